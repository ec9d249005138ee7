"""Lookahead decoding as a drafter: Jacobi guesses and the n-grams they leave behind (docs/training_free.md).

Each verify pass carries two branches in one tree:

- the *lookahead branch*: W diagonals of N - 1 guessed tokens. Diagonal i holds guesses for the
  positions i + 1 ... i + N - 1 after the root; its first tokens, one per diagonal, form the trunk
  (a chain from the root: trunk node i is diagonal i's first guess), and the rest of diagonal i hangs
  off trunk node i as a chain. The target's argmax after a diagonal's last token is a guess for the
  position after it: one Jacobi iteration per diagonal per pass. The diagonal plus that guess is an
  n-gram (N tokens) that goes into the pool, keyed by its first token, and the diagonal moves on
  (its first token dropped, the new guess appended), as the window moves by one position per step.
- the *verification branch*: the pool's n-grams (up to G, the most recent first) keyed by the root
  token, each a chain of its N - 1 continuation tokens.

Equal tokens under equal parents are merged (a trie), so every node has one context and one score.
Any path of the tree may be accepted, the trunk's too (that is Jacobi decoding's own acceptance); the
target verifies every node, so the output is the target's whatever the guesses. The draft is
deterministic (q = None), so `Lossless` verifies it exactly at any temperature.

Its cost per step: one target pass over 1 + up to (W + G)(N - 1) tokens. On hardware where the pass
costs the same for 1 and for 60 tokens (a GPU at batch 1) the lookahead branch is free; on a CPU it is
not, so W, N and G must come from the cost model (notebooks 02 and 07).
"""

from __future__ import annotations

import random
from collections import OrderedDict

import torch

from speclib.core.protocols import LM
from speclib.core.sampling import Sampling
from speclib.core.tree import Tree

__all__ = ["Lookahead"]


class Lookahead:
    """window (W) diagonals of ngram - 1 (N - 1) guesses; guesses (G) n-grams verified per step;
    pool_per_key n-grams kept per first token (least recently seen dropped first); shared: the pool
    carries over between requests (the window always restarts from the prompt); seed: the window's
    first guesses are tokens drawn from the prompt with this seed (the run's generator is left alone)."""

    def __init__(
        self,
        window: int = 4,
        ngram: int = 4,
        guesses: int = 4,
        pool_per_key: int = 16,
        shared: bool = False,
        seed: int = 0,
    ):
        for name, v, lo in (
            ("window", window, 1),
            ("ngram", ngram, 2),
            ("guesses", guesses, 0),
            ("pool_per_key", pool_per_key, 1),
        ):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        if guesses > pool_per_key:
            raise ValueError(
                f"guesses ({guesses}) cannot exceed pool_per_key ({pool_per_key}): they come from the pool"
            )
        self.window, self.ngram, self.guesses, self.pool_per_key = window, ngram, guesses, pool_per_key
        self.shared, self.seed = shared, seed
        self.pool: dict[int, OrderedDict] = {}  # first token -> OrderedDict(continuation tuple -> None)
        self.diagonals: list[list[int]] = []

    @property
    def max_nodes(self) -> int:
        return (self.window + self.guesses) * (self.ngram - 1)

    def check_compatible(self, target: LM) -> None:
        pass  # token ids only

    def reset(self, prompt: list[int], sampling: Sampling, gen: torch.Generator) -> None:
        if not prompt:
            raise ValueError("Lookahead needs a non-empty prompt to draw its first guesses from")
        if not self.shared:
            self.pool = {}
        rng = random.Random(self.seed)
        self.diagonals = [[rng.choice(prompt) for _ in range(self.ngram - 1)] for _ in range(self.window)]
        self._tokens: list[int] | None = None

    def candidates(self, token: int) -> list[tuple[int, ...]]:
        """The verification branch for `token`: up to G continuations, the most recently seen first."""
        kept = self.pool.get(token)
        return list(reversed(kept))[: self.guesses] if kept else []

    def add(self, ngram: list[int]) -> None:
        """Put an n-gram in the pool (moved to the most recent end if already there)."""
        kept = self.pool.setdefault(ngram[0], OrderedDict())
        cont = tuple(ngram[1:])
        kept.pop(cont, None)
        kept[cont] = None
        if len(kept) > self.pool_per_key:
            kept.popitem(last=False)

    def draft(self, context: list[int]) -> Tree:
        tokens: list[int] = []
        parents: list[int] = []
        node: dict[tuple[int, int], int] = {}  # (parent, token) -> node: the trie

        def child(parent: int, token: int) -> int:
            key = (parent, token)
            if key not in node:
                node[key] = len(tokens)
                tokens.append(token)
                parents.append(parent)
            return node[key]

        for cont in self.candidates(context[-1]):
            p = -1
            for t in cont:
                p = child(p, t)
        self._ends, trunk = [], -1
        for diag in self.diagonals:
            trunk = child(trunk, diag[0])
            p = trunk
            for t in diag[1:]:
                p = child(p, t)
            self._ends.append(p)  # the node after which the next guess is scored
        self._tokens = tokens
        return Tree(tokens, parents, None, source="lookahead")

    def observe_verify(self, tokens: list[int], logits: torch.Tensor, path: list[int], next_token: int) -> None:
        """One Jacobi iteration: each diagonal's next guess is the target's argmax after its last node;
        the diagonal and that guess are an n-gram for the pool, and the diagonal moves on by one. A pass
        over another drafter's tree (Lookahead as one of several sources) holds no diagonal: nothing moves."""
        if tokens[1:] != self._tokens:
            return
        guess = logits[[1 + e for e in self._ends]].argmax(-1).tolist()
        for diag, g in zip(self.diagonals, guess):
            self.add(diag + [g])
            diag.append(g)
            del diag[0]

    def observe(self, accepted: list[int]) -> None:
        pass  # the pool and window moved in observe_verify
