# %% [markdown]
# # 02 · Cache drafts and payoff-guided selection (Hybrid Verified Decoding)
#
# **Question.** When the output reuses the context — an agent that patches a file it just read, JSON
# tool calls quoting an earlier tool output, a plan re-emitted with one box ticked — a draft can be
# *copied* instead of generated. Such cache drafts cost nothing to produce but are often wrong. Can we
# predict, before verifying, how much a cache draft will pay, and use that to choose between it and a
# model drafter at every step?
#
# **Method.** Two parameter-free drafters (`PromptLookupDrafter`, transformers' n-gram rule;
# `SuffixDrafter`, SuffixDecoding's per-request + global suffix trees with frequency probabilities)
# and the model drafter (`agent-draft`, K tokens) feed `HybridDrafter`, which picks a source per
# step: always model, always cache, ArcticInference's rule (suffix iff score ≥ K), SAM's rule
# (retrieval iff match length ≥ 4), **HVD** (a payoff predictor's distribution of the accepted
# length of each cache candidate — prompt lookup's and the suffix tree's — gives the expected payoff
# of verifying each prefix of it; the prefix with the most expected tokens per second of measured
# cost is compared with the model drafter's, from its recent acceptance), and the hindsight oracle
# over the same candidates. Cache drafts are
# point masses, verified by the same lossless rule; every output is checked against AR.
#
# The predictor is fitted on logged verification outcomes of the first half of each workload's
# held-out prompts (by file) and evaluated on the second half; the models were fine-tuned on the
# workloads' train-split files only.
#
# **Why this is a scheduling problem, not a quality problem.** Whatever source drafts, the target
# verifies with the same lossless rule, so the output is the target's greedy output token for token
# (a cache draft is a point mass q = δ(copied token); why any q keeps the output exact is in
# [the lossless rule](../docs/lossless.md)). The only thing a draft source changes is *time*: how
# many tokens one target pass commits, and what drafting and verifying them cost. So every choice
# below is judged in tokens per second, and a wrong cache draft is not harmful, just wasted work — a
# verify pass that commits one token. The trade-off between acceptance and cost is the one of
# [the analytic model](../docs/analytic_model.md); here the acceptance changes from step to step,
# which is why a per-step decision can beat any fixed source.
#
# **How to read the notebook.** Section 1 and the first figure measure what a step costs (the
# currency of every decision); section 2 fits and checks the payoff predictor (is a cache draft's
# payoff predictable at all?); section 3 shows where cache drafts pay; sections 4–5 run every policy
# end to end and compare speedups, measured the workbook's one way with 95% bootstrap intervals (how,
# and why paired ratios, is in [the statistics notes](../docs/statistics.md)). Every number in the text
# cells below the figures is read from this run's results, not typed in.

# %% [markdown]
# ## About this notebook
#
# **What you will learn.**
#
# * How parameter-free drafts work: prompt lookup (copy what followed the last matching n-gram of the
#   context) and suffix trees (continuations seen in this request and earlier ones, with counts).
# * Why a draft source is a scheduling choice, judged in tokens per second, and never a quality one.
# * How to predict a cache draft's payoff before verifying it, how to check such a predictor on
#   unseen prompts (rank correlation, calibration), and how a per-step choice between cache and model
#   drafts (hybrid verified decoding, HVD) compares with fixed sources and published rules.
# * How to compare policies fairly: the same prompts, paired ratios, intervals over prompts.
#
# **What to know first.** Notebook 01: the lossless rule (any draft keeps the output exact), `E`,
# `c`, `v(K)` and the workbook's speedup estimator. Nothing about suffix trees or neural predictors is
# assumed; the predictor is a small multilayer perceptron fitted by gradient descent.
#
# **How long it takes.** With `RESULTS = "auto"` (the default) and the shipped parameters every step
# (the bare timings, the logged fit and evaluation runs, the end-to-end policy runs) is read from
# `data/results/`; only the payoff predictor is refitted (seconds) and the notebook draws everything
# in about a minute. `"recompute"` runs every step: about 55 minutes on 2 CPU cores (fit logs 10,
# evaluation logs 7, the policy runs of section 4 33: nine policies on 60 prompts, three rounds each;
# section 7's training-free drafters 11 more, plus tokenizing the standard library for REST's datastore the first time). Changing a parameter recomputes only the steps that use it; a run whose
# parameters differ from the shipped ones writes under `build/unpublished/02_cache_hybrid/…`.
# `"reuse"` never computes, and names the step and the parameters that differ when it cannot reuse.
# The table at the end of section 5 lists each step and how long it took when it was computed.

