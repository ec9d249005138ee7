"""Notebook 06 (self-speculation with layer subsets), SMOKE=True through papermill: the session's
`smoke_run` fixture of conftest.py, outputs in a temporary folder. Like tests/test_notebooks.py it
checks what a bug would break (no error cell, greedy identity, each speedup recomputed from the saved
runs, the pilot's choice carried to the report), never a time."""

import nbformat
import numpy as np
import pandas as pd
from conftest import needs_shipped

NB = "06_self_speculation"


def ci_contains(est, lo, hi) -> bool:
    slack = 1e-9 * np.abs(est)
    return bool(((lo <= est + slack) & (est - slack <= hi)).all())


@needs_shipped
def test_06_self_speculation_smoke(smoke_run):
    out = smoke_run(NB)
    nb = nbformat.read(out / f"{NB}.ipynb", 4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, [f"{e.ename}: {e.evalue}" for e in errors]
    res = out / "results" / NB
    cost = pd.read_parquet(res / "cost.parquet")
    one = cost[cost.n == 1]
    assert (one[one.subset == "full model"].c == 1).all() and (one.c > 0).all()
    subs = one[one.flop_c.notna() & (one.subset != "full model")]
    assert len(subs) and subs.flop_c.between(0, 1, inclusive="neither").all()  # a subset runs fewer layers
    assert set(one.context) >= {128}
    search = pd.read_parquet(res / "search.parquet")
    assert search.best.sum() >= 1 and search.alpha.between(0, 1).all() and (search.c > 0).all()
    # pilot: one chosen k per drafter, and the report runs each drafter at that k
    pilot = pd.read_parquet(res / "pilot.parquet")
    assert pilot.groupby("drafter").chosen.sum().eq(1).all()
    report = pd.read_parquet(res / "subsets.parquet")
    chosen = pilot[pilot.chosen].set_index("drafter").k.sort_index()
    assert report.set_index("drafter").k.sort_index().equals(chosen)
    assert (report.identical == report.runs).all() and (pilot.identical == pilot.runs).all()  # greedy SD = AR
    assert ci_contains(report.speedup, report.lo, report.hi)
    assert report.token_acceptance.between(0, 1).all() and report.tokens_per_call.between(1, report.k + 1).all()
    runs = pd.read_parquet(res / "runs.parquet")
    sp = runs.pivot_table(index="prompt", columns="method", values="tokens_per_s")
    for r in report.itertuples():
        assert np.isclose(r.speedup, (sp[r.method] / sp["AR"]).median())
    # the trained exit: trained at least one step, decoded losslessly
    rep = pd.read_parquet(res / "exit_report.parquet").iloc[0]
    assert rep.steps >= 1 and 0 <= rep.acceptance_after <= 1 and rep.kl_after >= 0
    ex = pd.read_parquet(res / "exit.parquet")
    assert len(ex) == 2 and (ex.identical == ex.runs).all()
    # context length: both timings at every context, greedy identity throughout
    ctx = pd.read_parquet(res / "context.parquet")
    assert set(ctx.timing) == {"end to end", "decoding only"}
    assert ctx.groupby("timing").context.apply(lambda c: sorted(set(c))).map(tuple).nunique() == 1
    assert (ctx.identical == ctx.runs).all() and ci_contains(ctx.speedup, ctx.lo, ctx.hi)
    # one self-draft, chosen on the pilot prompts, is set against the separate draft at every context
    assert ctx[ctx.chosen_on_pilot].groupby(["context", "timing"]).size().eq(1).all()
    assert ctx[ctx.chosen_on_pilot].method.nunique() == 1
    corr = pd.read_parquet(res / "perplexity_correlation.parquet")
    assert corr.rho.dropna().between(-1, 1).all() and "p" not in corr  # dependent points: no p-value
    # the second family: both subgraphs measured, the other family's linear subgraph decodes losslessly
    fam = pd.read_parquet(res / "families.parquet")
    assert set(fam.architecture) == {"qwen3_5_text", "falcon_h1"} and (fam.c > 0).all()
    assert fam.tf_acceptance_t0.between(0, 1).all() and fam.tf_acceptance_t1.between(0, 1).all()
    fruns = pd.read_parquet(res / "family_runs.parquet")
    assert set(fruns.model) == set(fam.model) and (fruns.identical == fruns.runs).all()
    assert fruns.acceptance.between(0, 1).all() and ci_contains(fruns.speedup, fruns.lo, fruns.hi)
    # the summary is recomputable from the committed per-run rows
    rows = pd.read_parquet(res / "family_run_rows.parquet")
    assert set(rows.model) == set(fam.model) and len(rows) == fruns.runs.sum() + rows.query("method == 'AR'").shape[0]
    pairs = pd.read_parquet(res / "family_pairs.parquet")
    assert len(pairs) == len(fam) * (len(fam) - 1) // 2
    for what in ["acceptance", "token_acceptance", "degradation"]:
        assert ci_contains(pairs[f"{what}_diff"], pairs[f"{what}_lo"], pairs[f"{what}_hi"])
    for name in ["cost", "search", "subsets", "exit", "context", "perplexity"]:
        assert (out / "figures" / f"{NB}_{name}.png").stat().st_size > 10_000
