# %% [markdown]
# # 03 · Tree speculation on a hybrid linear-attention model
#
# **Question.** Hybrid models (Gated DeltaNet + attention, as Qwen3-Next and Qwen3.5) decode with a
# recurrent state in most layers. A draft *tree* then needs a different state on every branch. Can we
# verify a whole tree in one pass without materialising a state per node — and does tree speculation
# then pay on such a model?
#
# **Method.** `speclib.lms.hybrid.HybridLM` runs the shipped `hybrid-target` (Qwen3.5 text
# architecture, 3 Gated DeltaNet layers per gated-attention layer) behind the extend/commit protocol
# with three interchangeable strategies for the recurrent layers:
#
# * `closed_form` (ours): the gated delta rule over the whole tree in closed form
#   (`speclib.kernels.tree_gdn`: path cumsum of log-decays, ancestor mask, one unit lower-triangular
#   solve), keeping only per-node *factors* `(k, u, G)`; `commit` folds the accepted path into the state;
# * `materialize` (prior art): branch by branch, a full `[H, K, V]` state per node;
# * `replay` (chains only): snapshot the state, re-run the accepted tokens on commit — a tree is then
#   verified one root-to-leaf branch at a time.
#
# All three give the same logits (tests/test_hybrid.py checks them against `transformers` at 1e-4).
# We measure verification latency and transient state memory per strategy, the node budget a batch
# can afford, end-to-end decoding (AR, chain SD, tree SD) at batch 1 and batch > 1, and
# component-aware self-speculation with the model's own linear-attention subgraph as the draft.
#
# **Why trees are hard on a recurrent layer.** In an attention layer a draft tree is cheap: every
# node attends to its ancestors through a mask, and rejected nodes are dropped from the KV cache.
# A Gated DeltaNet layer instead carries a fixed-size state `S` (per head a K × V matrix) that every
# token updates: it decays the state by a gate g and adds a rank-one delta-rule correction built from
# the token's key and value. Two siblings need two
# different states, and after verification only the accepted path's state may survive. Keeping a
# state per node costs n full matrices; replaying branch by branch costs one model pass per leaf.
# The closed form instead writes the state after any node as the committed state, decayed along
# the node's path, plus a sum of rank-one terms of its ancestors — so the whole tree is one masked,
# triangular computation, and only small per-node factors are held until commit. The derivation,
# and why it is exact, is in [the tree closed form](../docs/gdn_tree.md); how a draft tree is
# verified losslessly (siblings drawn without replacement, the residual rule) is in
# [draft trees](../docs/trees.md) and [the lossless rule](../docs/lossless.md).
#
# **How to read the notebook.** Sections 2–3 are micro-benchmarks: one layer, then the whole model,
# for a single verify pass (cost only, no acceptance). Section 4 adds acceptance: a pilot measures
# how many tokens each draft shape earns, and a cost model turns "tokens per pass" and "seconds per
# pass" into a node budget. Section 5 is the end-to-end test, where everything is paid for; section
# 6 asks whether the hybrid model can draft for itself. Each figure is preceded by what to look for
# and followed by a reading whose numbers come from this run.

# %% [markdown]
# ## About this notebook
#
# **What you will learn.**
#
# * Why a draft tree is easy on attention and hard on a recurrent layer, and how the closed form of
#   the gated delta rule over a tree verifies every branch in one masked computation.
# * How to hold a tree's speculative state as small per-node factors and fold only the accepted path
#   into the recurrent state at commit, and what that saves in memory and time.
# * How to choose a tree's node budget from measured acceptance and measured verify cost, and how the
#   choice moves with the batch size.
# * Whether a hybrid model's own linear-attention layers make a useful draft for it.
#
# **What to know first.** Notebook 01 (the rule, `E`, `c`, `v(K)`, the workbook's speedup estimator).
# Linear attention at the level of "a fixed-size state per head, updated by every token"; the maths of
# the gated delta rule and its tree form is derived in [the tree closed form](../docs/gdn_tree.md), and
# draft trees in [draft trees](../docs/trees.md). Section 2 reads comfortably after the first half of
# that page.
#
# **How long it takes.** With `RESULTS = "auto"` (the default) and the shipped parameters every step
# (the peer check, the layer and model timings, the pilot, the decoding runs, the self-speculation
# runs) is read from `data/results/` and the notebook draws everything in about a minute. `"recompute"`
# runs every step: about half an hour on 2 CPU cores, most of it the pilot and the end-to-end runs.
# Changing a parameter recomputes only the steps that use it; a run whose parameters differ from the
# shipped ones writes under `build/unpublished/03_tree_hybrid/…`. `"reuse"` never computes, and names
# the step and the parameters that differ when it cannot reuse. The table at the end of section 6
# lists each step and how long it took when it was computed.

