# %% [markdown]
# # 01 · Lossless speculative decoding from scratch
#
# **Question.** Can a small draft model make a larger target model generate faster *without changing
# a single probability* of what the target would have produced — and by how much, on this machine?
#
# **Method.** The draft proposes `K` tokens autoregressively; the target scores all of them in one
# pass; the Leviathan/Chen rejection rule (`speclib.Lossless`) keeps a prefix and draws one more
# token, so every iteration yields between 1 and `K + 1` tokens. Everything runs on the shipped pair
# `code-target` / `code-draft`, trained by `python -m speclib train` on the Python standard library.
#
# We check equivalence to the target at three levels — the exact math of the rule, a two-sample
# chi-square test on real-model tokens, and token-for-token greedy identity — then measure acceptance
# and wall-clock speedup against `K`, beside the analytic model and `transformers` assisted generation.

# %% [markdown]
# ## About this notebook
#
# **What you will learn.**
#
# * Why the draft-then-verify rule reproduces the target's distribution *exactly*, for any draft
#   model, and how a small implementation slip (a real `transformers` bug) breaks that.
# * How to test "same distribution" on generated text honestly: which unit is independent, why the
#   textbook chi-square p-value is not valid on tokens from the same run, and what is valid instead.
# * How to measure a speedup with an error bar: paired runs, a median of per-prompt ratios, a
#   bootstrap over prompts, and a K chosen on prompts that are not the reported ones.
# * How the analytic model `E / (K·c + v(K))` explains the measured speed, and which of acceptance,
#   draft cost and verify cost limits it.
#
# **What to know first.** A language model gives a probability distribution over the next token;
# generating autoregressively (AR) costs one forward pass of the model per token. Temperature,
# top-k and top-p reshape that distribution before a token is drawn. From statistics: what a p-value
# is and what a level α = 0.05 promises, and the idea of the bootstrap. Nothing about speculative
# decoding is assumed. The proofs behind each section are in [the lossless rule](../docs/lossless.md),
# [the statistics notes](../docs/statistics.md) and [the analytic model](../docs/analytic_model.md).
#
# **How long it takes.** The parameter `RESULTS` decides. With `"auto"` (the default) every expensive
# step (the cost profile, the exact-math check, the chi-square samples, the timed runs, the
# `transformers` comparison) is read from `data/results/` when it was saved with the same parameters,
# and computed otherwise: with the shipped parameters the notebook draws every figure and table from
# the saved results in about a minute. `"recompute"` computes every step, about an hour on 2 CPU
# cores, most of it the timed runs of section 4; `"reuse"` never computes, and stops with an error
# that names the step and the parameters that differ when its saved results do not match. Changing
# one parameter recomputes only the steps that use it (exercise 5 recomputes the chi-square step
# alone). A run whose parameters differ from the shipped ones writes its results and figures under
# `build/unpublished/01_baseline/…` (the setup cell prints where), never over the shipped ones.
# The table at the end of section 6 lists each step, whether this run computed or reused it, and how
# long it took when it was computed.
#
# **Notation** (the same everywhere in speclib):
#
# | symbol | meaning |
# |---|---|
# | `p`, `q` | the target's and the draft's next-token distributions at one position, *after* temperature, top-k and top-p |
# | AR, SD | autoregressive decoding with the target alone; speculative decoding (draft, then verify) |
# | `K` | draft length: tokens the draft proposes per iteration |
# | `a` | per-token acceptance: P(a draft token is accepted \| every earlier one in its iteration was) |
# | `α(K)` | acceptance *rate*: accepted / drafted tokens (falls with K even when `a` does not, section 4) |
# | `c` | the cost of one draft token, in units of one target token |
# | `v(K)` | the cost of one target pass over K + 1 tokens, in units of a pass over one |
# | `E` | expected tokens per target call, `(1 − a^{K+1}) / (1 − a)` |
#
# A bare α, without K, is the significance level of section 3.
#
# **Structure.**
#
# 1. **The pair**: who drafts, who verifies, and what each costs (`c`, `v(K)`).
# 2. **Exact math**: the rule's output distribution computed exactly, with a known bug as a
#    negative control.
# 3. **Chi-square**: is sampled SD text distributed like AR text? A test that is valid on dependent
#    tokens, calibrated before it is trusted.
# 4. **Speed versus K**: the measured speedup, its uncertainty, the analytic prediction, and the
#    acceptance profile.
# 5. **Identity and `transformers`**: greedy SD must equal greedy AR token for token; speed against a
#    peer implementation of the same algorithm.
# 6. **What limits the speedup**: where the time goes, and the ceiling that even perfect acceptance
#    cannot pass.
#
# It ends with what to take away and exercises to run. Each section opens with the idea (why this
# check or measurement, how it is done, what would count as failure, how to read its figure), then
# the code, then a text cell that the code writes from this run's results. Numbers appear only in
# those generated cells: they change from run to run and machine to machine, so the prose never
# quotes one.

# %%
SMOKE = False  # True: tiny sizes, the whole notebook in under ~2 minutes on 2 CPU cores
SEED = 0
DEVICE = "auto"  # auto: cuda, then mps, then cpu
TARGET = "code-target"  # a shipped name, a local HF folder or a hub id: any causal LM of the README's support matrix
DRAFT = "code-draft"  # any causal LM with the target's tokenizer (prompts are encoded with the target's)
K_MAX = 8  # draft lengths 1..K_MAX
N_PILOT = 4  # pilot prompts: choose the best K (half stdlib, half HumanEval)
N_PROMPTS = 12  # reported prompts, disjoint from the pilot ones (half stdlib, half HumanEval)
ROUNDS = 3  # interleaved repeats of the reported timing runs (run-to-run spread)
THREADS = 1  # torch threads (0: every CPU this process may use); 1 keeps T(n) smooth on 2 cores (notebook 05)
MAX_NEW_TOKENS = 128
CHI2_TOKENS = 9200  # tokens per method for the chi-square test (the seed study used ~9,200)
CHI2_K = 4  # draft length used for the chi-square samples
N_CALIBRATION = 200  # AR-vs-AR random splits for the null calibration
N_EXACT_PAIRS = 2000  # random (p, q) pairs for the exact-math table
LATENCY_REPEATS = 30
HEAD = "code-target-head"  # section 7: a feature-level head trained for TARGET (python -m speclib train head TARGET)
HEAD_TREES = [[3, 8], [4, 12], [5, 16], [6, 24]]  # section 7: EAGLE-2 trees as [depth, node budget]
HEAD_TOP = 3  # section 7: most children per tree node
OVERLAP_SETTINGS = [
    [3, 3],
    [4, 4],
    [6, 2],
    [8, 0],
]  # section 8: [k, wait_for] pairs of overlapped drafting (k up to K_MAX)
RESULTS = "auto"  # auto: reuse results saved with these parameters, else compute; "recompute"; "reuse"
PUBLISH = False  # True: a run with non-default parameters also replaces data/results and figures/

# %% [markdown]
# ### Parameters and setup
# The cell above holds every parameter; papermill overrides them (see the exercises at the end).
# The cell below loads both models, fixes the number of torch threads, and builds the prompts:
# excerpts of held-out Python standard-library files (excluded from training) and HumanEval problem
# statements, interleaved so that both sources appear in each set. The first `N_PILOT` prompts are
# the **pilot** set, used only to choose K in section 4; the next `N_PROMPTS` are the **reported**
# set on which every speed figure is measured. `SMOKE = True` shrinks every size to check quickly
# that the notebook runs end to end; its numbers carry no weight.

# %%

from functools import partial

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown, display
from tqdm.auto import tqdm

import speclib
from speclib import ModelDrafter, Sampling, generate
from speclib.core.acceptance import output_distribution
from speclib.lms.loading import describe
from speclib.research import bench, data, stats
from speclib.workbook import results
from speclib.workbook.plotting import savefig, style
from speclib.workbook.study import Study

if SMOKE:
    K_MAX, N_PILOT, N_PROMPTS, ROUNDS, MAX_NEW_TOKENS = 3, 2, 2, 1, 24
    CHI2_TOKENS, N_CALIBRATION, N_EXACT_PAIRS, LATENCY_REPEATS = 640, 20, 100, 3
    HEAD_TREES = [[3, 6]]
    OVERLAP_SETTINGS = [[2, 2]]
NB = "01_baseline"
KS = list(range(1, K_MAX + 1))
if max(k for k, _ in OVERLAP_SETTINGS) > K_MAX:
    raise ValueError(f"OVERLAP_SETTINGS: k must be <= K_MAX ({K_MAX}), whose in-loop v(k) section 8 reuses")
GREEDY, T1 = Sampling(0.0), Sampling(1.0)
style()
torch.manual_seed(SEED)
threads = speclib.core.device.set_threads(THREADS or None)
target, draft = speclib.load(TARGET, device=DEVICE), speclib.load(DRAFT, device=DEVICE)
dev = str(target.device)
n_all = N_PILOT + N_PROMPTS
stdlib_rows, humaneval_rows = data.load_workload("code_stdlib", n_all), data.load_workload("code_humaneval", n_all)
# interleaved, so the pilot and the reported prompts both mix the two sources
prompt_rows = [r for pair in zip(stdlib_rows, humaneval_rows) for r in pair][:n_all]
prompts = [target.encode(r["prompt"]) for r in prompt_rows]
pilot_prompts, report_prompts = prompts[:N_PILOT], prompts[N_PILOT:]
meta = dict(seed=SEED, device=dev, threads=threads, target=TARGET, draft=DRAFT, smoke=SMOKE)
study = Study(
    NB, globals(), mode=RESULTS, publish=PUBLISH, always=dict(SMOKE=SMOKE), calibrate=target
)  # target T(1) before/after each step
print(
    f"{len(pilot_prompts)} pilot + {len(report_prompts)} reported prompts, {np.mean([len(p) for p in prompts]):.0f} "
    f"tokens on average; device {dev}, {threads} torch thread(s); results mode {RESULTS!r}: this run {study.where()}"
)
PROMPT_PARAMS = ["N_PILOT", "N_PROMPTS"]  # the prompt sets depend on these

# %% [markdown]
# ## 1 · The pair
#
# **Why.** Speculation trades draft work for target passes. It can pay only if the draft is much
# cheaper than the target *and* agrees with it often; the cost is measured here, the agreement in
# section 4. The target must also be clearly better than the draft (lower held-out loss, in nats per
# token on held-out standard-library text), or one would simply use the draft.
#
# **The two costs**, both in units of one target forward pass over one new token, `T_target(1)`:
#
# * `c = T_draft(1) / T_target(1)`: one draft token. Every iteration pays it `K` times, whether the
#   tokens are accepted or not.
# * `v(K) = T_target(K + 1) / T_target(1)`: the verify pass, which scores the K draft tokens and the
#   position after them at once. Leviathan et al. take `v(K) = 1` (a wider pass is free, as on a GPU
#   running a large model); on a compute-bound machine (a CPU, small models) it grows with K — see
#   "Why v(K) depends on the runtime" in [the analytic model](../docs/analytic_model.md).
#
# **How.** We read the training record shipped beside each checkpoint (size, held-out loss, training
# budget) and time bare one-token passes of each model and (K + 1)-token passes of the target over a
# 128-token cached prefix (`bench.cost_profile`: the cases interleaved round-robin, `LATENCY_REPEATS`
# times each, medians).
#
# **Bare passes versus the loop.** These are microbenchmark numbers: each pass timed in isolation,
# at a fixed prefix. A real decoding iteration also samples, runs the acceptance rule, commits the
# accepted tokens to both caches, lets the draft catch up on the 1–2 tokens it has not seen, and runs
# Python between the calls; and the prefix grows over the run. Section 4 therefore measures `c` and `v(K)` again *inside* the decoding runs. Those are the costs the speedup
# actually paid, and the gap between the two sets shows how far a microbenchmark can be trusted.
#
# **What would count as failure:** `c` not well below 1 (K draft tokens per iteration would then cost
# about as much as K target steps, and no acceptance rate could make up for it), or a target no better
# than its draft. **Look at** `c` in the sentence under the table, and at how fast `v(K)` rises with K:
# that growth bounds the useful K as much as acceptance does.