# %%
SMOKE = False  # True: tiny sizes, the whole notebook in under ~2 minutes on 2 CPU cores
SEED = 0
DEVICE = "auto"
TARGET = "agent-target"  # a shipped name, a local HF folder or a hub id (any causal LM of the support matrix)
DRAFT = "agent-draft"  # the model drafter: any causal LM with the target's tokenizer
# The agentic workloads are the shipped ones (speclib.research.workloads): their prompts are in the tool-call and
# edit formats agent-target was trained on. Another model decodes them as plain text in its own tokenizer.
WORKLOADS = ["agentic_edit", "agentic_tools", "agentic_plan", "structured", "code_humaneval", "code_stdlib"]
N_FIT = 10  # prompts per workload whose logs train the payoff predictor
N_EVAL = 10  # prompts per workload for the policy comparison (disjoint from the fit ones)
MAX_NEW_TOKENS = 160
K = 4  # model drafter length
MAX_SPEC = 16  # longest cache draft
LATENCY_REPEATS = 25
HEAD = "agent-target-head"  # section 6: a feature-level head trained for TARGET (python -m speclib train head TARGET)
HEAD_K = 4  # section 6: the head's chain length
RECYCLING_NODES = [
    1,
    2,
    3,
    5,
    7,
    11,
    15,
]  # section 7: Token Recycling tree sizes; the cost model picks one per workload
REST_NODES = 8  # section 7: REST's tree size (its datastore: the standard library's training split)
LOOKAHEAD_GRID = [
    [1, 3, 1],
    [2, 3, 2],
    [2, 4, 2],
    [3, 3, 3],
    [4, 3, 4],
]  # section 8: Lookahead (W, N, G) tried on the fit prompts
THREADS = 1  # torch threads (0: every CPU this process may use); 1 keeps T(n) smooth on 2 cores (notebook 05)
RESULTS = "auto"  # auto: reuse results saved with these parameters, else compute; "recompute"; "reuse"
PUBLISH = False  # True: a run with non-default parameters also replaces data/results and figures/

# %%
import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

import speclib
from speclib.research import data
from speclib.research.studies import cache_hybrid as ch
from speclib.workbook import results, verdicts
from speclib.workbook.plotting import savefig, style
from speclib.workbook.study import Study

if SMOKE:
    WORKLOADS, N_FIT, N_EVAL, MAX_NEW_TOKENS, LATENCY_REPEATS = ["agentic_edit", "code_humaneval"], 2, 2, 32, 3
    RECYCLING_NODES = [1, 3]
    LOOKAHEAD_GRID = [[1, 3, 1], [2, 3, 2]]
NB = "02_cache_hybrid"
style()
torch.manual_seed(SEED)
threads = speclib.core.device.set_threads(THREADS or None)
target, draft = speclib.load(TARGET, device=DEVICE), speclib.load(DRAFT, device=DEVICE)
dev = str(target.device)
meta = dict(seed=SEED, device=dev, target=TARGET, draft=DRAFT, threads=threads, smoke=SMOKE)
prompts = {}
for w in WORKLOADS:
    rows = data.load_workload(w, N_FIT + N_EVAL)
    ids = [target.encode(r["prompt"])[-(target.max_length - MAX_NEW_TOKENS - MAX_SPEC - 8) :] for r in rows]
    prompts[w] = {"fit": ids[:N_FIT], "eval": ids[N_FIT : N_FIT + N_EVAL]}
study = Study(
    NB, globals(), mode=RESULTS, publish=PUBLISH, always=dict(SMOKE=SMOKE), calibrate=target
)  # target T(1) before/after each step
PROMPTS = ["TARGET", "WORKLOADS", "N_FIT", "N_EVAL", "MAX_NEW_TOKENS", "MAX_SPEC"]  # the prompt sets and their lengths
task = ch.Task(target, draft, TARGET, prompts, WORKLOADS, K, MAX_SPEC, MAX_NEW_TOKENS, LATENCY_REPEATS, SEED, meta)
task.recycling_nodes, task.rest_nodes, task.lookahead_grid = RECYCLING_NODES, REST_NODES, LOOKAHEAD_GRID
print(
    {w: (len(p["fit"]), len(p["eval"])) for w, p in prompts.items()},
    f"device {dev}; results mode {RESULTS!r}: this run {study.where()}",
)