# %%
SMOKE = False  # True: tiny sizes, the whole notebook in under ~2 minutes on 2 CPU cores
SEED = 0
DEVICE = "auto"  # auto: cuda, then mps, then cpu
TARGET = (
    "hybrid-target"  # a Gated DeltaNet hybrid that loads as HybridLM: Qwen3.5 (text, MoE or multimodal) or Qwen3-Next
)
DRAFT = "code-draft"  # the separate draft: any causal LM with the target's tokenizer
TREE_SIZES = [8, 16, 32, 64, 128]
BATCHES = [1, 2, 4, 8]
LATENCY_REPEATS = 7
PREFIX_LEN = 128  # cached prefix before each timed verify pass
N_PROMPTS = 24  # held-out prompts for end-to-end decoding (half stdlib, half HumanEval)
MAX_NEW_TOKENS = 96
CHAIN_KS = [2, 3, 4, 5, 6]  # chain SD draft lengths tried in the pilot (the best one is used)
TREE_DEPTHS = [3, 4, 6]  # EAGLE-2 tree depths tried in the pilot
SPINE_VALUES = [0.05, 0.15, 0.3]  # least path value of a sibling leaf, chain + leaves trees, in the pilot
PILOT_PROMPTS = 4  # held-out prompts of the pilot (not used below)
TREE_DEPTH = 6  # shape of the random trees in the latency measurements
DECODE_BATCH = 4  # batch size of the batched decoding comparison
SELF_KS = [1, 2, 3, 4]  # draft lengths for the self-speculation study
EVAL_WINDOWS = 32  # held-out windows of 256 tokens for the perplexity of the ablated model
HEAD = "hybrid-target-head"  # section 7: a feature-level head trained for TARGET (python -m speclib train head TARGET)
HEAD_KS = [2, 3, 4, 5]  # section 7: the head's chain lengths in the pilot
HEAD_TREES = [[3, 8], [4, 12], [5, 16], [6, 24]]  # section 7: the head's EAGLE-2 trees in the pilot, [depth, budget]
RESULTS = "auto"  # auto: reuse results saved with these parameters, else compute; "recompute"; "reuse"
PUBLISH = False  # True: a run with non-default parameters also replaces data/results and figures/
THREADS = 1  # torch threads (0: every CPU this process may use); 1 keeps T(n) smooth on 2 cores (notebook 05)

# %%
import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display
from tqdm.auto import tqdm

import speclib
from speclib.research import bench
from speclib.research.studies import tree_hybrid as th
from speclib.workbook import results
from speclib.workbook.plotting import savefig, style
from speclib.workbook.study import Study

if SMOKE:
    TREE_SIZES, BATCHES, LATENCY_REPEATS, N_PROMPTS, MAX_NEW_TOKENS = [8, 32], [1, 2], 2, 2, 24
    SELF_KS, EVAL_WINDOWS, DECODE_BATCH, CHAIN_KS, TREE_DEPTHS = [1, 2], 4, 2, [2, 4], [3]
    SPINE_VALUES, PILOT_PROMPTS, HEAD_KS, HEAD_TREES = [0.15], 2, [2], [[3, 6]]
NB = "03_tree_hybrid"
TOP = 4  # EAGLE-2 trees spend at most TOP nodes per level: at most TOP x depth nodes in all
PILOT_BUDGETS = th.pilot_budgets(TREE_DEPTHS, TREE_SIZES, TOP)  # per depth, the budgets that change the tree
style()
torch.manual_seed(SEED)
threads = speclib.core.device.set_threads(THREADS or None)
target, draft = speclib.load(TARGET, device=DEVICE), speclib.load(DRAFT, device=DEVICE)
th.check_hybrid(target, TARGET)  # trees on recurrent states, the closed form and the linear subgraph
prompts, pilot_prompts = th.workload_prompts(target, N_PROMPTS, PILOT_PROMPTS)  # reported, and the pilot's
meta = dict(seed=SEED, device=str(target.device), target=TARGET, draft=DRAFT, threads=threads, smoke=SMOKE)
study = Study(
    NB, globals(), mode=RESULTS, publish=PUBLISH, always=dict(SMOKE=SMOKE), calibrate=target
)  # target T(1) before/after each step
print(f"results mode {RESULTS!r}: this run {study.where()}")
print(th.describe(target, len(prompts)))

# %% [markdown]
# ## 1 · The peer refuses, speclib decodes
# `transformers` assisted generation cannot roll back a recurrent state, so it refuses stateful
# models outright. speclib's extend/commit protocol covers them: here the same pair decodes with a
# draft tree, and the output equals plain greedy decoding token for token — ours and `transformers`'
# own `generate`, whose speed is the reference our AR baseline must not fall behind (a slow baseline
# would flatter every speedup below).
#
# The refusal is printed rather than hidden: it is the practical gap this notebook fills. The token
# check is the cheapest correctness test of everything below — a tree verified with a wrong state
# on some branch would, sooner or later, accept a token that greedy decoding would not produce. Two
# numbers to read in the table: `tokens_per_s` of speclib's AR against `transformers`' (if ours
# were slower, every "speedup over AR" below would be inflated), and `identical_to_speclib_ar`,
# which must be True in every row.


