"""speclib.research.studies.baseline (notebook 01): the derived tables rebuilt from the committed steps
equal the committed ones, and the helpers behave on awkward inputs."""

import io

import numpy as np
import pandas as pd
import pytest
import torch

from speclib.core.acceptance import output_distribution
from speclib.core.device import REPO
from speclib.research.studies import baseline

RESULTS = REPO / "data" / "results" / "01_baseline"
META = ["seed", "device", "threads", "target", "draft", "smoke", "git_sha"]
SEED = 0  # the notebook's shipped SEED


def committed(name: str) -> pd.DataFrame:
    return pd.read_parquet(RESULTS / f"{name}.parquet")


def assert_same_table(derived: pd.DataFrame, name: str) -> None:
    """`derived`, written and read back as parquet, equals the committed table, run metadata aside."""
    derived = pd.read_parquet(io.BytesIO(derived.drop(columns=META, errors="ignore").to_parquet()))
    pd.testing.assert_frame_equal(derived, committed(name).drop(columns=META, errors="ignore"))


@pytest.fixture(scope="module")
def speed():
    prof = baseline.bare_profile(committed("models"), committed("cost"))
    return baseline.speed_tables(committed("runs"), prof, SEED)


@pytest.fixture(scope="module")
def hspeed():
    return baseline.head_tables(committed("head_runs"), SEED)


def report_of(speed):
    return speed[speed.split == "report"]


def greedy_k(speed) -> int:
    report = report_of(speed)
    return int(report[report.chosen].set_index("mode").loc["greedy"].K)


# ---- the committed derived tables, rebuilt from the committed steps ----------------------------------


def test_speedup_table_rebuilt(speed):
    assert_same_table(speed, "speedup")
    assert speed.groupby(["mode", "split"]).chosen.sum().eq(1).all()


def test_positions_and_limits_rebuilt(speed):
    runs = committed("runs")
    assert_same_table(baseline.positions(runs), "positions")
    assert_same_table(baseline.limits_table(runs, report_of(speed)), "limits")


def test_identity_and_assisted_ratio_rebuilt():
    runs, hf = committed("runs"), committed("assisted")
    plain_ok = committed("transformers_generate").identical
    assert_same_table(baseline.identity_table(runs, plain_ok, hf), "identity")
    ks = sorted(set(runs.K) - {0})
    assert_same_table(baseline.assisted_ratio(hf, ks, SEED), "assisted_ratio")


def test_head_tables_rebuilt(hspeed):
    assert_same_table(hspeed, "head_speedup")
    hrep = hspeed[(hspeed.split == "report") & (hspeed["mode"] == "greedy")].set_index("method")
    assert_same_table(baseline.head_ceiling(hrep), "head_ceiling")


def test_overlap_tables_rebuilt(speed):
    ov = {n: committed(n) for n in ["overlap_runs", "overlap_steps", "overlap_busy", "overlap_timeline"]}
    ks = sorted(set(speed.K))
    o = baseline.overlap_analysis(ov, report_of(speed), ks, greedy_k(speed), SEED)
    assert_same_table(o.table.assign(reference=o.fast_ar, k=o.k, wait_for=o.wait_for), "overlap_speedup")
    assert_same_table(o.summary.assign(k=o.k, wait_for=o.wait_for), "overlap_model")


def test_generated_text_reads_the_tables(speed, hspeed):
    """Every prose helper runs on the committed tables and quotes their numbers."""
    report = report_of(speed)
    best = report[report.chosen].set_index("mode")
    prof = baseline.bare_profile(committed("models"), committed("cost"))
    text = baseline.speed_text(report, best, prof)
    assert f"**{best.loc['greedy'].speedup:.2f}x**" in text
    k_max = int(speed.K.max())
    assert "Per position" in baseline.acceptance_text(report, baseline.positions(committed("runs")), k_max)
    chi = baseline.measured_chi2(committed("chi2"))
    assert len(chi) == 2 and f"χ² = {chi.chi2[0]:.1f}" in baseline.chi2_text(chi, committed("calibration"))
    hruns = committed("head_runs")
    assert str(hruns.chosen.iloc[0]) in baseline.head_text(hruns, hspeed, committed("head_chi2"), greedy_k(speed))
    assert baseline.exact_math_text(committed("exact_math"), committed("exact_tv")).startswith("Over ")


# ---- helpers on awkward inputs -------------------------------------------------------------------


def test_k_of_reads_draft_lengths_and_zero_without_one():
    names = pd.Series(["AR", "SD K=1", "SD K=12", "assisted K=3", "head tree d=3 n=8"])
    assert baseline.k_of(names).tolist() == [0, 1, 12, 3, 0]


@pytest.mark.parametrize("family, v, zp, zq", baseline.PAIR_FAMILIES)
def test_random_pair_is_a_distribution_with_the_asked_zeros(family, v, zp, zq):
    p, q = baseline.random_pair(v, torch.Generator().manual_seed(1), zp, zq)
    assert p.dtype == torch.float64 and p.shape == q.shape == (v,)
    assert abs(float(p.sum()) - 1) < 1e-12 and abs(float(q.sum()) - 1) < 1e-12
    assert int((p == 0).sum()) == zp and int((q == 0).sum()) == zq


