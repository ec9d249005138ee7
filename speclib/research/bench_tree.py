"""Measurements for tree speculation on hybrid models (notebook 03): verification latency and
speculative-state memory per strategy, the batch-wide node budget, and self-speculation quality.

Strategies (speclib.lms.hybrid): "closed_form" (factors, fold on commit), "materialize" (a full
state per node), and "replay" — which cannot take a tree, so a tree is verified branch by branch:
one chain extend per root-to-leaf path, the prior art for stacks without tree support.
"""

from __future__ import annotations

import statistics

import torch

from speclib.core.device import clock
from speclib.kernels.tree_gdn import recurrent_gated_delta_rule, tree_gdn
from speclib.lms.hybrid import extend_batch


def random_tree(n: int, depth: int, gen: torch.Generator) -> list[int]:
    """Parents of an n-node draft-like forest under the root: level sizes grow then shrink as in
    confidence-expanded trees; each node's parent is a node of the previous level, earlier (higher-
    ranked) nodes more likely. Depth is at most `depth`."""
    levels = max(1, min(depth, n))
    w = torch.linspace(1.0, 2.0, levels) * torch.linspace(2.0, 1.0, levels)  # bulge in the middle
    sizes = [1] * levels
    for _ in range(n - levels):
        sizes[int(torch.multinomial(w, 1, generator=gen))] += 1
    parents, prev = [], [-1]
    for s in sizes:
        weights = 1.0 / torch.arange(1, len(prev) + 1, dtype=torch.float)
        cur = []
        for _ in range(s):
            parents.append(prev[int(torch.multinomial(weights, 1, generator=gen))])
            cur.append(len(parents) - 1)
        prev = cur
    return parents


def leaf_paths(parents: list[int]) -> list[list[int]]:
    """Root-to-leaf node paths of a forest."""
    has_child = set(p for p in parents if p >= 0)
    paths = []
    for leaf in (i for i in range(len(parents)) if i not in has_child):
        path, node = [], leaf
        while node >= 0:
            path.append(node)
            node = parents[node]
        paths.append(path[::-1])
    return paths


def verify_once(views: list, tokens: list[int], parents: list[int]) -> float:
    """Seconds to score every node of one tree per request (all requests in one forward), then drop
    the nodes. Views in "replay" mode verify branch by branch."""
    dev = views[0].device
    t0 = clock(dev)
    if views[0].strategy == "replay":
        for path in leaf_paths(parents):
            chain = [tokens[j] for j in path]
            extend_batch(views, [chain] * len(views), [list(range(-1, len(chain) - 1))] * len(views))
            for v in views:
                v.commit([])
    else:
        extend_batch(views, [tokens] * len(views), [parents] * len(views))
    dt = clock(dev) - t0
    for v in views:
        v.commit([])
    return dt


