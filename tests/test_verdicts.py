"""The workbook's conclusions (speclib.workbook.verdicts): a goal is met or missed only where the whole
interval says so, and an interval never rounds past a threshold."""

import math

import pytest

from speclib.workbook import verdicts


@pytest.mark.parametrize(
    "speedup, lo, hi, want",
    [
        (1.30, 1.16, 1.40, "met"),
        (1.30, 1.15, 1.40, "met"),  # the bound at the goal
        (1.05, 0.95, 1.14, "not met"),
        (1.20, 1.10, 1.30, "met by the estimate; the interval holds 1.15x"),
        (1.10, 1.00, 1.20, "missed by the estimate; the interval holds 1.15x"),
        (1.20, math.nan, math.nan, "met by the estimate (one prompt: no interval)"),
    ],
)
def test_goal_reads_the_interval_before_the_estimate(speedup, lo, hi, want):
    assert verdicts.goal(dict(speedup=speedup, lo=lo, hi=hi), 1.15) == want


def test_interval_rounds_outward_and_accepts_rows():
    class Row:
        speedup, lo, hi = 1.5, 0.996, 1.342

    assert verdicts.interval(Row()) == "1.50x (95% CI 0.99–1.35)"
    assert verdicts.interval(dict(speedup=2.0, lo=math.nan, hi=math.nan)) == "2.00x (one prompt: no interval)"
    assert verdicts.ci(1.0, 1.2) == "1.00–1.20" and verdicts.ci(math.nan, 1.0) == "n/a"


def test_token_counts_read_as_words():
    assert [verdicts.tokens(n) for n in (950, 2.5e6, 3.4e8, 1.23e9, float("inf"))] == [
        "950",
        "2.5M",
        "340M",
        "1.2B",
        "never",
    ]


def test_learning_curve_text_follows_the_fit():
    """A rising line gives the data a goal takes (and how many times the data seen); a flat one says it
    cannot; a lossy run is called out."""
    import pandas as pd

    row = dict(
        tokens_seen=1e6,
        tokens_per_pass=1.5,
        lo=1.4,
        hi=1.6,
        speedup=0.9,
        speedup_lo=0.8,
        speedup_hi=1.0,
        identical=True,
    )
    curves = {"head": pd.DataFrame([row | dict(tokens_seen=1e5, identical=True), row])}
    curves["draft"] = pd.DataFrame([row | dict(identical=False)])
    rising = dict(a=-1.5, b=0.5, b_lo=0.3, b_hi=0.7, tokens_for_3=1e9, tokens_for_3_lo=1e8, tokens_for_3_hi=1e11)
    flat = dict(a=0.9, b=0.01, b_lo=-0.1, b_hi=0.1, **{"tokens_for_1.8": float("inf")})
    fits = {("head", "tokens_per_pass"): rising, ("head", "speedup"): flat, ("draft", "speedup"): flat}
    text = verdicts.learning_curve_text(curves, fits)
    head, draft = text.split("\n")
    assert "after 1M training tokens: 1.50 tokens per target pass (95% CI 1.40–1.60)" in head
    assert "reaches 3 tokens per pass at about 1B tokens (95% CI 100M–100B), 1000 times the data seen" in head
    assert "Speedup: +0.01x per tenfold data (95% CI -0.10 to +0.10), not a clear gain" in head
    assert "every output equals AR's" in head and "SOME OUTPUTS DIFFER" in draft
    alone = verdicts.learning_curve_text({"draft": curves["draft"]}, {})
    assert "Speedup: one snapshot, no line to say when 1.3x comes." in alone


def test_chat_verdicts_call_a_method_faster_only_beyond_ars_own_drift():
    import pandas as pd

    rows = [
        dict(method="AR", rate=r, tpot_p50=0.05, mean_batch=1.0, tpot_vs_ar=1, tpot_lo=1, tpot_hi=1) for r in (1, 2)
    ]
    rows += [
        dict(method="lookup", rate=1, tpot_p50=0.03, mean_batch=1.0, tpot_vs_ar=0.6, tpot_lo=0.5, tpot_hi=0.8, acceptance=0.3),
        dict(method="lookup", rate=2, tpot_p50=0.04, mean_batch=2.0, tpot_vs_ar=0.7, tpot_lo=0.6, tpot_hi=0.95, acceptance=0.3),
    ]  # fmt: skip
    summary = pd.DataFrame(rows)
    quiet = verdicts.chat_sweep_text(
        summary, ["AR", "lookup"], [1, 2], "m", drift={1: (1.01, 0.9, 1.1), 2: (0.98, 0.9, 1.0)}
    )
    assert "faster than AR at every rate (each interval below 1, beyond AR's drift)" in quiet
    # at rate 2 AR moved by 9% against itself: an upper bound of 0.95 no longer tells
    moved = verdicts.chat_sweep_text(
        summary, ["AR", "lookup"], [1, 2], "m", drift={1: (1.01, 0.9, 1.1), 2: (0.91, 0.8, 0.95)}
    )
    assert "faster than AR at 1/s; at 2/s its interval clears 1 but not AR's own drift" in moved
    assert "0.91 (95% CI 0.80–0.95) at 2/s" in moved
    assert "at every rate" in verdicts.chat_sweep_text(summary, ["AR", "lookup"], [1, 2], "m")  # no drift measured
