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