# %% [markdown]
# ## 1 · What a step costs
# HVD compares sources in tokens per second, so it needs the cost of a step verifying n tokens, T(n),
# and of one model-drafter token. A bare forward timed apart (`bench.latencies`, at the workloads'
# median prefix) is the usual estimate; HVD instead uses what the decoding loop itself paid on the
# fit prompts (section 2: target pass + acceptance + commit + drafter updates; the median per draft
# size where at least 20 steps of that size were seen, a straight line through those medians for the
# other sizes). Both are shown side by side in the first figure, once section 2 has the loop's logs.
#
# Why not the benchmark alone? A step is more than the target's forward: acceptance, the cache
# commit, the suffix tree's update and the draft model's catch-up all happen once per step, and on a
# CPU the matrix kernels for 2–4 rows are not always cheaper than for 5 or 8. A decision rule that
# divides expected tokens by cost is only as good as the cost it divides by, so it should use the
# costs the loop actually pays. The ratio c = (one draft-model token) / T(1) printed here is the
# drafter cost of [the analytic model](../docs/analytic_model.md): the smaller it is, the cheaper a
# model draft is next to a free cache draft.

# %%
bare = study.step("latency", task.latency, uses=PROMPTS + ["DRAFT", "LATENCY_REPEATS", "THREADS"])
task.lat = lat = bare.seconds.tolist()  # T(1..MAX_SPEC + 1) of the target, then one draft-model token
display(Markdown(ch.latency_prose(lat, task.prefix, MAX_SPEC)))

# %% [markdown]
# ## 2 · Logged verification outcomes, and the payoff predictor
# On the fit prompts we decode with each cache alone (every non-empty candidate is verified) and log
# each candidate's features — including how far it agrees with the other cache's candidate at the
# same step — with its accepted length; a model-only pass over the same prompts gives the model
# drafter's per-token acceptance, HVD's starting estimate for that side. The predictor is a tiny MLP
# (`PayoffPredictor`, one for both sources: the source is a feature) giving, for each draft position
# l, P(accepted ≥ l) — a discrete-time survival model — whose sum is the expected payoff; we score
# that expectation on logs of the evaluation prompts, which it never saw.
#
# What is logged, and why this way. A cache candidate's fate is only known after the target has
# verified it, so the training data has to come from decoding runs in which the candidate *was*
# verified: with the "cache" policy every non-empty candidate goes to the target, once with the suffix
# tree in front and once with prompt lookup in front, so both sources get outcomes. The features
# (`FEATURES`) are what is known before verifying: which source, the suffix tree's own score, the
# length of the context match the candidate was copied from, the candidate's length, the drafter's
# frequency probabilities (first, last, mean), the position in the output, whether the match came
# from the global tree (earlier outputs) or this request's, how far the other cache's candidate
# agrees with it, and how the source fared recently. Agreement matters: two independent sources
# proposing the same continuation is strong evidence that it is right. (Three more features, which
# tree source a candidate came from and its node count, are constant for these two chain sources and
# the predictor ignores them; section 8 uses them.)
#
# Why a distribution and not a single number: HVD does not only choose a source, it chooses how
# many tokens of the candidate to verify. Token l is worth its verification cost when
# P(accepted ≥ l) is high enough, whatever the mean, so the predictor gives one probability per
# position, and the expected payoff of verifying the first m tokens is the sum of the first m of them.


# %%
saved = study.step("fit", task.fit, uses=PROMPTS + ["DRAFT", "K", "THREADS"])
fit_logs = saved["fit_logs"]
fallback = task.use_fit(saved["fit_steps"])  # sets the model prior and HVD's costs from the loop's steps
print(f"model drafter per-token acceptance on the fit prompts: {task.model_prior:.3f}")
if fallback:  # too few draft sizes logged (a short smoke run, a pair whose caches rarely match)
    print(f"the loop's logs cannot give the costs ({fallback}); using the bare forward's instead")
cost_df = ch.cost_table(task)
results.save(cost_df, f"{NB}/costs")

# %% [markdown]
# ### What a verify step costs: benchmark vs the loop
# **Question.** Is a bare forward pass a good stand-in for what a decoding step costs, and does the
# cost grow with the number of tokens verified?
#
# **How to read it.** x: tokens verified in one step, n (the draft plus the bonus token); y:
# milliseconds. Circles: a bare target forward over n tokens, timed apart. Squares: the median
# verify time of the logged steps of that size in the decoding loop (target pass, acceptance,
# commit, drafter updates). Dashed: the table HVD divides by — the loop's medians where a size was
# seen often enough, a fitted line elsewhere. A flat curve means extra verified tokens are nearly
# free (the target is memory-bound, and long cache drafts are cheap to try); a steep one means every
# wrongly drafted token costs time, and HVD should verify shorter prefixes. The gap between squares
# and circles is the per-step overhead a benchmark does not see.

# %%
fig = ch.plot_costs(cost_df)
savefig(fig, f"{NB}_costs")
plt.show()
display(Markdown(ch.cost_prose(task)))
display(Markdown(ch.cost_reading(task, cost_df)))

