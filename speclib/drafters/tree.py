"""A draft LM proposing a TREE of tokens (SpecInfer / EAGLE-2 style), through the LM's extend/commit.

Three shapes:
  TreeDrafter(lm, branching=(3, 2, 1, 1))                  every node at depth d gets branching[d] children
  TreeDrafter(lm, budget=16, expand="confidence", depth=6, top=4)
                                                            EAGLE-2 style: children go to the nodes with
                                                            the highest path value (product of draft
                                                            probabilities along the path)
  TreeDrafter(lm, budget=8, expand="spine", depth=5, top=2, min_value=0.1)
                                                            the chain a ModelDrafter(lm, 5) would draft,
                                                            plus sibling LEAVES where the path value
                                                            times the sibling's draft probability is at
                                                            least min_value: the draft model runs exactly
                                                            as for the chain (leaves are never fed), so
                                                            a leaf costs only its verification

Siblings are drawn WITHOUT replacement (recursive rejection sampling, arXiv 2402.14160): the first
child from the processed draft distribution q, the next from q with the earlier siblings' tokens
removed and renormalised, and so on; `Tree.q[i]` is exactly the distribution node i was drawn from,
so `Lossless`'s residual rule (accept x w.p. min(1, p(x)/q_x(x)), else p <- norm(max(0, p - q_x)))
stays exact. In greedy mode the children are the top-b tokens by draft probability and the q rows are
one-hot on each node's token.

Losslessness constrains the shape rule: how many children a node gets (and whether it is expanded)
may depend on anything drawn BEFORE those children, never on a child's own token. So unlike EAGLE-2
there is no final re-ranking that prunes drawn nodes by their value: a node is kept once drawn, and
the budget is spent by deciding child counts in advance from scores that are known before drawing
(parent value x the j-th largest draft probability of the parent). Pruning a drawn sibling because of
its own token would bias the output (e.g. p = q = uniform on {a, b}, keep the child only if it is a:
P(a) = 3/4).

Draft-LM cache vs context: the draft LM's committed prefix is context[:fed]. draft() feeds the
unfed tail of the context (the last sampled token, plus an accepted leaf of the previous tree) as a
chain, then one extend per depth level for the nodes of the level just drawn (all of them, when a
deeper level follows); the last level's nodes are never fed. observe() commits the tail plus the
accepted nodes that went through the draft model: a prefix of the accepted path, since every node
with children was fed; an accepted unfed node (a leaf) stays in the next draft's tail.
"""

from __future__ import annotations

import math

import torch

from speclib.core.protocols import LM
from speclib.core.sampling import Sampling, probs, sample
from speclib.core.tree import Tree
from speclib.drafters.model import LMDrafter


