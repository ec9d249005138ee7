# %% [markdown]
# # 05 · Why speculation wins on one backend and loses on another
#
# **Question.** Speculative decoding assumes that verifying K + 1 tokens in one pass costs about as
# much as generating one. Whether that holds is a property of the runtime — its kernels, its
# quantization, its per-call overhead — not of the model. Given two short measurements on your
# machine, can you predict whether speculation will pay, and when it does not, say why?
#
# **Method.** The same shipped pair (`code-target`, 27M parameters; `code-draft`, 1.6M) runs behind
# the same extend/commit protocol on several runtimes (`speclib.load(name, backend=...)`): torch eager
# fp32, bf16, dynamic int8 and `torch.compile`; ONNX Runtime fp32 and int8 (our own export, KV cache
# in and out); llama.cpp on GGUF files written from the checkpoints (f16, q8_0, q4_0); and `SerialLM`,
# a wrapper that verifies n tokens as n one-token passes — the "parallel pass that is not parallel"
# built on purpose. We time one pass over n = 1..16 new tokens at a cached prefix of 128 and 512
# tokens, then run greedy speculative decoding end to end for several draft/target backend pairings
# (mixing runtimes, as the seed study did) and put each measured speedup beside the analytic model
#
#     speedup(K) = E(α, K) / (K·c + v(K)),   E = (1 − α^{K+1}) / (1 − α),   v(K) = T_target(K+1) / T_target(1),
#
# with α the per-token acceptance, c = T_draft(1) / T_target(1), all measured in this run
# (derivation and assumptions: [the analytic model](../docs/analytic_model.md)).
# Every timing of a single pass is a median over repeats after warm-up, cases interleaved round-robin
# so machine noise hits them alike. Every end-to-end speedup is measured the workbook's one way
# (`speclib.research.bench`, [the statistics page](../docs/statistics.md)): AR and SD run back to back on each
# prompt in alternating order, the speedup is the median over prompts of the per-prompt speed ratio
# with a 95% bootstrap interval, and the draft length K of each configuration is chosen on pilot
# prompts and reported on disjoint ones.
#
# **Why the runtime decides.** One SD step costs K draft passes and one target pass over K + 1
# tokens, and yields E tokens on average; AR pays one target pass per token. The two ratios in the
# denominator are where runtimes differ. c says how cheap the draft is next to the target: a runtime
# with a large fixed cost per call (Python dispatch, a session call, a graph launch) makes a tiny
# draft almost as slow as the target, and c creeps towards 1. v(K) says how much more a wide pass
# costs than a narrow one: when a pass is bound by reading the weights or by per-call overhead, the
# extra K tokens ride along and v stays near 1; when it is bound by arithmetic, or the runtime
# switches to a slower kernel for n > 1, v grows towards K + 1 and no acceptance rate can rescue
# speculation. The acceptance α belongs to the model pair and barely moves between runtimes; c and v
# belong to the runtime.
#
# **How to read the notebook.** Section 1 measures T(n)/T(1) — the shape of v — for every backend
# on its own. Section 2 runs AR and SD end to end per configuration and sets the measured speedup
# beside the model's prediction, then checks the torch configuration against notebook 01. Section 3
# splits each configuration's cost into drafting and verification to name the cause of a loss,
# section 4 maps where in (α, c) each runtime can win at all, section 5 checks that the outputs
# stayed the target's, section 6 sets the result beside the seed study, and section 7 repeats the question
# on a real 135M-parameter model against this machine's memory-bandwidth limit. Every number in the text
# under a table or figure is read from the results — this run's, or notebook 01's saved ones for the
# comparison in section 2 — not typed in; only the seed study's numbers (section 6) are quoted.
# Every step, table, figure and sentence built from the results is a function of
# `speclib.research.studies.backend_latency` (imported as `bl`): the cells below only call it.

