"""The decoding loop shared by every notebook: draft, verify, accept, commit.

Each iteration the drafter proposes a Tree, the target verifies the root token (the last sampled
token, not yet in its cache) plus the tree in one pass, the acceptor picks the accepted path and the
next token, and target and drafter commit; the next token becomes the root. With no drafter this is
plain autoregressive decoding (one target pass per token). What each call means (the `LM`, `Drafter`
and `Acceptor` protocols, the optional capabilities) is stated once, in `speclib.core.protocols`; every
per-step time is read with `speclib.core.device.clock`, which synchronises the device first.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import TypedDict, cast

import torch

from speclib.core.acceptance import Lossless
from speclib.core.device import clock
from speclib.core.protocols import LM, Acceptor, BatchedLM, Drafter, LogitsAcceptor, PerRequestAcceptor, VerifyObserver
from speclib.core.sampling import Sampling, probs, sample
from speclib.core.tree import Tree


class Step(TypedDict):
    """One verify pass of the loop."""

    drafted: int  # tree nodes verified besides the root
    accepted: int  # length of the accepted path
    source: str | None  # Tree.source ("model", a cache's name, ...), None for an empty draft
    draft_s: float  # seconds drafting
    verify_s: float  # seconds verifying, accepting and committing (target and drafter)


NAN = float("nan")


@dataclass
class Stats:
    """What one request cost and accepted. A peer loop that reports no steps (`speclib.research.peers`)
    leaves NaN (and empty lists) where it cannot say. `dataclasses.asdict` gives the row to store."""

    new_tokens: int
    seconds: float  # the request's wall time, prefill included
    tokens_per_s: float
    steps: list[Step] = field(default_factory=list)
    target_calls: int | float = NAN  # verify passes after the prefill
    tokens_per_call: float = NAN  # new tokens / (target_calls + 1): the prefill yields the first
    acceptance_rate: float = NAN  # accepted / drafted tokens, over all steps
    # accepted_at[j]: steps whose draft had its (j+1)-th token accepted (an accepted path of length > j);
    # one entry per draft position up to the drafter's max_nodes (or the longest accepted path)
    accepted_at: list[int] = field(default_factory=list)
    # vLLM's mean acceptance length: 1 + accepted / drafts (drafts = steps with a non-empty draft), i.e.
    # tokens per verify step of a draft, the bonus or correction token included; NaN without drafts
    mean_accepted_length: float = NAN
    batch_seconds: float | None = None  # generate_batch: the whole batch's wall time (None alone)


@dataclass
class Generation:
    tokens: list[int]  # new tokens only
    text: str
    stats: Stats


def _check(target: LM, prompt_ids, max_new_tokens, drafter, acceptor, sampling) -> list[int]:
    if not isinstance(sampling, Sampling):
        raise TypeError(f"sampling must be a speclib.Sampling, got {type(sampling).__name__}")
    prompt = prompt_list(prompt_ids)
    if not prompt:
        raise ValueError("prompt_ids is empty: give at least one prompt token")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if drafter is not None and not isinstance(drafter, Drafter):
        raise TypeError(f"drafter must implement speclib.core.protocols.Drafter, got {type(drafter).__name__}")
    if acceptor is not None and not isinstance(acceptor, Acceptor):
        raise TypeError(f"acceptor must implement speclib.core.protocols.Acceptor, got {type(acceptor).__name__}")
    lookahead = (drafter.max_nodes if drafter is not None else 0) + 1
    if len(prompt) + max_new_tokens + lookahead > target.max_length:
        raise ValueError(
            f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) + draft lookahead "
            f"({lookahead}) exceeds the target's context of {target.max_length} tokens"
        )
    if drafter is not None:
        drafter.check_compatible(target)
    return prompt


class Run:
    """One request's decoding state: the loop body of `generate`, split so that a batch of requests
    can share the verify pass (`generate_batch`, and the server's continuous batching in
    `speclib.serving.engine`). `emitted()` is the output so far, cut at max_new_tokens and EOS."""

    def __init__(self, target: LM, prompt_ids, max_new_tokens, drafter, acceptor, sampling, seed, eos_token_id):
        self.prompt = _check(target, prompt_ids, max_new_tokens, drafter, acceptor, sampling)
        self.target, self.drafter, self.sampling = target, drafter, sampling
        self.acceptor = acceptor or Lossless()
        self.max_new_tokens = max_new_tokens
        self.eos = target.eos_token_id if eos_token_id == -1 else eos_token_id
        self.gen = torch.Generator().manual_seed(seed)
        # capabilities checked once per request, not per step (runtime protocol checks are not free)
        self.wants_logits = isinstance(self.acceptor, LogitsAcceptor) and self.acceptor.uses_logits
        self.drafter_sees_verify = isinstance(drafter, VerifyObserver)  # e.g. TokenRecycling
        if isinstance(self.acceptor, PerRequestAcceptor):  # e.g. cospec.Arbiter
            self.acceptor.reset(self.prompt)
        self.steps: list[Step] = []
        self.t_start = clock(target.device)
        self.root = sample(probs(target.reset(self.prompt), sampling), self.gen)
        if drafter is not None:
            drafter.reset(self.prompt, sampling, self.gen)
        self.out = [self.root]
        self.done = self.root == self.eos or max_new_tokens <= 1

    def attach(self, drafter) -> None:
        """Draft with `drafter` from the next step on: a server defers a draft model's prefill until its budget
        turns drafting on for this request. The drafter is reset on the context before the pending root, as a
        fresh run's is on the prompt, so its first draft has the root (at least one token) to feed."""
        drafter.check_compatible(self.target)
        drafter.reset(self.prompt + self.out[:-1], self.sampling, self.gen)
        self.drafter, self.drafter_sees_verify = drafter, isinstance(drafter, VerifyObserver)

    def draft(self) -> tuple[list[int], list[int]]:
        """Draft a tree; return the tokens and parents to verify (the root token first)."""
        t0 = clock(self.target.device)
        self.tree = self.drafter.draft(self.prompt + self.out) if self.drafter is not None else Tree([], [])
        self.draft_s = clock(self.target.device) - t0
        self.verified = [self.root] + self.tree.tokens
        return self.verified, [-1] + [p + 1 for p in self.tree.parents]

    def finish(self, logits: torch.Tensor, verify_s: float) -> None:
        """Accept from the verify pass's logits, commit, and record the step."""
        t0 = clock(self.target.device)
        tree = self.tree
        extra = {"logits": logits} if self.wants_logits else {}
        path, self.root = self.acceptor(tree, probs(logits, self.sampling), self.sampling.greedy, self.gen, **extra)
        self.target.commit([0] + [i + 1 for i in path])
        accepted = [tree.tokens[i] for i in path]
        if self.drafter_sees_verify:
            self.drafter.observe_verify(self.verified, logits, path, self.root)
        if self.drafter is not None:
            self.drafter.observe(accepted)
        self.out += accepted + [self.root]
        self.done = (
            len(self.out) >= self.max_new_tokens
            or self.root == self.eos
            or (self.eos is not None and self.eos in accepted)
        )
        self.steps.append(
            Step(
                drafted=len(tree),
                accepted=len(path),
                source=tree.source if len(tree) else None,
                draft_s=self.draft_s,
                verify_s=verify_s + clock(self.target.device) - t0,
            )
        )

    def emitted(self) -> list[int]:
        return _truncate(self.out, self.max_new_tokens, self.eos)

    def result(self) -> Generation:
        out = self.emitted()
        seconds = clock(self.target.device) - self.t_start
        drafted = sum(s["drafted"] for s in self.steps)
        accepted = sum(s["accepted"] for s in self.steps)
        drafts = sum(s["drafted"] > 0 for s in self.steps)
        positions = max(
            [self.drafter.max_nodes if self.drafter is not None else 0] + [s["accepted"] for s in self.steps]
        )
        stats = Stats(
            new_tokens=len(out),
            seconds=seconds,
            tokens_per_s=len(out) / seconds,
            steps=self.steps,
            target_calls=len(self.steps),
            tokens_per_call=len(out) / max(1, len(self.steps) + 1),
            acceptance_rate=accepted / drafted if drafted else NAN,
            accepted_at=[sum(s["accepted"] > j for s in self.steps) for j in range(positions)],
            mean_accepted_length=1 + accepted / drafts if drafts else NAN,
        )
        return Generation(out, self.target.decode(out) if self.target.tokenizer is not None else "", stats)


