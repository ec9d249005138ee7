"""REST: retrieval-based drafting from a datastore of text (docs/training_free.md).

The datastore is a token stream and its suffix array, sorted by each suffix's first `max_len` tokens.
A draft looks up the longest suffix of the context (at most `max_len` tokens) that occurs in the
stream, takes the tokens that followed up to `max_candidates` of its occurrences, counts them in a trie
and drafts the `nodes` most frequent prefixes as a tree. The draft is deterministic (q = None), so
`Lossless` verifies it exactly at any temperature.

    python -m speclib datastore build TARGET OUT [--source chat|prompts|stdlib] [--n 320]   # build, save
"""

from __future__ import annotations

import heapq
from pathlib import Path

import numpy as np
import torch

from speclib.core.protocols import LM
from speclib.core.sampling import Sampling
from speclib.core.tree import Tree

__all__ = ["Datastore", "RestDrafter", "suffix_array"]


def _pair_ranks(first: np.ndarray, second_of: np.ndarray, offset: int) -> np.ndarray:
    """Dense ranks of the pairs (first[i], second_of[i + offset]), -1 past the end: the rank of a string
    made of the two parts, a part that runs past the end sorting before any token."""
    n = len(first)
    second = np.full(n, -1, dtype=np.int64)
    if offset < n:
        second[: n - offset] = second_of[offset:]
    order = np.lexsort((second, first))
    a, b = first[order], second[order]
    change = np.ones(n, dtype=bool)
    change[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.cumsum(change) - 1
    return rank


def suffix_array(tokens: np.ndarray, max_len: int) -> np.ndarray:
    """Positions of `tokens` sorted by their suffixes' first max_len tokens (a suffix that ends sooner
    sorts first; ties by position). Prefix doubling: the ranks by the first 2h tokens are the ranks of
    (rank by the first h, rank by the h after them); the ranks by max_len tokens combine the power-of-two
    ranks of its binary digits. About 2 log2(max_len) sorts of N integer pairs."""
    tokens = np.asarray(tokens, dtype=np.int64)
    ranks = {1: tokens}
    h = 1
    while 2 * h <= max_len:
        ranks[2 * h] = _pair_ranks(ranks[h], ranks[h], h)
        h *= 2
    rank, length = None, 0
    for p in sorted(ranks, reverse=True):
        if max_len - length >= p:
            rank = ranks[p] if rank is None else _pair_ranks(rank, ranks[p], length)
            length += p
    return np.argsort(rank, kind="stable")


class Datastore:
    """A token stream and its suffix array (by the first max_len tokens)."""

    def __init__(self, tokens, max_len: int = 16, sa: np.ndarray | None = None):
        tokens = np.asarray(tokens, dtype=np.int32)
        if tokens.ndim != 1 or not len(tokens):
            raise ValueError(f"the datastore needs a non-empty 1-D token stream, got shape {tokens.shape}")
        if not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"max_len must be an int >= 1, got {max_len!r}")
        self.tokens, self.max_len = tokens, max_len
        self.sa = suffix_array(tokens, max_len) if sa is None else np.asarray(sa, dtype=np.int64)
        if len(self.sa) != len(tokens):
            raise ValueError(f"suffix array has {len(self.sa)} entries for {len(tokens)} tokens")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.sa.nbytes

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, tokens=self.tokens, sa=self.sa, max_len=self.max_len)
        return path

    @classmethod
    def load(cls, path) -> Datastore:
        try:
            with np.load(Path(path)) as z:
                return cls(z["tokens"], int(z["max_len"]), z["sa"])
        except (OSError, KeyError, ValueError) as e:
            raise ValueError(
                f"cannot read a datastore from {path}: {e} (build one: python -m speclib datastore build TARGET OUT)"
            ) from e

    def _bound(self, s: list[int], upper: bool) -> int:
        """First suffix-array index whose suffix's first len(s) tokens are >= s (> s when upper)."""
        lo, hi, m, toks = 0, len(self.sa), len(s), self.tokens
        key = tuple(s)
        while lo < hi:
            mid = (lo + hi) // 2
            p = int(self.sa[mid])
            cur = tuple(toks[p : p + m].tolist())
            if cur < key or (upper and cur == key):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def occurrences(self, s: list[int]) -> np.ndarray:
        """Start positions of every occurrence of s (len(s) <= max_len), in position order."""
        if not 1 <= len(s) <= self.max_len:
            raise ValueError(f"the searched string must have 1 to max_len = {self.max_len} tokens, got {len(s)}")
        lo, hi = self._bound(s, False), self._bound(s, True)
        return np.sort(self.sa[lo:hi])


