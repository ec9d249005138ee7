"""Cache drafters against brute force on random token streams; point-mass acceptance; greedy identity."""

import functools
import random
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import KeepFirstBranch, tiny_lm, token_zero_draft

from speclib import Sampling, generate
from speclib.core.acceptance import Lossless, output_distribution
from speclib.core.tree import Tree
from speclib.drafters.cache import PromptLookupDrafter, SuffixDrafter, SuffixTree

GREEDY = Sampling(0.0)


def brute_counts(seqs, s):
    """Continuation counts of string s over all sequences (occurrences with a next token)."""
    c = Counter()
    for seq in seqs:
        for i in range(len(seq) - len(s)):
            if seq[i : i + len(s)] == s:
                c[seq[i + len(s)]] += 1
    return c


def brute_draft(seqs, context, max_depth, max_spec, min_prob, factor=1.0, offset=0.0):
    """Longest context suffix (< max_depth) with a continuation; greedy most-frequent walk."""
    for m in range(min(max_depth - 1, len(context)), 0, -1):  # the trie holds strings <= max_depth
        s = context[-m:]
        if not brute_counts(seqs, s):
            continue
        limit = max(1, min(max_spec, int(m * factor + offset)))
        tokens, prob, probs = [], 1.0, []
        while len(tokens) < limit:
            # counts of the extended string's continuations, restricted to the trie depth
            cur = (s + tokens)[-max_depth + 1 :] if len(s + tokens) >= max_depth else s + tokens
            c = brute_counts(seqs, cur) if len(s + tokens) < max_depth else Counter()
            if not c:
                break
            t, n = max(sorted(c.items()), key=lambda kv: kv[1])
            prob *= n / sum(c.values())
            if prob < min_prob:
                break
            tokens.append(t)
            probs.append(prob)
        return m, tokens, probs
    return 0, [], []


@pytest.mark.parametrize("seed", range(6))
def test_suffix_tree_counts_match_brute_force(seed):
    rng = random.Random(seed)
    alphabet = rng.randint(2, 5)
    seqs = [[rng.randrange(alphabet) for _ in range(rng.randint(1, 40))] for _ in range(4)]
    tree = SuffixTree(max_depth=6)
    for s in seqs:
        tree.add(s)
    tree.remove(seqs[1])  # eviction
    kept = [seqs[0], seqs[2], seqs[3]]
    for _ in range(60):
        src = rng.choice(kept)
        i = rng.randrange(len(src))
        s = src[i : i + rng.randint(1, 5)]
        node = tree.find(s)
        expect = brute_counts(kept, s)
        got = {t: e[0] for t, e in (node or {}).items()}
        assert {t: n for t, n in got.items()} == dict(expect) or len(s) >= 6
    assert tree.find([alphabet + 1]) is None


@pytest.mark.parametrize("seed", range(8))
def test_suffix_drafter_matches_brute_force(seed):
    """Per-request tree: the draft for every prefix of a random stream equals the brute-force
    longest-suffix, most-frequent-continuation walk (ties aside: counts are compared)."""
    rng = random.Random(seed)
    stream = [rng.randrange(3) for _ in range(120)]
    d = SuffixDrafter(max_depth=8, max_spec=6, min_token_prob=0.2)
    d.reset(stream[:5], GREEDY, None)
    for L in range(5, len(stream)):
        ctx = stream[:L]
        tree = d.draft(ctx)
        m, tokens, probs = brute_draft([ctx], ctx, 8, 6, 0.2)
        assert d.last["match_len"] == m
        assert len(tree.tokens) == len(tokens)
        assert d.last["probs"] == pytest.approx(probs)
        assert tree.q is None and tree.source == "suffix" and tree.is_chain


def test_suffix_drafter_global_tree_and_eviction():
    d = SuffixDrafter(max_depth=8, max_spec=8, global_tokens=25)
    out1 = [7, 8, 9, 10, 11, 12] * 2
    d.reset([1, 2, 3], GREEDY, None)
    d.draft([1, 2, 3] + out1)  # the request's context as generated
    d.reset([4, 5], GREEDY, None)  # request 1's output joins the global tree
    tree = d.draft([4, 5, 7, 8])
    assert d.last["tree"] == "global" and tree.tokens == [9, 10]  # match length 2: at most 2 tokens
    for r in range(3):  # push it out of the 25-token budget
        d.draft([4, 5] + [20 + r] * 12)
        d.reset([4, 5], GREEDY, None)
    assert sum(map(len, d.history)) <= 25
    d.draft([4, 5, 7, 8])
    assert d.last["draft_len"] == 0