# %% [markdown]
# ## About this notebook
#
# **What you will learn.**
#
# * Why the two costs of the analytic model, the draft's relative cost `c` and the verify pass's
#   growth `v(K)`, belong to the runtime and not to the model, and how to measure both in minutes.
# * How to read a runtime's T(n)/T(1) curve: flat (a wide pass rides along for free), straight
#   (arithmetic-bound, or serial by construction) or with steps (a kernel switch at some width).
# * How to predict, from those two measurements and the pair's acceptance, whether speculation will
#   pay on a runtime, and how to name the cause when it does not.
# * Why greedy identity can fail on a quantized runtime without any bug in the rule, and why a
#   second CPU thread can make timings worse rather than better on a small machine.
#
# **What to know first.** Notebook 01: the draft-then-verify rule, `E`, `c`, `v(K)`, the analytic
# speedup `E / (K·c + v(K))` and how the workbook measures a speedup (paired runs, a median of
# per-prompt ratios, a bootstrap interval, K chosen on pilot prompts). That int8, q8_0 and q4_0 are
# ways of storing weights (and, for int8, activations) in fewer bits, computed by other kernels; no
# detail of ONNX Runtime or llama.cpp is needed.
#
# **How long it takes.** With `RESULTS = "auto"` (the default) and the shipped parameters every step
# (the pass timings of section 1, the width check, the threads study, the end-to-end runs of section 2)
# is read from `data/results/`, and the notebook draws everything in about a minute without loading a
# single runtime besides torch. `"recompute"` runs every step: about 50 minutes on 2 CPU cores, plus,
# the first time, the exports of the ONNX and GGUF files (cached under `build/backends/`) and about nine
# minutes to build llama-cpp-python (`pip install -e ".[gguf]"`). A step that has to compute on a backend
# that is not installed (or, for another model pair, that runs only Llama checkpoints) stops with an error
# naming it and its install command, before timing anything; `SKIP_MISSING = True` instead drops such
# backends from `BACKENDS` and `CONFIGS` before anything runs, prints which, and the tables then hold only
# the backends measured (`SMOKE` implies it). Changing a parameter recomputes only the steps that use it; a
# run whose parameters differ from the shipped ones — a `SKIP_MISSING` run that dropped a backend included —
# writes under `build/unpublished/05_backend_latency/…`.
# `"reuse"` never computes, and names the step and the parameters that differ when it cannot reuse.

# %%
SMOKE = False  # True: tiny sizes, the whole notebook in under ~2 minutes on 2 CPU cores
SEED = 0
DEVICE = "auto"  # torch backends; auto: cuda, then mps, then cpu
TARGET = "code-target"  # any causal LM (name, folder or hub id); every runtime but torch and serial:torch
DRAFT = "code-draft"  # runs speclib's own Llama forward: another architecture needs SKIP_MISSING = True
BACKENDS = [
    "torch", "torch-bf16", "torch-int8", "torch-compile", "onnx", "onnx-int8",
    "llamacpp-f16", "llamacpp-q8_0", "llamacpp-q4_0", "serial:torch",
]  # fmt: skip
# (target backend, draft backend) pairings for end-to-end decoding
CONFIGS = [
    ["torch", "torch"], ["onnx", "llamacpp-q8_0"], ["onnx-int8", "onnx-int8"], ["torch-int8", "torch-int8"],
    ["torch-bf16", "torch-bf16"], ["llamacpp-f16", "llamacpp-q8_0"], ["llamacpp-q4_0", "llamacpp-q4_0"],
    ["llamacpp-q4_0", "torch"], ["serial:torch", "llamacpp-q8_0"],
]  # fmt: skip
N_MAX = 16  # tokens per pass, 1..N_MAX
PREFIXES = [128, 512]  # cached prefix lengths
REPEATS = 20  # timed passes per case (after 5 warm-up passes)
K_MAX = 8  # draft lengths 1..K_MAX
N_PILOT = 3  # pilot stdlib prompts: choose each configuration's K
N_PROMPTS = 9  # reported stdlib prompts, disjoint from the pilot ones
ROUNDS = 1  # interleaved repeats of the reported runs; raise it for run-to-run spread
MAX_NEW_TOKENS = 128
THREADS = 1  # every runtime gets the same number of CPU threads (1: see section 1b)
THREAD_COUNTS = [1, 2]  # section 1b: torch's T(n) at each thread count (capped at the CPUs available)
THREAD_ROUNDS = 3  # section 1b: interleaved rounds per thread count
SKIP_MISSING = False  # True: drop backends that are not installed or do not fit the model, and say so
REAL_MODEL = "smollm2-135m-instruct"  # section 7: a real model on every backend ("": skip the section)
REAL_BACKENDS = [
    "torch", "torch-int8", "torch-w8a8", "onnx", "onnx-int8", "openvino", "openvino-int8", "llamacpp-q8_0",
    "llamacpp-q4_0",
]  # fmt: skip
REAL_THREADS = 2  # section 7 times every backend at this many threads (the machine's two cores)
REAL_ROUNDS = 3  # section 7: round-robin rounds of every (backend, n) case
REAL_REPEATS = 6  # section 7: timed passes per case and round
RESULTS = "auto"  # auto: reuse results saved with these parameters, else compute; "recompute"; "reuse"
PUBLISH = False  # True: a run with non-default parameters also replaces data/results and figures/

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import Markdown, display

