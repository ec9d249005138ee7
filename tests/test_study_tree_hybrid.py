"""speclib.research.studies.tree_hybrid: notebook 03's derived tables rebuilt from its committed steps, and
its helpers on awkward inputs."""

import io
import json

import numpy as np
import pandas as pd
import pytest

from speclib.core.device import REPO
from speclib.research import bench
from speclib.research.studies import tree_hybrid as th

RES = REPO / "data" / "results" / "03_tree_hybrid"
needs_results = pytest.mark.skipif(not (RES / "pilot_runs.parquet").exists(), reason="no committed results")
META = ["seed", "device", "target", "draft", "threads", "smoke", "git_sha"]


def step(name: str) -> pd.DataFrame:
    return pd.read_parquet(RES / f"{name}.parquet")


def params() -> dict:
    return json.loads((RES / "pilot_runs.step.json").read_text())["notebook_params"]


def committed(name: str, columns) -> pd.DataFrame:
    """The committed derived table, restricted to the columns the rebuild has (its meta columns dropped)."""
    return step(name)[[c for c in columns if c not in META]]


def same(rebuilt: pd.DataFrame, name: str) -> None:
    """`rebuilt`, written and read back as parquet as the notebook saves it, equals the committed table."""
    rebuilt = pd.read_parquet(io.BytesIO(rebuilt.drop(columns=[c for c in META if c in rebuilt.columns]).to_parquet()))
    pd.testing.assert_frame_equal(rebuilt, committed(name, rebuilt.columns))


def pilot_from_steps() -> pd.DataFrame:
    p = params()
    budgets = th.pilot_budgets(p["TREE_DEPTHS"], p["TREE_SIZES"], 4)
    configs = th.pilot_configs(None, p["CHAIN_KS"], p["TREE_DEPTHS"], budgets, p["SPINE_VALUES"], 4)
    return th.pilot_table(step("pilot_runs"), configs, seed=p["SEED"])


@needs_results
def test_pilot_and_budget_rebuild_from_committed_steps():
    pilot = pilot_from_steps()
    same(pilot, "pilot")
    _, best_tree, _ = th.best_per_kind(pilot)
    budget = th.budget_table(pilot, step("verify"), params()["BATCHES"], int(best_tree.depth))
    same(budget, "budget")


@needs_results
def test_decode_tables_rebuild_from_committed_steps():
    p = params()
    saved = step("decode")
    k_chain, decode_batch = int(saved.chain_k.iloc[0]), p["DECODE_BATCH"]
    decode, batched = step("decode_paired"), step("batched")
    summary1 = th.decode_summary(decode, k_chain, seed=p["SEED"])
    choices = {c: int(saved[c].iloc[0]) for c in ("tree_budget", "tree_depth", "batch_budget")}
    summary = th.decode_table(summary1, batched, decode_batch, p["SEED"], **choices, k_chain=k_chain, meta={})
    same(summary, "decode")
    same(th.decode_runs(decode, batched, decode_batch, {}), "decode_runs")
    chain, tree, mat, leaves = th.method_names(k_chain)
    assert set(summary.method) == {"AR", chain, tree, mat, leaves}
    text = "\n".join(th.decode_notes(summary, batched, decode_batch))
    assert f"{summary.set_index(['method', 'batch']).speedup[tree, 1]:.2f}x" in text


@needs_results
def test_selfspec_and_head_tables_rebuild_from_committed_steps():
    seed = params()["SEED"]
    same(th.selfspec_table(step("selfspec_runs"), seed=seed), "selfspec")
    head_summary, acct = th.head_tables(step("head_decode"), seed=seed)
    same(head_summary, "head_summary")
    assert list(acct.index) == [m for m in head_summary.method if m != "AR" and "materialize" not in m]


@needs_results
def test_notes_quote_the_tables():
    layer, verify = step("layer"), step("verify")
    sizes = params()["TREE_SIZES"]
    shapes = {"hybrid-target": (8, 64, 64), th.QWEN_LAYER[0]: th.QWEN_LAYER[1]}
    numbers, reading = th.layer_notes(layer, shapes, sizes)
    o = layer[(layer.layer_shape == "hybrid-target") & (layer.nodes == 64)].iloc[0]
    assert f"**{o.speedup:.1f}x**" in numbers and reading.startswith("**Reading.**")
    numbers, _ = th.verify_notes(verify, layer, 64, params()["BATCHES"])
    v1 = verify[(verify.batch == 1) & (verify.nodes == 64)].set_index("strategy").seconds
    assert f"{v1['closed_form'] * 1e3:.0f} ms" in numbers
    pilot = pilot_from_steps()
    budget = th.budget_table(pilot, verify, params()["BATCHES"], int(th.best_per_kind(pilot)[1].depth))
    choices, _ = th.pilot_notes(pilot, budget, params()["PILOT_PROMPTS"], params()["N_PROMPTS"])
    assert f"**K = {int(th.best_per_kind(pilot)[0].K)}**" in choices


@pytest.mark.parametrize(
    "n, d, want",
    [
        (4, 4, (1, 1, 1, 1)),  # a 4-node tree of depth 4 is the chain
        (2, 4, (1, 1)),  # fewer nodes than levels: the tree stops early
        (16, 4, (4, 4, 4, 4)),  # the full tree
        (64, 3, (4, 4, 4)),  # a budget past the full tree draws the full tree
        (7, 3, (3, 2, 2)),
    ],
)
def test_levels(n, d, want):
    assert th.levels(n, d, 4) == want


