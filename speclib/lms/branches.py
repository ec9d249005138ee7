"""Self-drafts of parallel hybrids: models whose every decoder layer runs an attention branch beside a
recurrent (SSM) mixer on the same normed input and adds the two (Falcon-H1: Mamba2 + attention).

Skipping the attention branch of every layer leaves the model's linear subgraph: embeddings, the SSM
mixers, the MLPs and the LM head. `BranchSkipLM(target)` is that subgraph as an LM: the target's own
weights (no copy), its own cache and recurrent states, and the attention modules swapped for a zero
output while it runs, so no attention is computed and no K/V is stored. It drafts through the stock
`ModelDrafter`; the full model verifies, so the output stays exactly the target's.

    draft = BranchSkipLM(target)                     # target: speclib.load("falcon-h1-tiny")
    drafter = speclib.ModelDrafter(draft, k=2)       # lossless: the full model verifies

This is the sequential-hybrid `HybridLM.view(layers=...)` (speclib.drafters.layers) for the other
layout: there a layer IS attention or linear attention, so a subset drops whole layers; here every
layer holds both, so the view drops a branch inside each layer.
"""

from __future__ import annotations

import contextlib

import torch

from speclib.lms.stateful import StatefulLM

# model_type -> the attribute of each decoder layer holding its attention branch (called with the
# layer's normed hidden states; returns (output, attention weights))
ATTENTION_BRANCH = {"falcon_h1": "self_attn"}


class _ZeroBranch(torch.nn.Module):
    """Stands in for a skipped attention module: contributes nothing to the residual stream."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        return torch.zeros_like(hidden_states), None


class BranchSkipLM(StatefulLM):
    """The linear subgraph of a parallel hybrid (module docstring) as a chain LM sharing the target's
    weights. `target` is the StatefulLM of a model whose type `ATTENTION_BRANCH` names."""

    def __init__(self, target: StatefulLM):
        kind = getattr(getattr(target, "config", None), "model_type", None)
        if not isinstance(target, StatefulLM) or kind not in ATTENTION_BRANCH:
            raise TypeError(
                f"BranchSkipLM needs a StatefulLM of a parallel hybrid ({', '.join(ATTENTION_BRANCH)}), got "
                f"{type(target).__name__} ({kind}); for Qwen3.5-style hybrids, whose layers are either attention "
                f"or linear attention, use speclib.drafters.layers.subset(target, 'linear') and LayerSkipDrafter"
            )
        super().__init__(target.model, target.tokenizer, target.device, target.path)
        name = ATTENTION_BRANCH[kind]
        self._slots = [(layer, name, getattr(layer, name)) for layer in target.model.model.layers]
        self._zero = _ZeroBranch()

    @contextlib.contextmanager
    def _skipping(self):
        for layer, name, _ in self._slots:
            setattr(layer, name, self._zero)
        try:
            yield
        finally:  # the target's forwards run the same modules: always put attention back
            for layer, name, module in self._slots:
                setattr(layer, name, module)

    def _forward(self, ids: torch.Tensor, start: int, all_logits: bool = True) -> torch.Tensor:
        with self._skipping():
            return super()._forward(ids, start, all_logits)
