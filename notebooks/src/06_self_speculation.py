# %% [markdown]
# # 06 · Self-speculation with layer subsets of a hybrid model
#
# **Question.** A hybrid model (Gated DeltaNet + attention, as Qwen3.5) can draft for itself: run only
# some of its own decoder layers, read the LM head from there, and let the full model verify. No
# second model is trained, shipped or held in memory, and the output stays exactly the full model's.
# Which subset of layers drafts best on `hybrid-target`, what does a small trained exit add, and —
# since attention's cost per token grows with the context while the recurrent layers' does not —
# does self-speculation overtake plain decoding and a separate small draft at long contexts?
#
# **Method.** Every self-draft is a view of the target's own weights (`target.view(layers=...)`,
# [self-speculation](../docs/self_speculation.md)): skip every attention layer (`linear`, the variant
# of notebook 03), skip attention and the last n layers (`linear_early_exit`), keep every other layer
# (`every_other`), keep the first n layers (`first_n`), and a greedy search over subsets
# (`search_subsets`) that maximises the analytic speedup from a teacher-forced acceptance and a timed
# cost. We time one token of the full model and of every subset at contexts from 128 to several
# thousand tokens (section 1), decode with every subset on pilot prompts and report the chosen ones
# on disjoint prompts (section 2), train an exit adapter for the best subset (section 3), measure the
# best configurations and the separate draft `code-draft` at every context length (section 4), and set
# the ablated model's perplexity beside its acceptance (section 5), and repeat the linear-subgraph
# measurement on two tiny Falcon-H1 models, a second hybrid family trained the same way (section 6). Every speedup is measured the workbook's one way (`bench.paired_runs`,
# `bench.speedup_table`; [the statistics notes](../docs/statistics.md)): AR and every method back to
# back on each prompt in alternating order, the speedup is the median over prompts of the per-prompt
# speed ratio with a 95% bootstrap interval, settings are chosen on pilot prompts and reported on
# disjoint ones.
#
# **The trade-off.** The analytic model ([the analytic model](../docs/analytic_model.md)) gives the
# speedup of a draft as
#
#     speedup(k) = E(α, k) / (k·c + v(k)),   E = (1 − α^{k+1}) / (1 − α),
#
# with α the per-token acceptance, c the cost of a draft token over a target token and v(k) the cost of
# the verify pass over k + 1 tokens over one. A subset that keeps most of the layers is accurate (α
# high) but dear (c near 1); one that keeps few is cheap but wrong. A separate small draft sits at the
# other corner: cheap even when often wrong. Self-speculation can only win where some subset is both
# much cheaper than the model and close to it — which is why the context length matters: the
# attention layers are the only ones whose cost grows with it, so a subset without them gets
# relatively cheaper as the context grows.
#
# **How to read the notebook.** Section 1 is cost only (no acceptance): c of every subset against the
# context length, measured and from a FLOP count. Section 2 adds acceptance and picks the subsets;
# section 3 asks whether training a tiny exit moves α enough to matter; section 4 is the end-to-end
# answer at every context length; section 5 tests the claim that perplexity predicts α. Every number
# in the text under a table or figure is read from the results, not typed in; only the component-aware
# study's numbers are quoted.

# %% [markdown]
# ## About this notebook
#
# **What you will learn.**
#
# * How a hybrid model drafts for itself through views of its own layers, and why the output stays
#   exactly the full model's whatever subset drafts.
# * How to price a subset: its cost ratio c measured against a FLOP count, and how c moves with the
#   context length when the skipped layers are the attention layers.
# * How to choose a subset by a search that combines a cheap teacher-forced acceptance with a timed
#   cost, and how far that prediction is from decoding runs.
# * What a small trained exit (a norm and a low-rank correction before the frozen LM head) buys.
# * Whether the ablated model's perplexity predicts its acceptance, with a rank correlation and its
#   uncertainty.
#
# **What to know first.** Notebook 01 (the rule, `E`, `c`, `v(k)`, the workbook's speedup estimator)
# and section 6 of notebook 03 (self-speculation with the linear subgraph at one context). The
# [self-speculation page](../docs/self_speculation.md) explains views, subset kinds, the search and the
# exit adapter; nothing about Gated DeltaNet beyond "a fixed-size state per head" is needed.
#
# **How long it takes.** With `RESULTS = "auto"` (the default) and the shipped parameters every step is
# read from `data/results/` and the notebook draws everything in about a minute. `"recompute"` runs
# every step: about an hour on 2 CPU cores (sections 1-5 took 41 minutes in one run, section 6 with its
# three models 19 in another), most of it the long-context runs of section 4 (each prompt of
# 4,096 tokens is prefilled by the target and by every draft) and the pilot of section 2; the exit
# adapter trains for at most `EXIT_MINUTES`. Changing a parameter recomputes only
# the steps that use it; a run whose parameters differ from the shipped ones writes under
# `build/unpublished/06_self_speculation/…`. `"reuse"` never computes, and names the step and the
# parameters that differ when it cannot reuse. `SMOKE = True` runs everything at toy sizes in about
# two minutes (its numbers mean nothing).

# %%
SMOKE = False  # True: tiny sizes, the whole notebook in under ~2 minutes on 2 CPU cores
SEED = 0
DEVICE = "auto"  # auto: cuda, then mps, then cpu
TARGET = "hybrid-target"  # a Gated DeltaNet hybrid that loads as HybridLM (Qwen3.5 text, MoE or Qwen3-Next)
DRAFT = "code-draft"  # the reference drafter: a separate small model with the target's tokenizer
CONTEXTS = [128, 512, 1024, 2048, 4096]  # context lengths (tokens) of sections 1 and 4
PILOT_CONTEXT = 128  # context of the prompts on which subsets and k are chosen (sections 2 and 3)
LATENCY_REPEATS = 15  # timed one-token passes per case in section 1 (after 3 warm-up passes)
EARLY_EXIT_NS = [2, 3, 4]  # linear_early_exit: attention and the last n layers skipped
FIRST_NS = [2, 4, 6]  # first_n: only layers 0 .. n-1 kept
SEARCH_BUDGET = 37  # subset measurements of the greedy search (37: the whole descent on 8 layers)
SEARCH_WINDOWS = 8  # held-out windows (pilot half) for the search's teacher-forced acceptance
SEARCH_REPEATS = 7  # timed passes per subset in the search's cost measurement
KS = [1, 2, 3, 4]  # chain draft lengths tried on the pilot prompts
N_PILOT = 4  # pilot prompts: choose the subsets' and the draft's k
N_PROMPTS = 12  # reported prompts, disjoint from the pilot ones
MAX_NEW_TOKENS = 128
EXIT_MINUTES = 5.0  # training time cap of the exit adapter
EXIT_STEPS = 400  # training steps cap of the exit adapter (batches of 8 windows of 128 tokens)
EXIT_RANK = 16  # rank of the exit adapter's low-rank correction
CONTEXT_PROMPTS = 6  # section 4: reported prompts per context length
EVAL_WINDOWS = 16  # section 5: held-out windows of 256 tokens for the ablated models' loss
OTHER_FAMILIES = ["falcon-h1-tiny", "falcon-h1-tiny-wide-ssm"]  # section 6: other hybrid families trained here
RESULTS = "auto"  # auto: reuse results saved with these parameters, else compute; "recompute"; "reuse"
PUBLISH = False  # True: a run with non-default parameters also replaces data/results and figures/
THREADS = 1  # torch threads (0: every CPU this process may use); 1 keeps timings smooth on 2 cores

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown, display
from scipy.stats import spearmanr
from tqdm.auto import tqdm

import speclib
from speclib import LayerSkipDrafter, ModelDrafter, Sampling, generate
from speclib.core.analytic import predicted_speedup
from speclib.drafters.layers import ExitAdapter, subset
from speclib.lms import HybridLM
from speclib.lms.branches import BranchSkipLM
from speclib.lms.loading import HYBRID_TYPES, with_context
from speclib.research import bench, stats, train
from speclib.research.layer_search import (
    acceptance_proxy,
    flop_cost,
    lm_acceptance,
    lm_loss,
    proxy_measure,
    search_subsets,
    subset_loss,
    train_exit,
)
from speclib.workbook import results
from speclib.workbook.plotting import savefig, style
from speclib.workbook.study import Study

if SMOKE:
    CONTEXTS, PILOT_CONTEXT, LATENCY_REPEATS, EARLY_EXIT_NS, FIRST_NS = [128, 256], 128, 3, [2], [4]
    SEARCH_BUDGET, SEARCH_WINDOWS, SEARCH_REPEATS, KS = 4, 2, 2, [1, 2]
    N_PILOT, N_PROMPTS, MAX_NEW_TOKENS, EXIT_MINUTES, EXIT_STEPS = 1, 2, 12, 0.5, 3
    CONTEXT_PROMPTS, EVAL_WINDOWS, OTHER_FAMILIES = 2, 2, OTHER_FAMILIES[:1]
NB = "06_self_speculation"
GREEDY = Sampling(0.0)
CTXS = sorted(set(CONTEXTS) | {PILOT_CONTEXT})
EVAL_LEN = 64 if SMOKE else 256  # tokens per perplexity window (section 5)
SEARCH_K = 2 if 2 in KS else KS[0]  # the draft length the search scores (the component-aware study's k)
style()
torch.manual_seed(SEED)
threads = speclib.core.device.set_threads(THREADS or None)
target, draft = speclib.load(TARGET, device=DEVICE), speclib.load(DRAFT, device=DEVICE)
if not isinstance(target, HybridLM):
    raise ValueError(
        f"TARGET {TARGET!r} loads as {type(target).__name__}: layer-subset views need a Gated DeltaNet "
        f"hybrid that speclib runs with its own forward (HybridLM: {', '.join(HYBRID_TYPES)})"
    )
