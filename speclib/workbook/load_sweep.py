"""What notebook 08 computes: a verify pass's cost at each batch size, the pilot logs HVD's predictor is fitted
on, and the load sweeps of `python -m speclib serve` (methods in order, then reversed: ABBA). It sits in the
workbook layer because it drives both the server (speclib.serving) and the load tools (speclib.research)."""

from __future__ import annotations

import pandas as pd

from speclib.core.device import set_threads
from speclib.core.generate import generate
from speclib.core.sampling import Sampling
from speclib.drafters.hybrid import HybridDrafter
from speclib.drafters.model import ModelDrafter
from speclib.lms.loading import load as load_lm
from speclib.research import load
from speclib.serving.engine import calibrate
from speclib.serving.server import serving_caches

__all__ = ["server_args", "verify_costs", "cost_ratios", "hvd_pilot", "sweep", "answer_check", "plot_load"]


def server_args(draft: str, k: int, lookup_k: int, tree_budget: int, predictor_file) -> dict[str, list[str]]:
    """method -> the `python -m speclib serve` arguments that run it."""
    model = ["--draft", draft, "--k", str(k)]
    tree = ["--drafter", "tree", "--draft", draft, "--k", str(tree_budget)]
    return {
        "AR": ["--drafter", "none"],
        "chain": ["--drafter", "model", *model],
        "chain adaptive": ["--drafter", "model", *model, "--budget", "adaptive"],
        "tree": tree,
        "tree adaptive": [*tree, "--budget", "adaptive"],
        "lookup": ["--drafter", "lookup", "--k", str(lookup_k)],
        "hybrid": ["--drafter", "hybrid", *model],
        "hvd": ["--drafter", "hvd", *model, "--predictor", str(predictor_file)],
    }


def verify_costs(target: str, batches: list[int], max_nodes: int, repeats: int) -> pd.DataFrame:
    """Seconds of one batched verify pass per (batch, nodes per request), at one thread as the server runs."""
    set_threads(1)
    cost = calibrate(load_lm(target), sorted(set(batches)), max_nodes, repeats=repeats)
    return pd.DataFrame([dict(batch=b, nodes=n, seconds=s) for (b, n), s in cost.items()])


def cost_ratios(costs: pd.DataFrame) -> pd.DataFrame:
    """T(b, n) / T(b, 0): rows nodes, columns batch size."""
    plain = costs[costs.nodes == 0].set_index("batch").seconds
    per_plain = costs.assign(per_plain=costs.seconds / costs.batch.map(plain))
    return per_plain.pivot(index="nodes", columns="batch", values="per_plain")


def hvd_pilot(
    target: str, draft: str, sessions: list, k: int, max_tokens: int, meta: dict | None = None
) -> dict[str, pd.DataFrame]:
    """The pilot sessions replayed offline (`load.replay_sessions`) with the server's caches ranked first in turn,
    logging every cache candidate with its accepted length, then with the draft chain alone (its steps); `meta`:
    columns every table carries."""
    target_lm, draft_lm = load_lm(target), load_lm(draft)

    def replay(make_drafter, keep):
        def run(ids):
            d = make_drafter()
            g = generate(target_lm, ids, max_tokens, drafter=d, sampling=Sampling(0.0))
            keep(d, g)
            return g.tokens

        load.replay_sessions(target_lm, sessions, run)

    logs, steps = [], []
    for first in range(2):  # the fixed "cache" policy logs the first cache's candidates: each goes first once

        def ranked(first=first):
            caches = serving_caches(k)
            return HybridDrafter(caches[first:] + caches[:first], ModelDrafter(draft_lm, k), "cache")

        replay(ranked, lambda d, g: logs.extend(r for r in d.log if r["drafted"] > 0))
    replay(lambda: ModelDrafter(draft_lm, k), lambda d, g: steps.extend(g.stats.steps))
    tables = {"hvd_logs": pd.DataFrame(logs), "hvd_model_steps": pd.DataFrame(steps)[["drafted", "accepted"]]}
    return {name: t.assign(**(meta or {})) for name, t in tables.items()}


def sweep(
    target: str,
    methods: list[str],
    args: dict[str, list[str]],
    sessions: list,
    warmup: list,
    rates: list[float],
    *,
    passes: int,
    max_batch: int,
    max_tokens: int,
    duration_s: float,
    seed: int,
    chat: bool = False,
    meta: dict | None = None,
    prefix: str = "",
) -> dict[str, pd.DataFrame]:
    """Every method in order, then (passes = 2) reversed; per method a fresh server, the warm-up sessions (not
    recorded), then every rate: the client's rows (table `prefix + "requests"`) and the server's step log
    (`prefix + "steps"`), each with `meta`'s columns and the target's name."""
    rows, steps = [], []
    for p in range(passes):
        for method in methods if p == 0 else methods[::-1]:
            with load.served(target, *args[method], "--max-batch", str(max_batch)) as url:
                # a fresh server's first requests pay one-off costs (allocations, lazy initialisation) that
                # would land on whichever rate ran first
                load.run_load_blocking(
                    url, target, warmup, max(rates), max_tokens, duration_s, seed=seed + 1, chat=chat
                )
                for rate in rates:
                    start = len(load.server_steps(url))
                    r = load.run_load_blocking(
                        url, target, sessions, rate, max_tokens, duration_s, seed=seed, chat=chat
                    )
                    rows += [dict(method=method, rate=rate, pass_=p) | x for x in r]
                    steps += [dict(method=method, rate=rate, pass_=p) | s for s in load.server_steps(url)[start:]]
    info = (meta or {}) | dict(target=target)
    return {
        prefix + "requests": pd.DataFrame(rows).assign(**info),
        prefix + "steps": pd.DataFrame(steps).assign(**info),
    }


def answer_check(req: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Per method: requests, failed ones and answers equal to AR's (`req.same_as_ar`, set by the caller); and a
    sentence saying whether every answer matched and none failed."""
    failed = req[req.error.notna()]
    check = req.groupby("method").agg(
        requests=("text", "size"), failed=("error", "count"), same_as_ar=("same_as_ar", "sum")
    )
    whole = req.same_as_ar.all() and failed.empty
    text = (
        f"{len(req)} requests in all; {len(failed)} failed; {int(req.same_as_ar.sum())} of {len(req)} answers "
        "equal AR's for the same session and turn"
        + (
            "."
            if whole
            else f" — **not all**: {', '.join(check.index[check.same_as_ar < check.requests])} differ or failed."
        )
    )
    return check, text


def plot_load(summary: pd.DataFrame):
    """TPOT p50 and p99, TTFT p50 and throughput against the arrival rate, one line per method (dashed: adaptive)."""
    import matplotlib.pyplot as plt

    panels = [
        ("tpot_p50", 1e3, "TPOT p50 (ms)", "time per output token, median"),
        ("tpot_p99", 1e3, "TPOT p99 (ms)", "time per output token, 99th percentile"),
        ("ttft_p50", 1, "TTFT p50 (s)", "time to first token, median"),
        ("throughput", 1, "tokens / s", "throughput"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for m, g in summary.groupby("method", sort=False):
        for ax, (col, scale, _, _) in zip(axes.flat, panels):
            ax.plot(g.rate, g[col] * scale, "--" if "adaptive" in m else "-", marker="o", label=m)
    for i, (ax, (_, _, ylabel, title)) in enumerate(zip(axes.flat, panels)):
        ax.set(
            ylabel=ylabel, title=title, xscale="log", **({"xlabel": "session arrivals per second"} if i >= 2 else {})
        )
    axes[0, 0].legend(fontsize=7)
    return fig
