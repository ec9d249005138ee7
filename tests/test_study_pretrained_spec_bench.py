"""Notebook 07's study (speclib.research.studies.pretrained_spec_bench) and its conclusions
(speclib.workbook.verdicts), rebuilt from the committed results in data/results/07_spec_bench/."""

import math

import pandas as pd
import pytest

from speclib.core.device import REPO
from speclib.research import bench, spec_bench
from speclib.research.studies import pretrained_spec_bench as psb
from speclib.workbook import verdicts

RESULTS = REPO / "data" / "results" / "07_spec_bench"
LONG_TASKS = ["summarization", "rag"]

# what the notebook printed for section 9 from the committed tables (reuse mode; refresh after a recompute)
CONCLUSIONS = [
    "* Best speculative method overall: **HVD (every source)**, 1.68x over AR (95% CI 1.55–1.83); the workbook's goal of 2.0x is not met by the point estimate (it would take 1.19x more).",
    "* What bounds it: with drafting free and every verify pass as cheap as AR's step, HVD (every source)'s acceptance (2.06 tokens per target pass) allows 1.89x (95% CI 1.70–2.09); drafting and the wider pass cost the rest. AR spends 9% of its time outside its verify passes (mostly prefill), so 2.0x asks for about 2.22 tokens per pass even at no cost. The highest ceiling of any method here is HVD (every source)'s 1.89x: the goal lies above that estimate, inside its interval: even free drafting and a free wide pass would most likely miss it, and drafts the target accepts more often are what would reach it.",
    "* Cache drafts per task, best of prompt lookup, suffix, HVD (every source): mt_bench 2.14x (copied share 0.52), math_reasoning 1.68x (copied share 0.10), translation 1.66x (copied share 0.36), summarization 1.56x (copied share 0.29), rag 1.47x (copied share 0.15), qa 1.30x (copied share 0.06); the tasks whose answers copy more of their prompt gain more (Spearman 0.66 over 6 tasks); the 2.5x goal on summarization and RAG is not met (acceptance alone allows summarization 1.73x by HVD (every source), where 2.5x needs about 3.34 tokens per pass against its 1.93, rag 1.66x by HVD (every source), where 2.5x needs about 3.83 tokens per pass against its 2.00). Mean tokens per target step: 1.73 for prompt lookup here, 1.73 for PLD on the leaderboard — about the same: what the drafter gets accepted carries over from a 7B model on a GPU; its speedup is 1.50x here, 1.64x there, close: a wide verify pass costs little more than a narrow one here too (next line).",
    "* At Spec-Bench's own cap of 1024 tokens (section 6) prompt lookup reaches summarization 2.04x (95% CI 1.28–2.24), rag 1.67x (95% CI 1.23–2.65), below 2.5x on summarization and rag, with 7 of 12 AR answers repeating more than half of their 4-grams: the longer cap gives the copy more to copy, part of it the model's own loops.",
    "* One verify pass over 8 tokens costs v(8) = 1.11 passes over one here (1.90 for notebook 05's 27.8M code model at one thread, as its saved run measured it): the extra rows of a verify pass are nearly free at this size, so a rejected copy costs little; k was chosen on the pilot questions (4). The same forward through plain `F.linear` (backend torch-mkl, section 8) prices the same rows differently: which matrix-multiply library runs the projections is part of the backend.",
    "* Greedy output of every speclib method equals AR's on all 42 turns.",
    "* The trained feature head: 0.79x over AR with 1.23 tokens per target step (k = 2), its draft step costing c = 0.18 target passes; drafting from the 8192 most frequent tokens (FR-Spec) brings c to 0.08 and the speedup to 0.92x (1.23 tokens per step).",
    "* The separate draft model (SmolLM2 cut to 4 layers, distilled): draft model 0.66x over AR (1.30 tokens per step at k = 3, per-token acceptance 0.24, c = 0.26); draft model + FR-Spec 0.80x over AR (1.30 tokens per step at k = 3, per-token acceptance 0.24, c = 0.15).",
    "* Against transformers' assisted generation with the same draft: speclib's draft model (full vocabulary, the same work) runs at **1.17x** its speed, paired per turn (95% CI 1.15–1.18; goal 1.2x: not met); drafting from FR-Spec's smaller vocabulary, which assisted generation does not do, 1.40x (95% CI 1.39–1.41); assisted generation itself at 0.57x speclib's AR.",
    "* Self-speculation with SmolLM2's own layers (first_n 8 with a trained exit, k = 1): 0.81x over AR, 1.09 tokens per step at a per-token acceptance of 0.09 and c = 0.28; like notebook 06's self-drafts it does not pay: a subset cheap enough to draft with agrees too rarely with the whole model.",
    "* Against transformers on the same float32 weights: speclib's prompt lookup at 1.21x its prompt lookup's speed, paired per turn (95% CI 1.17–1.24; goal 1.2x: met by the estimate; the interval holds 1.2x; ratio of median tokens per second 1.19x); transformers' AR at 1.11x speclib's, its prompt lookup at 1.12x its own AR.",
    "* llama.cpp is another runtime on other numbers: the 4-bit file's weights with activations rounded to 8 bits. Its plain AR already runs at 2.13x speclib's float32 AR (a backend effect, notebook 05's subject, not speculation), and its prompt lookup at 0.87x its own AR; speclib's prompt lookup reaches 0.73x llama.cpp's tokens per second in float32; run on llama.cpp's own forward (section 8), speclib's prompt lookup is 0.98x llama.cpp's at the same n-gram and k (paired, 95% CI 0.97–1.01; goal 1.0x: missed by the estimate; the interval holds 1x).",
    "* The runtime decides whether speculation pays (section 8): prompt lookup over its own AR torch 1.50x (v(2) = 1.00), torch-mkl 1.33x (v(2) = 1.01), torch-bf16 1.62x (v(2) = 1.04), torch-int8 1.51x (v(2) = 1.05), onnx 1.42x (v(2) = 1.03), onnx-int8 1.55x (v(2) = 1.39), llamacpp-gguf 1.07x (v(2) = 1.25). Its gain does not follow v(2) here; the fastest runtime (torch-int8, 2.38x torch float32 AR's tokens per second) is one where it pays.",
]


