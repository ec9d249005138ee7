"""TreeDrafter: fixed-branching and EAGLE-2-style ("confidence") draft trees, lossless with sampling.

Statistical tests use speclib.research.stats.chi2_two_sample at alpha = 1e-3 on fixed seeds: under the null
(lossless drafting) an assertion fails for 0.1% of seed sets, and with the seeds fixed the outcome is
the same on every run.
"""

import pytest
import torch
from conftest import KeepFirstBranch, tiny_lm, token_zero_draft

from speclib import ModelDrafter, Sampling, generate
from speclib.core.sampling import probs
from speclib.drafters import TreeDrafter
from speclib.research.stats import chi2_two_sample

GREEDY = Sampling(0.0)
T1 = Sampling(1.0)
TRUNC = Sampling(0.8, top_k=8, top_p=0.9)

FIXED = dict(branching=(3, 2, 1, 1))
CONF = dict(budget=16, expand="confidence", depth=6, top=4)
SPINE = dict(budget=9, expand="spine", depth=5, top=3, min_value=0.02)


def noisy_copy(scale=0.3, seed=0):
    """The target's weights with a noisy output head: a draft that agrees often, not always."""
    lm = tiny_lm(32, 2, seed=0)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = lm.model.lm_head.weight
        w.add_(scale * w.std() * torch.randn(w.shape, generator=g))
    return lm


def sharpen(lm, factor):
    """Scale the output head: random tiny models are nearly uniform at temperature 1."""
    with torch.no_grad():
        lm.model.lm_head.weight.mul_(factor)
    return lm


class Recording(TreeDrafter):
    """Keeps every tree it drafts."""

    def reset(self, *a):
        super().reset(*a)
        self.trees = []

    def draft(self, context):
        tree = super().draft(context)
        self.trees.append(tree)
        return tree


def check_tree(tree, drafter, sampling):
    n = len(tree)
    assert 0 < n <= drafter.max_nodes
    assert all(-1 <= p < i for i, p in enumerate(tree.parents))  # topological
    assert max(tree.depths()) < drafter.depth
    q = tree.q
    assert q.shape == (n, drafter.lm.vocab_size)
    assert (q >= 0).all() and torch.allclose(q.sum(-1), torch.ones(n), atol=1e-5)
    for kids in tree.children:
        toks = [tree.tokens[c] for c in kids]
        assert len(set(toks)) == len(toks)  # siblings distinct
        for j, c in enumerate(kids):
            assert q[c, tree.tokens[c]] > 0
            assert all(q[c, t] == 0 for t in toks[:j])  # drawn without replacement
            if sampling.greedy:
                assert q[c, tree.tokens[c]] == 1  # one-hot on the node's token


@pytest.mark.parametrize(
    "kind",
    [FIXED, CONF, dict(budget=7, depth=3, top=3), dict(branching=(5, 1, 2)), SPINE],
    ids=["fixed", "conf", "conf-small", "fixed-512", "spine"],
)
@pytest.mark.parametrize("sampling", [GREEDY, T1, TRUNC], ids=["greedy", "t1", "trunc"])
def test_draft_is_a_valid_tree(pair, kind, sampling):
    target, draft = pair
    d = TreeDrafter(draft, **kind)
    gen = torch.Generator().manual_seed(0)
    d.reset([3, 1, 4], sampling, gen)
    context = [3, 1, 4, 7]
    for step in range(4):
        tree = d.draft(context)
        check_tree(tree, d, sampling)
        if "branching" in kind and sampling is not TRUNC:  # full support: the exact shape
            assert len(tree) == d.max_nodes
        accepted = [tree.tokens[i] for i in tree.path_to(max(0, len(tree) - 1 - step))][: step + 1]
        d.observe(accepted)
        context = context + accepted + [step + 11]


def test_max_nodes_and_bad_arguments(pair):
    _, draft = pair
    assert TreeDrafter(draft, branching=(3, 2, 1, 1)).max_nodes == 3 + 6 + 6 + 6
    assert TreeDrafter(draft).max_nodes == 21
    assert TreeDrafter(draft, budget=16).max_nodes == 16
    for bad in [
        dict(branching=()),
        dict(branching=(2, 0)),
        dict(branching=3),
        dict(budget=0),
        dict(budget=8, depth=0),
        dict(budget=8, top=0),
        dict(budget=8, expand="random"),
        dict(branching=(2,), budget=8),
        dict(budget=3, depth=4, expand="spine"),
        dict(budget=8, min_value=1.0),
        dict(budget=8, min_value=-0.1),
    ]:
        with pytest.raises(ValueError):
            TreeDrafter(draft, **bad)
    with pytest.raises(ValueError, match="vocabulary"):
        generate(tiny_lm(vocab=65), [1], 5, drafter=TreeDrafter(draft))