trained_context = target.max_length
LONG = max(CTXS) + MAX_NEW_TOKENS + max(KS) + 2  # the longest sequence any run reaches


target, draft = with_context(target, LONG), with_context(draft, LONG)
L = len(target.is_gdn)
ALL = list(range(L))
full = target.view(layers=ALL, exit=None)
dev = str(target.device)
meta = dict(seed=SEED, device=dev, target=TARGET, draft=DRAFT, threads=threads, smoke=SMOKE)
study = Study(
    NB, globals(), mode=RESULTS, publish=PUBLISH, always=dict(SMOKE=SMOKE), calibrate=target
)  # target T(1) before/after each step
print(f"results mode {RESULTS!r}: this run {study.where()}")
print(
    f"{TARGET}: {L} layers, attention at {[i for i in ALL if not target.is_gdn[i]]}; configured context "
    f"{trained_context} positions"
    + (f", raised to {LONG} for this notebook's longest runs" if LONG > trained_context else "")
    + f"; device {dev}, {threads} thread(s)"
)

# Prompts: windows of the held-out stdlib stream (every held-out file, tokenized and joined by EOS).
# The first half serves the choices (pilot prompts, the search's windows), the second half the reports.
# A prompt at context n is the n tokens before a fixed anchor, so across context lengths the same
# continuation point is decoded with more or less text before it.
held = train.token_stream("heldout", target.tokenizer)
half = len(held) // 2
# Anchors start LEAD tokens into each half, whatever CONTEXTS is, so the prompts of sections 2-3 do not change
# with it; a context longer than LEAD would reach back into the text before that.
LEAD = 8192
pilot_anchors = np.linspace(LEAD, half - MAX_NEW_TOKENS - 1, N_PILOT).astype(int)
report_anchors = np.linspace(half + LEAD, len(held) - MAX_NEW_TOKENS - 1, N_PROMPTS).astype(int)
context_anchors = np.linspace(half + LEAD, len(held) - MAX_NEW_TOKENS - 1, CONTEXT_PROMPTS).astype(int)


def window(anchor, n):
    return held[anchor - n : anchor].astype(np.int64).tolist()


pilot_prompts = [window(a, PILOT_CONTEXT) for a in pilot_anchors]
report_prompts = [window(a, PILOT_CONTEXT) for a in report_anchors]
search_windows = [
    held[s : s + PILOT_CONTEXT].astype(np.int64).tolist()
    for s in np.linspace(0, half - PILOT_CONTEXT, SEARCH_WINDOWS + 2).astype(int)[1:-1]
]
eval_windows = [
    held[s : s + EVAL_LEN + 1].astype(np.int64).tolist()
    for s in np.linspace(half, len(held) - EVAL_LEN - 2, EVAL_WINDOWS).astype(int)
]
print(
    f"held-out stream: {len(held)} tokens; {N_PILOT} pilot and {N_PROMPTS} reported prompts of {PILOT_CONTEXT} "
    f"tokens; {CONTEXT_PROMPTS} prompts per context in section 4"
)

# %% [markdown]
# ## The subsets
# Every named kind for this model, each a list of decoder-layer indices; two kinds that name the same
# layers are one subset (the table says which names it goes by). On Qwen3.5's 3:1 pattern several
# kinds coincide: skipping the last layer, an attention layer, does not change the linear subgraph.
# The greedy search's best subset joins them in section 2a.


# %%
def catalogue():
    named = [("linear", subset(target, "linear"))]
    named += [
        (f"linear_early_exit n={n}", subset(target, "linear_early_exit", n)) for n in EARLY_EXIT_NS if 1 <= n <= L - 1
    ]
    named += [("every_other", subset(target, "every_other"))]
    named += [(f"first_n n={n}", subset(target, "first_n", n)) for n in FIRST_NS if 1 <= n < L]
    out, aliases = {}, {}
    for name, layers in named:
        for first, got in out.items():
            if got == layers:
                aliases[first].append(name)
                break
        else:
            out[name], aliases[name] = layers, []
    return out, aliases


SUBSETS, ALIASES = catalogue()
display(
    pd.DataFrame(
        [
            dict(
                subset=n,
                layers=str(l),
                attention_kept=sum(not target.is_gdn[i] for i in l),
                layers_kept=len(l),
                also_named=", ".join(ALIASES[n]),
            )
            for n, l in SUBSETS.items()
        ]
    )
)

# %% [markdown]
# ## 1 · The cost structure: c(subset, context)
# **Question.** What does one drafted token of each subset cost, relative to one token of the full
# model, and how does that ratio move as the context grows?
#
# **Method.** `bench.latencies` times one `extend` of one new token over a cached prefix of each
# context length (random tokens: the time does not depend on which), for the full model, every subset
# view and the separate draft, interleaved round-robin so machine noise hits them alike; the full
# model is also timed over k + 1 tokens, which gives the verify ratio v(k) at each context. The
# measured c is the subset's time over the full model's. Beside it, `flop_cost` counts multiply-adds:
# 2 per weight of each layer run and of the LM head, the attention layers' scores and values over the
# cache (growing with the context) and the GDN layers' fixed-size state update. The FLOP count is the
# cost on hardware where arithmetic dominates; on this CPU every layer also pays a fixed call
# overhead, and attention here also copies its cache, so the two can differ a lot.
#
# Contexts above the model's configured context (printed above) are reached by raising the limit on
# the same weights: the model was trained on windows of 256 tokens, so every context above that is
# already extrapolation, and the time of a pass does not depend on what the model predicts.
#
# **How to read the figure.** Left: measured c against the context (log scale), one line per subset,
# the separate draft dashed black; lower is cheaper. Right: the same subsets' FLOP c, on the same
# axes. A line that falls with the context is a subset whose skipped layers carry the cost that grows
# with it.


# %%
def cost_structure():
    views = {name: target.view(layers=layers, exit=None) for name, layers in SUBSETS.items()}
    rows = []
    for ctx in tqdm(CTXS, desc="contexts"):
        cases = [(full, 1)] + [(full, k + 1) for k in KS] + [(v, 1) for v in views.values()] + [(draft, 1)]
        secs = bench.latencies(cases, prefix_len=ctx, repeats=LATENCY_REPEATS, warmup=3)
        t1 = secs[0]
        rows.append(dict(context=ctx, subset="full model", layers=str(ALL), n=1, seconds=t1, c=1.0, flop_c=1.0))
        rows += [
            dict(context=ctx, subset="full model", layers=str(ALL), n=k + 1, seconds=s, c=s / t1, flop_c=np.nan)
            for k, s in zip(KS, secs[1 : 1 + len(KS)])
        ]
        rows += [
            dict(
                context=ctx,
                subset=name,
                layers=str(SUBSETS[name]),
                n=1,
                seconds=s,
                c=s / t1,
                flop_c=flop_cost(target, SUBSETS[name], ctx),
            )
            for name, s in zip(views, secs[1 + len(KS) : -1])
        ]
        rows.append(
            dict(
                context=ctx,
                subset=f"{DRAFT} (separate draft)",
                layers="",
                n=1,
                seconds=secs[-1],
                c=secs[-1] / t1,
                flop_c=np.nan,
            )
        )
    return pd.DataFrame(rows).assign(**meta)


cost = study.step(
    "cost",
    cost_structure,
    uses=[
        "TARGET",
        "DRAFT",
        "CONTEXTS",
        "PILOT_CONTEXT",
        "LATENCY_REPEATS",
        "EARLY_EXIT_NS",
        "FIRST_NS",
        "KS",
        "MAX_NEW_TOKENS",
        "THREADS",
    ],
)
one = cost[cost.n == 1]
vk = cost[cost.subset == "full model"].pivot_table(index="context", columns="n", values="c")
c_tab = one.pivot_table(index="subset", columns="context", values="c", sort=False)
display(Markdown("**Measured c** (one token of the subset over one of the full model):"))
display(c_tab.round(3))
display(Markdown("**FLOP c** (`flop_cost`) and the full model's one-token time (ms) and verify ratio v(k):"))
display(
    one[one.subset.isin(SUBSETS)].pivot_table(index="subset", columns="context", values="flop_c", sort=False).round(3)
)
display(
    pd.concat(
        [
            one[one.subset == "full model"].set_index("context").seconds.mul(1e3).rename("full model, ms / token"),
            vk.drop(columns=1).rename(columns=lambda n: f"v(k={n - 1})"),
        ],
        axis=1,
    ).round(3)
)

fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
for i, name in enumerate(SUBSETS):
    g = one[one.subset == name]
    axes[0].plot(g.context, g.c, "o-", color=f"C{i}", label=name)
    axes[1].plot(g.context, g.flop_c, "s--", color=f"C{i}", label=name)
g = one[one.subset.str.endswith("(separate draft)")]
axes[0].plot(g.context, g.c, "k--", marker="x", label=f"{DRAFT} (separate draft)")
axes[0].set(title="measured (one token, wall clock)", ylabel="c = T_subset(1) / T_full(1)")
axes[1].set(title="FLOP count (flop_cost)")
for ax in axes:
    ax.set(xscale="log", xlabel="context (tokens)", ylim=(0, 1.05))
    ax.set_xticks(CTXS, [str(c) for c in CTXS])
    ax.minorticks_off()
    if trained_context < max(CTXS):
        ax.axvline(trained_context, color="grey", lw=0.8, ls=":")
axes[0].legend(fontsize=8, ncol=2)
savefig(fig, f"{NB}_cost")
plt.show()

