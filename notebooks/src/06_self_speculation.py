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
import torch
from IPython.display import Markdown, display

import speclib
from speclib.research import train
from speclib.research.studies import self_speculation as ss
from speclib.workbook import results
from speclib.workbook.plotting import savefig, style
from speclib.workbook.study import Study

if SMOKE:
    CONTEXTS, PILOT_CONTEXT, LATENCY_REPEATS, EARLY_EXIT_NS, FIRST_NS = [128, 256], 128, 3, [2], [4]
    SEARCH_BUDGET, SEARCH_WINDOWS, SEARCH_REPEATS, KS = 4, 2, 2, [1, 2]
    N_PILOT, N_PROMPTS, MAX_NEW_TOKENS, EXIT_MINUTES, EXIT_STEPS = 1, 2, 12, 0.5, 3
    CONTEXT_PROMPTS, EVAL_WINDOWS, OTHER_FAMILIES = 2, 2, OTHER_FAMILIES[:1]
NB = "06_self_speculation"
CTXS = sorted(set(CONTEXTS) | {PILOT_CONTEXT})
EVAL_LEN = 64 if SMOKE else 256  # tokens per perplexity window (section 5)
SEARCH_K = 2 if 2 in KS else KS[0]  # the draft length the search scores (the component-aware study's k)
LONG = max(CTXS) + MAX_NEW_TOKENS + max(KS) + 2  # the longest sequence any run reaches
DRAFT_NAME = f"{DRAFT} (separate draft)"
style()
torch.manual_seed(SEED)
threads = speclib.core.device.set_threads(THREADS or None)
target, draft, trained_context = ss.load_models(TARGET, DRAFT, DEVICE, LONG)
ALL = list(range(len(target.is_gdn)))
full = target.view(layers=ALL, exit=None)
meta = dict(seed=SEED, device=str(target.device), target=TARGET, draft=DRAFT, threads=threads, smoke=SMOKE)
# calibrate: the target's T(1) is timed before and after each step
study = Study(NB, globals(), mode=RESULTS, publish=PUBLISH, always=dict(SMOKE=SMOKE), calibrate=target)
print(f"results mode {RESULTS!r}: this run {study.where()}")
print(ss.describe_target(TARGET, target, trained_context, LONG, threads))

# %% [markdown]
# **Prompts.** Every prompt and window is cut from the held-out stdlib stream (every held-out file,
# tokenized and joined by EOS). Its first half serves the choices (pilot prompts, the search's windows),
# its second half the reports. A prompt at context n is the n tokens before a fixed anchor, so across
# context lengths the same continuation point is decoded with more or less text before it; the anchors
# start 8,192 tokens into each half whatever `CONTEXTS` is, so the prompts of sections 2-3 do not move
# with it (a context longer than that would reach back into the text before).

# %%
held = train.token_stream("heldout", target.tokenizer)
prompts = ss.prompts(
    held, N_PILOT, N_PROMPTS, CONTEXT_PROMPTS, PILOT_CONTEXT, MAX_NEW_TOKENS, SEARCH_WINDOWS, EVAL_WINDOWS, EVAL_LEN
)
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
SUBSETS, ALIASES = ss.catalogue(target, EARLY_EXIT_NS, FIRST_NS)
display(ss.subset_table(target, SUBSETS, ALIASES))

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

# %%
cost = study.step(
    "cost",
    lambda: ss.cost_structure(target, full, draft, SUBSETS, CTXS, KS, LATENCY_REPEATS, DRAFT_NAME, meta),
    uses="TARGET DRAFT CONTEXTS PILOT_CONTEXT LATENCY_REPEATS EARLY_EXIT_NS FIRST_NS KS MAX_NEW_TOKENS THREADS".split(),
)
cost_tabs = ss.cost_tables(cost, SUBSETS)
display(Markdown("**Measured c** (one token of the subset over one of the full model):"))
display(cost_tabs["measured"].round(3))
display(Markdown("**FLOP c** (`flop_cost`) and the full model's one-token time (ms) and verify ratio v(k):"))
display(cost_tabs["flop"].round(3))
display(cost_tabs["full"].round(3))