import speclib
from speclib import Sampling
from speclib.research import data, roofline
from speclib.research.studies import backend_latency as bl
from speclib.research.studies import real_backends
from speclib.workbook import results
from speclib.workbook.plotting import savefig, style
from speclib.workbook.provenance import Calibration
from speclib.workbook.study import Study

if SMOKE:  # one backend per runtime family, or fewer where BACKENDS names fewer
    BACKENDS, CONFIGS = bl.smoke_backends(BACKENDS)
    N_MAX, PREFIXES, REPEATS, K_MAX, MAX_NEW_TOKENS = 4, [128], 3, 3, 24
    N_PILOT, N_PROMPTS, ROUNDS, THREAD_ROUNDS = 1, 2, 1, 2
    # a small stand-in for the real model, unless section 7 is switched off ("")
    REAL_MODEL, REAL_BACKENDS, REAL_ROUNDS, REAL_REPEATS = REAL_MODEL and "code-target", ["torch", "torch-w8a8"], 1, 2
    if not SKIP_MISSING:
        print("SMOKE: backends that cannot run here are skipped (SMOKE implies SKIP_MISSING = True)")
        SKIP_MISSING = True
NB = "05_backend_latency"
GREEDY = Sampling(0.0)
style()
torch.manual_seed(SEED)
torch.set_num_threads(THREADS)

# %% [markdown]
# **What runs.** Before the Study records the parameters, `bl.plan` checks every backend named in `BACKENDS`
# and `CONFIGS`: one that is not installed, or cannot run this model pair, is an error unless `SKIP_MISSING`
# drops it (the steps' manifests then record the backends that ran). A run that reads every step back from
# saved results loads no backend but torch, so it only warns; a step that has to compute stops before timing
# anything. The table lists every backend speclib knows and whether this run uses it.

# %%
rts, BACKENDS, CONFIGS, skipped = bl.plan(TARGET, DRAFT, DEVICE, BACKENDS, CONFIGS, SKIP_MISSING, RESULTS)
KS, NS = list(range(1, K_MAX + 1)), list(range(1, N_MAX + 1))
# the torch target's one-token pass before and after each computed step (loaded only when a step computes)
study = Study(
    NB,
    globals(),
    mode=RESULTS,
    publish=PUBLISH,
    always=dict(SMOKE=SMOKE),
    calibrate=lambda: Calibration(rts.lm(TARGET, "torch"))(),
)
dev = str(rts.lm(TARGET, "torch").device)
meta = dict(seed=SEED, device=dev, target=TARGET, draft=DRAFT, threads=THREADS, smoke=SMOKE)
display(bl.backend_table(BACKENDS, skipped, SKIP_MISSING))
print(
    f"device {dev}; results mode {RESULTS!r}: this run {study.where()}. A step that computes loads each backend "
    f"when it first needs it (exports cached under build/backends/)."
)

# %% [markdown]
# ## 1 · One pass over n tokens: T(n) / T(1) per backend
# For each backend, model and prefix length: the median time of one `extend` that scores n new chain
# tokens over a cached prefix (random tokens; the time does not depend on which), each backend timed on
# its own (the n = 1..N_MAX cases interleaved). A backend is
# **parallel** when T(n)/T(1) stays near 1 (the pass is bound by reading the weights, or by per-call
# overhead, and extra tokens ride along), **serial** when it grows about linearly (each extra token
# costs about as much as a whole pass). A sudden step between n and n + 1 marks a kernel switch
# (e.g. matrix–vector to matrix–matrix).
#
# **Question.** How much does a pass over n tokens cost relative to a pass over one, on each runtime?
# This curve at n = K + 1 is v(K), the verification cost in the analytic model, so its shape decides
# how long a draft a runtime can afford.
#
# **How to read the figure.** One panel per model (target left, draft right) and prefix length (rows).
# x: tokens scored in one pass, n; y: T(n)/T(1), so every curve starts at 1. The dotted grey diagonal
# is a perfectly serial pass, T(n) = n·T(1): a curve on it gains nothing from batching tokens. The
# dashed curve is `SerialLM`, serial by construction — it should sit on the diagonal, which checks that
# the timing can see serial verification when it is there. The lower and flatter a curve, the cheaper
# a long draft is to verify on that runtime. The y axis is cut at 8 so the parallel runtimes stay
# readable; a curve leaving the top is steeper than that. The table above the figure gives each
# curve's one-token time, its ratio at n = N_MAX, a fitted slope and its largest single step.