lin = one[one.subset == "linear"].set_index("context")
flop_gap = one[one.subset.isin(SUBSETS)].c - one[one.subset.isin(SUBSETS)].flop_c
dr = one[one.subset.str.endswith("(separate draft)")].set_index("context").c
display(
    Markdown(
        f"The linear subgraph (every attention layer skipped) costs c = {lin.c.iloc[0]:.2f} of the full model at "
        f"{lin.index[0]} tokens of context and {lin.c.iloc[-1]:.2f} at {lin.index[-1]}; its FLOP count says "
        f"{lin.flop_c.iloc[0]:.2f} and {lin.flop_c.iloc[-1]:.2f}. The full model's token costs "
        f"{one[one.subset == 'full model'].seconds.iloc[0] * 1e3:.1f} ms at {CTXS[0]} tokens and "
        f"{one[one.subset == 'full model'].seconds.iloc[-1] * 1e3:.1f} ms at {CTXS[-1]}. Across subsets and contexts, "
        f"measured c minus FLOP c is {flop_gap.median():+.2f} at the median (range {flop_gap.min():+.2f} to "
        f"{flop_gap.max():+.2f}): "
        + (
            "the subsets cost more than their arithmetic, as a fixed overhead per layer run would make them. "
            if flop_gap.median() > 0.05
            else "the subsets cost less than their arithmetic says: the skipped layers cost more "
            "than their share of the FLOPs. "
            if flop_gap.median() < -0.05
            else "the FLOP count is a fair guide to the measured cost here. "
        )
        + f"The separate draft costs c = {dr.iloc[0]:.3f} at {dr.index[0]} tokens and {dr.iloc[-1]:.3f} at {dr.index[-1]}; "
        f"the cheapest subset at the longest context, **{c_tab[CTXS[-1]].drop(['full model', f'{DRAFT} (separate draft)']).idxmin()}**, "
        f"costs {c_tab[CTXS[-1]].drop(['full model', f'{DRAFT} (separate draft)']).min():.3f}."
    )
)

# %% [markdown]
# ## 2 · Subsets as drafts
# ### 2a · A greedy search over subsets
# **Question.** Is there a subset, not one of the named kinds, that predicts a better speedup?
#
# **Method.** `search_subsets` starts from the full model and drops one layer per round, moving to the
# subset with the highest predicted speedup E(α, k)/(k·c + v(k)) at k = `SEARCH_K`, for at most
# `SEARCH_BUDGET` measurements. Each measurement combines the **teacher-forced acceptance** of the
# subset on `SEARCH_WINDOWS` held-out windows from the pilot half (`proxy_measure` at temperature 0:
# how often the subset's argmax equals the full model's, the greedy acceptance) with its **measured
# c** at the pilot context (the subset and the full model timed side by side); v(k) is the full
# model's, timed at the same context. The search is greedy, as a cheap stand-in for the Bayesian search of Draft
# & Verify; its timings are short and noisy, so it can prefer one of two near-equal subsets by chance.
#
# **How to read the figure.** Each point is a subset the search measured: x its measured c, y its
# teacher-forced acceptance, colour its predicted speedup; the named kinds are labelled, the search's
# best is starred. The grey curve is where the prediction equals 1 (break-even): points above it are
# predicted to win.


# %%
def search():
    pm = proxy_measure(target, search_windows, context=PILOT_CONTEXT, temperature=0.0)

    def measure(layers, prompts=None):
        a, _ = pm(layers)
        t_full, t_sub = bench.latencies(
            [(full, 1), (target.view(layers=layers, exit=None), 1)],
            prefix_len=PILOT_CONTEXT,
            repeats=SEARCH_REPEATS,
            warmup=2,
        )
        return a, t_sub / t_full

    t1, tk = bench.latencies(
        [(full, 1), (full, SEARCH_K + 1)], prefix_len=PILOT_CONTEXT, repeats=max(SEARCH_REPEATS, 5), warmup=2
    )
    v = tk / t1
    found = search_subsets(target, None, measure, budget=SEARCH_BUDGET, k=SEARCH_K, v=v)
    named = [dict(layers=l, **dict(zip(["alpha", "c"], measure(l)))) for l in SUBSETS.values()]
    hist = pd.DataFrame(found.history).assign(source="search")
    named = pd.DataFrame(named).assign(
        source="named", predicted=lambda d: [predicted_speedup(a, SEARCH_K, c, v) for a, c in zip(d.alpha, d.c)]
    )
    out = pd.concat([hist, named], ignore_index=True)
    out["layers"] = out.layers.map(str)
    out["best"] = out.layers == str(found.layers)
    return out.assign(k=SEARCH_K, v=v, **meta)


hist = study.step(
    "search",
    search,
    uses=[
        "TARGET",
        "PILOT_CONTEXT",
        "EARLY_EXIT_NS",
        "FIRST_NS",
        "KS",
        "SEARCH_BUDGET",
        "SEARCH_WINDOWS",
        "SEARCH_REPEATS",
        "SEED",
        "THREADS",
    ],
)
best_row = hist[(hist.source == "search")].sort_values("predicted").iloc[-1]
BEST_SEARCH = [int(x) for x in best_row.layers.strip("[]").split(",")]
if all(BEST_SEARCH != l for l in SUBSETS.values()):
    SUBSETS["search"] = BEST_SEARCH
    ALIASES["search"] = []
else:
    ALIASES[next(n for n, l in SUBSETS.items() if l == BEST_SEARCH)].append("search")

fig, ax = plt.subplots(figsize=(7.5, 4.6))
sc = ax.scatter(hist.c, hist.alpha, c=hist.predicted, cmap="viridis", s=28, edgecolor="none")
plt.colorbar(sc, ax=ax, label=f"predicted speedup at k = {SEARCH_K}")
cs = np.linspace(0.02, 1.1, 200)
be = [
    next((a for a in np.linspace(0, 0.999, 400) if predicted_speedup(a, SEARCH_K, c, hist.v.iloc[0]) >= 1), np.nan)
    for c in cs
]
ax.plot(cs, be, color="grey", lw=1, label="break-even (predicted 1x)")
named_pts = hist[hist.source == "named"]
for r, name in zip(named_pts.itertuples(), SUBSETS):
    ax.annotate(name, (r.c, r.alpha), fontsize=7, xytext=(4, 3), textcoords="offset points")
ax.scatter(
    best_row.c, best_row.alpha, marker="*", s=220, color="red", edgecolor="black", label="search's best", zorder=3
)
ax.set(
    xlabel="measured c at the pilot context",
    ylabel="teacher-forced greedy acceptance",
    ylim=(0, 1.02),
    title="every subset the search measured",
)
ax.legend(fontsize=8, loc="lower right")
savefig(fig, f"{NB}_search")
plt.show()
display(
    Markdown(
        f"The search measured {int((hist.source == 'search').sum())} subsets. Its best, layers {best_row.layers}, predicts "
        f"{best_row.predicted:.2f}x at k = {SEARCH_K} (teacher-forced acceptance {best_row.alpha:.2f}, c = {best_row.c:.2f}); "
        f"the full model it started from predicts {hist[hist.source == 'search'].predicted.iloc[0]:.2f}x and the best named "
        f"kind, {list(SUBSETS)[int(np.argmax(named_pts.predicted.to_numpy()))]}, {named_pts.predicted.max():.2f}x. "
        f"Of the {len(hist)} measurements, {int((hist.predicted > 1).sum())} predict a win over AR."
    )
)

# %% [markdown]
# ### 2b · Decoding with every subset: choose on pilot prompts, report on others
# **Method.** Greedy decoding of `MAX_NEW_TOKENS` tokens from prompts of `PILOT_CONTEXT` held-out tokens
# (EOS ignored, so every run has the same length), with every subset (the named kinds and the search's
# best) as a chain drafter at every k in `KS`, and the separate draft at every k: on the `N_PILOT`
# pilot prompts, each drafter's k is chosen by its pilot speedup; on the `N_PROMPTS` reported prompts,
# each drafter runs at its chosen k. Every output is compared with AR's token for token.
#
# **How to read the figure.** Left: each drafter's reported speedup over AR (median over prompts, 95%
# bootstrap interval) at its chosen k, the separate draft last in black; the vertical line is AR.
# Right: the same drafters' per-token acceptance α (accepted / reached positions) from the decoding
# runs against their in-loop c (drafting seconds per drafted token over AR's seconds per step); the
# grey curves are break-even at k = 1 and at the largest k, from the analytic model with the measured
# v(k). A self-draft that lands far below the curves is too expensive for its accuracy.


# %%
def drafter_for(layers, k, exit=None):
    return LayerSkipDrafter(target, layers, k, exit=exit)


def methods_for(configs):
    """configs: name -> (drafter factory); AR first."""
    out = {"AR": lambda ids, i: generate(target, ids, MAX_NEW_TOKENS, sampling=GREEDY, eos_token_id=None)}
    for name, make in configs.items():
        out[name] = lambda ids, i, make=make: generate(
            target, ids, MAX_NEW_TOKENS, drafter=make(), sampling=GREEDY, eos_token_id=None
        )
    return out


def label(drafter, k):
    return f"{drafter} | k={k}"


def split_label(df):
    parts = df.method.str.rsplit(" | k=", n=1)
    return df.assign(drafter=parts.str[0], k=parts.str[1].astype(int))


DRAFT_NAME = f"{DRAFT} (separate draft)"


def all_configs():
    cfgs = {}
    for name, layers in SUBSETS.items():
        for k in KS:
            cfgs[label(name, k)] = lambda layers=layers, k=k: drafter_for(layers, k)
    for k in KS:
        cfgs[label(DRAFT_NAME, k)] = lambda k=k: ModelDrafter(draft, k)
    return cfgs


pilot_runs = study.step(
    "pilot_runs",
    lambda: bench.paired_runs(pilot_prompts, methods_for(all_configs()), progress=tqdm).assign(**meta),
    uses=["search", "DRAFT", "N_PILOT", "MAX_NEW_TOKENS"],
)
pilot = split_label(bench.speedup_table(pilot_runs, seed=SEED))
chosen_k = pilot.loc[pilot.groupby("drafter", sort=False).speedup.idxmax()].set_index("drafter").k
CHOSEN = {d: int(k) for d, k in chosen_k.items()}


