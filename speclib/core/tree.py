"""A draft tree: nodes in topological order, each with a token and a parent (-1 = the root).

A chain is the tree with parents [-1, 0, 1, ...]. `q[i]` is the distribution node i was drawn from
(None for cache drafts: a point mass on the token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


def check_parents(parents: list[int], offset: int = 0) -> None:
    """Parents must form a forest in topological order: -1 or an earlier node's index.

    `offset` is the number of nodes that already exist (indices below it are valid parents).
    """
    for i, p in enumerate(parents):
        if not isinstance(p, int) or not -1 <= p < offset + i:
            raise ValueError(
                f"parents[{i}] = {p!r}: each parent must be -1 (the committed tip) or the "
                f"index of an earlier node (< {offset + i}); nodes must be in topological order"
            )


def path_to(parents, node: int) -> list[int]:
    """Root-to-node list of node indices (both ends included) in the forest `parents` (-1 = root)."""
    path = []
    while node >= 0:
        path.append(node)
        node = int(parents[node])
    return path[::-1]


def ancestor_mask(parents) -> torch.Tensor:
    """[N, N] bool, True where column j is row i or one of its ancestors.

    parents: N ints in topological order (-1 = root), as a list or an integer tensor [N]; a tensor
    [B, N] gives [B, N, N]. Vectorised on the parents' device by path doubling: from I + P (P = the
    parent edges), squaring the reachability matrix doubles the path length it covers, so
    ceil(log2 N) squarings reach every ancestor.
    """
    par = torch.as_tensor(parents, dtype=torch.long)
    N, dev = par.shape[-1], par.device
    edges = torch.zeros(*par.shape, N + 1, device=dev)
    # Column N is a sink for -1 (roots): scatter there, then drop it.
    edges.scatter_(-1, torch.where(par < 0, N, par).unsqueeze(-1), 1.0)
    M = edges[..., :N] + torch.eye(N, device=dev)
    for _ in range(max(1, math.ceil(math.log2(max(N, 2))))):
        M = (M @ M > 0).float()
    return M > 0


@dataclass
class Tree:
    tokens: list[int]
    parents: list[int]
    q: torch.Tensor | None = None  # [N, V] draft distributions, or None (point masses)
    source: str = "model"
    draft_logits: torch.Tensor | None = None  # [N, V] the draft model's raw logits (for CoSpec's features)
    children: list[list[int]] = field(init=False, repr=False)

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"tokens ({len(self.tokens)}) and parents ({len(self.parents)}) differ in length")
        check_parents(self.parents)
        if self.q is not None and self.q.shape[0] != len(self.tokens):
            raise ValueError(f"q has {self.q.shape[0]} rows for {len(self.tokens)} nodes")
        self.children = [[] for _ in range(len(self.tokens) + 1)]  # children[0] = the root's
        for i, p in enumerate(self.parents):
            self.children[p + 1].append(i)

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens, q=None, source="model") -> Tree:
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), q, source)

    @property
    def is_chain(self) -> bool:
        return self.parents == list(range(-1, len(self.parents) - 1))

    def depths(self) -> list[int]:
        d: list[int] = []
        for p in self.parents:
            d.append(0 if p < 0 else d[p] + 1)
        return d

    def path_to(self, node: int) -> list[int]:
        """Root-to-node list of node indices."""
        return path_to(self.parents, node)