def load(name):
    return pd.read_parquet(RESULTS / f"{name}.parquet")


def drop_meta(df):
    return df.drop(columns=["seed", "target", "threads", "smoke", "git_sha", "cap"], errors="ignore")


@pytest.fixture(scope="module")
def tasks():
    qs = spec_bench.questions(REPO / "data" / "workloads" / "spec_bench" / "question.jsonl")
    _, reported = spec_bench.split(qs, 6, 1, seed=0)
    return psb.turn_tasks(reported)


def test_turn_tasks_counts_second_turns():
    qs = [dict(task="mt_bench", turns=["a", "b"]), dict(task="qa", turns=["c"]), dict(task="rag", turns=["d"])]
    assert psb.turn_tasks(qs) == {0: "mt_bench", 1: "mt_bench", 2: "qa", 3: "rag"}


def test_conclusions_equal_what_the_notebook_printed(tasks):
    names = ["task_table", "ceiling", "identity", "implementations", "runtime_table", "runs", "pass_costs"]
    names += ["runtime_runs", "head_cost", "draft_cost", "draft_runs", "self_cost", "llamacpp_loops"]
    tables = {n: load(n) for n in names + ["long_table", "long_turns", "degeneracy"]}
    board = spec_bench.leaderboard().set_index("method")
    lat05 = pd.read_parquet(
        RESULTS.parent / "05_backend_latency" / "latency.parquet"
    )  # the committed one, wherever results.root() points
    text = verdicts.spec_bench_text(
        tables, tasks, board, lat05, lookup_k=4, fr_vocab=8192, long_tasks=LONG_TASKS, long_cap=1024
    )
    assert text.split("\n") == CONCLUSIONS


def test_task_table_and_ceiling_rebuild_from_the_step_tables(tasks):
    table = spec_bench.task_table(load("runs"), tasks)
    saved = drop_meta(load("task_table"))
    got = saved[saved.method.isin(table.method.unique())].reset_index(drop=True)
    pd.testing.assert_frame_equal(table.reset_index(drop=True), got.iloc[: len(table)].reset_index(drop=True))
    ceiling = psb.ceiling_table(load("runs"), tasks, ["prompt lookup", "suffix"])
    want = drop_meta(load("ceiling"))[["task", "method", "ceiling", "ceiling_lo", "ceiling_hi"]]
    merged = ceiling.merge(want, on=["task", "method"], suffixes=("", "_saved"))
    assert len(merged) == len(ceiling)
    assert (merged.ceiling == merged.ceiling_saved).all()


