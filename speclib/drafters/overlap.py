"""Drafting while the target verifies (PEARL-style): the draft LM runs in a process of its own, on a core
of its own, and never waits for the target; the target verifies whatever the draft has ready.

    with OverlapDrafter(draft, k=8) as drafter:
        out = speclib.generate(target, ids, 64, drafter=drafter, sampling=speclib.Sampling(0.0))

The draft process keeps a *hypothesis*: the chain it believes comes next (every drafted token accepted,
and the target's next token equal to its own next draft). It extends the hypothesis up to `ahead`
tokens past the last context it was told, one token at a time, posting each token (and its q) to the
decoding process as soon as it has it. Each `draft(context)` tells it the new context and takes the
posted tokens that continue it, at most `k` (waiting for at least `wait_for`); if the context left the
hypothesis (a rejection, or a next token other than the draft's), both sides drop it and the draft
process starts again from the context. So while the target verifies n tokens, the draft process drafts
the next ones (PEARL's post-verify), and after a rejection the target's next pass, with few or no draft
tokens, runs while the draft catches up (pre-verify); the draft length adapts to the timing.

Lossless: every token handed to the target was sampled from q given exactly the context it extends (a
hypothesis token is kept only when the target's own token at its position equals it, and the target
draws that token independently of the draft's randomness), and how many tokens are verified depends
only on timing and the draft's own tokens, which the rejection rule allows. Greedy output equals AR;
at temperature > 0 the output distribution is AR's, but a seeded run is not repeatable token for token,
because the draft lengths depend on timing.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
import weakref

import numpy as np
import torch
import torch.multiprocessing as mp

from speclib.core.device import cpu_count
from speclib.core.protocols import LM
from speclib.core.sampling import Sampling, probs, sample
from speclib.core.tree import Tree
from speclib.drafters.model import check_draft_lm
from speclib.lms.head import HeadLM

RESTART_EVERY = 256  # confirmed pending nodes before the draft process commits them (bounded pending state)


def _serve_process(lm: LM, conn, ahead: int, threads: int) -> None:
    """The draft process: its own torch threads; Ctrl-C reaches the decoding process, which stops this one
    (close, or end of file on the pipe when it exits)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    _serve(lm, conn, ahead)


def _serve_thread(lm: LM, conn, ahead: int) -> None:
    """The draft thread: closing its end of the pipe when it ends (a crash included) wakes the decoder."""
    try:
        _serve(lm, conn, ahead)
    finally:
        conn.close()


def _serve(lm: LM, conn, ahead: int) -> None:
    """Apply the decoder's messages, and between them draft one token at a time along the hypothesis,
    posting (hypothesis id, position, token, q or None, the draft LM's calls since the last post as (start,
    end) in perf_counter seconds, a clock all processes of the machine share)."""
    pending: list[int] = []  # the draft LM's pending chain (after its committed prefix)
    confirmed = 0  # pending[:confirmed] is context; pending[confirmed:] is the hypothesis
    context_len, hyp_id, logits = 0, 0, None  # logits: the draft's scores after the last token it holds
    sampling, gen = Sampling(0.0), torch.Generator()

    busy: list[tuple[float, float]] = []  # draft LM calls since the last post: (start, end) perf_counter

    def extend(tokens: list[int]) -> torch.Tensor:
        t0 = time.perf_counter()
        out = lm.extend(tokens, [len(pending) - 1 + i for i in range(len(tokens))])
        pending.extend(tokens)
        busy.append((t0, time.perf_counter()))
        return out[-1]

    def commit(n: int) -> None:  # the first n pending nodes join the committed prefix, the rest are dropped
        nonlocal confirmed
        lm.commit(list(range(n)))
        pending.clear()
        confirmed = 0

    with torch.inference_mode():
        while True:
            hyp_len = len(pending) - confirmed
            if logits is None or hyp_len >= ahead or conn.poll():
                try:
                    msg = conn.recv()  # blocks only when there is nothing to draft
                except (EOFError, OSError):  # the decoder is gone (a reset socket raises OSError, not EOF)
                    return
                if msg[0] == "close":
                    return
                if msg[0] == "reset":
                    _, prompt, sampling, seed = msg
                    gen.manual_seed(seed)
                    t0 = time.perf_counter()
                    logits = lm.reset(prompt)
                    busy[:] = [(t0, time.perf_counter())]
                    pending.clear()
                    confirmed, context_len, hyp_id = 0, len(prompt), 0
                    continue
                _, restart, new = msg  # "sync": the context grew by `new`
                context_len += len(new)
                if not restart:  # the hypothesis held: its first len(new) tokens are now context
                    confirmed += len(new)
                else:  # keep what matched, but re-feed at least one token for fresh logits
                    hyp = pending[confirmed:]
                    m = next((i for i, (a, b) in enumerate(zip(hyp, new)) if a != b), min(len(hyp), len(new)))
                    keep = min(m, len(new) - 1)
                    commit(confirmed + keep)
                    logits = extend(new[keep:])
                    confirmed, hyp_id = len(pending), hyp_id + 1
                if confirmed >= RESTART_EVERY:  # bound the pending chain: commit the context part
                    hyp = pending[confirmed:]
                    commit(confirmed)
                    if hyp:
                        logits = extend(hyp)
                continue
            q = probs(logits, sampling)
            x = int(q.argmax()) if sampling.greedy else sample(q, gen)
            conn.send(
                (hyp_id, context_len + hyp_len, x, None if sampling.greedy else q.numpy().astype(np.float32), busy)
            )
            busy = []
            logits = extend([x])


