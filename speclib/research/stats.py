"""Statistical checks for speculative decoding (the maths: docs/statistics.md).

Lossless speculative decoding must sample from exactly the target model's distribution. This module
holds the tests that check it empirically and the helpers that put error bars on measurements:

- `chi2_two_sample`: two-sample chi-square homogeneity test between AR-sampled and SD-sampled
  tokens, with sparse bins pooled so every expected count is large enough for the chi-square
  approximation; `pooled_table` exposes the table it tests.
- `null_calibration`: runs that test many times between two samples of the same distribution, to
  measure its false-positive rate (a calibrated test rejects about `alpha` of the time).
- `greedy_identity`: greedy SD output must be token-identical to greedy AR output.
- `bootstrap_ci`, `bootstrap_ratio_ci`: percentile bootstrap intervals, e.g. for the median of
  per-prompt speed ratios (the workbook's speedup, `speclib.research.bench.speedup`) or for a ratio of two
  samples' statistics, such as total AR time / total SD time (stat=np.sum).
- `median_ci`, `median_ci_coverage`: the distribution-free interval of a median from two order statistics,
  whose coverage holds at the small samples the workbook uses per task (6 or 12 prompts), where the
  percentile bootstrap of a median covers less than it claims (tests/test_stats.py measures both).

Floor 1: imports only numpy and scipy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _sps

__all__ = [
    "Chi2Result",
    "IdentityResult",
    "pooled_table",
    "chi2_two_sample",
    "null_calibration",
    "greedy_identity",
    "bootstrap_ci",
    "bootstrap_ratio_ci",
    "median_ci",
    "median_ci_coverage",
    "paired_difference_ci",
    "PermutationResult",
    "run_permutation_test",
]


@dataclass(frozen=True)
class Chi2Result:
    """Outcome of `chi2_two_sample`: statistic, degrees of freedom (n_bins - 1), p-value, number of
    bins after pooling, and the two sample sizes."""

    chi2: float
    dof: int
    p: float
    n_bins: int
    n_a: int
    n_b: int


@dataclass(frozen=True)
class IdentityResult:
    """Outcome of `greedy_identity`: `first_mismatch` lists (pair index, first differing position)
    for every pair that is not identical."""

    n: int
    n_identical: int
    all_identical: bool
    first_mismatch: list[tuple[int, int]]


def _tokens(x, name: str) -> np.ndarray:
    """A non-empty 1-D integer array from a sequence of token ids."""
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of token ids, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must be non-empty")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must contain integers (token ids), got dtype {arr.dtype}")
    return arr


def _expected(table: np.ndarray) -> np.ndarray:
    """Expected counts under homogeneity: row total * column total / grand total."""
    return np.outer(table.sum(axis=1), table.sum(axis=0)) / table.sum()


def pooled_table(a: Sequence[int], b: Sequence[int], min_expected: float = 5.0) -> np.ndarray:
    """The 2 x n_bins contingency table of samples `a` and `b` after pooling sparse categories.

    Categories (the union of observed values) are sorted by pooled count, largest first (ties by
    value, so the result is deterministic). Categories are kept while both rows' expected counts
    are >= `min_expected`; all remaining ones are merged into one "other" bin. If that bin's
    expected count is below `min_expected` in either row, it is merged into the smallest kept bin.
    Every bin of the result therefore has expected count >= `min_expected` in both rows.

    Because a row's expected count is proportional to the column total, the categories that pass
    form a prefix of the sorted order, and the pooling depends only on pooled counts (symmetric in
    `a` and `b`), so it does not bias the test under the null.
    """
    a = _tokens(a, "a")
    b = _tokens(b, "b")
    if not (np.isfinite(min_expected) and min_expected > 0):
        raise ValueError(f"min_expected must be a finite number > 0, got {min_expected!r}")
    values, inverse = np.unique(np.concatenate([a, b]), return_inverse=True)
    table = np.zeros((2, values.size), dtype=np.int64)
    np.add.at(table[0], inverse[: a.size], 1)
    np.add.at(table[1], inverse[a.size :], 1)

    col = table.sum(axis=0)
    order = np.lexsort((values, -col))  # pooled count descending, then value ascending
    table = table[:, order]
    rows = np.array([a.size, b.size], dtype=float)
    expected = np.outer(rows, table.sum(axis=0)) / table.sum()
    ok = (expected >= min_expected).all(axis=0)
    n_keep = int(np.argmin(ok)) if not ok.all() else ok.size  # length of the passing prefix

    kept = table[:, :n_keep]
    rest = table[:, n_keep:].sum(axis=1, keepdims=True)
    if n_keep == table.shape[1]:
        return kept
    if n_keep == 0:
        return rest
    if (rows * rest.sum() / table.sum() >= min_expected).all():
        return np.concatenate([kept, rest], axis=1)
    kept = kept.copy()
    kept[:, -1:] += rest  # the last kept bin is the smallest one
    return kept


def chi2_two_sample(a: Sequence[int], b: Sequence[int], min_expected: float = 5.0) -> Chi2Result:
    """Two-sample chi-square homogeneity test: were token samples `a` and `b` drawn from the same
    distribution?

    Builds the contingency table with `pooled_table` (sparse categories pooled so every expected
    count is >= `min_expected`), then computes sum((O - E)^2 / E) with E = row total * column
    total / grand total, which handles unequal sample sizes, and dof = n_bins - 1. The p-value is
    the chi-square survival function. Raises ValueError for empty samples or when fewer than two
    bins remain after pooling (samples too small or too concentrated to test).
    """
    table = pooled_table(a, b, min_expected)
    n_bins = table.shape[1]
    if n_bins < 2:
        raise ValueError(
            f"a, b: only {n_bins} bin(s) left after pooling with min_expected={min_expected}; "
            "need at least 2 (use larger samples or a smaller min_expected)"
        )
    expected = _expected(table)
    chi2 = float(((table - expected) ** 2 / expected).sum())
    dof = n_bins - 1
    return Chi2Result(
        chi2=chi2,
        dof=dof,
        p=float(_sps.chi2.sf(chi2, dof)),
        n_bins=n_bins,
        n_a=int(table[0].sum()),
        n_b=int(table[1].sum()),
    )


@dataclass(frozen=True)
class PermutationResult:
    chi2: float
    dof: int
    p_asymptotic: float  # chi-square survival function: assumes independent tokens
    p_permutation: float  # exact under exchangeable runs, whatever the dependence inside a run
    n_perm: int
    n_a: int
    n_b: int


def run_permutation_test(
    runs_a: Sequence[Sequence[int]],
    runs_b: Sequence[Sequence[int]],
    n_perm: int = 1000,
    paired: bool = True,
    seed: int = 0,
    min_expected: float = 5.0,
) -> PermutationResult:
    """Chi-square statistic over the tokens of whole runs, with a permutation p-value.

    Tokens inside one generated run are dependent, so the chi-square distribution of the pooled
    token counts is only approximate (anti-conservative when runs repeat themselves). Runs are
    independent, though: under the null, swapping the labels of runs leaves the distribution of the
    statistic unchanged. With `paired=True`, run i of each method shares a prompt and labels are
    swapped within pairs; otherwise runs are relabelled at random, group sizes kept.
    p = (1 + #{permuted statistic >= observed}) / (1 + n_perm).
    """
    if len(runs_a) == 0 or len(runs_b) == 0:
        raise ValueError("runs_a and runs_b must each hold at least one run")
    if paired and len(runs_a) != len(runs_b):
        raise ValueError(f"paired runs need equal counts, got {len(runs_a)} and {len(runs_b)}")
    if not isinstance(n_perm, int) or n_perm < 1:
        raise ValueError(f"n_perm must be an int >= 1, got {n_perm!r}")
    runs = [np.asarray(r, dtype=np.int64) for r in list(runs_a) + list(runs_b)]
    na = len(runs_a)

    def stat(in_a: np.ndarray) -> float:
        a = np.concatenate([r for r, f in zip(runs, in_a) if f])
        b = np.concatenate([r for r, f in zip(runs, in_a) if not f])
        return chi2_two_sample(a, b, min_expected).chi2

    labels = np.arange(len(runs)) < na
    observed = chi2_two_sample(np.concatenate(runs[:na]), np.concatenate(runs[na:]), min_expected)
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(n_perm):
        if paired:
            swap = rng.random(na) < 0.5
            perm = np.concatenate([~swap, swap])
        else:
            perm = rng.permutation(labels)
        hits += stat(perm) >= observed.chi2
    return PermutationResult(
        chi2=observed.chi2,
        dof=observed.dof,
        p_asymptotic=observed.p,
        p_permutation=(1 + hits) / (1 + n_perm),
        n_perm=n_perm,
        n_a=observed.n_a,
        n_b=observed.n_b,
    )


def null_calibration(
    sampler: Callable[[np.random.Generator], tuple[Sequence[int], Sequence[int]]],
    n_trials: int,
    alpha: float = 0.05,
    seed: int = 0,
    **kw,
) -> tuple[np.ndarray, float]:
    """Measure the false-positive rate of `chi2_two_sample` under the null hypothesis.

    `sampler(rng)` must return two samples (a, b) drawn from the SAME distribution. Each of
    `n_trials` draws is tested with `chi2_two_sample(a, b, **kw)`. Returns all p-values and the
    fraction below `alpha`. A calibrated test has a false-positive rate close to `alpha` and
    p-values spread uniformly on [0, 1]; a rate far above `alpha` means the chi-square
    approximation is failing (too-sparse bins), far below means the test is needlessly weak.
    Deterministic for a given `seed` (one generator is shared by all trials).
    """
    if not callable(sampler):
        raise TypeError(f"sampler must be callable, got {type(sampler).__name__}")
    if int(n_trials) != n_trials or n_trials < 1:
        raise ValueError(f"n_trials must be an integer >= 1, got {n_trials!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    rng = np.random.default_rng(seed)
    p_values = np.empty(int(n_trials))
    for i in range(int(n_trials)):
        a, b = sampler(rng)
        p_values[i] = chi2_two_sample(a, b, **kw).p
    return p_values, float(np.mean(p_values < alpha))


def greedy_identity(seqs_a: Sequence[Sequence[int]], seqs_b: Sequence[Sequence[int]]) -> IdentityResult:
    """Compare two lists of token-id sequences pair by pair (e.g. greedy SD vs greedy AR outputs).

    For each differing pair, `first_mismatch` records (index, position): the first position where
    the tokens differ, or the shorter length when one sequence is a prefix of the other.
    """
    if len(seqs_a) != len(seqs_b):
        raise ValueError(f"seqs_a and seqs_b must have the same length, got {len(seqs_a)} and {len(seqs_b)}")
    mismatches: list[tuple[int, int]] = []
    for i, (sa, sb) in enumerate(zip(seqs_a, seqs_b)):
        x = np.asarray(sa).reshape(-1)
        y = np.asarray(sb).reshape(-1)
        m = min(x.size, y.size)
        diff = np.flatnonzero(x[:m] != y[:m])
        if diff.size:
            mismatches.append((i, int(diff[0])))
        elif x.size != y.size:
            mismatches.append((i, m))
    n = len(seqs_a)
    return IdentityResult(n=n, n_identical=n - len(mismatches), all_identical=not mismatches, first_mismatch=mismatches)


def _sample(values, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of numbers, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must contain only finite values")
    return arr


def _check_boot(n_boot: int, level: float) -> None:
    if int(n_boot) != n_boot or n_boot < 1:
        raise ValueError(f"n_boot must be an integer >= 1, got {n_boot!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")


def _interval(boot: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def bootstrap_ci(
    values: Sequence[float],
    stat: Callable[[np.ndarray], float] = np.median,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Percentile bootstrap: (stat(values), lo, hi) with a `level` two-sided interval from
    `n_boot` resamples with replacement. Deterministic for a given `seed`."""
    x = _sample(values, "values")
    _check_boot(n_boot, level)
    rng = np.random.default_rng(seed)
    draws = x[rng.integers(0, x.size, (int(n_boot), x.size))]  # the same stream as one draw per resample
    if stat in (np.median, np.mean):  # vectorized over the resamples; the same values as the loop
        boot = stat(draws, axis=1)
    else:
        boot = np.array([stat(row) for row in draws])
    return (float(stat(x)), *_interval(boot, level))


def _median_rank(n: int, level: float) -> int:
    """The largest k with P(x(k) <= median <= x(n+1-k)) = 1 - 2 P(Binomial(n, 1/2) < k) >= level; 0 if none."""
    k = np.arange(1, n // 2 + 1)
    ok = k[1 - 2 * _sps.binom.cdf(k - 1, n, 0.5) >= level]
    return int(ok.max()) if ok.size else 0


def median_ci_coverage(n: int, level: float = 0.95) -> float:
    """The exact coverage of `median_ci` for `n` values: at least `level` (it jumps with n), NaN where no pair
    of order statistics reaches `level` (n < 6 at 0.95)."""
    k = _median_rank(int(n), level)
    return float(1 - 2 * _sps.binom.cdf(k - 1, n, 0.5)) if k else float("nan")


def median_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(median, lo, hi): the distribution-free interval of the population median, the order statistics
    x(k) and x(n+1-k) with the largest k whose coverage 1 - 2 P(Binomial(n, 1/2) < k) is at least `level`.
    Exact for independent draws of any continuous distribution, and conservative (`median_ci_coverage`:
    0.969 at n = 6, where it is the whole sample's range; 0.961 at 12; 0.956 at 42). NaN ends where no such
    pair exists (n < 6 at 0.95): no interval rather than one that covers less than it says."""
    x = np.sort(_sample(values, "values"))
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    k = _median_rank(x.size, level)
    lo, hi = (float(x[k - 1]), float(x[x.size - k])) if k else (float("nan"), float("nan"))
    return float(np.median(x)), lo, hi


def bootstrap_ratio_ci(
    num: Sequence[float],
    den: Sequence[float],
    stat: Callable[[np.ndarray], float] = np.median,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
    paired: bool | None = None,
) -> tuple[float, float, float]:
    """Percentile bootstrap of the ratio stat(num) / stat(den) of two samples' statistics, e.g. the
    total-time ratio total AR time / total SD time (stat=np.sum). Returns (estimate, lo, hi). The
    workbook's speedup is not this ratio but the median of per-prompt ratios (`speclib.research.bench.speedup`).

    `paired=None` (default) resamples pairs (the same indices in both) when len(num) == len(den),
    e.g. AR and SD timed on the same prompts, and the two samples independently otherwise.
    `paired=True` requires equal lengths; `paired=False` always resamples independently.
    """
    x = _sample(num, "num")
    y = _sample(den, "den")
    _check_boot(n_boot, level)
    if paired is None:
        paired = x.size == y.size
    elif paired and x.size != y.size:
        raise ValueError(f"paired=True needs len(num) == len(den), got {x.size} and {y.size}")
    d = stat(y)
    if d == 0:
        raise ValueError("den: stat(den) is 0, the ratio is undefined")
    rng = np.random.default_rng(seed)
    boot = np.empty(int(n_boot))
    for i in range(int(n_boot)):
        ix = rng.integers(0, x.size, x.size)
        iy = ix if paired else rng.integers(0, y.size, y.size)
        boot[i] = stat(x[ix]) / stat(y[iy])
    return (float(stat(x) / d), *_interval(boot, level))


def paired_difference_ci(a, b, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """Percentile bootstrap of rate(a) - rate(b) for two methods measured on the same units (prompts,
    windows), resampling units, the same indices on both sides. Each side holds per-unit columns
    `num` and `den` (for a pooled rate sum(num) / sum(den), e.g. accepted / drafted per prompt; use
    den = 1 for a plain mean). Returns (estimate, lo, hi); an interval that holds 0 means the data
    cannot order the two."""
    an, ad, bn, bd = (
        _sample(np.asarray(x[c], dtype=float), f"{name}[{c!r}]")
        for x, name in ((a, "a"), (b, "b"))
        for c in ("num", "den")
    )
    if not (an.size == ad.size == bn.size == bd.size):
        raise ValueError(f"a and b must hold the same units, got {an.size} and {bn.size}")
    _check_boot(n_boot, level)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, an.size, (int(n_boot), an.size))
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = an[idx].sum(1) / ad[idx].sum(1) - bn[idx].sum(1) / bd[idx].sum(1)
    return (float(an.sum() / ad.sum() - bn.sum() / bd.sum()), *_interval(boot[np.isfinite(boot)], level))