def test_derived_tables_rebuild(tasks):
    rtable = psb.runtime_table(load("runtime_latency"), load("runtime_runs"), list(load("runtime_table").runtime))
    pd.testing.assert_frame_equal(rtable, drop_meta(load("runtime_table")))
    pd.testing.assert_frame_equal(psb.llamacpp_loops(load("runtime_runs")), drop_meta(load("llamacpp_loops")))
    long = psb.long_table(load("long_runs"), load("long_turns"))
    pd.testing.assert_frame_equal(long, drop_meta(load("long_table")))
    head = psb.loop_cost_table(load("head_runs"))
    pd.testing.assert_frame_equal(head, drop_meta(load("head_cost")), check_dtype=False)
    draft = psb.loop_cost_table(load("draft_runs"), acceptance=True, skip=("AR", "transformers assisted"))
    pd.testing.assert_frame_equal(draft, drop_meta(load("draft_cost")), check_dtype=False)
    self_cost = pd.DataFrame([psb.self_cost(load("self_runs"))])
    pd.testing.assert_frame_equal(self_cost, drop_meta(load("self_cost")), check_dtype=False)
    pilot, best_lookup, best_suffix = psb.pilot_choice(load("pilot"), [[2, 4], [2, 8], [3, 8], [2, 12]], [8, 16])
    pd.testing.assert_frame_equal(pilot, drop_meta(load("pilot_table")))
    assert best_lookup == [2, 4]


def test_identity_table_and_common_prefix():
    assert psb.common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and psb.common_prefix([], [1]) == 0
    tok = pd.DataFrame({"AR": [[1, 2, 3], [4]], "suffix": [[1, 2, 3], [5]], "llama.cpp AR": [[1, 9], []]})
    tok["llama.cpp prompt lookup"] = [[1, 9], []]
    ident = psb.identity_table(tok).set_index("method")
    assert ident.identical["suffix"] == 1 and ident.mean_common_prefix["suffix"] == 0.5
    assert ident.reference["llama.cpp prompt lookup"] == "llama.cpp AR"
    assert ident.identical["llama.cpp prompt lookup"] == 2  # an empty answer equals an empty one
    assert "DIFFERS" in verdicts._identity_line(
        pd.DataFrame([dict(method=m, identical=1, turns=2) for m in psb.speclib_methods([])])
    )


def test_runtime_prediction_and_outside_shares():
    lat = pd.Series({1: 0.01, 2: 0.011, 3: 0.015})
    assert psb.steps_cost(lat, [1, 2, 0]) == pytest.approx(0.011 + 0.015 + 0.01)
    assert psb.predicted_speedup(lat, [1, 1], 4) == pytest.approx(4 * 0.01 / 0.022)
    runs = pd.DataFrame(
        dict(method=["AR", "AR", "x"], prompt=[0, 1, 0], seconds=[2.0, 4.0, 1.0], verify_s=[1.0, 4.0, 1.0])
    )
    shares = psb.outside_shares(runs, {0: "qa", 1: "rag"})
    assert shares == {"qa": 0.5, "rag": 0.0, "overall": pytest.approx(1 / 6)}


def test_section_texts_read_their_tables():
    chi = pd.DataFrame(dict(method=["prompt lookup", "suffix"], p_permutation=[0.5, 0.01]))
    assert verdicts.chi2_text(chi).startswith("Rejected at α = 0.05: suffix")
    assert verdicts.chi2_text(chi.assign(p_permutation=0.5)) == "No row rejects at α = 0.05."
    assert verdicts.code_model_v8(None) == "notebook 05 not run here"
    assert verdicts.llamacpp_agreement_text(pd.DataFrame(dict(method=["AR"], identical=[1], turns=[1]))) == ""
    assert verdicts._ci_if(math.nan, math.nan) == ""