class RestDrafter:
    """Drafts a tree of the most frequent continuations of the context's longest suffix found in a datastore.

    max_suffix       longest context suffix searched (<= the datastore's max_len); shorter ones are tried
                     down to min_suffix until one occurs with a continuation.
    depth            tokens of continuation read after each occurrence.
    nodes            the tree's size: the `nodes` most frequent continuation prefixes (a prefix is at least
                     as frequent as its extensions, so they form a tree).
    max_candidates   occurrences read per draft (the first in position order: a fixed, cheap sample).
    """

    def __init__(
        self,
        datastore: Datastore,
        max_suffix: int = 8,
        min_suffix: int = 2,
        depth: int = 6,
        nodes: int = 16,
        max_candidates: int = 200,
    ):
        if not isinstance(datastore, Datastore):
            raise TypeError(f"datastore must be a speclib.drafters.rest.Datastore, got {type(datastore).__name__}")
        for name, v in (
            ("max_suffix", max_suffix),
            ("min_suffix", min_suffix),
            ("depth", depth),
            ("nodes", nodes),
            ("max_candidates", max_candidates),
        ):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if not min_suffix <= max_suffix <= datastore.max_len:
            raise ValueError(
                f"need min_suffix ({min_suffix}) <= max_suffix ({max_suffix}) <= the datastore's "
                f"max_len ({datastore.max_len})"
            )
        self.store, self.max_suffix, self.min_suffix = datastore, max_suffix, min_suffix
        self.depth, self.nodes, self.max_candidates = depth, nodes, max_candidates
        self.last: dict = {}

    @property
    def max_nodes(self) -> int:
        return self.nodes

    def check_compatible(self, target: LM) -> None:
        top = int(self.store.tokens.max())
        if top >= target.vocab_size:
            raise ValueError(
                f"the datastore holds token id {top}, outside the target's vocabulary of "
                f"{target.vocab_size}: it was built with another tokenizer"
            )

    def reset(self, prompt: list[int], sampling: Sampling, gen: torch.Generator) -> None:
        self.last = {}

    def observe(self, accepted: list[int]) -> None:
        pass  # the datastore is static

    def continuations(self, context: list[int]) -> tuple[int, list[list[int]]]:
        """(match length, continuation lists) for the longest context suffix found with a continuation."""
        toks, n = self.store.tokens, len(self.store.tokens)
        for m in range(min(self.max_suffix, len(context)), self.min_suffix - 1, -1):
            starts = self.store.occurrences(list(context[-m:]))
            starts = starts[starts + m < n][: self.max_candidates]
            if len(starts):
                return m, [toks[s + m : s + m + self.depth].tolist() for s in starts]
        return 0, []

    def draft(self, context: list[int]) -> Tree:
        m, conts = self.continuations(context)
        counts: dict[tuple[int, ...], int] = {}
        for c in conts:
            for d in range(1, len(c) + 1):
                counts[tuple(c[:d])] = counts.get(tuple(c[:d]), 0) + 1
        # best-first from the root: a prefix is counted at least as often as each extension, so every kept
        # node's parent is kept first; ties broken by the smaller token sequence
        children: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        for pre in counts:
            children.setdefault(pre[:-1], []).append(pre)
        heap = [(-counts[c], c) for c in children.get((), [])]
        heapq.heapify(heap)
        index: dict[tuple[int, ...], int] = {(): -1}
        tokens, parents = [], []
        while heap and len(tokens) < self.nodes:
            _, pre = heapq.heappop(heap)
            index[pre] = len(tokens)
            tokens.append(pre[-1])
            parents.append(index[pre[:-1]])
            for c in children.get(pre, []):
                heapq.heappush(heap, (-counts[c], c))
        spine, pre = [], ()  # the most frequent path: its share of the continuations
        while kids := [c for c in children.get(pre, []) if c in index]:
            pre = max(kids, key=lambda c: counts[c])
            spine.append(counts[pre] / len(conts))
        self.last = dict(
            score=float(len(conts)), match_len=m, candidates=len(conts), draft_len=len(tokens), probs=spine
        )
        return Tree(tokens, parents, None, source="rest")
