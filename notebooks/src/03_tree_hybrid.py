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
import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown, display
from tqdm.auto import tqdm

import speclib
from speclib import ModelDrafter, Sampling, SelfDrafter, TreeDrafter, generate, generate_batch
from speclib.core.device import clock
from speclib.lms import HybridLM
from speclib.lms.loading import HYBRID_TYPES
from speclib.research import bench, bench_tree, data, stats, train
from speclib.workbook import results
from speclib.workbook.plotting import savefig, style
from speclib.workbook.study import Study

if SMOKE:
    TREE_SIZES, BATCHES, LATENCY_REPEATS, N_PROMPTS, MAX_NEW_TOKENS = [8, 32], [1, 2], 2, 2, 24
    SELF_KS, EVAL_WINDOWS, DECODE_BATCH, CHAIN_KS, TREE_DEPTHS = [1, 2], 4, 2, [2, 4], [3]
    SPINE_VALUES, PILOT_PROMPTS, HEAD_KS, HEAD_TREES = [0.15], 2, [2], [[3, 6]]
NB = "03_tree_hybrid"
GREEDY = Sampling(0.0)
TOP = 4  # EAGLE-2 trees spend at most TOP nodes per level: at most TOP x depth nodes in all
# the pilot's tree budgets per depth: only budgets that can change the tree (a budget of TOP x depth or more
# draws the same full tree), the full tree included
PILOT_BUDGETS = {d: sorted({n for n in [4] + TREE_SIZES if d <= n < TOP * d} | {TOP * d}) for d in TREE_DEPTHS}
style()
torch.manual_seed(SEED)
threads = speclib.core.device.set_threads(THREADS or None)
target, draft = speclib.load(TARGET, device=DEVICE), speclib.load(DRAFT, device=DEVICE)
if not isinstance(target, HybridLM):  # trees on recurrent states, the closed form and the linear subgraph
    raise ValueError(
        f"TARGET {TARGET!r} loads as {type(target).__name__}: this notebook needs a Gated DeltaNet "
        f"hybrid that speclib runs with its own forward (HybridLM: {', '.join(HYBRID_TYPES)})"
    )
