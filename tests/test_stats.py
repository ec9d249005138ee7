"""Tests for speclib.research.stats.

Every statistical test here uses a fixed seed, so it is deterministic: it passes or fails the same
way on every run. The comments state the false-positive rate each threshold would have if the seed
were drawn at random, i.e. how likely a correct implementation would be to fail by bad luck.
"""

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from speclib.research import stats
from speclib.research.stats import (
    Chi2Result,
    bootstrap_ci,
    bootstrap_ratio_ci,
    chi2_two_sample,
    greedy_identity,
    null_calibration,
    pooled_table,
)


def zipf_probs(n: int, s: float = 1.1) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1) ** s
    return p / p.sum()


# --- chi-square -------------------------------------------------------------------------------


def test_chi2_same_distribution_not_rejected():
    # Under the null p is uniform, so a random seed would fail p > 0.01 with probability 1 %.
    rng = np.random.default_rng(1)
    p = zipf_probs(100)
    a = rng.choice(100, size=5000, p=p)
    b = rng.choice(100, size=3000, p=p)  # unequal sizes on purpose
    r = chi2_two_sample(a, b)
    assert isinstance(r, Chi2Result)
    assert r.n_a == 5000 and r.n_b == 3000
    assert r.dof == r.n_bins - 1 and r.n_bins >= 10
    assert r.p > 0.01


def test_chi2_different_distributions_rejected():
    # Probabilities over 50 categories shifted by one place (a power-law tail, so the shift is
    # large): chi2 is in the hundreds, a p >= 1e-6 would take an astronomically unlucky seed.
    rng = np.random.default_rng(2)
    p = zipf_probs(50)
    a = rng.choice(50, size=5000, p=p)
    b = rng.choice(50, size=5000, p=np.roll(p, 1))
    r = chi2_two_sample(a, b)
    assert r.p < 1e-6


def test_chi2_matches_scipy_on_dense_table():
    # 6 equiprobable categories, 3000 + 2000 draws: every expected count is ~300, no pooling.
    rng = np.random.default_rng(3)
    a = rng.integers(0, 6, size=3000)
    b = rng.integers(0, 6, size=2000)
    table = np.array([np.bincount(a, minlength=6), np.bincount(b, minlength=6)])
    ref_chi2, ref_p, ref_dof, _ = chi2_contingency(table, correction=False)
    r = chi2_two_sample(a, b)
    assert r.n_bins == 6 and r.dof == ref_dof == 5
    assert r.chi2 == pytest.approx(ref_chi2, rel=1e-12)
    assert r.p == pytest.approx(ref_p, rel=1e-9)
    # The pooled table is the same table, columns reordered by count.
    assert sorted(map(tuple, pooled_table(a, b).T)) == sorted(map(tuple, table.T))


@pytest.mark.parametrize("min_expected", [1.0, 5.0, 20.0])
def test_pooling_leaves_no_sparse_bin(min_expected):
    rng = np.random.default_rng(4)
    p = zipf_probs(400, s=1.3)  # a long sparse tail that must be pooled
    a = rng.choice(400, size=3000, p=p)
    b = rng.choice(400, size=1000, p=p)
    table = pooled_table(a, b, min_expected)
    assert table.shape[0] == 2 and 2 <= table.shape[1] < len(np.union1d(a, b))
    assert table[0].sum() == 3000 and table[1].sum() == 1000  # pooling loses no sample
    expected = np.outer(table.sum(axis=1), table.sum(axis=0)) / table.sum()
    assert expected.min() >= min_expected


def test_pooling_merges_small_other_bin_into_smallest_kept():
    # Pooled counts: 0 -> 200, 1 -> 100, 2 -> 4 (expected 2 per row, fails min_expected=5).
    # "other" = {2} is itself too small, so it joins the smallest kept bin (category 1).
    a = [0] * 100 + [1] * 50 + [2] * 2
    b = [0] * 100 + [1] * 50 + [2] * 2
    np.testing.assert_array_equal(pooled_table(a, b), [[100, 52], [100, 52]])
    # With a larger tail, "other" is big enough to stand alone.
    a2 = a + [3, 4, 5, 6, 7, 8] * 2
    b2 = b + [3, 4, 5, 6, 7, 8] * 2
    np.testing.assert_array_equal(pooled_table(a2, b2), [[100, 50, 14], [100, 50, 14]])


