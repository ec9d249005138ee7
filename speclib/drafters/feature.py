"""Feature-level drafting (EAGLE / EAGLE-2 / EAGLE-3 style): a one-layer head over the target's own
hidden features, chains of k or dynamic trees under a node budget. Maths: docs/feature_drafting.md.

The head is wrapped as an LM (`HeadLM`), so the chain and tree logic of `ModelDrafter` and
`TreeDrafter` (sampling from the processed q, siblings without replacement, Tree.q filled) drive it
unchanged. Head slot j holds the pair (feature of position j - 1, token j) and its output scores token
j + 1. A node whose position's feature is committed in the target reads the target's feature (fused);
a drafted node reads its parent's output state instead (the head's own guess of that feature).
"""

from __future__ import annotations

import torch

from speclib.core.protocols import LM, FeatureLM
from speclib.core.sampling import Sampling
from speclib.core.tree import Tree
from speclib.drafters.model import ModelDrafter
from speclib.drafters.tree import TreeDrafter
from speclib.lms.head import HeadLM


class FeatureDrafter:
    """EAGLE-style drafter: `FeatureDrafter(target, head, k=4)` drafts a chain of k tokens;
    `tree=budget` drafts an EAGLE-2 dynamic tree of depth k with at most `budget` nodes (children go to
    the nodes with the highest path value, the product of draft probabilities, at most `top` per node;
    the rules of `TreeDrafter(..., expand="confidence")`, which keep sampling lossless).

    The target must be a `speclib.core.protocols.FeatureLM`; building the drafter switches its feature
    recording on (for the head's layers), so build it before decoding. Draft tokens come from the
    head's distribution processed by the target's Sampling (or `sampling`), with the run's generator.
    observe() keeps only the head's slots computed from the target's true features: drafted slots
    (computed from the head's own states) are recomputed from true features on the next draft.

    vocab: token ids the head may draft (FR-Spec: e.g. the most frequent ones, `frequent_tokens`); the
    LM head then scores only those rows, a large share of a draft step for a big vocabulary. Drafting
    stays lossless: the target verifies over its whole vocabulary, and a token outside `vocab` simply
    has draft probability 0 (the residual distribution gives it its full target probability)."""

    def __init__(
        self,
        target: LM,
        head,
        k: int = 4,
        tree: int | None = None,
        top: int = 4,
        sampling: Sampling | None = None,
        vocab=None,
    ):
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k (draft depth) must be an int >= 1, got {k!r}")
        if tree is not None and (not isinstance(tree, int) or isinstance(tree, bool) or tree < 1):
            raise ValueError(f"tree (node budget) must be None (a chain) or an int >= 1, got {tree!r}")
        if not isinstance(top, int) or top < 1:
            raise ValueError(f"top (most children per node) must be an int >= 1, got {top!r}")
        self.target, self.head, self.k = target, head, k
        self._check_target(target)
        target.record_features(head.feature_layers)
        if vocab is not None:
            vocab = torch.as_tensor(vocab).long()
            if (
                vocab.ndim != 1
                or vocab.numel() == 0
                or int(vocab.min()) < 0
                or int(vocab.max()) >= target.vocab_size
                or vocab.unique().numel() != vocab.numel()
            ):
                raise ValueError(
                    f"vocab must be distinct token ids in [0, {target.vocab_size}), got {vocab.numel()} ids"
                )
        self.lm = HeadLM(head, target, vocab)
        self.inner = (
            ModelDrafter(self.lm, k, sampling)
            if tree is None
            else TreeDrafter(self.lm, budget=tree, expand="confidence", depth=k, top=top, sampling=sampling)
        )

    def _check_target(self, target) -> None:
        if not isinstance(target, FeatureLM):
            raise ValueError(
                f"FeatureDrafter needs a target with the FeatureLM capability (speclib.core.protocols): "
                f"{type(target).__name__} does not hand out hidden features; use LlamaLM, HFLM or HybridLM"
            )
        c = self.head.config
        mine = target.weights_fingerprint()
        if c.get("fingerprint") != mine:
            raise ValueError(
                f"this head was trained for {c.get('target')!r} (weights fingerprint {c.get('fingerprint')}), "
                f"not for this target (fingerprint {mine}): load the head trained for it, or train one "
                f"with `python -m speclib train head TARGET`"
            )
        if c["vocab_size"] != target.vocab_size or c["hidden_size"] != target.hidden_size:
            raise ValueError(
                f"head shape (vocab {c['vocab_size']}, hidden {c['hidden_size']}) does not fit the "
                f"target (vocab {target.vocab_size}, hidden {target.hidden_size})"
            )

    @property
    def max_nodes(self) -> int:
        return self.inner.max_nodes

    @property
    def tree(self) -> Tree | None:
        return self.inner.tree

    def check_compatible(self, target: LM) -> None:
        if target is not self.target:
            raise ValueError(
                "this FeatureDrafter reads the features of the target it was built with; "
                "build one for this target: FeatureDrafter(target, head)"
            )
        self._check_target(target)

    def reset(self, prompt: list[int], sampling: Sampling, gen: torch.Generator) -> None:
        if self.target.feature_layers != self.head.feature_layers:
            raise RuntimeError(
                f"the target records features {self.target.feature_layers}, the head reads "
                f"{self.head.feature_layers}: one target serves one FeatureDrafter at a time"
            )
        if self.target.committed_features(0).shape[0] != len(prompt):
            raise RuntimeError("FeatureDrafter.reset: reset the target on the prompt first (generate does)")
        self.inner.reset(prompt, sampling, gen)

    def draft(self, context: list[int]) -> Tree:
        return self.inner.draft(context)

    def observe(self, accepted: list[int]) -> None:
        """Commit the tail fed from true features; the accepted drafted tokens are re-fed next time."""
        self.inner.keep_tail()


def frequent_tokens(counts, n: int) -> torch.Tensor:
    """The `n` most frequent token ids of `counts` [V] (ties by id): FR-Spec's drafting vocabulary."""
    counts = torch.as_tensor(counts, dtype=torch.float64)
    if not 1 <= n <= counts.numel():
        raise ValueError(f"n must be in [1, {counts.numel()}], got {n}")
    return torch.argsort(-counts, stable=True)[:n].sort().values