def generate(
    target: LM,
    prompt_ids,
    max_new_tokens: int = 128,
    drafter=None,
    acceptor=None,
    sampling: Sampling = Sampling(),  # noqa: B008 (Sampling is a frozen dataclass)
    seed: int = 0,
    eos_token_id: int | None = -1,
) -> Generation:
    """Decode up to max_new_tokens new tokens from `target`, speculatively when a drafter is given.

    Stops exactly at max_new_tokens, and at EOS even inside an accepted block (pass
    eos_token_id=None to ignore EOS). All randomness comes from one torch.Generator seeded by `seed`.
    """
    run = Run(target, prompt_ids, max_new_tokens, drafter, acceptor, sampling, seed, eos_token_id)
    while not run.done:
        tokens, parents = run.draft()
        t0 = clock(target.device)
        logits = target.extend(tokens, parents)
        run.finish(logits, clock(target.device) - t0)
    return run.result()


def generate_batch(
    targets: list,
    prompts: list,
    max_new_tokens: int = 128,
    drafters: list | None = None,
    acceptor=None,
    sampling: Sampling = Sampling(),  # noqa: B008 (Sampling is a frozen dataclass)
    seed: int = 0,
    eos_token_id: int | None = -1,
) -> list[Generation]:
    """Decode several requests together: each step every unfinished request drafts its own tree, and
    all trees are verified in ONE target forward (`extend_batch`); acceptance and commits stay per
    request, so each request's output is exactly what `generate` would give it with seed `seed + r`.

    targets: one LM per request over the same model (e.g. `HybridLM.view()`), with the batched-extend
    capability (`speclib.core.protocols.BatchedLM`). drafters: one per request (or None: plain AR).
    """
    if not targets or not all(isinstance(t, BatchedLM) for t in targets):
        raise TypeError(
            "targets must be one speclib.core.protocols.BatchedLM per request (e.g. HybridLM.view()), got "
            f"{sorted({type(t).__name__ for t in targets}) or 'none'}"
        )
    if len(prompts) != len(targets) or (drafters is not None and len(drafters) != len(targets)):
        raise ValueError(
            f"need one target view (and drafter) per prompt: got {len(targets)} targets, "
            f"{len(prompts)} prompts, {len(drafters) if drafters is not None else 0} drafters"
        )
    drafters = drafters if drafters is not None else [None] * len(targets)
    if len({id(d) for d in drafters if d is not None}) != sum(d is not None for d in drafters):
        raise ValueError("each request needs its own drafter (its draft model keeps per-request state)")
    t_start = clock(targets[0].device)
    runs = [
        Run(t, p, max_new_tokens, d, acceptor, sampling, seed + r, eos_token_id)
        for r, (t, p, d) in enumerate(zip(targets, prompts, drafters))
    ]
    while live := [r for r in runs if not r.done]:
        drafts = [r.draft() for r in live]
        t0 = clock(targets[0].device)
        batched = cast(BatchedLM, live[0].target)  # every target was checked to be a BatchedLM
        logits = type(batched).extend_batch([r.target for r in live], [d[0] for d in drafts], [d[1] for d in drafts])
        verify_s = clock(targets[0].device) - t0
        for r, lg in zip(live, logits):
            r.finish(lg, verify_s)
    results = [r.result() for r in runs]
    for g in results:
        g.stats.batch_seconds = clock(targets[0].device) - t_start
    return results