# %%
peer = study.step(
    "peer",
    lambda: th.peer_check(target, draft, prompts[0], TREE_DEPTH, TOP, meta),
    uses=["TARGET", "DRAFT", "TREE_DEPTH", "N_PROMPTS", "THREADS"],
)
print("transformers assisted generation:", peer.refusal[0])
display(peer[["method", "tokens_per_s", "identical_to_speclib_ar"]])
print(f"speclib tree SD: {peer.sd_tokens_per_call[0]:.2f} tokens per target call")
print(repr(peer.sd_text[0]))

# %% [markdown]
# ## 2 · One Gated DeltaNet layer: closed form vs a state per node
# The tree closed form (`tree_gdn`) against the node-by-node recurrence that keeps a full state per
# node (`materialize`), on random trees shaped like confidence-expanded drafts (depth ≤ 6), at our
# model's layer shape and at a real Qwen3.5 layer shape (32 value heads, K = V = 128). Memory is
# the speculative state each strategy holds until commit, read off the tensors it returns: factors
# `k [n, H, K]`, `u [n, H, V]`, `G [n, H]` (kept in fp32 here; bf16 storage halves them, as the seed
# stores them) versus `n` fp32 states `[H, K, V]`. The analytic ratio is `K·V / (K + V + 1)` (fp32
# factors), about 64x at K = V = 128; twice that for bf16 factors.
#
# Where the ratio comes from: a state per node stores a K × V matrix per head for every node, while
# the closed form stores, per node and head, one key (K numbers), one value-side vector (V numbers)
# and one cumulative log-decay (1 number), and rebuilds any node's state on demand from its
# ancestors' factors and the committed state. Memory matters beyond the single request: the state
# held until commit is per request, so at batch b it is b times larger, and it competes with the KV
# cache of the attention layers for the same accelerator memory. A speculative state smaller by the
# factor above is what lets a server keep large trees *and* large batches.
#
# Why random trees: the latency of one verify depends only on the tree's shape, not on which tokens
# sit in it, so a seeded random tree with a realistic depth makes the measurement reproducible and
# independent of any drafter. Section 4 checks how far this proxy is from the drafter's real trees.

# %%
shapes = th.layer_shapes(target)  # name -> (heads, K, V): our GDN layer and a real Qwen3.5 one
layer = study.step(
    "layer",
    lambda: th.layer_timings(shapes, TREE_SIZES, TREE_DEPTH, SEED, LATENCY_REPEATS, meta, progress=tqdm),
    uses=["TARGET", "TREE_SIZES", "TREE_DEPTH", "LATENCY_REPEATS", "SEED", "THREADS"],
)
display(layer[th.LAYER_COLUMNS].round(4))

# %% [markdown]
# ### One layer: time and memory of the two strategies
# **Question.** For a single Gated DeltaNet layer, how do the closed form and a state per node scale
# with the number of tree nodes, in time and in the speculative state held until commit — and does
# the gap grow with the layer's size?
#
# **How to read it.** Both panels are log–log, x = nodes in the tree. Colour = layer shape (ours,
# small; a real Qwen3.5 layer, large); solid circles = closed form, dashed squares = a state per node.
# Left: milliseconds for one verify of the layer. Right: MiB of speculative state held until commit
# (fp32 states for the per-node strategy, bf16 factors for the closed form). On a log–log plot a
# slope of 1 means cost proportional to n; the *vertical distance* between the solid and the dashed
# line of one colour is the ratio between the strategies (a constant distance = a constant factor).
# The memory panel should show two parallel lines per colour — both strategies hold something per
# node — separated by the analytic factor `2·K·V / (K + V + 1)` for bf16 factors; the time panel
# shows whether the arithmetic follows.

# %%
savefig(th.layer_figure(layer, TREE_SIZES), f"{NB}_layer")
plt.show()
for text in th.layer_notes(layer, shapes, TREE_SIZES):
    display(Markdown(text))

# %% [markdown]
# ## 3 · The whole model: verification latency vs tree size and batch
# One verify pass of `hybrid-target` over a cached prefix of `PREFIX_LEN` tokens, scoring an n-node
# tree per request; a batch of requests shares one forward (`extend_batch`: projections, MLPs and the
# LM head read the weights once; attention and the recurrence run per request). `replay` verifies a
# tree branch by branch. Medians over repeats, strategies timed round-robin. The dense parts of the
# model cost the same under every strategy, so the whole-model ratio is smaller than the layer ratio.
#
# The sizes are those of section 2 plus every tree budget the pilot of section 4 tries, so that its
# cost model can price them.
#
# Why time a bare verify pass? End-to-end speed mixes three things — what a pass costs, how many
# tokens it yields, and what drafting costs. This section isolates the first: the same random tree
# (shaped like a confidence-expanded draft, depth ≤ `TREE_DEPTH`) is scored under each strategy,
# so any difference is the strategy's. The column `over_one_token` divides by a one-token pass at
# the same batch size: it is the verification cost ratio v(n) of
# [the analytic model](../docs/analytic_model.md), the price of scoring n nodes instead of one. A
# tree pays only if the extra tokens it earns per pass exceed that price (plus drafting).
#
# Batch > 1 is where the question changes. At batch 1 a small model leaves the hardware idle, so
# extra nodes ride along almost for free; at a larger batch the pass is already busy with other
# requests' tokens, and every node competes with them. The batch panel shows how quickly that happens.

