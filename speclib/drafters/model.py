"""A smaller LM drafting a chain of k tokens, sampled from its processed distribution q."""

from __future__ import annotations

import torch

from speclib.core.protocols import LM
from speclib.core.sampling import Sampling, probs, sample
from speclib.core.tree import Tree


def check_draft_lm(lm: LM, target: LM) -> None:
    """A draft LM must score the target's vocabulary with the target's tokenizer."""
    if lm.vocab_size != target.vocab_size:
        raise ValueError(f"draft vocabulary ({lm.vocab_size}) differs from the target's ({target.vocab_size})")
    a, b = lm.tokenizer, target.tokenizer
    if a is not None and b is not None and a is not b and a.get_vocab() != b.get_vocab():
        raise ValueError("draft and target tokenizers differ: a draft must share the target's tokenizer")


class LMDrafter:
    """What the drafters over a draft LM share (`ModelDrafter`, `speclib.drafters.tree.TreeDrafter`): the
    draft LM's committed prefix is context[:fed]; draft() feeds the context's unfed tail (n_tail tokens)
    first and keeps the last draft in `tree`; observe() commits the tail plus the accepted drafted nodes
    that went through the draft LM."""

    def __init__(self, lm: LM, sampling: Sampling | None):
        self.lm = lm
        self.sampling_override = sampling  # None: use the target's (set by reset())
        self.tree: Tree | None = None

    def check_compatible(self, target: LM) -> None:
        check_draft_lm(self.lm, target)

    def reset(self, prompt: list[int], sampling: Sampling, gen: torch.Generator) -> None:
        """Prefill the draft; draft with the target's sampling (unless given one) and the run's generator."""
        self.lm.reset(prompt)
        self.fed = len(prompt)  # tokens in the draft's committed cache
        self.sampling, self.gen = self.sampling_override or sampling, gen
        self.tree = None

    def _keep(self, path: list[int]) -> None:
        """Commit the draft LM's pending nodes `path` (the tail first), which joins context[:fed]."""
        self.lm.commit(path)
        self.fed += len(path)

    def keep_tail(self) -> None:
        """Commit only the last draft's fed tail, so its drafted tokens are fed again next time (what
        `FeatureDrafter` needs: its head computed them from its own states, not the target's)."""
        self._keep(list(range(self.n_tail)))


class ModelDrafter(LMDrafter):
    def __init__(self, lm: LM, k: int = 4, sampling: Sampling | None = None):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k (draft length) must be an int >= 1, got {k!r}")
        super().__init__(lm, sampling)
        self.k = k

    @property
    def max_nodes(self) -> int:
        return self.k

    def draft(self, context: list[int]) -> Tree:
        tail = context[self.fed :]
        logits = self.lm.extend(tail, list(range(-1, len(tail) - 1)))[-1]
        tokens, qs, raw = [], [], []
        for i in range(self.k):
            q = probs(logits, self.sampling)
            x = sample(q, self.gen) if not self.sampling.greedy else int(q.argmax())
            tokens.append(x)
            qs.append(q)
            raw.append(logits)
            if i + 1 < self.k:
                logits = self.lm.extend([x], [len(tail) + i - 1])[0]
        self.n_tail = len(tail)
        tree = self.tree = Tree.chain(tokens, torch.stack(qs))
        tree.draft_logits = torch.stack(raw)
        return tree

    def observe(self, accepted: list[int]) -> None:
        """Keep the fed tail and the accepted drafted tokens that went through the draft model."""
        self._keep(list(range(self.n_tail + min(len(accepted), self.k - 1))))


class SelfDrafter(ModelDrafter):
    """Component-aware self-speculation: the target's own linear-attention subgraph (every
    full-attention decoder layer skipped) drafts a chain of k tokens. It shares the target's weights
    and keeps its own recurrent states; only hybrid LMs (`models.hybrid.HybridLM`) have such a subgraph."""

    def __init__(self, target: LM, k: int = 4, sampling: Sampling | None = None):
        from speclib.lms.hybrid import HybridLM

        if not isinstance(target, HybridLM):
            raise TypeError(
                f"SelfDrafter needs a hybrid LM (speclib.lms.hybrid.HybridLM), got "
                f"{type(target).__name__}: an attention-only model has no linear subgraph"
            )
        super().__init__(target.view(skip_attention=True), k, sampling)
