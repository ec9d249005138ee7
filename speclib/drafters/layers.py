"""Layer-subset self-speculation on a hybrid model or a Llama: a view of the target's own weights that
runs only some of its decoder layers drafts for the full model (docs/self_speculation.md).

    layers = subset(target, "linear_early_exit", n=2)     # or any list of decoder-layer indices
    drafter = LayerSkipDrafter(target, layers, k=2)        # lossless: the full model verifies
    adapter, report = train_exit(target, layers, stream, steps=200)   # optional trained exit
    best = search_subsets(target, prompts, proxy_measure(target, windows), budget=30)

Every subset is a `HybridLM.view(layers=...)` (or `LlamaLM.view(layers=...)`) over the same weights
with its own decoding state, so there is no second model to train or keep in memory. An `ExitAdapter`
(a norm and a zero-initialised low-rank residual) sits before the target's frozen final norm and LM
head and is trained to bring the subset's next-token distribution closer to the full model's; the
target's weights are untouched.
"""

from __future__ import annotations

import torch

from speclib.core.sampling import Sampling
from speclib.drafters.model import ModelDrafter
from speclib.lms.hybrid import HybridLM, check_layers
from speclib.lms.llama import LlamaLM

KINDS = ("all", "linear", "linear_early_exit", "every_other", "first_n")


def _layered(target, who: str) -> HybridLM | LlamaLM:
    if not isinstance(target, (HybridLM, LlamaLM)):
        raise TypeError(
            f"{who} needs a HybridLM or a LlamaLM (speclib.lms), got {type(target).__name__}: "
            f"layer-subset self-drafts are views of its decoder layers"
        )
    return target


def subset(target: HybridLM, kind: str, n: int | None = None) -> list[int]:
    """The decoder-layer indices a named self-draft runs.

    "all"                the full model (the search's starting point)
    "linear"             every linear-attention (GDN) layer: all attention layers skipped
    "linear_early_exit"  the GDN layers among the first L - n: attention and the last n layers skipped
    "every_other"        layers 0, 2, 4, ...
    "first_n"            layers 0 .. n-1 (plain early exit)
    """
    L = len(_layered(target, "subset").is_gdn)
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    needs_n = kind in ("linear_early_exit", "first_n")
    if not needs_n and n is not None:
        raise ValueError(f"kind {kind!r} takes no n, got n={n!r}")
    if needs_n:
        top = L if kind == "first_n" else L - 1
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= top:
            raise ValueError(f"kind {kind!r} needs n, an int in [1, {top}] for this {L}-layer model, got {n!r}")
    if kind == "all":
        out = list(range(L))
    elif kind == "linear":
        out = [i for i in range(L) if target.is_gdn[i]]
    elif kind == "linear_early_exit":
        out = [i for i in range(L - n) if target.is_gdn[i]]
    elif kind == "every_other":
        out = list(range(0, L, 2))
    else:
        out = list(range(n))
    if not out:
        raise ValueError(f"kind {kind!r} with n={n} leaves no decoder layer of this model to run")
    return out


class LayerSkipDrafter(ModelDrafter):
    """A chain of k tokens drafted by the target's own decoder-layer subset `layers` (indices; see
    `subset`), optionally through an `ExitAdapter`. It shares the target's weights and keeps its own
    caches and recurrent states; the target verifies, so the output is the target's exactly."""

    def __init__(
        self,
        target: HybridLM,
        layers,
        k: int = 4,
        exit: torch.nn.Module | None = None,
        sampling: Sampling | None = None,
    ):
        _layered(target, "LayerSkipDrafter")
        self.layers = check_layers(layers, len(target.is_gdn))
        super().__init__(target.view(layers=self.layers, exit=exit), k, sampling)


# --- the trained exit -----------------------------------------------------------------------------------
class ExitAdapter(torch.nn.Module):
    """h + up(down(norm(h))) on the subset's last hidden state [..., D], before the target's frozen
    final norm and LM head. `up` starts at zero, so an untrained adapter is the identity and the
    subset's logits are unchanged; rank r adds 2 D r weights (fp32; the output keeps h's dtype).
    `down` is drawn from a generator seeded with `seed`, not the global RNG."""

    def __init__(self, hidden: int, rank: int = 16, eps: float = 1e-6, seed: int = 0):
        super().__init__()
        for name, val in (("hidden", hidden), ("rank", rank)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be an int >= 1, got {val!r}")
        self.norm = torch.nn.RMSNorm(hidden, eps=eps)
        self.down = torch.nn.Linear(hidden, rank, bias=False)
        self.up = torch.nn.Linear(rank, hidden, bias=False)
        with torch.no_grad():
            self.down.weight.normal_(0.0, hidden**-0.5, generator=torch.Generator().manual_seed(seed))
        torch.nn.init.zeros_(self.up.weight)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = h.float()
        return (x + self.up(self.down(self.norm(x)))).to(h.dtype)