# %%
n64 = th.probe_size(TREE_SIZES)  # the tree size the readings quote
sizes = th.timed_sizes(TREE_SIZES, PILOT_BUDGETS)  # section 2's sizes and every budget the pilot can draft
verify = study.step(
    "verify",
    lambda: th.verify_timings(
        target, prompts[0], sizes, BATCHES, PREFIX_LEN, LATENCY_REPEATS, TREE_DEPTH, SEED, n64, meta, progress=tqdm
    ),
    uses=[
        "TARGET",
        "BATCHES",
        "TREE_SIZES",
        "TREE_DEPTHS",
        "PREFIX_LEN",
        "LATENCY_REPEATS",
        "TREE_DEPTH",
        "SEED",
        "N_PROMPTS",
        "THREADS",
    ],
)

# %% [markdown]
# ### The whole model: one verify pass, by tree size and by batch
# **Question.** Once the dense layers and attention are included, how much does the recurrent-layer
# strategy still matter, and how does the cost of scoring a tree grow with the batch?
#
# **How to read it.** Both panels log–log, y = milliseconds per verify pass (medians). Left, batch 1:
# x = tree nodes, one line per strategy; the vertical gap between lines is the strategy's cost at
# that tree size, and `replay`'s steeper line is the price of one pass per branch. Right, a tree of
# the size marked in the legend per request: x = requests per pass; the dotted line is the same
# batch decoding one token per request (batched AR). The gap between a strategy's line and the
# dotted line is what tree verification costs on top of plain batched decoding; if that gap grows
# with the batch, trees become harder to afford as the batch grows (section 4 turns this into a
# budget). `replay` is measured only up to batch 2.

# %%
savefig(th.verify_figure(verify, TREE_SIZES, BATCHES, n64), f"{NB}_verify")
plt.show()
display(verify[verify.nodes == n64].pivot(index="batch", columns="strategy", values="seconds").mul(1e3).round(1))
for text in th.verify_notes(verify, layer, n64, BATCHES):
    display(Markdown(text))

# %% [markdown]
# ## 4 · Tuning both sides, and a batch-wide node budget from a cost model profiled at start
# Tree and chain are each given their best shape on this machine before they are compared. A short
# pilot (batch 1, `PILOT_PROMPTS` held-out prompts not used below) decodes with AR, every chain
# length in `CHAIN_KS`, every EAGLE-2 tree (budget n, depth d) and every *chain + leaves* tree (the
# chain of length K plus sibling leaves whose path value is at least v: the draft model runs exactly
# as for the chain, so a leaf costs only its verification); batch 1 then uses each kind's
# configuration with the highest speedup over AR in the pilot. Speed is measured the workbook's one
# way (`bench.paired_runs` and `bench.speedup_table`: AR and every configuration back to back per
# prompt in alternating order, speedup = median over prompts of the per-prompt tokens-per-second
# ratio to AR; [the statistics notes](../docs/statistics.md), notebook 01 section 4). The runs also
# record, per step, the tokens gained E, the drafting seconds D and the verify seconds V. For a
# batch of b requests that draft one after another and verify in one shared pass,
# `bench_tree.choose_budget` combines the pilot's E(n), D(n) with the verify profile T_b(n) of
# section 3 and picks the n maximising `b·E(n) / (b·D(n) + T_b(n))`.
#
# Why tune both sides first? A comparison of "tree vs chain" is only as fair as the weaker side's
# configuration: a tree compared with a badly chosen chain length wins for the wrong reason. So each
# kind gets its best shape from the same pilot, on prompts that are not used afterwards (choosing
# and evaluating on the same prompts would favour whichever kind has more knobs to overfit).
#
# Only distinct trees are chosen from. An EAGLE-2 tree's nodes per level follow from its budget and
# depth alone (at most `TOP` = 4 per level, the remaining budget spread over the remaining levels), so
# any budget of `TOP` × depth or more draws the same full tree: the grid stops at that full tree
# (`PILOT_BUDGETS`). Configurations can still coincide — a 4-node tree of depth 4 is the chain of 4;
# a chain + leaves tree that drafted no leaf is the chain itself, and two leaf thresholds at the same
# K that drafted exactly as many leaves on every pilot prompt drew the same trees. Such a
# configuration (column `shape`: nodes per level, or what the leaves drafted) is marked a duplicate of
# the first one in the grid and never chosen, so the choice is not made on timing noise between
# identical configurations; it still runs, and its distance from its twin is a direct measure of that
# noise.
#
# Reading the cost model. Per step and per request, E(n) tokens are gained, D(n) seconds go to
# drafting (requests draft one after another) and one shared pass of T_b(n) seconds verifies all b
# trees; the batch then produces b·E(n) tokens in b·D(n) + T_b(n) seconds. At batch 1 a larger tree
# raises E a little and T a little; as b grows T_b(n) rises with b·n scored nodes while E(n) per
# request stays the same, so the best n shrinks. E and D come from real drafts in the pilot, T from
# random trees of n nodes in section 3 — the cost model is only as good as that match.
#
# Caveats. The pilot is short (`PILOT_PROMPTS` prompts), so its speedups carry timing noise of
# several percent and wide intervals; the choice is unbiased for the reported prompts because they
# are disjoint from the pilot's, not because the pilot is precise.

