"""What a load sweep measured (`speclib.research.load` rows: one per request, and the server's step log),
summarized per method and rate: latency percentiles, throughput, batch sizes, acceptance, and each
method's TPOT paired with AR's on the same turns.

    summary = summarize(requests, steps, seed=0)     # one row per (method, rate)
    requests["same_as_ar"] = same_as_ar(requests)    # greedy answers equal to AR's
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from speclib.research import stats


def same_as_ar(req: pd.DataFrame) -> pd.Series:
    """Per request: its text equals AR's (first pass) for the same rate, session and turn."""
    ar = req[(req.method == "AR") & (req.pass_ == 0)].set_index(["rate", "session", "turn"]).text
    return pd.Series([ar.get((r.rate, r.session, r.turn)) == r.text for r in req.itertuples()], index=req.index)


def paired_tpot(ok: pd.DataFrame, method: str, rate: float, seed: int = 0) -> tuple[float, float, float]:
    """TPOT against AR's on the same turns (each turn's TPOT the mean over the passes): per session the mean
    of its requests' ratios, then the median over sessions with a 95% bootstrap interval over sessions (the
    independent units). One session: the ratio, no interval."""
    a = ok[(ok.method == "AR") & (ok.rate == rate)].groupby(["session", "turn"]).tpot.mean()
    m = ok[(ok.method == method) & (ok.rate == rate)].groupby(["session", "turn"]).tpot.mean()
    r = (m / a).dropna().groupby(level="session").mean().to_numpy()
    return stats.bootstrap_ci(r, seed=seed) if len(r) > 1 else (float(r[0]), np.nan, np.nan)


def ar_drift(ok: pd.DataFrame, rate: float, seed: int = 0) -> tuple[float, float, float]:
    """AR's TPOT in its second pass (the sweep's last run) over its first (the first run), paired per turn:
    per session the mean ratio, the median over sessions with a 95% bootstrap interval. How far the machine
    moved over the sweep, the noise every method's comparison with AR carries."""
    a = ok[(ok.method == "AR") & (ok.rate == rate)].set_index(["pass_", "session", "turn"]).tpot
    r = (a.loc[1] / a.loc[0]).dropna().groupby(level="session").mean().to_numpy()
    return stats.bootstrap_ci(r, seed=seed)


def _p99(x: pd.Series) -> float:
    return float(np.percentile(x.dropna(), 99))


def summarize(req: pd.DataFrame, steps: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per method and rate: client-side latency percentiles, throughput, the server's batch sizes and
    acceptance, and TPOT paired with AR's (`paired_tpot`); failed requests left out."""
    ok = req[req.error.isna()]
    summary = (
        ok.groupby(["method", "rate"])
        .agg(
            requests=("tokens", "size"),
            tokens=("tokens", "sum"),
            ttft_p50=("ttft", "median"),
            ttft_p99=("ttft", _p99),
            tpot_p50=("tpot", "median"),
            tpot_p99=("tpot", _p99),
            e2e_p50=("e2e", "median"),
        )
        .reset_index()
    )
    span = (
        ok.assign(done=ok.arrival + ok.e2e)
        .groupby(["method", "rate"])
        .agg(first=("arrival", "min"), last=("done", "max"))
    )
    summary["throughput"] = summary.tokens.to_numpy() / (span["last"] - span["first"]).to_numpy()
    st = steps.groupby(["method", "rate"]).agg(
        steps=("batch", "size"),
        mean_batch=("batch", "mean"),
        drafted=("drafted", "sum"),
        accepted=("accepted", "sum"),
        mean_nodes=("nodes", "mean"),
    )
    summary = summary.merge(st.reset_index(), on=["method", "rate"])
    summary["acceptance"] = summary.accepted / summary.drafted.replace(0, np.nan)
    ar = summary[summary.method == "AR"].set_index("rate")
    ratios = [paired_tpot(ok, r.method, r.rate, seed) for r in summary.itertuples()]
    summary["tpot_vs_ar"], summary["tpot_lo"], summary["tpot_hi"] = np.array(ratios).T
    summary["ttft_vs_ar"] = summary.ttft_p50 / summary.rate.map(ar.ttft_p50)
    return summary


def step_economy(steps: pd.DataFrame, method: str, rate: float) -> dict:
    """From the server's step log at `rate`: tokens each request gains per step, seconds per request-step
    (drafting and the verify pass), the share of drafting steps whose draft was wholly rejected and their
    mean seconds, and the seconds per request-step had those steps been plain ones (AR's mean step: a
    hindsight bound)."""
    g = steps[(steps.method == method) & (steps.rate == rate)]
    ar_step = steps[(steps.method == "AR") & (steps.rate == rate)].verify_s.mean()
    rejected = g[(g.drafted > 0) & (g.accepted == 0)]
    busy = (g.draft_s + g.verify_s).sum()
    return dict(
        tokens=(g.accepted.sum() + g.batch.sum()) / g.batch.sum(),
        seconds=busy / g.batch.sum(),
        wasted=len(rejected) / max(1, (g.drafted > 0).sum()),
        wasted_s=(rejected.draft_s + rejected.verify_s).mean() if len(rejected) else np.nan,
        hindsight=(busy - (rejected.draft_s + rejected.verify_s).sum() + len(rejected) * ar_step) / g.batch.sum(),
    )