# %% [markdown]
# # **How to read the figure.** Left: measured c against the context (log scale), one line per subset,
# the separate draft dashed black; lower is cheaper. Right: the same subsets' FLOP c, on the same
# axes. A line that falls with the context is a subset whose skipped layers carry the cost that grows
# with it.

# %%
savefig(ss.plot_cost(cost, SUBSETS, DRAFT_NAME, CTXS, trained_context), f"{NB}_cost")
plt.show()
display(Markdown(ss.cost_text(cost, SUBSETS, DRAFT_NAME, CTXS)))

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

# %%
hist = study.step(
    "search",
    lambda: ss.search(
        target, full, prompts.search, SUBSETS, PILOT_CONTEXT, SEARCH_REPEATS, SEARCH_BUDGET, SEARCH_K, meta
    ),
    uses="TARGET PILOT_CONTEXT EARLY_EXIT_NS FIRST_NS KS SEARCH_BUDGET SEARCH_WINDOWS SEARCH_REPEATS SEED THREADS".split(),
)
# the search's best subset joins the named kinds from here on
best_row, SUBSETS, ALIASES = ss.with_search_best(hist, SUBSETS, ALIASES)

# %% [markdown]
# # **How to read the figure.** Each point is a subset the search measured: x its measured c, y its
# teacher-forced acceptance, colour its predicted speedup; the named kinds are labelled, the search's
# best is starred. The grey curve is where the prediction equals 1 (break-even): points above it are
# predicted to win.

# %%
savefig(ss.plot_search(hist, SUBSETS, best_row, SEARCH_K), f"{NB}_search")
plt.show()
display(Markdown(ss.search_text(hist, SUBSETS, best_row, SEARCH_K)))

# %% [markdown]
# ### 2b · Decoding with every subset: choose on pilot prompts, report on others
# **Method.** Greedy decoding of `MAX_NEW_TOKENS` tokens from prompts of `PILOT_CONTEXT` held-out tokens
# (EOS ignored, so every run has the same length), with every subset (the named kinds and the search's
# best) as a chain drafter at every k in `KS`, and the separate draft at every k: on the `N_PILOT`
# pilot prompts, each drafter's k is chosen by its pilot speedup; on the `N_PROMPTS` reported prompts,
# each drafter runs at its chosen k. Every output is compared with AR's token for token.

# %%
pilot_runs = study.step(
    "pilot_runs",
    lambda: ss.decode_runs(
        prompts.pilot, target, MAX_NEW_TOKENS, ss.all_configs(target, draft, SUBSETS, KS, DRAFT_NAME), meta
    ),
    uses=["search", "DRAFT", "N_PILOT", "MAX_NEW_TOKENS"],
)
pilot = ss.pilot_table(pilot_runs, SEED)
CHOSEN = ss.choose_k(pilot)  # drafter -> its k, chosen on the pilot prompts
runs = study.step(
    "runs",
    lambda: ss.decode_runs(
        prompts.report, target, MAX_NEW_TOKENS, ss.report_configs(target, draft, SUBSETS, CHOSEN, DRAFT_NAME), meta
    ),
    uses=["pilot_runs", "N_PROMPTS"],
)
report = ss.report_table(runs, SUBSETS, SEED)
BEST = ss.best_self_draft(pilot, DRAFT_NAME).drafter  # the self-draft chosen on the pilot prompts
results.save(pilot.assign(split="pilot", **meta), f"{NB}/pilot")
results.save(report.assign(split="report", **meta), f"{NB}/subsets")
columns = "drafter layers k speedup lo hi total_ratio token_acceptance acceptance c v predicted tokens_per_call"
display(report[[*columns.split(), "identical", "runs"]].round(3))