# %%
lat = study.step(
    "latency",
    lambda: bl.pass_latencies(rts, BACKENDS, NS, PREFIXES, REPEATS, meta),
    uses=["TARGET", "DRAFT", "BACKENDS", "N_MAX", "PREFIXES", "REPEATS", "THREADS"],
)
shape = bl.latency_shapes(lat)
results.save(shape.assign(**meta), f"{NB}/classes")
display(shape.round(3))
colors = bl.backend_colors(lat)
savefig(bl.plot_latency(lat, PREFIXES, NS, TARGET, DRAFT, colors), f"{NB}_latency")
plt.show()

# %%
display(Markdown(bl.latency_prose(shape, PREFIXES[0], N_MAX)))

# %% [markdown]
# ### Does the width of a pass change the numbers?
# Speculation is lossless in exact arithmetic, but a verify pass over K + 1 tokens is a different
# computation from K + 1 one-token passes: sums in another order, and for dynamic int8 activation
# scales computed over the whole pass. Here: the largest logit difference between one 8-token pass and
# eight one-token passes (`SerialLM`) on the same backend, over a 128-token prefix, and how often the
# greedy token differs. This matters for section 5: greedy SD picks its tokens from the wide pass,
# greedy AR from the narrow ones, so a backend whose two computations disagree can make SD's output
# differ from AR's without any bug in the rule.

# %%
width = study.step("width", lambda: bl.width_check(rts, BACKENDS, SEED, meta), uses=["TARGET", "BACKENDS", "SEED"])
display(width)
display(Markdown(bl.width_prose(width)))

# %% [markdown]
# ### 1b · Threads, and why T(n) is not smooth on two cores
# On this kind of machine (2 CPU cores) the torch target's v(K) can jump around between runs and is
# not monotone in n: a pass over 5 tokens can cost less than one over 3. The suspects are the matrix
# kernels' choice per shape (a matrix–vector path for a few rows, a blocked, multi-threaded matrix
# multiply beyond some row count), the second thread, and allocation. Here the torch target's pass over
# n = 1..N_MAX tokens at a 128-token prefix is timed with each thread count in `THREAD_COUNTS`, in
# `THREAD_ROUNDS` rounds that alternate the thread counts, so a burst of machine noise hits both.
# A size is **reliably cheap** when, in every round, it costs less than a smaller size: a decoder
# can then use it for free, by drafting up to it (a chain drafter choosing K on pilot prompts does so
# by itself; the cache drafters of notebook 02 pad or cut their drafts to the cheaper sizes).


# %%
thr = study.step(
    "threads",
    lambda: bl.thread_latencies(rts, THREAD_COUNTS, THREAD_ROUNDS, NS, REPEATS, meta),
    uses=["TARGET", "N_MAX", "REPEATS", "THREAD_COUNTS", "THREAD_ROUNDS"],
)
savefig(bl.plot_threads(thr, NS, TARGET), f"{NB}_threads")
plt.show()
summary = bl.threads_summary(thr)
results.save(
    summary.assign(**{k: v for k, v in meta.items() if k != "threads"}), f"{NB}/threads_summary"
)  # its own threads column stays
display(summary.round(3))
display(Markdown(bl.threads_prose(summary, THREADS)))