def test_prompt_lookup_matches_transformers_rule():
    d = PromptLookupDrafter(max_ngram=3, k=4)
    d.reset([], GREEDY, None)
    ctx = [1, 2, 3, 9, 9, 1, 2, 3, 5, 6, 1, 2, 3]
    assert d.draft(ctx).tokens == [9, 9, 1, 2]  # earliest match of [1, 2, 3]
    assert d.match_len == 3
    assert d.draft([4, 4, 4, 7]).tokens == []  # no match
    assert d.draft([5, 1, 5]).tokens == [1, 5]  # falls back to n = 1
    with pytest.raises(ValueError):
        PromptLookupDrafter(k=0)


def test_point_mass_acceptance_exact():
    """A cache draft (q = None) is a point mass: the rule's output distribution equals p exactly,
    and the acceptor uses the same residual (p without x, renormalised)."""
    g = torch.Generator().manual_seed(0)
    for v in (2, 7, 50):
        for _ in range(20):
            p = torch.rand(v, generator=g, dtype=torch.float64) ** 3
            p[torch.randperm(v, generator=g)[: v // 3]] = 0
            p /= p.sum()
            x = int(torch.randint(v, (), generator=g))
            q = torch.zeros(v, dtype=torch.float64)
            q[x] = 1
            assert (output_distribution(p, q) - p).abs().max() < 1e-12
    # Monte Carlo through Lossless on a one-token cache draft
    p = torch.tensor([[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3]])
    tree = Tree.chain([1], None, source="suffix")
    counts = Counter()
    gen = torch.Generator().manual_seed(1)
    for _ in range(20000):
        path, nxt = Lossless()(tree, p, False, gen)
        counts[1 if path else nxt] += 1
    for x in range(3):
        assert abs(counts[x] / 20000 - float(p[0, x])) < 0.015  # 4.5 sigma at n = 20000


@pytest.mark.parametrize(
    "make",
    [lambda: PromptLookupDrafter(2, 5), lambda: SuffixDrafter(max_depth=8, max_spec=6)],
    ids=["prompt_lookup", "suffix"],
)
def test_greedy_identity_with_cache_drafts(make):
    target = tiny_lm(32, 2, vocab=16, seed=0)
    total = 0
    for prompt in ([1, 2, 3, 1, 2, 3, 1, 2], [5, 5, 5, 5], [3, 1, 4, 1, 5, 9, 2, 6]):
        ar = generate(target, prompt, 30, sampling=GREEDY)
        d = make()
        sd = generate(target, prompt, 30, drafter=d, sampling=GREEDY)
        assert sd.tokens == ar.tokens
        assert sum(s["drafted"] for s in sd.stats.steps) > 0
        total += sum(s["accepted"] for s in sd.stats.steps)
    assert total >= 10  # measured over the three prompts: prompt lookup 52, suffix 39 accepted


# --- HybridDrafter: every policy ------------------------------------------------------------------
from speclib import ModelDrafter  # noqa: E402
from speclib.drafters.hybrid import FEATURES, POLICIES, Costs, HybridDrafter, PayoffPredictor  # noqa: E402
from speclib.research.stats import chi2_two_sample  # noqa: E402

REPEATY = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]


@functools.lru_cache(maxsize=1)
def _fitted_predictor():
    rng = np.random.default_rng(0)
    X = rng.random((300, len(FEATURES))) * 5
    X[:, FEATURES.index("draft_len")] = rng.integers(0, 7, 300)
    y = np.floor(np.minimum(X[:, FEATURES.index("draft_len")], X[:, 0] * 0.8))
    return PayoffPredictor(steps=100).fit(X, y)


def _hybrid(policy, target, draft, reference=None, two_caches=False, k=3):
    costs = Costs(verify_s={n: 1e-3 * (1 + 0.05 * n) for n in range(1, 20)}, model_token_s=2e-4)
    cache = SuffixDrafter(max_depth=8, max_spec=6)
    if two_caches:  # prompt lookup first: the fixed rules use the first cache
        cache = [PromptLookupDrafter(2, 5), cache]
    return HybridDrafter(
        cache, ModelDrafter(draft, k), policy, _fitted_predictor() if policy == "hvd" else None, costs, reference
    )


@pytest.mark.parametrize("two_caches", [False, True])
@pytest.mark.parametrize("policy", POLICIES)
def test_greedy_identity_every_policy(policy, two_caches):
    target, draft = tiny_lm(32, 2, vocab=16, seed=0), tiny_lm(16, 1, vocab=16, seed=1)
    for prompt in (REPEATY, [3, 1, 4, 1, 5, 9, 2, 6]):
        ar = generate(target, prompt, 30, sampling=GREEDY).tokens
        d = _hybrid(policy, target, draft, reference=ar, two_caches=two_caches)
        sd = generate(target, prompt, 30, drafter=d, sampling=GREEDY)
        assert sd.tokens == ar
        assert len(d.log) == len(sd.stats.steps)
        assert [s["accepted"] for s in d.log] == [s["accepted"] for s in sd.stats.steps]
        sources = {s["source"] for s in d.log}
        assert sources <= {"cache", "model"}
        if policy in ("model", "cache"):
            assert sources == {policy}
        if policy == "cache":  # the fixed rules verify the first cache's candidate
            assert {s["cache_source"] for s in d.log} == {"prompt_lookup" if two_caches else "suffix"}


def test_oracle_over_two_caches_and_agreement_feature():
    """With two caches the oracle's chosen candidate is, at every step, accepted at least as far as each
    cache candidate and the model draft; `agree` is the common prefix of the two cache candidates."""
    target, draft = tiny_lm(32, 2, vocab=16, seed=0), tiny_lm(16, 1, vocab=16, seed=1)
    ar = generate(target, REPEATY, 40, sampling=GREEDY).tokens
    d = _hybrid("oracle", target, draft, reference=ar, two_caches=True)
    pos = []
    orig = d.draft
    d.draft = lambda ctx: (pos.append(len(ctx) - len(REPEATY)), orig(ctx))[1]
    generate(target, REPEATY, 40, drafter=d, sampling=GREEDY)
    for j, step in zip(pos, d.log):
        ctx, fut = REPEATY + ar[:j], ar[j:]
        pl, sf = PromptLookupDrafter(2, 5), SuffixDrafter(max_depth=8, max_spec=6)
        pl.reset(REPEATY, GREEDY, None)
        sf.reset(REPEATY, GREEDY, None)
        for cand in (pl.draft(ctx).tokens, sf.draft(ctx).tokens):
            n = 0
            while n < len(cand) and n < len(fut) and cand[n] == fut[n]:
                n += 1
            assert step["accepted"] >= min(n, len(fut) - 1)
    pl, sf = PromptLookupDrafter(2, 5), SuffixDrafter(max_depth=8, max_spec=6)
    for c in (pl, sf):
        c.reset(REPEATY, GREEDY, None)
    ctx = REPEATY + ar[:3]
    a, b = pl.draft(ctx).tokens, sf.draft(ctx).tokens
    h = _hybrid("cache", target, draft, two_caches=True)
    h.reset(REPEATY, GREEDY, torch.Generator())
    h.draft(ctx)
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert h.log[-1]["agree"] == n and h.log[-1]["other_len"] == len(b) and h.log[-1]["draft_len"] == len(a)


def test_oracle_accepts_at_least_as_much_as_each_candidate():
    target, draft = tiny_lm(32, 2, vocab=16, seed=0), tiny_lm(16, 1, vocab=16, seed=1)
    ar = generate(target, REPEATY, 40, sampling=GREEDY).tokens
    per_call = {}
    for policy in ("model", "cache", "oracle"):
        g = generate(target, REPEATY, 40, drafter=_hybrid(policy, target, draft, ar), sampling=GREEDY)
        per_call[policy] = g.stats.tokens_per_call
    assert per_call["oracle"] >= max(per_call["model"], per_call["cache"]) - 0.2


def test_hvd_verifies_the_prefix_with_the_most_expected_tokens_per_second():
    """Recomputed from the logged features: the verified length m of the chosen cache candidate maximises
    (1 + sum_{l <= m} P(accepted >= l)) / (cache_s + verify(m + 1)); with cut=False it is the whole candidate."""
    target, draft = tiny_lm(32, 2, vocab=16, seed=0), tiny_lm(16, 1, vocab=16, seed=1)
    ar = generate(target, REPEATY, 30, sampling=GREEDY).tokens
    for cut in (True, False):
        d = _hybrid("hvd", target, draft, two_caches=True)
        d.cut = cut
        assert generate(target, REPEATY, 30, drafter=d, sampling=GREEDY).tokens == ar
        steps = [s for s in d.log if s["source"] == "cache"]
        assert steps
        for step in steps:
            whole = int(step["draft_len"])
            S = d.predictor.survival(np.array([[step[f] for f in FEATURES]]))[0]
            rate = [(S[:m].sum() + 1) / (step["cache_s"] + d.costs.verify(m + 1)) for m in range(1, whole + 1)]
            assert step["drafted"] == (int(np.argmax(rate)) + 1 if cut else whole)


class _FixedSurvival:
    """P(accepted >= l) = 0.5 ** l for l <= draft_len."""

    def survival(self, X):
        n = X[:, FEATURES.index("draft_len")]
        return 0.5 ** np.arange(1, 17)[None] * (np.arange(1, 17)[None] <= n[:, None])


def test_hvd_cut_follows_the_measured_verify_costs():
    # verify cost need not grow with the tokens verified (CPU matmul kernels): 5 tokens may cost less than 3
    draft = tiny_lm(16, 1, vocab=16, seed=1)
    costs = Costs(verify_s={1: 1.0, 2: 3.0, 3: 3.0, 4: 3.5, 5: 2.0, 6: 2.5, 7: 9.0, 8: 9.0}, model_token_s=10.0)
    d = HybridDrafter(PromptLookupDrafter(2, 7), ModelDrafter(draft, 2), "hvd", _FixedSurvival(), costs)
    d.reset(REPEATY, GREEDY, torch.Generator())
    d._cache_s = 0.0
    # 7 tokens: 4 (1.94 expected tokens in 2.0 s) beats 2 (1.75 in 3.0 s); 3 tokens: 2 beats 3 (1.875 in 3.5 s)
    for n, want in [(7, 4), (3, 2), (1, 1)]:
        d.candidates([Tree.chain(list(range(n)), None, source="prompt_lookup")])
        X = np.stack([d.features(0, REPEATY)])
        assert d._choose(X, REPEATY) == (0, True) and d._keep == want


def test_costs_fitted_line():
    c = Costs.fitted([1, 2, 3, 4], [1.0, 3.0, 2.0, 4.0], model_token_s=0.5)
    assert c.verify(4) > c.verify(1) and c.verify(2) - c.verify(1) == pytest.approx(c.verify(4) - c.verify(3))
    flat = Costs.fitted([1, 2, 3], [3.0, 2.0, 1.0], model_token_s=0.5)  # a falling fit is flattened
    assert flat.verify(1) == flat.verify(3) == pytest.approx(2.0)
    assert Costs.fitted([2, 5], [2.0, 5.0], 0.5).verify_s == pytest.approx({1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0, 5: 5.0})


def test_costs_from_logged_steps():
    rng = np.random.default_rng(3)

    def cost(d):
        return 0.010 + 0.001 * d + (0.004 if d == 2 else 0.0)  # 3 tokens cost more than the line says

    steps = [
        dict(drafted=d, source="suffix", draft_s=1e-4, verify_s=cost(d) + rng.normal(0, 1e-4))
        for d in rng.integers(1, 12, 600)
    ]
    steps += [dict(drafted=4, source="model", draft_s=4 * 0.002, verify_s=0.014)] * 9
    steps += [dict(drafted=0, source=None, draft_s=1e-4, verify_s=0.5)] * 9  # empty drafts: not used
    steps += [dict(drafted=14, source="suffix", draft_s=1e-4, verify_s=9.0)] * 5  # too rare: the line instead
    c = Costs.from_steps(steps)
    for d in (1, 2, 5, 10):  # measured sizes: their medians
        assert c.verify(d + 1) == pytest.approx(cost(d), abs=3e-4)
    assert c.verify(15) == pytest.approx(cost(14), rel=0.1)  # the line, not the 5 outliers
    assert c.model_token_s == pytest.approx(0.002) and c.cache_s == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="model-drafted"):
        Costs.from_steps([s for s in steps if s["source"] != "model"])


