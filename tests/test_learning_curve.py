"""The learning curve's pieces: snapshots taken once each, snapshot names, held-out prompts, the curve."""

from pathlib import Path

import speclib
from speclib.research import draft_corpus, learning_curve, training


def test_snapshots_are_taken_once_each_and_resume():
    st = {"tokens": 0}
    assert training.snapshots_due(st, (100, 300)) == []
    st["tokens"] = 350  # one step can pass two thresholds: both are taken
    assert training.snapshots_due(st, (300, 100)) == [100, 300]
    assert training.snapshots_due(st, (100, 300)) == []
    st["tokens"] = 1000
    assert training.snapshots_due(dict(st), (100, 300, 1000)) == [1000]  # a resumed record keeps what it took


def test_tokens_seen_reads_snapshot_folders_only():
    assert learning_curve.tokens_seen(Path("build/train/x/tokens-300000")) == 300000
    assert learning_curve.tokens_seen(Path("build/no-such-export")) == -1


def test_heldout_prompts_are_held_out_and_cover_every_task():
    rows = learning_curve.heldout_prompts(per_task=2, seed=1)
    assert {p.task for p in rows} == set(draft_corpus.TASKS)
    assert all(draft_corpus.split(p) == "heldout" for p in rows)
    assert len({p.id for p in rows}) == len(rows) == 2 * len(draft_corpus.TASKS)


def test_snapshot_runs_are_lossless_paired_and_summarized(pair):
    """Each snapshot runs paired with AR; the summary's tokens per pass, speedup and identity come from those
    runs, and its per-prompt values are what `fit` resamples."""
    from speclib.research import bench

    target, draft = pair
    prompts = [[1, 5, 9, 2], [3, 3, 7], [4, 2]]
    methods = {
        "AR": learning_curve.Recording(bench.Method(target, 12)),
        "x/tokens-100": learning_curve.Recording(bench.Method(target, 12, speclib.ModelDrafter(draft, 3))),
    }
    runs = bench.paired_runs(prompts, methods)
    table = learning_curve.summarize(runs, {"x/tokens-100": 100})
    row = table.iloc[0]
    assert row.identical and row.prompts == 3 and row.tokens_seen == 100
    assert 1.0 <= row.lo <= row.tokens_per_pass <= row.hi <= 4.0
    assert abs(row.tokens_per_pass - sum(row.tokens_per_pass_per_prompt) / 3) < 1e-9
    assert len(row.speedup_per_prompt) == 3 and row.speedup_lo <= row.speedup <= row.speedup_hi


def test_snapshot_methods_refuses_an_unknown_kind(pair):
    import pytest

    with pytest.raises(ValueError, match="kind must be"):
        learning_curve.snapshot_methods(pair[0], "tree", [])


def test_fit_recovers_a_log_linear_curve_and_extrapolates():
    import numpy as np
    import pandas as pd

    tokens = [1e5, 3e5, 1e6, 3e6]
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.05, 30)  # per prompt, shared across snapshots: the rows are paired
    rows = [dict(tokens_seen=t, tokens_per_pass_per_prompt=list(1.0 + 0.4 * (np.log10(t) - 5) + noise)) for t in tokens]
    table = pd.DataFrame(rows + [dict(tokens_seen=-1, tokens_per_pass_per_prompt=[9.0] * 30)])  # unknown: left out
    f = learning_curve.fit(table, goals=(3.0,))
    assert f["points"] == 4 and abs(f["b"] - 0.4) < 1e-6 and f["b_lo"] <= 0.4 <= f["b_hi"]
    assert abs(np.log10(f["tokens_for_3"]) - 10.0) < 0.05  # 1 + 0.4 (log10 N - 5) = 3 at N = 1e10
    flat = pd.DataFrame([dict(tokens_seen=t, tokens_per_pass_per_prompt=[1.2] * 5) for t in tokens])
    assert learning_curve.fit(flat, goals=(3.0,))["tokens_for_3"] == float("inf")  # no slope: never


def test_tokens_seen_of_a_final_export_comes_from_its_record(tmp_path):
    (tmp_path / "training.json").write_text('{"tokens_seen": 1228800}')
    assert learning_curve.tokens_seen(tmp_path) == 1228800
