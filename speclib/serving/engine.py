"""Continuous batching over speclib's loop: requests join the running batch and leave it at step
boundaries; every step each live request drafts its own chain or tree, and all of them are verified in
one target forward (`extend_batch`, the hybrid models' closed form); acceptance, commits and randomness
stay per request (`speclib.core.generate.Run`), so each request's output is exactly what `generate`
gives its prompt with its seed, whatever else is in the batch.

    engine = Engine(target, drafters=[ModelDrafter(speclib.load("code-draft"), 4) for _ in range(4)])
    with engine:
        req = engine.submit(target.encode("def f("), max_tokens=64)
        tokens = req.result()

How many draft nodes each request gets per step is the budget's call (`FixedBudget`, or `AdaptiveBudget`,
which picks the count with the best predicted throughput at the current batch size from measured
verify costs and the acceptance seen so far, down to none when plain batched decoding is faster). A
target without batched extend serves one request at a time. The target's prefill runs when a request is
admitted, inside the step loop (no chunked prefill): a long prompt delays the running requests' next step.
A drafter is reset on the request's context (its draft model's prefill) only at the first step the budget
gives that request draft nodes, so a budget that keeps drafting off costs no draft prefills.
"""

from __future__ import annotations

import collections
import itertools
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from speclib.core.analytic import expected_tokens
from speclib.core.generate import Run, Stats, prompt_list
from speclib.core.protocols import LM, BatchedLM
from speclib.core.sampling import Sampling
from speclib.drafters.cache import PromptLookupDrafter
from speclib.drafters.model import ModelDrafter
from speclib.drafters.tree import TreeDrafter


