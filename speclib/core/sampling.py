"""Logits -> the processed distribution a token is actually drawn from.

Temperature, top-k and top-p are applied identically to the target (p) and the draft (q): the
lossless rule is exact only for the distributions the tokens were really sampled from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """temperature 0 means greedy; top_k 0 and top_p 1 mean no truncation."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_logits(logits: torch.Tensor) -> None:
    """-inf masks a token (probability 0, as logits processors produce); NaN, +inf, or a row that is all
    -inf has no distribution."""
    top = logits.amax(-1)  # NaN, +inf or -inf exactly when a row is bad: one sync
    if torch.isfinite(top).all():
        return
    if torch.isnan(top).any():
        raise ValueError("logits contain NaN; the model produced non-finite scores")
    if (top == float("inf")).any():
        raise ValueError("logits contain +inf (non-finite); only -inf is allowed, to mask a token")
    raise ValueError("a row of logits is all -inf (non-finite): every token is masked, none can be drawn")


def probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Processed distribution(s) over the vocabulary, fp32, shape of `logits` ([..., V]).

    Greedy gives the one-hot of the argmax, so the lossless rule reduces exactly to greedy matching.
    """
    check_logits(logits)
    logits = logits.float()
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        kth = logits.topk(sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    p = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1:
        sorted_p, idx = p.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always the first token)
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= sampling.top_p
        p = p.masked_fill(drop_sorted.scatter(-1, idx, drop_sorted), 0.0)
        p = p / p.sum(-1, keepdim=True)
    return p


def sample(p: torch.Tensor, gen: torch.Generator) -> int:
    """One draw from a 1-D distribution, using only `gen`."""
    return int(torch.multinomial(p, 1, generator=gen))