def test_hybrid_bad_arguments():
    d = tiny_lm(16, 1, vocab=16)
    with pytest.raises(ValueError, match="policy"):
        HybridDrafter(SuffixDrafter(), ModelDrafter(d, 2), "sometimes")
    with pytest.raises(ValueError, match="predictor"):
        HybridDrafter(SuffixDrafter(), ModelDrafter(d, 2), "hvd")
    with pytest.raises(ValueError, match="reference"):
        HybridDrafter(SuffixDrafter(), ModelDrafter(d, 2), "oracle")
    o = HybridDrafter(SuffixDrafter(), ModelDrafter(d, 2), "oracle", reference=[1])
    with pytest.raises(ValueError, match="greedy"):
        o.reset([1, 2], Sampling(1.0), torch.Generator())


@pytest.mark.parametrize("policy,two_caches", [("cache", False), ("arctic", False), ("hvd", True)])
def test_chi_square_with_cache_drafts(policy, two_caches):
    """Token at new-token index 4 over 800 seeded runs at T = 1, AR vs SD with point-mass cache drafts
    (alpha = 1e-3: 0.1% false-positive rate under the null; seeds fixed). Negative control: the same test
    rejects a rule that keeps every draft token of the first branch (the same policy and caches; the model
    draft proposes 4 tokens near token 0, so index 4 is a kept draft token, not the target's own sample: the
    tiny target is near-uniform, and a draft like it would hide the error)."""
    target, draft = tiny_lm(32, 2, vocab=16, seed=0), tiny_lm(16, 1, vocab=16, seed=1)
    t1 = Sampling(1.0)
    ar = [generate(target, REPEATY, 5, sampling=t1, seed=s).tokens[4] for s in range(800)]
    sd = [
        generate(
            target,
            REPEATY,
            5,
            sampling=t1,
            seed=10**6 + s,
            drafter=_hybrid(policy, target, draft, two_caches=two_caches),
        ).tokens[4]
        for s in range(800)
    ]
    assert chi2_two_sample(ar, sd).p > 1e-3
    zero = token_zero_draft(16)  # a model draft near token 0: what the wrong rule keeps shows in the marginal
    bad = [
        generate(
            target,
            REPEATY,
            5,
            sampling=t1,
            seed=10**6 + s,
            drafter=_hybrid(policy, target, zero, two_caches=two_caches, k=4),
            acceptor=KeepFirstBranch(),
        ).tokens[4]
        for s in range(800)
    ]
    assert chi2_two_sample(ar, bad).p < 1e-3