# %% [markdown]
# ### Fitting the payoff predictor, and scoring it on unseen prompts
# The predictor is fitted on the fit prompts' logs only, then asked about every candidate logged on
# the evaluation prompts (the same workloads, other files). Two scores: Spearman's rank correlation
# between predicted and actual accepted length (does it *order* candidates right? — all a ranking
# rule needs) and the mean absolute error in tokens (is the expectation right in size? — what a
# tokens-per-second comparison with the model drafter needs). The baseline is the suffix tree's own
# score, the quantity ArcticInference's rule thresholds; it exists for suffix candidates only, so
# it is compared on that subset. A predictor that cannot beat it would not justify HVD's extra
# machinery.

# %%
task.predictor = predictor = ch.fit_predictor(fit_logs, SEED)
saved = study.step("eval", task.eval, uses=PROMPTS + ["DRAFT", "K", "THREADS"])
eval_logs = ch.scored_logs(saved["eval_logs"], meta, predictor)
task.eval_outputs = ch.outputs_of(saved["eval_outputs"])  # the oracle's hindsight in section 4
quality = ch.predictor_quality(eval_logs)
results.save(quality.assign(fit_rows=len(fit_logs), **meta), f"{NB}/predictor")
results.save(eval_logs.assign(**meta), f"{NB}/cache_logs")  # with this run's predictions
display(quality.round(3))

# %% [markdown]
# ### Is a cache draft's payoff predictable?
# **Question.** Before the target has seen a candidate, can we tell how many of its tokens it will
# accept — well enough to rank candidates, and to put a number on them in tokens?
#
# **How to read it.** Left, a calibration plot: the unseen candidates are sorted into ten equal-count
# groups by predicted accepted length; each dot is one group, x its mean prediction, y the mean
# accepted length the target actually gave it. Dots on the dotted diagonal mean the predictions are
# right on average at every level; dots below it mean over-promising (HVD would verify too many
# tokens), above it under-promising (HVD would pass up good candidates). Right: every candidate, its
# prediction against its real accepted length (both jittered a little so that identical values do
# not hide each other). A useful predictor puts the zeros at the left and the long acceptances at the
# right; horizontal bands are the integer accepted lengths.

# %%
cal = ch.calibration(eval_logs)
fig = ch.plot_predictor(eval_logs, cal, quality, SEED)
savefig(fig, f"{NB}_predictor")
plt.show()
display(Markdown(ch.quality_prose(quality, len(fit_logs))))
by_src = ch.by_source(eval_logs)
display(by_src.round(3))
display(Markdown(ch.calibration_reading(eval_logs, cal, quality, by_src)))

# %% [markdown]
# ## 3 · Where the cache pays
# Accepted length of the cache candidates by match length and position in the output, and how
# concentrated the payoff is: the share of all accepted cache tokens that comes from the best x% of
# candidates.
#
# **Question.** Is the payoff of cache drafts spread evenly — then a fixed rule such as "always
# copy" would do — or concentrated in a few situations that a predictor must find?
#
# **How to read it.** Left, a heat map over the unseen candidates: rows are the length of the
# context match the candidate was copied from (how many tokens just generated also occur earlier),
# columns the position in the output where it was proposed; the colour and the number in each cell
# are the mean accepted length, with the count of candidates below it (cells with few candidates are
# noisy). Bright rows mean that long matches predict long acceptances; a bright right edge would mean
# that the suffix tree's memory of the output so far helps as the output grows. Right, a
# concentration (Lorenz-type) curve: candidates sorted from best to worst by accepted length; the
# curve gives the share of all accepted cache tokens collected by the best x% of them. The dotted
# diagonal is an even spread; the further the curve bows above it, the more the payoff sits in a few
# candidates, and the more a good ranking is worth. Where the curve reaches 100%, the remaining
# candidates gained nothing at all.

# %%
payoff = ch.PayoffMap.of(eval_logs)
fig = payoff.plot()
savefig(fig, f"{NB}_payoff")
plt.show()
results.save(payoff.table().assign(**meta), f"{NB}/payoff_map")
display(Markdown(payoff.prose()))
display(Markdown(payoff.reading()))