dev = str(target.device)
cfg = target.config
half = max(1, N_PROMPTS // 2)
prompt_rows = data.load_workload("code_stdlib", half) + data.load_workload("code_humaneval", N_PROMPTS - half)
prompts = [target.encode(r["prompt"]) for r in prompt_rows]
meta = dict(seed=SEED, device=dev, target=TARGET, draft=DRAFT, threads=threads, smoke=SMOKE)
study = Study(
    NB, globals(), mode=RESULTS, publish=PUBLISH, always=dict(SMOKE=SMOKE), calibrate=target
)  # target T(1) before/after each step
print(f"results mode {RESULTS!r}: this run {study.where()}")
gdn = [l.linear_attn for l, g in zip(target.text.layers, target.is_gdn) if g]
H, DK, DV = gdn[0].num_v_heads, gdn[0].head_k_dim, gdn[0].head_v_dim
print(
    f"{type(target).__name__} over {cfg.model_type}: {sum(target.is_gdn)} GDN + {len(target.is_gdn) - sum(target.is_gdn)} "
    f"attention layers, GDN heads {H} x K {DK} x V {DV}; {len(prompts)} prompts; device {dev}"
)

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
def peer_check():
    ids = prompts[0]
    try:
        with torch.inference_mode():
            target.model.generate(
                torch.tensor([ids], device=target.device),
                assistant_model=draft.model,
                do_sample=False,
                max_new_tokens=16,
                pad_token_id=target.eos_token_id,
            )
        refusal = "(no error: this transformers version accepted the hybrid model)"
    except Exception as e:  # the refusal is the point of this cell
        refusal = f"{type(e).__name__}: {e}"
    ar = generate(target, ids, 32, sampling=GREEDY)
    sd = generate(target, ids, 32, drafter=TreeDrafter(draft, budget=16, depth=TREE_DEPTH, top=TOP), sampling=GREEDY)
    with torch.inference_mode():  # the stock forward (its own cache and torch fallbacks), for reference
        t0 = clock(target.device)
        hf = target.model.generate(
            torch.tensor([ids], device=target.device),
            do_sample=False,
            max_new_tokens=32,
            pad_token_id=target.eos_token_id,
        )[0, len(ids) :].tolist()
        hf_s = clock(target.device) - t0
    peer = pd.DataFrame(
        [
            dict(
                method="transformers generate (greedy)",
                tokens_per_s=len(hf) / hf_s,
                identical_to_speclib_ar=hf == ar.tokens,
            ),
            dict(method="speclib AR (HybridLM)", tokens_per_s=ar.stats.tokens_per_s, identical_to_speclib_ar=True),
            dict(
                method="speclib tree SD",
                tokens_per_s=sd.stats.tokens_per_s,
                identical_to_speclib_ar=sd.tokens == ar.tokens,
            ),
        ]
    )
    return peer.assign(refusal=refusal, sd_tokens_per_call=sd.stats.tokens_per_call, sd_text=sd.text[:200], **meta)


peer = study.step("peer", peer_check, uses=["TARGET", "DRAFT", "TREE_DEPTH", "N_PROMPTS", "THREADS"])
refusal = peer.refusal[0]
print("transformers assisted generation:", refusal)
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
shapes = {"hybrid-target": (H, DK, DV), "Qwen3.5 layer (32 x 128 x 128)": (32, 128, 128)}


def layer_timings():
    layer_rows = []
    for shape_name, (h, dk, dv) in shapes.items():
        for n in tqdm(TREE_SIZES, desc=shape_name):
            r = bench_tree.layer_state_bytes(n, h, dk, dv, depth=TREE_DEPTH, seed=SEED, repeats=LATENCY_REPEATS)
            layer_rows.append(dict(layer_shape=shape_name, **r))
    layer = pd.DataFrame(layer_rows)
    layer["speedup"] = layer.materialize_seconds / layer.closed_form_seconds
    layer["memory_ratio_fp32"] = layer.materialize_bytes / layer.closed_form_fp32_bytes
    layer["memory_ratio_bf16"] = layer.materialize_bytes / layer.closed_form_bf16_bytes
    return layer.assign(**meta)


layer = study.step(
    "layer", layer_timings, uses=["TARGET", "TREE_SIZES", "TREE_DEPTH", "LATENCY_REPEATS", "SEED", "THREADS"]
)
display(
    layer[
        [
            "layer_shape",
            "nodes",
            "closed_form_seconds",
            "materialize_seconds",
            "speedup",
            "memory_ratio_fp32",
            "memory_ratio_bf16",
        ]
    ].round(4)
)

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
fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
for i, (shape_name, g) in enumerate(layer.groupby("layer_shape", sort=False)):
    axes[0].plot(g.nodes, g.closed_form_seconds * 1e3, "o-", color=f"C{i}", label=f"closed form, {shape_name}")
    axes[0].plot(g.nodes, g.materialize_seconds * 1e3, "s--", color=f"C{i}", label=f"state per node, {shape_name}")
    axes[1].plot(
        g.nodes, g.materialize_bytes / 2**20, "s--", color=f"C{i}", label=f"state per node (fp32), {shape_name}"
    )
    axes[1].plot(g.nodes, g.closed_form_bf16_bytes / 2**20, "o-", color=f"C{i}", label=f"factors (bf16), {shape_name}")
axes[0].set(
    xscale="log", yscale="log", xlabel="tree nodes", ylabel="ms per layer", title="GDN tree verification, one layer"
)
axes[1].set(
    xscale="log",
    yscale="log",
    xlabel="tree nodes",
    ylabel="MiB held until commit",
    title="Speculative state, one layer",
)
for ax in axes:
    ax.set_xticks(TREE_SIZES, [str(n) for n in TREE_SIZES])
    ax.minorticks_off()
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1, frameon=False)
savefig(fig, f"{NB}_layer")
plt.show()
n64 = 64 if 64 in TREE_SIZES else TREE_SIZES[-1]
q = layer[(layer.layer_shape != "hybrid-target") & (layer.nodes == n64)].iloc[0]
o = layer[(layer.layer_shape == "hybrid-target") & (layer.nodes == n64)].iloc[0]
display(
    Markdown(
        f"At {n64} nodes the closed form verifies one layer **{o.speedup:.1f}x** faster than a state per node at our "
        f"shape and **{q.speedup:.1f}x** at the Qwen3.5 shape (seed study: 3.4–7.7x). It holds "
        f"**{q.memory_ratio_fp32:.0f}x** less speculative state at the Qwen3.5 shape with fp32 factors and "
        f"**{q.memory_ratio_bf16:.0f}x** with bf16 factors ({q.materialize_bytes / 2**20:.0f} MiB vs "
        f"{q.closed_form_bf16_bytes / 2**20:.2f} MiB per layer; seed study: 82–99x)."
    )
)
lo_n, hi_n = min(TREE_SIZES), max(TREE_SIZES)
growth = {
    (s_, col): layer[(layer.layer_shape == s_) & (layer.nodes == hi_n)][col].iloc[0]
    / layer[(layer.layer_shape == s_) & (layer.nodes == lo_n)][col].iloc[0]
    for s_ in shapes
    for col in ("closed_form_seconds", "materialize_seconds")
}
analytic = {s_: dk * dv / (dk + dv + 1) for s_, (_, dk, dv) in shapes.items()}
display(
    Markdown(
        "**Reading.** Memory "
        + (
            "behaves exactly as counted"
            if all(
                abs(layer[layer.layer_shape == s_].memory_ratio_fp32.mean() / analytic[s_] - 1) < 0.05 for s_ in shapes
            )
            else "departs from the simple count"
        )
        + ": the measured fp32-factor ratio is "
        + ", ".join(
            f"{layer[layer.layer_shape == s_].memory_ratio_fp32.mean():.1f}x at the {s_} shape "
            f"(analytic K·V/(K+V+1) = {analytic[s_]:.1f})"
            for s_ in shapes
        )
        + (
            ", the same at every tree size, because both strategies store a fixed amount per node. "
            if layer.groupby("layer_shape").memory_ratio_fp32.agg(lambda r: r.max() / r.min()).max() < 1.01
            else ", varying a little with the tree size (the factors or states include per-tree terms). "
        )
        + f"Time is "
        f"less clean: from {lo_n} to {hi_n} nodes ({hi_n // lo_n}x the nodes) the closed form's time grows "
        + ", ".join(f"{growth[(s_, 'closed_form_seconds')]:.1f}x ({s_})" for s_ in shapes)
        + " and the state-per-node time "
        + ", ".join(f"{growth[(s_, 'materialize_seconds')]:.1f}x ({s_})" for s_ in shapes)
        + f". A small tree leaves the closed form's fixed overheads (the triangular solve, kernel launches) "
        f"visible, so the layer ratio depends on the tree size; the memory ratio does not. The larger the state per "
        f"head (K·V), the more a per-node state costs to write and to hold: at {n64} nodes the time advantage is "
        f"{q.speedup:.1f}x at the Qwen3.5 shape against {o.speedup:.1f}x at ours"
        + (
            ", so the closed form matters more, not less, on real model sizes."
            if q.speedup > o.speedup
            else " — here the larger shape does not widen the time gap, though it widens the memory gap."
        )
    )
)

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
strategies = ["closed_form", "materialize", "replay"]
# the tree sizes of section 2, and every budget the pilot of section 4 can draft (its cost model needs their T_b(n))
sizes = sorted(set([1] + TREE_SIZES) | {n for b in PILOT_BUDGETS.values() for n in b})


def verify_timings():
    lat_rows = []
    for b in tqdm(BATCHES, desc="batch"):
        # replay re-runs the model once per branch: measured where it stays affordable (batch <= 2)
        strat = strategies if b <= 2 else strategies[:2]
        lat_rows += bench_tree.tree_latency(
            target, strat, sizes, [b], prefix_len=PREFIX_LEN, repeats=LATENCY_REPEATS, depth=TREE_DEPTH, seed=SEED
        )
    verify = pd.DataFrame(lat_rows)
    base = verify[(verify.nodes == 1) & (verify.strategy == "closed_form")].set_index("batch").seconds
    verify["over_one_token"] = verify.seconds / verify.batch.map(base)
    # the speculative state each strategy holds after extending one tree (batch 1, n64 nodes)
    gen = torch.Generator().manual_seed(SEED)
    par64 = bench_tree.random_tree(n64, TREE_DEPTH, gen)
    mem = {}
    for s in strategies:
        v = target.view(strategy=s)
        v.reset(prompts[0][:PREFIX_LEN])
        if s == "replay":
            path = max(bench_tree.leaf_paths(par64), key=len)  # replay holds one branch at a time
            v.extend([7] * len(path), list(range(-1, len(path) - 1)))
        else:
            v.extend([7] * n64, par64)
        mem[s] = bench_tree.state_bytes(v)
    verify["state_bytes_at_n64"] = verify.strategy.map(mem)
    return verify.assign(**meta)