def test_payoff_predictor_learns_the_accepted_length_distribution():
    """Accepted lengths drawn as in speculative decoding: each of the draft_len tokens accepted with
    probability a(x) = sigmoid(2 x0 - 2) until the first rejection (the other features are noise). The
    fitted survival function is a proper one (in [0, 1], non-increasing, 0 beyond the draft) and close
    to the true P(accepted >= l) on unseen rows."""
    rng = np.random.default_rng(1)
    X = rng.random((3000, len(FEATURES))) * 2
    n = rng.integers(0, 9, 3000)
    X[:, FEATURES.index("draft_len")] = n
    a = 1 / (1 + np.exp(-(2 * X[:, 0] - 2)))
    y = np.array([next((l for l in range(k) if rng.random() > ai), k) for k, ai in zip(n, a)])
    p = PayoffPredictor(seed=0).fit(X[:2500], y[:2500])
    S = p.survival(X[2500:])
    assert S.shape == (500, 8) and (S >= 0).all() and (S <= 1).all() and (np.diff(S, axis=1) <= 1e-12).all()
    assert (S[np.arange(1, 9)[None] > n[2500:, None]] == 0).all()
    truth = a[2500:, None] ** np.arange(1, 9)[None] * (np.arange(1, 9)[None] <= n[2500:, None])
    assert np.abs(S - truth).mean() < 0.04  # measured 0.025 (seed 0)
    e = truth.sum(1)  # the expected payoff: 0.18 vs 0.79 for the mean
    assert np.abs(p.predict(X[2500:]) - e).mean() < 0.3 * np.abs(e - e.mean()).mean()
    np.testing.assert_allclose(p.predict(X[2500:]), S.sum(1))
    longer = X[2500:2501].copy()  # a draft longer than any in the fit logs:
    longer[0, FEATURES.index("draft_len")] = 11  # positions beyond 8 reuse position 8's hazard
    SL = p.survival(longer)[0]
    assert SL.shape == (11,) and (np.diff(SL) <= 0).all()
    np.testing.assert_allclose(SL[8:] / SL[7:10], SL[7] / SL[6])
    with pytest.raises(RuntimeError, match="before fit"):
        PayoffPredictor().predict(X)
    with pytest.raises(ValueError, match="draft_len"):
        PayoffPredictor().fit(X[:10], n[:10] + 1)  # more accepted than drafted
    with pytest.raises(ValueError, match="integer"):
        PayoffPredictor().fit(X[:10], np.full(10, 0.5))