def test_null_calibration_false_positive_rate():
    # Two samples of 2000 draws from the same Zipf-like 200-category distribution, 300 trials.
    # A calibrated test rejects with probability alpha = 0.05, so the count of rejections is
    # Binomial(300, 0.05): mean 15, sd 3.8. The band [0.02, 0.09] (6..27 rejections) is -2.4 sd to
    # +3.2 sd, so a calibrated test would fail it with probability < 1 % for a random seed (over
    # seeds 0..9 the rate ranged 0.03..0.077, mean 0.048). The seed is fixed, so the outcome is
    # deterministic. What it catches: gross miscalibration, e.g. a one-sample test that treats
    # sample a as the exact distribution ignores a's own noise and rejects ~98 % of the time here.
    p = zipf_probs(200)

    def sampler(rng):
        return rng.choice(200, size=2000, p=p), rng.choice(200, size=2000, p=p)

    p_values, fpr = null_calibration(sampler, n_trials=300, alpha=0.05, seed=5)
    assert p_values.shape == (300,)
    assert 0.02 <= fpr <= 0.09
    assert fpr == np.mean(p_values < 0.05)
    # p-values roughly uniform: each quarter of [0, 1] holds 75 +- 7.5 (sd) of them.
    counts = np.histogram(p_values, bins=4, range=(0, 1))[0]
    assert counts.min() >= 50 and counts.max() <= 100
    # Deterministic for a seed.
    p2, _ = null_calibration(sampler, n_trials=5, alpha=0.05, seed=5)
    np.testing.assert_array_equal(p2, p_values[:5])


@pytest.mark.parametrize(
    "a, b, match",
    [
        ([], [1, 2], "a must be non-empty"),
        ([1, 2], [], "b must be non-empty"),
        ([[1, 2]], [1, 2], "a must be a 1-D"),
        ([0.5, 1.0], [1, 2], "a must contain integers"),
        ([1] * 50, [1] * 50, "at least 2"),  # one category: nothing to compare
        ([1, 2], [2, 1], "at least 2"),  # too small: everything pools into one bin
    ],
)
def test_chi2_bad_inputs(a, b, match):
    with pytest.raises(ValueError, match=match):
        chi2_two_sample(a, b)


def test_bad_min_expected_and_calibration_args():
    with pytest.raises(ValueError, match="min_expected"):
        chi2_two_sample([1, 2] * 50, [1, 2] * 50, min_expected=0)
    sampler = lambda rng: ([1, 2] * 50, [1, 2] * 50)  # noqa: E731
    with pytest.raises(ValueError, match="n_trials"):
        null_calibration(sampler, n_trials=0)
    with pytest.raises(ValueError, match="alpha"):
        null_calibration(sampler, n_trials=3, alpha=1.5)
    with pytest.raises(TypeError, match="sampler"):
        null_calibration(None, n_trials=3)


# --- greedy identity --------------------------------------------------------------------------


def test_greedy_identity_all_identical():
    seqs = [[1, 2, 3], [4, 5], np.array([7, 8, 9])]
    r = greedy_identity(seqs, [list(s) for s in seqs])
    assert r.n == 3 and r.n_identical == 3 and r.all_identical and r.first_mismatch == []


def test_greedy_identity_mismatch_and_prefix():
    a = [[1, 2, 3, 4], [5, 6, 7], [1, 2], [9], [3, 3, 3]]
    b = [[1, 2, 9, 4], [5, 6, 7], [1, 2, 3], [8], [3, 3]]
    r = greedy_identity(a, b)
    assert r.n == 5 and r.n_identical == 1 and not r.all_identical
    # pair 0 differs at position 2; pair 2 and 4 are prefix cases (shorter length); pair 3 at 0
    assert r.first_mismatch == [(0, 2), (2, 2), (3, 0), (4, 2)]


def test_greedy_identity_length_mismatch_raises():
    with pytest.raises(ValueError, match="seqs_a and seqs_b"):
        greedy_identity([[1]], [[1], [2]])


# --- bootstrap --------------------------------------------------------------------------------


def test_bootstrap_ci_covers_true_median_and_is_deterministic():
    # Exponential(1) has median ln 2. A 95 % interval misses it with probability ~5 % for a
    # random seed; with these fixed seeds the outcome is deterministic.
    rng = np.random.default_rng(6)
    x = rng.exponential(1.0, size=400)
    est, lo, hi = bootstrap_ci(x, seed=0)
    assert est == pytest.approx(np.median(x))
    assert lo < np.log(2) < hi
    assert lo <= est <= hi and hi - lo < 0.3
    assert bootstrap_ci(x, seed=0) == (est, lo, hi)
    assert bootstrap_ci(x, seed=1) != (est, lo, hi)
    # A wider level gives a wider interval.
    _, lo99, hi99 = bootstrap_ci(x, level=0.99, seed=0)
    assert lo99 <= lo and hi99 >= hi