def test_pilot_budgets_stop_at_the_full_tree():
    assert th.pilot_budgets([3, 6], [8, 16, 32], 4) == {3: [4, 8, 12], 6: [8, 16, 24]}
    assert th.pilot_budgets([1], [8], 4) == {1: [4]}  # only the full tree: every budget draws it


def test_probe_and_timed_sizes():
    assert th.probe_size([8, 64, 128]) == 64 and th.probe_size([8, 32]) == 32
    assert th.timed_sizes([8, 32], {3: [4, 8, 12]}) == [1, 4, 8, 12, 32]


def test_eligible_keeps_a_kind_without_distinct_rows():
    pilot = pd.DataFrame(
        dict(
            method=["chain K=2", "tree n=2 d=2", "spine a", "spine b"],
            kind=["chain", "tree", "chain + leaves", "chain + leaves"],
            duplicate_of=[None, "chain K=2", "chain K=2", None],
        )
    )
    # the tree duplicates the chain but is its kind's only row; the duplicate spine is dropped
    assert list(th.eligible(pilot).method) == ["chain K=2", "tree n=2 d=2", "spine b"]


def test_pilot_table_marks_twins_and_never_chooses_them():
    runs = []
    for method, drafted, speed in [("AR", 0, 10.0), ("chain K=2", 2, 12.0), ("tree n=2 d=2", 2, 13.0)]:
        for prompt in range(3):
            runs.append(
                dict(
                    prompt=prompt,
                    round=0,
                    method=method,
                    target_calls=1,
                    accepted=1,
                    drafted=drafted,
                    draft_s=0.1,
                    verify_s=0.2,
                    new_tokens=10,
                    seconds=10 / (speed + prompt),
                    tokens_per_s=speed + prompt,
                    tokens_per_call=2.0,
                    reached=drafted,
                    draft_token_s=0.05,
                    step_verify_s=0.2,
                    identical=True,
                    same_as_reference=True,
                )
            )
    runs = pd.DataFrame(runs)
    configs = th.pilot_configs(None, [2], [2], {2: [2, 8]}, [], 4)[:2]  # the chain of 2, the tree (1, 1)
    assert configs[1]["shape"] == (1, 1)
    pilot = th.pilot_table(runs, configs, seed=0)
    assert pilot.duplicate_of.tolist()[1] == "chain K=2" and pd.isna(pilot.duplicate_of[0])
    # the tree, the twin, is faster but its kind has no distinct row: it is chosen among its kind only
    assert pilot.chosen.tolist() == [True, True]
    assert np.allclose(pilot.tokens_per_step, 2.0)


def test_batch_budget_falls_back_to_the_largest_batch():
    budget = pd.DataFrame(dict(batch=[1, 1, 2, 2], budget_per_request=[8, 16, 4, 8], chosen=[False, True, True, False]))
    assert th.batch_budget(budget, 2) == 4 and th.batch_budget(budget, 8) == 4 and th.batch_budget(budget, 1) == 16


def test_batched_summary_single_group_has_no_interval():
    batched = pd.DataFrame(
        dict(
            group=[0, 0],
            method=["AR", "tree"],
            seconds=[2.0, 1.0],
            new_tokens=[10, 10],
            tokens_per_call=[1.0, 2.5],
            identical=[2, 2],
            of=[2, 2],
        )
    )
    rows = th._batched_summary(batched, 2, seed=0).set_index("method")
    assert rows.speedup["tree"] == pytest.approx(2.0) and np.isnan(rows.lo["tree"]) and np.isnan(rows.hi["tree"])
    assert rows.total_ratio["tree"] == pytest.approx(2.0) and (rows.batch == 2).all()


def test_methods_are_records_not_closures():
    methods = th.decode_methods("target", "draft", 3, 16, 6, 4, 0.15, 32, 4)
    chain, tree, mat, leaves = th.method_names(3)
    assert list(methods) == ["AR", chain, tree, mat, leaves]
    assert methods["AR"] == bench.Method("target", 32, sampling=th.GREEDY)
    assert methods[chain].drafter.args == ("draft", 3) and methods[leaves].drafter.args == ("draft", 4, 0.15)
    assert methods[mat].strategy == "materialize" and methods[mat].method == methods[tree]
    heads = th.head_methods("t", "tf", "tm", "head", [2], [(3, 8)], 32, 4, materialize=True)
    assert list(heads) == ["AR", "head chain K=2", "head tree d=3 n=8", "head tree d=3 n=8, materialize"]
    assert heads["head tree d=3 n=8, materialize"].target == "tm"
    assert heads["head tree d=3 n=8"].drafter.keywords == dict(k=3, tree=8, top=4)


def test_view_method_decodes_on_a_fresh_view(monkeypatch):
    calls = []

    class Target:
        def view(self, strategy=None):
            return ("view", strategy)

    monkeypatch.setattr(bench, "generate", lambda target, ids, n, **kw: calls.append((target, ids, n, kw)))
    th.ViewMethod(bench.Method(Target(), 5, sampling=th.GREEDY), "materialize")([1, 2], 3)
    target, ids, n, kw = calls[0]
    assert target == ("view", "materialize") and ids == [1, 2] and n == 5 and kw["seed"] == 3