# %% [markdown]
# ## 4 · Policies, per workload
# Greedy, `MAX_NEW_TOKENS` tokens per evaluation prompt, every policy with its own drafters (the
# suffix drafter's global tree grows over the workload's earlier outputs); target calls per generated
# token measure sequential work. Two ablations of HVD: verifying whole candidates (no choice of
# prefix length), and ranking the suffix tree's candidate alone (no prompt lookup candidate).
#
# The policies, from simplest to most informed:
#
# * **model** — the draft model every step (ordinary speculative decoding with K tokens);
# * **prompt lookup**, **suffix** — one cache drafter every step; when it has no candidate the step
#   verifies nothing but the bonus token, i.e. runs as plain AR;
# * **ArcticInference rule** — the suffix candidate if the tree's score is at least K, else the
#   model; **SAM rule** — the retrieval candidate if its match is at least 4 tokens long, else the
#   model. Both are fixed thresholds on one feature;
# * **HVD** and its two ablations — the expected-tokens-per-second comparison of section 2;
# * **oracle (hindsight)** — knows the AR output and picks the candidate the target will accept
#   furthest. It maximises accepted tokens per step, *not* tokens per second (it ignores what a
#   long verify pass or a model draft costs), so it is a reference, not a strict upper bound: a
#   cost-aware policy can beat it in wall clock.
#
# **How speed is measured**: the workbook's one estimator (`bench.paired_runs`, `bench.speedup_table`;
# defined in [the statistics notes](../docs/statistics.md) and notebook 01, section 4) runs AR and
# every policy back to back on each prompt in alternating (ABBA) order, and a policy's speedup is the
# median over prompts of its tokens per second over AR's on the same prompt, with a 95% bootstrap
# interval over prompts and the total-time ratio beside it.
#
# Why the same drafter object across a workload's prompts: the suffix drafter's global tree learns
# from every earlier output of the workload, as it would in a serving system that sees many similar
# requests; re-creating it per prompt would throw that memory away. Two consequences for the timed
# runs. The untimed warm-up run of each policy (once, before the first workload) uses throwaway
# drafters: warming up the timed drafter on a prompt would put that prompt's output into its global
# tree before the prompt is timed. And the oracle must know AR's output before it runs (in the
# alternating order it sometimes runs before AR on a prompt), so it reads the greedy output of
# section 2's logging runs on the same prompts — lossless greedy decoding reproduces AR's, which the
# timed AR runs check again. Every policy's output is compared with AR's token for token
# (`identical` in the table), the check that no policy changed the text.
#
# Caveats. Each workload has only `N_EVAL` evaluation prompts, so the intervals are wide and a
# ranking inside one workload is rarely conclusive; section 5 pools the three agentic workloads.
# Wall-clock times come from a CPU shared with other work; the calls-per-token column (sequential
# target passes per generated token) is the machine-independent part of the story.


# %%
timed = study.step("policies", task.policy_runs, uses=PROMPTS + ["DRAFT", "K", "THREADS", "SEED"])
runs, hindsight_is_ar = timed["runs"], timed["hindsight"].hindsight_is_ar.tolist()
speed = ch.speed_table(runs, WORKLOADS, SEED)
results.save(speed.assign(**meta), f"{NB}/speedup")
display(speed.pivot(index="policy", columns="workload", values="speedup").round(2))

# %% [markdown]
# ### Speedup of every policy on every workload
# **Question.** On which workloads does copying from the context pay at all, and does choosing the
# source per step (HVD) beat committing to one source or to a fixed threshold rule?
#
# **How to read it.** One group of bars per workload, one bar per policy in the same colour
# everywhere (HVD with a black edge); bar height is the median per-prompt speedup over AR, the
# whisker its 95% bootstrap interval; the black line at 1 is AR's speed. A bar whose whisker lies
# wholly above 1 is reliably faster than AR, wholly below 1 reliably slower. Compare bars within a
# group, not across groups: the workloads differ in how much of the output can be copied (the
# agentic ones most, plain code completion least), and that sets the height of the whole group.
# Overlapping whiskers between two bars mean the data cannot tell them apart on that workload.

# %%
fig = ch.plot_speedup(speed, list(task.policies([])), WORKLOADS)
savefig(fig, f"{NB}_speedup")
plt.show()
display(Markdown(ch.speed_reading(speed, WORKLOADS, N_EVAL, hindsight_is_ar)))

# %% [markdown]
# ## 5 · HVD against the single sources and the rules, and what drafting costs
# The per-workload bars leave the main question open because `N_EVAL` prompts per workload give wide
# intervals. Here the three agentic workloads (the use case HVD was designed for) are pooled — each
# (workload, prompt) one prompt of the pooled set — and HVD is compared, paired per prompt, with every
# other policy: the three single sources, the ArcticInference rule (the strongest published rule in
# this family) and the SAM rule. The table also names the best single source *in hindsight* on these
# same prompts and gives every policy's paired ratio to it; choosing it on the reported prompts
# favours it (its own median is the highest of three noisy medians, biased upward), so a comparison
# against it is conservative for HVD, and the paired ratios against each single source need no
# choice at all.
#
# **Paired per prompt**: the same estimator as above with another policy in AR's place
# (`bench.speedup(runs, "HVD (ours)", reference=other)`; [the statistics notes](../docs/statistics.md)),
# i.e. the median over prompts of HVD's tokens per second over the other policy's on the same prompt
# (above 1: HVD faster), with a bootstrap interval over prompts and the total-time ratio beside it.
# Pairing removes the prompt-to-prompt variation in length and difficulty, which is much larger than
# the difference between two good policies; a median of ratios and a ratio of totals can disagree
# when a few long prompts dominate the total.
#
# **What drafting costs.** The last table gives the drafting time per drafted token inside each
# policy's runs, and each cache drafter timed alone over 64 steps of one prompt: a cache draft is
# "free" only if this is small next to a verify step.

