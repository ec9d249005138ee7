"""Token Recycling: draft trees from the target's own earlier top-k candidates (docs/training_free.md).

Every verify pass scores each of its nodes' next token over the whole vocabulary; plain decoding keeps
the one it samples and throws the rest away. Token Recycling keeps the top-k of every node in an
adjacency matrix M [V, k]: M[t] = the k most likely tokens after the last time t was verified (the
row is overwritten, not merged). A draft is a tree grown breadth-first from the root token through M
along a static template: node (parent, rank j) holds M[token of parent][j]. No draft model, no
datastore: the matrix costs V * k int32 (1.5 MB for SmolLM2's 49,152 tokens at k = 8).

The draft is deterministic (q = None, point masses), so `Lossless` verifies it exactly at any temperature.
"""

from __future__ import annotations

import heapq

import numpy as np
import torch

from speclib.core.protocols import LM
from speclib.core.sampling import Sampling
from speclib.core.tree import Tree

__all__ = ["TokenRecycling", "recycling_template", "expected_accepted"]


def recycling_template(nodes: int, rank_accept) -> tuple[list[int], list[int]]:
    """(parents, ranks) of the `nodes`-node tree with the most expected accepted tokens when the
    target's next token is the parent's j-th candidate with probability rank_accept[j] (independently
    at each depth): best-first over path values (the product of rank_accept along the path), so
    every node comes after its parent and the tree is in topological order."""
    a = [float(x) for x in rank_accept]
    if not isinstance(nodes, int) or nodes < 0:
        raise ValueError(f"nodes must be an int >= 0, got {nodes!r}")
    if not a or any(not 0 <= x <= 1 for x in a):
        raise ValueError(f"rank_accept must be probabilities in [0, 1], one per rank, got {rank_accept!r}")
    parents, ranks = [], []
    heap = [(-a[j], j, -1, j) for j in range(len(a)) if a[j] > 0]  # (-value, tie order, parent, rank)
    order = len(heap)
    heapq.heapify(heap)
    while heap and len(parents) < nodes:
        v, _, parent, rank = heapq.heappop(heap)
        parents.append(parent)
        ranks.append(rank)
        for j in range(len(a)):
            if a[j] > 0:
                heapq.heappush(heap, (v * a[j], order, len(parents) - 1, j))
                order += 1
    return parents, ranks


def expected_accepted(parents: list[int], ranks: list[int], rank_accept) -> float:
    """Expected accepted draft tokens per step of a template under rank_accept (the sum of its nodes'
    path values): each node is on the accepted path with the product of rank_accept along its path."""
    value: list[float] = []
    for p, r in zip(parents, ranks):
        value.append((1.0 if p < 0 else value[p]) * float(rank_accept[r]))
    return float(sum(value))