def tree_latency(
    target,
    strategies,
    sizes,
    batches,
    prefix_len: int = 128,
    repeats: int = 10,
    warmup: int = 2,
    depth: int = 6,
    seed: int = 0,
) -> list[dict]:
    """Median verify seconds per (strategy, tree size, batch). Each request gets its own random prefix
    of prefix_len tokens; the cases of one (size, batch) are timed round-robin across strategies."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    views = {(s, b): [target.view(strategy=s) for _ in range(b)] for s in strategies for b in batches}
    for b in batches:
        prefixes = [torch.randint(0, target.vocab_size, (prefix_len,), generator=gen).tolist() for _ in range(b)]
        for s in strategies:
            for v, p in zip(views[s, b], prefixes):
                v.reset(p)
        for n in sizes:
            parents = random_tree(n, depth, gen)
            tokens = torch.randint(0, target.vocab_size, (n,), generator=gen).tolist()
            times = {s: [] for s in strategies}
            for _ in range(warmup + repeats):
                for s in strategies:
                    times[s].append(verify_once(views[s, b], tokens, parents))
            for s in strategies:
                rows.append(
                    dict(
                        strategy=s,
                        nodes=n,
                        batch=b,
                        depth=max(len(p) for p in leaf_paths(parents)),
                        branches=len(leaf_paths(parents)),
                        seconds=statistics.median(times[s][warmup:]),
                    )
                )
    return rows


def state_bytes(lm) -> int:
    """Bytes of speculative (pending) recurrent state an LM holds right now, over all GDN layers:
    factors (closed_form), per-node states (materialize), or the pending inputs plus the live state
    (replay). The committed state itself is not counted: every strategy keeps exactly one."""
    total = 0
    for st in lm.gdn.values():
        tensors = [st.k, st.u, st.G, st.x] + list(st.states) + list(st.inputs or []) + [st.live]
        total += sum(t.numel() * t.element_size() for t in tensors if t is not None)
    return total


def layer_state_bytes(
    n: int, heads: int, dk: int, dv: int, depth: int = 6, seed: int = 0, time_it: bool = True, repeats: int = 5
) -> dict:
    """One Gated DeltaNet layer at a given head shape, a random n-node tree over a random state:
    speculative bytes held per strategy (measured on the returned tensors: closed_form's factors
    k [n, H, K], u [n, H, V], G [n, H], in fp32 and as bf16 storage; materialize's n states [H, K, V]
    fp32) and, if time_it, the median seconds of tree_gdn vs the node-by-node recurrence."""
    gen = torch.Generator().manual_seed(seed)
    parents = random_tree(n, depth, gen)
    q = torch.nn.functional.normalize(torch.randn(1, n, heads, dk, generator=gen), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(torch.randn(1, n, heads, dk, generator=gen), dim=-1)
    v = torch.randn(1, n, heads, dv, generator=gen)
    g = -torch.rand(1, n, heads, generator=gen)
    beta = torch.rand(1, n, heads, generator=gen)
    S = torch.randn(1, heads, dk, dv, generator=gen) * 0.1
    par = torch.tensor(parents)

    def closed():
        return tree_gdn(q, k, v, g, beta, par, S)

    def materialize():
        states = []
        for j, p in enumerate(parents):
            Sp = S[0] if p < 0 else states[p]
            states.append(
                recurrent_gated_delta_rule(
                    q[0, j : j + 1], k[0, j : j + 1], v[0, j : j + 1], g[0, j : j + 1], beta[0, j : j + 1], Sp
                )[2]
            )
        return states

    _, f = closed()
    factor_elems = f.k.numel() + f.u.numel() + f.G.numel()
    states = materialize()
    out = dict(
        nodes=n,
        heads=heads,
        dk=dk,
        dv=dv,
        closed_form_fp32_bytes=factor_elems * 4,
        closed_form_bf16_bytes=factor_elems * 2,
        materialize_bytes=sum(s.numel() * s.element_size() for s in states),
    )
    if time_it:
        for name, fn in (("closed_form", closed), ("materialize", materialize)):
            fn()
            ts = []
            for _ in range(repeats):
                t0 = clock(q.device)
                fn()
                ts.append(clock(q.device) - t0)
            out[f"{name}_seconds"] = statistics.median(ts)
    return out


def choose_budget(
    verify_s: dict[int, float], batch: int, tokens_per_call: dict[int, float], draft_s: dict[int, float]
) -> tuple[int, dict[int, float]]:
    """The tree budget per request for a batch, from a cost model profiled at start.

    verify_s[n]: seconds of one verify pass at this batch size with n nodes per request (the batch
    shares the pass); tokens_per_call[n] and draft_s[n]: tokens gained per step and seconds of
    drafting per step for one request with an n-node tree (a short pilot run). Drafting is sequential
    per request, verification is shared, so the batch's throughput with budget n is
        batch * E(n) / (batch * D(n) + T_batch(n)),
    and the budget is its argmax. Returns (n, {n: predicted tokens per second})."""
    common = sorted(set(verify_s) & set(tokens_per_call) & set(draft_s))
    if not common:
        raise ValueError(
            f"no budget measured in all three profiles: verify {sorted(verify_s)}, "
            f"tokens/call {sorted(tokens_per_call)}, draft {sorted(draft_s)}"
        )
    rate = {n: batch * tokens_per_call[n] / (batch * draft_s[n] + verify_s[n]) for n in common}
    return max(rate, key=rate.get), rate


@torch.inference_mode()
def heldout_loss(lm, windows: list[list[int]]) -> float:
    """Mean next-token loss of an LM over token windows (each scored from its first token: reset on
    it, then one chain extend over the rest)."""
    losses = []
    for w in windows:
        first = lm.reset(w[:1])
        rest = lm.extend(w[1:-1], list(range(-1, len(w) - 3)))
        logits = torch.cat([first[None], rest])
        losses.append(torch.nn.functional.cross_entropy(logits, torch.tensor(w[1:]), reduction="none"))
        lm.commit([])
    return float(torch.cat(losses).mean())