@pytest.mark.parametrize("n", [1, 2, 6, 7, 42])
def test_bootstrap_ci_vectorized_median_and_mean_equal_the_resample_loop(n):
    """np.median and np.mean run over all resamples at once; any other callable runs once per resample. Both
    see the same draws, so the intervals are equal to the last bit (ties and even n included)."""
    x = np.round(np.random.default_rng(n).lognormal(0.2, 0.3, n), 2)  # rounded: ties
    for fast, slow in ((np.median, lambda v: float(np.median(v))), (np.mean, lambda v: float(np.mean(v)))):
        assert bootstrap_ci(x, fast, n_boot=501, seed=3) == bootstrap_ci(x, slow, n_boot=501, seed=3)


def test_bootstrap_ratio_ci():
    # AR times ~ 2x SD times: true ratio of medians is 2.
    rng = np.random.default_rng(7)
    sd = rng.lognormal(0.0, 0.2, size=200)
    ar = 2.0 * sd * rng.lognormal(0.0, 0.05, size=200)  # paired: same prompts
    est, lo, hi = bootstrap_ratio_ci(ar, sd, seed=0)
    assert est == pytest.approx(np.median(ar) / np.median(sd))
    assert lo < 2.0 < hi
    # Pairing exploits the correlation: the paired interval is narrower than the unpaired one.
    _, ulo, uhi = bootstrap_ratio_ci(ar, sd, seed=0, paired=False)
    assert hi - lo < uhi - ulo
    # Unequal lengths resample independently.
    est2, lo2, hi2 = bootstrap_ratio_ci(ar, sd[:150], seed=0)
    assert lo2 < est2 < hi2
    assert bootstrap_ratio_ci(ar, sd, seed=0) == (est, lo, hi)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(values=[]), "values"),
        (dict(values=[1.0, np.nan]), "values"),
        (dict(values=[1.0, 2.0], n_boot=0), "n_boot"),
        (dict(values=[1.0, 2.0], level=1.0), "level"),
    ],
)
def test_bootstrap_bad_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bootstrap_ci(**kwargs)


def test_bootstrap_ratio_bad_inputs():
    with pytest.raises(ValueError, match="paired"):
        bootstrap_ratio_ci([1.0, 2.0], [1.0], paired=True)
    with pytest.raises(ValueError, match="den"):
        bootstrap_ratio_ci([1.0, 2.0], [0.0, 0.0])
    with pytest.raises(ValueError, match="num"):
        bootstrap_ratio_ci([], [1.0])


def _sticky_runs(rng, n_runs, length, probs):
    """Runs that repeat their first token with prob 0.8: strongly dependent tokens within a run."""
    runs = []
    for _ in range(n_runs):
        first = rng.choice(len(probs), p=probs)
        runs.append([first if rng.random() < 0.8 else rng.choice(len(probs), p=probs) for _ in range(length)])
    return runs


def test_permutation_test_is_calibrated_where_the_asymptotic_one_is_not():
    """Dependent tokens: the asymptotic chi-square p-value rejects far too often, the run-level
    permutation p-value does not. 60 trials at alpha 0.05, fixed seed; the bands are loose
    (binomial sd of the rate ~0.028) so the test is deterministic and fails only on real regressions."""
    from speclib.research.stats import run_permutation_test

    rng = np.random.default_rng(0)
    probs = np.ones(20) / 20
    asym, perm = [], []
    for t in range(60):
        r = run_permutation_test(_sticky_runs(rng, 30, 20, probs), _sticky_runs(rng, 30, 20, probs), n_perm=99, seed=t)
        asym.append(r.p_asymptotic < 0.05)
        perm.append(r.p_permutation < 0.05)
    assert np.mean(asym) > 0.3
    assert np.mean(perm) < 0.15


def test_permutation_test_detects_a_difference():
    from speclib.research.stats import run_permutation_test

    rng = np.random.default_rng(1)
    p1 = np.ones(10) / 10
    p2 = np.r_[np.full(5, 0.14), np.full(5, 0.06)]
    a = [list(rng.choice(10, 20, p=p1)) for _ in range(40)]
    b = [list(rng.choice(10, 20, p=p2)) for _ in range(40)]
    assert run_permutation_test(a, b, n_perm=199, seed=0).p_permutation < 0.01