def report_configs():
    cfgs = {label(n, CHOSEN[n]): (lambda l=l, k=CHOSEN[n]: drafter_for(l, k)) for n, l in SUBSETS.items()}
    cfgs[label(DRAFT_NAME, CHOSEN[DRAFT_NAME])] = lambda: ModelDrafter(draft, CHOSEN[DRAFT_NAME])
    return cfgs


runs = study.step(
    "runs",
    lambda: bench.paired_runs(report_prompts, methods_for(report_configs()), progress=tqdm).assign(**meta),
    uses=["pilot_runs", "N_PROMPTS"],
)
report = split_label(bench.speedup_table(runs, seed=SEED))
report["layers"] = report.drafter.map(lambda d: str(SUBSETS.get(d, "")))
report["predicted"] = [predicted_speedup(r.token_acceptance, r.k, r.c, r.v) for r in report.itertuples()]
pilot["chosen"] = [CHOSEN[d] == k for d, k in zip(pilot.drafter, pilot.k)]
results.save(pilot.assign(split="pilot", **meta), f"{NB}/pilot")
results.save(report.assign(split="report", **meta), f"{NB}/subsets")
display(
    report[
        [
            "drafter",
            "layers",
            "k",
            "speedup",
            "lo",
            "hi",
            "total_ratio",
            "token_acceptance",
            "acceptance",
            "c",
            "v",
            "predicted",
            "tokens_per_call",
            "identical",
            "runs",
        ]
    ].round(3)
)

fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.6))
order = report.sort_values("speedup")
colors = ["k" if d == DRAFT_NAME else f"C{list(SUBSETS).index(d)}" for d in order.drafter]
y = np.arange(len(order))
axes[0].barh(y, order.speedup, color=colors, alpha=0.8)
axes[0].errorbar(
    order.speedup, y, xerr=[order.speedup - order.lo, order.hi - order.speedup], fmt="none", ecolor="k", capsize=3
)
axes[0].set_yticks(y, [f"{d} (k = {k})" for d, k in zip(order.drafter, order.k)], fontsize=8)
axes[0].axvline(1, color="k", lw=0.8)
axes[0].set(xlabel="speedup over AR (median over reported prompts)", title=f"greedy, {PILOT_CONTEXT}-token prompts")
for r, col in zip(
    report.itertuples(), ["k" if d == DRAFT_NAME else f"C{list(SUBSETS).index(d)}" for d in report.drafter]
):
    axes[1].scatter(r.c, r.token_acceptance, color=col, s=50, marker="x" if r.drafter == DRAFT_NAME else "o")
    axes[1].annotate(r.drafter, (r.c, r.token_acceptance), fontsize=7, xytext=(4, 3), textcoords="offset points")
v_loop = report.v.median()
for k, ls in [(KS[0], ":"), (KS[-1], "--")]:
    be = [next((a for a in np.linspace(0, 0.999, 400) if predicted_speedup(a, k, c, v_loop) >= 1), np.nan) for c in cs]
    axes[1].plot(cs, be, color="grey", ls=ls, lw=1, label=f"break-even, k = {k}")
axes[1].set(
    xlabel="in-loop c (drafting per token / AR step)",
    ylabel="per-token acceptance α (decoding)",
    ylim=(0, 1.02),
    title="accuracy against cost",
)
axes[1].legend(fontsize=8)
savefig(fig, f"{NB}_subsets")
plt.show()

selfs = report[report.drafter != DRAFT_NAME]
piloted_best = pilot[(pilot.drafter != DRAFT_NAME) & pilot.chosen].sort_values("speedup").iloc[-1]
BEST = piloted_best.drafter  # the self-draft chosen on the pilot prompts
sep = report[report.drafter == DRAFT_NAME].iloc[0]
chosen_self = report[report.drafter == BEST].iloc[0]
display(
    Markdown(
        f"On the pilot prompts the best self-draft is **{BEST}** (layers {SUBSETS[BEST]}) at k = {CHOSEN[BEST]} "
        f"({piloted_best.speedup:.2f}x). On the reported prompts it runs at {chosen_self.speedup:.2f}x over AR (95% CI "
        f"{chosen_self.lo:.2f}–{chosen_self.hi:.2f}); the self-drafts span {selfs.speedup.min():.2f}x to "
        f"{selfs.speedup.max():.2f}x there, the separate draft {sep.speedup:.2f}x at k = {int(sep.k)} "
        f"(CI {sep.lo:.2f}–{sep.hi:.2f}). Per-token acceptance spans {selfs.token_acceptance.min():.2f}–"
        f"{selfs.token_acceptance.max():.2f} for the subsets ({sep.token_acceptance:.2f} for the separate draft) while their "
        f"in-loop c spans {selfs.c.min():.2f}–{selfs.c.max():.2f} ({sep.c:.3f}). The analytic model with these in-loop α, c and "
        f"v is off the measured speedup by {np.abs(report.predicted - report.speedup).median():.2f} at the median and "
        f"{np.abs(report.predicted - report.speedup).max():.2f} at most ({report.loc[(report.predicted - report.speedup).abs().idxmax()].drafter}). Outputs identical "
        f"to AR: {int(report.identical.sum())} / {int(report.runs.sum())} reported runs, "
        f"{int(pilot.identical.sum())} / {int(pilot.runs.sum())} pilot runs."
    )
)

# %% [markdown]
# ## 3 · A trained exit for the chosen subset
# **Question.** The chosen subset's last hidden state was never trained to feed the LM head directly.
# How much acceptance does a small trained correction buy, and at what cost?
#
# **Method.** `train_exit` trains an `ExitAdapter` (an RMSNorm and a rank-`EXIT_RANK` correction,
# zero-initialised, so it starts as the identity) before the target's frozen final norm and LM head,
# by distillation: minimise KL(p_full ‖ q_subset) on windows of the *training* split, for at most
# `EXIT_STEPS` steps or `EXIT_MINUTES` minutes; the target's weights do not change. It reports the
# KL and the teacher-forced acceptance Σ min(p, q) on held-out windows of the training stream before
# and after. Then the subset with the exit decodes like section 2: its k chosen on the pilot prompts,
# reported on the same reported prompts as the subset without it, AR beside both.
#
# **How to read the figure.** Left: teacher-forced KL and acceptance before and after training.
# Right: speedup over AR with its interval and per-token acceptance, the subset without and with the
# exit.


# %%
def exit_tables():
    stream = train.token_stream("train", target.tokenizer)
    small = dict(batch=2, seq=64, n_eval=2) if SMOKE else {}
    adapter, rep = train_exit(
        target, SUBSETS[BEST], stream, EXIT_STEPS, minutes=EXIT_MINUTES, rank=EXIT_RANK, seed=SEED, **small
    )
    weights = pd.DataFrame(
        [
            dict(name=n, shape=list(p.shape), values=p.detach().float().flatten().tolist())
            for n, p in adapter.state_dict().items()
        ]
    )
    rep = pd.DataFrame(
        [{**rep, "layers": str(rep["layers"]), "subset": BEST, "params": sum(p.numel() for p in adapter.parameters())}]
    )
    pilot_cfgs = {label(f"{BEST} + exit", k): (lambda k=k: drafter_for(SUBSETS[BEST], k, adapter)) for k in KS}
    p_runs = bench.paired_runs(pilot_prompts, methods_for(pilot_cfgs), progress=tqdm)
    p_tab = split_label(bench.speedup_table(p_runs, seed=SEED))
    k_exit = int(p_tab.loc[p_tab.speedup.idxmax()].k)
    r_cfgs = {
        label(BEST, CHOSEN[BEST]): lambda: drafter_for(SUBSETS[BEST], CHOSEN[BEST]),
        label(f"{BEST} + exit", k_exit): lambda: drafter_for(SUBSETS[BEST], k_exit, adapter),
    }
    r_runs = bench.paired_runs(report_prompts, methods_for(r_cfgs), progress=tqdm)
    return {
        "exit_report": rep.assign(k_exit=k_exit, **meta),
        "exit_weights": weights,
        "exit_pilot_runs": p_runs.assign(**meta),
        "exit_runs": r_runs.assign(**meta),
    }


ex = study.step("exit", exit_tables, uses=["runs", "EXIT_MINUTES", "EXIT_STEPS", "EXIT_RANK"])
exit_rep = ex["exit_report"].iloc[0]
K_EXIT = int(exit_rep.k_exit)
ADAPTER = ExitAdapter(target.config.hidden_size, int(exit_rep["rank"])).to(target.device)
ADAPTER.load_state_dict(
    {
        r["name"]: torch.tensor(np.asarray(r["values"], dtype=np.float32)).reshape([int(s) for s in r["shape"]])
        for _, r in ex["exit_weights"].iterrows()
    }
)
ADAPTER.eval()
exit_tab = split_label(bench.speedup_table(ex["exit_runs"], seed=SEED))
results.save(exit_tab.assign(**meta), f"{NB}/exit")
display(
    ex["exit_report"][
        [
            "subset",
            "layers",
            "rank",
            "params",
            "steps",
            "tokens",
            "seconds",
            "kl_before",
            "kl_after",
            "acceptance_before",
            "acceptance_after",
            "k_exit",
        ]
    ].round(4)
)
display(
    exit_tab[
        ["drafter", "k", "speedup", "lo", "hi", "token_acceptance", "c", "tokens_per_call", "identical", "runs"]
    ].round(3)
)