# %% [markdown]
# ## 2 · End to end: predicted vs measured speedup per configuration
# Each configuration pairs a target backend with a draft backend (written `target ← draft`). Per
# configuration, three measurements:
#
# 1. **Bare-pass costs** (`bench.cost_profile`): c and v(K) from one-token and (K+1)-token passes at a
#    128-token prefix, the target's and the draft's passes timed side by side (interleaved), as SD
#    alternates them.
# 2. **Pilot runs**: greedy AR on the target backend and greedy SD at K = 1..K_MAX on `N_PILOT`
#    held-out stdlib prompts. They serve only to choose the configuration's K.
# 3. **Reported runs**: the same methods on `N_PROMPTS` other prompts, repeated `ROUNDS` times.
#
# **How speed is measured, here and in every notebook** (`speclib.research.bench`; details in
# [the statistics page](../docs/statistics.md)). For each prompt, AR and SD at every K run back to
# back, in an order that alternates between prompts and rounds (AR first, then last: "ABBA"), so a
# slow drift of the machine — another process waking up, the CPU clocking down — hits every method
# alike. One untimed warm-up run of each method comes first. The **speedup** of a method is the median
# over prompts of its per-prompt speed ratio (its tokens per second over AR's on the same prompt),
# with a 95% bootstrap interval that resamples prompts: prompts are the independent units, tokens
# inside one prompt are not. The per-prompt ratio cancels how hard each prompt is, and the median
# resists a prompt hit by a stall. The **total-time ratio** (all of AR's time over all of the
# method's, per token) stands beside it: throughput over the whole workload, weighted towards the
# long runs. With more than one round, the **spread** is the lowest and highest estimate of a single
# round: how much the headline would move if we ran the notebook again.
#
# **Choosing K honestly.** Picking the best of K_MAX noisy medians and reporting it on the same
# prompts overstates the speedup: the maximum collects the luckiest noise (the winner's curse). So each
# configuration's K is the one with the highest speedup on the pilot prompts, and the number reported
# for it comes from the disjoint reported prompts, whose noise is independent of the choice.
#
# **Two measurements of c and v.** The bare passes of step 1 are the "two short measurements" of the
# question: they take seconds and need no decoding. The loop also records what each step cost, so c
# and v are measured a second time **inside** the reported runs (`bench.loop_costs`): c = median
# drafting time per drafted token over AR's median step, v = SD's median verify step (K + 1 tokens,
# acceptance and commit included) over AR's median step. The analytic prediction `predicted` uses the
# bare-pass costs with the per-token acceptance α = accepted / reached draft positions (the estimate
# the model assumes: [the analytic model](../docs/analytic_model.md)); `predicted_loop` uses the
# in-loop costs with the same α. When the first misses and the second does not, the bare passes
# misjudged the cost; when both miss, the model's assumptions (i.i.d. acceptance, no overhead
# outside the passes) do. `predicted_v1` is the textbook v = 1, `predicted_c0` a free draft.
#
# Each SD output is compared with the same target backend's own AR output on the same prompt
# (`identical` of `of` runs; section 5).

# %%
prompt_rows = data.load_workload("code_stdlib", N_PILOT + N_PROMPTS)
prompts = [rts.lm(TARGET, "torch").encode(r["prompt"]) for r in prompt_rows]
splits = {"pilot": (prompts[:N_PILOT], 1), "report": (prompts[N_PILOT:], ROUNDS)}
print(
    f"{N_PILOT} pilot + {N_PROMPTS} reported stdlib prompts, {np.mean([len(p) for p in prompts]):.0f} tokens on "
    f"average; reported runs x {ROUNDS} round(s)"
)
saved = study.step(
    "runs",
    lambda: bl.config_runs(rts, CONFIGS, KS, splits, MAX_NEW_TOKENS, GREEDY, SEED, REPEATS, meta),
    uses=[
        "TARGET",
        "DRAFT",
        "CONFIGS",
        "REPEATS",
        "K_MAX",
        "N_PILOT",
        "N_PROMPTS",
        "ROUNDS",
        "MAX_NEW_TOKENS",
        "THREADS",
        "SEED",
    ],
)
runs, profile = saved["runs"], saved["profile"].drop(columns=list(meta) + ["git_sha"])
speed = bl.speedups(runs, profile, splits, SEED)
results.save(speed.assign(**meta), f"{NB}/speedup")
report = speed[speed.split == "report"].reset_index(drop=True)
best = report[report.chosen].reset_index(drop=True)  # each configuration at its pilot-chosen K
display(best[bl.BEST_COLUMNS].round(3))

# %% [markdown]
# ### Predicted vs measured, per configuration
# **Question.** Fed with the bare-pass c and v(K) and the measured acceptance, does the analytic model
# predict the measured speedup — its level, and the K at which it peaks — on every runtime?
#
# **How to read the figure.** One panel per configuration (`target ← draft`), each with its own y
# scale; x: draft length K; y: speedup over AR on the same target backend, from the reported prompts.
# Above the black line at 1 speculation pays, below it it slows decoding down. Blue dots with bars:
# the measured median and its 95% interval (a light band around them, when `ROUNDS` > 1, spans the
# single rounds). Orange squares: the analytic model with the bare-pass costs; green triangles: with
# the costs measured inside the runs; grey dotted: the textbook v = 1, so the distance between grey
# and orange is what a verify pass that is not flat costs. The red ring marks the K chosen on the
# pilot prompts: its blue dot is the number reported for the configuration. A measured curve inside
# the two predictions means the model is right and the remaining question is which cost estimate to
# trust; a measured curve below both means something outside the model — per-step overhead,
# acceptance that is not i.i.d. — is eating the gain.