class TreeDrafter(LMDrafter):
    """A draft LM proposing a tree; `reset / draft / observe / check_compatible / max_nodes`.

    With a budget, `min_value` > 0 drops every node ("spine": every leaf; the chain always runs to
    `depth`) whose path value (product of draft probabilities from the root) would fall below it,
    deciding before the node is drawn."""

    def __init__(
        self,
        lm: LM,
        branching=None,
        *,
        budget: int | None = None,
        expand: str = "confidence",
        depth: int = 6,
        top: int = 4,
        min_value: float = 0.0,
        sampling: Sampling | None = None,
    ):
        super().__init__(lm, sampling)
        if budget is None:
            branching = (3, 2, 1, 1) if branching is None else branching
            if (
                isinstance(branching, int)
                or not len(branching)
                or not all(isinstance(b, int) and b >= 1 for b in branching)
            ):
                raise ValueError(
                    f"branching must be a non-empty sequence of ints >= 1 (children per node at "
                    f"each depth), got {branching!r}"
                )
            self.mode, self.branching, self.depth = "fixed", tuple(branching), len(branching)
            self._max_nodes = sum(math.prod(self.branching[: d + 1]) for d in range(self.depth))
        else:
            if branching is not None:
                raise ValueError("give either branching=(...) (fixed shape) or budget=... (EAGLE-2 style), not both")
            for name, v in (("budget", budget), ("depth", depth), ("top", top)):
                if not isinstance(v, int) or v < 1:
                    raise ValueError(f"{name} must be an int >= 1, got {v!r}")
            if expand not in ("confidence", "spine"):
                raise ValueError(
                    f"expand must be 'confidence' (path value = product of draft probabilities) "
                    f"or 'spine' (a chain plus sibling leaves), got {expand!r}"
                )
            if expand == "spine" and budget < depth:
                raise ValueError(f"expand='spine' needs budget >= depth (the chain itself), got {budget} < {depth}")
            if not 0 <= min_value < 1:
                raise ValueError(
                    f"min_value (least path value of a drafted node) must lie in [0, 1), got {min_value!r}"
                )
            self.mode, self.budget, self.depth, self.top, self.min_value = expand, budget, depth, top, min_value
            self._max_nodes = budget

    @property
    def max_nodes(self) -> int:
        return self._max_nodes

    # --- drafting -----------------------------------------------------------------------------
    def draft(self, context: list[int]) -> Tree:
        tail = list(context[self.fed :])
        if not tail:
            raise ValueError(
                "draft(context): the context has no token beyond what the draft model has seen "
                "(it must end with the last sampled token)"
            )
        logits = self.lm.extend(tail, list(range(-1, len(tail) - 1)))[-1]
        self.n_tail = len(tail)
        tokens, parents, qs, values = [], [], [], []
        fed: list[int] = []  # draft-LM pending index of each node, -1 if never fed
        n_pending = len(tail)
        # frontier entries: (tree node or -1 for the root, its pending index, its logits, its path value)
        frontier = [(-1, len(tail) - 1, logits, 1.0)]
        remaining = self._max_nodes
        for d in range(self.depth):
            conf = [self._confidence(row) for _, _, row, _ in frontier]
            counts = self._child_counts(d, frontier, conf, remaining)
            new = []
            for (node, _, row, value), c, n_children in zip(frontier, conf, counts):
                for x, q in self._children(row, c, n_children):
                    tokens.append(x)
                    parents.append(node)
                    qs.append(q)
                    values.append(value * float(c[x]))
                    fed.append(-1)
                    new.append(len(tokens) - 1)
            remaining -= len(new)
            if not new or d + 1 == self.depth or remaining <= 0:
                break
            grow = new[:1] if self.mode == "spine" else new  # the spine's siblings stay leaves
            out = self.lm.extend(
                [tokens[i] for i in grow], [fed[parents[i]] if parents[i] >= 0 else len(tail) - 1 for i in grow]
            )
            for j, i in enumerate(grow):
                fed[i] = n_pending + j
            n_pending += len(grow)
            frontier = [(i, fed[i], out[j], values[i]) for j, i in enumerate(grow)]
        vocab = logits.shape[-1]
        self.fed_index = fed
        self.values = values  # path values (product of draft probabilities)
        self.tree = Tree(tokens, parents, torch.stack(qs) if qs else torch.zeros(0, vocab))
        return self.tree

    def _confidence(self, row: torch.Tensor) -> torch.Tensor:
        """Draft probabilities used to rank children and score paths: the processed q when sampling,
        the plain softmax in greedy mode (where q itself is one-hot)."""
        if self.sampling.greedy:
            return torch.softmax(row.float(), -1)
        return probs(row, self.sampling)

    def _child_counts(self, d: int, frontier, conf, remaining: int) -> list[int]:
        """How many children each frontier node gets at depth d, decided BEFORE drawing them."""
        support = [int((c > 0).sum()) for c in conf]
        if self.mode == "fixed":
            return [min(self.branching[d], s) for s in support]
        if self.mode == "spine":  # one frontier node: the chain's, which always continues
            (_, _, _, value), c = frontier[0], conf[0]
            spare = remaining - (self.depth - d)  # nodes left beyond the rest of the chain
            top = c.topk(min(self.top, support[0])).values.tolist()
            leaves = sum(value * pj >= self.min_value for pj in top[1:])
            return [1 + min(leaves, max(spare, 0))]
        # EAGLE-2 style: the best child slots of this level by parent value x j-th largest draft
        # probability of the parent; at most `top` per parent and per level, and the remaining budget
        # spread over the remaining levels so the tree can reach `depth`.
        width = min(self.top, remaining, math.ceil(remaining / (self.depth - d)))
        slots = []
        for f, ((_, _, _, value), c, s) in enumerate(zip(frontier, conf, support)):
            k = min(self.top, s)
            for j, pj in enumerate(c.topk(k).values.tolist()):
                if value * pj >= self.min_value:
                    slots.append((-value * pj, f, j))
        counts = [0] * len(frontier)
        for _, f, _ in sorted(slots)[:width]:  # ties: earlier node, then smaller j (keeps prefixes)
            counts[f] += 1
        return counts

    def _children(self, row: torch.Tensor, conf: torch.Tensor, n: int):
        """n children of one node: (token, the distribution it was drawn from), siblings distinct."""
        if n == 0:
            return []
        if self.sampling.greedy:
            top = conf.topk(n).indices.tolist()
            eye = torch.zeros(n, conf.shape[-1])
            eye[torch.arange(n), torch.tensor(top)] = 1.0
            return list(zip(top, eye))
        r = conf.clone()  # the processed q, earlier siblings removed
        out = []
        for _ in range(n):
            s = r.sum()
            if not s > 0:
                break
            q = r / s
            x = sample(q, self.gen)
            out.append((x, q))
            r = r.clone()
            r[x] = 0.0
        return out

    # --- after verification -------------------------------------------------------------------
    def observe(self, accepted: list[int]) -> None:
        """Commit the fed tail plus the accepted nodes that went through the draft model."""
        tree, keep, row = self.tree, list(range(self.n_tail)), 0
        for x in accepted:
            child = next((c for c in tree.children[row] if tree.tokens[c] == x), None)
            if child is None:
                raise ValueError(f"observe: accepted tokens {accepted} are not a root path of the last draft tree")
            if self.fed_index[child] < 0:  # a leaf: never fed, stays in the context's tail
                break
            keep.append(self.fed_index[child])
            row = child + 1
        self._keep(keep)