# %%
configs = th.pilot_configs(draft, CHAIN_KS, TREE_DEPTHS, PILOT_BUDGETS, SPINE_VALUES, TOP)
pilot_methods = th.pilot_methods(target, configs, MAX_NEW_TOKENS)  # AR and every configuration
pilot_runs = study.step(
    "pilot_runs",
    lambda: bench.paired_runs(pilot_prompts, pilot_methods, progress=tqdm).assign(**meta),
    uses=[
        "TARGET",
        "DRAFT",
        "CHAIN_KS",
        "TREE_DEPTHS",
        "TREE_SIZES",
        "SPINE_VALUES",
        "PILOT_PROMPTS",
        "N_PROMPTS",
        "MAX_NEW_TOKENS",
        "SEED",
        "THREADS",
    ],
)
pilot = th.pilot_table(pilot_runs, configs, seed=SEED)  # one row per configuration, duplicates marked
best_chain, best_tree, best_spine = th.best_per_kind(pilot)
K_CHAIN, TREE_BUDGET, TREE_DEPTH_BEST = int(best_chain.K), int(best_tree.budget), int(best_tree.depth)
K_SPINE, SPINE_VALUE = int(best_spine.K), float(best_spine.min_value)
results.save(pilot.assign(**meta), f"{NB}/pilot")
display(pilot.round(4))
budget = th.budget_table(pilot, verify, BATCHES, TREE_DEPTH_BEST)  # the cost model at the chosen depth
results.save(budget.assign(**meta), f"{NB}/budget")
display(budget[budget.chosen].set_index("batch")[th.BUDGET_COLUMNS].round(4))

# %% [markdown]
# ### Pilot and cost model: which shape, and how many nodes per request
# **Question.** Left: at batch 1, which draft shape — chain, EAGLE-2 tree, or chain + leaves —
# gives the highest speedup over AR, and how many nodes is it worth drafting? Right: as the batch
# grows, how large a tree can each request afford?
#
# **How to read it.** Left, the pilot: x = draft nodes *actually* drafted per step (mean, log
# scale), y = speedup over AR at batch 1 (median over the pilot prompts), higher is better. Black
# dashed squares are chains (one point per K); coloured circles EAGLE-2 trees of one depth (one point
# per budget, up to the full tree of that depth); triangles chain + leaves trees of one leaf
# threshold (one point per chain length K); rings mark each kind's choice. Right, the cost model: x =
# tree budget per request, y = predicted batch tokens per second, one line per batch size, the ring
# marks the budget it picks. A peak moving left as the batch grows is the expected pattern: bigger
# batches afford smaller trees.

# %%
savefig(th.budget_figure(pilot, budget, TREE_DEPTHS, SPINE_VALUES), f"{NB}_budget")
plt.show()
BATCH_BUDGET = th.batch_budget(budget, DECODE_BATCH)  # the cost model's budget per request at DECODE_BATCH
for text in th.pilot_notes(pilot, budget, PILOT_PROMPTS, N_PROMPTS):
    display(Markdown(text))

# %% [markdown]
# ## 5 · End-to-end decoding on `hybrid-target`
# Greedy, `MAX_NEW_TOKENS` new tokens per held-out prompt: target alone (AR), chain SD with the
# separate draft (the pilot's best K, closed-form strategy), tree SD with the same draft —
# EAGLE-2 confidence-expanded (the pilot's best budget and depth) under `closed_form` and under
# `materialize`, and chain + leaves (the pilot's best K and leaf value) under `closed_form`. Speed is
# measured the workbook's one way (`bench.paired_runs`, `bench.speedup_table`; [the statistics
# notes](../docs/statistics.md), notebook 01 section 4): per prompt, every method back to back in
# alternating order after a warm-up run, speedup = median over prompts of the tokens-per-second ratio
# to AR with a 95% bootstrap interval, the total-time ratio beside it. Every output must equal AR's.
#
# This is the test that pays for everything: drafting time, the verify pass, the commit that folds
# the accepted path into the recurrent state, and the bookkeeping. Two comparisons carry the
# argument. *Closed form vs materialize* uses the same drafter and the same trees, so the tokens per
# call are identical and any difference in speed is the state strategy alone. *Tree vs chain* asks
# whether the extra tokens a tree earns per pass are worth its larger pass; it is reported as a
# paired ratio — the same estimator with the chain in AR's place (`bench.speedup(runs, tree,
# reference=chain)`: the tree's tokens per second over the chain's on the same prompt, median over
# prompts) — because two speedups over AR with overlapping intervals can still differ reliably when
# paired.