# %%
def measure_costs():
    prof = bench.cost_profile(target, draft, KS, prefix_len=128, repeats=LATENCY_REPEATS)
    models = pd.DataFrame(
        [
            dict(role="target", **describe(target), latency_ms=prof["target_1"] * 1e3),
            dict(role="draft", **describe(draft), latency_ms=prof["draft_1"] * 1e3),
        ]
    )
    cost = pd.DataFrame([dict(K=k, v=prof["v"][k], c=prof["c"]) for k in KS])
    return {"models": models.assign(**meta), "cost": cost.assign(**meta)}


saved = study.step("cost", measure_costs, uses=["TARGET", "DRAFT", "K_MAX", "LATENCY_REPEATS", "THREADS"])
models, cost = saved["models"], saved["cost"]
prof = dict(
    target_1=models.latency_ms[0] / 1e3, draft_1=models.latency_ms[1] / 1e3, c=cost.c[0], v=dict(zip(cost.K, cost.v))
)
v_text = ", ".join(f"{prof['v'][k]:.2f}" for k in KS)
display(models[["role", "name", "parameters", "heldout_loss", "tokens_seen", "train_minutes", "latency_ms"]])
display(
    Markdown(
        f"The target has {models.parameters[0] / 1e6:.1f}M parameters and held-out loss "
        f"{models.heldout_loss[0]:.3f}; the draft {models.parameters[1] / 1e6:.2f}M and {models.heldout_loss[1]:.3f} "
        f"(nan: a checkpoint that did not record one). "
        f"One target token costs {prof['target_1'] * 1e3:.2f} ms, one draft token {prof['draft_1'] * 1e3:.2f} ms: "
        f"**c = {prof['c']:.3f}** (the target is {1 / prof['c']:.1f}x slower). Verifying K + 1 tokens costs "
        f"v(K) = {v_text} times one token for K = 1..{K_MAX}."
    )
)

# %% [markdown]
# ## 2 · Level 1: the exact math of the rule
#
# **Why exactness holds.** Draw `x ~ q` and accept it with probability `min(1, p(x)/q(x))`. Then
# P(accept and emit `x`) = `q(x)·min(1, p(x)/q(x)) = min(p(x), q(x))`: a token the draft
# under-proposes is always accepted, one it over-proposes is thinned down to `p(x)`. The accepted mass
# is `β = Σ_y min(p(y), q(y))`, so a rejection happens with probability `1 − β`. What is still missing
# from `p` is `p(x) − min(p(x), q(x)) = max(0, p(x) − q(x))`, which also sums to exactly `1 − β`; so
# drawing from the normalised residual `norm(max(0, p − q))` after a rejection fills in exactly the
# missing mass, and `x` is emitted with total probability `p(x)`. Nothing here depends on how good
# `q` is: any draft gives exact output, a better one only gets more tokens accepted. Positions chain
# by conditional probability, so whole sequences are distributed as AR's. The full proof, the edge
# cases and greedy decoding are in [the lossless rule](../docs/lossless.md).
#
# **The check.** Written out, the rule emits `x` with probability
# `q(x)·min(1, p(x)/q(x)) + (1 − Σ_y q(y)·min(1, p(y)/q(y)))·norm(max(0, p − q))(x)`, which must equal
# `p(x)`. We evaluate it exactly (`acceptance.output_distribution`: float64, no sampling, so any
# deviation beyond round-off would be the rule's, not Monte Carlo noise) on random pairs of shapes
# chosen to stress it:
#
# * *dense*: the generic case;
# * *q zero where p > 0*: the draft never proposes some tokens the target wants; only the residual
#   can produce them;
# * *p zero where q > 0*: the draft proposes tokens the target forbids; they must always be rejected;
# * *both sparse*: each keeps only 56 of 256 entries, so the supports overlap only partly and the
#   residual carries much of the mass;
# * *full vocabulary*: the size of the shipped tokenizer, where round-off accumulates over many terms;
#
# and on real (p, q) pairs from the two models at every position of half the prompts, after
# temperature 1, top-k 20 and top-p 0.95 (processing puts exact zeros into both). For real positions
# the table reports the total variation (TV) `½·Σ_x |emitted(x) − p(x)|`: the largest difference in
# probability the two distributions assign to any set of tokens.
#
# **The negative control.** The proof needs one fact: the `q` in the ratio and the residual is the
# distribution `x` was actually drawn from. A known bug (HF #47932) breaks it: tokens are drawn from
# the top-k-processed `q`, but the ratio uses the raw `q`. Processing renormalises the surviving
# tokens, so their raw probability is smaller than the one they were drawn with; the ratio `p/q` comes
# out too large, draft tokens are accepted too often, and the output leans toward the draft's
# favourites. The control shows that the check can fail: if the buggy rule also came out at
# round-off, a passing lossless rule would prove nothing.
#
# **What would count as failure:** any lossless row far above float64 round-off (machine epsilon is
# about 2e-16), or a control that the check cannot tell from the correct rule.
#
# **The figure.** A histogram over real positions of the buggy rule's TV from the target (x axis;
# positions on the y axis). The dashed black line marks the largest TV of speclib's rule over the
# same positions; it should sit at the far left, at round-off. Look at where the bulk of the
# histogram lies: a bug that only bites at rare positions piles up near zero with a thin tail, one
# that distorts typical positions moves the bulk away from zero.


# %%
def random_pair(v, gen, zp, zq):
    p = torch.rand(v, generator=gen, dtype=torch.float64) ** 3
    q = torch.rand(v, generator=gen, dtype=torch.float64) ** 3
    p[torch.randperm(v, generator=gen)[:zp]] = 0
    q[torch.randperm(v, generator=gen)[:zq]] = 0
    return p / p.sum(), q / q.sum()


def raw_q_bug(p, q_drawn, q_raw):
    """Output distribution when tokens come from q_drawn but the ratio uses q_raw."""
    acc = q_drawn * (p / q_raw).clamp(max=1)
    r = (p - q_raw).clamp_min(0)
    return acc + (1 - acc.sum()) * r / r.sum()