def test_payoff_predictor_ignores_a_feature_constant_in_training():
    # the fit logs come from cache-only decoding, where e.g. a source's running acceptance may never
    # move; meeting another value of it while decoding must not change the prediction
    rng = np.random.default_rng(2)
    X = rng.random((300, len(FEATURES))) * 4
    j = FEATURES.index("source_recent")
    X[:, j] = 0.5
    X[:, FEATURES.index("draft_len")] = rng.integers(0, 5, 300)
    y = np.floor(np.minimum(X[:, FEATURES.index("draft_len")], X[:, 0]))
    p = PayoffPredictor(steps=100).fit(X, y)
    moved = X[:20].copy()
    moved[:, j] = rng.random(20)
    np.testing.assert_array_equal(p.predict(moved), p.predict(X[:20]))


def test_payoff_predictor_save_load_round_trip(tmp_path):
    p = _fitted_predictor()
    p.save(tmp_path / "p.npz")
    q = PayoffPredictor.load(tmp_path / "p.npz")
    X = np.random.default_rng(5).random((50, len(FEATURES))) * 6
    X[:, FEATURES.index("draft_len")] = np.arange(50) % 9  # longer drafts than the fit saw, too
    np.testing.assert_array_equal(q.survival(X), p.survival(X))
    with pytest.raises(RuntimeError, match="before fit"):
        PayoffPredictor().save(tmp_path / "unfitted.npz")
    np.savez(tmp_path / "other.npz", features=np.array(["a", "b"]))
    with pytest.raises(ValueError, match="refit"):
        PayoffPredictor.load(tmp_path / "other.npz")