# %%
chain, tree, mat, leaves = th.method_names(K_CHAIN)
decode_methods = th.decode_methods(
    target, draft, K_CHAIN, TREE_BUDGET, TREE_DEPTH_BEST, K_SPINE, SPINE_VALUE, MAX_NEW_TOKENS, TOP
)
# the step's table is decode_paired: "decode" is the summary saved below
decode = study.step(
    "decode_paired",
    lambda: bench.paired_runs(prompts, decode_methods, progress=tqdm).assign(**meta),
    uses=["pilot_runs", "verify"],
)
summary1 = th.decode_summary(decode, K_CHAIN, seed=SEED)  # batch 1, with each tree's paired ratio to the chain

# %% [markdown]
# ### Batch > 1
# `DECODE_BATCH` prompts decode together with `generate_batch`: each step every unfinished request
# drafts its own tree (budget `BATCH_BUDGET` per request) and all trees are verified in one forward.
# Throughput = new tokens of the batch / batch wall time; batched AR (one token per request per pass)
# is the baseline, and each request's output must equal its own AR output.
#
# A batch is not a single request's run, so the batch rows use their own estimator, not
# `bench.paired_runs`: per group of `DECODE_BATCH` prompts, the three methods run back to back in a
# fixed order (AR first) without a separate warm-up; the speedup is the median over groups of the
# method's batch throughput over batched AR's, with a bootstrap interval over groups (wide: there
# are only `N_PROMPTS` / `DECODE_BATCH` groups), and the total-time ratio beside it.
#
# Batched AR is a much stronger baseline than AR at batch 1: one pass already serves
# `DECODE_BATCH` requests, so the idle hardware that speculation exploits at batch 1 is partly used
# up. Speculation at batch > 1 wins only if the verify pass over all requests' trees stays close to
# the cost of a batched one-token pass (section 3's batch panel) while still multiplying the tokens
# per pass. The requests also finish at different times, and a step waits for the slowest drafter.


# %%
batched = study.step(
    "batched",
    lambda: th.batched_runs(
        target,
        DRAFT,
        DEVICE,
        prompts,
        DECODE_BATCH,
        K_CHAIN,
        BATCH_BUDGET,
        TREE_DEPTH_BEST,
        MAX_NEW_TOKENS,
        TOP,
        meta,
        progress=tqdm,
    ),
    uses=["pilot_runs", "verify", "DECODE_BATCH"],
)
choices = dict(tree_budget=TREE_BUDGET, tree_depth=TREE_DEPTH_BEST, batch_budget=BATCH_BUDGET, k_chain=K_CHAIN)
summary = th.decode_table(summary1, batched, DECODE_BATCH, SEED, **choices, meta=meta)
results.save(summary, f"{NB}/decode")
results.save(th.decode_runs(decode, batched, DECODE_BATCH, meta), f"{NB}/decode_runs")
display(summary[th.DECODE_COLUMNS].round(3))

# %% [markdown]
# ### End-to-end speedups
# **Question.** Paying for drafting, verification and commit, does tree speculation beat the chain
# on this hybrid model, does the state strategy matter end to end, and what is left at batch > 1?
#
# **How to read it.** One horizontal bar per method, grouped by batch size (blue: batch 1, orange:
# batch `DECODE_BATCH`); the bar is the speedup over AR *at the same batch size* (batch 1: median
# over prompts; batch > 1: median over groups of prompts), the whisker its 95% bootstrap interval and
# the number its value. AR itself is the vertical line at 1 — bars ending left of it are slower than
# AR. Two bars of the same batch with overlapping whiskers are not necessarily equal: the paired
# tree/chain ratio in the text below is the sharper comparison.

# %%
savefig(th.decode_figure(summary), f"{NB}_decode")
plt.show()
for text in th.decode_notes(summary, batched, DECODE_BATCH):
    display(Markdown(text))

