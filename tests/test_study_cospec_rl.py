"""Notebook 04's derived tables rebuilt from its committed step tables, and its helpers on awkward inputs."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from speclib.acceptors import cospec
from speclib.acceptors.cospec import FEATURES
from speclib.research.studies import cospec_rl

RES = Path(__file__).resolve().parents[1] / "data" / "results" / "04_cospec_rl"
META = ["seed", "device", "target", "draft", "k", "smoke"]
needs_results = pytest.mark.skipif(not (RES / "labels.parquet").is_file(), reason="no committed results")


def committed(table: str) -> pd.DataFrame:
    return pd.read_parquet(RES / f"{table}.parquet").drop(columns="git_sha")


def meta_of(df: pd.DataFrame) -> dict:
    return {k: df[k].iloc[0] for k in META}


@needs_results
def test_disagreements_rebuilt_from_the_labels():
    labels = cospec_rl.labels_by_split(pd.read_parquet(RES / "labels.parquet"))
    saved = committed("disagreements")
    share = cospec_rl.disagreement_shares(labels).assign(**meta_of(saved))
    pd.testing.assert_frame_equal(share, saved, check_dtype=False)


@needs_results
def test_importance_rebuilt_from_the_policy_and_test_labels():
    labels = cospec_rl.labels_by_split(pd.read_parquet(RES / "labels.parquet"))
    policy = cospec.policies_from_table(pd.read_parquet(RES / "policy_rl.parquet"))["CoSpec (RL)"]
    saved = committed("importance")
    with torch.no_grad():
        _, importance = cospec_rl.permutation_importance(policy, labels["test"], seed=int(saved.seed[0]))
    assert list(importance.index) == list(saved.feature)
    assert np.allclose(importance.values, saved.importance.values, atol=1e-12)


@needs_results
def test_speed_columns_and_verdict_rebuilt_from_the_timed_runs():
    methods = committed("methods").set_index("method")
    speed_cols = ["speedup", "speed_lo", "speed_hi", "total_ratio", "same_as_batched"]
    accuracy_part = methods.drop(columns=speed_cols + ["n_timed", *META])
    n_timed, seed = int(methods.n_timed.iloc[0]), int(methods.seed.iloc[0])
    table = cospec_rl.with_speed(
        accuracy_part, pd.read_parquet(RES / "timed_runs.parquet"), committed("same_as_batched"), n_timed, seed
    )
    pd.testing.assert_frame_equal(table[speed_cols], methods[speed_cols])
    saved = committed("verdict")
    best = cospec_rl.rl_best(committed("rl_best"))
    verdict = cospec_rl.verdict_table(table, int(saved.rl_iterations[0]), best["iteration"], meta_of(saved))
    pd.testing.assert_frame_equal(verdict, saved, check_dtype=False)


def test_rows_table_round_trip():
    rows = [
        dict(tokens=[5, 6, 7], target_calls=2, kept=torch.tensor([True, False]), at=[(0, 9), (2, 4)]),
        dict(tokens=[], target_calls=0, kept=torch.zeros(0, dtype=torch.bool), at=[]),
    ]
    table = cospec_rl.rows_table({"m": rows, "other": rows[:1]})
    back = cospec_rl.rows_of(table.iloc[::-1], "m")  # rows_of orders by problem
    assert [r["tokens"] for r in back] == [[5, 6, 7], []]
    assert back[0]["at"] == [(0, 9), (2, 4)] and back[0]["kept"].tolist() == [True, False]
    assert back[1]["kept"].dtype == bool and len(back[1]["kept"]) == 0
    assert cospec_rl.decode_stats(back) == dict(calls_per_token=2 / 3, keep_rate=0.5)


def test_decode_stats_without_mismatches_has_keep_rate_zero():
    rows = [dict(tokens=[1, 2], target_calls=1, kept=np.zeros(0, dtype=bool))]
    assert cospec_rl.decode_stats(rows) == dict(calls_per_token=0.5, keep_rate=0.0)


def _labels(rows):
    return pd.DataFrame(rows, columns=["problem", "pos", "target_correct", "draft_correct"])


def test_oracle_accuracy_swaps_only_draft_right_target_wrong_problems():
    lab = _labels([(0, 3, False, True), (1, 2, True, False), (2, 5, False, False), (0, 7, False, True)])
    acc = np.array([0.0, 1.0, 0.0, 0.0])
    assert cospec_rl.oracle_accuracy(acc, lab).tolist() == [1.0, 1.0, 0.0, 0.0]
    assert acc.tolist() == [0.0, 1.0, 0.0, 0.0]  # the target's accuracy is left as it was


def test_labels_by_split_with_no_test_mismatches():
    table = pd.DataFrame(
        dict(problem=[0], pos=[1], features=[[0.5] * len(FEATURES)], target_correct=[True], draft_correct=[False])
    ).assign(split="train")
    labels = cospec_rl.labels_by_split(table)
    assert len(labels["test"]) == 0
    assert labels["train"].features[0].dtype == torch.float32
    share = cospec_rl.disagreement_shares(labels)
    assert share.set_index("split").target_right_draft_wrong["train"] == 1.0


def test_pareto_front_keeps_ties_and_drops_dominated_methods():
    rows = pd.DataFrame(
        dict(speedup=[1.0, 2.0, 2.0, 1.5, 3.0], accuracy=[0.9, 0.8, 0.8, 0.7, 0.5]),
        index=["slow", "tie a", "tie b", "dominated", "fast"],
    )
    assert cospec_rl.pareto_front(rows) == ["slow", "tie a", "tie b", "fast"]


def test_best_fuzzy_trades_accuracy_against_calls():
    val = {
        "fuzzy JSD<0.1": dict(accuracy=0.80, calls_per_token=0.5),
        "fuzzy JSD<0.2": dict(accuracy=0.81, calls_per_token=0.7),  # +0.01 accuracy costs 0.02
    }
    assert cospec_rl.best_fuzzy(val, [0.1, 0.2]) == 0.1


def test_accuracy_table_oracle_row_and_paired_difference():
    acc = {
        "target AR": np.array([1.0, 0.0, 1.0, 0.0]),
        "draft AR": np.array([0.0, 0.0, 1.0, 0.0]),
        "oracle branch choice": np.array([1.0, 1.0, 1.0, 0.0]),
    }
    rows = {m: [dict(tokens=[1, 2], target_calls=1, kept=np.zeros(0, dtype=bool))] for m in ("target AR", "draft AR")}
    table = cospec_rl.accuracy_table(acc, rows, seed=0)
    assert table.diff_vs_target["target AR"] == 0 and table.diff_lo["target AR"] == 0
    assert table.calls_per_token["draft AR"] == 0.0 and np.isnan(table.calls_per_token["oracle branch choice"])
    assert table.diff_vs_target["oracle branch choice"] == pytest.approx(0.25)
    assert (table.n == 4).all()


def test_kept_mismatches_on_and_off_the_target_path():
    target_rows = [dict(tokens=[1, 2, 3, 4])]
    rows = [dict(tokens=[1, 9, 3, 5], kept=np.array([True, True]), at=[(1, 9), (3, 5)])]
    lab = _labels([(0, 1, False, True), (0, 3, True, False)])
    kept = cospec_rl.kept_mismatches(rows, target_rows, lab)
    # the mismatch at 1 is on the target's path; at 3 the prefix already holds the kept draft token
    assert kept.on_target_path.tolist() == [True, False]
    assert kept.draft_branch_correct.iloc[0] and np.isnan(kept.draft_branch_correct.iloc[1])
    summary = cospec_rl.kept_summary(kept)
    assert summary["sent_to_draft"] == 2 and summary["sent_on_target_path"] == 1
    assert summary["sent_draft_right_target_wrong"] == 1.0 and summary["sent_target_right_draft_wrong"] == 0.0


def test_kept_summary_and_reading_without_mismatches():
    summary = cospec_rl.kept_summary(cospec_rl.kept_mismatches([], [], _labels([])))
    assert summary["mismatches"] == 0 and np.isnan(summary["share_sent"])
    share = pd.DataFrame([dict(split="test", draft_right_target_wrong=0.1, target_right_draft_wrong=0.2)])
    assert "nothing to compare" in cospec_rl.kept_reading(summary, share)


def test_permutation_importance_without_discordant_mismatches_is_nan():
    policy = cospec.Policy(hidden=0)
    lab = pd.DataFrame(
        dict(features=[torch.zeros(len(FEATURES))] * 2, target_correct=[True, False], draft_correct=[True, False])
    )
    with torch.no_grad():
        base, importance = cospec_rl.permutation_importance(policy, lab, seed=0)
    assert np.isnan(base) and importance.isna().all() and list(sorted(importance.index)) == sorted(FEATURES)


def test_policy_map_corners_read_rows_as_draft_confidence():
    pm = cospec_rl.PolicyMap(np.zeros((2, 2)), np.zeros((2, 2)), np.array([[0.1, 0.2], [0.3, 0.4]]))
    assert pm.corner(0, -1) == 0.3 and pm.corner(-1, 0) == 0.2