def test_copied_share_counts_the_answers_ngrams_found_in_the_prompt():
    assert spec_bench.copied_share([1, 2, 3, 4, 5], [1, 2, 3, 4, 5]) == 1.0
    assert spec_bench.copied_share([1, 2, 3, 4], [9, 1, 2, 3, 4]) == 0.5  # (9,1,2,3) new, (1,2,3,4) copied
    assert spec_bench.copied_share([1, 2, 3], [1, 2, 3, 4]) == 0.0  # the prompt is shorter than a 4-gram
    assert spec_bench.copied_share([4, 3, 2, 1], [1, 2, 3, 4]) == 0.0  # order matters
    assert math.isnan(spec_bench.copied_share([1, 2, 3, 4], [1, 2, 3]))  # no 4-gram in the answer
    assert spec_bench.copied_share([7, 7, 7, 7], [7] * 8, n=4) == 1.0


def test_degenerate_table_rebuilds_from_the_committed_runs(tasks):
    degen = load("degeneracy")
    assert ((degen.copied > psb.DEGENERATE) | (degen.repeated > psb.DEGENERATE)).eq(degen.degenerate).all()
    steps = [
        load(n) for n in ["runs", "head_runs", "draft_runs", "self_runs", "recycling_runs", "rest_runs", "es_runs"]
    ]
    both = psb.degenerate_table(steps, tasks, degen)
    pd.testing.assert_frame_equal(both, drop_meta(load("degenerate_table")), check_dtype=False)
    o = both[both.task == "overall"].set_index("method")
    # on all turns the rows are the task table's; on the clean ones only the non-degenerate turns count
    table = load("task_table").set_index(["task", "method"])
    assert (o.speedup_all - table.xs("overall").speedup.loc[o.index]).abs().max() < 1e-12
    assert (o.turns_clean == (~degen.degenerate).sum()).all() and (o.turns_all == len(degen)).all()
    text = verdicts.degeneracy_text(degen, both, *psb.degeneracy_correlations(degen, steps[0], steps[-1]), 0.5)
    assert f"{int(degen.degenerate.sum())} of {len(degen)} reported turns copy or loop" in text


def test_prediction_error_rebuilds_and_its_parts_give_the_pooled_ratio():
    rlat, rruns, committed = load("runtime_latency"), load("runtime_runs"), drop_meta(load("prediction_error"))
    perr = psb.prediction_error(rlat, rruns, list(committed.runtime))
    pd.testing.assert_frame_equal(perr, committed, check_dtype=False)
    e, rt = perr.set_index("runtime"), drop_meta(load("runtime_table")).set_index("runtime")
    # the same prediction and measurement as the runtime table, signed
    assert e.predicted.to_numpy() == pytest.approx(rt.predicted[e.index].to_numpy())
    assert e.error.to_numpy() == pytest.approx((rt.predicted / rt.measured - 1)[e.index].to_numpy())
    for b in e.index:
        rb = rruns[rruns.backend == b]
        ar = rb[rb.method == "AR"]
        t1 = rlat[(rlat.backend == b) & (rlat.n == 1)].seconds.iloc[0]
        # outside + in-loop verify (bare price x loop factor) + drafting is every second of AR's runs
        ar_s = (
            e.outside_share[b] * ar.seconds.sum() + e.ar_loop[b] * ar.new_tokens.sum() * t1 + ar.draft_s.fillna(0).sum()
        )
        assert ar_s == pytest.approx(ar.seconds.sum())
    text = verdicts.prediction_error_text(perr)
    assert ("every one of the 7 predictions is high" in text) == bool((e.error > 0).all())
    low = perr.assign(error=[-0.1] + [0.1] * (len(perr) - 1))
    assert f"{len(perr) - 1} of {len(perr)} predictions are high, 1 low" in verdicts.prediction_error_text(low)


def test_best_held_out_rebuilds_from_the_committed_runs(tasks):
    steps = [
        load(n) for n in ["runs", "head_runs", "draft_runs", "self_runs", "recycling_runs", "rest_runs", "es_runs"]
    ]
    best = psb.best_held_out(steps, tasks, verdicts.SINGLE_SOURCES)
    pd.testing.assert_frame_equal(best, drop_meta(load("best_held_out")), check_dtype=False)
    b, table = best.set_index("task"), load("task_table").set_index(["task", "method"])
    for task in b.index:  # the in-sample pick is the task table's best single source
        t = table.loc[task].loc[[m for m in verdicts.SINGLE_SOURCES if m in table.loc[task].index]]
        assert b.in_sample[task] == t.speedup.idxmax() and b.in_sample_speedup[task] == pytest.approx(t.speedup.max())
    assert (b.held_out <= b.in_sample_speedup + 1e-12).all()  # here no task's held-out pick beats its in-sample one
    assert b.coverage.min() >= 0.95