# %%
savefig(bl.plot_predicted_vs_measured(report, KS, ROUNDS), f"{NB}_predicted_vs_measured")
plt.show()

# %%
display(Markdown(bl.speedup_prose(speed)))

# %% [markdown]
# ### Does the torch configuration agree with notebook 01?
# Notebook 01 measures the same pair on torch with the same estimator (`bench.paired_runs`,
# `bench.speedup_table`, K chosen on pilot prompts). The `torch ← torch` configuration here runs the
# same code on the same weights, so the two greedy speedups at the same K should agree up to noise —
# and up to what differs in the setting:
#
# * **prompts**: notebook 01 interleaves stdlib and HumanEval prompts; this notebook uses stdlib
#   continuations only, with its own number of prompts and rounds. Acceptance depends on the text
#   (the draft is better on what it has seen more of), and the prompt length sets the cached prefix
#   every pass attends over.
# * **threads**: this notebook pins every runtime to `THREADS` threads so that runtimes compete on
#   equal terms; notebook 01 gives torch every CPU it may use. The thread count changes both costs
#   and not by the same factor — a one-token pass of a small model gains little from more threads,
#   a (K + 1)-token pass more — so c and v move.
# * **time**: the notebooks ran at different moments, on a machine whose load may differ.
#
# We compare at notebook 01's chosen K (greedy, reported prompts): both medians with their 95%
# intervals, whether the intervals overlap, and the in-loop c, v and per-token acceptance of each,
# which tell where a gap comes from — acceptance (the prompts) or costs (threads, machine).
# Overlapping intervals mean the difference is within the noise of the two runs, not that the
# speedups are equal; disjoint ones mean the settings differ in a way that matters.

# %%
roots = [results.root(), speclib.core.device.REPO / "data" / "results"]  # this run's folder, then the committed results
have = [r for r in roots if results.path("01_baseline/speedup", r).is_file()]
nb01 = results.load("01_baseline/speedup", have[0]) if have else None
vs01, text = bl.compare_with_01(nb01, report, meta, NB)
if vs01 is None:
    print(text)
else:
    display(vs01.round(3))
    display(Markdown(text))

# %% [markdown]
# ## 3 · Which cause dominates where speculation loses?
# The analytic denominator K·c + v(K) splits the cost of one SD step into drafting (K·c target-passes'
# worth) and verification (v(K), of which v(K) − 1 is the excess over a one-token pass). For every
# configuration, at the K chosen on the pilot prompts (reported rows): the predicted speedup if
# verification were flat (v = 1) and if drafting were free (c = 0). The larger gain names the
# dominant cause. Beside the interleaved bare-pass c of section 2 stand `c_alone`, the same ratio from
# section 1 where each backend was timed on its own, and `c_loop`, the cost SD actually paid per
# drafted token: the difference between them is the price of running two models in turn.
#
# **Why two models in turn cost more than each alone.** Every runtime keeps its own pool of worker
# threads. After a pass, idle workers may keep spinning for a while, waiting for more work, and hold
# the cores the other model's pool now needs. When this notebook was developed, with ONNX Runtime's
# default spinning a llama.cpp draft pass right after an ONNX Runtime target pass took about ten times
# its time alone; the ONNX Runtime sessions are therefore built with spinning off, which removed most
# of that. torch's OpenMP pool and llama.cpp's are left as shipped: making OpenMP threads sleep
# instead of spin (`OMP_WAIT_POLICY=PASSIVE`) made every runtime slower, a llama.cpp q4_0 target pass
# several times so. What remains — caches refilled with the other model's weights, sleeping threads
# woken — this notebook measures (the gap between `c` and `c_alone`) but does not separate.

# %%
cause = bl.cost_causes(best, lat)
results.save(cause.assign(**meta), f"{NB}/causes")
display(cause[bl.CAUSE_COLUMNS].round(3))
display(Markdown(bl.causes_prose(cause)))

