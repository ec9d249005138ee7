"""Acceptance rules. p = target, q = draft, everywhere (both already processed by `sampling.probs`).

Every rule is an `Acceptor`, called as stated in `speclib.core.protocols.Acceptor`; a cache draft
(Tree.q None) is a point mass on each token.
"""

from __future__ import annotations

import torch

from speclib.core.sampling import sample
from speclib.core.tree import Tree


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): where to sample after rejecting a token drawn from q."""
    r = (p - q).clamp_min(0)
    s = r.sum()
    # s == 0 only when p <= q everywhere, i.e. p == q, where rejection has probability 0: keep p.
    return r / s if s > 0 else p


def accept_probability(p: torch.Tensor, q: torch.Tensor, x: int) -> float:
    """min(1, p(x) / q(x)); q(x) > 0 for any token actually drawn from q."""
    return min(1.0, float(p[x] / q[x])) if q[x] > 0 else 1.0


class Lossless:
    """Leviathan/Chen rejection sampling on chains, SpecInfer's multi-draft residual rule on trees.

    At a node, children are tried in order: child x (drawn from q_x) is accepted with probability
    min(1, p(x)/q_x(x)); on rejection p <- norm(max(0, p - q_x)) and the next child is tried; if none
    is accepted the next token is drawn from what is left of p. When all drafted tokens on a path are
    accepted, the bonus token comes from p after the last one. The output is distributed exactly as p.
    Greedy (temperature 0: p and q one-hot) is the same rule: accept while argmax p equals the token.
    The protocol's `logits` keyword is unused: p and q decide.
    """

    def __call__(self, tree: Tree, p: torch.Tensor, greedy: bool, gen: torch.Generator, logits=None):
        if greedy:
            return self._greedy(tree, p)
        path, row, dist = [], 0, p[0]
        while True:
            for child in tree.children[row]:
                x = tree.tokens[child]
                q = tree.q[child] if tree.q is not None else _point_mass(x, dist)
                if float(torch.rand((), generator=gen)) < accept_probability(dist, q, x):
                    path.append(child)
                    row, dist = child + 1, p[child + 1]
                    break
                dist = residual(dist, q)
            else:
                return path, sample(dist, gen)

    @staticmethod
    def _greedy(tree: Tree, p: torch.Tensor):
        best = p.argmax(-1).tolist()
        path: list[int] = []
        row = 0
        while True:
            child = next((c for c in tree.children[row] if tree.tokens[c] == best[row]), None)
            if child is None:
                return path, best[row]
            path.append(child)
            row = child + 1


def _point_mass(x: int, like: torch.Tensor) -> torch.Tensor:
    q = torch.zeros_like(like)
    q[x] = 1.0
    return q


def output_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Exact distribution of the token the rule emits at one position, no sampling:
    P(x) = q(x)·min(1, p(x)/q(x)) + (1 - Σ_y q(y)·min(1, p(y)/q(y)))·norm(max(0, p - q))(x).
    Equals p for every (p, q): the lossless property, checked in tests and notebook 01."""
    p, q = p.double(), q.double()
    ratio = torch.where(q > 0, p / q.clamp_min(1e-300), torch.ones_like(p)).clamp(max=1)
    accepted = q * ratio
    return accepted + (1 - accepted.sum()) * residual(p, q)
