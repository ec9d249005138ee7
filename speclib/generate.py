"""The decoding loop shared by every notebook: draft, verify, accept, commit.

p = target distribution, q = draft distribution, everywhere. Each iteration:
  1. the drafter proposes a Tree (tokens, parents, q) from the context;
  2. the target extends the root token (the last sampled token, not yet in its cache) plus the tree
     in one pass: p[0] scores the root's children, p[1 + i] scores node i's children;
  3. the acceptor returns the accepted path and the next token (correction or bonus);
  4. target and drafter commit the root plus the accepted path; the next token becomes the root.
With no drafter this is plain autoregressive decoding (one target pass per token).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .acceptance import Lossless
from .lm import LM
from .sampling import Sampling, probs, sample
from .tree import Tree


@dataclass
class Generation:
    tokens: list[int]                       # new tokens only
    text: str
    stats: dict = field(default_factory=dict)


def _check(target: LM, prompt_ids, max_new_tokens, drafter, sampling) -> list[int]:
    if not isinstance(sampling, Sampling):
        raise TypeError(f"sampling must be a speclib.Sampling, got {type(sampling).__name__}")
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("prompt_ids is empty: give at least one prompt token")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    lookahead = getattr(drafter, "max_nodes", 0) + 1
    if len(prompt) + max_new_tokens + lookahead > target.max_length:
        raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) + draft lookahead "
                         f"({lookahead}) exceeds the target's context of {target.max_length} tokens")
    if drafter is not None:
        drafter.check_compatible(target)
    return prompt


def generate(target: LM, prompt_ids, max_new_tokens: int = 128, drafter=None, acceptor=None,
             sampling: Sampling = Sampling(), seed: int = 0, eos_token_id: int | None = -1) -> Generation:
    """Decode up to max_new_tokens new tokens from `target`, speculatively when a drafter is given.

    Stops exactly at max_new_tokens, and at EOS even inside an accepted block (pass
    eos_token_id=None to ignore EOS). All randomness comes from one torch.Generator seeded by `seed`.
    """
    prompt = _check(target, prompt_ids, max_new_tokens, drafter, sampling)
    acceptor = acceptor or Lossless()
    eos = target.eos_token_id if eos_token_id == -1 else eos_token_id
    gen = torch.Generator().manual_seed(seed)
    steps = []
    t_start = time.perf_counter()
    root = sample(probs(target.reset(prompt), sampling), gen)
    if drafter is not None:
        drafter.reset(prompt, sampling, gen)
    out = [root]
    done = root == eos
    while len(out) < max_new_tokens and not done:
        t0 = time.perf_counter()
        tree = drafter.draft(prompt + out) if drafter is not None else Tree([], [])
        t1 = time.perf_counter()
        logits = target.extend([root] + tree.tokens, [-1] + [p + 1 for p in tree.parents])
        p = probs(logits, sampling)
        path, root = acceptor(tree, p, sampling.greedy, gen)
        target.commit([0] + [i + 1 for i in path])
        accepted = [tree.tokens[i] for i in path]
        if drafter is not None:
            drafter.observe(accepted)
        t2 = time.perf_counter()
        out += accepted + [root]
        done = eos is not None and eos in accepted or root == eos
        steps.append({"drafted": len(tree), "accepted": len(path), "source": tree.source if len(tree) else None,
                      "draft_s": t1 - t0, "verify_s": t2 - t1})
    out = _truncate(out, max_new_tokens, eos)
    seconds = time.perf_counter() - t_start
    drafted = sum(s["drafted"] for s in steps)
    stats = {
        "steps": steps,
        "new_tokens": len(out),
        "target_calls": len(steps),          # verify passes after the prefill
        "acceptance_rate": sum(s["accepted"] for s in steps) / drafted if drafted else float("nan"),
        "tokens_per_call": len(out) / max(1, len(steps) + 1),   # the prefill's pass yields the first token
        "seconds": seconds,
        "tokens_per_s": len(out) / seconds,
    }
    return Generation(out, target.decode(out) if target.tokenizer is not None else "", stats)


def _truncate(out: list[int], max_new_tokens: int, eos: int | None) -> list[int]:
    out = out[:max_new_tokens]
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]
    return out
