"""Notebook 08's study code (speclib.workbook.load_sweep): the servers' arguments, the verify-cost ratios and
the answer check, on hand-made and committed tables (the sweeps themselves run in the notebook's smoke test)."""

import numpy as np
import pandas as pd
import pytest

from speclib.core.device import REPO
from speclib.workbook import load_sweep

RESULTS = REPO / "data" / "results" / "08_serving"


def test_every_method_has_server_arguments_and_the_draft_where_it_needs_one():
    args = load_sweep.server_args("d", 4, 8, 6, "/p.npz")
    assert args["AR"] == ["--drafter", "none"]
    assert args["lookup"] == ["--drafter", "lookup", "--k", "8"] and "--draft" not in args["lookup"]
    assert args["tree"][-2:] == ["--k", "6"] and args["tree adaptive"][-2:] == ["--budget", "adaptive"]
    assert args["hvd"][-2:] == ["--predictor", "/p.npz"]
    assert all(a[a.index("--draft") + 1] == "d" for m, a in args.items() if m not in ("AR", "lookup"))


def test_cost_ratios_divide_by_the_plain_pass_of_the_same_batch():
    costs = pd.DataFrame(dict(batch=[1, 1, 4, 4], nodes=[0, 2, 0, 2], seconds=[1.0, 1.5, 2.0, 5.0]))
    t = load_sweep.cost_ratios(costs)
    assert t.loc[0].tolist() == [1.0, 1.0] and t.loc[2, 1] == 1.5 and t.loc[2, 4] == 2.5


@pytest.mark.skipif(not (RESULTS / "verify_cost.parquet").exists(), reason="committed results absent")
def test_cost_ratios_of_the_committed_calibration_are_one_at_zero_nodes():
    t = load_sweep.cost_ratios(pd.read_parquet(RESULTS / "verify_cost.parquet"))
    assert np.allclose(t.loc[0], 1.0) and (t > 0).all().all()


def test_answer_check_names_the_methods_that_differ_or_failed():
    req = pd.DataFrame(
        dict(
            method=["AR", "AR", "chain", "chain", "lookup"],
            text=["a", "b", "a", "x", "b"],
            error=[None, None, None, None, "timeout"],
            same_as_ar=[True, True, True, False, False],
        )
    )
    check, text = load_sweep.answer_check(req)
    assert check.loc["chain"].tolist() == [2, 0, 1] and check.loc["lookup", "failed"] == 1
    assert text.startswith("5 requests in all; 1 failed; 3 of 5 answers") and "not all**: chain, lookup" in text
    whole, text = load_sweep.answer_check(req[req.method == "AR"])
    assert text.endswith("equal AR's for the same session and turn.")


def test_the_load_figure_has_one_line_per_method_in_each_panel():
    summary = pd.DataFrame(
        dict(method=["AR", "AR", "chain adaptive"], rate=[0.1, 1.0, 0.1], tpot_p50=[0.01] * 3, tpot_p99=[0.02] * 3)
    ).assign(ttft_p50=0.1, throughput=50.0)
    fig = load_sweep.plot_load(summary)
    assert [len(ax.lines) for ax in fig.axes] == [2, 2, 2, 2]
    assert fig.axes[0].lines[1].get_linestyle() == "--" and fig.axes[3].get_xscale() == "log"
