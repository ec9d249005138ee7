"""The workbook's conclusions, worded once: whether a measured ratio meets a goal, and how an interval is
written. A row `r` is what `speclib.research.bench.speedup` returns (speedup, lo, hi: the median ratio and
its 95% interval; lo and hi NaN where one prompt leaves no interval).

    verdicts.goal(r, 1.15)      # "met" | "not met" | "met by the estimate; the interval holds 1.15x" | ...
    verdicts.interval(r)        # "1.50x (95% CI 1.27–1.68)", the interval rounded outward (`ci`)

A goal is met only when the whole interval lies at or above it and not met only when the whole interval
lies below it; in between the data do not decide, and the wording says so, with the estimate's side.
"""

from __future__ import annotations

import math


def _get(r, key: str) -> float:
    return float(r[key] if isinstance(r, dict) else getattr(r, key))


def goal(r, target: float) -> str:
    """Whether ratio `r` reaches `target`, read from its interval first, then its estimate."""
    lo, hi, est = _get(r, "lo"), _get(r, "hi"), _get(r, "speedup")
    if math.isnan(lo) or math.isnan(hi):
        return f"{'met' if est >= target else 'missed'} by the estimate (one prompt: no interval)"
    if lo >= target:
        return "met"
    if hi < target:
        return "not met"
    return f"{'met' if est >= target else 'missed'} by the estimate; the interval holds {target:g}x"


def ci(lo: float, hi: float, digits: int = 2) -> str:
    """An interval rounded outward ("0.99–1.35" for 0.996–1.342), so a bound never reads as if it
    cleared a threshold (1, say) that it does not clear; "n/a" when it was not computed."""
    if not (lo == lo and hi == hi):
        return "n/a"
    f = 10**digits
    return f"{math.floor(lo * f + 1e-9) / f:.{digits}f}–{math.ceil(hi * f - 1e-9) / f:.{digits}f}"


def interval(r, digits: int = 2) -> str:
    """`r`'s estimate and 95% interval in the workbook's wording (the interval rounded outward, `ci`)."""
    est, lo, hi = _get(r, "speedup"), _get(r, "lo"), _get(r, "hi")
    if math.isnan(lo) or math.isnan(hi):
        return f"{est:.{digits}f}x (one prompt: no interval)"
    return f"{est:.{digits}f}x (95% CI {ci(lo, hi, digits)})"