# --- HVD over every source: chain and tree caches together ---------------------------------------------

from speclib import RestDrafter, TokenRecycling  # noqa: E402
from speclib.drafters.hybrid import accepted_greedy, spine  # noqa: E402
from speclib.drafters.rest import Datastore  # noqa: E402


def _every_source(policy, target, draft, reference=None, predictor=None):
    """draft: the model drafter's LM, or None (no model drafter)."""
    """Prompt lookup, the suffix tree, Token Recycling and REST (a datastore of the target's own greedy text)."""
    text = sum((generate(target, p, 40, sampling=GREEDY).tokens for p in (REPEATY, [7, 7, 2, 9])), [])
    caches = [
        PromptLookupDrafter(2, 5),
        SuffixDrafter(max_depth=8, max_spec=6),
        TokenRecycling(top_k=2, nodes=5, rank_accept=(0.6, 0.3)),
        RestDrafter(Datastore(text, 8), nodes=5),
    ]
    costs = Costs(verify_s={n: 1e-3 * (1 + 0.05 * n) for n in range(1, 20)}, model_token_s=2e-4)
    return HybridDrafter(
        caches,
        None if draft is None else ModelDrafter(draft, 3),
        policy,
        predictor or (_fitted_predictor() if policy == "hvd" else None),
        costs,
        reference,
    )


