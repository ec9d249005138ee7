"""speclib.research.load_stats reproduces notebook 08's committed tables from its committed rows."""

import numpy as np
import pandas as pd
import pytest

from speclib.research import load_stats
from speclib.workbook import results


def _same(mine: pd.DataFrame, committed: pd.DataFrame, keys: list[str]) -> None:
    cols = [c for c in mine.columns if c in committed.columns]
    a = mine[cols].sort_values(keys).reset_index(drop=True)
    b = committed[cols].sort_values(keys).reset_index(drop=True)
    assert len(a) == len(b)
    for c in cols:
        if pd.api.types.is_numeric_dtype(a[c]):
            np.testing.assert_allclose(a[c].to_numpy(float), b[c].to_numpy(float), rtol=1e-9, equal_nan=True, err_msg=c)
        else:
            assert a[c].tolist() == b[c].tolist(), c


@pytest.mark.parametrize("prefix", ["", "chat_"])
def test_summaries_reproduce_the_committed_ones(prefix):
    try:
        req, steps = results.load(f"08_serving/{prefix}requests"), results.load(f"08_serving/{prefix}steps")
        committed = results.load(f"08_serving/{prefix}summary")
    except results.MissingResult:
        pytest.skip("notebook 08's results are not committed")
    _same(load_stats.summarize(req, steps, seed=0), committed, ["method", "rate"])


def test_ar_drift_reproduces_the_committed_one():
    try:
        req, committed = results.load("08_serving/requests"), results.load("08_serving/drift")
    except results.MissingResult:
        pytest.skip("notebook 08's drift is not committed")
    ok = req[req.error.isna()]
    mine = pd.DataFrame(
        [
            dict(rate=r, tpot_ratio=d[0], lo=d[1], hi=d[2])
            for r in committed.rate
            for d in [load_stats.ar_drift(ok, r, 0)]
        ]
    )
    _same(mine, committed, ["rate"])


def test_same_as_ar_compares_against_the_first_ar_pass():
    req = pd.DataFrame(
        dict(
            method=["AR", "AR", "lookup", "lookup"],
            pass_=[0, 1, 0, 0],
            rate=[1.0] * 4,
            session=[0, 0, 0, 1],
            turn=[0, 0, 0, 0],
            text=["a", "b", "a", "a"],
        )
    )
    assert load_stats.same_as_ar(req).tolist() == [True, False, True, False]


def test_load_sweep_text_reads_the_committed_sweep():
    """`verdicts.load_sweep_text` on notebook 08's committed rows: the best method at the lowest rate is the
    summary's minimum there, its ratio printed with its interval, and AR's drift named first."""
    from speclib.workbook import verdicts

    try:
        req, steps = results.load("08_serving/requests"), results.load("08_serving/steps")
        drift = results.load("08_serving/drift")
    except results.MissingResult:
        pytest.skip("notebook 08's results are not committed")
    summary = load_stats.summarize(req, steps, seed=0)
    rates = sorted(summary.rate.unique())
    methods = list(summary.method.unique())
    table = pd.DataFrame({1: [1.0, 1.3], 8: [1.0, 2.0]}, index=[0, 4])  # verify price (nodes x batch)
    text = verdicts.load_sweep_text(
        summary, steps, methods, rates, 4, table, 8, {r.rate: (r.tpot_ratio, r.lo, r.hi) for r in drift.itertuples()}
    )
    low = summary[(summary.rate == rates[0]) & (summary.method != "AR")].sort_values("tpot_vs_ar").iloc[0]
    assert (
        text.startswith("AR's second pass")
        and f"the best TPOT is **{low.method}**'s, {low.tpot_vs_ar:.2f} (95% CI" in text
    )
    assert "prices 4 draft tokens per request at 2.00 plain steps at batch 8 against 1.30 alone" in text
