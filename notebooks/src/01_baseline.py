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
import torch
from IPython.display import Markdown, display

import speclib
from speclib.research.studies import baseline
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
style()
torch.manual_seed(SEED)
threads = speclib.core.device.set_threads(THREADS or None)
target, draft = speclib.load(TARGET, device=DEVICE), speclib.load(DRAFT, device=DEVICE)
dev = str(target.device)
n_all = N_PILOT + N_PROMPTS
prompts = baseline.code_prompts(target, n_all)  # stdlib and HumanEval, interleaved
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

cost_step = partial(baseline.measure_costs, target, draft, KS, LATENCY_REPEATS, meta)
saved = study.step("cost", cost_step, uses=["TARGET", "DRAFT", "K_MAX", "LATENCY_REPEATS", "THREADS"])
models, cost = saved["models"], saved["cost"]
prof = baseline.bare_profile(models, cost)  # c, v(K) of the bare passes, beside the in-loop ones of section 4
display(models[["role", "name", "parameters", "heldout_loss", "tokens_seen", "train_minutes", "latency_ms"]])
display(Markdown(baseline.cost_text(models, prof, KS)))

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

exact_step = partial(baseline.exact_math, target, draft, prompts, SEED, N_EXACT_PAIRS, meta)
saved = study.step("exact_math", exact_step, uses=["SEED", "N_EXACT_PAIRS", "TARGET", "DRAFT"] + PROMPT_PARAMS)
exact, tv = saved["exact_math"], saved["exact_tv"]
display(exact.drop(columns=list(meta)))
fig = baseline.plot_exact_math(tv)
savefig(fig, f"{NB}_exact_math")
plt.show()
display(Markdown(baseline.exact_math_text(exact, tv)))

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

chi2_step = partial(baseline.chi_square, target, draft, prompts, SEED, CHI2_TOKENS, CHI2_K, N_CALIBRATION, meta)
saved = study.step(
    "chi2", chi2_step, uses=["SEED", "CHI2_TOKENS", "CHI2_K", "N_CALIBRATION", "TARGET", "DRAFT"] + PROMPT_PARAMS
)
chi, calib = baseline.measured_chi2(saved["chi2"]), saved["calibration"]
display(chi.drop(columns=list(meta)))
fig = baseline.plot_chi2(calib, chi)
savefig(fig, f"{NB}_chi2")
plt.show()
display(Markdown(baseline.chi2_text(chi, calib)))

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

runs_step = partial(
    baseline.timed_runs, target, draft, KS, pilot_prompts, report_prompts, ROUNDS, MAX_NEW_TOKENS, SEED, meta
)
runs = study.step(
    "runs", runs_step, uses=["TARGET", "DRAFT", "K_MAX", "ROUNDS", "THREADS", "MAX_NEW_TOKENS", "SEED"] + PROMPT_PARAMS
)
speed = baseline.speed_tables(runs, prof, SEED)
results.save(speed.assign(**meta), f"{NB}/speedup")
report = speed[speed.split == "report"]
best = report[report.chosen].set_index("mode")
K_GREEDY = int(best.loc["greedy"].K)  # the pilot's greedy K: sections 5 to 8 use it
display(report.drop(columns=["method", "split"]).round(3))
fig = baseline.plot_speedup(report, best, len(report_prompts), ROUNDS)
savefig(fig, f"{NB}_speedup")
plt.show()
display(Markdown(baseline.speed_text(report, best, prof)))

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

pos = baseline.positions(runs)
results.save(pos.assign(**meta), f"{NB}/positions")
fig = baseline.plot_acceptance(report, pos, K_MAX)
savefig(fig, f"{NB}_acceptance")
plt.show()
display(Markdown(baseline.acceptance_text(report, pos, K_MAX)))

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

plain_step = partial(baseline.transformers_generate, target, report_prompts, MAX_NEW_TOKENS, meta)
plain_ok = study.step("transformers_generate", plain_step, uses=["TARGET", "MAX_NEW_TOKENS"] + PROMPT_PARAMS).identical
assisted_step = partial(baseline.assisted_runs, target, draft, KS, report_prompts, MAX_NEW_TOKENS, SEED, meta)
hf = study.step(
    "assisted", assisted_step, uses=["TARGET", "DRAFT", "K_MAX", "THREADS", "MAX_NEW_TOKENS", "SEED"] + PROMPT_PARAMS
)
ratio = baseline.assisted_ratio(hf, KS, SEED)
identity = baseline.identity_table(runs, plain_ok, hf).assign(**meta)
results.save(identity, f"{NB}/identity")
results.save(ratio.assign(**meta), f"{NB}/assisted_ratio")
display(identity.drop(columns=list(meta)))
fig = baseline.plot_assisted(ratio)
savefig(fig, f"{NB}_assisted")
plt.show()
display(Markdown(baseline.assisted_text(identity, ratio, K_GREEDY)))

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