def test_every_source_over_rebuilds_from_the_committed_runs():
    over = psb.every_source_over(load("es_runs"), seed=0).reset_index()
    pd.testing.assert_frame_equal(over, drop_meta(load("every_source_over")), check_dtype=False)
    hvd_rows = over[over.method == "HVD (every source)"].set_index("reference")
    speed = bench.speedup_table(load("es_runs")).set_index("method")
    best = speed.loc[["prompt lookup", "suffix", "lookahead"]].speedup.idxmax()
    text = verdicts.every_source_text(
        load("es_lookahead"), speed, over.set_index("reference"), load("es_choice"), best, len(load("es_logs"))
    )
    assert f"**{hvd_rows.speedup[best]:.2f}x** the best single source of this step, {best}" in text
    assert "afresh" not in text  # the committed run has no per-turn HVD, so the text says nothing of it


def test_a_per_turn_hvd_separates_memory_from_the_choice_of_source():
    runs = load("es_runs")
    hvd_rows = runs[runs.method == "HVD (every source)"]
    # a per-turn HVD 10% slower on every turn: HVD's memory is worth 1.10x, the choice alone the rest
    slower = hvd_rows.assign(method="HVD (every source, per turn)", tokens_per_s=hvd_rows.tokens_per_s / 1.1)
    kept = runs[runs.method == "suffix"].assign(method=psb.SUFFIX_MEMORY)  # a suffix tree kept across turns
    runs = pd.concat([runs, slower, kept], ignore_index=True)
    over = psb.every_source_over(runs, seed=0)
    memory = over[over.method == "HVD (every source)"].loc["HVD (every source, per turn)"]
    assert memory.speedup == pytest.approx(1.1) and memory.lo == pytest.approx(1.1)
    alone = over[over.method == "HVD (every source, per turn)"].loc["prompt lookup"]
    with_memory = over[over.method == "HVD (every source)"].loc["prompt lookup"]
    assert alone.speedup == pytest.approx(with_memory.speedup / 1.1)
    speed = bench.speedup_table(runs).set_index("method")
    text = verdicts._per_turn_memory(speed, over, "prompt lookup")
    assert "its memory across turns is worth 1.10x" in text and f"{alone.speedup:.2f}x prompt lookup" in text
    vs_kept = over[over.method == "HVD (every source)"].loc[psb.SUFFIX_MEMORY]
    assert vs_kept.speedup == pytest.approx(over[over.method == "HVD (every source)"].loc["suffix"].speedup)
    assert f"HVD runs at {vs_kept.speedup:.2f}x" in text and "memory against memory" in text


def test_hvd_takes_section_4s_draft_with_its_k_and_measured_cost():
    druns = load("draft_runs")
    alt = psb.draft_alternative("smollm2-draft", druns, 8192)
    fr = druns[druns.method == "draft model + FR-Spec"]
    assert (alt.k, alt.fr_vocab) == (int(fr.chosen_k.iloc[0]), 8192)
    assert alt.token_s == pytest.approx(fr.draft_token_s.median())
    whole = psb.draft_alternative("smollm2-draft", druns, None)
    assert whole.fr_vocab is None and whole.token_s == pytest.approx(
        druns[druns.method == "draft model"].draft_token_s.median()
    )
    assert psb.draft_alternative(None, druns, 8192) is None
    d, e = alt(), alt()  # a new drafter per call over one loaded draft
    assert d.k == e.k == alt.k and d is not e and d.lm is e.lm


def test_texts_say_when_there_is_no_interval_or_no_over_promise():
    best = drop_meta(load("best_held_out"))
    assert "none here" in verdicts.best_held_out_text(best.assign(coverage=math.nan))
    speed = bench.speedup_table(load("es_runs")).set_index("method")
    over, choice = load("every_source_over").set_index("reference"), load("es_choice")
    args = (load("es_lookahead"), speed, over)
    assert "over-promised most" in verdicts.every_source_text(*args, choice, "prompt lookup", 10)
    under = choice.assign(predicted=choice.accepted - 0.5)  # every payoff promised below what was accepted
    assert "promised no source more than it delivered" in verdicts.every_source_text(*args, under, "prompt lookup", 10)