fig, axes = plt.subplots(1, 2, figsize=(11, 4))
axes[0].bar([0, 1], [exit_rep.kl_before, exit_rep.kl_after], color=["C7", "C2"], width=0.35, label="KL(p ‖ q), nats")
axes[0].bar([2, 3], [exit_rep.acceptance_before, exit_rep.acceptance_after], color=["C7", "C2"], width=0.35)
axes[0].set_xticks([0, 1, 2, 3], ["KL before", "KL after", "Σmin(p,q) before", "Σmin(p,q) after"], fontsize=8)
axes[0].set(title=f"teacher-forced, held-out windows ({int(exit_rep.steps)} steps)")
x = np.arange(len(exit_tab))
axes[1].errorbar(
    x - 0.1,
    exit_tab.speedup,
    yerr=[exit_tab.speedup - exit_tab.lo, exit_tab.hi - exit_tab.speedup],
    fmt="o",
    capsize=4,
    label="speedup over AR",
)
axes[1].plot(x + 0.1, exit_tab.token_acceptance, "s", color="C2", label="per-token acceptance α")
axes[1].axhline(1, color="k", lw=0.8)
axes[1].set_xticks(x, [f"{d}\n(k = {k})" for d, k in zip(exit_tab.drafter, exit_tab.k)], fontsize=8)
axes[1].set(title="decoding, reported prompts", ylim=(0, max(1.1, float(exit_tab.hi.max()) + 0.05)))
axes[1].legend(fontsize=8)
savefig(fig, f"{NB}_exit")
plt.show()
e_no, e_yes = exit_tab.iloc[0], exit_tab.iloc[1]
display(
    Markdown(
        f"Training the exit for {BEST} ({int(exit_rep.params)} weights, {int(exit_rep.steps)} steps, "
        f"{exit_rep.seconds:.0f} s) moved the held-out KL from {exit_rep.kl_before:.3f} to {exit_rep.kl_after:.3f} "
        f"nats and the teacher-forced acceptance from {exit_rep.acceptance_before:.3f} to {exit_rep.acceptance_after:.3f}. In "
        f"decoding, per-token acceptance goes from {e_no.token_acceptance:.3f} (k = {int(e_no.k)}) to {e_yes.token_acceptance:.3f} "
        f"(k = {int(e_yes.k)}) and the speedup from {e_no.speedup:.2f}x (CI {e_no.lo:.2f}–{e_no.hi:.2f}) to {e_yes.speedup:.2f}x "
        f"(CI {e_yes.lo:.2f}–{e_yes.hi:.2f}); the exit's in-loop c is {e_yes.c:.3f} against {e_no.c:.3f} without it. Outputs "
        f"identical to AR: {int(exit_tab.identical.sum())} / {int(exit_tab.runs.sum())}."
    )
)

# %% [markdown]
# ## 4 · Context length: where, if anywhere, self-speculation overtakes AR
# **Question.** Section 1 showed how c moves with the context. Does the speedup follow, and does a
# self-draft overtake AR and the separate draft at some context length?
#
# **Method.** For each context length in `CONTEXTS`, `CONTEXT_PROMPTS` reported prompts: the n held-out
# tokens before a fixed anchor (the same anchors at every length), then `MAX_NEW_TOKENS` greedy tokens.
# Configurations, each at the k chosen on the pilot prompts: the chosen self-draft, the same with its
# trained exit, the linear subgraph (notebook 03's variant) when it is not the chosen one, and the
# separate draft. Two speedups per configuration, both with the workbook's estimator on the same runs:
# **end to end** (the run's whole time, the prompt's prefill included — a self-draft prefills the
# prompt through its own layers, the separate draft through its two small ones) and **decoding only**
# (the run's drafting and verifying time, prefill excluded: the steady state a long generation
# approaches). The paired ratio of the best self-draft to the separate draft, on the same prompts,
# says which of the two is faster.
#
# **How to read the figure.** Left: end-to-end speedup over AR against the context (log scale), one line
# per configuration with its 95% interval; middle: decoding only. Above the black line is faster than AR.
# A self-draft line that rises with the context while the separate draft's does not is the cost
# structure of section 1 at work. Right: each configuration's per-token acceptance α against the
# context. Both models were trained on 256-token windows, so at long contexts each predicts from
# positions it never saw; a draft whose α falls with the context is extrapolating worse than the
# target it drafts for, and that, not cost, can decide the comparison there.

# %%
CTX_CONFIGS = {
    label(BEST, CHOSEN[BEST]): lambda: drafter_for(SUBSETS[BEST], CHOSEN[BEST]),
    label(f"{BEST} + exit", K_EXIT): lambda: drafter_for(SUBSETS[BEST], K_EXIT, ADAPTER),
}
if BEST != "linear":
    CTX_CONFIGS[label("linear", CHOSEN["linear"])] = lambda: drafter_for(SUBSETS["linear"], CHOSEN["linear"])
CTX_CONFIGS[label(DRAFT_NAME, CHOSEN[DRAFT_NAME])] = lambda: ModelDrafter(draft, CHOSEN[DRAFT_NAME])
# the self-draft set against the separate draft at every context: the fastest on the pilot prompts (the
# chosen subset at its k from section 2's pilot, the same with its exit from section 3's)
exit_pilot = split_label(bench.speedup_table(ex["exit_pilot_runs"], seed=SEED))
pilot_speed = {
    label(BEST, CHOSEN[BEST]): float(pilot[(pilot.drafter == BEST) & pilot.chosen].speedup.iloc[0]),
    label(f"{BEST} + exit", K_EXIT): float(exit_pilot[exit_pilot.k == K_EXIT].speedup.iloc[0]),
}
if BEST != "linear":
    pilot_speed[label("linear", CHOSEN["linear"])] = float(
        pilot[(pilot.drafter == "linear") & pilot.chosen].speedup.iloc[0]
    )
CTX_SELF = max(pilot_speed, key=pilot_speed.get)
print(
    f"self-draft compared with the separate draft at every context (fastest on the pilot prompts): {CTX_SELF} "
    f"({pilot_speed[CTX_SELF]:.2f}x there)"
)


def decoding_only(runs):
    """The same rows with a run's time reduced to its drafting and verifying (prefill excluded)."""
    out = runs.copy()
    out["seconds"] = out.draft_s + out.verify_s
    out["tokens_per_s"] = out.new_tokens / out.seconds
    return out


def context_runs():
    frames = []
    for ctx in tqdm(CONTEXTS, desc="contexts"):
        prompts = [window(a, ctx) for a in context_anchors]
        frames.append(bench.paired_runs(prompts, methods_for(CTX_CONFIGS), progress=tqdm).assign(context=ctx))
    return pd.concat(frames, ignore_index=True).assign(**meta)


ctx_runs = study.step("context_runs", context_runs, uses=["exit", "CONTEXTS", "CONTEXT_PROMPTS"])
rows, paired = [], []
for ctx, g in ctx_runs.groupby("context"):
    for how, frame in [("end to end", g), ("decoding only", decoding_only(g))]:
        tab = split_label(bench.speedup_table(frame, seed=SEED)).assign(context=ctx, timing=how)
        rows.append(tab)
        pr = bench.speedup(frame, CTX_SELF, reference=label(DRAFT_NAME, CHOSEN[DRAFT_NAME]), seed=SEED)
        paired.append(
            dict(context=ctx, timing=how, self_draft=CTX_SELF, over_separate=pr["speedup"], lo=pr["lo"], hi=pr["hi"])
        )
ctx_tab = pd.concat(rows, ignore_index=True)
ctx_tab["chosen_on_pilot"] = ctx_tab.method == CTX_SELF
ctx_pair = pd.DataFrame(paired)
# what 1.3x over AR would need, per context: the acceptance the analytic model asks of each self-draft at the
# c and v(k) it paid inside these runs (drafting seconds per drafted token and its verify step, over AR's step)
need = []
for r in ctx_tab[(ctx_tab.timing == "decoding only") & (ctx_tab.drafter != DRAFT_NAME)].itertuples():
    a_need = next((a for a in np.linspace(0, 0.9999, 2000) if predicted_speedup(a, r.k, r.c, r.v) >= 1.3), np.nan)
    need.append(
        dict(
            context=r.context,
            drafter=r.drafter,
            k=r.k,
            c=r.c,
            v=r.v,
            alpha_measured=r.token_acceptance,
            alpha_for_1_3x=a_need,
            best_possible=predicted_speedup(1.0, r.k, r.c, r.v),
        )
    )
need = pd.DataFrame(need)
results.save(ctx_tab.assign(**meta), f"{NB}/context")
results.save(ctx_pair.assign(**meta), f"{NB}/context_vs_separate")
results.save(need.assign(**meta), f"{NB}/context_need")
display(ctx_tab.pivot_table(index=["timing", "drafter"], columns="context", values="speedup", sort=False).round(3))
display(ctx_pair.round(3))
display(need.round(3))

fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
axes[1].sharey(axes[0])
for ax, how in zip(axes, ["end to end", "decoding only"]):
    t = ctx_tab[ctx_tab.timing == how]
    for i, (d, g) in enumerate(t.groupby("drafter", sort=False)):
        g = g.sort_values("context")
        ax.errorbar(
            g.context * (1 + 0.03 * (i - 1.5)),
            g.speedup,
            yerr=[g.speedup - g.lo, g.hi - g.speedup],
            fmt="o",
            capsize=3,
            color="k" if d == DRAFT_NAME else f"C{i}",
            ls="--" if d == DRAFT_NAME else "-",
            label=f"{d} (k = {int(g.k.iloc[0])})",
        )
    ax.axhline(1, color="k", lw=0.8)
    if trained_context < max(CONTEXTS):
        ax.axvline(trained_context, color="grey", lw=0.8, ls=":")
    ax.set(xscale="log", xlabel="context (tokens)", title=how)
    ax.set_xticks(CONTEXTS, [str(c) for c in CONTEXTS])
    ax.minorticks_off()