def test_tree_helpers_against_paths():
    t = Tree([4, 5, 6, 7, 8], [-1, -1, 0, 0, 3])  # root -> 4 -> {6, 7 -> 8}, root -> 5
    assert spine(t) == [4, 6] and spine(Tree.chain([1, 2, 3])) == [1, 2, 3] and spine(Tree([], [])) == []
    for future, want in [([4, 7, 8, 1], 3), ([4, 6, 0], 2), ([5, 4], 1), ([9], 0), ([], 0), ([4, 7], 2)]:
        paths = [[t.tokens[j] for j in t.path_to(i)] for i in range(len(t))]
        best = max((len(p) for p in paths if p == future[: len(p)]), default=0)
        assert accepted_greedy(t, future) == want == best


@pytest.mark.parametrize("with_model", [True, False])
@pytest.mark.parametrize("policy", ["cache", "hvd", "oracle", "sam"])
def test_every_source_greedy_identity_and_verify_passes_reach_token_recycling(policy, with_model):
    target, draft = tiny_lm(32, 2, vocab=16, seed=0), tiny_lm(16, 1, vocab=16, seed=1) if with_model else None
    for prompt in (REPEATY, [3, 1, 4, 1, 5, 9, 2, 6]):
        ar = generate(target, prompt, 30, sampling=GREEDY).tokens
        d = _every_source(policy, target, draft, reference=ar)
        sd = generate(target, prompt, 30, drafter=d, sampling=GREEDY)
        assert sd.tokens == ar
        steps = sd.stats.steps
        # Token Recycling counts one outcome per accepted token plus the next, on every pass whoever drafted
        assert d.caches[2].rank_counts.sum() == sum(s["accepted"] + 1 for s in steps)
        assert all(s["drafted"] <= d.max_nodes for s in steps)
    assert {s["cache_source"] for s in d.log} <= {"prompt_lookup", "suffix", "recycling", "rest"}
    assert {s["source"] for s in d.log} <= ({"cache", "model"} if with_model else {"cache", "none"})


def test_without_a_model_drafter_hvd_weighs_a_cache_draft_against_a_plain_step():
    target = tiny_lm(32, 2, vocab=16, seed=0)
    d = _every_source("hvd", target, None, predictor=_FixedSurvival())
    d.check_compatible(target)
    d.reset(REPEATY, GREEDY, torch.Generator())
    d._cache_s = 0.0
    d.candidates([Tree.chain([1, 2], None, source="prompt_lookup")] + [Tree([], [])] * 3)
    X = np.stack([d.features(i, REPEATY) for i in range(4)])
    d.costs = Costs(verify_s={1: 1.0, 2: 1.4, 3: 1.6}, model_token_s=1.0)
    assert d._choose(X, REPEATY) == (0, True) and d._keep == 2  # 1.75 / 1.6 > 1.5 / 1.4 > 1 / 1.0
    d.costs = Costs(verify_s={1: 1.0, 2: 1.6, 3: 1.8}, model_token_s=1.0)
    assert d._choose(X, REPEATY) == (0, False)  # 1.5 / 1.6 and 1.75 / 1.8 < 1: a plain step
    for policy in ("model", "arctic"):
        with pytest.raises(ValueError, match="needs a model drafter"):
            HybridDrafter([PromptLookupDrafter(2, 5)], None, policy)


def test_hvd_verifies_a_tree_whole_at_its_expected_tokens_per_second():
    """A tree candidate is never cut: HVD rates it (1 + P(accepted >= 1..depth) summed) / (cache_s +
    verify(nodes + 1)) and verifies all its nodes when it wins."""
    target, draft = tiny_lm(32, 2, vocab=16, seed=0), tiny_lm(16, 1, vocab=16, seed=1)
    d = _every_source("hvd", target, draft, predictor=_FixedSurvival())
    d.check_compatible(target)
    d.reset(REPEATY, GREEDY, torch.Generator())
    d.costs = Costs(verify_s={1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0}, model_token_s=10.0)
    d._cache_s = 0.0
    d.candidates(
        [Tree.chain([1], None, source="prompt_lookup"), Tree([2, 3, 4, 5], [-1, -1, 0, 2], None, source="recycling")]
    )
    assert d._spines == [[1], [2, 4, 5]] and d._depth == [1, 3]
    X = np.stack([d.features(i, REPEATY) for i in range(2)])
    assert X[1, FEATURES.index("draft_len")] == 3 and X[1, FEATURES.index("nodes")] == 4
    assert X[1, FEATURES.index("recycling_source")] == 1 and X[0, FEATURES.index("recycling_source")] == 0
    # the chain: (1 + 0.5) / 1.0; the tree: (1 + 0.5 + 0.25 + 0.125) / verify(5) = 1.875
    assert d._choose(X, REPEATY) == (1, True) and d._keep is None
    d.costs.verify_s[5] = 1.5  # now 1.25 < 1.5: the chain wins
    assert d._choose(X, REPEATY) == (0, True) and d._keep == 1