class TokenRecycling:
    """Drafts a tree from the adjacency matrix of the target's earlier top-k candidates.

    top_k      candidates kept per token (the matrix's width).
    nodes      the tree's size; the template is the best-first tree for `rank_accept`, the measured (or
               assumed) probability that the target's next token is a parent's j-th candidate. Choose
               nodes with the cost model: a tree of n nodes costs one target pass over n + 1 tokens.
    shared     True: the matrix carries over from one request to the next (a warm start, as in the
               paper); False: every request starts from an empty matrix (a cold start).

    The drafter learns from every verify pass through the `VerifyObserver` capability, which
    `speclib.generate` calls with the pass's tokens and logits. `rank_counts[j]` counts how often the
    target's next token after an accepted token was its row's j-th candidate (index top_k: not in the row);
    `fitted_rank_accept()` turns them into the rank_accept of a better template.
    """

    # the default template's rank_accept: a geometric guess, replaced by measured counts in the notebooks
    DEFAULT_RANK_ACCEPT = tuple(0.5 * 0.5**j for j in range(8))

    def __init__(self, top_k: int = 8, nodes: int = 24, rank_accept=None, shared: bool = True):
        if not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
        if not isinstance(nodes, int) or nodes < 1:
            raise ValueError(f"nodes must be an int >= 1 (the tree's size), got {nodes!r}")
        a = list(self.DEFAULT_RANK_ACCEPT[:top_k] if rank_accept is None else rank_accept)
        if not 0 < len(a) <= top_k or any(not 0 <= x <= 1 for x in a) or not any(a):
            raise ValueError(
                f"rank_accept must be 1 to top_k = {top_k} probabilities in [0, 1], not all 0 (the "
                f"chance the target takes a token's j-th candidate), got {rank_accept!r}"
            )
        a += [0.0] * (top_k - len(a))
        self.top_k, self.shared = top_k, shared
        self.parents, self.ranks = recycling_template(nodes, a)
        self.rank_accept = tuple(a)
        self.matrix: np.ndarray | None = None  # [V, top_k] int32, -1 = no candidate yet
        self.rank_counts = np.zeros(top_k + 1, dtype=np.int64)

    @property
    def max_nodes(self) -> int:
        return len(self.parents)

    def check_compatible(self, target: LM) -> None:
        if self.matrix is None or self.matrix.shape[0] != target.vocab_size:
            self.matrix = np.full((target.vocab_size, self.top_k), -1, dtype=np.int32)

    def reset(self, prompt: list[int], sampling: Sampling, gen: torch.Generator) -> None:
        if self.matrix is None:
            raise RuntimeError(
                "TokenRecycling.reset before check_compatible(target): the matrix needs the "
                "target's vocabulary size (speclib.generate calls it)"
            )
        if not self.shared:
            self.matrix.fill(-1)
        self.last: dict = {}

    def draft(self, context: list[int]) -> Tree:
        M, root = self.matrix, context[-1]
        kept = {-1: -1}  # template index -> tree index (-1: the root)
        tokens, parents, node_tokens = [], [], {-1: root}
        for i, (p, r) in enumerate(zip(self.parents, self.ranks)):
            if p not in kept:
                continue  # its parent had no candidate
            t = int(M[node_tokens[p], r])
            if t < 0:
                continue
            kept[i], node_tokens[i] = len(tokens), t
            tokens.append(t)
            parents.append(kept[p])
        # score: the expected accepted tokens of the nodes kept, under the template's rank_accept
        score = expected_accepted(parents, [self.ranks[i] for i in kept if i >= 0], self.rank_accept)
        self.last = dict(score=score, match_len=0, draft_len=len(tokens))
        return Tree(tokens, parents, None, source="recycling")

    def observe_verify(self, tokens: list[int], logits: torch.Tensor, path: list[int], next_token: int) -> None:
        """Learn from a verify pass: tokens = [root] + the tree's tokens, logits [N + 1, V] the target's
        raw logits (row i after tokens[i]), path the accepted tree nodes, next_token the token after them."""
        # which candidate the target took after each accepted token (the root, then the path); the
        # matrix is as the draft read it (nothing writes between draft and verify), whichever drafter
        # proposed the verified tree
        chain = [0] + [i + 1 for i in path]
        taken = [tokens[i] for i in chain[1:]] + [next_token]
        for row, t in zip(self.matrix[[tokens[i] for i in chain]], taken):
            hit = np.flatnonzero(row == t)
            self.rank_counts[hit[0] if len(hit) else self.top_k] += 1
        top = torch.topk(logits.float(), self.top_k, dim=-1).indices.numpy().astype(np.int32)
        # rows of the accepted path last: where a token occurs twice, its candidates in the true context win
        on_path = set(chain)
        order = [i for i in range(len(tokens)) if i not in on_path] + chain
        ids = np.asarray(tokens, dtype=np.int64)[order]
        # numpy assigns repeated indices in order, so the last occurrence of a token wins
        self.matrix[ids] = top[order]

    def observe(self, accepted: list[int]) -> None:
        pass  # the matrix was updated by observe_verify

    def with_template(self, nodes: int, rank_accept=None, shared: bool = True) -> TokenRecycling:
        """A drafter of `nodes` nodes for `rank_accept` (default: this one's fitted rates) that starts from
        a copy of this drafter's matrix: the warm start of a drafter whose matrix was filled on pilot
        prompts (with shared=False, a cold drafter empties it at every request)."""
        if self.matrix is None:
            raise RuntimeError("with_template before check_compatible(target): there is no matrix to start from")
        d = TokenRecycling(self.top_k, nodes, self.fitted_rank_accept() if rank_accept is None else rank_accept, shared)
        d.matrix = self.matrix.copy()
        return d

    def fitted_rank_accept(self) -> tuple[float, ...]:
        """P(the target's next token is the j-th candidate), j < top_k, from rank_counts."""
        total = self.rank_counts.sum()
        if not total:
            raise ValueError("no verify pass observed yet: run the drafter (speclib.generate) first")
        return tuple(float(c) / total for c in self.rank_counts[: self.top_k])