# %% [markdown]
# ## 6 · Component-aware self-speculation
# The linear-attention subgraph of the hybrid model (every full-attention decoder layer skipped,
# `SelfDrafter`) drafts for the full model at zero extra parameters. The component-aware study found
# α = 0.68 at k = 2 on Falcon-H1 but only 0.038 on Qwen3.5, and that the ablated model's perplexity
# predicts it. We measure the acceptance rate (accepted / drafted) and the per-token acceptance
# (accepted / reached) at k = `SELF_KS` for the self-draft and the separate draft, and the held-out
# loss (`EVAL_WINDOWS` evenly spaced windows of 256 tokens) of the full model, the ablated subgraph
# and the separate draft. Speed is measured the workbook's one way (`bench.paired_runs`: AR and every
# drafter and k back to back per prompt, speedup = median over prompts of the tokens-per-second ratio
# to AR with a 95% bootstrap interval; [the statistics notes](../docs/statistics.md)).
#
# The appeal is obvious — no second model to train, ship or keep in memory, and the draft shares the
# target's tokenizer and embeddings by construction. The catch is in the two quantities of
# [the analytic model](../docs/analytic_model.md): acceptance α, which depends on how much of the
# target's behaviour survives without its attention layers, and cost c, the price of a draft token
# relative to a target pass. A subgraph that keeps most of the layers is expensive to run (c is far
# from 0), so it needs a high α just to break even, whereas a separate small draft is cheap even when
# it is often wrong. The held-out loss of the ablated model is measured because the component-aware
# study found it predicts α: a large loss increase when attention is removed means the
# attention layers carry much of what the model knows, and the subgraph will guess badly.
#
# Two acceptance measures are plotted: accepted / drafted (falls with k by construction, since later
# tokens are reached less often) and per-token acceptance, accepted / reached (the α of the analytic
# model, roughly flat in k if the drafter is equally good at every position).


# %%
losses = study.step(
    "ablation_loss",
    lambda: th.ablation_loss(target, draft, DRAFT, EVAL_WINDOWS, meta),
    uses=["TARGET", "DRAFT", "EVAL_WINDOWS"],
)
self_methods = th.self_methods(target, draft, DRAFT, SELF_KS, MAX_NEW_TOKENS)  # AR, self-draft and draft per k
self_runs = study.step(
    "selfspec_runs",
    lambda: bench.paired_runs(prompts, self_methods, progress=tqdm).assign(**meta),
    uses=["TARGET", "DRAFT", "SELF_KS", "N_PROMPTS", "MAX_NEW_TOKENS", "SEED", "THREADS"],
)
selfspec = th.selfspec_table(self_runs, seed=SEED)
results.save(selfspec.assign(**meta), f"{NB}/selfspec")
display(losses.round(3))
display(selfspec[th.SELFSPEC_COLUMNS].round(3))

# %% [markdown]
# ### Self-speculation against a separate draft
# **Question.** Is the model's own linear-attention subgraph a usable drafter for it — accepted
# often enough, and cheap enough, to beat AR and the separate small draft?
#
# **How to read it.** Left: acceptance against draft length k, one colour per drafter; solid circles
# accepted / drafted, dotted squares per-token acceptance; the two black stars are the
# component-aware study's values at k = 2 for Falcon-H1 (high) and Qwen3.5 (low), for scale. Right:
# speedup over AR against k (median over prompts, whiskers its 95% bootstrap interval); above the
# black line is faster than AR.
# A drafter whose acceptance is decent but whose speedup stays below 1 is too expensive per token;
# one whose speedup rises with k has cheap drafts and acceptance that holds up along the chain.

# %%
savefig(th.selfspec_figure(selfspec, SELF_KS), f"{NB}_selfspec")
plt.show()
n_attention = len(target.is_gdn) - sum(target.is_gdn)  # the layers the subgraph skips
for text in th.selfspec_notes(selfspec, losses, self_runs, DRAFT, SELF_KS, n_attention):
    display(Markdown(text))

# %% [markdown]
# ## 7 · A feature-level head on the hybrid target: tree vs chain
# The trees above are drafted by a separate model. EAGLE-style drafting instead runs a one-layer head
# on `TARGET`'s own hidden features (`HEAD`, trained with `python -m speclib train head TARGET`;
# [docs/feature_drafting.md](../docs/feature_drafting.md)): the hybrid forward hands the head the
# features of every committed position, kept for the accepted path exactly like its recurrent states.
# A head's draft token costs one decoder layer instead of a whole small model, and its confidence is
# calibrated against the target's own representation, which is what dynamic trees rank nodes by.
#
# **What is compared.** A pilot on the section-4 pilot prompts picks the head's best chain length
# (`HEAD_KS`) and best EAGLE-2 tree ([depth, budget] in `HEAD_TREES`, at most `TOP` children per node);
# then, on the reported prompts, back to back with AR: that chain, that tree verified with the closed
# form, and the same tree verified by materialising a state per node. The question is the issue's:
# **is tree SD with the head faster than chain SD with it on this CPU, and if not, why not?** The
# answer comes from the paired ratio tree/chain and from its parts: tokens per target call (what the
# tree buys) against the verify pass's cost v and the drafting cost per call (what it pays).
#
# **Reading the figure.** Left: speedup over AR of the three methods (95% CI over prompts). Right:
# the accounting per target call of the chain and the tree — tokens gained, drafting time and verify
# time per call, relative to one AR step.