# %% [markdown]
# ## 4 · Break-even map
# **Question.** Where in (α, c) does speculation win at all, on each target runtime? The analytic model
# says it wins when E(α, K) > K·c + v(K) for some K: better acceptance buys room for a dearer draft,
# a flatter verify pass buys room for both. The map draws that boundary for every runtime, so a
# reader can place any draft model on it — measure its α and c, and read off whether it can pay.
#
# **How to read the figure.** x: per-token acceptance α; y: the cost ratio c = T_draft(1) / T_target(1),
# on a log scale. Each curve belongs to one target backend and uses that backend's measured v(K)
# from section 1 (timed alone, prefix 128 or the shortest prefix measured), taking the best
# K = 1..K_MAX at every point: below and to the right of its curve speculation wins, above and to the
# left it loses. A curve high up means a runtime that tolerates an expensive draft; a runtime whose
# verify pass is serial has its curve pushed to the bottom-right corner, or no curve at all when it
# cannot win anywhere in the box. The points are the configurations of section 2 at their chosen K,
# at their measured α and (interleaved, bare-pass) c, coloured by their target backend: a circle for a
# measured win, an X for a measured loss. Read a point against the curve of its own colour: a circle
# below it or an X above it is where the map and the measurement agree. The table under the figure
# reads the map at three acceptances: the largest c at which each backend still wins.

# %%
tv = bl.target_curves(lat, PREFIXES[0])  # each target's v(K), timed alone
bmap = bl.break_even_map(tv, KS, best.c.max())
savefig(bl.plot_break_even(bmap, best, colors), f"{NB}_break_even")
plt.show()
breakeven = bmap.table()
results.save(breakeven.assign(**meta), f"{NB}/break_even")
display(breakeven.pivot(index="backend", columns="alpha", values="max_c").round(3))

# %%
display(Markdown(bl.break_even_prose(breakeven, best, tv, KS, bmap.alphas.max())))

# %% [markdown]
# ## 5 · Output agreement
# Greedy SD should reproduce the target's greedy AR output token for token. On an fp32 backend it does
# up to ties broken by rounding; on a quantized backend the verify pass over K + 1 tokens can compute a
# different logit from the one-token AR pass (section 1's width check), and a near-tie can flip.
# The counts below cover every SD run of section 2, pilot and reported prompts, every K and round:
# each compared with the same target backend's AR run on the same prompt.

# %%
agree = bl.agreement(speed, width)
results.save(agree.assign(**meta), f"{NB}/agreement")
display(agree.round(4))
display(Markdown(bl.agreement_prose(agree)))

# %% [markdown]
# ## 6 · Beside the seed study
# The seed study ran five draft/target backend configurations: the best reached 1.61x at K = 6, and three
# of five decelerated. Our row reports each configuration at the K chosen on pilot prompts; how the
# seed study chose its K is not recorded, and if it was the best K on the same prompts it reports, its
# number carries the upward bias of section 2's winner's curse. The configurations also differ, so
# the comparison is of the overall picture — a few runtimes win, several lose — not of one number.

# %%
seed_tbl = bl.seed_comparison(best)
results.save(seed_tbl.assign(**meta), f"{NB}/seed_comparison")
display(seed_tbl)

# %% [markdown]
# ## 7 · A real model on every backend, against the machine's limit
# **Question.** Sections 1–6 time a 27M-parameter model, whose passes are mostly per-call overhead. Does the
# picture hold for a real instruct model (`REAL_MODEL`, SmolLM2-135M-Instruct by default), how far is each
# runtime from the fastest pass this machine allows, and where can speculation pay on each?
#
# **How.** One step measures the machine first: a STREAM-like copy over 512 MB arrays gives the memory
# bandwidth, and products at a decode shape give the arithmetic rate per number format
# (`speclib.research.roofline`). A one-token pass must read every weight once, so its bound is the weights'
# bytes over the bandwidth, or their multiply-adds over the arithmetic rate if that takes longer. Then the
# model's T(n) on each backend in `REAL_BACKENDS`, all timed round-robin at `REAL_THREADS` threads, and on six
# chat requests (64 greedy tokens each) both plain decoding and prompt lookup (k = 4) on each backend, with
# how many answers prompt lookup changed: it must change none, and changes some where a pass over several
# tokens rounds differently from one-token passes.
#
# **How to read it.** Left: T(n) per backend, with each weight format's bound dashed. Right: the smallest
# per-token acceptance at which a free draft (c = 0, as prompt lookup) breaks even under the analytic model
# with the backend's measured v(K), the best K up to `K_MAX`; the table adds the same for a draft that costs a
# tenth of a target pass (c = 0.1). A backend whose wide passes cost in proportion to their tokens needs
# drafts that are nearly always right.

