"""Devices, the one clock every timing in speclib reads, and CPU threads.

`clock(device)` waits for the device's queued work (CUDA, MPS) before it reads `time.perf_counter`:
on a GPU, reading the clock without a sync times kernel launches, not kernels. The decoding loop's
per-step timings and every benchmark read time through it.

`cpu_count()` is the number of CPUs this process may actually use: the affinity mask (`taskset`,
`docker --cpuset-cpus`) and a cgroup CPU quota (`docker --cpus`, Kubernetes limits) both count.
torch's default thread count ignores the quota, so two jobs on a 2-core machine each start two
threads, and their spin-waiting threads slow both down several times over. `set_threads()` sets torch's
intra-op threads to `cpu_count()`; run two jobs side by side on disjoint cores (`taskset -c 0 ...`,
`taskset -c 1 ...`) and each uses one thread.
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]  # the repository checkout speclib runs from

__all__ = ["REPO", "pick_device", "sync", "clock", "cpu_count", "set_threads", "threads"]


def pick_device(device: str = "auto") -> torch.device:
    """ "auto" = cuda, then mps, then cpu; anything else is passed to torch.device."""
    if device != "auto":
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def sync(device) -> None:
    """Wait until the work queued on `device` has finished (no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def clock(device="cpu") -> float:
    """`time.perf_counter()` after the device's queued work has finished: t1 - t0 of two calls is
    the time the device spent in between."""
    sync(device)
    return time.perf_counter()


def _cgroup_quota() -> float | None:
    """CPUs allowed by a cgroup quota (v2 cpu.max, or v1 cfs files), or None when unlimited."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def cpu_count() -> int:
    """CPUs this process may use: min(affinity mask, ceil(cgroup quota)), at least 1."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_quota()
    if quota is not None:
        n = min(n, math.ceil(quota))
    return max(1, n)


def set_threads(n: int | None = None) -> int:
    """Set torch's intra-op threads to `n`. Default: $SPECLIB_THREADS when set, else `cpu_count()`
    capped by $OMP_NUM_THREADS when that is set (the usual way to ask a job for fewer threads).
    $SPECLIB_MAX_THREADS, when set, caps every count, an explicit `n` included: a test process that shares
    the cores with another one (pytest-xdist) runs a notebook's two-thread timings at one thread rather than
    spin-waiting against its neighbour. Returns the number set."""
    if n is None:
        n = int(os.environ.get("SPECLIB_THREADS") or 0) or cpu_count()
        if os.environ.get("SPECLIB_THREADS") is None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
            n = min(n, max(1, int(os.environ["OMP_NUM_THREADS"])))
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n (threads) must be an int >= 1, got {n!r}")
    if os.environ.get("SPECLIB_MAX_THREADS", "").isdigit():
        n = min(n, max(1, int(os.environ["SPECLIB_MAX_THREADS"])))
    torch.set_num_threads(n)
    return n


@contextmanager
def threads(n: int | None = None):
    """`with threads(1): ...` runs the block with `set_threads(n)` and restores torch's previous count
    after it: a notebook times its loops at one thread and runs its untimed batch work on every CPU."""
    before = torch.get_num_threads()
    try:
        yield set_threads(n)
    finally:
        torch.set_num_threads(before)