axes[0].set_ylabel("speedup over AR (median over prompts)")
axes[1].legend(fontsize=8)
t = ctx_tab[ctx_tab.timing == "end to end"]
for i, (d, g) in enumerate(t.groupby("drafter", sort=False)):
    g = g.sort_values("context")
    axes[2].plot(
        g.context,
        g.token_acceptance,
        "o-" if d != DRAFT_NAME else "x--",
        color="k" if d == DRAFT_NAME else f"C{i}",
        label=d,
    )
axes[2].set(
    xscale="log", xlabel="context (tokens)", ylabel="per-token acceptance α", ylim=(0, 1.02), title="acceptance"
)
axes[2].set_xticks(CONTEXTS, [str(c) for c in CONTEXTS])
axes[2].minorticks_off()
savefig(fig, f"{NB}_context")
plt.show()


def crossing(t, cond):
    hit = t[cond(t)]
    return int(hit.context.min()) if len(hit) else None


text = []
for how in ["end to end", "decoding only"]:
    t = ctx_tab[(ctx_tab.timing == how) & ctx_tab.chosen_on_pilot]
    top = t.set_index("context")
    sep_t = ctx_tab[(ctx_tab.timing == how) & (ctx_tab.drafter == DRAFT_NAME)].set_index("context")
    pr = ctx_pair[ctx_pair.timing == how].set_index("context")
    over_ar = crossing(t, lambda d: d.lo > 1)
    over_sep = next((c for c in pr.index if pr.lo[c] > 1), None)
    text.append(
        f"**{how.capitalize()}.** The self-draft chosen on the pilot prompts ({CTX_SELF}) runs at "
        + ", ".join(f"{top.speedup[c]:.2f}x (CI {top.lo[c]:.2f}–{top.hi[c]:.2f}) at {c}" for c in top.index)
        + " tokens of context; the separate draft at "
        + ", ".join(f"{sep_t.speedup[c]:.2f}x (CI {sep_t.lo[c]:.2f}–{sep_t.hi[c]:.2f})" for c in sep_t.index)
        + ". "
        + (
            f"Its interval lies above 1 (reliably faster than AR) first at {over_ar} tokens of context. "
            if over_ar
            else "It is not reliably faster than AR (interval above 1) at any measured context. "
        )
        + (
            f"Paired per prompt, it overtakes the separate draft from {over_sep} tokens on "
            f"({pr.over_separate[over_sep]:.2f}x its speed, CI {pr.lo[over_sep]:.2f}–{pr.hi[over_sep]:.2f})."
            if over_sep
            else f"Paired per prompt it never overtakes the separate draft: its speed over the separate "
            f"draft's is {pr.over_separate.min():.2f}–{pr.over_separate.max():.2f}x across contexts."
        )
    )
acc_ctx = ctx_tab[ctx_tab.timing == "end to end"].pivot_table(
    index="drafter", columns="context", values="token_acceptance", sort=False
)
text.append(
    "**Acceptance by context.** Per-token α of the separate draft: "
    + ", ".join(f"{acc_ctx.loc[DRAFT_NAME, c]:.2f} at {c}" for c in acc_ctx.columns)
    + "; of "
    + BEST
    + ": "
    + ", ".join(f"{acc_ctx.loc[BEST, c]:.2f} at {c}" for c in acc_ctx.columns)
    + ". "
    + (
        "Contexts above 256 tokens lie beyond both models' training windows, so these runs also measure how each "
        "model extrapolates."
        if max(CONTEXTS) > 256
        else ""
    )
)
n_best = need.groupby("context").apply(lambda g: g.loc[g.best_possible.idxmax()], include_groups=False)
text.append(
    "**Why, in the analytic model's terms.** For the most favourable self-draft at each context (at the c and v(k) it "
    "paid in these runs), 1.3x over AR would need: "
    + "; ".join(
        f"at {c} tokens ({r.drafter}, k = {int(r.k)}, c = {r.c:.2f}, v = {r.v:.2f}) "
        + (
            f"per-token acceptance {r.alpha_for_1_3x:.2f}, against {r.alpha_measured:.2f} measured"
            if r.alpha_for_1_3x == r.alpha_for_1_3x
            else f"more than a perfect draft gives: α = 1 predicts at most {r.best_possible:.2f}x"
        )
        for c, r in n_best.iterrows()
    )
    + "."
)
display(Markdown("\n\n".join(text)))

# %% [markdown]
# ## 5 · Perplexity degradation against acceptance
# **Question.** The component-aware study found that the perplexity of the ablated model (the subgraph
# run as a language model on its own) predicts its acceptance as a draft. Does the ranking hold across
# this model's subsets?
#
# **Method.** For every subset the search measured and every named kind, and the chosen subset with its
# trained exit: the held-out next-token loss (`subset_loss`, `EVAL_WINDOWS` windows of 256 tokens from
# the reported half) and, on the same windows, the teacher-forced greedy acceptance. For the subsets
# that decoded in section 2 and 3, also their per-token acceptance α from the decoding runs. The
# degradation is the loss increase over the full model, log(PPL_subset / PPL_full). The rank
# correlation is Spearman's ρ (`scipy.stats.spearmanr`); the claim predicts ρ < 0. No p-value is
# given: the subsets are neighbours along one greedy search path (each drops one layer from the one
# before) and all are scored on the same windows, so the points are not independent draws, which is
# what the p-value of a rank correlation assumes.
#
# **How to read the figure.** x: perplexity degradation (nats); y: acceptance. Left: decoding α of the
# subsets that decoded (few points). Right: teacher-forced acceptance of every subset
# measured (many more points); the red point is the chosen subset with its exit.


# %%
def perplexity():
    pm = proxy_measure(target, eval_windows, context=PILOT_CONTEXT, temperature=0.0)
    todo = dict.fromkeys([str(ALL)] + list(hist.layers) + [str(l) for l in SUBSETS.values()])
    rows = []
    for s in tqdm(todo, desc="subsets"):
        layers = [int(x) for x in s.strip("[]").split(",")]
        rows.append(
            dict(layers=s, exit=False, loss=subset_loss(target, layers, eval_windows), tf_acceptance=pm(layers)[0])
        )
    rows.append(
        dict(
            layers=str(SUBSETS[BEST]),
            exit=True,
            loss=subset_loss(target, SUBSETS[BEST], eval_windows, exit=ADAPTER),
            tf_acceptance=acceptance_proxy(target, SUBSETS[BEST], eval_windows, exit=ADAPTER, temperature=0.0),
        )
    )
    return pd.DataFrame(rows).assign(**meta)


ppl = study.step("perplexity", perplexity, uses=["exit", "EVAL_WINDOWS"])
full_loss = float(ppl[(ppl.layers == str(ALL)) & ~ppl.exit].loss.iloc[0])
ppl["degradation"] = ppl.loss - full_loss
ppl["perplexity"] = np.exp(ppl.loss)
ppl = ppl[~((ppl.layers == str(ALL)) & ~ppl.exit)]
name_of = {str(l): n for n, l in SUBSETS.items()}
ppl["subset"] = [name_of.get(s, "") + (" + exit" if e else "") for s, e in zip(ppl.layers, ppl.exit)]
dec = pd.concat(
    [
        report[report.drafter != DRAFT_NAME][["drafter", "token_acceptance"]],
        exit_tab[exit_tab.drafter.str.endswith("+ exit")][["drafter", "token_acceptance"]],
    ]
)
dec = dec.merge(ppl[ppl.subset != ""][["subset", "degradation", "loss"]], left_on="drafter", right_on="subset")
rho_dec = spearmanr(dec.degradation, dec.token_acceptance) if len(dec) > 2 else None
rho_tf = spearmanr(ppl.degradation, ppl.tf_acceptance)
corr = pd.DataFrame(
    [
        dict(acceptance="decoding α (section 2–3 subsets)", n=len(dec), rho=rho_dec.statistic if rho_dec else np.nan),
        dict(acceptance="teacher-forced greedy (every subset measured)", n=len(ppl), rho=rho_tf.statistic),
    ]
)
results.save(ppl.assign(**meta), f"{NB}/perplexity_points")
results.save(dec.assign(**meta), f"{NB}/perplexity_decoding")
results.save(corr.assign(full_loss=full_loss, **meta), f"{NB}/perplexity_correlation")
display(corr.round(4))

fig, axes = plt.subplots(1, 2, figsize=(12, 4.3), sharex=True)
axes[0].scatter(dec.degradation, dec.token_acceptance, s=40)
for r in dec.itertuples():
    axes[0].annotate(
        r.drafter, (r.degradation, r.token_acceptance), fontsize=7, xytext=(4, 3), textcoords="offset points"
    )
axes[0].set(
    title=f"decoding α: Spearman ρ = {corr.rho[0]:.2f} (n = {len(dec)})",
    ylabel="per-token acceptance α",
    xlabel="log(PPL_subset / PPL_full), nats",
)
plain = ppl[~ppl.exit]
axes[1].scatter(plain.degradation, plain.tf_acceptance, s=18, color="C0", alpha=0.7, label="subset")
axes[1].scatter(ppl[ppl.exit].degradation, ppl[ppl.exit].tf_acceptance, s=60, color="C3", label=f"{BEST} + exit")
axes[1].set(
    title=f"teacher-forced: Spearman ρ = {corr.rho[1]:.2f} (n = {len(ppl)})",
    ylabel="teacher-forced greedy acceptance",
    xlabel="log(PPL_subset / PPL_full), nats",
)
axes[1].legend(fontsize=8)
for ax in axes:
    ax.set_ylim(0, 1.02)
