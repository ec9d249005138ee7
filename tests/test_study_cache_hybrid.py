"""speclib.research.studies.cache_hybrid: notebook 02's derived tables rebuilt from its committed step tables
equal the committed derived tables, and its helpers on awkward inputs."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from speclib.drafters.hybrid import Costs
from speclib.research.studies import cache_hybrid as ch

RES = Path(__file__).resolve().parents[1] / "data" / "results" / "02_cache_hybrid"
META = ["seed", "device", "target", "draft", "threads", "smoke", "git_sha"]


def read(name: str) -> pd.DataFrame:
    if not (RES / f"{name}.parquet").exists():
        pytest.skip(f"no committed {name}.parquet")
    return pd.read_parquet(RES / f"{name}.parquet")


def same(built: pd.DataFrame, name: str):
    saved = read(name).drop(columns=META, errors="ignore")
    built = built.drop(columns=META, errors="ignore").reset_index(drop=True)
    pd.testing.assert_frame_equal(built[saved.columns], saved, check_dtype=False, check_categorical=False)


def test_speedup_and_pooled_tables_match_the_committed_ones():
    runs = read("runs")
    workloads = list(dict.fromkeys(runs.workload))
    speed = ch.speed_table(runs, workloads, seed=0)
    same(speed, "speedup")
    agentic = [w for w in workloads if w.startswith("agentic")]
    agentic_runs = ch.pooled_prompts(runs, agentic)
    pooled = ch.pooled_table(agentic_runs, seed=0)
    same(pooled.reset_index().assign(n_prompts=agentic_runs.prompt.nunique()), "agentic_pooled")
    same(ch.drafting_table(runs, read("drafting_alone")), "drafting_cost")


def test_training_free_head_and_every_source_tables_match_the_committed_ones():
    tf_runs = read("tf_runs")
    workloads = list(dict.fromkeys(tf_runs.workload))
    agentic = [w for w in workloads if w.startswith("agentic")]
    same(ch.training_free_table(tf_runs, workloads, agentic, seed=0), "training_free")
    hr = read("head_runs")
    same(ch.head_table(ch.head_sets(hr, agentic), seed=0), "head_policies")
    es_speed, over, best_single = ch.every_source_tables(read("es_runs"), seed=0)
    same(es_speed.reset_index(), "every_source")
    same(over.reset_index(), "every_source_over")
    assert best_single in ch.EVERY_SINGLE


def test_payoff_map_matches_the_committed_one():
    logs = read("cache_logs")  # the evaluation logs with the predictions of the run that saved them
    same(ch.PayoffMap.of(logs.drop(columns=META, errors="ignore")).table(), "payoff_map")


def test_span_names_integer_intervals():
    assert ch.span(pd.Interval(0, 1)) == "1"
    assert ch.span(pd.Interval(2, 4)) == "3–4"
    assert ch.span(pd.Interval(-1, 16)) == "0–16"  # the first position bin starts below zero


def test_calibration_with_few_distinct_predictions():
    logs = pd.DataFrame(dict(predicted=[0.5] * 6 + [2.0] * 4, accepted=[0, 1, 0, 1, 0, 1, 2, 2, 3, 1]))
    cal = ch.calibration(logs)  # the deciles collapse to two groups
    assert cal.n.sum() == len(logs) and len(cal) == 2
    assert cal.pred.tolist() == pytest.approx([0.5, 2.0])


def test_gain_follows_reports_one_workload_and_overlap():
    ratio = pd.DataFrame(dict(speedup=[1.2, 1.1], lo=[1.0, 0.9], hi=[1.4, 1.3]), index=["a", "b"])
    assert ch.gain_follows(ratio.iloc[:1], pd.Series({"a": 0.5})).startswith("One workload")
    assert "overlap" in ch.gain_follows(ratio, pd.Series({"a": 0.6, "b": 0.4}))
    apart = pd.DataFrame(dict(speedup=[1.1, 1.6], lo=[1.0, 1.5], hi=[1.2, 1.7]), index=["a", "b"])
    assert "larger where the head accepts less" in ch.gain_follows(apart, pd.Series({"a": 0.6, "b": 0.4}))


def test_twice_table_flags_intervals_apart():
    hvd_w = pd.DataFrame(dict(speedup=[1.5], lo=[1.4], hi=[1.6]), index=["agentic_edit"])
    head = pd.DataFrame(
        dict(
            workload=["agentic_edit", "agentic pooled"],
            method="HVD (separate draft)",
            speedup=[2.0, 1.5],
            lo=[1.9, 1.2],
            hi=[2.1, 1.8],
        )
    )
    twice = ch.twice_table(hvd_w, pd.Series(dict(speedup=1.5, lo=1.3, hi=1.7)), head, ["agentic_edit"])
    assert twice.overlap.tolist() == [False, True]
    assert "apart on agentic_edit" in ch.twice_prose(twice)


def test_use_fit_falls_back_to_the_bare_forward():
    task = ch.Task(None, None, "t", {}, [], k=4, max_spec=3, max_new_tokens=8, latency_repeats=1, seed=0, meta={})
    task.lat = [1e-3, 1.1e-3, 1.2e-3, 1.3e-3, 2e-4]
    steps = pd.DataFrame([dict(drafted=0, accepted=0, draft_s=0.0, verify_s=1e-3, drafter="model", git_sha="x")] * 3)
    reason = task.use_fit(steps)
    assert reason is not None and isinstance(task.costs, Costs)
    assert task.fit_cache_steps == [] and len(task.fit_model_steps) == 3
    assert np.isfinite(task.costs.verify(2))