@dataclass
class Request:
    """One request in the engine. Events arrive through `notify(kind, payload)` from the engine's thread:
    ("tokens", [ids]) as they are accepted, then ("done", Stats) or ("error", message)."""

    id: int
    prompt: list[int]
    max_tokens: int
    sampling: Sampling
    seed: int
    notify: Callable[[str, object], None]
    arrived: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None
    cancelled: bool = False
    tokens: list[int] = field(default_factory=list)
    stats: Stats | None = None
    error: str | None = None
    _done: threading.Event = field(default_factory=threading.Event)

    def result(self, timeout: float | None = None) -> list[int]:
        """Block until the request ends; its tokens (RuntimeError if it failed or was cancelled)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} still running after {timeout} s")
        if self.stats is None:
            raise RuntimeError(f"request {self.id} did not finish: {self.error}")
        return self.tokens


class FixedBudget:
    """The same draft budget (chain length or tree nodes) at every batch size."""

    def __init__(self, nodes: int):
        self.nodes = nodes

    def __call__(self, batch: int) -> int:
        return self.nodes

    def observe(self, steps: list[tuple[int, int]]) -> None:
        pass


class AdaptiveBudget:
    """The draft budget with the best predicted throughput at the batch size:
    argmax_n  batch * E(alpha, n) / (T_verify(batch, n) + batch * n * t_draft), n in 0..max_nodes,
    where T_verify comes from `calibrate` (measured on this machine at each batch size; for n >= 1 a
    least-squares line in n per batch size, so that timing noise between neighbouring n does not steer
    the argmax), t_draft is the drafter's measured seconds per node and alpha the acceptance seen so far
    (`observe`; `alpha0` until then). n = 0 is plain batched decoding (its measured time)."""

    def __init__(self, verify_s: dict[tuple[int, int], float], draft_token_s: float, max_nodes: int, alpha0=0.6):
        self.verify_s, self.draft_token_s, self.max_nodes = linear_in_nodes(verify_s), draft_token_s, max_nodes
        self.batches = sorted({b for b, _ in verify_s})
        self.alpha = alpha0
        self.nodes = self.tokens = self.count = 0.0  # exponentially decayed sums over drafted steps

    def _verify(self, batch: int, n: int) -> float:
        b = min(self.batches, key=lambda x: (abs(x - batch), x))  # nearest calibrated batch size
        return self.verify_s[(b, n)] * batch / b

    def predicted(self, batch: int, n: int) -> float:
        return batch * expected_tokens(self.alpha, n) / (self._verify(batch, n) + batch * n * self.draft_token_s)

    def __call__(self, batch: int) -> int:
        return max(range(self.max_nodes + 1), key=lambda n: self.predicted(batch, n))

    def observe(self, steps: list[tuple[int, int]]) -> None:
        """Each request's step as (draft nodes, accepted length). alpha is the i.i.d. acceptance at which a
        chain of the mean drafted size yields the mean tokens per step seen (exponentially decayed): for a
        chain, about the per-token acceptance; for a tree, the chain it is worth, so that a tree of n nodes
        is not credited with a chain of n."""
        for n, accepted in steps:
            if n:
                self.nodes, self.tokens = 0.95 * self.nodes + n, 0.95 * self.tokens + accepted + 1
                self.count = 0.95 * self.count + 1
        if self.count:
            n, want = self.nodes / self.count, self.tokens / self.count
            lo, hi = 0.0, 0.99
            for _ in range(40):  # expected_tokens rises with alpha: bisect
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if expected_tokens(mid, n) < want else (lo, mid)
            self.alpha = (lo + hi) / 2


def linear_in_nodes(verify_s: dict[tuple[int, int], float]) -> dict[tuple[int, int], float]:
    """{(batch, n): s} with the n >= 1 entries of each batch size replaced by their least-squares line in n
    (n = 0, a plain step without a draft's mask, kept as measured; a batch size with one n >= 1 kept too)."""
    out = dict(verify_s)
    for b in {b for b, _ in verify_s}:
        pts = [(n, s) for (bb, n), s in verify_s.items() if bb == b and n >= 1]
        if len(pts) < 2:
            continue
        mn, ms = statistics.fmean(n for n, _ in pts), statistics.fmean(s for _, s in pts)
        slope = sum((n - mn) * (s - ms) for n, s in pts) / sum((n - mn) ** 2 for n, _ in pts)
        out |= {(b, n): ms + slope * (n - mn) for n, _ in pts}
    return out


@torch.inference_mode()
def calibrate(target: LM, batches=(1, 2, 4, 8), max_nodes: int = 8, prefix: int = 64, repeats: int = 3) -> dict:
    """Median seconds of one batched verify pass, {(batch, n): s}: `batch` requests, each verifying a
    chain of n draft nodes plus its root over a `prefix`-token context (n = 0: a plain decoding step)."""
    views = [target.view() for _ in range(max(batches))] if isinstance(target, BatchedLM) else [target]
    for v in views:
        v.reset(list(range(1, prefix + 1)))
    out = {}
    for b in batches if isinstance(target, BatchedLM) else (1,):
        for n in range(max_nodes + 1):
            times = []
            for _ in range(repeats + 1):  # the first is a warm-up
                tokens, parents = [list(range(3, n + 4))] * b, [list(range(-1, n))] * b
                t0 = time.perf_counter()
                if isinstance(target, BatchedLM):
                    type(target).extend_batch(views[:b], tokens, parents)
                else:
                    views[0].extend(tokens[0], parents[0])
                times.append(time.perf_counter() - t0)
                for v in views[:b]:
                    v.commit([])  # drop the pending nodes: the context stays at `prefix`
            out[(b, n)] = statistics.median(times[1:])
    return out


def set_budget(drafter, n: int) -> None:
    """Cap a drafter at n >= 1 nodes for the next draft (a chain's length, a budgeted tree's node count)."""
    if isinstance(drafter, (ModelDrafter, PromptLookupDrafter)):
        drafter.k = n
    elif isinstance(drafter, TreeDrafter) and drafter.mode != "fixed":
        full = drafter.__dict__.setdefault("serving_depth", drafter.depth)  # the depth it was built with
        drafter.budget, drafter.depth = n, min(full, n)
    # any other drafter (a fixed tree shape, a hybrid of caches and a model) keeps its own size: a budget
    # can only switch it off (n = 0)


class Engine:
    """The step loop in a thread of its own (module doc). target: the LM (a `BatchedLM` batches up to
    `max_batch` requests; any other LM serves one at a time). drafters: one per slot (each keeps one
    request's draft state), or None for plain decoding. budget: nodes per request per step given the
    batch size (default: each drafter's own size)."""

    def __init__(self, target: LM, drafters: list | None = None, max_batch: int = 4, budget=None):
        if not isinstance(target, BatchedLM):
            max_batch = 1
        self.target, self.max_batch = target, max_batch
        self.drafters = list(drafters) if drafters is not None else [None] * max_batch
        if len(self.drafters) < max_batch:
            raise ValueError(f"need one drafter per slot: {max_batch} slots, {len(self.drafters)} drafters")
        self.max_nodes = max((d.max_nodes for d in self.drafters if d is not None), default=0)
        self.sizes = [d.max_nodes if d is not None else 0 for d in self.drafters]
        self.budget = budget
        self.views = [target.view() for _ in range(max_batch)] if isinstance(target, BatchedLM) else [target]
        self.waiting: collections.deque[Request] = collections.deque()
        self.slots: list[tuple[Request, Run] | None] = [None] * max_batch
        self.primed = [False] * max_batch  # the slot's drafter has been reset on its request's context
        self.log: list[dict] = []  # one row per step: time, batch, nodes, drafted, accepted, primed, draft_s, verify_s
        self._ids = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False

    # --- the client side ------------------------------------------------------------------------
    def submit(self, prompt_ids, max_tokens: int, sampling: Sampling = Sampling(0.0), seed: int = 0, notify=None):  # noqa: B008
        """Queue a request; ValueError for a bad one (nothing is queued). notify: called from the engine's
        thread with each event (default: nothing; `Request.result()` waits for the end)."""
        prompt = self.check(prompt_ids, max_tokens)
        req = Request(next(self._ids), prompt, max_tokens, sampling, seed, notify or (lambda kind, payload: None))
        with self._wake:
            self.waiting.append(req)
            self._wake.notify()
        return req

    def check(self, prompt_ids, max_tokens: int) -> list[int]:
        """The prompt as a list of ids, or ValueError naming what is wrong with the request."""
        prompt = prompt_list(prompt_ids)
        if not prompt:
            raise ValueError("the prompt is empty")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        need = len(prompt) + max_tokens + self.max_nodes + 1
        if need > self.target.max_length:
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) + draft lookahead ({self.max_nodes + 1}) "
                f"exceeds the model's context of {self.target.max_length} tokens"
            )
        if min(prompt) < 0 or max(prompt) >= self.target.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.target.vocab_size})")
        return prompt

    def cancel(self, req: Request) -> None:
        """Stop a request at the next step boundary and free its slot (a client that went away)."""
        req.cancelled = True
        with self._wake:
            self._wake.notify()

    def start(self) -> Engine:
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="speclib-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def active(self) -> int:
        return sum(s is not None for s in self.slots)

    # --- the step loop --------------------------------------------------------------------------
    def _finish(self, i: int, error: str | None = None) -> None:
        req, run = self.slots[i]
        self.slots[i] = None
        req.finished_at = time.perf_counter()
        if error is None and not req.cancelled:
            req.stats = run.result().stats
            req.notify("done", req.stats)
        else:
            req.error = error or "cancelled"
            req.notify("error", req.error)
        req._done.set()

    def _emit(self, req: Request, run: Run) -> None:
        new = run.emitted()[len(req.tokens) :]
        if new:
            if req.first_token_at is None:
                req.first_token_at = time.perf_counter()
            req.tokens += new
            req.notify("tokens", new)

    def _admit(self) -> None:
        for i in range(self.max_batch):
            if self.slots[i] is not None:
                continue
            with self._wake:
                req = self.waiting.popleft() if self.waiting else None
            if req is None:
                return
            if req.cancelled:
                req.error = "cancelled"
                req.notify("error", req.error)
                req._done.set()
                continue
            try:  # the target's prefill; the drafter's waits until a step drafts (`Run.attach`)
                if self.drafters[i] is not None:
                    self.drafters[i].check_compatible(self.views[i])
                run = Run(self.views[i], req.prompt, req.max_tokens, None, None, req.sampling, req.seed, -1)
            except Exception as e:  # noqa: BLE001 (a request that cannot run fails alone)
                req.error = f"{type(e).__name__}: {e}"
                req.notify("error", req.error)
                req._done.set()
                continue
            self.slots[i], self.primed[i] = (req, run), False
            self._emit(req, run)
            if run.done:
                self._finish(i)

    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self._wake:
                    while not self._stop and not self.waiting and not self.active:
                        self._wake.wait()
                    if self._stop:
                        break
                try:
                    self._step()
                except Exception as e:  # noqa: BLE001 (fail the live requests, keep serving)
                    for i, s in enumerate(self.slots):
                        if s is not None:
                            self._finish(i, f"{type(e).__name__}: {e}")
            for i, s in enumerate(self.slots):
                if s is not None:
                    self._finish(i, "the server stopped")

    def _step(self) -> None:
        for i, s in enumerate(self.slots):
            if s is not None and s[0].cancelled:
                self._finish(i)
        self._admit()
        live = [i for i, s in enumerate(self.slots) if s is not None]
        if not live:
            return
        nodes = self.budget(len(live)) if self.budget is not None else None
        t0 = time.perf_counter()
        drafts, primed, drafting = [], 0, []
        for i in live:
            _, run = self.slots[i]
            n = self.sizes[i] if nodes is None else min(nodes, self.sizes[i])
            run.drafter = None  # a plain step unless this one drafts; the drafter catches up when it next does
            try:
                if n > 0:
                    if not self.primed[i]:
                        self.primed[i], primed = True, primed + 1
                        run.attach(self.drafters[i])
                    run.drafter = self.drafters[i]
                    if nodes is not None:
                        set_budget(run.drafter, n)
                drafts.append(run.draft())
                drafting.append(i)
            except Exception as e:  # noqa: BLE001 (a drafter that fails on one request fails that request alone)
                self._finish(i, f"{type(e).__name__}: {e}")
        live = drafting
        if not live:
            return
        t1 = time.perf_counter()
        runs = [self.slots[i][1] for i in live]
        if isinstance(self.target, BatchedLM):
            logits = type(self.target).extend_batch(
                [r.target for r in runs], [d[0] for d in drafts], [d[1] for d in drafts]
            )
        else:
            logits = [runs[0].target.extend(*drafts[0])]
        verify_s = time.perf_counter() - t1
        drafted = accepted = 0
        outcomes = []
        for i, r, lg in zip(live, runs, logits):
            r.finish(lg, verify_s)
            s = r.steps[-1]
            drafted, accepted = drafted + s["drafted"], accepted + s["accepted"]
            outcomes.append((s["drafted"], s["accepted"]))
            self._emit(*self.slots[i])
            if r.done:
                self._finish(i)
        if self.budget is not None:
            self.budget.observe(outcomes)
        self.log.append(
            dict(
                t=t0,
                batch=len(live),
                nodes=nodes,
                drafted=drafted,
                accepted=accepted,
                primed=primed,
                draft_s=t1 - t0,
                verify_s=verify_s,
            )
        )