# %% [markdown]
# # **How to read the figure.** Left: each drafter's reported speedup over AR (median over prompts, 95%
# bootstrap interval) at its chosen k, the separate draft last in black; the vertical line is AR.
# Right: the same drafters' per-token acceptance α (accepted / reached positions) from the decoding
# runs against their in-loop c (drafting seconds per drafted token over AR's seconds per step); the
# grey curves are break-even at k = 1 and at the largest k, from the analytic model with the measured
# v(k). A self-draft that lands far below the curves is too expensive for its accuracy.

# %%
savefig(ss.plot_subsets(report, SUBSETS, DRAFT_NAME, PILOT_CONTEXT, KS), f"{NB}_subsets")
plt.show()
display(Markdown(ss.subsets_text(report, pilot, SUBSETS, DRAFT_NAME)))

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

# %%
ex = study.step(
    "exit",
    lambda: ss.exit_tables(
        target,
        BEST,
        SUBSETS[BEST],
        CHOSEN[BEST],
        prompts,
        KS,
        MAX_NEW_TOKENS,
        steps=EXIT_STEPS,
        minutes=EXIT_MINUTES,
        rank=EXIT_RANK,
        seed=SEED,
        smoke=SMOKE,
        meta=meta,
    ),
    uses=["runs", "EXIT_MINUTES", "EXIT_STEPS", "EXIT_RANK"],
)
exit_rep = ex["exit_report"].iloc[0]
K_EXIT = int(exit_rep.k_exit)
ADAPTER = ss.load_adapter(target, exit_rep, ex["exit_weights"])
exit_tab = ss.speedup_table(ex["exit_runs"], SEED)
results.save(exit_tab.assign(**meta), f"{NB}/exit")
columns = "subset layers rank params steps tokens seconds kl_before kl_after acceptance_before acceptance_after k_exit"
display(ex["exit_report"][columns.split()].round(4))
columns = "drafter k speedup lo hi token_acceptance c tokens_per_call identical runs"
display(exit_tab[columns.split()].round(3))

# %% [markdown]
# # **How to read the figure.** Left: teacher-forced KL and acceptance before and after training.
# Right: speedup over AR with its interval and per-token acceptance, the subset without and with the
# exit.

# %%
savefig(ss.plot_exit(exit_rep, exit_tab), f"{NB}_exit")
plt.show()
display(Markdown(ss.exit_text(exit_rep, exit_tab, BEST)))

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

# %%
CTX_CONFIGS = ss.context_configs(target, draft, SUBSETS, BEST, CHOSEN, K_EXIT, ADAPTER, DRAFT_NAME)
# the self-draft set against the separate draft at every context: the fastest on the pilot prompts (the
# chosen subset at its k from section 2's pilot, the same with its exit from section 3's)
exit_pilot = ss.speedup_table(ex["exit_pilot_runs"], SEED)
pilot_speed = ss.pilot_speeds(pilot, exit_pilot, BEST, CHOSEN, K_EXIT)
CTX_SELF = max(pilot_speed, key=pilot_speed.get)
print(
    f"self-draft compared with the separate draft at every context (fastest on the pilot prompts): {CTX_SELF} "
    f"({pilot_speed[CTX_SELF]:.2f}x there)"
)
ctx_runs = study.step(
    "context_runs",
    lambda: ss.context_runs(target, CTX_CONFIGS, prompts, CONTEXTS, MAX_NEW_TOKENS, meta),
    uses=["exit", "CONTEXTS", "CONTEXT_PROMPTS"],
)
ctx_tab, ctx_pair = ss.context_tables(ctx_runs, CTX_SELF, ss.label(DRAFT_NAME, CHOSEN[DRAFT_NAME]), SEED)
need = ss.need_table(ctx_tab, DRAFT_NAME)  # what 1.3x over AR would need of each self-draft, per context
results.save(ctx_tab.assign(**meta), f"{NB}/context")
results.save(ctx_pair.assign(**meta), f"{NB}/context_vs_separate")
results.save(need.assign(**meta), f"{NB}/context_need")
display(ctx_tab.pivot_table(index=["timing", "drafter"], columns="context", values="speedup", sort=False).round(3))
display(ctx_pair.round(3))
display(need.round(3))