def test_paired_difference_ci():
    from speclib.research.stats import paired_difference_ci

    rng = np.random.default_rng(0)
    den = rng.integers(20, 40, 30)
    same = dict(num=rng.binomial(den, 0.5), den=den)
    assert paired_difference_ci(same, same) == (0.0, 0.0, 0.0)  # identical sides: no spread at all
    better = dict(num=rng.binomial(den, 0.8), den=den)
    est, lo, hi = paired_difference_ci(better, same, seed=1)
    assert 0 < lo < est < hi and abs(est - (better["num"].sum() / den.sum() - same["num"].sum() / den.sum())) < 1e-12
    # negative control: two draws of the same rate; the 95% interval holds 0 in about 95% of seeds
    holds = 0
    for s in range(200):
        r = np.random.default_rng(100 + s)
        a, b = dict(num=r.binomial(den, 0.5), den=den), dict(num=r.binomial(den, 0.5), den=den)
        _, lo, hi = paired_difference_ci(a, b, n_boot=400, seed=s)
        holds += lo <= 0 <= hi
    assert holds >= 180  # 0.90: the percentile bootstrap runs a little narrow at 30 units
    with pytest.raises(ValueError, match="same units"):
        paired_difference_ci(same, dict(num=[1, 2], den=[2, 2]))


def test_median_ci_takes_order_statistics_and_gives_none_below_six():
    assert stats.median_ci([3, 1, 2, 6, 5, 4]) == (3.5, 1.0, 6.0)  # n = 6: the range, coverage 1 - 2/64
    assert stats.median_ci_coverage(6) == pytest.approx(1 - 2 / 64)
    est, lo, hi = stats.median_ci(np.arange(12.0))
    assert (est, lo, hi) == (5.5, 2.0, 9.0)  # x(3), x(10): 0.961; x(4), x(9) would be 0.854
    assert stats.median_ci_coverage(12) == pytest.approx(0.9614, abs=1e-4)
    est, lo, hi = stats.median_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    assert est == 3.0 and np.isnan(lo) and np.isnan(hi) and np.isnan(stats.median_ci_coverage(5))
    assert np.isfinite(stats.median_ci(range(6), level=0.9)[1])
    with pytest.raises(ValueError, match="level"):
        stats.median_ci(range(10), level=1.0)


@pytest.mark.parametrize("n", [6, 12, 42])
def test_median_ci_holds_its_coverage_where_the_percentile_bootstrap_falls_short(n):
    """Simulated per-prompt speed ratios around a true median of 1.3, skewed (lognormal) and heavy-tailed
    (t with 3 degrees of freedom on the log scale): the order-statistic interval covers the median at its exact
    coverage (>= 0.95) within Monte Carlo error; the percentile bootstrap of the median, at the same nominal
    0.95, covers less (measured: 0.92-0.94 at n = 6 and 12). 1,500 samples each: standard error 0.006."""
    rng, reps, true = np.random.default_rng(n), 1500, 1.3
    idx = rng.integers(0, n, (500, n))
    for z in [rng.normal(0, 0.25, (reps, n)), 0.15 * rng.standard_t(3, (reps, n))]:
        x = true * np.exp(z)
        order = np.mean([lo <= true <= hi for _, lo, hi in map(stats.median_ci, x)])
        bounds = (np.quantile(np.median(v[idx], axis=1), [0.025, 0.975]) for v in x)
        boot = np.mean([lo <= true <= hi for lo, hi in bounds])
        se = np.sqrt(0.05 * 0.95 / reps)
        assert abs(order - stats.median_ci_coverage(n)) < 4 * se and order > 0.95 - 3 * se
        assert boot < order and (n > 12 or boot < 0.95 - 2 * se)


def test_chi2_false_positive_rate_at_the_sizes_the_lossless_tests_use():
    """The chi-square tests of the decoders compare 1200 (or 800) runs of AR with as many of SD over a
    near-uniform 64-token vocabulary and assert p > 1e-3. Under the null (the same distribution on both
    sides) that assertion should fail 0.1% of the time, and p < 0.05 5% of the time: measured over 4000
    seeded pairs of i.i.d. draws (a mildly skewed 64-token distribution, unequal sizes too), the rates stay
    in binomial bands (sd 0.0034 at 0.05; at 1e-3 the expected count is 4). Measured: 5.0% below 0.05, 0.8%
    below 0.01, 1 of 4000 below 1e-3."""
    rng = np.random.default_rng(7)
    p = zipf_probs(64, 0.3)
    pvals = np.array(
        [chi2_two_sample(rng.choice(64, n, p=p), rng.choice(64, 1200, p=p)).p for n in (1200, 800) for _ in range(2000)]
    )
    assert 0.035 < np.mean(pvals < 0.05) < 0.065
    assert np.sum(pvals < 1e-3) <= 12  # 4 expected; 12 or more has probability below 0.2%