# %%
agentic = task.agentic
agentic_runs = ch.pooled_prompts(runs, agentic)  # one prompt id per (workload, prompt)
pooled = ch.pooled_table(agentic_runs, SEED)
drafting = ch.drafting_table(runs, timed["drafting_alone"])
results.save(drafting.assign(**meta), f"{NB}/drafting_cost")
results.save(pooled.reset_index().assign(n_prompts=agentic_runs.prompt.nunique(), **meta), f"{NB}/agentic_pooled")
display(pooled[ch.POOLED_COLUMNS].round(3))
display(drafting.round(4))
display(Markdown(ch.pooled_prose(pooled, agentic_runs, runs)))

# %%
display(Markdown(ch.drafting_reading(drafting, task.costs)))

# %% [markdown]
# ## 6 · A feature-level head as the model drafter
# The source study compares payoff-guided selection with an EAGLE-style draft head, the drafter most
# serving stacks would reach for first. Here `HEAD`, a one-layer head trained on `TARGET`'s own hidden
# features (`python -m speclib train head TARGET`; [docs/feature_drafting.md](../docs/feature_drafting.md)),
# takes two roles: a **policy of its own** (the head drafts a chain of `HEAD_K` tokens at every step)
# and **HVD's model drafter** in place of the separate draft (the cache candidates, the payoff predictor
# and the decision rule are unchanged). HVD needs the head's per-token acceptance and its cost per
# drafted token, so both are measured the way section 2 measured them for the separate draft: on the
# fit prompts, with the loop's own step logs.
#
# **What is compared.** Per agentic workload, back to back on the same evaluation prompts: AR, the head
# alone, HVD with the separate draft (section 4's policy, re-run here so that every ratio is paired
# within one block of runs) and HVD with the head. The question is the seed's claim: **is HVD faster
# than the feature head alone on every agentic workload?** It is answered with the paired ratio
# (median over prompts of HVD's speed over the head's on the same prompt, 95% bootstrap CI), per
# workload and pooled. AR runs on a copy of the target that records no features.
#
# **Reading the figure.** Left: speedup over AR per workload and pooled (95% CI) for the three
# drafters. Right: the paired ratio of HVD-with-head over the head alone; the line at 1 is parity, and
# an interval entirely above it means HVD is reliably faster on that workload.

# %%
task.head, task.head_k = speclib.load_head(HEAD), HEAD_K
task.target_f = speclib.load(TARGET, device=DEVICE)  # the head's target records features; AR's does not
saved = study.step(
    "head_policies", task.head_policy_runs, uses=PROMPTS + ["DRAFT", "K", "THREADS", "SEED", "HEAD", "HEAD_K"]
)
hr, hinfo = saved["head_runs"], saved["head_info"].iloc[0]
sets = ch.head_sets(hr, agentic)  # each agentic workload, then the three pooled
names = [w for w, _ in sets]
head_table = ch.head_table(sets, SEED)
results.save(head_table.assign(**meta), f"{NB}/head_policies")
display(head_table.pivot(index="method", columns="workload", values="speedup").round(2))
fig = ch.plot_head(head_table, names)
savefig(fig, f"{NB}_head")
plt.show()
display(Markdown(ch.head_prose(head_table, hr, hinfo, names, agentic)))

# %% [markdown]
# ### One configuration, two runs
# HVD with the separate draft runs twice in this notebook, with the same drafters and predictor on the same
# prompts: in section 4's `policies` step (the number sections 4 and 5 report) and again in this section's
# `head_policies` step, so that every ratio here is paired within one block of runs. The two measurements
# differ by run-to-run noise (the machine's state, what ran before), and by nothing else the notebook
# controls: the table sets them side by side, each with its own 95% interval over prompts.

# %%
hvd_w = ch.by_workload(speed, "HVD (ours)", WORKLOADS)
twice = ch.twice_table(hvd_w, pooled.loc["HVD (ours)"], head_table, agentic)  # section 5's pooled row
display(twice.round(3))
display(Markdown(ch.twice_prose(twice)))