# %%
if REAL_MODEL:
    real = study.step(
        "real_backends",
        lambda: real_backends.measure(
            REAL_MODEL, REAL_BACKENDS, range(1, K_MAX + 2), REAL_ROUNDS, REAL_REPEATS, REAL_THREADS,
            16 if SMOKE else 512, roofline.CHAT_REQUESTS[: 2 if SMOKE else 6],
            meta | dict(target=REAL_MODEL, draft=None, threads=REAL_THREADS),
        ),
        uses=["REAL_MODEL", "REAL_BACKENDS", "K_MAX", "REAL_ROUNDS", "REAL_REPEATS", "REAL_THREADS"],
    )  # fmt: skip
    real_tab = real_backends.table(real, KS)
    savefig(real_backends.figure(real, real_tab, REAL_MODEL), f"{NB}_real_backends")
    plt.show()
    display(real_tab.round(3))
    display(Markdown(real_backends.prose(real_tab)))

# %% [markdown]
# ### This run's steps
# Each expensive step, whether this run computed it or read it from saved results (and from which
# commit), and how long it took when it was computed. A step recorded from results made before steps
# were timed shows no time.

# %%
display(study.summary())

# %% [markdown]
# ## What to take away
#
# * **c and v(K) are measurements of a runtime, not constants of speculative decoding.** The same
#   weights give a flat T(n) on one runtime and a steep or stepped one on another, and a draft that
#   is cheap on one runtime is nearly as slow as the target on another because of per-call overhead.
# * **Two short measurements predict the sign of the result.** T(n)/T(1) of the target and
#   T_draft(1)/T_target(1), with the pair's per-token acceptance, place a configuration on the
#   break-even map of section 4 before any end-to-end run.
# * **A loss has a named cause**: drafting too expensive (`K·c` large) or verification not parallel
#   (`v(K) − 1` large). Section 3 says which, per configuration.
# * **Exactness holds in exact arithmetic.** A quantized or reordered wide pass computes slightly
#   different logits from the one-token passes, so greedy SD and greedy AR can part at a near-tie
#   (section 5): check the width difference before calling a mismatch a bug.
# * **Small machines need care with threads**: on two cores one torch thread gives smooth, repeatable
#   timings; two make the wide passes erratic (section 1b).
#
# Caveats: one machine, tiny models (27M and 1.6M parameters), short prompts; on a GPU or with large
# models most runtimes move towards the flat, weight-bound regime in which speculation pays.

# %% [markdown]
# ## Exercises
#
# Run from the repository root. A run with changed parameters writes under
# `build/unpublished/05_backend_latency/<hash>/` and recomputes only the steps that use the changed
# parameters; the rest is read from the shipped results. Predict before running.
#
# 1. **A longer prefix.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/05_backend_latency.ipynb build/05_prefix.ipynb -p PREFIXES "[128, 2048]"
#    ```
#
#    Only section 1's pass timings are recomputed. *Look for:* T(1) growing with the prefix on every
#    backend, and whether T(n)/T(1) flattens. *Why:* each pass reads the whole cached prefix once,
#    however many new tokens it carries; the longer that shared read, the smaller the share of the
#    cost that grows with n.
#
# 2. **Two threads for every runtime.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/05_backend_latency.ipynb build/05_threads.ipynb -p THREADS 2
#    ```
#
#    *Look for:* `c` and `v(K)` per backend moving in different directions, and the speedups' single
#    rounds spreading (raise `ROUNDS` to see it). *Why:* a second thread can split a wide pass's
#    arithmetic but not a tiny draft's per-call overhead, and on two cores it competes with everything
#    else (section 1b).
#
# 3. **Your own pairing.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/05_backend_latency.ipynb build/05_pairs.ipynb -p CONFIGS '[["torch", "llamacpp-q4_0"], ["onnx", "onnx"]]'
#    ```
#
#    Before running, read `c` and `v(K)` for the two backends off section 1 and place each pairing on
#    section 4's map. *Look for:* whether the measured speedup lands where the map said. *Why:* the
#    acceptance barely changes between runtimes, so the map's two axes carry the prediction.
#
# 4. **Run-to-run spread.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/05_backend_latency.ipynb build/05_rounds.ipynb -p ROUNDS 3
#    ```
#
#    *Look for:* the light bands of single rounds in the predicted-vs-measured figure, and whether the
#    chosen K's interval covers every round. *Why:* the interval is over prompts within one run;
#    rounds show what another run on the same machine would have reported.