# %% [markdown]
# # **How to read the figure.** Left: end-to-end speedup over AR against the context (log scale), one line
# per configuration with its 95% interval; middle: decoding only. Above the black line is faster than AR.
# A self-draft line that rises with the context while the separate draft's does not is the cost
# structure of section 1 at work. Right: each configuration's per-token acceptance α against the
# context. Both models were trained on 256-token windows, so at long contexts each predicts from
# positions it never saw; a draft whose α falls with the context is extrapolating worse than the
# target it drafts for, and that, not cost, can decide the comparison there.

# %%
savefig(ss.plot_context(ctx_tab, CONTEXTS, DRAFT_NAME, trained_context), f"{NB}_context")
plt.show()
display(Markdown(ss.context_text(ctx_tab, ctx_pair, need, CTX_SELF, BEST, DRAFT_NAME)))

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

# %%
ppl_rows = study.step(
    "perplexity",
    lambda: ss.perplexity(target, hist, SUBSETS, BEST, ADAPTER, prompts.eval, PILOT_CONTEXT, meta),
    uses=["exit", "EVAL_WINDOWS"],
)
ppl = ss.perplexity_tables(ppl_rows, SUBSETS, report, exit_tab, DRAFT_NAME)
results.save(ppl["points"].assign(**meta), f"{NB}/perplexity_points")
results.save(ppl["decoding"].assign(**meta), f"{NB}/perplexity_decoding")
results.save(ppl["correlation"].assign(full_loss=ppl["full_loss"], **meta), f"{NB}/perplexity_correlation")
display(ppl["correlation"].round(4))

# %% [markdown]
# # **How to read the figure.** x: perplexity degradation (nats); y: acceptance. Left: decoding α of the
# subsets that decoded (few points). Right: teacher-forced acceptance of every subset
# measured (many more points); the red point is the chosen subset with its exit.

# %%
savefig(ss.plot_perplexity(ppl, BEST), f"{NB}_perplexity")
plt.show()
display(Markdown(ss.perplexity_text(ppl, BEST)))

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
models = {TARGET: target} | ss.load_families(OTHER_FAMILIES, DEVICE)
fam_tabs = study.step(
    "families",
    lambda: ss.families(models, prompts.eval, PILOT_CONTEXT, LATENCY_REPEATS, meta),
    uses=["OTHER_FAMILIES", "EVAL_WINDOWS", "PILOT_CONTEXT", "LATENCY_REPEATS", "THREADS"],
)
fam, fam_windows = fam_tabs["families"], fam_tabs["family_windows"]
columns = "model architecture params_m loss_full loss_linear degradation tf_acceptance_t0 tf_acceptance_t1 c"
display(fam[columns.split()].round(3))
fam_rows = study.step(
    "family_runs",
    lambda: ss.family_runs(models, prompts.report, KS, MAX_NEW_TOKENS, meta),
    uses=["OTHER_FAMILIES", "KS", "N_PROMPTS", "MAX_NEW_TOKENS", "PILOT_CONTEXT", "SEED", "THREADS"],
)["family_run_rows"]
runs_tab = ss.family_runs_table(fam_rows, SEED)
results.save(runs_tab.assign(**meta), f"{NB}/family_runs")
columns = "model k acceptance token_acceptance tokens_per_call c speedup lo hi identical runs"
display(runs_tab[columns.split()].round(3))

# %% [markdown]
# **Paired comparisons.** Every pair of models is compared on the same prompts (acceptance rate, accepted /
# drafted, and per-token acceptance, accepted / reached, of their linear subgraphs at k = 2, the study's
# draft length, or the smallest k run) and on the same windows (loss degradation), each difference with a
# 95% bootstrap interval; `*_order` is 1 or -1 where the interval excludes 0, else 0.

# %%
pairs = ss.family_pairs(fam_rows, fam_windows, list(models), ss.family_k(runs_tab), SEED)
results.save(pairs.assign(**meta), f"{NB}/family_pairs")
display(pairs.round(3))
display(Markdown(ss.family_text(fam, fam_rows, runs_tab, pairs, TARGET, KS, SEED)))

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