# %%
head = speclib.load_head(HEAD)
target_f = speclib.load(TARGET, device=DEVICE)  # records the head's features; AR's target does not
target_mat = target_f.view(strategy="materialize")  # same weights, a full state per pending node
hdec = study.step(
    "head_decode",
    lambda: th.head_decode(
        target,
        target_f,
        target_mat,
        head,
        pilot_prompts,
        prompts,
        HEAD_KS,
        HEAD_TREES,
        MAX_NEW_TOKENS,
        TOP,
        SEED,
        meta,
        progress=tqdm,
    ),
    uses=["TARGET", "HEAD", "HEAD_KS", "HEAD_TREES", "N_PROMPTS", "PILOT_PROMPTS", "MAX_NEW_TOKENS", "SEED", "THREADS"],
)
head_summary, acct = th.head_tables(hdec, seed=SEED)  # the reported speedups; per call, what each gains and costs
results.save(head_summary.assign(**meta), f"{NB}/head_summary")  # not head_decode: that is the step's table
display(head_summary.round(3))
display(acct.round(3))
savefig(th.head_figure(head_summary, acct, TARGET, len(prompts)), f"{NB}_head")
plt.show()
display(Markdown(th.head_notes(hdec, head_summary, acct)))

# %% [markdown]
# ### This run's steps
# Each expensive step, whether this run computed it or read it from saved results (and from which
# commit), and how long it took when it was computed.

# %%
display(study.summary())

# %% [markdown]
# ## What to take away
#
# * **Exactness first.** Every strategy gives the same logits, and every decoded output above is
#   compared with AR token for token; a tree on a recurrent model is not an approximation.
# * **The closed form changes what a tree costs on a recurrent layer**: memory held until commit
#   drops by the analytic factor K·V/(K+V+1) (and twice that with bf16 factors), and verification
#   time no longer pays for writing a full state per node. The memory gap grows with K·V by
#   construction, so it is far larger at a real Qwen3.5 layer shape than at ours; section 2 shows
#   how far the time gap follows.
# * **Whether a tree then beats a chain is a separate, empirical question**: it depends on how many
#   more tokens per pass the tree earns on this draft/target pair against its larger verify pass,
#   and on the batch size. Read the paired tree/chain ratio in section 5, not the two speedups apart.
# * **Batch size moves the optimum.** The cost model's node budget per request shrinks as the batch
#   grows, and batched AR is a strong baseline.
#
# Caveats: small models on a CPU (kernel launch and Python overheads weigh more than on an
# accelerator, and the dense layers are cheap), one seed, greedy decoding, a short pilot whose choices
# carry timing noise (chosen on prompts disjoint from the reported ones, so the reported numbers are
# not inflated by it), random trees in the latency profile rather than the drafter's real trees, and
# trees bounded by the drafter's per-level width cap (`TOP` nodes per level, so at most `TOP` × depth
# nodes: the pilot's largest trees are small).

# %% [markdown]
# ## Exercises
#
# Run from the repository root. A run with changed parameters writes under
# `build/unpublished/03_tree_hybrid/<hash>/` and recomputes only the steps that use the changed
# parameters; the rest is read from the shipped results. Predict before running.
#
# 1. **Longer contexts for the verify pass.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/03_tree_hybrid.ipynb build/03_prefix.ipynb -p PREFIX_LEN 1024
#    ```
#
#    *Look for:* how T(n) of the three strategies moves with a longer cached prefix, and whether the
#    node budget chosen per batch changes. *Why:* the attention layers' cost per pass grows with the
#    prefix while the recurrent layers' does not, so the share of the pass that the tree strategy
#    affects shrinks; and a dearer pass raises the bar a tree must clear.
#
# 2. **Deeper trees in the pilot.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/03_tree_hybrid.ipynb build/03_depth.ipynb -p TREE_DEPTHS "[3, 4, 6, 8]"
#    ```
#
#    *Look for:* whether depth 8 earns more tokens per step than depth 6 and whether the pilot picks it.
#    *Why:* a node deep in the tree is reached only if every ancestor is accepted, so its expected
#    value is the product of the acceptances along its path; past some depth extra nodes cost a verify
#    slot and almost never pay.
#
# 3. **Bigger batches.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/03_tree_hybrid.ipynb build/03_batch.ipynb -p BATCHES "[1, 2, 4, 8, 16]"
#    ```
#
#    *Look for:* the chosen budget per request falling as the batch grows. *Why:* the verify pass of a
#    batch already fills the hardware with the batch's one-token passes; the spare capacity that a tree
#    spends shrinks, so each request can afford fewer nodes.
#
# 4. **More self-speculation draft lengths.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/03_tree_hybrid.ipynb build/03_self.ipynb -p SELF_KS "[1, 2, 3, 4, 6, 8]"
#    ```
#
#    Only the self-speculation runs are recomputed. *Look for:* whether the subgraph's speedup ever
#    crosses 1. *Why:* its cost per drafted token is a large fraction of the full model's, so `K·c`
#    grows almost as fast as the tokens a longer draft can earn.
