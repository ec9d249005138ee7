"""Parameter-free cache drafters: copy what followed an earlier occurrence of the context's suffix.

Their drafts carry no q: `Tree.q = None`, a point mass on each token, which `Lossless` handles
exactly (accept x with probability p(x); on rejection sample from p with x removed, renormalised).

    PromptLookupDrafter(max_ngram=3, k=10)   n-gram match over prompt + output (transformers' prompt lookup)
    SuffixDrafter(max_depth=32, max_spec=16)  SuffixDecoding: a per-request suffix tree over prompt +
                                              output and a global one over earlier outputs, frequency
                                              probabilities, a draft length growing with the match length
"""

from __future__ import annotations

from collections import deque

import torch

from speclib.core.protocols import LM
from speclib.core.sampling import Sampling
from speclib.core.tree import Tree


class _CacheDrafter:
    """reset / draft / observe / check_compatible / max_nodes for drafters that only read tokens."""

    def check_compatible(self, target: LM) -> None:
        pass  # token ids only: any target vocabulary works

    @property
    def max_nodes(self) -> int:
        return self.k

    def observe(self, accepted: list[int]) -> None:
        pass  # draft() reads the whole context; nothing to commit


class PromptLookupDrafter(_CacheDrafter):
    """Match the last n tokens (n = max_ngram down to 1) at their EARLIEST earlier occurrence in
    prompt + output with a continuation, and copy up to k following tokens (as transformers'
    `prompt_lookup_num_tokens` / `max_matching_ngram_size`)."""

    def __init__(self, max_ngram: int = 3, k: int = 10):
        for name, v in (("max_ngram", max_ngram), ("k", k)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        self.max_ngram, self.k = max_ngram, k

    def reset(self, prompt: list[int], sampling: Sampling, gen: torch.Generator) -> None:
        self.match_len, self.last = 0, {}

    def draft(self, context: list[int]) -> Tree:
        ctx = torch.as_tensor(context)
        L = len(context)
        cont, self.match_len = [], 0
        for n in range(min(self.max_ngram, L - 1), 0, -1):
            windows = ctx[: L - 1].unfold(0, n, 1) if L - 1 >= n else ctx[:0].view(0, n)
            hits = (windows == ctx[L - n :]).all(1).nonzero().flatten().tolist()
            # earliest first; the continuation must exist
            cont = next((c for start in hits if (c := context[start + n : start + n + self.k])), [])
            if cont:
                self.match_len = n
                break
        # no frequencies: every copied token counts as certain (HVD's features, `ScoredDrafter`)
        self.last = dict(score=float(len(cont)), match_len=self.match_len, draft_len=len(cont), probs=[1.0] * len(cont))
        return Tree.chain(cont, None, source="prompt_lookup")


class SuffixTree:
    """Counts of every substring of length <= max_depth of the sequences added (a bounded suffix
    trie). Node = dict token -> [count, children]; count(s) = occurrences of s. Sequences can be added
    whole (`add`), removed whole (`remove`, for eviction), or grown one token at a time (`Cursor`)."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root: dict = {}

    def _walk_all(self, seq: list[int], delta: int) -> None:
        for i in range(len(seq)):
            node = self.root
            for t in seq[i : i + self.max_depth]:
                entry = node.get(t)
                if entry is None:
                    entry = node[t] = [0, {}]
                entry[0] += delta
                if entry[0] <= 0:
                    del node[t]
                    break
                node = entry[1]

    def add(self, seq: list[int]) -> None:
        self._walk_all(list(seq), +1)

    def remove(self, seq: list[int]) -> None:
        self._walk_all(list(seq), -1)

    def find(self, s: list[int]) -> dict | None:
        """The children dict of the node for string s (None if s does not occur)."""
        node = self.root
        for t in s:
            entry = node.get(t)
            if entry is None:
                return None
            node = entry[1]
        return node


class _Cursor:
    """The nodes of one tree that match each suffix of a growing context, longest first, kept up to
    date in O(max_depth) per appended token. If `insert`, appending also adds the token to the tree
    (the per-request tree over prompt + output); else it only follows (the global tree)."""

    def __init__(self, tree: SuffixTree, insert: bool):
        self.tree, self.insert = tree, insert
        self.active: list[dict] = []  # children dicts for suffixes of length 1, 2, ... (shortest first)

    def append(self, t: int) -> None:
        nxt = []
        for node in [self.tree.root] + self.active[: self.tree.max_depth - 1]:
            entry = node.get(t)
            if entry is None:
                if not self.insert:
                    break  # longer suffixes cannot occur either
                entry = node[t] = [0, {}]
            if self.insert:
                entry[0] += 1
            nxt.append(entry[1])
        self.active = nxt

    def longest_with_children(self) -> tuple[int, dict | None]:
        """(match length m, node) for the longest context suffix whose node has a continuation."""
        for m in range(len(self.active), 0, -1):
            node = self.active[m - 1]
            if node:
                return m, node
        return 0, None


class SuffixDrafter(_CacheDrafter):
    """SuffixDecoding-style cache drafter.

    For the longest suffix of the context (length m < max_depth) found with a continuation, in the
    per-request tree (prompt + output so far) or the global tree (outputs of earlier requests of the
    same drafter, at most global_tokens tokens, oldest evicted first), walk the most frequent child:
    each token's probability is the running product of child count / sum of sibling counts; stop when
    it falls below min_token_prob or at min(max_spec, m * factor + offset) tokens. The draft's score
    is the sum of those probabilities, an estimate of its expected accepted length; the source with
    the higher score wins. `last` holds the features of the last draft (for payoff predictors)."""

    def __init__(
        self,
        max_depth: int = 32,
        max_spec: int = 16,
        factor: float = 1.0,
        offset: float = 0.0,
        min_token_prob: float = 0.1,
        global_tokens: int = 100_000,
    ):
        if not isinstance(max_depth, int) or max_depth < 1 or not isinstance(max_spec, int) or max_spec < 1:
            raise ValueError(f"max_depth and max_spec must be ints >= 1, got {max_depth!r}, {max_spec!r}")
        if not 0 <= min_token_prob <= 1:
            raise ValueError(f"min_token_prob must lie in [0, 1], got {min_token_prob!r}")
        self.max_depth, self.k = max_depth, max_spec
        self.factor, self.offset, self.min_token_prob = factor, offset, min_token_prob
        self.global_tree, self.global_tokens = SuffixTree(max_depth), global_tokens
        self.history: deque[list[int]] = deque()
        self.request: list[int] | None = None
        self.prompt_len = 0

    def reset(self, prompt: list[int], sampling: Sampling, gen: torch.Generator) -> None:
        if self.request is not None:  # the previous request's output joins the global tree
            self._remember(self.request[self.prompt_len :])
        self.local = SuffixTree(self.max_depth)
        self.cur_local, self.cur_global = _Cursor(self.local, True), _Cursor(self.global_tree, False)
        self.request, self.prompt_len = [], len(prompt)
        self.last: dict = {}

    def _remember(self, output: list[int]) -> None:
        if not output:
            return
        self.global_tree.add(output)
        self.history.append(output)
        while sum(map(len, self.history)) > self.global_tokens and len(self.history) > 1:
            self.global_tree.remove(self.history.popleft())

    def draft(self, context: list[int]) -> Tree:
        for t in context[len(self.request) :]:  # incremental: only the new tokens
            self.cur_local.append(t)
            self.cur_global.append(t)
            self.request.append(t)
        best = (0.0, [], [], 0, "none")
        for name, cur in (("local", self.cur_local), ("global", self.cur_global)):
            m, node = cur.longest_with_children()
            if node is None:
                continue
            limit = max(1, min(self.k, int(m * self.factor + self.offset)))
            tokens, probs, prob = [], [], 1.0
            while node and len(tokens) < limit:
                total = sum(e[0] for e in node.values())
                t, (c, children) = max(node.items(), key=lambda kv: (kv[1][0], -kv[0]))  # ties: smaller id
                prob *= c / total
                if prob < self.min_token_prob:
                    break
                tokens.append(t)
                probs.append(prob)
                node = children
            if tokens and sum(probs) > best[0]:
                best = (sum(probs), tokens, probs, m, name)
        score, tokens, probs, m, name = best
        self.last = dict(
            score=score,
            match_len=m,
            draft_len=len(tokens),
            tree=name,
            probs=probs,
            position=len(context) - self.prompt_len,
        )
        return Tree.chain(tokens, None, source="suffix")