def test_chi_square_hvd_over_every_source():
    """Token at new-token index 4 over 800 seeded runs at T = 1, AR vs HVD over chain and tree caches
    (alpha = 1e-3: 0.1% false-positive rate under the null)."""
    target, draft = tiny_lm(32, 2, vocab=16, seed=0), tiny_lm(16, 1, vocab=16, seed=1)
    t1 = Sampling(1.0)
    ar = [generate(target, REPEATY, 5, sampling=t1, seed=s).tokens[4] for s in range(800)]
    d = _every_source("hvd", target, draft, predictor=_FixedSurvival())
    runs, verified = [], set()
    for s in range(800):
        runs.append(generate(target, REPEATY, 5, sampling=t1, seed=10**6 + s, drafter=d))
        verified |= {s["cache_source"] for s in d.log if s["source"] == "cache"}
    assert {"recycling", "rest"} <= verified  # trees were verified, not only chains
    assert chi2_two_sample(ar, [r.tokens[4] for r in runs]).p > 1e-3

    # negative control: the same test rejects a rule that keeps every draft token of the first branch
    bad = [
        generate(target, REPEATY, 5, sampling=t1, seed=10**6 + s, drafter=d, acceptor=KeepFirstBranch()).tokens[4]
        for s in range(800)
    ]
    assert chi2_two_sample(ar, bad).p < 1e-3


def test_feature_matrix_fills_the_tree_columns_of_older_logs():
    import pandas as pd

    from speclib.drafters.hybrid import feature_matrix

    old = pd.DataFrame([{f: float(i + j) for j, f in enumerate(FEATURES[:12])} for i in range(3)])
    X = feature_matrix(old)
    assert X.shape == (3, len(FEATURES)) and (X[:, :12] == old.to_numpy()).all()
    assert (X[:, FEATURES.index("recycling_source")] == 0).all() and (X[:, FEATURES.index("rest_source")] == 0).all()
    assert (X[:, FEATURES.index("nodes")] == old.draft_len).all()
    new = pd.DataFrame([{f: 1.0 for f in FEATURES}])
    assert (feature_matrix(new) == 1).all()


def test_cache_drafters_describe_their_drafts_for_hvd():
    """Every shipped cache drafter is a `ScoredDrafter` once reset (HVD reads `last`, no name probes);
    prompt lookup's description is what HVD assumed before it had one: its length as score, certain tokens."""
    from speclib import Lookahead
    from speclib.core.protocols import ScoredDrafter

    target = tiny_lm(32, 2, vocab=16, seed=0)
    text = generate(target, REPEATY, 40, sampling=GREEDY).tokens
    for d in (
        PromptLookupDrafter(2, 5),
        SuffixDrafter(max_depth=8, max_spec=6),
        TokenRecycling(top_k=2, nodes=3),
        RestDrafter(Datastore(text, 8), nodes=3),
    ):
        d.check_compatible(target)
        d.reset(REPEATY, GREEDY, torch.Generator())
        assert isinstance(d, ScoredDrafter), type(d).__name__
        d.draft(REPEATY + text[:5])
        assert {"score", "match_len"} <= set(d.last)
    pl = PromptLookupDrafter(2, 5)
    pl.reset(REPEATY, GREEDY, torch.Generator())
    t = pl.draft(REPEATY)
    assert t.tokens == [4, 5, 1, 2, 3] and pl.last == dict(score=5.0, match_len=2, draft_len=5, probs=[1.0] * 5)
    assert pl.draft([9, 8]).tokens == [] and pl.last["match_len"] == 0
    la = Lookahead()
    la.reset(REPEATY, GREEDY, torch.Generator())
    assert not isinstance(la, ScoredDrafter)  # HVD gives it default features