verify = study.step(
    "verify",
    verify_timings,
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
mem = verify.groupby("strategy").state_bytes_at_n64.first().to_dict()  # speculative state held per strategy

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
fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
for i, s in enumerate(strategies):
    g = verify[(verify.strategy == s) & (verify.batch == 1) & (verify.nodes > 1)]
    axes[0].plot(g.nodes, g.seconds * 1e3, "o-", color=f"C{i}", label=s)
    g = verify[(verify.strategy == s) & (verify.nodes == n64)]
    axes[1].plot(g.batch, g.seconds * 1e3, "o-", color=f"C{i}", label=f"{s}, {n64} nodes / request")
g = verify[(verify.strategy == "closed_form") & (verify.nodes == 1)]
axes[1].plot(g.batch, g.seconds * 1e3, "k:", label="one token / request")
axes[0].set(
    xscale="log", yscale="log", xlabel="tree nodes", ylabel="ms per verify pass", title="hybrid-target, batch 1"
)
axes[1].set(
    xscale="log",
    yscale="log",
    xlabel="batch (requests per pass)",
    ylabel="ms per verify pass",
    title="hybrid-target vs batch",
)
axes[0].set_xticks(TREE_SIZES, [str(n) for n in TREE_SIZES])
axes[1].set_xticks(BATCHES, [str(b) for b in BATCHES])
for ax in axes:
    ax.minorticks_off()
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
savefig(fig, f"{NB}_verify")
plt.show()
v1 = verify[(verify.batch == 1) & (verify.nodes == n64)].set_index("strategy").seconds
display(verify[verify.nodes == n64].pivot(index="batch", columns="strategy", values="seconds").mul(1e3).round(1))
display(
    Markdown(
        f"At {n64} nodes and batch 1 a closed-form verify pass takes {v1['closed_form'] * 1e3:.0f} ms, "
        f"{v1['materialize'] / v1['closed_form']:.2f}x faster than materialising states and "
        f"{v1['replay'] / v1['closed_form']:.1f}x faster than branch-by-branch replay. Speculative state held "
        f"over all GDN layers: closed form {mem['closed_form'] / 2**20:.2f} MiB, materialize "
        f"{mem['materialize'] / 2**20:.2f} MiB ({mem['materialize'] / mem['closed_form']:.0f}x; both include the "
        f"pending conv inputs), replay {mem['replay'] / 2**20:.2f} MiB for one branch."
    )
)
cf = verify[verify.strategy == "closed_form"].set_index(["batch", "nodes"]).seconds
b_hi = max(BATCHES)
display(
    Markdown(
        f"**Reading.** At batch 1, scoring {n64} nodes with the closed form costs {cf[1, n64] / cf[1, 1]:.1f}x a one-token "
        f"pass (the v(n) of the analytic model), so a {n64}-node tree must commit more than {cf[1, n64] / cf[1, 1]:.1f} "
        f"tokens per pass just to match AR, before drafting is even counted. Across the batch, a one-token-per-request pass grows "
        f"{cf[b_hi, 1] / cf[1, 1]:.1f}x from batch 1 to {b_hi} (the weights are read once for all requests), while a "
        f"{n64}-node tree per request grows {cf[b_hi, n64] / cf[1, n64]:.1f}x: at batch {b_hi} the tree pass costs "
        f"{cf[b_hi, n64] / cf[b_hi, 1]:.1f}x the batched one-token pass, against {cf[1, n64] / cf[1, 1]:.1f}x at batch 1. "
        f"Closed form against a state per node: {v1['materialize'] / v1['closed_form']:.2f}x for the whole model at "
        f"{n64} nodes, {o.speedup:.1f}x for one of its GDN layers alone"
        + (
            " — smaller, because the projections, MLPs and attention cost the same under every strategy; what survives "
            "is the recurrence's share of the pass."
            if v1["materialize"] / v1["closed_form"] < o.speedup
            else " — not smaller here, so the per-node states also slow the rest of the pass (memory traffic)."
        )
    )
)

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
pilot_prompts = [target.encode(r["prompt"]) for r in data.load_workload("code_stdlib", half + PILOT_PROMPTS)[half:]]


def spine(k, v, d=draft):
    return TreeDrafter(d, budget=3 * k, expand="spine", depth=k, top=3, min_value=v)


def levels(n, d):
    """Nodes per level of an EAGLE-2 tree with budget n and depth d (the width rule of speclib.drafters.tree)."""
    out, left = [], n
    for i in range(d):
        if left <= 0:
            break
        out.append(min(TOP, left, -(-left // (d - i))))
        left -= out[-1]
    return tuple(out)


configs = (
    [
        dict(
            method=f"chain K={k}",
            kind="chain",
            K=k,
            budget=k,
            depth=k,
            shape=(1,) * k,
            make=lambda k=k: ModelDrafter(draft, k),
        )
        for k in CHAIN_KS
    ]
    + [
        dict(
            method=f"tree n={n} d={d}",
            kind="tree",
            budget=n,
            depth=d,
            shape=levels(n, d),
            make=lambda n=n, d=d: TreeDrafter(draft, budget=n, depth=d, top=TOP),
        )
        for d in TREE_DEPTHS
        for n in PILOT_BUDGETS[d]
    ]
    + [
        dict(
            method=f"chain + leaves K={k} v={v}",
            kind="chain + leaves",
            K=k,
            budget=3 * k,
            depth=k,
            min_value=v,
            make=lambda k=k, v=v: spine(k, v),
        )
        for k in CHAIN_KS
        for v in SPINE_VALUES
    ]
)
pilot_methods = {"AR": lambda ids, i: generate(target, ids, MAX_NEW_TOKENS, sampling=GREEDY)}
pilot_methods.update(
    {
        c["method"]: lambda ids, i, make=c["make"]: generate(
            target, ids, MAX_NEW_TOKENS, drafter=make(), sampling=GREEDY
        )
        for c in configs
    }
)
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
sums = pilot_runs.groupby("method", sort=False)[
    ["target_calls", "accepted", "drafted", "draft_s", "verify_s", "new_tokens", "seconds"]
].sum()
steps = sums.target_calls
per_step = pd.DataFrame(
    dict(
        tokens_per_step=(sums.accepted + steps) / steps,
        draft_s=sums.draft_s / steps,
        verify_s=sums.verify_s / steps,
        drafted_per_step=sums.drafted / steps,
        tokens_per_s=sums.new_tokens / sums.seconds,
    )
)
# chain + leaves trees: no leaf drafted = the chain itself; otherwise identified by the leaves drafted per prompt
for c in (c for c in configs if c["kind"] == "chain + leaves"):
    g = pilot_runs[pilot_runs.method == c["method"]].sort_values(["prompt", "round"])
    no_leaves = (g.drafted == c["K"] * g.target_calls).all()
    c["shape"] = (1,) * c["K"] if no_leaves else ("leaves", c["K"], tuple(int(x) for x in g.drafted))
first_with = {}
pilot = pd.DataFrame([{k: v for k, v in c.items() if k != "make"} for c in configs])
pilot["duplicate_of"] = [first_with.setdefault(c["shape"], c["method"]) for c in configs]
pilot["shape"] = pilot["shape"].map(str)
pilot["duplicate_of"] = pilot.duplicate_of.where(pilot.duplicate_of != pilot.method)
pilot = pilot.merge(
    bench.speedup_table(pilot_runs, seed=SEED)[["method", "speedup", "lo", "hi", "total_ratio"]], on="method"
).join(per_step, on="method")
distinct = pilot.duplicate_of.isna()
eligible = pilot[distinct | ~pilot.kind.isin(pilot.kind[distinct])]  # a kind without a distinct row keeps all
pilot["chosen"] = pilot.index.isin(eligible.groupby("kind", sort=False).speedup.idxmax())
best_chain, best_tree, best_spine = (
    pilot[pilot.chosen & (pilot.kind == k)].iloc[0] for k in ("chain", "tree", "chain + leaves")
)
K_CHAIN, TREE_BUDGET, TREE_DEPTH_BEST = int(best_chain.K), int(best_tree.budget), int(best_tree.depth)
K_SPINE, SPINE_VALUE = int(best_spine.K), float(best_spine.min_value)
results.save(pilot.assign(**meta), f"{NB}/pilot")
display(pilot.round(4))

# every budget at the chosen depth: within one depth each budget draws its own tree shape
tp = pilot[(pilot.kind == "tree") & (pilot.depth == TREE_DEPTH_BEST)].set_index("budget")
budget_rows = []
for b in BATCHES:
    g = verify[(verify.strategy == "closed_form") & (verify.batch == b)]
    T = dict(zip(g.nodes.astype(int), g.seconds))
    best_n, rate = bench_tree.choose_budget(T, b, tp.tokens_per_step.to_dict(), tp.draft_s.to_dict())
    for n, r in rate.items():
        budget_rows.append(
            dict(
                batch=b,
                budget_per_request=n,
                depth=TREE_DEPTH_BEST,
                tokens_per_step=tp.tokens_per_step[n],
                drafted_per_step=tp.drafted_per_step[n],
                draft_s=tp.draft_s[n],
                verify_s=T[n],
                predicted_tokens_per_s=r,
                chosen=n == best_n,
            )
        )
budget = pd.DataFrame(budget_rows)
results.save(budget.assign(**meta), f"{NB}/budget")
chosen = budget[budget.chosen].set_index("batch")
display(chosen[["budget_per_request", "tokens_per_step", "draft_s", "verify_s", "predicted_tokens_per_s"]].round(4))

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
fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
for i, d in enumerate(TREE_DEPTHS):
    g = pilot[(pilot.kind == "tree") & (pilot.depth == d)]
    axes[0].plot(g.drafted_per_step, g.speedup, "o-", color=f"C{i}", label=f"tree, depth {d}")
g = pilot[pilot.kind == "chain"]
axes[0].plot(g.drafted_per_step, g.speedup, "s--", color="k", label="chain, K draft tokens")
for j, v in enumerate(SPINE_VALUES):
    g = pilot[(pilot.kind == "chain + leaves") & (pilot.min_value == v)]
    axes[0].plot(
        g.drafted_per_step, g.speedup, "^:", color=f"C{len(TREE_DEPTHS) + j}", label=f"chain K + leaves, value ≥ {v}"
    )
c_ = pilot[pilot.chosen]
axes[0].scatter(
    c_.drafted_per_step,
    c_.speedup,
    s=180,
    facecolors="none",
    edgecolors="C3",
    lw=2,
    zorder=3,
    label="chosen (per kind)",
)
axes[0].axhline(1, color="k", lw=0.8)
axes[0].set(
    xscale="log",
    xlabel="draft nodes per step (mean, as drafted)",
    ylabel="speedup over AR (pilot, batch 1)",
    title="Pilot: tree shapes vs chains",
)
ticks = [
    t for t in (1, 2, 4, 8, 16, 32, 64) if pilot.drafted_per_step.min() / 1.5 <= t <= pilot.drafted_per_step.max() * 1.5
]
axes[0].set_xticks(ticks, [str(t) for t in ticks])
axes[0].minorticks_off()
axes[0].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
for i, (b, g) in enumerate(budget.groupby("batch")):
    axes[1].plot(g.budget_per_request, g.predicted_tokens_per_s, "o-", color=f"C{i}", label=f"batch {b}")
    c = g[g.chosen].iloc[0]
    axes[1].scatter(
        [c.budget_per_request], [c.predicted_tokens_per_s], s=150, facecolors="none", edgecolors=f"C{i}", lw=2
    )
axes[1].set(
    xscale="log",
    xlabel="tree budget per request (nodes)",
    ylabel="predicted tokens / s (batch)",
    title=f"Cost model, depth {TREE_DEPTH_BEST}: where the budget pays",
)
bticks = sorted(budget.budget_per_request.unique())
axes[1].set_xticks(bticks, [str(int(t)) for t in bticks])
axes[1].minorticks_off()
axes[1].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4, frameon=False)
savefig(fig, f"{NB}_budget")
plt.show()
BATCH_BUDGET = int(chosen.budget_per_request.get(DECODE_BATCH, chosen.budget_per_request.iloc[-1]))


def fmt(r):
    return f"{r.speedup:.2f}x AR in the pilot, CI {r.lo:.2f}–{r.hi:.2f}"


display(
    Markdown(
        f"Best chain: **K = {K_CHAIN}** ({fmt(best_chain)}); best tree: **{TREE_BUDGET} nodes, depth {TREE_DEPTH_BEST}** "
        f"({fmt(best_tree)}; {best_tree.tokens_per_step:.2f} tokens per step, {best_tree.drafted_per_step:.1f} nodes); "
        f"best chain + leaves: **K = {K_SPINE}, leaf value ≥ {SPINE_VALUE}** ({fmt(best_spine)}; "
        f"{best_spine.tokens_per_step:.2f} tokens per step, {best_spine.drafted_per_step:.1f} nodes). "
        f"Batch 1 decodes with the pilot's measured best; for larger batches the cost model decides (its own batch-1 "
        f"choice, {int(chosen.budget_per_request.iloc[0])}, shows how far a profile of random trees is from real drafts). "
        f"Cost-model budget per request by batch size: "
        + ", ".join(f"{b}: {int(r.budget_per_request)}" for b, r in chosen.iterrows())
        + "."
    )
)
dups = pilot[pilot.duplicate_of.notna()]
noise = "; ".join(
    f"{r.method} draws the same trees as {r.duplicate_of}: {r.speedup:.2f}x vs "
    f"{pilot.set_index('method').speedup[r.duplicate_of]:.2f}x"
    for r in dups.itertuples()
)
others = eligible[~eligible.index.isin(pilot.index[pilot.chosen])]
close = others[others.hi >= others.kind.map(pilot[pilot.chosen].set_index("kind").speedup)]
used = best_tree.drafted_per_step
display(
    Markdown(
        "**Reading.** "
        + (
            f"Configurations that drafted the same trees give the pilot's noise level directly — {noise}. "
            if len(dups)
            else "No two configurations drafted the same trees, so the pilot gives no direct "
            "measure of its own noise beyond its intervals. "
        )
        + f"With {PILOT_PROMPTS} pilot prompts the intervals are wide: {len(close)} of the {len(others)} configurations not "
        f"chosen have an upper interval end at or above the chosen speedup of their kind, so the pilot ranks the shapes "
        f"only roughly, and section 5 settles tree against chain on {N_PROMPTS} other prompts. The chosen tree (budget "
        f"{TREE_BUDGET}, depth {TREE_DEPTH_BEST}) drafts {used:.1f} nodes per step on average"
        + (
            f", fewer than its budget, while the cost model's verify profile T_b({TREE_BUDGET}) prices a full "
            f"{TREE_BUDGET}-node tree, so it is a little pessimistic about this budget. "
            if used < TREE_BUDGET - 0.5
            else ". "
        )
        + f"In the right panel the predicted rate at the chosen budget goes from "
        f"{chosen.predicted_tokens_per_s.iloc[0]:.0f} tokens/s at batch {chosen.index[0]} to "
        f"{chosen.predicted_tokens_per_s.iloc[-1]:.0f} at batch {chosen.index[-1]} "
        + (
            "(batching raises throughput)"
            if chosen.predicted_tokens_per_s.iloc[-1] > chosen.predicted_tokens_per_s.iloc[0]
            else "(batching does not raise the predicted throughput here)"
        )
        + "; the budget a request can afford is where its curve peaks."
    )
)

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
chain = f"chain SD (K = {K_CHAIN})"
tree, mat, leaves = "tree SD, closed_form", "tree SD, materialize", "tree SD (chain + leaves), closed_form"


def eagle():
    return TreeDrafter(draft, budget=TREE_BUDGET, depth=TREE_DEPTH_BEST, top=TOP)


decode_methods = {
    "AR": lambda ids, i: generate(target, ids, MAX_NEW_TOKENS, sampling=GREEDY),
    chain: lambda ids, i: generate(target, ids, MAX_NEW_TOKENS, drafter=ModelDrafter(draft, K_CHAIN), sampling=GREEDY),
    tree: lambda ids, i: generate(target, ids, MAX_NEW_TOKENS, drafter=eagle(), sampling=GREEDY),
    mat: lambda ids, i: generate(
        target.view(strategy="materialize"), ids, MAX_NEW_TOKENS, drafter=eagle(), sampling=GREEDY
    ),
    leaves: lambda ids, i: generate(target, ids, MAX_NEW_TOKENS, drafter=spine(K_SPINE, SPINE_VALUE), sampling=GREEDY),
}
# the step's table is decode_paired: "decode" is the summary saved below
decode = study.step(
    "decode_paired",
    lambda: bench.paired_runs(prompts, decode_methods, progress=tqdm).assign(**meta),
    uses=["pilot_runs", "verify"],
)
decode["drafted_per_call"] = decode.drafted / decode.target_calls.clip(lower=1)
per_method = decode.groupby("method", sort=False).agg(
    tokens_per_s=("tokens_per_s", "median"), drafted_per_call=("drafted_per_call", "mean")
)
ar_rows = decode[decode.method == "AR"]
summary1 = pd.concat(
    [
        pd.DataFrame(
            [
                dict(
                    method="AR",
                    speedup=1.0,
                    lo=1.0,
                    hi=1.0,
                    total_ratio=1.0,
                    tokens_per_call=ar_rows.tokens_per_call.mean(),
                    identical=len(ar_rows),
                    runs=len(ar_rows),
                )
            ]
        ),
        bench.speedup_table(decode, seed=SEED),
    ],
    ignore_index=True,
).join(per_method, on="method")
vs_chain = {m: bench.speedup(decode, m, reference=chain, seed=SEED) for m in (tree, mat, leaves)}  # paired per prompt
for col, key in [
    ("vs_chain", "speedup"),
    ("vs_chain_lo", "lo"),
    ("vs_chain_hi", "hi"),
    ("vs_chain_total", "total_ratio"),
]:
    summary1[col] = summary1.method.map({m: v[key] for m, v in vs_chain.items()})
summary1 = summary1.rename(columns={"runs": "of"}).assign(batch=1)

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
def batched_runs():
    groups = [list(range(s, s + DECODE_BATCH)) for s in range(0, len(prompts) - DECODE_BATCH + 1, DECODE_BATCH)]
    batch_drafts = [speclib.load(DRAFT, device=DEVICE) for _ in range(DECODE_BATCH)]  # one draft state per request
    batch_rows = []
    for gi, idx in enumerate(tqdm(groups, desc="batches")):
        ps = [prompts[i] for i in idx]
        runs = {
            "AR": None,
            chain: [ModelDrafter(d, K_CHAIN) for d in batch_drafts],
            tree: [TreeDrafter(d, budget=BATCH_BUDGET, depth=TREE_DEPTH_BEST, top=TOP) for d in batch_drafts],
        }
        ar_tokens = None
        for name, drafters in runs.items():
            t0 = clock(target.device)
            out = generate_batch([target.view() for _ in ps], ps, MAX_NEW_TOKENS, drafters=drafters, sampling=GREEDY)
            secs = clock(target.device) - t0
            toks = [g.tokens for g in out]
            ar_tokens = toks if name == "AR" else ar_tokens
            batch_rows.append(
                dict(
                    group=gi,
                    method=name,
                    seconds=secs,
                    new_tokens=sum(map(len, toks)),
                    tokens_per_call=np.mean([g.stats.tokens_per_call for g in out]),
                    identical=sum(a == b for a, b in zip(toks, ar_tokens)),
                    of=len(ps),
                )
            )
    batched = pd.DataFrame(batch_rows)
    return batched.assign(**meta)


batched = study.step("batched", batched_runs, uses=["pilot_runs", "verify", "DECODE_BATCH"])
batched["tokens_per_s"] = batched.new_tokens / batched.seconds
ar_b = batched[batched.method == "AR"].set_index("group")
summary_b = []
for name, g in batched.groupby("method", sort=False):
    g = g.set_index("group")
    ratio = (g.tokens_per_s / ar_b.tokens_per_s.loc[g.index]).to_numpy()
    est, lo, hi = stats.bootstrap_ci(ratio, seed=SEED) if len(ratio) > 1 else (ratio[0], np.nan, np.nan)
    total = (g.new_tokens.sum() / g.seconds.sum()) / (ar_b.new_tokens.sum() / ar_b.seconds.sum())
    summary_b.append(
        dict(
            method=name,
            batch=DECODE_BATCH,
            speedup=est,
            lo=lo,
            hi=hi,
            total_ratio=total,
            tokens_per_s=g.tokens_per_s.median(),
            tokens_per_call=g.tokens_per_call.mean(),
            drafted_per_call=np.nan,
            identical=int(g.identical.sum()),
            of=int(g.of.sum()),
        )
    )
summary = pd.concat([summary1, pd.DataFrame(summary_b)], ignore_index=True).assign(
    tree_budget=TREE_BUDGET, tree_depth=TREE_DEPTH_BEST, batch_budget=BATCH_BUDGET, chain_k=K_CHAIN, **meta
)
results.save(summary, f"{NB}/decode")
results.save(
    pd.concat([decode.assign(batch=1), batched.assign(batch=DECODE_BATCH)]).drop(columns="git_sha").assign(**meta),
    f"{NB}/decode_runs",
)
display(
    summary[
        [
            "method",
            "batch",
            "speedup",
            "lo",
            "hi",
            "total_ratio",
            "vs_chain",
            "vs_chain_lo",
            "vs_chain_hi",
            "vs_chain_total",
            "tokens_per_s",
            "tokens_per_call",
            "drafted_per_call",
            "identical",
            "of",
        ]
    ].round(3)
)

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
bars = summary[summary.method != "AR"].reset_index(drop=True)
fig, ax = plt.subplots(figsize=(8.5, 0.5 * len(bars) + 1.4))
y = np.arange(len(bars))[::-1]
lo_err = (bars.speedup - bars.lo.fillna(bars.speedup)).clip(lower=0)
hi_err = (bars.hi.fillna(bars.speedup) - bars.speedup).clip(lower=0)
ax.barh(
    y, bars.speedup, xerr=[lo_err, hi_err], capsize=3, height=0.65, color=[f"C{0 if b == 1 else 1}" for b in bars.batch]
)
for yi, (sp, hi) in zip(y, zip(bars.speedup, bars.hi.fillna(bars.speedup))):
    ax.text(max(sp, hi) + 0.02, yi, f"{sp:.2f}x", va="center", fontsize=8)
ax.axvline(1, color="k", lw=0.8)
ax.set_yticks(y, [f"{m} (batch {b})" for m, b in zip(bars.method, bars.batch)], fontsize=9)
ax.set_xlim(0, float(np.nanmax(bars.hi.fillna(bars.speedup))) * 1.15)
ax.set(xlabel="speedup over AR at the same batch size (AR = 1)", title="End-to-end greedy decoding on hybrid-target")
ax.grid(axis="y", visible=False)
savefig(fig, f"{NB}_decode")
plt.show()
s1 = summary[summary.batch == 1].set_index("method")
sb = summary[summary.batch == DECODE_BATCH].set_index("method")


def ci(r, m):
    return f"95% CI {r.lo[m]:.2f}–{r.hi[m]:.2f}, total-time ratio {r.total_ratio[m]:.2f}x"


def vs_txt(m):
    return (
        f"{s1.vs_chain[m]:.2f}x (CI {s1.vs_chain_lo[m]:.2f}–{s1.vs_chain_hi[m]:.2f}, "
        f"total-time ratio {s1.vs_chain_total[m]:.2f}x)"
    )


display(
    Markdown(
        f"Batch 1: tree SD (closed form) **{s1.speedup[tree]:.2f}x** over AR ({ci(s1, tree)}, "
        f"{s1.tokens_per_call[tree]:.2f} tokens per call), chain SD {s1.speedup[chain]:.2f}x ({ci(s1, chain)}, "
        f"{s1.tokens_per_call[chain]:.2f} tokens per call), tree SD with materialised states {s1.speedup[mat]:.2f}x "
        f"({ci(s1, mat)}), chain + leaves tree SD **{s1.speedup[leaves]:.2f}x** ({ci(s1, leaves)}; "
        f"{s1.tokens_per_call[leaves]:.2f} tokens per call, {s1.drafted_per_call[leaves]:.1f} nodes). Against the chain on "
        f"the same prompts (the tree's speed over the chain's): EAGLE-2 tree {vs_txt(tree)}, chain + leaves "
        f"**{vs_txt(leaves)}**. Batch {DECODE_BATCH}: tree SD {sb.speedup[tree]:.2f}x and chain SD {sb.speedup[chain]:.2f}x "
        f"the throughput of batched AR (median over {batched.group.nunique()} groups; total-time ratios {sb.total_ratio[tree]:.2f}x and "
        f"{sb.total_ratio[chain]:.2f}x). Outputs identical to AR: {int(summary.identical.sum())}/{int(summary.of.sum())} "
        f"(AR rows compare with themselves)."
    )
)
vs = s1.vs_chain[tree], s1.vs_chain_lo[tree], s1.vs_chain_hi[tree]
verdict_tree = (
    "reliably faster than" if vs[1] > 1 else "reliably slower than" if vs[2] < 1 else "not distinguishable from"
)
display(
    Markdown(
        f"**Reading.** The EAGLE-2 tree commits {s1.tokens_per_call[tree] / s1.tokens_per_call[chain]:.2f}x the tokens per "
        f"target call of the chain ({s1.tokens_per_call[tree]:.2f} vs {s1.tokens_per_call[chain]:.2f}) while drafting "
        f"{s1.drafted_per_call[tree]:.0f} nodes per call against the chain's {s1.drafted_per_call[chain]:.0f}; in wall "
        f"clock it is {verdict_tree} the chain on the same prompts (paired ratio {vs[0]:.2f}, CI {vs[1]:.2f}–{vs[2]:.2f}). "
        f"Extra tokens per call do not translate one for one into speed: each call of the tree also costs more to "
        f"draft and to verify. Same trees, other state strategy: materialising a state per node runs at "
        f"{s1.speedup[mat]:.2f}x against {s1.speedup[tree]:.2f}x for the closed form, with identical tokens per call "
        f"({s1.tokens_per_call[mat]:.2f}) — the whole difference is the cost of the per-node states, and without the "
        f"closed form the tree would be {'slower' if s1.speedup[mat] < s1.speedup[chain] else 'no slower'} than the "
        f"plain chain. At batch {DECODE_BATCH}: {sb.speedup[tree]:.2f}x (tree) and {sb.speedup[chain]:.2f}x (chain) the "
        f"throughput of batched AR"
        + (
            ", smaller gains than at batch 1, in line with section 3: batching already uses the hardware that "
            "speculation exploits at batch 1."
            if max(sb.speedup[tree], sb.speedup[chain]) < s1.speedup[tree]
            else ", not smaller than at batch 1 here."
        )
    )
)

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
def ablation_loss():
    stream = train.token_stream("heldout", target.tokenizer)
    held = [
        stream[s : s + 257].astype(int).tolist() for s in np.linspace(0, len(stream) - 258, EVAL_WINDOWS).astype(int)
    ]
    loss = {
        "hybrid-target (full)": bench_tree.heldout_loss(target.view(), held),
        "linear-only subgraph (attention layers skipped)": bench_tree.heldout_loss(
            target.view(skip_attention=True), held
        ),
        f"{DRAFT} (separate draft)": bench_tree.heldout_loss(draft, held),
    }
    return pd.DataFrame([dict(model=m, heldout_loss=l, perplexity=float(np.exp(l))) for m, l in loss.items()]).assign(
        **meta
    )


losses = study.step("ablation_loss", ablation_loss, uses=["TARGET", "DRAFT", "EVAL_WINDOWS"])
self_methods = {"AR": lambda ids, i: generate(target, ids, MAX_NEW_TOKENS, sampling=GREEDY)}
for k in SELF_KS:
    self_methods[f"self (linear subgraph) k={k}"] = lambda ids, i, k=k: generate(
        target, ids, MAX_NEW_TOKENS, drafter=SelfDrafter(target, k), sampling=GREEDY
    )
    self_methods[f"{DRAFT} k={k}"] = lambda ids, i, k=k: generate(
        target, ids, MAX_NEW_TOKENS, drafter=ModelDrafter(draft, k), sampling=GREEDY
    )
self_runs = study.step(
    "selfspec_runs",
    lambda: bench.paired_runs(prompts, self_methods, progress=tqdm).assign(**meta),
    uses=["TARGET", "DRAFT", "SELF_KS", "N_PROMPTS", "MAX_NEW_TOKENS", "SEED", "THREADS"],
)
selfspec = bench.speedup_table(self_runs, seed=SEED).rename(columns={"acceptance": "acceptance_rate", "runs": "of"})
selfspec["drafter"] = selfspec.method.str.rsplit(" k=", n=1).str[0]
selfspec["k"] = selfspec.method.str.rsplit(" k=", n=1).str[1].astype(int)
self_sums = self_runs.groupby("method")[["draft_s", "drafted"]].sum()
selfspec["draft_ms_per_token"] = selfspec.method.map(1e3 * self_sums.draft_s / self_sums.drafted)
ar_runs = self_runs[self_runs.method == "AR"]
loss = dict(zip(losses.model, losses.heldout_loss))
results.save(selfspec.assign(**meta), f"{NB}/selfspec")
display(losses.round(3))
display(
    selfspec[
        [
            "drafter",
            "k",
            "speedup",
            "lo",
            "hi",
            "total_ratio",
            "acceptance_rate",
            "token_acceptance",
            "draft_ms_per_token",
            "tokens_per_call",
            "identical",
            "of",
        ]
    ].round(3)
)

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
fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
for i, (name, g) in enumerate(selfspec.groupby("drafter", sort=False)):
    axes[0].plot(g.k, g.acceptance_rate, "o-", color=f"C{i}", label=f"{name}: accepted / drafted")
    axes[0].plot(g.k, g.token_acceptance, "s:", color=f"C{i}", label=f"{name}: per token")
    axes[1].errorbar(
        g.k, g.speedup, yerr=[g.speedup - g.lo, g.hi - g.speedup], fmt="o-", capsize=3, color=f"C{i}", label=name
    )
axes[0].plot([2, 2], [0.68, 0.038], "k*", ms=11, label="component-aware study: Falcon-H1 / Qwen3.5 (k = 2)")
for yv, who in [(0.68, "Falcon-H1"), (0.038, "Qwen3.5")]:
    axes[0].annotate(who, (2, yv), xytext=(8, -3), textcoords="offset points", fontsize=8)
axes[0].set(xlabel="draft length k", ylabel="acceptance", ylim=(0, 1), title="Self-speculation vs a separate draft")
axes[1].axhline(1, color="k", lw=0.8)
axes[1].set(xlabel="draft length k", ylabel="speedup over AR (median per prompt)", title="Greedy decoding, batch 1")
for ax in axes:
    ax.set_xticks(SELF_KS)
    ax.legend(
        fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1 if ax is axes[0] else 2, frameon=False
    )
savefig(fig, f"{NB}_selfspec")
plt.show()
s2 = selfspec.set_index(["drafter", "k"])
k2 = 2 if 2 in SELF_KS else SELF_KS[-1]
lf = losses.set_index("model").heldout_loss
display(
    Markdown(
        f"At k = {k2} the linear-only subgraph's drafts are accepted at rate {s2.acceptance_rate['self (linear subgraph)', k2]:.3f} "
        f"(the separate draft: {s2.acceptance_rate[DRAFT, k2]:.3f}); skipping the {len(target.is_gdn) - sum(target.is_gdn)} attention "
        f"layers raises held-out loss from {lf.iloc[0]:.3f} to {lf.iloc[1]:.3f} nats/token (perplexity "
        f"{np.exp(lf.iloc[0]):.1f} -> {np.exp(lf.iloc[1]):.1f}). Speedup at k = {k2}, the component-aware study's k (fixed "
        f"in advance, not tuned on these prompts): "
        + "; ".join(
            f"{'self-speculation' if d.startswith('self') else 'the separate draft'} {r.speedup:.2f}x "
            f"(95% CI {r.lo:.2f}–{r.hi:.2f}, total-time ratio {r.total_ratio:.2f}x; over every k tried "
            f"{g.speedup.min():.2f}–{g.speedup.max():.2f}x)"
            for d, g, r in ((d, g, g[g.k == k2].iloc[0]) for d, g in selfspec.groupby("drafter", sort=False))
        )
        + ". "
        f"Outputs identical to AR: {int(selfspec.identical.sum())}/{int(selfspec.of.sum())}."
    )
)
ms_self = s2.draft_ms_per_token["self (linear subgraph)"].median()
ms_sep = s2.draft_ms_per_token[DRAFT].median()
ta_self = s2.token_acceptance["self (linear subgraph)"].median()
ta_sep = s2.token_acceptance[DRAFT].median()
ar_ms = 1e3 * ar_runs.seconds.sum() / ar_runs.new_tokens.sum()
a_self2 = s2.acceptance_rate["self (linear subgraph)", k2]
display(
    Markdown(
        f"**Reading.** Per-token acceptance (median over k): self-draft {ta_self:.2f}, separate draft {ta_sep:.2f}. "
        f"A self-drafted token costs {ms_self:.2f} ms, a separate-draft token {ms_sep:.2f} ms, against "
        f"{ar_ms:.2f} ms per token for AR decoding with the full model — c ≈ {ms_self / ar_ms:.2f} for the self-draft "
        f"and {ms_sep / ar_ms:.2f} for the separate one. "
        + (
            "The subgraph is both less accurate and far more expensive per token, so it loses on both terms of the "
            "analytic model; "
            if ta_self < ta_sep and ms_self > ms_sep
            else "The two drafters trade accuracy against cost; "
        )
        + f"removing the attention layers multiplies perplexity by {np.exp(lf.iloc[1] - lf.iloc[0]):.1f} "
        f"({np.exp(lf.iloc[0]):.1f} → {np.exp(lf.iloc[1]):.1f}), and the subgraph's acceptance rate at k = {k2}, "
        f"{a_self2:.2f}, lies closer to the component-aware study's "
        f"{'Falcon-H1 (0.68)' if abs(a_self2 - 0.68) < abs(a_self2 - 0.038) else 'Qwen3.5 (0.038)'} value. "
        + (
            "Acceptance alone does not decide it, though: with c this far from 0 the subgraph stays slower than AR "
            "at every k, and self-speculation would need a subgraph that is much cheaper than the model (fewer layers "
            "kept) while staying close to it in loss."
            if selfspec[selfspec.drafter.str.startswith("self")].speedup.max() < 1
            else "At its best k the self-draft beats AR; whether it beats the separate draft is in the right panel."
        )
    )
)

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
from speclib import FeatureDrafter, load_head

head = load_head(HEAD)
target_f = speclib.load(TARGET, device=DEVICE)  # records the head's features; AR's target does not
target_mat = target_f.view(strategy="materialize")  # same weights, a full state per pending node
head_trees = [tuple(t) for t in HEAD_TREES]


def head_methods(chains, trees, materialize=False):
    def run(lm, make):
        return lambda ids, i: generate(lm, ids, MAX_NEW_TOKENS, drafter=make(), sampling=GREEDY)

    m = {"AR": lambda ids, i: generate(target, ids, MAX_NEW_TOKENS, sampling=GREEDY)}
    for k in chains:
        m[f"head chain K={k}"] = run(target_f, lambda k=k: FeatureDrafter(target_f, head, k=k))
    for d, n in trees:
        m[f"head tree d={d} n={n}"] = run(
            target_f, lambda d=d, n=n: FeatureDrafter(target_f, head, k=d, tree=n, top=TOP)
        )
        if materialize:
            m[f"head tree d={d} n={n}, materialize"] = run(
                target_mat, lambda d=d, n=n: FeatureDrafter(target_mat, head, k=d, tree=n, top=TOP)
            )
    return m


def head_decode():
    pilot = bench.paired_runs(pilot_prompts, head_methods(HEAD_KS, head_trees), progress=tqdm)
    t = bench.speedup_table(pilot, seed=SEED)
    best_chain = t[t.method.str.contains("chain")].sort_values("speedup").method.iloc[-1]
    best_tree = t[t.method.str.contains("tree")].sort_values("speedup").method.iloc[-1]
    k = int(best_chain.split("=")[1])
    d, n = (int(x) for x in re.findall(r"=(\d+)", best_tree))
    report = bench.paired_runs(prompts, head_methods([k], [(d, n)], materialize=True), progress=tqdm)
    return pd.concat([pilot.assign(split="pilot"), report.assign(split="report")], ignore_index=True).assign(**meta)


hdec = study.step(
    "head_decode",
    head_decode,
    uses=["TARGET", "HEAD", "HEAD_KS", "HEAD_TREES", "N_PROMPTS", "PILOT_PROMPTS", "MAX_NEW_TOKENS", "SEED", "THREADS"],
)
rep = hdec[hdec.split == "report"]
h_chain = next(m for m in rep.method.unique() if "chain" in m)
h_tree = next(m for m in rep.method.unique() if "tree" in m and "materialize" not in m)
htab = bench.speedup_table(rep, seed=SEED).set_index("method")
tree_vs_chain = bench.speedup(rep, h_tree, reference=h_chain, seed=SEED)
ar_step = rep[rep.method == "AR"].seconds.sum() / rep[rep.method == "AR"].new_tokens.sum()
acct = []
for m in [h_chain, h_tree]:
    g = rep[rep.method == m]
    calls = g.target_calls.sum()
    acct.append(
        dict(
            method=m,
            tokens_per_call=g.new_tokens.sum() / calls,
            draft_per_call=g.draft_s.sum() / calls / ar_step,
            verify_per_call=g.verify_s.sum() / calls / ar_step,
            drafted_per_call=g.drafted.sum() / calls,
        )
    )
acct = pd.DataFrame(acct).set_index("method")
head_summary = htab.reset_index().assign(
    tree_vs_chain=tree_vs_chain["speedup"], tree_vs_chain_lo=tree_vs_chain["lo"], tree_vs_chain_hi=tree_vs_chain["hi"]
)
results.save(head_summary.assign(**meta), f"{NB}/head_summary")  # not head_decode: that is the step's table
display(head_summary.round(3))
display(acct.round(3))

fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
order = [h_chain, h_tree, f"{h_tree}, materialize"]
s = htab.loc[order]
axes[0].bar(range(3), s.speedup, yerr=[s.speedup - s.lo, s.hi - s.speedup], capsize=4, color=["C1", "C2", "C7"])
axes[0].axhline(1, color="k", lw=0.8)
axes[0].set_xticks(range(3), [o.replace("head ", "").replace(", ", "\n") for o in order], fontsize=8)
axes[0].set(ylabel="speedup over AR", title=f"feature head on {TARGET} ({len(prompts)} reported prompts)")
acct[["tokens_per_call", "draft_per_call", "verify_per_call"]].T.plot.bar(ax=axes[1], rot=0)
axes[1].set(ylabel="per target call (tokens, or AR steps of time)", title="What a call gains and costs")
axes[1].legend(fontsize=8)
savefig(fig, f"{NB}_head")
plt.show()
ident = rep[rep.method != "AR"].same_as_reference
tc, tt = acct.loc[h_chain], acct.loc[h_tree]
display(
    Markdown(
        f"Pilot choices: **{h_chain}** and **{h_tree}**. Reported: chain {htab.speedup[h_chain]:.2f}x AR (CI {htab.lo[h_chain]:.2f}–"
        f"{htab.hi[h_chain]:.2f}), tree with the closed form {htab.speedup[h_tree]:.2f}x (CI {htab.lo[h_tree]:.2f}–{htab.hi[h_tree]:.2f}), "
        f"the same tree materialising states {htab.speedup[order[2]]:.2f}x. Tree over chain, paired per prompt: "
        f"**{tree_vs_chain['speedup']:.2f}x** (CI {tree_vs_chain['lo']:.2f}–{tree_vs_chain['hi']:.2f}). Per target call the tree gains "
        f"{tt.tokens_per_call:.2f} tokens against the chain's {tc.tokens_per_call:.2f}, and costs {tt.draft_per_call:.2f} + "
        f"{tt.verify_per_call:.2f} AR steps (drafting + verification) against {tc.draft_per_call:.2f} + {tc.verify_per_call:.2f}: "
        + (
            "the extra tokens pay for the wider pass."
            if tree_vs_chain["speedup"] > 1
            else "on this CPU the wider verify pass and the extra drafting cost more than the extra tokens bring."
        )
        + f" Greedy outputs identical to AR: {int(ident.sum())}/{len(ident)}."
    )
)

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
