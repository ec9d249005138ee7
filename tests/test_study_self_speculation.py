"""speclib.research.studies.self_speculation: notebook 06's derived tables rebuilt from its committed step
tables equal the committed derived tables, and its helpers on awkward inputs. No model is loaded."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from speclib.research.studies import self_speculation as ss

RES = Path(__file__).resolve().parents[1] / "data" / "results" / "06_self_speculation"
DRAFT_NAME = "code-draft (separate draft)"
SEED = 0
META = ["seed", "device", "target", "draft", "threads", "smoke", "git_sha"]

needs_results = pytest.mark.skipif(not (RES / "cost.parquet").is_file(), reason="no committed results")


def read(name: str) -> pd.DataFrame:
    return pd.read_parquet(RES / f"{name}.parquet")


def same(rebuilt: pd.DataFrame, name: str, drop=()):
    committed = read(name).drop(columns=[*META, *drop], errors="ignore")
    rebuilt = rebuilt.drop(columns=[*META, *drop], errors="ignore").reset_index(drop=True)
    pd.testing.assert_frame_equal(rebuilt, committed.reset_index(drop=True), check_dtype=False)


def committed_subsets() -> dict:
    """The catalogue as the notebook had it after section 2a: the named kinds in the cost table's order,
    then the search's best."""
    one = read("cost").query("n == 1")
    named = one[~one.subset.isin(["full model", DRAFT_NAME])].drop_duplicates("subset")
    subsets = {r.subset: ss.parse_layers(r.layers) for r in named.itertuples()}
    aliases = {n: [] for n in subsets}
    _, subsets, _ = ss.with_search_best(read("search"), subsets, aliases)
    return subsets


@needs_results
def test_sections_2_and_3_rebuild_from_the_committed_runs():
    subsets = committed_subsets()
    pilot = ss.pilot_table(read("pilot_runs"), SEED)
    same(pilot, "pilot", drop=["split"])
    report = ss.report_table(read("runs"), subsets, SEED)
    same(report, "subsets", drop=["split"])
    same(ss.speedup_table(read("exit_runs"), SEED), "exit")
    chosen = ss.choose_k(pilot)
    assert set(report.method) == {ss.label(d, k) for d, k in chosen.items()}


@needs_results
def test_sections_4_and_5_rebuild_from_the_committed_runs():
    subsets = committed_subsets()
    pilot = ss.pilot_table(read("pilot_runs"), SEED)
    chosen = ss.choose_k(pilot)
    best = ss.best_self_draft(pilot, DRAFT_NAME).drafter
    k_exit = int(read("exit_report").k_exit.iloc[0])
    speeds = ss.pilot_speeds(pilot, ss.speedup_table(read("exit_pilot_runs"), SEED), best, chosen, k_exit)
    ctx_self = max(speeds, key=speeds.get)
    ctx_tab, ctx_pair = ss.context_tables(
        read("context_runs"), ctx_self, ss.label(DRAFT_NAME, chosen[DRAFT_NAME]), SEED
    )
    same(ctx_tab, "context")
    same(ctx_pair, "context_vs_separate")
    need = ss.need_table(ctx_tab, DRAFT_NAME)
    same(need, "context_need")
    assert "1.3x over AR would need" in ss.context_text(ctx_tab, ctx_pair, need, ctx_self, best, DRAFT_NAME)
    report = ss.report_table(read("runs"), subsets, SEED)
    t = ss.perplexity_tables(read("perplexity"), subsets, report, ss.speedup_table(read("exit_runs"), SEED), DRAFT_NAME)
    same(t["points"], "perplexity_points")
    same(t["decoding"], "perplexity_decoding")
    same(t["correlation"].assign(full_loss=t["full_loss"]), "perplexity_correlation")


@needs_results
def test_section_6_rebuilds_from_the_committed_runs():
    rows, fam = read("family_run_rows"), read("families")
    runs_tab = ss.family_runs_table(rows, SEED)
    same(runs_tab, "family_runs")
    pairs = ss.family_pairs(rows, read("family_windows"), list(fam.model), ss.family_k(runs_tab), SEED)
    same(pairs, "family_pairs")
    text = ss.family_text(fam, rows, runs_tab, pairs, fam.model.iloc[0], sorted(runs_tab.k.unique()), SEED)
    assert all(f"`{m}`" in text for m in fam.model)


def test_split_label_keeps_a_drafter_name_with_bars():
    df = pd.DataFrame(dict(method=["a | b | k=3", "search + exit | k=1"]))
    out = ss.split_label(df)
    assert list(out.drafter) == ["a | b", "search + exit"] and list(out.k) == [3, 1]
    assert ss.split_label(pd.DataFrame(dict(method=[ss.label("x", 2)]))).k.iloc[0] == 2


def test_alpha_needed_is_nan_when_even_a_perfect_draft_cannot_reach_it():
    assert np.isnan(ss.alpha_needed(2, c=1.0, v=1.5))
    a = ss.alpha_needed(2, c=0.05, v=1.0)
    assert 0 < a < 1 and ss.alpha_needed(2, c=0.05, v=1.0, speedup=1.3) > a


def test_sign_and_parse_layers():
    assert [ss.sign(0.1, 0.2), ss.sign(-0.2, -0.1), ss.sign(-0.1, 0.1), ss.sign(0.0, 0.1)] == [1, -1, 0, 0]
    assert ss.parse_layers("[0, 1, 5]") == [0, 1, 5] and ss.parse_layers("[3]") == [3]


def test_with_search_best_aliases_a_named_subset_and_copies():
    hist = pd.DataFrame(dict(source=["search", "search"], layers=["[0, 1, 2]", "[0, 1]"], predicted=[0.9, 1.1]))
    subsets, aliases = {"first_n n=2": [0, 1]}, {"first_n n=2": []}
    row, s2, a2 = ss.with_search_best(hist, subsets, aliases)
    assert row.layers == "[0, 1]" and s2 == subsets and a2["first_n n=2"] == ["search"] and aliases["first_n n=2"] == []
    _, s3, _ = ss.with_search_best(hist.assign(predicted=[1.2, 1.1]), subsets, aliases)
    assert s3["search"] == [0, 1, 2] and list(s3) == ["first_n n=2", "search"]


def test_prompts_are_windows_before_their_anchors():
    held = np.arange(40_000)
    p = ss.prompts(held, 2, 3, 2, 16, 8, search_windows=2, eval_windows=2, eval_len=10)
    assert [len(x) for x in p.pilot + p.report] == [16] * 5 and all(w[-1] < 20_000 for w in p.pilot)
    assert all(w[0] >= 20_000 for w in p.report + p.eval) and [len(w) for w in p.eval] == [11, 11]
    assert [len(w) for w in p.at_context(32)] == [32, 32] and p.at_context(4)[0][-1] == p.at_context(32)[0][-1]