# %% [markdown]
# ## 7 · Two more training-free drafters: Token Recycling and REST
# Prompt lookup and the suffix tree copy from the request and from earlier outputs. Two drafters the
# Spec-Bench leaderboard ranks take their guesses elsewhere ([training-free drafting](../docs/training_free.md)):
#
# * **Token Recycling** keeps the target's own top-8 candidates after every verified token (a 4,096 × 8
#   matrix here) and grows a draft tree from them. One drafter per workload, its matrix first filled on
#   the workload's fit prompts (which also measure how often the target takes each candidate rank); its
#   tree size is the one the cost model of section 1 predicts fastest:
#   (1 + expected accepted) × T(1) / T(n + 1).
# * **REST** looks up the context's longest suffix (up to 8 tokens) in a suffix array over a datastore and
#   drafts a tree of the `REST_NODES` most frequent continuations. The datastore is the standard library's
#   training split, the text the models were trained on (the workloads' prompts are held-out files and
#   task descriptions).
#
# Both run back to back with AR and prompt lookup (section 4's best single source on the agentic
# workloads) on the evaluation prompts; the agentic workloads are pooled as in section 5.


# %%
tf = study.step(
    "training_free",
    task.training_free_runs,
    uses=PROMPTS + ["RECYCLING_NODES", "REST_NODES", "LATENCY_REPEATS", "THREADS"],
)
tf_runs = tf["tf_runs"]
tf_speed = ch.training_free_table(tf_runs, WORKLOADS, agentic, SEED)
results.save(tf_speed.assign(**meta), f"{NB}/training_free")
display(tf_speed.pivot(index="method", columns="workload", values="speedup").round(2))
display(tf_speed.pivot(index="method", columns="workload", values="tokens_per_call").round(2))
over_lookup = ch.recycling_over_lookup(tf_runs, WORKLOADS, SEED)
display(Markdown("Token Recycling over prompt lookup, paired per prompt (median ratio of tokens per second, 95% CI):"))
display(over_lookup[["workload", "speedup", "lo", "hi"]].round(2))
task.chosen_nodes = tf_runs.groupby("workload").recycling_nodes.first()  # section 8's tree sizes
display(Markdown(ch.training_free_prose(tf, tf_speed, over_lookup)))
assert tf_runs[tf_runs.method != "AR"].same_as_reference.all(), "a training-free drafter changed the greedy output"

# %% [markdown]
# ## 8 · Lookahead, and HVD choosing among every source
# Two more questions on the agentic workloads, with every source of this notebook side by side:
#
# * **Lookahead decoding** ([training-free drafting](../docs/training_free.md)) makes its own guesses: W
#   diagonals of N − 1 guessed tokens ride along in every verify pass, each pass moves every diagonal one
#   Jacobi iteration forward, and the n-grams they leave behind are verified as G candidates at later steps.
#   Everything rides in the verify pass, so its cost is the pass's width: (W + G)(N − 1) nodes. (W, N, G)
#   is chosen per workload on the fit prompts from `LOOKAHEAD_GRID` by the cost model: the measured tokens
#   per call × T(1) / T(mean nodes + 1), with T from section 1.
# * **HVD over every source.** Prompt lookup, the suffix tree, Token Recycling (section 7's tree size, its
#   matrix and rank template from the fit prompts) and REST (section 7's datastore) are all cache
#   candidates at every step, and the model drafter the alternative. A new payoff predictor is fitted,
#   as in section 2, on logs where each source was verified in front once over the fit prompts; its
#   features now say which source a candidate came from and how many nodes it has. A tree is verified
#   whole: n nodes cost T(n + 1) and pay their expected accepted depth.
#
# Every method runs back to back with AR on the evaluation prompts; ratios are paired per prompt and
# pooled over the agentic workloads as in section 5. The goal set for HVD: at least 1.15x the best
# single source, paired per prompt.


# %%
es = study.step(
    "every_source",
    task.every_source_runs,
    uses=PROMPTS + ["DRAFT", "K", "RECYCLING_NODES", "REST_NODES", "LOOKAHEAD_GRID", "LATENCY_REPEATS", "THREADS"],
)
es_runs = es["es_runs"]
assert es_runs[es_runs.method != "AR"].same_as_reference.all(), "a drafter changed the greedy output"
es_speed, over, best_single = ch.every_source_tables(es_runs, SEED)
results.save(es_speed.reset_index().assign(**meta), f"{NB}/every_source")
results.save(over.reset_index().assign(**meta), f"{NB}/every_source_over")
display(es_speed[["speedup", "lo", "hi", "total_ratio", "tokens_per_call", "identical", "runs"]].round(2))
display(
    Markdown(
        "HVD over every source against each other method, paired per prompt (median ratio of tokens per "
        "second, 95% CI; above 1: HVD faster):"
    )
)
display(over[["speedup", "lo", "hi", "total_ratio"]].round(2))
fig = ch.plot_every_source(es_speed, es["es_choice"])
savefig(fig, f"{NB}_every_source")
plt.show()
goal = verdicts.goal(over.loc[best_single], 1.15)
display(Markdown(ch.every_source_prose(es, es_speed, over, best_single, goal)))