limits = baseline.limits_table(runs, report)
results.save(limits.assign(**meta), f"{NB}/limits")
display(limits.round(3))
display(Markdown(baseline.limits_text(limits, K_GREEDY)))

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

head = speclib.load_head(HEAD)
target_f = speclib.load(TARGET, device=DEVICE)  # the head's target: records features; AR's does not
pair = baseline.HeadPair(target, target_f, draft, head, K_GREEDY, MAX_NEW_TOKENS, SEED, HEAD_TOP)
tree_cfgs = [tuple(t) for t in HEAD_TREES]
head_step = partial(baseline.head_runs, pair, KS, tree_cfgs, pilot_prompts, report_prompts, ROUNDS, meta)
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
hruns = study.step("head_runs", head_step, uses=HEAD_USES + PROMPT_PARAMS)
hchi = study.step(
    "head_chi2",
    partial(baseline.head_chi2, pair, prompts, CHI2_TOKENS, CHI2_K, meta),
    uses=["SEED", "CHI2_TOKENS", "CHI2_K", "TARGET", "HEAD"] + PROMPT_PARAMS,
)
chosen, chain_k = hruns.chosen.iloc[0], int(hruns.chosen_chain.iloc[0])
hspeed = baseline.head_tables(hruns, SEED)
results.save(hspeed.assign(**meta), f"{NB}/head_speedup")
hrep = hspeed[(hspeed.split == "report") & (hspeed["mode"] == "greedy")].set_index("method")
display(hspeed.drop(columns=["split"]).round(3))
greedy_rep = hruns[(hruns["mode"] == "greedy") & (hruns.split == "report")]
fig = baseline.plot_head(hrep, greedy_rep, K_GREEDY, K_MAX, chosen, chain_k, len(report_prompts), ROUNDS)
savefig(fig, f"{NB}_head")
plt.show()
display(Markdown(baseline.head_text(hruns, hspeed, hchi, K_GREEDY)))

# %% [markdown]
# **What limits the head.** Section 6's ceiling, per chain length: with perfect acceptance a chain of K
# yields K + 1 tokens per target call, so it can run at most `(K + 1) / (K·c + v(K))` times AR at the
# head's measured c, and `(K + 1) / v(K)` even for a draft that costs nothing. Inverting the analytic
# model (`analytic.acceptance_needed`) gives the i.i.d. per-token acceptance a chain of K would need, at
# the head's c and the measured v(K), to reach 2x and 2.5x (blank: above the ceiling even at α = 1).
# Beside them, what the head earned: its per-token acceptance, tokens per call and speedup.

# %%

ceil = baseline.head_ceiling(hrep)
results.save(ceil.assign(**meta), f"{NB}/head_ceiling")
display(ceil[baseline.CEILING_COLUMNS].round(3))
display(Markdown(baseline.ceiling_text(ceil, chain_k)))

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

overlap_step = partial(
    baseline.overlap_runs,
    target,
    draft,
    OVERLAP_SETTINGS,
    K_GREEDY,
    pilot_prompts,
    report_prompts,
    ROUNDS,
    MAX_NEW_TOKENS,
    SEED,
    meta,
)
ov = study.step(
    "overlap",
    overlap_step,
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

o = baseline.overlap_analysis(ov, report, KS, K_GREEDY, SEED)
results.save(o.table.assign(reference=o.fast_ar, k=o.k, wait_for=o.wait_for, **meta), f"{NB}/overlap_speedup")
results.save(o.summary.assign(k=o.k, wait_for=o.wait_for, **meta), f"{NB}/overlap_model")
display(Markdown(f"Pilot prompts, speedup over AR at one thread (chosen: k = {o.k}, wait_for = {o.wait_for}):"))
display(o.pilot_table.round(3))
columns = ["method", "speedup", "lo", "hi", "spread_lo", "spread_hi", "tokens_per_call", "identical", "runs"]
display(o.table[columns].round(3))
display(o.summary.round(3))
fig = baseline.plot_overlap(o)
savefig(fig, f"{NB}_overlap")
plt.show()
display(Markdown(baseline.overlap_text(o)))

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