class OverlapDrafter:
    """A `ModelDrafter` whose draft LM runs in its own process while the target verifies (module doc).

    lm: the draft LM (sent to the process once; torch shares its weights). k: most tokens per verify
    pass; wait_for: tokens to wait for before a pass (0: verify at once with whatever is ready, down to
    a plain step); ahead: how far past the context the draft runs (default 2 k). threads: torch threads
    of the draft process (the decoding process keeps its own). backend: "process" (default) or "thread"
    (a thread of this process: torch releases the GIL inside its kernels, but the draft's Python code
    and the decoder's take turns; measured slower, docs/overlap.md). Needs 2 usable CPUs; close() (or
    a `with` block) stops the process, as does the object's garbage collection. `timeline()` gives the
    last request's busy intervals on both sides.

    A feature head (`HeadLM`) cannot overlap: it reads the target's features of every verified token,
    which exist only after the verify pass it would run beside; use `FeatureDrafter`. Cache drafters
    (prompt lookup, suffix, REST) draft in microseconds and gain nothing from a second core."""

    def __init__(
        self,
        lm: LM,
        k: int = 8,
        wait_for: int = 1,
        ahead: int | None = None,
        sampling: Sampling | None = None,
        threads: int = 1,
        backend: str = "process",
    ):
        if isinstance(lm, HeadLM):
            raise ValueError(
                "a feature head drafts from the target's features of the tokens verified so far, so it cannot "
                "draft while the target verifies them: use FeatureDrafter (sequential)"
            )
        if backend not in ("process", "thread"):
            raise ValueError(f'backend must be "process" or "thread", got {backend!r}')
        for name, val, low in (("k", k, 1), ("wait_for", wait_for, 0), ("threads", threads, 1)):
            if isinstance(val, bool) or not isinstance(val, int) or val < low:
                raise ValueError(f"{name} must be an int >= {low}, got {val!r}")
        if wait_for > k:
            raise ValueError(f"wait_for ({wait_for}) must be <= k ({k})")
        ahead = 2 * k if ahead is None else ahead
        if isinstance(ahead, bool) or not isinstance(ahead, int) or ahead < k:
            raise ValueError(f"ahead must be an int >= k ({k}), got {ahead!r}")
        if cpu_count() < 2:
            raise RuntimeError(
                f"OverlapDrafter needs 2 usable CPUs (the draft and the target each on one), found {cpu_count()}: "
                "use ModelDrafter, which drafts and verifies in turn"
            )
        self.lm, self.k, self.wait_for, self.ahead, self.threads, self.backend = (
            lm,
            k,
            wait_for,
            ahead,
            threads,
            backend,
        )
        self.sampling_override = sampling
        self._proc = None
        self.tree: Tree | None = None

    @property
    def max_nodes(self) -> int:
        return self.k

    def check_compatible(self, target: LM) -> None:
        check_draft_lm(self.lm, target)

    def _start(self) -> None:
        if self.backend == "thread":
            self._conn, child = mp.Pipe()
            self._proc = threading.Thread(target=_serve_thread, args=(self.lm, child, self.ahead), daemon=True)
            self._proc.start()
        else:
            ctx = mp.get_context("spawn")  # fork after torch has started its threads can deadlock
            self._conn, child = ctx.Pipe()
            self._proc = ctx.Process(
                target=_serve_process, args=(self.lm, child, self.ahead, self.threads), daemon=True
            )
            with _main_module_hidden():
                self._proc.start()
            child.close()
        self._finalizer = weakref.finalize(self, _stop, self._proc, self._conn)

    def close(self) -> None:
        if self._proc is not None:
            self._finalizer()
            self._proc = None

    def __enter__(self) -> OverlapDrafter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _send(self, msg) -> None:
        if self._proc is None or not self._proc.is_alive():
            raise RuntimeError(f"the draft {self.backend} is not running (it crashed, or the drafter was closed)")
        try:
            self._conn.send(msg)
        except OSError:  # it ended between the check and the send
            raise RuntimeError(f"the draft {self.backend} stopped") from None

    def reset(self, prompt: list[int], sampling: Sampling, gen: torch.Generator) -> None:
        if self._proc is None:
            self._start()
        self.sampling = self.sampling_override or sampling
        seed = int(torch.randint(0, 2**62, (), generator=gen))  # the run's seed decides the draft's randomness
        self._send(("reset", list(prompt), self.sampling, seed))
        self.context_len, self.hyp_id = len(prompt), 0
        # timeline of this request, perf_counter seconds: the draft LM's calls, and the decoder's waits
        # for draft tokens (draft() calls); between a wait's end and the next wait's start it verifies
        self._t_reset = time.perf_counter()
        self._draft_busy: list[tuple[float, float]] = []
        self._waits: list[tuple[float, float]] = []
        self.posted: list[tuple[int, np.ndarray | None]] = []  # hypothesis tokens from position context_len on

    def _receive(self, block: bool) -> None:
        """Take the draft process's posts; keep those of the current hypothesis, in order."""
        while block or self._conn.poll():
            try:
                hyp_id, pos, token, q, busy = self._conn.recv()
            except (EOFError, OSError):  # closed with our messages unread, its end resets the socket: OSError
                raise RuntimeError(f"the draft {self.backend} stopped") from None
            self._draft_busy += busy
            if hyp_id == self.hyp_id and pos == self.context_len + len(self.posted):
                self.posted.append((token, q))
                block = False
            elif hyp_id == self.hyp_id and pos < self.context_len + len(self.posted):
                continue  # already consumed as context
            else:
                continue  # an abandoned hypothesis (still in the pipe when it was dropped)

    def draft(self, context: list[int]) -> Tree:
        t0 = time.perf_counter()
        new = context[self.context_len :]
        self._receive(block=False)
        known = [t for t, _ in self.posted]
        restart = known[: len(new)] != new  # a rejection, another next token, or not drafted yet
        self._send(("sync", restart, new))
        if restart:
            self.posted, self.hyp_id = [], self.hyp_id + 1
        else:
            self.posted = self.posted[len(new) :]
        self.context_len = len(context)
        while len(self.posted) < self.wait_for:
            self._receive(block=True)
        chain = self.posted[: self.k]
        tokens = [t for t, _ in chain]
        q = None if self.sampling.greedy or not chain else torch.from_numpy(np.stack([q for _, q in chain]))
        self.tree = Tree.chain(tokens, q)
        self._waits.append((t0, time.perf_counter()))
        return self.tree

    def timeline(self) -> dict[str, list[tuple[float, float]]]:
        """The last request so far, in seconds from reset(): "draft" (the draft LM's calls
        whose tokens reached this side, abandoned hypotheses included) and "wait" (the decoder in draft(),
        waiting for tokens); the decoder verifies between one wait's end and the next's start."""
        t = self._t_reset
        return {
            name: [(a - t, b - t) for a, b in ivs] for name, ivs in (("draft", self._draft_busy), ("wait", self._waits))
        }

    def observe(self, accepted: list[int]) -> None:
        """Nothing to do here: the next draft() tells the draft process the context, next token included."""


@contextlib.contextmanager
def _main_module_hidden():
    """Start a spawned process without it re-running the caller's script: spawn re-imports `__main__` by
    name or path, which re-runs a script without an `if __name__ == "__main__"` guard (and starts another
    draft process from it). The draft process needs nothing from `__main__`."""
    main = sys.modules["__main__"]
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _stop(proc, conn) -> None:
    try:
        conn.send(("close",))
    except (OSError, ValueError):
        pass
    proc.join(timeout=5)
    if proc.is_alive() and hasattr(proc, "terminate"):  # a thread cannot be killed; it ends on "close"
        proc.terminate()
        proc.join(timeout=5)
    conn.close()