# %% [markdown]
# ### This run's steps
# Each expensive step, whether this run computed it or read it from saved results (and from which
# commit), and how long it took when it was computed.

# %%
display(study.summary())

# %% [markdown]
# ## What to take away
#
# * **Cache drafts are a lottery; the question is whether the odds are predictable.** Many
#   candidates gain nothing and a few gain a whole draft (section 3); no single feature separates
#   them, so a small model over a dozen features is asked to rank them and to give expected payoffs
#   in tokens, and section 2 checks both on prompts it never saw (rank correlation, calibration).
# * **The currency is tokens per second of measured cost.** The same expected payoff is worth
#   verifying or not depending on what a step of that size costs on this machine (section 1). On a
#   memory-bound target extra verified tokens are nearly free and long cache drafts should be tried;
#   on a compute-bound one the predictor's per-position probabilities decide where to cut.
# * **Choosing per step beats choosing per workload** when the best source changes from workload to
#   workload and from step to step — compare the per-workload winners in section 4 with HVD's
#   pooled, paired ratios in section 5.
# * **The target's own scores are a cache too.** Token Recycling (section 7) drafts from the candidates the
#   target ranked after each token earlier, text that neither the prompt nor earlier outputs contain;
#   compare its tokens per call and speedup with prompt lookup's per workload, and with REST's, whose
#   datastore is the text the models were trained on.
# * **A new source helps only as far as the predictor can tell when it pays.** Section 8 adds Token
#   Recycling and REST to HVD's choice; compare HVD over every source with HVD over two sources (paired
#   per prompt), and each source's predicted against accepted tokens, and Lookahead's tokens per call with
#   the width of the pass it pays for them on this CPU.
# * **Nothing here changes the output**: every policy's text equals AR's, checked token for token.
#
# Caveats: one seed, `N_EVAL` prompts per workload, greedy decoding only (with sampling a cache draft
# is still a point mass and the same rule applies, but acceptance falls), small models on a CPU where
# the cost curve is flatter and noisier than on an accelerator, and a predictor fitted per model
# pair and machine (its cost table must be re-measured when either changes).


# %% [markdown]
# ## Exercises
#
# Run from the repository root. A run with changed parameters writes under
# `build/unpublished/02_cache_hybrid/<hash>/` and recomputes only the steps that use the changed
# parameters. Predict before running.
#
# 1. **Longer cache drafts.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/02_cache_hybrid.ipynb build/02_spec.ipynb -p MAX_SPEC 32
#    ```
#
#    *Look for:* the cost curve of section 1 reaching further, the payoff map's long-match cells, and
#    whether the cache-only policies and HVD gain or lose. *Why:* a longer candidate can commit more
#    tokens in one pass, but every drafted token past the first rejection is verified for nothing; on a
#    machine where T(n) grows with n the right length is a prefix, which is what HVD's cut chooses.
#
# 2. **A longer model draft.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/02_cache_hybrid.ipynb build/02_k.ipynb -p K 6
#    ```
#
#    *Look for:* the model policy's speedup and how often HVD now picks the model drafter (the
#    `cache_share` column). *Why:* the model side's expected tokens per second changes with K through
#    `E` and `K·c`, and HVD compares the two sources on that scale at every step.
#
# 3. **One agentic and one code workload.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/02_cache_hybrid.ipynb build/02_two.ipynb -p WORKLOADS '["agentic_edit", "code_stdlib"]'
#    ```
#
#    *Look for:* cache drafts paying far more on the edit workload than on new code, and HVD's cache
#    share differing between the two; the steps are recomputed on the two workloads alone. *Why:* an edit copies
#    most of a file it has just read, while new code copies little of its prompt; a predictor that sees
#    the difference buys cache drafts only where the odds are good.
#
# 4. **Fewer fit prompts.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/02_cache_hybrid.ipynb build/02_fit.ipynb -p N_FIT 3
#    ```
#
#    *Look for:* the predictor's Spearman correlation and calibration on the unseen prompts, and
#    whether HVD's advantage over the best single source survives. *Why:* with fewer logged outcomes
#    the predictor's expected payoffs are noisier, and a per-step rule is only as good as its estimates.
# 5. **A smaller REST tree.** `-p REST_NODES 2`. *Look for:* REST's tokens per call and speedup in section 7
#    against the 8-node tree. *Why:* REST finds a match at almost every step but the target rarely accepts
#    what the standard library would continue with; each unaccepted node still costs a row of the verify pass.