def exact_math():
    gen = torch.Generator().manual_seed(SEED)
    rows = []
    for family, v, zp, zq in [
        ("dense", 16, 0, 0),
        ("q zero where p > 0", 16, 0, 8),
        ("p zero where q > 0", 16, 8, 0),
        ("both sparse", 256, 200, 200),
        ("full vocabulary", 4096, 0, 0),
    ]:
        n = max(10, N_EXACT_PAIRS // 5)
        errs = []
        for _ in range(n):
            p, q = random_pair(v, gen, zp, zq)
            errs.append(float((output_distribution(p, q) - p).abs().max()))
        rows.append(dict(family=family, vocab=v, pairs=n, rule="lossless", max_abs_error=max(errs)))

    # real distributions from the two models, processed with top-k 20 / top-p 0.95
    s_proc = Sampling(1.0, top_k=20, top_p=0.95)
    tv_ok, tv_bug = [], []
    for ids in prompts[: max(2, len(prompts) // 2)]:
        with torch.inference_mode():
            lp = target.model(input_ids=torch.tensor([ids], device=target.device)).logits[0].float().cpu()
            lq = draft.model(input_ids=torch.tensor([ids], device=draft.device)).logits[0].float().cpu()
        # float64 and renormalised, so the check measures the rule, not float32 round-off of the inputs
        P, Q = speclib.core.sampling.probs(lp, s_proc).double(), speclib.core.sampling.probs(lq, s_proc).double()
        P, Q = P / P.sum(-1, keepdim=True), Q / Q.sum(-1, keepdim=True)
        Qraw = torch.softmax(lq.double(), -1)
        for p, q, qr in zip(P, Q, Qraw):
            tv_ok.append(0.5 * float((output_distribution(p, q) - p).abs().sum()))
            tv_bug.append(0.5 * float((raw_q_bug(p, q, qr) - p).abs().sum()))
    rows.append(
        dict(
            family="real models, top-k 20 / top-p 0.95",
            vocab=target.vocab_size,
            pairs=len(tv_ok),
            rule="lossless",
            max_abs_error=None,
            max_tv=max(tv_ok),
        )
    )
    rows.append(
        dict(
            family="real models, top-k 20 / top-p 0.95",
            vocab=target.vocab_size,
            pairs=len(tv_bug),
            rule="raw-q bug (#47932)",
            max_abs_error=None,
            max_tv=max(tv_bug),
        )
    )
    tv = pd.DataFrame({"rule": ["lossless"] * len(tv_ok) + ["raw-q bug (#47932)"] * len(tv_bug), "tv": tv_ok + tv_bug})
    return {"exact_math": pd.DataFrame(rows).assign(**meta), "exact_tv": tv.assign(**meta)}


saved = study.step("exact_math", exact_math, uses=["SEED", "N_EXACT_PAIRS", "TARGET", "DRAFT"] + PROMPT_PARAMS)
exact, tv = saved["exact_math"], saved["exact_tv"]
tv_ok, tv_bug = tv[tv.rule == "lossless"].tv.to_numpy(), tv[tv.rule != "lossless"].tv.to_numpy()
random_rows = exact[~exact.family.str.startswith("real models")]
display(exact.drop(columns=list(meta)))

fig, ax = plt.subplots(figsize=(6.4, 3.4))
bins = np.linspace(0, max(max(tv_bug), 1e-3), 40)
ax.hist(tv_bug, bins=bins, alpha=0.7, label="ratio with raw q (HF #47932)")
ax.axvline(max(tv_ok), color="k", ls="--", label=f"speclib: max TV {max(tv_ok):.1e}")
ax.set(
    xlabel="total variation between emitted and target distribution",
    ylabel="positions",
    title="Exact output distribution at each position of the prompts",
)
ax.legend()
savefig(fig, f"{NB}_exact_math")
plt.show()
display(
    Markdown(
        f"Over {random_rows.pairs.sum()} random pairs the largest deviation from `p` is "
        f"{random_rows.max_abs_error.max():.1e} (float64 round-off). On {len(tv_ok)} real positions "
        f"the lossless rule stays within total variation {max(tv_ok):.1e} of the target, while the raw-q bug "
        f"reaches {max(tv_bug):.3f} (median {np.median(tv_bug):.3f})."
    )
)

# %% [markdown]
# ## 3 · Level 2: two-sample chi-square on real-model tokens
#
# **Why another check.** Level 1 verified a formula. The decoder is more than the formula: it samples,
# keeps two KV caches in step, stores the `q` row each draft token was drawn from, scores K + 1
# positions in one pass and commits the accepted prefix. A mistake in any of these changes the output
# distribution without touching the formula. Level 2 tests the output of the whole code path at
# temperature 1: are SD's tokens distributed like AR's?
#
# **How.** We sample runs of up to 64 tokens from the target alone (AR) and with speculation (SD, `K = CHI2_K`)
# until each method has at least `CHI2_TOKENS` tokens; run i of both methods continues the same
# prompt, with its own seed. The statistic is the two-sample chi-square over token frequencies
# (`speclib.research.stats.chi2_two_sample`, sparse bins pooled so every expected count is at least 5). It is
# done twice: at plain temperature 1, and with top-k 50 and top-p 0.9 added, the processed path where
# the bug of section 2 lives.
#
# **Why the textbook p-value is invalid here.** It assumes independent tokens — but tokens inside one
# run are not independent (a model that repeats itself puts many copies of one token in one run). Bin
# counts then vary more than independent sampling allows, by roughly the design effect
# `1 + (m − 1)·ρ` for `m` tokens per run with within-run correlation `ρ`; the statistic is inflated by
# about that factor, and the test rejects true nulls far more often than α, even when comparing AR
# with AR. A low textbook p-value here says nothing about SD.
#
# **Why the permutation test is valid.** Runs *are* independent (each has its own seed). Under the
# null "SD and AR runs come from the same distribution", swapping the AR/SD labels of the two runs of
# a prompt pair leaves the joint distribution of the data unchanged. So we also compute an exact
# permutation p-value by swapping labels within each prompt pair (`stats.run_permutation_test`): the
# observed chi-square is ranked among the values after 999 random relabellings,
# `p = (1 + #{permuted ≥ observed}) / (1 + 999)`, and `P(p ≤ α) ≤ α` holds exactly, whatever the
# dependence inside a run. Its only assumption is independence *between* runs. Details and the
# design-effect argument: [the statistics notes](../docs/statistics.md).
#
# **Calibration: test the test first.** Random splits of the AR runs into two halves give
# comparisons where the null holds by construction. A valid test's p-values are then uniform on
# [0, 1]: a calibrated test rejects about 5% of them at α = 0.05, up to binomial noise of roughly
# `±2·sqrt(0.05·0.95 / N_CALIBRATION)`. The splits are unpaired (`paired=False`, labels permuted over
# all runs) with 99 relabellings each, so their permutation p-values come in steps of 1/100.
#
# **What would count as failure:** the permutation test rejecting clearly more than 5% of the AR-vs-AR
# splits (the test itself is broken), or an AR-vs-SD permutation p-value below α. The latter happens
# with probability α even for a perfect decoder, so a single low value is a reason to rerun with
# another `SEED` and more tokens, not a verdict; one that stays low is a bug. The textbook test
# over-rejecting the calibration splits is *not* a failure of speclib: showing it is the point of the
# calibration. And a pass is not a proof: it says that any deviation is too small to see with this many
# tokens, which is why levels 1 and 3 exist.
#
# **The figure.** Left: histograms of the AR-vs-AR p-values, one colour per setting, dashed for the
# textbook test and solid for the permutation test; the dotted horizontal line is the height every bin
# would have if the p-values were exactly uniform. Look for solid lines close to the dotted one, and
# dashed lines piled up in the leftmost bins. Right: the AR-vs-SD p-values of each setting, textbook
# and permutation side by side, with the red dashed line at α = 0.05. Only the permutation bars count
# as evidence; they should stand above the line.


# %%
def sample_pairs(sampling, n_tokens, seed0, make_drafter=lambda: ModelDrafter(draft, CHI2_K), sd_target=None):
    """Paired runs (same prompt, own seeds) until BOTH methods have at least n_tokens tokens; SD drafts
    with make_drafter() for sd_target (default: the target)."""
    ar_runs, sd_runs = [], []
    bar = tqdm(total=n_tokens, desc="AR/SD runs", leave=False)
    while min(sum(map(len, ar_runs)), sum(map(len, sd_runs))) < n_tokens:
        i, ids = len(ar_runs), prompts[len(ar_runs) % len(prompts)]
        ar_runs.append(generate(target, ids, 64, sampling=sampling, seed=seed0 + i).tokens)
        sd_runs.append(
            generate(
                sd_target or target, ids, 64, drafter=make_drafter(), sampling=sampling, seed=seed0 + 500_000 + i
            ).tokens
        )
        bar.n = min(sum(map(len, ar_runs)), sum(map(len, sd_runs)))
        bar.refresh()
    bar.close()
    return ar_runs, sd_runs


def chi_square():
    chi_rows, calib_rows = [], []
    for name, s in [("temperature 1", T1), ("temperature 1, top-k 50, top-p 0.9", Sampling(1.0, top_k=50, top_p=0.9))]:
        ar_runs, sd_runs = sample_pairs(s, CHI2_TOKENS, SEED * 10**6)
        n_runs = len(ar_runs)
        r = stats.run_permutation_test(ar_runs, sd_runs, n_perm=999, paired=True, seed=SEED)
        chi_rows.append(
            dict(
                setting=name,
                method="speclib",
                chi2=r.chi2,
                dof=r.dof,
                p=r.p_asymptotic,
                p_permutation=r.p_permutation,
                tokens_ar=r.n_a,
                tokens_sd=r.n_b,
                runs=n_runs,
            )
        )
        rng = np.random.default_rng(SEED)
        for trial in range(N_CALIBRATION):
            perm = rng.permutation(n_runs)
            a, b = [ar_runs[j] for j in perm[: n_runs // 2]], [ar_runs[j] for j in perm[n_runs // 2 :]]
            try:
                c = stats.run_permutation_test(a, b, n_perm=99, paired=False, seed=trial)
                calib_rows.append(
                    dict(setting=name, trial=trial, p_asymptotic=c.p_asymptotic, p_permutation=c.p_permutation)
                )
            except ValueError:  # a split too small to keep two bins (smoke sizes only)
                pass
    chi = pd.DataFrame(chi_rows).assign(**meta)
    calib = pd.DataFrame(calib_rows).assign(**meta)
    return {"chi2": chi, "calibration": calib}


saved = study.step(
    "chi2", chi_square, uses=["SEED", "CHI2_TOKENS", "CHI2_K", "N_CALIBRATION", "TARGET", "DRAFT"] + PROMPT_PARAMS
)
chi, calib = saved["chi2"], saved["calibration"]
# only this run's measurements: tables saved before this step stopped writing it carry a "reference" row
# with the seed study's published figures (SEED_STUDY_CHI2 below), which is not a measurement
chi = chi[chi.method == "speclib"].reset_index(drop=True)
display(chi.drop(columns=list(meta)))

fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
for (name, g), color in zip(calib.groupby("setting", sort=False), ["C0", "C1"]):
    axes[0].hist(
        g.p_asymptotic, bins=20, range=(0, 1), histtype="step", lw=2, ls="--", color=color, label=f"{name}: textbook χ²"
    )
    axes[0].hist(
        g.p_permutation, bins=20, range=(0, 1), histtype="step", lw=2, color=color, label=f"{name}: permutation"
    )
axes[0].axhline(len(calib) / calib.setting.nunique() / 20, color="k", ls=":", label="uniform")
axes[0].set(xlabel="p-value (AR vs AR, random splits)", ylabel="splits", title="Null calibration")
axes[0].legend(fontsize=7)
ours = chi
x = np.arange(len(ours))
axes[1].bar(x - 0.2, ours.p, 0.4, label="textbook χ²")
axes[1].bar(x + 0.2, ours.p_permutation, 0.4, label="permutation")
axes[1].axhline(0.05, color="C3", ls="--", label="α = 0.05")
axes[1].set_xticks(x, [s.replace(", ", "\n") for s in ours.setting], fontsize=8)
axes[1].set(ylabel="p-value (AR vs SD)", ylim=(0, 1), title="Two-sample test, AR vs SD")
axes[1].legend(fontsize=8)
savefig(fig, f"{NB}_chi2")
plt.show()
fpr = calib.groupby("setting", sort=False)[["p_asymptotic", "p_permutation"]].agg(lambda p: (p < 0.05).mean())
# the seed study's published test (a quotation, not a measurement of this workbook)
SEED_STUDY_CHI2 = dict(chi2=162.5, dof=200, p=0.976, tokens_per_method=9200)
display(
    Markdown(
        "; ".join(
            f"**{r.setting}**: χ² = {r.chi2:.1f}, dof = {r.dof}, p = {r.p:.3f} (permutation p = {r.p_permutation:.3f}) over "
            f"{r.tokens_ar} AR and {r.tokens_sd} SD tokens; on AR-vs-AR splits the textbook test rejects "
            f"{fpr.p_asymptotic[r.setting]:.1%} and the permutation test {fpr.p_permutation[r.setting]:.1%} at α = 0.05"
            for r in ours.itertuples()
        )
        + f". The seed study reported χ² = {SEED_STUDY_CHI2['chi2']}, dof = {SEED_STUDY_CHI2['dof']}, "
        f"p = {SEED_STUDY_CHI2['p']} over about {SEED_STUDY_CHI2['tokens_per_method']:,} tokens per method."
    )
)

# %% [markdown]
# ## 4 · Speed and acceptance versus K
#
# **Why K matters, and the analytic model.** One iteration drafts `K` tokens (cost `K·c`), verifies
# them in one target pass (cost `v(K)`) and yields on average `E = (1 − a^{K+1}) / (1 − a)` tokens:
# the accepted prefix plus one correction or bonus token. Against AR's one token per target pass, the
# predicted speedup is
#
# `speedup(K) = E / (K·c + v(K))`.
#
# `E` grows with K but saturates at `1/(1 − a)`, while the cost keeps growing, so there is a best K
# and beyond it speculation slows down again; it pays at all only while `v(K) < E − K·c`. At
# temperature 1 the chance of accepting a draft token at a position is `Σ_x min(p(x), q(x)) = 1 − TV(p, q)`,
# how much the two distributions overlap; under greedy decoding it is the chance that the two models'
# top tokens agree. Neither is larger in general, so both modes are measured. Derivations, the
# break-even condition and its assumptions (one acceptance `a` at every position, independent of
# the others): [the analytic model](../docs/analytic_model.md).
#
# **How speed is measured, here and in every notebook** (`speclib.research.bench`, details in
# [the statistics page](../docs/statistics.md)). For each prompt, AR and speculative decoding at every
# `K` run back to back, in an order that alternates between prompts and rounds (AR first, then last:
# "ABBA"), so a slow drift of the machine — another process waking up, the CPU clocking down — hits
# every method alike. One untimed warm-up run of each method comes first. The **speedup** of a method
# is the median over prompts of its per-prompt speed ratio (its tokens per second over AR's on the
# same prompt), with a 95% bootstrap interval over prompts; the **total-time ratio** (all of AR's time
# over all of the method's, per token) stands beside it. The reported runs are repeated `ROUNDS`
# times, interleaved, and the **spread** is the lowest and highest estimate of a single round: how
# much the headline would move if we ran the notebook again.
#
# **Choosing K honestly.** Picking the best of `K_MAX` noisy medians and reporting it on the same
# prompts overstates the speedup: the maximum collects the luckiest noise (the winner's curse). So the
# best `K` is chosen on `N_PILOT` pilot prompts, and reported on `N_PROMPTS` disjoint ones.
#
# The loop records what each step cost, so `c` and `v(K)` are also measured **inside** these runs:
# `c` = median drafting time per drafted token over AR's median step, `v(K)` = SD's median verify step
# (K + 1 tokens, acceptance and commit included) over AR's median step. These, not the bare passes of
# section 1, are the costs the speedup actually paid. Greedy runs double as the level-3 check: every
# greedy SD output must equal AR's token for token.
#
# **Reading the figure.** One panel per mode; the x axis is K, the y axis the speedup over AR with the
# same target, and the black horizontal line at 1 is break-even (below it, speculation is slower).
#
# * *Circles with error bars*: the measured speedup (median over the reported prompts) with its 95%
#   bootstrap interval over prompts — the uncertainty from which prompts happened to be drawn.
# * *Shaded band*: the lowest and highest estimate from a single round (min–max) — how much a rerun on
#   the same prompts moves the number, i.e. machine noise.
# * *Squares on a dashed line*: the analytic model with the per-token acceptance, `c` and `v(K)`
#   measured in these runs. *Grey dotted line*: the same acceptance with section 1's bare-pass `c`
#   and `v(K)`.
# * *Red ring*: the K chosen on the pilot prompts, drawn at its speedup on the reported prompts.
#
# **What to look for.** Does the measured curve follow the in-loop analytic one? If it does, `a`, `c`
# and `v(K)` account for the speed; a persistent gap is time the model leaves out (the prompt's
# prefill, Python between calls), and the table's `measured_over_predicted` column sizes it. How far
# does the grey curve sit from both? That distance is what a microbenchmark would have got wrong.
# Where is the top, and how flat is it? Where the intervals of neighbouring K overlap, the data cannot
# tell them apart. Does the red ring sit near the top of the reported curve? The pilot set is small, so
# it need not; the ring, not the top, is the honest headline. In the table, the measured
# `tokens_per_call` counts the prefill pass as a call, so it sits slightly below
# `predicted_tokens_per_call` even when the model is right.
#
# **What would count as failure:** intervals below 1 at every K (speculation does not pay for this
# pair on this machine); a measured curve that departs from the in-loop prediction by more than its
# intervals and keeps doing so with more prompts (a cost the model does not see); or a band wider
# than the differences between K (too noisy to conclude anything: raise `ROUNDS`).


# %%
def timed_runs():
    frames = []
    for mode, s in [("greedy", GREEDY), ("temperature 1", T1)]:
        methods = bench.chain_methods(target, draft, KS, MAX_NEW_TOKENS, s, seed=SEED)
        for split, ps, rounds in [("pilot", pilot_prompts, 1), ("report", report_prompts, ROUNDS)]:
            r = bench.paired_runs(ps, methods, rounds=rounds, progress=tqdm)
            frames.append(r.assign(mode=mode, split=split))
    runs = pd.concat(frames, ignore_index=True)
    runs["K"] = runs.method.str.extract(r"K=(\d+)", expand=False).fillna(0).astype(int)
    return runs.assign(**meta)


runs = study.step(
    "runs", timed_runs, uses=["TARGET", "DRAFT", "K_MAX", "ROUNDS", "THREADS", "MAX_NEW_TOKENS", "SEED"] + PROMPT_PARAMS
)


def speed_table(mode, split):
    t = bench.speedup_table(runs[(runs["mode"] == mode) & (runs.split == split)], seed=SEED)
    t["K"] = t.method.str.extract(r"K=(\d+)", expand=False).astype(int)
    # the analytic model with the per-token acceptance and the costs measured in these runs (and, for
    # comparison, with the bare-pass costs of section 1)
    t["predicted"] = [bench.predicted_speedup(r.token_acceptance, r.K, r.c, r.v) for r in t.itertuples()]
    t["v_bare"] = t.K.map(prof["v"])
    t["predicted_bare"] = [
        bench.predicted_speedup(r.token_acceptance, r.K, prof["c"], r.v_bare) for r in t.itertuples()
    ]
    t["predicted_tokens_per_call"] = [bench.expected_tokens(r.token_acceptance, r.K) for r in t.itertuples()]
    return t.assign(mode=mode, split=split)


speed = pd.concat(
    [speed_table(m, sp) for m in ["greedy", "temperature 1"] for sp in ["pilot", "report"]], ignore_index=True
)
speed["measured_over_predicted"] = speed.speedup / speed.predicted
pilot_best = speed[speed.split == "pilot"].loc[lambda d: d.groupby("mode").speedup.idxmax()][["mode", "K"]]
speed["chosen"] = False
for r in pilot_best.itertuples():
    speed.loc[(speed["mode"] == r.mode) & (speed.K == r.K), "chosen"] = True
results.save(speed.assign(**meta), f"{NB}/speedup")
report = speed[speed.split == "report"]
best = report[report.chosen].set_index("mode")
display(report.drop(columns=["method", "split"]).round(3))

fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
for ax, mode in zip(axes, ["greedy", "temperature 1"]):
    g = report[report["mode"] == mode]
    ax.fill_between(g.K, g.spread_lo, g.spread_hi, color="C0", alpha=0.15, label="single rounds (min–max)")
    ax.errorbar(
        g.K,
        g.speedup,
        yerr=[g.speedup - g.lo, g.hi - g.speedup],
        marker="o",
        capsize=3,
        label="measured (median, 95% CI)",
    )
    ax.plot(g.K, g.predicted, "s--", label="analytic, in-loop c and v(K)")
    ax.plot(g.K, g.predicted_bare, ":", color="grey", label="analytic, bare-pass c and v(K)")
    b = best.loc[mode]
    ax.scatter(
        [b.K],
        [b.speedup],
        s=200,
        facecolors="none",
        edgecolors="C3",
        lw=2,
        label=f"K chosen on the pilot = {int(b.K)}",
        zorder=3,
    )
    ax.axhline(1, color="k", lw=0.8)
    ax.set(xlabel="draft length K", title=f"{mode} ({len(report_prompts)} reported prompts x {ROUNDS} rounds)")
axes[0].set_ylabel("speedup over AR (same target)")
axes[0].legend(fontsize=7)
savefig(fig, f"{NB}_speedup")
plt.show()
g, t = best.loc["greedy"], best.loc["temperature 1"]
top_k = report.loc[report.groupby("mode").speedup.idxmax()].set_index("mode")
argmax_k = top_k.K


def versus_top(mode):
    """The reported prompts' highest median against the pilot's K, in words, judged by their two intervals."""
    c, m = best.loc[mode], top_k.loc[mode]
    if int(m.K) == int(c.K):
        return f"at the chosen K = {int(c.K)}"
    words = f"at K = {int(m.K)} ({m.speedup:.2f}x, CI {m.lo:.2f}–{m.hi:.2f}, against {c.speedup:.2f}x at the chosen K)"
    if not np.isfinite([m.lo, m.hi, c.lo, c.hi]).all():
        return words + ", without intervals to compare"
    return words + (
        ", the two intervals overlapping: the data cannot tell the two K apart"
        if m.lo <= c.hi and c.lo <= m.hi
        else ", the two intervals apart: the pilot's choice cost speed that noise does not explain"
    )


display(
    Markdown(
        f"Greedy, at the K chosen on the pilot prompts (**K = {int(g.K)}**): **{g.speedup:.2f}x** (95% CI {g.lo:.2f}–{g.hi:.2f}; "
        f"total-time ratio {g.total_ratio:.2f}x; single rounds {g.spread_lo:.2f}–{g.spread_hi:.2f}), acceptance rate "
        f"{g.acceptance:.3f}, per-token acceptance {g.token_acceptance:.3f}, {g.tokens_per_call:.2f} tokens per target call. "
        f"Inside these runs c = {g.c:.3f} and v({int(g.K)}) = {g.v:.2f} (bare passes, section 1: c = {prof['c']:.3f}, "
        f"v = {g.v_bare:.2f}); the analytic model with the in-loop costs predicts {g.predicted:.2f}x (measured/predicted "
        f"{g.measured_over_predicted:.2f}). Temperature 1 at K = {int(t.K)}: **{t.speedup:.2f}x** (CI {t.lo:.2f}–{t.hi:.2f}; "
        f"single rounds {t.spread_lo:.2f}–{t.spread_hi:.2f}). On the reported prompts themselves the highest greedy median sits "
        f"{versus_top('greedy')}; the highest at temperature 1 {versus_top('temperature 1')}."
    )
)

# %% [markdown]
# ### Acceptance profile
# **Why.** The analytic model assumes one per-token acceptance `a` at every draft position. This
# checks that assumption, and separates the two numbers that are both called "acceptance".
#
# Acceptance rate α(K) = accepted / drafted tokens, and the per-position rate: how often the draft's
# i-th token is accepted given that every token before it was. The dotted line is what a *constant*
# per-token acceptance `a` predicts for the rate, `(a − a^{K+1}) / ((1 − a)·K)`
# ([the analytic model](../docs/analytic_model.md)): if it tracks the measured rate, the fall with K
# is a truncation effect of the rule — every token after the first rejection counts as a failure —
# not the draft getting worse further out. The per-token acceptance (accepted / reached positions) is
# the maximum-likelihood estimate of `a` under that model, and the number that belongs in `E`; putting
# the rate into `E` instead would under-predict the speedup at large K.
#
# **Reading the figure.** Left: the measured acceptance rate against K for each mode (circles) and,
# dotted in the same colour, the constant-`a` prediction with that mode's per-token acceptance
# averaged over K. Right: at `K = K_MAX`, P(accept | reached) at each draft position. A flat line means
# the constant-`a` model holds. A falling one means the draft's guesses further out are worse even when
# everything before them was right. A rising one is possible too: reaching a deep position means the
# text has been predictable so far, and predictable stretches (boilerplate, a repeated identifier)
# tend to stay predictable — a selection effect. Deep positions are reached less often, so their rates
# rest on fewer counts and wobble more. This is a check of the model, not a pass/fail test: if the
# dotted line misses, per-position rates, not a single `a`, describe the pair.

# %%
sd_runs = runs[(runs.split == "report") & (runs.K > 0)]
pos_rows = []
for (mode, k), g in sd_runs.groupby(["mode", "K"]):
    reached, accepted = bench.position_totals(g, k)
    pos_rows += [
        dict(mode=mode, K=k, position=i + 1, reached=int(reached[i]), accepted=int(accepted[i]))
        for i in range(len(reached))
    ]
pos = pd.DataFrame(pos_rows)
pos["rate"] = pos.accepted / pos.reached.clip(lower=1)
results.save(pos.assign(**meta), f"{NB}/positions")
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
for i, (mode, g) in enumerate(report.groupby("mode", sort=False)):
    axes[0].plot(g.K, g.acceptance, "o-", color=f"C{i}", label=f"speclib, {mode}")
    a_tok = g.token_acceptance.mean()
    axes[0].plot(
        g.K,
        (a_tok - a_tok ** (g.K + 1)) / ((1 - a_tok) * g.K),
        ":",
        color=f"C{i}",
        label=f"constant per-token a = {a_tok:.2f}",
    )
axes[0].set(xlabel="draft length K", ylabel="acceptance rate α(K)", ylim=(0, 1), title="Acceptance vs K")
axes[0].legend(fontsize=8)
kk = K_MAX
for mode, g in pos[pos.K == kk].groupby("mode", sort=False):
    axes[1].plot(g.position, g.rate, "o-", label=mode)
axes[1].set(
    xlabel=f"draft position (K = {kk})", ylabel="P(accept | reached)", ylim=(0, 1), title="Per-position acceptance"
)
axes[1].legend(fontsize=8)
savefig(fig, f"{NB}_acceptance")
plt.show()
a = report.set_index(["mode", "K"]).acceptance
rates = pos[(pos.K == kk) & (pos["mode"] == "greedy")].rate.to_numpy()
display(
    Markdown(
        f"Greedy acceptance falls from {a['greedy', 1]:.3f} at K = 1 to {a['greedy', K_MAX]:.3f} at K = {K_MAX}; "
        f"at temperature 1 from {a['temperature 1', 1]:.3f} to {a['temperature 1', K_MAX]:.3f}. The per-token "
        f"acceptance stays between {report.token_acceptance.min():.3f} and {report.token_acceptance.max():.3f} over every K "
        f"and mode. Per position (K = {kk}, greedy) the rate runs "
        f"{', '.join(f'{r:.2f}' for r in rates)}: "
        + (
            "within 0.15 of each other, so a constant per-token acceptance is a fair model of this pair."
            if np.ptp(rates) <= 0.15
            else f"a range of {np.ptp(rates):.2f}, so the i.i.d. model is only a first approximation for this pair."
        )
    )
)

# %% [markdown]
# ## 5 · Level 3: greedy identity, and `transformers` as a peer
#
# **Why.** At temperature 0 the rule is deterministic: accept while the draft's token equals the
# target's top token, and at the first mismatch emit the target's top token. So greedy SD must
# reproduce greedy AR *token for token*. This is the strictest check of the code path: an off-by-one
# in a cache, a wrong position or a bad commit changes a token, and usually everything after it.
# Level 2 could miss a small distortion; at temperature 0 this check cannot.
#
# **Three identities.**
#
# 1. speclib SD = speclib AR, at every K, on every reported prompt and round (section 4's greedy runs);
# 2. speclib AR = `transformers` `generate(do_sample=False)`: speclib's own Llama forward and
#    preallocated cache, checked against the stock implementation;
# 3. `transformers` assisted generation = AR: the peer is exact too, so the speed comparison below
#    compares like with like.
#
# **What would count as failure:** any count below its total. One caveat: identity assumes the
# (K + 1)-token verify pass computes the same logits as one-token passes. Sums taken in a different
# order can differ in the last bits and flip the top token at a near-tie. In float32 that is rare; in
# bf16 (the default on a GPU) and on quantized runtimes the differences are larger and flips more
# likely (notebook 05, sections 1 and 5). A mismatch is a bug unless it is traced to such a tie.
#
# **The speed comparison.** We also run `transformers` assisted generation (`assistant_model=`,
# constant K, confidence threshold off so it drafts exactly K tokens like speclib instead of stopping
# when the draft is unsure) on the same pair and reported prompts, paired with speclib's SD at each K
# in the same blocks, and compare their speed with the same estimator (speclib's speed over
# transformers', per prompt). Same tokens, same weights, same algorithm: any difference in speed is
# per-call overhead of the implementations, which weighs most on a tiny draft whose passes are short.
#
# **The figure.** The x axis is K, the y axis speclib's speed over `transformers`' (median over
# prompts, 95% bootstrap interval); the line at 1 is parity, above it speclib is faster. Look at
# whether the interval excludes 1, and whether the ratio drifts with K: changing K shifts work
# between draft calls and target calls, whose overheads differ between the two implementations.


# %%
def transformers_generate():
    rows = []
    for i, ids in enumerate(tqdm(report_prompts, desc="transformers generate")):
        ar_tokens = generate(target, ids, MAX_NEW_TOKENS, sampling=GREEDY).tokens
        with torch.inference_mode():
            plain = target.model.generate(
                torch.tensor([ids], device=target.device),
                do_sample=False,
                max_new_tokens=len(ar_tokens),
                pad_token_id=target.eos_token_id,
            )
        rows.append(dict(prompt=i, tokens=len(ar_tokens), identical=plain[0, len(ids) :].tolist() == ar_tokens))
    return pd.DataFrame(rows).assign(**meta)


def assisted_runs():
    hf = bench.paired_runs(
        report_prompts,
        bench.chain_methods(target, draft, KS, MAX_NEW_TOKENS, GREEDY, SEED, assisted=True),
        progress=tqdm,
    )
    hf["K"] = hf.method.str.extract(r"K=(\d+)", expand=False).fillna(0).astype(int)
    return hf.assign(**meta)


plain_ok = study.step(
    "transformers_generate", transformers_generate, uses=["TARGET", "MAX_NEW_TOKENS"] + PROMPT_PARAMS
).identical
hf = study.step(
    "assisted", assisted_runs, uses=["TARGET", "DRAFT", "K_MAX", "THREADS", "MAX_NEW_TOKENS", "SEED"] + PROMPT_PARAMS
)
ratio = pd.DataFrame([dict(K=k, **bench.speedup(hf, f"SD K={k}", reference=f"assisted K={k}", seed=SEED)) for k in KS])
greedy_sd = runs[(runs["mode"] == "greedy") & (runs.K > 0)]
assisted = hf[hf.method.str.startswith("assisted")]
identity = pd.DataFrame(
    [
        dict(
            check="speclib SD = AR (greedy, every K)",
            identical=int(greedy_sd.same_as_reference.sum()),
            of=len(greedy_sd),
        ),
        dict(check="AR = transformers generate(do_sample=False)", identical=int(sum(plain_ok)), of=len(plain_ok)),
        dict(
            check="transformers assisted = AR (every K)",
            identical=int(assisted.same_as_reference.sum()),
            of=len(assisted),
        ),
    ]
).assign(**meta)
results.save(identity, f"{NB}/identity")
results.save(ratio.assign(**meta), f"{NB}/assisted_ratio")
display(identity.drop(columns=list(meta)))

fig, ax = plt.subplots(figsize=(6.4, 3.6))
ax.errorbar(ratio.K, ratio.speedup, yerr=[ratio.speedup - ratio.lo, ratio.hi - ratio.speedup], marker="o", capsize=3)
ax.axhline(1, color="k", lw=0.8)
ax.set(
    xlabel="draft length K",
    ylabel="speclib speed / transformers speed",
    title="speclib vs transformers assisted generation (greedy)",
)
savefig(fig, f"{NB}_assisted")
plt.show()
rk = ratio.set_index("K")
bk = int(best.loc["greedy"].K)
display(
    Markdown(
        f"{identity.identical[0]}/{identity.of[0]} greedy SD runs equal AR; {identity.identical[1]}/{identity.of[1]} prompts "
        f"agree with `transformers` greedy generate; {identity.identical[2]}/{identity.of[2]} assisted runs equal AR. "
        f"At the chosen K = {bk}, speclib is **{rk.speedup[bk]:.2f}x** as fast as `transformers` assisted generation "
        f"(95% CI {rk.lo[bk]:.2f}–{rk.hi[bk]:.2f}"
        + (
            ", an interval that holds 1: not distinguishable from it"
            if rk.lo[bk] <= 1 <= rk.hi[bk]
            else ", the whole interval above 1: faster"
            if rk.lo[bk] > 1
            else ", the whole interval below 1: slower"
        )
        + f"); across K the ratio spans {ratio.speedup.min():.2f}–{ratio.speedup.max():.2f}, reliably above 1 at "
        f"{int((ratio.lo > 1).sum())} and reliably below 1 at {int((ratio.hi < 1).sum())} of {len(ratio)} K. "
        f"Both decode the same tokens with the same weights, so a gap lies in what each call costs besides the arithmetic "
        f"(speclib's own Llama forward and preallocated cache against the stock forward and its generation machinery); "
        f"this notebook does not time those parts apart."
    )
)

# %% [markdown]
# ## 6 · What limits the speedup
# Each iteration costs `K·c + v(K)` target-token units and yields `E = (1 − a^{K+1}) / (1 − a)` tokens
# (a: per-token acceptance). Two questions remain after section 4: where does the measured time
# actually go, and how much could a better draft, one with higher acceptance, still buy?
#
# **How.** For SD at each K, the drafting time (`draft_s`), verification time (`verify_s`) and total
# time (`seconds`) are summed over the reported greedy runs and divided by the total time AR took on
# the same prompts. `seconds_over_ar` is SD's time as a fraction of AR's — the inverse of section 4's
# total-time ratio, since greedy SD and AR emit the same tokens — split into drafting, verification
# and `overhead_over_ar`, the rest: the prompt's prefill and the loop's own bookkeeping.
#
# **The ceiling.** With perfect acceptance (`a = 1`), `E = K + 1`, so no draft, however good, can beat
# `(K + 1) / (K·c + v(K))` at this K with these costs. If the measured speedup is close to that
# ceiling, acceptance is not what holds it back; if it is far below, a draft aligned more closely with
# the target (the shipped `code-draft` is already distilled from `code-target`) would still pay.
#
# **Reading the table.** A large drafting fraction points at `c`: a smaller or faster draft. A large
# verification fraction that grows with K points at `v(K)`: hardware or a runtime on which a wider
# pass is nearly free. A large overhead points at the loop itself. The text cell below the table
# states the ceiling at the chosen K.

# %%
gr = runs[(runs["mode"] == "greedy") & (runs.split == "report")]
g = gr[gr.K > 0].groupby("K")[["draft_s", "verify_s", "seconds"]].sum()
limits = (g / gr[gr.K == 0].seconds.sum()).rename(columns=lambda c: c + "_over_ar").reset_index()
limits = limits.merge(
    report[report["mode"] == "greedy"][["K", "acceptance", "token_acceptance", "c", "v", "predicted", "speedup"]],
    on="K",
)
limits["overhead_over_ar"] = limits.seconds_over_ar - limits.draft_s_over_ar - limits.verify_s_over_ar
results.save(limits.assign(**meta), f"{NB}/limits")
display(limits.round(3))
bl = limits.set_index("K").loc[bk]
display(
    Markdown(
        f"At K = {bk} drafting takes {bl.draft_s_over_ar:.2f} and verification {bl.verify_s_over_ar:.2f} of the AR run's time "
        f"(the rest, {bl.overhead_over_ar:.2f}, is prefill and bookkeeping). With c = {bl.c:.3f} and v = {bl.v:.2f}, "
        f"even perfect acceptance would give at most {(bk + 1) / (bk * bl.c + bl.v):.2f}x at this K: the draft's cost "
        f"and the verify pass's growth with K, not acceptance alone, cap the speedup on this machine."
    )
)

# %% [markdown]
# ## 7 · Feature-level drafting: a head on the target's own features
# A separate draft model has to rediscover, from tokens alone, what the target is about to say. An
# EAGLE-style **feature head** instead reads what the target has already computed: at each position,
# the target's hidden states at a low, a middle and the top layer (fused by one linear map), together
# with the embedding of the next token, go through **one** decoder layer, and the target's own frozen
# final norm and LM head turn the result into a distribution. For the second and later draft tokens the
# head feeds its own output state in place of the target's feature, the way it was trained (unrolled
# over several steps, `python -m speclib train head TARGET`). The maths, the training objective and why
# the output stays exactly the target's: [docs/feature_drafting.md](../docs/feature_drafting.md).
#
# **What is compared.** On the same pilot and reported prompts as section 4, back to back with AR:
# the separate draft at section 4's pilot-chosen K; the head drafting chains of K = 1..K_MAX; and the
# head drafting EAGLE-2 dynamic trees (each level expands the nodes with the highest product of draft
# probabilities, at most `HEAD_TOP` children each, under a node budget) at the (depth, budget) pairs
# of `HEAD_TREES`. The configuration is chosen on the pilot prompts and reported on the others. AR
# runs on a copy of the target that records no features, so it pays nothing for the head's inputs; the
# head's target records the three feature layers it reads (a few percent of a step, measured here as
# part of `v`).
#
# **Checks as for the separate draft.** Every greedy run must equal AR token for token, and a run-level
# permutation chi-square test at temperature 1 compares AR with head-drafted SD over `CHI2_TOKENS`
# tokens each (the same test and calibration as section 3: under the null it rejects at its nominal
# 5%).
#
# **Reading the figure.** Left: speedup over AR against K for the head's chains (circles, 95% CI over
# prompts, band = single rounds) beside the separate draft at its chosen K (dashed line) and the trees
# (squares, placed at their depth). Middle: per-position acceptance P(accept | reached) at K = K_MAX,
# head vs separate draft — the head's advantage, if any, is here. Right: where the time goes at each
# method's chosen configuration: drafting, verification and the rest, as fractions of AR's time.

# %%
from speclib import FeatureDrafter, load_head

head = load_head(HEAD)
target_f = speclib.load(TARGET, device=DEVICE)  # the head's target: records features; AR's does not
sep_k = int(best.loc["greedy"].K)  # section 4's pilot-chosen K for the separate draft
tree_cfgs = [tuple(t) for t in HEAD_TREES]


def head_methods(sampling, chains, trees):
    def method(lm, d=None):
        return bench.Method(lm, MAX_NEW_TOKENS, d, sampling, seed=SEED)

    m = {"AR": method(target), f"separate K={sep_k}": method(target, ModelDrafter(draft, sep_k))}
    for k in chains:
        m[f"head K={k}"] = method(target_f, FeatureDrafter(target_f, head, k=k))
    for depth, budget in trees:
        m[f"head tree d={depth} n={budget}"] = method(
            target_f, FeatureDrafter(target_f, head, k=depth, tree=budget, top=HEAD_TOP)
        )
    return m


def head_runs():
    frames = []
    for split, ps, rounds in [("pilot", pilot_prompts, 1), ("report", report_prompts, ROUNDS)]:
        r = bench.paired_runs(ps, head_methods(GREEDY, KS, tree_cfgs), rounds=rounds, progress=tqdm)
        frames.append(r.assign(mode="greedy", split=split))
    pilot = bench.speedup_table(frames[0], seed=SEED)
    chosen = pilot[pilot.method.str.startswith("head")].sort_values("speedup").method.iloc[-1]
    # temperature 1 at the greedy pilot's choice among chains (a tree's siblings are drawn without replacement)
    chain_k = int(pilot[pilot.method.str.match(r"head K=\d+$")].sort_values("speedup").method.iloc[-1].split("=")[1])
    r = bench.paired_runs(report_prompts, head_methods(T1, [chain_k], []), rounds=ROUNDS, progress=tqdm)
    frames.append(r.assign(mode="temperature 1", split="report"))
    return pd.concat(frames, ignore_index=True).assign(chosen=chosen, chosen_chain=chain_k, **meta)


def head_chi2():
    ar_runs, sd_runs = sample_pairs(
        T1, CHI2_TOKENS, SEED * 10**6 + 7, lambda: FeatureDrafter(target_f, head, k=CHI2_K), target_f
    )
    r = stats.run_permutation_test(ar_runs, sd_runs, n_perm=999, paired=True, seed=SEED)
    return pd.DataFrame(
        [
            dict(
                setting="temperature 1",
                method="feature head",
                chi2=r.chi2,
                dof=r.dof,
                p=r.p_asymptotic,
                p_permutation=r.p_permutation,
                tokens_ar=r.n_a,
                tokens_sd=r.n_b,
                runs=len(ar_runs),
            )
        ]
    ).assign(**meta)


HEAD_USES = [
    "TARGET",
    "DRAFT",
    "HEAD",
    "HEAD_TREES",
    "HEAD_TOP",
    "K_MAX",
    "ROUNDS",
    "THREADS",
    "MAX_NEW_TOKENS",
    "SEED",
]
hruns = study.step("head_runs", head_runs, uses=HEAD_USES + PROMPT_PARAMS)
hchi = study.step("head_chi2", head_chi2, uses=["SEED", "CHI2_TOKENS", "CHI2_K", "TARGET", "HEAD"] + PROMPT_PARAMS)
chosen, chain_k = hruns.chosen.iloc[0], int(hruns.chosen_chain.iloc[0])


def head_table(mode, split):
    t = bench.speedup_table(hruns[(hruns["mode"] == mode) & (hruns.split == split)], seed=SEED)
    t["kind"] = np.where(
        t.method.str.contains("tree"), "head tree", np.where(t.method.str.startswith("head"), "head chain", "separate")
    )
    t["depth"] = t.method.str.extract(r"(?:K|d)=(\d+)", expand=False).astype(int)
    t["budget"] = t.method.str.extract(r"n=(\d+)", expand=False).astype(float)
    return t.assign(mode=mode, split=split)


hspeed = pd.concat(
    [head_table("greedy", "pilot"), head_table("greedy", "report"), head_table("temperature 1", "report")],
    ignore_index=True,
)
results.save(hspeed.assign(**meta), f"{NB}/head_speedup")
hrep = hspeed[(hspeed.split == "report") & (hspeed["mode"] == "greedy")].set_index("method")
display(hspeed.drop(columns=["split"]).round(3))

greedy_rep = hruns[(hruns["mode"] == "greedy") & (hruns.split == "report")]
fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
ch = hrep[hrep.kind == "head chain"].sort_values("depth")
axes[0].fill_between(ch.depth, ch.spread_lo, ch.spread_hi, color="C1", alpha=0.15)
axes[0].errorbar(
    ch.depth,
    ch.speedup,
    yerr=[ch.speedup - ch.lo, ch.hi - ch.speedup],
    marker="o",
    capsize=3,
    color="C1",
    label="feature head, chain",
)
tr = hrep[hrep.kind == "head tree"]
axes[0].errorbar(
    tr.depth + 0.1,
    tr.speedup,
    yerr=[tr.speedup - tr.lo, tr.hi - tr.speedup],
    fmt="s",
    capsize=3,
    color="C2",
    label="feature head, tree (at its depth)",
)
for r in tr.itertuples():
    axes[0].annotate(f"n={int(r.budget)}", (r.depth + 0.15, r.speedup), fontsize=7)
sep = hrep[hrep.kind == "separate"].iloc[0]
axes[0].axhline(sep.speedup, color="C0", ls="--", label=f"separate draft, K = {sep_k}")
axes[0].axhline(1, color="k", lw=0.8)
axes[0].set(
    xlabel="draft depth K",
    ylabel="speedup over AR (greedy)",
    title=f"{len(report_prompts)} reported prompts x {ROUNDS} rounds",
)
axes[0].legend(fontsize=7)
for name, color in [(f"head K={K_MAX}", "C1"), (f"separate K={sep_k}", "C0")]:
    g = greedy_rep[greedy_rep.method == name]
    if len(g):
        reached, accepted = bench.position_totals(g, int(name.split("=")[1]))
        axes[1].plot(
            np.arange(1, len(reached) + 1), accepted / np.clip(reached, 1, None), "o-", color=color, label=name
        )
axes[1].set(
    xlabel="draft position", ylabel="P(accept | reached)", ylim=(0, 1), title="Per-position acceptance (greedy)"
)
axes[1].legend(fontsize=8)
ar_s = greedy_rep[greedy_rep.method == "AR"].seconds.sum()
parts = []
for name in [f"separate K={sep_k}", chosen, f"head K={chain_k}"]:
    g = greedy_rep[greedy_rep.method == name]
    parts.append(
        dict(
            method=name,
            drafting=g.draft_s.sum() / ar_s,
            verification=g.verify_s.sum() / ar_s,
            rest=(g.seconds.sum() - g.draft_s.sum() - g.verify_s.sum()) / ar_s,
        )
    )
parts = pd.DataFrame(parts).drop_duplicates("method").set_index("method")
parts.plot.barh(stacked=True, ax=axes[2], color=["C1", "C0", "C7"])
axes[2].axvline(1, color="k", lw=0.8)
axes[2].set(xlabel="time / AR's time (greedy, reported prompts)", ylabel="", title="Where the time goes")
axes[2].legend(fontsize=7)
savefig(fig, f"{NB}_head")
plt.show()

c_best, t1 = (
    hrep.loc[chosen],
    hspeed[(hspeed["mode"] == "temperature 1") & (hspeed.method == f"head K={chain_k}")].iloc[0],
)
identical = hruns[(hruns["mode"] == "greedy") & (hruns.method != "AR")]
chi_h = hchi.iloc[0]
display(
    Markdown(
        f"Chosen on the pilot prompts: **{chosen}**. On the reported prompts it runs at **{c_best.speedup:.2f}x** over AR "
        f"(95% CI {c_best.lo:.2f}–{c_best.hi:.2f}; total-time ratio {c_best.total_ratio:.2f}x; single rounds "
        f"{c_best.spread_lo:.2f}–{c_best.spread_hi:.2f}), per-token acceptance {c_best.token_acceptance:.3f}, "
        f"{c_best.tokens_per_call:.2f} tokens per target call, c = {c_best.c:.3f} per drafted token and v = {c_best.v:.2f}; "
        f"the separate draft at K = {sep_k}: {sep.speedup:.2f}x (CI {sep.lo:.2f}–{sep.hi:.2f}), per-token acceptance "
        f"{sep.token_acceptance:.3f}, c = {sep.c:.3f}. At temperature 1 the head's chain at K = {chain_k} runs at "
        f"{t1.speedup:.2f}x (CI {t1.lo:.2f}–{t1.hi:.2f}). Greedy head SD equals AR on "
        f"{int(identical.same_as_reference.sum())}/{len(identical)} runs; AR vs head SD at temperature 1: χ² = {chi_h.chi2:.1f}, "
        f"dof = {chi_h.dof}, permutation p = {chi_h.p_permutation:.3f} over {chi_h.tokens_ar} and {chi_h.tokens_sd} tokens."
    )
)

# %% [markdown]
# **What limits the head.** Section 6's ceiling, per chain length: with perfect acceptance a chain of K
# yields K + 1 tokens per target call, so it can run at most `(K + 1) / (K·c + v(K))` times AR at the
# head's measured c, and `(K + 1) / v(K)` even for a draft that costs nothing. Inverting the analytic
# model (`analytic.acceptance_needed`) gives the i.i.d. per-token acceptance a chain of K would need, at
# the head's c and the measured v(K), to reach 2x and 2.5x (blank: above the ceiling even at α = 1).
# Beside them, what the head earned: its per-token acceptance, tokens per call and speedup.

# %%
from speclib.core.analytic import acceptance_needed, predicted_speedup

ceil = hrep[hrep.kind == "head chain"].sort_values("depth")
ceil = ceil.assign(
    ceiling_at_c=(ceil.depth + 1) / (ceil.depth * ceil.c + ceil.v),
    ceiling_free=(ceil.depth + 1) / ceil.v,
    alpha_for_2x=[acceptance_needed(2.0, int(r.depth), r.c, r.v) for r in ceil.itertuples()],
    alpha_for_2_5x=[acceptance_needed(2.5, int(r.depth), r.c, r.v) for r in ceil.itertuples()],
)
results.save(ceil.assign(**meta), f"{NB}/head_ceiling")
display(
    ceil[
        [
            "depth",
            "token_acceptance",
            "tokens_per_call",
            "c",
            "v",
            "speedup",
            "ceiling_at_c",
            "ceiling_free",
            "alpha_for_2x",
            "alpha_for_2_5x",
        ]
    ].round(3)
)
cb = ceil.loc[f"head K={chain_k}"]
free_at_alpha = max(predicted_speedup(r.token_acceptance, int(r.depth), 0.0, r.v) for r in ceil.itertuples())
best2 = ceil.loc[ceil.alpha_for_2x.idxmin()] if ceil.alpha_for_2x.notna().any() else None
display(
    Markdown(
        f"At its chosen K = {chain_k} the head reaches {cb.speedup:.2f}x of a {cb.ceiling_at_c:.2f}x ceiling at its own "
        f"c = {cb.c:.3f}, with {cb.tokens_per_call:.2f} of {chain_k + 1} possible tokens per call (per-token acceptance "
        f"{cb.token_acceptance:.3f}; the per-position curve above shows where it drops). Verifying K + 1 tokens costs "
        f"v(K) = " + ", ".join(f"{r.v:.2f}" for r in ceil.itertuples()) + f" single-token passes for K = "
        f"{int(ceil.depth.min())}..{int(ceil.depth.max())} on this CPU, so short chains cap low (K = 2: at most "
        f"{ceil.set_index('depth').ceiling_at_c.get(2, float('nan')):.2f}x at the head's c) and long ones need nearly "
        f"every token right: "
        + (
            f"2x needs a per-token acceptance of at least {best2.alpha_for_2x:.3f} (at K = {int(best2.depth)}), "
            if best2 is not None
            else "2x is above every chain's ceiling, "
        )
        + f"against the head's {ceil.token_acceptance.max():.3f} at best. A free head (c = 0) at the acceptance it has "
        f"would give at most {free_at_alpha:.2f}x: a cheaper pass (the head runs one decoder layer, the feature fusion "
        f"and the full LM head) buys part of the gap, and the rest takes a head that agrees with the target more often."
    )
)

# %% [markdown]
# ## 8 · Both cores: drafting while the target verifies
#
# **Why.** Every run above uses one torch thread, and in sequential speculative decoding the draft and
# the target take turns on that one core: the target idles while the draft drafts `K` tokens (`K·c`
# of every step), the draft idles while the target verifies (`v(K)`). This machine has two cores. Two
# ways to use the second: give both models **two threads** (each pass splits its arithmetic), or give
# each model **a core of its own** and let the draft run on while the target verifies (PEARL's
# post-verify). `speclib.drafters.OverlapDrafter` does the latter: the draft, in a process of its own,
# extends a *hypothesis* (every drafted token accepted, and the target's next token equal to its own
# next draft) and posts each token as soon as it has it; the decoder verifies whatever has arrived
# (waiting for `wait_for` tokens, taking at most `k`). When the hypothesis holds, the next step's draft
# tokens are already there; when it breaks, the draft starts again from the new context. It stays
# lossless (the module docstring has the argument; tests/test_overlap.py checks greedy identity and a
# chi-square against AR at temperature 1).
#
# **The timeline model** ([the overlap page](../docs/overlap.md)). With `wait_for = k`, a step costs
# `v(k) + k·c` sequentially; overlapped, a step after one whose hypothesis held (probability
# `α^(k+1)`) finds `R` tokens ready and waits only `(k − R)·c`, so the mean step costs
# `v(k) + k·c − α^(k+1)·R·c`, and no overlap can do better than remove the whole `k·c`. For the other
# settings `speclib.core.analytic.simulate_overlap` plays the timeline step by step under the same
# i.i.d. acceptance. Both leave out that two busy cores share one memory system, so each pass may slow
# down while the other core works; the runs measure that separately.
#
# **How.** On the pilot prompts, the overlapped settings `OVERLAP_SETTINGS` (`k`, `wait_for`) race
# sequential SD at section 4's greedy K; the fastest goes on. On the reported prompts, paired and
# interleaved over `ROUNDS` rounds (greedy): AR at 1 and at 2 threads, sequential SD at 1 and 2
# threads, and the chosen overlap with the draft in a process and in a thread (torch releases the GIL
# inside its kernels, but both sides' Python code takes turns). Every speedup is over the **faster AR**
# of the two. One more pass over the reported prompts records each side's busy intervals (the draft's
# calls, the decoder's waits) for the timeline figure and the busy fractions, and every step's verify
# time, whose ratio to sequential SD's at the same draft length is the contention between the cores.
#
# **What would count as failure:** a greedy output that differs from AR's; an overlapped run slower
# than sequential SD without the model or the contention explaining it; a process left running.


# %%
from speclib.core.analytic import expected_tokens, simulate_overlap
from speclib.drafters.overlap import OverlapDrafter

K_SEQ = int(best.loc["greedy"].K)  # section 4's pilot choice, greedy


def at_threads(n, run):
    """run(ids, i) with torch at n threads, restoring the count after it."""

    def timed(ids, i):
        with speclib.core.device.threads(n):
            return run(ids, i)

    return timed


def sd_run(k):
    return bench.Method(target, MAX_NEW_TOKENS, partial(ModelDrafter, draft, k))


def drafter_run(d):
    return bench.Method(target, MAX_NEW_TOKENS, d)


ar_run = bench.Method(target, MAX_NEW_TOKENS)


def overlap_runs():
    def name(k, w):
        return f"overlap k={k} w={w}"

    opened = {name(k, w): OverlapDrafter(draft, k=k, wait_for=w) for k, w in OVERLAP_SETTINGS}
    try:
        methods = {"AR": ar_run, f"SD K={K_SEQ}": sd_run(K_SEQ)} | {n: drafter_run(d) for n, d in opened.items()}
        pilot = bench.paired_runs(pilot_prompts, methods, rounds=1, progress=tqdm)
        ratios = {n: bench.speedup(pilot, n, seed=SEED)["speedup"] for n in opened}
        k, w = OVERLAP_SETTINGS[list(opened).index(max(ratios, key=ratios.get))]
        opened["thread"] = OverlapDrafter(draft, k=k, wait_for=w, backend="thread")
        chosen = opened[name(k, w)]
        methods = {
            "AR, 1 thread": ar_run,
            "AR, 2 threads": at_threads(2, ar_run),
            "SD, 1 thread": sd_run(K_SEQ),
            "SD, 2 threads": at_threads(2, sd_run(K_SEQ)),
            "overlap, process": drafter_run(chosen),
            "overlap, thread": drafter_run(opened["thread"]),
        }
        report = bench.paired_runs(report_prompts, methods, reference="AR, 1 thread", rounds=ROUNDS, progress=tqdm)
        # one more untimed-for-speed pass: both sides' intervals, and every step's verify time
        steps, busy, timeline = [], [], []
        for i, ids in enumerate(report_prompts):
            for method, run in [("SD", sd_run(k)), ("overlap", drafter_run(chosen))]:
                g = run(ids, i)
                steps += [
                    dict(prompt=i, method=method, drafted=s["drafted"], verify_s=s["verify_s"]) for s in g.stats.steps
                ]
                if method == "SD":  # one core: draft, then verify, step after step
                    t = np.cumsum([0.0] + [x for s in g.stats.steps for x in (s["draft_s"], s["verify_s"])])
                    kinds = ["draft", "verify"] * len(g.stats.steps)
                    timeline += [
                        dict(prompt=i, lane="sequential", kind=kd, start=a, end=b) for kd, a, b in zip(kinds, t, t[1:])
                    ]
                    continue
                tl = chosen.timeline()
                waits = tl["wait"]  # the decoder verifies from each wait's end to the next wait's start
                ends = [a for a, _ in waits[1:]] + [waits[-1][1] + g.stats.steps[-1]["verify_s"]]
                lanes = [("draft core", "draft", a, b) for a, b in tl["draft"]]
                lanes += [("target core", "wait", a, b) for a, b in waits]
                lanes += [("target core", "verify", b, e) for (_, b), e in zip(waits, ends)]
                t0 = waits[0][0]  # the first step, as for the sequential lane (the draft's prefill starts earlier)
                timeline += [dict(prompt=i, lane=ln, kind=kd, start=a - t0, end=b - t0) for ln, kd, a, b in lanes]
                busy.append(
                    dict(
                        prompt=i,
                        seconds=ends[-1] - t0,
                        draft_busy=sum(
                            min(b, ends[-1]) - max(a, t0) for a, b in tl["draft"] if b > t0 and a < ends[-1]
                        ),
                        target_wait=sum(b - a for a, b in waits),
                    )
                )
    finally:
        for d in opened.values():
            d.close()
    pilot["split"], report["split"] = "pilot", "report"
    return {
        "overlap_runs": pd.concat([pilot, report], ignore_index=True).assign(k=k, wait_for=w, **meta),
        "overlap_steps": pd.DataFrame(steps).assign(k=k, wait_for=w, **meta),
        "overlap_busy": pd.DataFrame(busy).assign(**meta),
        "overlap_timeline": pd.DataFrame(timeline).assign(**meta),
    }


ov = study.step(
    "overlap",
    overlap_runs,
    uses=["TARGET", "DRAFT", "K_MAX", "ROUNDS", "THREADS", "MAX_NEW_TOKENS", "SEED", "OVERLAP_SETTINGS"]
    + PROMPT_PARAMS,
)


# %% [markdown]
# **Reading the table and the figure.** The table gives each method's speedup over the faster AR
# (median over prompts of per-prompt speed ratios, 95% bootstrap interval, single-round spread) and
# its greedy identity count. The left panel draws the first steps of one reported prompt on a common
# time axis: sequential SD on its one core (draft, then verify), and the overlapped run's two cores
# (the target verifying or waiting, the draft drafting, including hypotheses that are then dropped).
# The right panel sets the measured gain of overlap over sequential SD beside the timeline model's,
# with and without the measured contention. **Look for** how much of the target core's time is still
# spent waiting, and how much of the draft core's work is thrown away.

# %%
oruns, osteps, obusy, otl = ov["overlap_runs"], ov["overlap_steps"], ov["overlap_busy"], ov["overlap_timeline"]
k_ov, w_ov = int(oruns.k.iloc[0]), int(oruns.wait_for.iloc[0])
rep = oruns[oruns.split == "report"]
pil = oruns[oruns.split == "pilot"]
ar_speed = rep.groupby("method").tokens_per_s.median()
fast_ar = max(["AR, 1 thread", "AR, 2 threads"], key=lambda m: ar_speed[m])
otable = bench.speedup_table(rep, reference=fast_ar, seed=SEED)
pilot_table = bench.speedup_table(pil, seed=SEED)[["method", "speedup", "tokens_per_call", "acceptance"]]
gain = bench.speedup(rep, "overlap, process", reference="SD, 1 thread", seed=SEED)
# the timeline model, fed with section 4's in-loop costs at every draft length and this run's acceptance
g4 = report[report["mode"] == "greedy"].set_index("K")
v_loop = [1.0] + [float(g4.v.get(n, np.nan)) for n in range(1, max(KS) + 1)]
c_loop, alpha = float(g4.c.loc[K_SEQ]), float(otable.set_index("method").token_acceptance["SD, 1 thread"])
st = osteps[osteps.drafted == k_ov].groupby("method").verify_s.median()
contention = float(st["overlap"] / st["SD"])  # a verify pass with the draft busy on the other core
seq_model = expected_tokens(alpha, K_SEQ) / (K_SEQ * c_loop + v_loop[K_SEQ])
model = {
    name: simulate_overlap(alpha, k_ov, c_loop, [x * f for x in v_loop], wait_for=w_ov, seed=SEED)["speedup"]
    / seq_model
    for name, f in [("timeline model", 1.0), ("model + contention", contention)]
}
ceiling = (K_SEQ * c_loop + v_loop[K_SEQ]) / v_loop[K_SEQ]  # no waiting at all, no token lost
fr = obusy[["seconds", "draft_busy", "target_wait"]].sum()
busy_draft, busy_target = fr.draft_busy / fr.seconds, 1 - fr.target_wait / fr.seconds
orow = otable.set_index("method")
summary = pd.DataFrame(
    [
        dict(
            quantity="gain, overlap over sequential SD (measured)", value=gain["speedup"], lo=gain["lo"], hi=gain["hi"]
        ),
        *[dict(quantity=f"gain predicted: {n}", value=x) for n, x in model.items()],
        dict(quantity="ceiling: no wait at all", value=ceiling),
        dict(quantity="contention: verify pass with the draft busy / alone", value=contention),
        dict(quantity="target core busy (overlap)", value=busy_target),
        dict(quantity="draft core busy (overlap)", value=busy_draft),
    ]
)
results.save(otable.assign(reference=fast_ar, k=k_ov, wait_for=w_ov, **meta), f"{NB}/overlap_speedup")
results.save(summary.assign(k=k_ov, wait_for=w_ov, **meta), f"{NB}/overlap_model")
display(Markdown(f"Pilot prompts, speedup over AR at one thread (chosen: k = {k_ov}, wait_for = {w_ov}):"))
display(pilot_table.round(3))
display(
    otable[["method", "speedup", "lo", "hi", "spread_lo", "spread_hi", "tokens_per_call", "identical", "runs"]].round(3)
)
display(summary.round(3))

fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 3.6), gridspec_kw=dict(width_ratios=[2.2, 1]))
p0 = otl[otl.prompt == 0]
horizon = p0[p0.lane == "sequential"].end.iloc[min(23, len(p0[p0.lane == "sequential"]) - 1)]
colours = dict(draft="C1", verify="C0", wait="lightgrey")
for y, lane in enumerate(["sequential", "target core", "draft core"]):
    for kind, g in p0[(p0.lane == lane) & (p0.start < horizon) & (p0.end > 0)].groupby("kind"):
        ax.broken_barh(list(zip(g.start * 1e3, (g.end - g.start) * 1e3)), (y - 0.35, 0.7), color=colours[kind])
ax.set(
    yticks=[0, 1, 2],
    yticklabels=["sequential SD\n(one core)", "overlap:\ntarget core", "overlap:\ndraft core"],
    xlabel="ms from the first step",
    xlim=(0, horizon * 1e3),
    title=f"first steps of a reported prompt (K = {k_ov})",
)
ax.invert_yaxis()
ax.legend(
    handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()],
    labels=["draft", "verify (+ loop)", "target waits"],
    fontsize=7,
    loc="upper right",
)
names = ["measured", *model, "ceiling"]
vals = [gain["speedup"], *model.values(), ceiling]
bx.bar(names, vals, color=["C0", "C2", "C2", "grey"])
bx.errorbar(
    [0], [gain["speedup"]], yerr=[[gain["speedup"] - gain["lo"]], [gain["hi"] - gain["speedup"]]], color="k", capsize=4
)
bx.axhline(1, color="k", lw=0.8)
bx.axhline(1.25, color="C3", lw=0.8, ls="--", label="goal 1.25x")
bx.set(ylabel="overlap / sequential SD", title="gain from the second core")
bx.tick_params(axis="x", labelrotation=20, labelsize=7)
bx.legend(fontsize=7)
savefig(fig, f"{NB}_overlap")
plt.show()

best_method = otable.loc[otable.speedup.idxmax()]
best_seq = max(["SD, 1 thread", "SD, 2 threads"], key=lambda m: orow.speedup[m])
vs_best = orow.speedup["overlap, process"] / orow.speedup[best_seq]
two_threads = orow.loc["SD, 2 threads"]
display(
    Markdown(
        f"Faster AR on the reported prompts: **{fast_ar}** (median {ar_speed[fast_ar]:.1f} tokens/s against "
        f"{ar_speed[[m for m in ('AR, 1 thread', 'AR, 2 threads') if m != fast_ar][0]]:.1f}). Over it, sequential SD at "
        f"K = {K_SEQ} reaches {orow.speedup['SD, 1 thread']:.2f}x at one thread and {two_threads.speedup:.2f}x at two; "
        f"overlapped SD (k = {k_ov}, wait_for = {w_ov}) {orow.speedup['overlap, process']:.2f}x with the draft in a "
        f"process (CI {orow.lo['overlap, process']:.2f}–{orow.hi['overlap, process']:.2f}) and "
        f"{orow.speedup['overlap, thread']:.2f}x in a thread. The fastest here is **{best_method.method}**. "
        f"Greedy outputs identical to AR: {int(otable.identical.sum())} of {int(otable.runs.sum())}. "
        f"Overlap over sequential SD, paired: **{gain['speedup']:.3f}x** (CI {gain['lo']:.3f}–{gain['hi']:.3f}), against "
        f"{model['timeline model']:.3f}x from the timeline model at this run's acceptance ({alpha:.3f}), c = {c_loop:.3f} "
        f"and v(K), and {model['model + contention']:.3f}x once each verify pass is {contention:.3f} times slower "
        f"with the draft busy beside it. Even a draft that never kept the target waiting would gain at most "
        f"{ceiling:.2f}x: drafting is {1 - 1 / ceiling:.0%} of a sequential step. The target core is busy "
        f"{busy_target:.0%} of the time and the draft core {busy_draft:.0%}. "
        + (
            "The model with contention lies inside the measured gain's interval, so within this run's noise the "
            "timeline accounts for what overlap earned: "
            if gain["lo"] <= model["model + contention"] <= gain["hi"]
            else f"The measured gain lies {'below' if gain['speedup'] < model['model + contention'] else 'above'} "
            "the model with contention by more than its interval, so something the model leaves out "
            "(the pipe between the processes, the draft's restarts, Python in the loop) "
            f"{'eats' if gain['speedup'] < model['model + contention'] else 'adds'} the difference: "
        )
        + f"a hypothesis survives a step only with probability α^(k+1) = {alpha ** (k_ov + 1):.2f}, so most steps "
        f"still wait for their draft. Against the best sequential SD ({best_seq}, {orow.speedup[best_seq]:.2f}x), "
        f"overlap reaches {vs_best:.2f} times its speedup; the goal of 1.25 times is "
        + ("met." if vs_best >= 1.25 else f"missed by {1.25 - vs_best:.2f}.")
    )
)

# %% [markdown]
# ### This run's steps
# Each expensive step above, whether this run computed it or read it from saved results (and from
# which commit), and how long it took when it was computed. A step recorded from results made before
# steps were timed shows no time.

# %%
display(study.summary())

# %% [markdown]
# ## What to take away
#
# * **Exactness is a property of the rule, not of the draft.** Any `q` yields the target's
#   distribution, provided the `q` in the acceptance ratio and the residual is the one each token was
#   drawn from. A slip as small as using the raw `q` (HF #47932) gives a visibly different
#   distribution, and a check means something only once it has caught such a control.
# * **Three levels catch three kinds of error.** Exact math checks the formula, the distribution test
#   the sampling code path, greedy identity the caches, positions and commits. None replaces the others.
# * **On generated text the independent unit is the run, not the token.** The textbook chi-square
#   p-value errs in the dangerous direction there (it rejects true nulls far too often); a run-level
#   permutation test is exact, and calibrating on AR-vs-AR splits shows which test to trust before
#   either is used.
# * **A speedup is an accounting identity with measured inputs.** `E / (K·c + v(K))`, fed with the
#   per-token acceptance and the costs measured inside the loop, is the yardstick for the measured
#   curve; the acceptance *rate* falls with K partly by truncation alone, and costs from bare passes
#   are a different input from the costs the loop pays.
# * **The best K is finite, and like any smooth maximum the curve is flat near its top**, so noise
#   decides between neighbouring K. Choose K on pilot prompts, report it on fresh ones, and quote the
#   interval over prompts and the spread over rounds beside the headline.
# * **Cost sets a ceiling that acceptance cannot lift:** `(K + 1) / (K·c + v(K))`. Section 6 shows how
#   close this run comes to it, and whether drafting, verification or overhead takes the time.
# * **A draft that reads the target's features is a different trade.** The feature head of section 7
#   costs about as much per drafted token as the small separate draft, so what it can buy is
#   acceptance, position by position; its figure shows how much, and where the time then goes.
# * **A second core buys at most the draft's share of a step**, `(K·c + v(K)) / v(K)`, and overlap
#   collects only the part of it that follows steps whose whole hypothesis held (`α^(k+1)`); section 8
#   measures how much of it this pair gets, and what two threads per pass give instead.
#
# Caveats: one seed, small models, one machine; the prompts are Python code, and acceptance and
# therefore speed are properties of the pair *on that workload*.

# %% [markdown]
# ## Exercises
#
# Each exercise reruns the notebook headlessly with changed parameters, from the repository root
# (`speclib.workbook.notebooks` refuses unknown parameter names before anything runs); in JupyterLab, change
# the parameters cell instead. A run with changed parameters writes its results and figures under
# `build/unpublished/01_baseline/<hash>/`, leaving the shipped ones in `data/results/` and `figures/`
# alone, and in the default results mode it recomputes only the steps whose parameters changed; the
# rest is read from the shipped results. `-p SMOKE True` checks a setup quickly but overrides the
# size parameters (`K_MAX`, `N_PROMPTS`, `CHI2_TOKENS`, ...), so do not combine it with them. Temperature is fixed per section
# (greedy and 1 in section 4, 1 in section 3), so it is not a parameter. Predict the outcome before
# running, then compare the generated text cells with this notebook's.
#
# 1. **Longer drafts.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/01_baseline.ipynb build/01_k.ipynb -p K_MAX 12 -p N_PROMPTS 6
#    ```
#
#    *Look for:* whether the speedup curve turns down beyond the default range and whether the in-loop
#    analytic curve still tracks it; the acceptance rate falling further while the per-token
#    acceptance stays put; the per-position panel now reaching position 12, its last points resting on
#    few counts. *Why:* `E` approaches `1/(1 − a)` and stops growing, while `K·c` and `v(K)` keep
#    growing; the rate falls by truncation. Halving the reported prompts keeps the run time in check
#    and widens the intervals: see by how much.
#
# 2. **A draft from another domain.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/01_baseline.ipynb build/01_mathdraft.ipynb -p DRAFT math-draft
#    ```
#
#    `math-draft` shares the tokenizer with `code-target` but was trained only on arithmetic problems.
#    *Look for:* sections 2, 3 and 5 still passing (exact math, calibrated p-values, identical greedy
#    outputs) while acceptance drops, the speedup shrinks (perhaps below 1) and the pilot picks a
#    smaller K. Section 1's held-out losses are now measured on different data (the math draft's on
#    arithmetic), so they no longer compare the pair. *Why:* the rule is exact for any `q`, so a poor
#    draft costs only time; acceptance is the overlap `1 − TV(p, q)` (or top-token agreement under
#    greedy), and a draft that has never seen Python overlaps little with the target on it.
#
# 3. **The draft is the target.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/01_baseline.ipynb build/01_self.ipynb -p DRAFT code-target
#    ```
#
#    *Look for:* acceptance at or next to 1 in both modes, `c` near 1, and a speedup below 1 at every K
#    (the constant-`a` curve of the acceptance figure is undefined at `a = 1` and may be missing).
#    *Why:* `E ≤ K + 1`, while the cost `K·c + v(K)` is about `K + v(K) ≥ K + 1` when `c ≈ 1`, so the
#    break-even condition `v(K) < E − K·c` fails however well the draft agrees. A draft must be cheap,
#    not just right.
#
# 4. **Two threads.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/01_baseline.ipynb build/01_threads.ipynb -p THREADS 2
#    ```
#
#    Or use `-p THREADS 0` for every CPU the process may use. *Look for:* `c` and `v(K)`, both bare and
#    in-loop; whether `v(K)` becomes bumpy or non-monotone in K; whether the speedup curve, the chosen K
#    and the round spread change. *Why:* a second thread can split the arithmetic of a wide verify
#    pass, but a one-token pass of a tiny draft is dominated by per-call overhead and may gain nothing
#    or lose to synchronisation, so `c` and `v(K)` can move in opposite directions; on a machine with
#    few cores the second thread also competes with everything else (notebook 05, section 1b).
#
# 5. **Less data for the chi-square test, finer calibration.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/01_baseline.ipynb build/01_chi2.ipynb -p CHI2_TOKENS 2300 -p N_CALIBRATION 400
#    ```
#
#    *Look for:* whether the textbook test still over-rejects the AR-vs-AR splits with a quarter of the
#    tokens, whether the permutation test stays near 5%, and how the AR-vs-SD p-values move. *Why:* the
#    textbook test's excess comes from dependence inside runs (the design effect `1 + (m − 1)·ρ` is set
#    by run length and within-run correlation, not by how many runs there are), so less data does not
#    cure it; the permutation test is valid at any size. What less data costs is power: a small
#    distortion, such as a milder cousin of the HF bug, would go unseen. More splits shrink the binomial
#    noise on the measured rejection rates.