def _truncate(out: list[int], max_new_tokens: int, eos: int | None) -> list[int]:
    out = out[:max_new_tokens]
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]
    return out


def prompt_list(prompt_ids, name: str = "prompt_ids") -> list[int]:
    """`prompt_ids` (a list, 1-D tensor or 1-D array of int token ids) as a list of ints; a TypeError or
    ValueError saying what is expected for anything else (a string, a 2-D batch, floats)."""
    what = f"{name} must be a 1-D sequence of int token ids"
    if isinstance(prompt_ids, (str, bytes)):
        raise TypeError(f"{what}, got a string: encode it first with lm.encode(text)")
    if len(getattr(prompt_ids, "shape", (0,))) != 1:
        raise ValueError(f"{what}, got shape {tuple(prompt_ids.shape)} (for a batch of one, pass ids[0])")
    try:
        ids = prompt_ids.tolist() if hasattr(prompt_ids, "tolist") else list(prompt_ids)
    except TypeError:
        raise TypeError(f"{what}, got {type(prompt_ids).__name__}") from None
    try:
        return [t if type(t) is int else operator.index(t) for t in ids]
    except TypeError:
        pass
    for t in ids:  # name the first element that is not an int
        try:
            operator.index(t)
        except TypeError:
            if isinstance(t, (list, tuple)) or getattr(t, "ndim", 0) != 0:
                raise ValueError(f"{what}, got a nested (2-D) one (for a batch of one, pass ids[0])") from None
            raise TypeError(f"{what}, got an element {t!r} of type {type(t).__name__}") from None
    raise AssertionError("unreachable: operator.index failed on some element")