savefig(fig, f"{NB}_perplexity")
plt.show()
lin_row = ppl[(ppl.subset == "linear")].iloc[0]
d_plain, a_plain = ppl[(ppl.subset == BEST)][["degradation", "tf_acceptance"]].iloc[0]
d_exit, a_exit = ppl[ppl.exit][["degradation", "tf_acceptance"]].iloc[0]
display(
    Markdown(
        f"The full model's held-out loss is {full_loss:.3f} nats (perplexity {np.exp(full_loss):.1f}); skipping the attention "
        f"layers raises it by {lin_row.degradation:.3f} nats (perplexity {lin_row.perplexity:.1f}). Across the {len(ppl)} subsets "
        f"measured, the rank correlation between degradation and teacher-forced acceptance is ρ = {corr.rho[1]:.2f}; over "
        f"the {len(dec)} subsets that decoded, between degradation and decoding α, ρ = {corr.rho[0]:.2f}. "
        + (
            "Both are negative: on these windows and prompts, the more a subset degrades the model, the less often its "
            "drafts are kept, as the component-aware study found. "
            if corr.rho.max() < 0
            else "The two correlations do not agree in sign, so the ablated perplexity does not rank acceptance consistently "
            "here. "
            if corr.rho.min() < 0
            else "Neither is negative: the ablated perplexity does not rank acceptance on this model. "
        )
        + "How far the ranking generalises beyond these windows is not tested: the subsets lie along one search path and "
        "share the windows they are scored on, so the points are not independent and no p-value is given. "
        + f"The trained exit moves its subset's degradation from {d_plain:.3f} to {d_exit:.3f} nats and its teacher-forced "
        f"acceptance from {a_plain:.3f} to {a_exit:.3f}."
    )
)

# %% [markdown]
# ## 6 · Other hybrid families
# **Question.** The component-aware study's two numbers come from two families: the linear subgraph of
# Falcon-H1 (a Mamba2 mixer beside attention in every layer, the two outputs added) drafts with
# α = 0.68 at k = 2, Qwen3.5's (Gated DeltaNet layers between attention layers, as `hybrid-target`)
# with α = 0.038. Does the family matter that much when both are trained the same way?
#
# **Method.** `OTHER_FAMILIES` are two tiny Falcon-H1 models trained here on the same data, the same
# number of tokens and the same distillation from `code-target` as `TARGET` (their model cards say how),
# at about its parameter count: `falcon-h1-tiny` with attention and Mamba2 branches equally wide (8
# heads of 64 each), `falcon-h1-tiny-wide-ssm` with the released Falcon-H1 models' ratio (the 0.5B model
# has 24 Mamba heads and 8 attention heads, all of 64; here 12 and 4), so that switching attention off
# removes a smaller share of each layer. In a Falcon-H1 layer attention is a branch, not a layer, so
# its linear subgraph is every layer with the attention branch switched off: `BranchSkipLM(lm)`, a view
# of the same weights with its own cache,
# drafting through the stock `ModelDrafter` (`speclib/lms/branches.py`). `TARGET`'s linear
# subgraph is `subset(target, "linear")`. For every model, on the same held-out windows as section 5
# and at the pilot context: the full model's and the subgraph's held-out loss (their difference is the
# degradation), the teacher-forced acceptance at temperature 0 (argmax agreement) and 1 (Σ min(p, q)),
# and the subgraph's cost c (one-token pass over the full model's, timed round-robin). Then each model
# decodes the reported prompts greedily with its own linear subgraph at every k of `KS`, its own AR
# beside it, the speedup with its bootstrap CI as everywhere in the workbook. speclib runs Falcon-H1
# through the stock transformers forward (`StatefulLM`): a step that rejects part of the chain restores
# the recurrent states and re-runs the accepted tokens (snapshot-replay), an extra pass `hybrid-target`'s
# own forward does not pay. That weighs on the Falcon-H1 speedups, not on their acceptance.
#
# **How to read the tables.** The first compares the models' subgraphs teacher-forced; the second
# is their decoding on the same prompts, one model's rows against its own AR. acceptance is accepted /
# drafted per step, the component-aware study's α; c there is the in-loop draft cost.

# %%
shipped = speclib.checkpoints()
missing = [name for name in OTHER_FAMILIES if name not in shipped]
if missing:
    raise ValueError(
        f"OTHER_FAMILIES {missing} are not shipped checkpoints ({', '.join(shipped)}); train them with "
        f"`python -m speclib train model NAME ...` (presets in speclib/research/training.py, commands in `make train`)"
    )
models = {TARGET: target} | {name: speclib.load(name, device=DEVICE) for name in OTHER_FAMILIES}


def linear_subgraph(lm):
    """A model's linear subgraph as an LM: layer views for Qwen3.5-style hybrids, the attention branch
    switched off for parallel hybrids (Falcon-H1)."""
    if isinstance(lm, HybridLM):
        return lm.view(layers=subset(lm, "linear"), exit=None)
    return BranchSkipLM(lm)


def families():
    rows, per_window = [], []
    for name, lm in models.items():
        full = lm.view(layers=ALL, exit=None) if isinstance(lm, HybridLM) else lm
        sub = linear_subgraph(lm)
        t_full, t_sub = bench.latencies(
            [(full, 1), (sub, 1)], prefix_len=PILOT_CONTEXT, repeats=LATENCY_REPEATS, warmup=3
        )
        # per window (all windows have the same length, so their mean is the pooled loss): the degradation
        # of two models compared window by window, with a paired interval
        for i, w in enumerate(eval_windows):
            per_window.append(dict(model=name, window=i, loss_full=lm_loss(full, [w]), loss_linear=lm_loss(sub, [w])))
        pw = pd.DataFrame([r for r in per_window if r["model"] == name])
        rows.append(
            dict(
                model=name,
                architecture=lm.model.config.model_type,
                params_m=lm.model.num_parameters() / 1e6,
                loss_full=pw.loss_full.mean(),
                loss_linear=pw.loss_linear.mean(),
                degradation=(pw.loss_linear - pw.loss_full).mean(),
                tf_acceptance_t0=lm_acceptance(full, sub, eval_windows, temperature=0.0),
                tf_acceptance_t1=lm_acceptance(full, sub, eval_windows, temperature=1.0),
                c=t_sub / t_full,
            )
        )
    return {"families": pd.DataFrame(rows).assign(**meta), "family_windows": pd.DataFrame(per_window).assign(**meta)}


def family_runs():
    """Every run's row (paired_runs), one model after another; the summary is computed from them below."""
    frames = []
    for name, lm in models.items():
        sub = linear_subgraph(lm)
        methods = {"AR": lambda ids, i, lm=lm: generate(lm, ids, MAX_NEW_TOKENS, sampling=GREEDY, eos_token_id=None)}
        for k in KS:
            methods[label("linear", k)] = lambda ids, i, lm=lm, sub=sub, k=k: generate(
                lm, ids, MAX_NEW_TOKENS, drafter=ModelDrafter(sub, k), sampling=GREEDY, eos_token_id=None
            )
        frames.append(bench.paired_runs(report_prompts, methods, progress=tqdm).assign(model=name))
    return {"family_run_rows": pd.concat(frames, ignore_index=True).assign(**meta)}


fam_tabs = study.step(
    "families", families, uses=["OTHER_FAMILIES", "EVAL_WINDOWS", "PILOT_CONTEXT", "LATENCY_REPEATS", "THREADS"]
)
fam, fam_windows = fam_tabs["families"], fam_tabs["family_windows"]
display(
    fam[
        [
            "model",
            "architecture",
            "params_m",
            "loss_full",
            "loss_linear",
            "degradation",
            "tf_acceptance_t0",
            "tf_acceptance_t1",
            "c",
        ]
    ].round(3)
)
fam_rows = study.step(
    "family_runs",
    family_runs,
    uses=["OTHER_FAMILIES", "KS", "N_PROMPTS", "MAX_NEW_TOKENS", "PILOT_CONTEXT", "SEED", "THREADS"],
)["family_run_rows"]
runs_tab = pd.concat(
    [
        split_label(bench.speedup_table(g.drop(columns="model"), seed=SEED)).assign(model=m)
        for m, g in fam_rows.groupby("model", sort=False)
    ],
    ignore_index=True,
)
results.save(runs_tab.assign(**meta), f"{NB}/family_runs")
display(
    runs_tab[
        [
            "model",
            "k",
            "acceptance",
            "token_acceptance",
            "tokens_per_call",
            "c",
            "speedup",
            "lo",
            "hi",
            "identical",
            "runs",
        ]
    ].round(3)
)

# %%
acc = runs_tab.pivot(index="k", columns="model", values="acceptance")
sp, f2 = runs_tab.set_index(["model", "k"]), fam.set_index("model")
k2 = 2 if 2 in acc.index else acc.index[0]
falcons = [m for m in OTHER_FAMILIES if f2.architecture[m] == "falcon_h1"]
deg, a2 = f2.degradation, acc.loc[k2]
STUDY_ALPHA = {"falcon_h1": 0.68, "qwen3_5_text": 0.038}  # the component-aware study's k = 2 acceptance


def per_prompt(model, k=k2):
    """One model's linear-subgraph runs at draft length k, one row per prompt, in prompt order."""
    g = fam_rows[(fam_rows.model == model) & (fam_rows.method == label("linear", k))]
    return g.groupby("prompt")[["accepted", "drafted", "reached"]].sum().sort_index()


def acceptance_diff(a, b, den="drafted"):
    """(a - b, lo, hi): the paired difference of pooled acceptance (accepted / `den`) over the same prompts."""
    pa, pb = per_prompt(a), per_prompt(b)
    return stats.paired_difference_ci(dict(num=pa.accepted, den=pa[den]), dict(num=pb.accepted, den=pb[den]), seed=SEED)


def degradation_diff(a, b):
    """(a - b, lo, hi): the paired difference of loss degradation over the same held-out windows."""
    wa, wb = (fam_windows[fam_windows.model == m].sort_values("window") for m in (a, b))
    return stats.paired_difference_ci(
        dict(num=(wa.loss_linear - wa.loss_full).to_numpy(), den=np.ones(len(wa))),
        dict(num=(wb.loss_linear - wb.loss_full).to_numpy(), den=np.ones(len(wb))),
        seed=SEED,
    )