@pytest.mark.parametrize(
    "kind", [FIXED, CONF, dict(budget=7, depth=3, top=3), SPINE], ids=["fixed", "conf", "conf-small", "spine"]
)
@pytest.mark.parametrize("sampling", [T1, TRUNC, GREEDY], ids=["t1", "trunc", "greedy"])
def test_draft_cache_tracks_the_context(kind, sampling):
    """After observe(), the draft LM's state must equal a fresh prefill of the context: the root's
    first child is drawn from (greedy: ranked by) the draft distribution at the context's end.
    Accepted paths end at leaves (never fed), at inner nodes, and are empty."""
    draft, fresh = noisy_copy(), noisy_copy()
    d = TreeDrafter(draft, **kind)
    d.reset([5, 2], sampling, torch.Generator().manual_seed(1))
    context = [5, 2, 9]
    for step in range(6):
        tree = d.draft(context)
        want = torch.softmax(fresh.reset(context), -1) if sampling.greedy else probs(fresh.reset(context), sampling)
        if sampling.greedy:
            assert tree.tokens[tree.children[0][0]] == int(want.argmax())
        else:
            torch.testing.assert_close(tree.q[tree.children[0][0]], want, atol=1e-5, rtol=1e-4)
        leaf = len(tree) - 1 if step % 3 == 0 else (tree.children[0][0] if step % 3 == 1 else None)
        accepted = [] if leaf is None else [tree.tokens[i] for i in tree.path_to(leaf)]
        d.observe(accepted)
        context = context + accepted + [20 + step]


@pytest.mark.parametrize(
    "kind", [FIXED, CONF, dict(budget=5, depth=2, top=3), SPINE], ids=["fixed", "conf", "conf-small", "spine"]
)
def test_greedy_tree_sd_equals_ar(pair, kind):
    """Accepted draft tokens over the three prompts, measured: unrelated draft 5 / 5 / 5 / 0 (fixed / conf /
    conf-small / spine), the target's noisy copy 62 / 68 / 52 / 56; the noisy copy must exercise accepts."""
    target, draft = pair
    for d in (draft, noisy_copy()):
        total = 0
        for prompt in ([1], [5, 9, 2, 33], list(range(20))):
            ar = generate(target, prompt, 30, sampling=GREEDY)
            sd = generate(target, prompt, 30, drafter=TreeDrafter(d, **kind), sampling=GREEDY)
            assert sd.tokens == ar.tokens
            total += sum(s["accepted"] for s in sd.stats.steps)
        assert d is draft or total >= 15


def test_greedy_acceptance_is_maximal_with_the_target_as_draft():
    """Same weights: the argmax path is always drafted and accepted. Fixed branching puts it at
    full depth (depth tokens per step); a confidence tree accepts exactly the chain of first
    children (each node's argmax child), whatever its length, and top=1 makes that the full depth."""
    target = tiny_lm()
    for kind, full in [(FIXED, 4), (dict(budget=6, depth=6, top=1), 6), (CONF, None)]:
        d = Recording(tiny_lm(), **kind)
        out = generate(target, [1, 2], 40, drafter=d, sampling=GREEDY)
        assert out.tokens == generate(target, [1, 2], 40, sampling=GREEDY).tokens
        accepted = [s["accepted"] for s in out.stats.steps]
        first_child_chain = []
        for tree in d.trees:
            n, row = 0, 0
            while tree.children[row]:
                row, n = tree.children[row][0] + 1, n + 1
            first_child_chain.append(n)
        assert accepted == first_child_chain
        if full is not None:
            assert accepted == [full] * len(accepted)
        else:
            assert max(accepted) > 1


def _token_at(target, make_drafter, pos, n_runs, sampling, seed0=0, acceptor=None):
    return [
        generate(
            target,
            [3, 1, 4],
            pos + 1,
            drafter=make_drafter() if make_drafter else None,
            sampling=sampling,
            seed=seed0 + s,
            acceptor=acceptor,
        ).tokens[pos]
        for s in range(n_runs)
    ]


class GreedyChildrenClaimedSampled(TreeDrafter):
    """A wrong drafter (the HF #32867 family): children are the top-b draft tokens, deterministic,
    but q is stored as if they had been sampled from the draft distribution."""

    def _children(self, row, conf, n):
        top = conf.topk(min(n, int((conf > 0).sum()))).indices.tolist()
        return [(x, conf) for x in top]