def test_raw_q_bug_is_the_lossless_rule_when_both_qs_agree_and_biased_otherwise():
    gen = torch.Generator().manual_seed(3)
    p, q = baseline.random_pair(16, gen, 0, 4)
    assert torch.allclose(baseline.raw_q_bug(p, q, q), output_distribution(p, q), atol=1e-15)
    # q drawn after top-k renormalisation, the ratio with the raw q: still a distribution, no longer p
    q_raw = q.clone()
    q_drawn = torch.where(q >= q.topk(4).values[-1], q, torch.zeros_like(q))
    q_drawn = q_drawn / q_drawn.sum()
    out = baseline.raw_q_bug(p, q_drawn, q_raw)
    assert abs(float(out.sum()) - 1) < 1e-12 and (out >= 0).all()
    assert float((out - p).abs().sum()) > 1e-3


def row(k, speedup, lo, hi):
    return pd.Series(dict(K=k, speedup=speedup, lo=lo, hi=hi))


def test_versus_top_words():
    assert baseline.versus_top(row(3, 2.0, 1.9, 2.1), row(3, 2.0, 1.9, 2.1)) == "at the chosen K = 3"
    overlap = baseline.versus_top(row(3, 2.0, 1.9, 2.1), row(4, 2.05, 2.0, 2.2))
    assert overlap.startswith("at K = 4 (2.05x") and "cannot tell" in overlap
    # touching intervals count as overlapping
    assert "cannot tell" in baseline.versus_top(row(3, 2.0, 1.9, 2.1), row(4, 2.3, 2.1, 2.4))
    assert "apart" in baseline.versus_top(row(3, 2.0, 1.9, 2.1), row(4, 2.5, 2.4, 2.6))
    assert "without intervals" in baseline.versus_top(row(3, 2.0, np.nan, np.nan), row(4, 2.5, 2.4, 2.6))


def test_interval_vs_one():
    assert "holds 1" in baseline.interval_vs_one(0.9, 1.1)
    assert "holds 1" in baseline.interval_vs_one(1.0, 1.2)  # an endpoint at parity holds it
    assert "faster" in baseline.interval_vs_one(1.01, 1.2)
    assert "slower" in baseline.interval_vs_one(0.8, 0.99)


def test_false_positive_rates_and_measured_chi2():
    calib = pd.DataFrame(
        dict(setting=["b", "b", "a", "a"], p_asymptotic=[0.01, 0.5, 0.04, 0.05], p_permutation=[0.2, 0.3, 0.9, 0.01])
    )
    fpr = baseline.false_positive_rates(calib)
    assert list(fpr.index) == ["b", "a"]  # in the order the settings were run
    assert fpr.loc["b"].tolist() == [0.5, 0.0] and fpr.loc["a"].tolist() == [0.5, 0.5]  # p = 0.05 is not < 0.05
    chi = pd.DataFrame(dict(method=["reference", "speclib", "speclib"], chi2=[1.0, 2.0, 3.0]))
    assert baseline.measured_chi2(chi).chi2.tolist() == [2.0, 3.0]
    assert baseline.measured_chi2(chi).index.tolist() == [0, 1]


def test_sequential_lane_tiles_the_steps_from_zero():
    steps = [dict(draft_s=0.1, verify_s=0.3), dict(draft_s=0.2, verify_s=0.4)]
    lane = pd.DataFrame(baseline.sequential_lane(5, steps))
    assert lane.kind.tolist() == ["draft", "verify", "draft", "verify"]
    assert lane.start.iloc[0] == 0 and np.allclose(lane.start.iloc[1:], lane.end.iloc[:-1])
    assert np.allclose(lane.end - lane.start, [0.1, 0.3, 0.2, 0.4]) and (lane.prompt == 5).all()
    assert baseline.sequential_lane(0, []) == []


def test_overlap_lanes_clip_the_draft_to_the_run():
    # the draft's prefill starts before the decoder's first wait and its last hypothesis runs past the end
    tl = dict(draft=[(0.0, 1.5), (2.0, 9.0)], wait=[(1.0, 2.0), (3.0, 3.5)])
    rows, busy = baseline.overlap_lanes(0, tl, last_verify_s=0.5)
    lanes = pd.DataFrame(rows)
    verify = lanes[lanes.kind == "verify"]
    assert verify[["start", "end"]].values.tolist() == [[1.0, 2.0], [2.5, 3.0]]  # from t0 = the first wait
    assert busy["seconds"] == 3.0  # from the first wait's start to the last verify's end
    assert busy["draft_busy"] == pytest.approx(0.5 + 2.0)  # [1, 1.5] and [2, 4], clipped to the run
    assert busy["target_wait"] == 1.5


def test_at_threads_runs_at_n_and_restores():
    before = torch.get_num_threads()
    seen = []
    run = baseline.AtThreads(1, lambda ids, i: seen.append((torch.get_num_threads(), ids, i)) or "out")
    assert run([1, 2], 3) == "out"
    assert seen == [(1, [1, 2], 3)] and torch.get_num_threads() == before


def test_cost_text_quotes_every_v():
    models = pd.DataFrame(
        dict(parameters=[5e6, 3e5], heldout_loss=[1.0, np.nan], latency_ms=[2.0, 0.2])  # a draft with no loss
    )
    cost = pd.DataFrame(dict(K=[1, 2], v=[1.25, 1.5], c=[0.1, 0.1]))
    prof = baseline.bare_profile(models, cost)
    assert prof == dict(target_1=0.002, draft_1=0.0002, c=0.1, v={1: 1.25, 2: 1.5})
    text = baseline.cost_text(models, prof, [1, 2])
    assert "v(K) = 1.25, 1.50 times one token for K = 1..2" in text and "nan" in text