def sign(lo, hi):
    return 1 if lo > 0 else -1 if hi < 0 else 0


pairs = []
names = list(models)
for i, a in enumerate(names):
    for b in names[i + 1 :]:
        d_acc, d_tok, d_deg = acceptance_diff(a, b), acceptance_diff(a, b, "reached"), degradation_diff(a, b)
        pairs.append(
            dict(
                a=a,
                b=b,
                k=k2,
                acceptance_diff=d_acc[0],
                acceptance_lo=d_acc[1],
                acceptance_hi=d_acc[2],
                token_acceptance_diff=d_tok[0],
                token_acceptance_lo=d_tok[1],
                token_acceptance_hi=d_tok[2],
                degradation_diff=d_deg[0],
                degradation_lo=d_deg[1],
                degradation_hi=d_deg[2],
            )
        )
pairs = pd.DataFrame(pairs)
pairs["acceptance_order"] = [sign(r.acceptance_lo, r.acceptance_hi) for r in pairs.itertuples()]
pairs["token_order"] = [sign(r.token_acceptance_lo, r.token_acceptance_hi) for r in pairs.itertuples()]
pairs["degradation_order"] = [sign(r.degradation_lo, r.degradation_hi) for r in pairs.itertuples()]
results.save(pairs.assign(**meta), f"{NB}/family_pairs")
display(pairs.round(3))


def acc_ci(model):
    """(acceptance, lo, hi): accepted / drafted pooled over prompts, 95% bootstrap interval over prompts."""
    p = per_prompt(model)
    acc_, dr = p.accepted.to_numpy(), p.drafted.to_numpy()
    return stats.bootstrap_ci(
        np.arange(len(p)), stat=lambda ix: acc_[ix.astype(int)].sum() / dr[ix.astype(int)].sum(), seed=SEED
    )


def compare(r, what):
    """A sentence comparing r.a with r.b on `what` ("acceptance", "token_acceptance", "degradation")."""
    d, lo, hi = getattr(r, f"{what}_diff"), getattr(r, f"{what}_lo"), getattr(r, f"{what}_hi")
    verdict = "higher" if lo > 0 else "lower" if hi < 0 else "not distinguishable (the interval holds 0)"
    return f"{d:+.3f} (95% CI {lo:+.3f} to {hi:+.3f}): {verdict}"


lines = [
    f"Acceptance of the linear subgraph at k = {k2} on the same {len(per_prompt(TARGET))} reported prompts, with a "
    f"95% bootstrap interval over prompts: "
    + "; ".join(
        f"`{m}` {a2[m]:.3f} (CI {acc_ci(m)[1]:.3f}–{acc_ci(m)[2]:.3f}; teacher-forced greedy agreement "
        f"{f2.tf_acceptance_t0[m]:.3f}, degradation {deg[m]:.2f} nats, c = {f2.c[m]:.2f})"
        for m in models
    )
    + "."
]
for m in models:
    ref = STUDY_ALPHA.get(f2.architecture[m])
    if ref is not None:
        _, lo, hi = acc_ci(m)
        lines.append(
            f"`{m}` against the component-aware study's {ref} for its family: its interval "
            + (
                f"lies above it ({lo:.3f}–{hi:.3f})."
                if lo > ref
                else f"lies below it ({lo:.3f}–{hi:.3f})."
                if hi < ref
                else f"holds it ({lo:.3f}–{hi:.3f})."
            )
        )
lines.append(
    "Paired comparisons (first model minus second; acceptance rate accepted / drafted, per-token acceptance "
    "accepted / reached, loss degradation over the same windows): "
    + " ".join(
        f"`{r.a}` − `{r.b}`: acceptance {compare(r, 'acceptance')}; per-token {compare(r, 'token_acceptance')}; "
        f"degradation {compare(r, 'degradation')}."
        for r in pairs.itertuples()
    )
)
resolved = pairs[(pairs.degradation_order != 0) & (pairs.acceptance_order != 0)]
agree = int((resolved.degradation_order == -resolved.acceptance_order).sum())
unresolved = len(pairs) - len(resolved)
lines.append(
    f"Section 5's rule (the subgraph that degrades its model more drafts worse) can be checked on {len(resolved)} of "
    f"the {len(pairs)} pairs of models, those where both intervals exclude 0: it holds on {agree} and fails on "
    f"{len(resolved) - agree}" + (f"; on the other {unresolved} the data cannot order the pair." if unresolved else ".")
)
lines.append(
    f"Speedups over each model's own AR at the study's k = {k2} (fixed in advance, not tuned): "
    + ", ".join(
        f"`{m}` {sp.loc[(m, k2)].speedup:.2f}x (CI {sp.loc[(m, k2)].lo:.2f}–{sp.loc[(m, k2)].hi:.2f})" for m in models
    )
    + "; at every k of KS: "
    + "; ".join(f"`{m}` " + ", ".join(f"{sp.loc[(m, k)].speedup:.2f}x (k = {k})" for k in KS) for m in models)
    + f". Every greedy output identical to AR's ({int(runs_tab.identical.sum())}/{int(runs_tab.runs.sum())})."
)
display(Markdown("\n\n".join(lines)))

# %% [markdown]
# What this comparison cannot say. The models are tiny, trained on 1.84M tokens; the component-aware
# study's are billions of parameters trained on trillions of tokens, and one seed of training per model
# here gives no spread between runs. The two Falcon-H1 models separate one factor, the width of the
# attention branch against the SSM branch, at fixed data, tokens and parameter count; scale and the
# amount of training are not separated.

# %% [markdown]
# ### This run's steps
# Each expensive step, whether this run computed it or read it from saved results (and from which
# commit), and how long it took when it was computed.

# %%
display(study.summary())

# %% [markdown]
# ## What to take away
#
# * **A self-draft is a view, and the output stays the target's.** Every subset above runs on the
#   target's own weights with its own caches, and every greedy output equals AR's token for token;
#   a subset changes the speed, never the text.
# * **Cost bounds what any subset can do.** A subset that keeps half the layers costs about half a
#   token of the full model (section 1 measures how close to half, against the FLOP count), and with
#   the verify pass's v(k) above 1 even a perfect draft at that price cannot gain much: section 4's
#   last paragraph turns this into the acceptance each context would need. The separate two-layer
#   draft costs a small fraction of a full token, so it can afford far lower acceptance.
# * **The context length moves c.** Attention is the only part of a token whose cost grows with the
#   context, so a subset that skips it gets relatively cheaper as the context grows. Section 4
#   measures how far that carries the speedup, end to end (prefill included: every draft prefills
#   the prompt too) and in the decoding steady state.
# * **Accuracy can be bought cheaply, cost cannot.** A trained exit of 2·d·r weights moves the
#   teacher-forced distance to the full model (section 3); whether that shows in the speed depends on
#   c, which the exit leaves almost as it was.
# * **Perplexity as a predictor.** Section 5 gives the rank correlation and its p-value: read the
#   teacher-forced panel (many subsets) before the decoding one (few).
# * **The family, trained alike.** Section 6 repeats the linear-subgraph measurement on two tiny
#   Falcon-H1 models trained on the same tokens with the same distillation, one with attention as wide
#   as its SSM branch and one with the released models' narrower attention; compare their acceptance
#   with `hybrid-target`'s before reading the component-aware study's 0.68 against 0.038 as a property
#   of the family.
#
# Caveats: one small model trained on 256-token windows (every context above that is extrapolation, and
# those above its configured context are reached by raising the limit), one CPU thread, greedy
# decoding, one seed, short pilots whose choices carry timing noise (reported prompts are disjoint, so
# the reported numbers are not inflated by it), and a greedy subset search with noisy timings.

# %% [markdown]
# ## Exercises
#
# Run from the repository root. A run with changed parameters writes under
# `build/unpublished/06_self_speculation/<hash>/` and recomputes only the steps that use the changed
# parameters; the rest is read from the shipped results. Predict before running.
#
# 1. **Longer drafts.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/06_self_speculation.ipynb build/06_ks.ipynb -p KS "[1, 2, 3, 4, 6, 8]"
#    ```
#
#    *Look for:* whether any subset's chosen k grows, and whether the best speedup moves. *Why:* a
#    longer chain pays k·c for tokens reached with probability α, α², …; with c far from 0, extra
#    positions cost nearly a full pass each and rarely pay.
#
# 2. **A less noisy search.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/06_self_speculation.ipynb build/06_search.ipynb -p SEARCH_REPEATS 20 -p SEARCH_WINDOWS 32
#    ```
#
#    *Look for:* whether the search's best subset changes, and whether its predicted speedup survives
#    decoding. *Why:* the greedy descent follows one layer-removal path, chosen at each round by
#    measurements that carry noise; more timing repeats and more windows make each choice firmer, so a
#    change of the best subset here says the shipped choice was partly luck.
#
# 3. **A longer-trained exit.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/06_self_speculation.ipynb build/06_exit.ipynb -p EXIT_MINUTES 20 -p EXIT_STEPS 2000 -p EXIT_RANK 64
#    ```
#
#    *Look for:* the held-out KL after training and the decoding α with the exit. *Why:* a low-rank
#    correction on the last hidden state can only undo what the skipped layers did in a small
#    subspace; more rank and steps show where that stops helping.
#
# 4. **Longer contexts only.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/06_self_speculation.ipynb build/06_long.ipynb -p CONTEXTS "[1024, 4096, 8192]"
#    ```
#
#    Before running, read section 1's c of the linear subgraph at the longest shipped context and
#    extrapolate. *Look for:* whether the decoding-only speedup keeps rising. *Why:* the attention layers'
#    share of a token's cost keeps growing with the context, but so does the prefill each draft pays.