@pytest.mark.parametrize(
    "sampling,kind",
    [(T1, FIXED), (TRUNC, dict(budget=5, depth=2, top=3)), (T1, dict(budget=6, expand="spine", depth=3, top=3))],
    ids=["t1-fixed", "trunc-conf", "t1-spine"],
)
def test_chi_square_ar_vs_tree_sd(pair, sampling, kind):
    """Token at new-token index 4 over 1200 independent seeded runs (i.i.d.), AR vs tree SD:
    two-sample chi-square, alpha = 1e-3 (0.1% false-positive rate per assertion under the null;
    seeds fixed). One sampling setting per tree mode, to keep the file fast; the truncated setting
    (q with zeros, supports of p and q differ) exercises exhausting a node's support.
    Negative controls, 400 runs each: with fixed branching (T=1) the same test rejects a drafter that takes
    the top-b children but stores q as if they were sampled (measured p ~ 1e-49 with 1200 runs; asserted
    below 1e-6 to leave no doubt; the subtler bugs, forgetting to renormalise q after removing siblings
    or drawing with replacement, are NOT detectable at this sample size on these near-uniform tiny
    models). In the other two modes a rule that keeps every draft token of the first branch
    (KeepFirstBranch): with truncated sampling on the same draft (measured p 5e-12); in the spine mode on a
    draft that proposes token 0 whatever the context, at index 3, the last token a depth-3 step drafts
    (index 4 is always the target's own sample there, and the same draft's chain at index 3 is a mixture
    over contexts, near uniform: p 0.40), measured p 1e-158; both asserted below 1e-3."""
    target, draft = pair
    n = 1200
    ar = _token_at(target, None, 4, n, sampling)
    sd = _token_at(target, lambda: TreeDrafter(draft, **kind), 4, n, sampling, seed0=10**6)
    assert chi2_two_sample(ar, sd).p > 1e-3
    if kind is FIXED:
        bad = _token_at(
            target, lambda: GreedyChildrenClaimedSampled(draft, branching=(2, 2)), 4, 400, sampling, seed0=10**6
        )
        assert chi2_two_sample(ar, bad).p < 1e-6
    elif kind.get("expand") == "spine":
        ar3 = _token_at(target, None, 3, 400, sampling)
        zero = token_zero_draft()
        wrong = _token_at(target, lambda: TreeDrafter(zero, **kind), 3, 400, sampling, 10**6, KeepFirstBranch())
        assert chi2_two_sample(ar3, wrong).p < 1e-3
    else:
        wrong = _token_at(target, lambda: TreeDrafter(draft, **kind), 4, 400, sampling, 10**6, KeepFirstBranch())
        assert chi2_two_sample(ar, wrong).p < 1e-3


def test_tree_yields_more_tokens_per_call_than_chain():
    """Temperature 1, same draft, chain k = 4 vs tree (3, 2, 1, 1) of depth 4. The models' heads are
    sharpened (x10, TV(p, q) ~ 0.5 at the first position) because random tiny models are nearly
    uniform at T=1, where a chain already accepts ~95% and the tree's gain (~0.1 token/call) is
    within noise. Over 20 seed blocks of 12 runs the ratio was 1.08-1.37 (mean 1.24); this uses 24
    runs and asserts > 1.05."""
    target, draft = sharpen(tiny_lm(32, 2, seed=0), 10), sharpen(tiny_lm(16, 1, seed=1), 10)

    def tokens_per_call(make):
        toks = calls = 0
        for i in range(24):
            out = generate(target, [3 + i, 1, 4], 40, drafter=make(), sampling=T1, seed=i)
            toks, calls = toks + len(out.tokens), calls + out.stats.target_calls + 1
        return toks / calls

    chain = tokens_per_call(lambda: ModelDrafter(draft, 4))
    tree = tokens_per_call(lambda: TreeDrafter(draft, branching=(3, 2, 1, 1)))
    assert tree > 1.05 * chain, (tree, chain)


def test_spine_is_the_chain_plus_leaves():
    """expand='spine', greedy: the chain of first children is what ModelDrafter(lm, depth) drafts, every other node is a leaf hanging off that chain, a leaf's path value (product of
    draft probabilities) is >= min_value, and the draft model is fed exactly the chain (never a leaf)."""
    K, min_value = 4, 0.01
    spine = TreeDrafter(sharpen(noisy_copy(seed=1), 10), budget=12, expand="spine", depth=K, top=3, min_value=min_value)
    chain = ModelDrafter(sharpen(noisy_copy(seed=1), 10), K)
    context, leaves = [5, 2, 9, 4], 0
    spine.reset(context[:-1], GREEDY, torch.Generator().manual_seed(3))
    chain.reset(context[:-1], GREEDY, torch.Generator().manual_seed(3))
    for step in range(5):
        tree = spine.draft(context)
        want = chain.draft(context)
        firsts, row = [], 0
        while tree.children[row]:
            firsts.append(tree.children[row][0])
            row = firsts[-1] + 1
        assert [tree.tokens[i] for i in firsts] == want.tokens
        assert len(spine.lm.pending_parents) == len(chain.lm.pending_parents)  # leaves never fed
        for i in set(range(len(tree))) - set(firsts):
            assert not tree.children[i + 1] and tree.parents[i] in [-1] + firsts
            assert spine.values[i] >= min_value
            leaves += 1
        accepted = want.tokens[: step % (K + 1)]
        spine.observe(accepted)
        chain.observe(accepted)
        context = context + accepted + [20 + step]
    assert leaves > 0
