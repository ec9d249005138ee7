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

from functools import partial

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown, display
from scipy.stats import spearmanr
from tqdm.auto import tqdm

import speclib
from speclib import (
    HybridDrafter,
    Lookahead,
    ModelDrafter,
    PromptLookupDrafter,
    Sampling,
    SuffixDrafter,
    generate,
)
from speclib.core.device import clock
from speclib.drafters import rest
from speclib.drafters.hybrid import FEATURES, Costs, PayoffPredictor, feature_matrix
from speclib.drafters.recycling import expected_accepted, recycling_template
from speclib.research import bench, data, datastore
from speclib.research import hvd as hvd_plumbing
from speclib.workbook import results, verdicts
from speclib.workbook.plotting import savefig, style
from speclib.workbook.study import Study

if SMOKE:
    WORKLOADS, N_FIT, N_EVAL, MAX_NEW_TOKENS, LATENCY_REPEATS = ["agentic_edit", "code_humaneval"], 2, 2, 32, 3
    RECYCLING_NODES = [1, 3]
    LOOKAHEAD_GRID = [[1, 3, 1], [2, 3, 2]]
NB = "02_cache_hybrid"
GREEDY = Sampling(0.0)
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
ns = list(range(1, MAX_SPEC + 2))
prefix = int(np.median([len(x) for p in prompts.values() for x in p["eval"]]))
bare = study.step(
    "latency",
    lambda: pd.DataFrame(
        dict(
            n=ns + [1],
            model=["target"] * len(ns) + ["draft"],
            prefix_len=prefix,
            seconds=bench.latencies(
                [(target, n) for n in ns] + [(draft, 1)], prefix_len=prefix, repeats=LATENCY_REPEATS
            ),
        )
    ).assign(**meta),
    uses=PROMPTS + ["DRAFT", "LATENCY_REPEATS", "THREADS"],
)
lat = bare.seconds.tolist()  # T(1..MAX_SPEC + 1) of the target, then one draft-model token
display(
    Markdown(
        f"Bare forward at a {prefix}-token prefix: T(1) = {lat[0] * 1e3:.1f} ms, T({MAX_SPEC + 1}) = {lat[-2] * 1e3:.1f} ms "
        f"({lat[-2] / lat[0]:.2f}x); one draft-model token {lat[-1] * 1e3:.2f} ms (c = {lat[-1] / lat[0]:.3f})."
    )
)

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
def caches(first="suffix"):
    """Both cache drafters, `first` in front (the "cache" policy verifies the first one's candidate)."""
    pair = [SuffixDrafter(max_spec=MAX_SPEC), PromptLookupDrafter(3, MAX_SPEC)]
    return pair if first == "suffix" else pair[::-1]


def cache_logs(split):
    """Every non-empty candidate's features and accepted length, the loop's timed steps, and each
    prompt's greedy output (lossless greedy decoding reproduces AR's: the oracle's hindsight in section 4)."""
    rows, steps, outputs = [], [], {}
    for w in WORKLOADS:
        for first in ("suffix", "prompt lookup"):
            d = HybridDrafter(caches(first), ModelDrafter(draft, K), "cache")
            for pi, ids in enumerate(prompts[w][split]):
                g = generate(target, ids, MAX_NEW_TOKENS, drafter=d, sampling=GREEDY)
                steps += g.stats.steps
                outputs.setdefault((w, pi), g.tokens)
                rows += [dict(workload=w, prompt=pi, **s) for s in d.log if s["drafted"] > 0]
    return pd.DataFrame(rows), steps, outputs


def fit_logs_and_steps():
    fit_logs, fit_cache_steps, _ = cache_logs("fit")
    # the model drafter's per-token acceptance on the same fit prompts: HVD's prior for the model side
    fit_steps = []
    for w in WORKLOADS:
        for ids in prompts[w]["fit"]:
            fit_steps += generate(
                target, ids, MAX_NEW_TOKENS, drafter=ModelDrafter(draft, K), sampling=GREEDY
            ).stats.steps
    steps = pd.DataFrame(fit_cache_steps + fit_steps).assign(
        drafter=["cache"] * len(fit_cache_steps) + ["model"] * len(fit_steps)
    )
    return {"fit_logs": fit_logs.assign(**meta), "fit_steps": steps.assign(**meta)}


saved = study.step("fit", fit_logs_and_steps, uses=PROMPTS + ["DRAFT", "K", "THREADS"])
fit_logs = saved["fit_logs"]
step_records = saved["fit_steps"].drop(columns=list(meta) + ["git_sha"]).to_dict("records")
fit_cache_steps = [r for r in step_records if r["drafter"] == "cache"]
fit_steps = [r for r in step_records if r["drafter"] == "model"]
model_prior = bench.token_acceptance(fit_steps)
print(f"model drafter per-token acceptance on the fit prompts: {model_prior:.3f}")
try:
    costs = Costs.from_steps(fit_cache_steps + fit_steps)
except ValueError as exc:  # too few draft sizes logged (a short smoke run, a pair whose caches rarely match)
    print(f"the loop's logs cannot give the costs ({exc}); using the bare forward's instead")
    costs = Costs.fitted(ns, lat[:-1], lat[-1])
loop_t = pd.DataFrame(fit_cache_steps + fit_steps).query("drafted > 0").groupby("drafted").verify_s.median()
cost_df = pd.DataFrame(
    dict(
        n=ns,
        bench_verify_s=lat[:-1],
        loop_median_verify_s=[loop_t.get(n - 1, np.nan) for n in ns],
        fitted_s=[costs.verify(n) for n in ns],
    )
).assign(
    bench_model_token_s=lat[-1], model_token_s=costs.model_token_s, cache_s=costs.cache_s, prefix_len=prefix, **meta
)
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
fig, ax = plt.subplots(figsize=(6, 3.8))
ax.plot(cost_df.n, cost_df.bench_verify_s * 1e3, "o-", label="bare forward (benchmark)")
ax.plot(cost_df.n, cost_df.loop_median_verify_s * 1e3, "s-", label="in the loop (median step)")
ax.plot(cost_df.n, cost_df.fitted_s * 1e3, "k--", lw=1, label="HVD's cost table (medians, line where sparse)")
ax.set(xlabel="tokens verified n", ylabel="ms per step", title="Cost of a verify step")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.18), ncol=2, frameon=False)
savefig(fig, f"{NB}_costs")
plt.show()
display(
    Markdown(
        f"In the loop a step verifying n tokens costs {costs.verify(2) * 1e3:.1f} ms at n = 2 and {costs.verify(MAX_SPEC + 1) * 1e3:.1f} ms "
        f"at n = {MAX_SPEC + 1} ({(costs.verify(MAX_SPEC + 1) - costs.verify(2)) / (MAX_SPEC - 1) * 1e3:.2f} ms per extra token; the bare forward: "
        f"{(lat[-2] - lat[1]) / (MAX_SPEC - 1) * 1e3:.2f}); a model-drafter token {costs.model_token_s * 1e3:.2f} ms with its catch-up "
        f"(bare: {lat[-1] * 1e3:.2f}); both cache drafters together {costs.cache_s * 1e3:.2f} ms per step."
    )
)
step_sizes = pd.DataFrame(fit_cache_steps + fit_steps).query("drafted > 0").groupby("drafted").size()
gap = (cost_df.loop_median_verify_s / cost_df.bench_verify_s).dropna()
display(
    Markdown(
        f"**Reading.** Where both were measured, a step in the loop costs {gap.min():.2f}–{gap.max():.2f}x the bare forward "
        f"of the same size (median {gap.median():.2f}x): that is the per-step overhead a benchmark leaves out, and it is "
        f"paid once per step whatever the source, which is one more reason to make each step commit many tokens. "
        f"Going from n = 2 to n = {MAX_SPEC + 1} costs {costs.verify(MAX_SPEC + 1) / costs.verify(2):.2f}x, so on this machine "
        f"the length of a cache draft is {'cheap' if costs.verify(MAX_SPEC + 1) < 1.5 * costs.verify(2) else 'not cheap'} "
        f"next to the step itself, while one model-drafter token costs "
        f"{costs.model_token_s / costs.verify(1):.2f} of a one-token step. The loop's curve is not smooth in n; "
        f"{int((step_sizes >= 20).sum())} of the {len(step_sizes)} draft sizes seen were logged at least 20 times and keep "
        f"their own median, the rest come from the line. Single timings on a shared machine are noisy, so read the "
        f"overall level and slope, not the zigzag."
    )
)

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
predictor = PayoffPredictor(seed=SEED).fit(feature_matrix(fit_logs), fit_logs.accepted.to_numpy())


def eval_logs_and_outputs():
    eval_logs, _, outputs = cache_logs("eval")
    out = pd.DataFrame([dict(workload=w, prompt=i, tokens=t) for (w, i), t in outputs.items()])
    return {"eval_logs": eval_logs.assign(**meta), "eval_outputs": out.assign(**meta)}


saved = study.step("eval", eval_logs_and_outputs, uses=PROMPTS + ["DRAFT", "K", "THREADS"])
eval_logs = saved["eval_logs"].drop(columns=list(meta) + ["git_sha"])
eval_outputs = {(r.workload, r.prompt): [int(t) for t in r.tokens] for r in saved["eval_outputs"].itertuples()}
eval_logs["predicted"] = predictor.predict(feature_matrix(eval_logs))
rho = spearmanr(eval_logs.predicted, eval_logs.accepted).statistic
mae = float((eval_logs.predicted - eval_logs.accepted).abs().mean())
sfx = eval_logs[eval_logs.cache_source == "suffix"]
mae_score = float((sfx.score.clip(upper=sfx.draft_len) - sfx.accepted).abs().mean())
rho_score = spearmanr(sfx.score, sfx.accepted).statistic
quality = pd.DataFrame(
    [
        dict(estimator="payoff predictor (MLP), both sources", spearman=rho, mae=mae, n=len(eval_logs)),
        dict(
            estimator="payoff predictor (MLP), suffix candidates",
            spearman=spearmanr(sfx.predicted, sfx.accepted).statistic,
            mae=float((sfx.predicted - sfx.accepted).abs().mean()),
            n=len(sfx),
        ),
        dict(
            estimator="suffix score (SuffixDecoding), suffix candidates", spearman=rho_score, mae=mae_score, n=len(sfx)
        ),
    ]
)
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
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
bins = np.unique(np.quantile(eval_logs.predicted, np.linspace(0, 1, 11)))
eval_logs["bin"] = pd.cut(eval_logs.predicted, bins, include_lowest=True)
cal = eval_logs.groupby("bin", observed=True).agg(
    pred=("predicted", "mean"), actual=("accepted", "mean"), n=("accepted", "size")
)
axes[0].plot(cal.pred, cal.actual, "o-", label="payoff predictor")
m = float(max(cal.pred.max(), cal.actual.max(), 1))
axes[0].plot([0, m], [0, m], "k:", lw=1, label="perfect calibration")
axes[0].set(
    xlabel="predicted accepted length (decile mean)",
    ylabel="actual accepted length",
    title="Calibration on unseen prompts",
)
axes[0].legend(fontsize=8)
jit = np.random.default_rng(SEED)
axes[1].scatter(
    eval_logs.predicted + jit.normal(0, 0.08, len(eval_logs)),
    eval_logs.accepted + jit.uniform(-0.2, 0.2, len(eval_logs)),
    s=6,
    alpha=0.3,
)
axes[1].set(
    xlabel="predicted accepted length (jittered)",
    ylabel="accepted length (jittered)",
    title=f"Spearman {rho:.2f}, MAE {mae:.2f} tokens",
)
axes[1].yaxis.set_major_locator(plt.MaxNLocator(integer=True))
savefig(fig, f"{NB}_predictor")
plt.show()
display(
    Markdown(
        f"Fitted on {len(fit_logs)} logged cache verifications, scored on {len(eval_logs)} unseen ones: Spearman "
        f"**{rho:.2f}**, MAE **{mae:.2f}** tokens (on the suffix candidates alone, the suffix tree's own score: Spearman "
        f"{rho_score:.2f}, MAE {mae_score:.2f})."
    )
)
cal_err = cal.actual - cal.pred
worst = cal_err.abs().idxmax()
rho_pred_sfx, mae_pred_sfx = quality.spearman.iloc[1], quality.mae.iloc[1]
by_src = eval_logs.groupby("cache_source").agg(
    candidates=("accepted", "size"),
    mean_accepted=("accepted", "mean"),
    mean_predicted=("predicted", "mean"),
    share_zero=("accepted", lambda a: float((a == 0).mean())),
)
by_src["spearman"] = [
    spearmanr(g.predicted, g.accepted).statistic if len(g) > 2 else np.nan for _, g in eval_logs.groupby("cache_source")
]
display(by_src.round(3))
display(
    Markdown(
        f"**Reading.** From the lowest-predicted group to the highest, the mean accepted length goes from "
        f"{cal.actual.iloc[0]:.2f} to {cal.actual.iloc[-1]:.2f} tokens (predicted {cal.pred.iloc[0]:.2f} and "
        f"{cal.pred.iloc[-1]:.2f}). Calibration is off by at most "
        f"{abs(cal_err[worst]):.2f} tokens in any group ({'over' if cal_err[worst] < 0 else 'under'}-promising, at a mean "
        f"prediction of {cal.pred[worst]:.2f}), "
        + (
            "so HVD can use the numbers as tokens, not just as a ranking. "
            if abs(cal_err[worst]) < 1
            else "so the numbers are better read as a ranking than as tokens. "
        )
        + f"On suffix candidates, where both exist, the predictor ranks "
        f"{'better' if rho_pred_sfx > rho_score else 'no better'} than the suffix tree's own score (Spearman "
        f"{rho_pred_sfx:.2f} vs {rho_score:.2f}) and is {'closer' if mae_pred_sfx < mae_score else 'not closer'} in size "
        f"(MAE {mae_pred_sfx:.2f} vs {mae_score:.2f} tokens). By source: "
        + "; ".join(
            f"{s} candidates accepted for {r.mean_accepted:.2f} tokens on average (predicted {r.mean_predicted:.2f}), "
            f"{r.share_zero:.0%} of them for none"
            for s, r in by_src.iterrows()
        )
        + f". The right panel shows what the averages hide: for any "
        f"prediction, the real outcome is spread from zero to the whole draft ({(eval_logs.accepted == 0).mean():.0%} of "
        f"all candidates gain nothing). A single candidate's payoff is a gamble; only its *distribution* is "
        f"predictable — which is why HVD works with expected tokens per second rather than a yes/no rule."
    )
)

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
ev = eval_logs.copy()
ev["match"] = pd.cut(ev.match_len, [0, 1, 2, 4, 8, 16, 64], right=True)
ev["pos"] = pd.cut(ev.position, [-1, 16, 32, 64, 128, 1024])
heat = ev.pivot_table(index="match", columns="pos", values="accepted", aggfunc="mean", observed=True)
shares = np.sort(ev.accepted.to_numpy())[::-1].cumsum() / max(1, ev.accepted.sum())
frac = np.arange(1, len(shares) + 1) / len(shares)
fig, axes = plt.subplots(1, 2, figsize=(12, 4), layout="constrained")
counts = ev.pivot_table(index="match", columns="pos", values="accepted", aggfunc="size", observed=True).reindex_like(
    heat
)


def span(iv):
    return f"{int(iv.left) + 1}" if int(iv.left) + 1 == int(iv.right) else f"{max(0, int(iv.left) + 1)}–{int(iv.right)}"


im = axes[0].imshow(heat.to_numpy(dtype=float), aspect="auto", origin="lower", cmap="viridis")
for (r_, c_), val in np.ndenumerate(heat.to_numpy(dtype=float)):
    if np.isfinite(val):
        axes[0].text(
            c_,
            r_,
            f"{val:.1f}\nn={int(counts.iat[r_, c_])}",
            ha="center",
            va="center",
            fontsize=7,
            color="k" if val > 0.6 * np.nanmax(heat.to_numpy(dtype=float)) else "w",
        )
axes[0].set_xticks(range(heat.shape[1]), [span(c) for c in heat.columns], fontsize=8)
axes[0].set_yticks(range(heat.shape[0]), [span(i) for i in heat.index], fontsize=8)
axes[0].grid(False)
axes[0].set(
    xlabel="position in the output (tokens)",
    ylabel="match length (tokens)",
    title="Mean accepted length of cache drafts",
)
fig.colorbar(im, ax=axes[0], label="mean accepted length")
axes[1].plot(np.r_[0, frac] * 100, np.r_[0, shares] * 100)
axes[1].plot([0, 100], [0, 100], "k:", lw=1)
axes[1].set(xlabel="best x% of cache candidates", ylabel="% of accepted cache tokens", title="Payoff concentration")
savefig(fig, f"{NB}_payoff")
plt.show()
top20 = float(np.interp(0.2, frac, shares))
payoff = heat.stack().rename("mean_accepted").reset_index().astype({"match": str, "pos": str})
results.save(payoff.assign(**meta), f"{NB}/payoff_map")
zero = float((ev.accepted == 0).mean())
long_m, short_m = ev[ev.match_len >= 8].accepted.mean(), ev[ev.match_len <= 2].accepted.mean()
display(
    Markdown(
        f"{zero:.0%} of cache candidates gain nothing; the best 20% carry **{top20:.0%}** of all accepted cache tokens. "
        f"{'Long matches pay' if long_m > short_m else 'Long matches do not pay more here'}: mean accepted length "
        f"{long_m:.2f} at match length ≥ 8 vs {short_m:.2f} at ≤ 2."
    )
)
cells = heat.stack().dropna()
cells = cells[counts.stack().reindex(cells.index).fillna(0) >= 20] if (counts.stack() >= 20).any() else cells
best_cell, worst_cell = cells.idxmax(), cells.idxmin()
display(
    Markdown(
        f"**Reading.** All accepted cache tokens come from the {1 - zero:.0%} of candidates that gained anything, "
        f"and the best 20% alone carry {top20:.0%} of them (an even spread would give 20%). Among cells with at least 20 candidates (all cells if none has), the best is match "
        f"length {span(best_cell[0])} at output positions {span(best_cell[1])} ({cells[best_cell]:.2f} tokens on "
        f"average), the worst match length {span(worst_cell[0])} at positions {span(worst_cell[1])} "
        f"({cells[worst_cell]:.2f}). Match length alone is a coarse signal — it is one of the predictor's "
        f"{len(FEATURES) - 3} features that vary between the two chain sources, and the suffix tree's score adds how often the continuation was seen — but the map makes "
        f"the point of section 2 concrete: most cache candidates are worth verifying only as a short prefix or not at "
        f"all, and a few are accepted for up to {int(ev.accepted.max())} tokens. A policy that must pick one source for every step "
        f"pays for the bad ones; one that ranks candidates per step keeps the good ones."
    )
)

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
def policies(ar_tokens):
    def suffix():
        return SuffixDrafter(max_spec=MAX_SPEC)

    return {
        "model": lambda: HybridDrafter(suffix(), ModelDrafter(draft, K), "model"),
        "prompt lookup": lambda: HybridDrafter(PromptLookupDrafter(3, MAX_SPEC), ModelDrafter(draft, K), "cache"),
        "suffix": lambda: HybridDrafter(suffix(), ModelDrafter(draft, K), "cache"),
        "ArcticInference rule": lambda: HybridDrafter(suffix(), ModelDrafter(draft, K), "arctic"),
        "SAM rule": lambda: HybridDrafter(suffix(), ModelDrafter(draft, K), "sam"),
        "HVD, suffix candidate only": lambda: HybridDrafter(
            suffix(), ModelDrafter(draft, K), "hvd", predictor, costs, model_prior=model_prior
        ),
        "HVD, whole candidates": lambda: HybridDrafter(
            caches(), ModelDrafter(draft, K), "hvd", predictor, costs, model_prior=model_prior, cut=False
        ),
        "HVD (ours)": lambda: HybridDrafter(
            caches(), ModelDrafter(draft, K), "hvd", predictor, costs, model_prior=model_prior
        ),
        "oracle (hindsight)": lambda: HybridDrafter(caches(), ModelDrafter(draft, K), "oracle", reference=ar_tokens),
    }


def policy_methods(w, keep, notes):
    """`bench.paired_runs` methods for workload w: AR and every policy. `keep` holds one drafter per
    policy for the whole workload (the suffix tree's global memory persists across its prompts);
    `notes` records what a Generation does not carry: the share of steps that verified a cache draft,
    and whether AR's output equals the oracle's hindsight reference."""

    def ar(ids, i):
        g = generate(target, ids, MAX_NEW_TOKENS, sampling=GREEDY)
        notes["AR", i] = dict(hindsight_is_ar=g.tokens == eval_outputs[w, i])
        return g

    def policy(name, make):
        def run(ids, i):
            d = keep.setdefault(name, make())
            d.reference = eval_outputs[w, i]  # read by the oracle only
            g = generate(target, ids, MAX_NEW_TOKENS, drafter=d, sampling=GREEDY)
            notes[name, i] = dict(cache_share=np.mean([s["source"] == "cache" for s in d.log]) if d.log else np.nan)
            return g

        return run

    return {"AR": ar} | {name: policy(name, make) for name, make in policies(eval_outputs[w, 0]).items()}


def policy_table(r):
    """`bench.speedup_table` of paired runs, with this notebook's names (policy, of) and two more
    columns: the share of steps that verified a cache draft and target calls per generated token."""
    t = bench.speedup_table(r, seed=SEED).rename(columns={"method": "policy", "runs": "of"})
    extra = r[r.method != "AR"].groupby("method", sort=False)[["cache_share", "calls_per_token"]].mean()
    return t.join(extra, on="policy")


def policy_runs():
    w0 = WORKLOADS[0]
    for run_once in policy_methods(w0, {}, {}).values():  # untimed warm-up, throwaway drafters
        run_once(prompts[w0]["eval"][0], 0)
    frames, hindsight_is_ar = [], []
    for w in WORKLOADS:
        notes = {}
        r = bench.paired_runs(prompts[w]["eval"], policy_methods(w, {}, notes), warmup=False, progress=tqdm)
        r["cache_share"] = [notes[m, p].get("cache_share", np.nan) for m, p in zip(r.method, r.prompt)]
        hindsight_is_ar += [n["hindsight_is_ar"] for (m, _), n in notes.items() if m == "AR"]
        frames.append(r.assign(workload=w))
    runs = pd.concat(frames, ignore_index=True)
    runs["calls_per_token"] = (runs.target_calls + 1) / runs.new_tokens  # + 1: the prefill's pass
    hindsight = pd.DataFrame(dict(hindsight_is_ar=hindsight_is_ar))
    return {
        "runs": runs.assign(**meta),
        "hindsight": hindsight.assign(**meta),
        "drafting_alone": drafting_alone().assign(**meta),
    }


def drafting_alone():
    """Each cache drafter timed on its own over 64 positions of one prompt: ms per draft, per drafted token."""
    rows = []
    for name, make in [
        ("suffix", lambda: SuffixDrafter(max_spec=MAX_SPEC)),
        ("prompt lookup", lambda: PromptLookupDrafter(3, MAX_SPEC)),
    ]:
        d, ids = make(), prompts[WORKLOADS[0]]["eval"][0]
        d.reset(ids[:-64], GREEDY, None)
        t0 = clock()
        n = 0
        for L in range(len(ids) - 64, len(ids)):
            n += len(d.draft(ids[:L]))
        seconds = clock() - t0
        rows.append(
            dict(
                policy=f"{name} drafter alone",
                draft_ms_per_drafted_token=1e3 * seconds / max(n, 1),
                draft_ms_per_step=1e3 * seconds / 64,
            )
        )
    return pd.DataFrame(rows)


timed = study.step("policies", policy_runs, uses=PROMPTS + ["DRAFT", "K", "THREADS", "SEED"])
runs, hindsight_is_ar = timed["runs"], timed["hindsight"].hindsight_is_ar.tolist()
speed = pd.concat([policy_table(runs[runs.workload == w]).assign(workload=w) for w in WORKLOADS], ignore_index=True)
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
order = list(policies([]).keys())
fig, ax = plt.subplots(figsize=(13, 4.2))
width = 0.8 / len(order)
for i, pol in enumerate(order):
    g = speed[speed.policy == pol].set_index("workload").reindex(WORKLOADS)
    x = np.arange(len(WORKLOADS)) + (i - len(order) / 2 + 0.5) * width
    ax.bar(
        x,
        g.speedup,
        width,
        yerr=[g.speedup - g.lo, g.hi - g.speedup],
        capsize=2,
        label=pol,
        color=f"C{i}",
        edgecolor="k" if pol == "HVD (ours)" else "none",
        lw=1.2,
        error_kw=dict(lw=0.8),
    )
ax.axhline(1, color="k", lw=0.8)
ax.set_xticks(range(len(WORKLOADS)), WORKLOADS)
ax.set(ylabel="speedup over AR (greedy)", title="Draft-source policies per workload")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, title="policy", title_fontsize=8)
savefig(fig, f"{NB}_speedup")
plt.show()
real = speed[speed.policy != "oracle (hindsight)"]
fastest = real.loc[real.groupby("workload", sort=False).speedup.idxmax()].set_index("workload").reindex(WORKLOADS)
singles = speed[speed.policy.isin(["model", "prompt lookup", "suffix"])]
best_1 = singles.loc[singles.groupby("workload", sort=False).speedup.idxmax()].set_index("workload").reindex(WORKLOADS)
hvd_w = speed[speed.policy == "HVD (ours)"].set_index("workload").reindex(WORKLOADS)
orc_w = speed[speed.policy == "oracle (hindsight)"].set_index("workload").reindex(WORKLOADS)
overlap = (hvd_w.lo <= best_1.hi) & (best_1.lo <= hvd_w.hi)
hvd_first = [w for w in WORKLOADS if fastest.policy[w] == "HVD (ours)"]
slower = speed[speed.hi < 1]
display(
    Markdown(
        f"**Reading.** HVD has the highest median of the non-oracle policies on {len(hvd_first)} of {len(WORKLOADS)} "
        f"workloads" + (f" ({', '.join(hvd_first)})" if hvd_first else "") + "; per workload, HVD (95% CI; total-time "
        "ratio) against the single source with the highest median there: "
        + "; ".join(
            f"{w} {hvd_w.speedup[w]:.2f}x ({hvd_w.lo[w]:.2f}–{hvd_w.hi[w]:.2f}; {hvd_w.total_ratio[w]:.2f}x) vs "
            f"{best_1.policy[w]} {best_1.speedup[w]:.2f}x ({best_1.lo[w]:.2f}–{best_1.hi[w]:.2f}; "
            f"{best_1.total_ratio[w]:.2f}x)"
            for w in WORKLOADS
        )
        + (
            f". The best single source changes from workload to workload ({', '.join(sorted(set(best_1.policy.dropna())))}), "
            f"which is the case for choosing per step. "
            if best_1.policy.nunique() > 1
            else f". The best single source is {best_1.policy.iloc[0]} on every workload here. "
        )
        + f"HVD's interval overlaps the best single source's on {int(overlap.sum())} of {len(WORKLOADS)} workloads, so "
        f"with {N_EVAL} prompts each most per-workload differences are within noise; the pooled, paired comparison "
        f"of section 5 is the sharper test. "
        + (
            "Reliably slower than AR (whole interval below 1): "
            + ", ".join(f"{r.policy} on {r.workload} ({r.speedup:.2f}x)" for r in slower.itertuples())
            + " — a source that rarely gets a token accepted still pays its drafting and the longer verify pass. "
            if len(slower)
            else "No policy is reliably slower than AR on any workload. "
        )
        + f"The hindsight oracle is beaten in wall clock by HVD on {int((hvd_w.speedup > orc_w.speedup).sum())} workloads: "
        f"it maximises accepted tokens per step, not tokens per second. The oracle's hindsight reference equalled AR's "
        f"timed output on {sum(hindsight_is_ar)} of {len(hindsight_is_ar)} prompts."
    )
)

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
agentic = [w for w in WORKLOADS if w.startswith("agentic")]
# one prompt id per (workload, prompt): the agentic workloads' prompts pool into one set
agentic_runs = runs[runs.workload.isin(agentic)].assign(prompt=lambda d: d.workload + "/" + d.prompt.astype(str))
pooled = policy_table(agentic_runs).set_index("policy")
single = pooled.loc[["model", "prompt lookup", "suffix"]].speedup
best_single = single.idxmax()  # in hindsight, on the reported prompts: favours the opponent
vs = {p: bench.speedup(agentic_runs, p, reference=best_single, seed=SEED) for p in pooled.index if p != best_single}
hvd_over = {
    p: bench.speedup(agentic_runs, "HVD (ours)", reference=p, seed=SEED) for p in pooled.index if p != "HVD (ours)"
}
for cols, d in [
    (("vs_best_single", "vs_lo", "vs_hi", "vs_total"), vs),
    (("hvd_over", "hvd_over_lo", "hvd_over_hi", "hvd_over_total"), hvd_over),
]:
    for col, key in zip(cols, ("speedup", "lo", "hi", "total_ratio")):
        pooled[col] = pd.Series({p: v[key] for p, v in d.items()}, dtype=float)
pooled["best_single"] = best_single
cost_rows = []
for pol, g in runs[runs.drafted > 0].groupby("method"):
    cost_rows.append(dict(policy=pol, draft_ms_per_drafted_token=1e3 * g.draft_s.sum() / g.drafted.sum()))
drafting = pd.concat(
    [pd.DataFrame(cost_rows), timed["drafting_alone"][["policy", "draft_ms_per_drafted_token", "draft_ms_per_step"]]],
    ignore_index=True,
)
results.save(drafting.assign(**meta), f"{NB}/drafting_cost")
results.save(pooled.reset_index().assign(n_prompts=agentic_runs.prompt.nunique(), **meta), f"{NB}/agentic_pooled")
display(
    pooled[
        [
            "speedup",
            "lo",
            "hi",
            "total_ratio",
            "hvd_over",
            "hvd_over_lo",
            "hvd_over_hi",
            "hvd_over_total",
            "vs_best_single",
            "vs_lo",
            "vs_hi",
            "tokens_per_call",
            "cache_share",
            "identical",
            "of",
        ]
    ].round(3)
)
display(drafting.round(4))
identical = runs[runs.method != "AR"].same_as_reference
h, p_ = pooled.loc["HVD (ours)"], pooled
paired_txt = "; ".join(
    f"{o} **{p_.hvd_over[o]:.2f}x** (CI {p_.hvd_over_lo[o]:.2f}–{p_.hvd_over_hi[o]:.2f}; total "
    f"{p_.hvd_over_total[o]:.2f}x)"
    for o in ["prompt lookup", "suffix", "model", "ArcticInference rule", "SAM rule"]
)
display(
    Markdown(
        f"On the agentic workloads pooled ({agentic_runs.prompt.nunique()} prompts), HVD runs at **{h.speedup:.2f}x** AR "
        f"(95% CI {h.lo:.2f}–{h.hi:.2f}; total-time ratio {h.total_ratio:.2f}x); the best single source in hindsight is "
        f"{best_single} at {single.max():.2f}x (CI {p_.lo[best_single]:.2f}–{p_.hi[best_single]:.2f}), the ArcticInference "
        f"rule {p_.speedup['ArcticInference rule']:.2f}x, the oracle {p_.speedup['oracle (hindsight)']:.2f}x. Paired per "
        f"prompt, HVD's speed over each other policy's: {paired_txt}. Seed study: 2.73x average on agentic workflows. "
        f"Outputs identical to AR: {int(identical.sum())}/{len(identical)}."
    )
)

# %%
alone = drafting.set_index("policy").draft_ms_per_step.dropna()
display(
    Markdown(
        "**Reading the drafting cost.** Timed alone, one draft costs "
        + ", ".join(
            f"{n.replace(' drafter alone', '')} {v:.3f} ms ({v / (costs.verify(1) * 1e3):.1%} of a one-token verify step)"
            for n, v in alone.items()
        )
        + f", against {costs.model_token_s * 1e3:.2f} ms for each model-drafter token. So a cache candidate really is "
        f"nearly free to produce, and the whole question is whether verifying it pays — which is what the payoff "
        f"predictor answers. A paired interval whose lower end is above 1 means HVD is reliably faster than that "
        f"opponent on these prompts; a total-time ratio below the median ratio means the advantage is smaller on the "
        f"longest prompts."
    )
)

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
from speclib import FeatureDrafter, load_head

head = load_head(HEAD)
target_f = speclib.load(TARGET, device=DEVICE)  # the head's target records features; AR's does not


def head_drafter():
    return FeatureDrafter(target_f, head, k=HEAD_K)


def head_fit():
    """The head alone on the fit prompts: the loop's steps give its per-token acceptance and its cost."""
    steps = []
    for w in agentic:
        for ids in prompts[w]["fit"]:
            steps += generate(target_f, ids, MAX_NEW_TOKENS, drafter=head_drafter(), sampling=GREEDY).stats.steps
    return pd.DataFrame(steps).assign(**meta)


def head_policy_runs():
    fit_steps = head_fit()
    prior = bench.token_acceptance(fit_steps.to_dict("records"))
    try:
        head_costs = Costs.from_steps(fit_cache_steps + fit_steps.drop(columns=list(meta)).to_dict("records"))
    except ValueError:
        head_costs = Costs(
            dict(costs.verify_s), float(np.median(fit_steps.draft_s / fit_steps.drafted.clip(lower=1))), costs.cache_s
        )
    methods = {
        "feature head": head_drafter,
        "HVD (separate draft)": lambda: HybridDrafter(
            caches(), ModelDrafter(draft, K), "hvd", predictor, costs, model_prior=model_prior
        ),
        "HVD (feature head)": lambda: HybridDrafter(
            caches(), head_drafter(), "hvd", predictor, head_costs, model_prior=prior
        ),
    }
    frames = []
    for w in agentic:
        # one drafter per policy per workload, shared by its prompts (a global suffix tree)
        on = {"feature head": target_f, "HVD (separate draft)": target, "HVD (feature head)": target_f}
        m = {"AR": bench.Method(target, MAX_NEW_TOKENS)} | {
            name: bench.Method(lm, MAX_NEW_TOKENS, methods[name]()) for name, lm in on.items()
        }
        frames.append(
            bench.paired_runs(prompts[w]["eval"], m, warmup=(w == agentic[0]), progress=tqdm).assign(workload=w)
        )
    runs_h = pd.concat(frames, ignore_index=True).assign(**meta)
    info = pd.DataFrame(
        [
            dict(
                head_prior=prior,
                head_token_ms=head_costs.model_token_s * 1e3,
                draft_token_ms=costs.model_token_s * 1e3,
                fit_steps=len(fit_steps),
            )
        ]
    ).assign(**meta)
    return {"head_runs": runs_h, "head_info": info}


saved = study.step(
    "head_policies", head_policy_runs, uses=PROMPTS + ["DRAFT", "K", "THREADS", "SEED", "HEAD", "HEAD_K"]
)
hr, hinfo = saved["head_runs"], saved["head_info"].iloc[0]
sets = [(w, hr[hr.workload == w]) for w in agentic] + [
    ("agentic pooled", hr.assign(prompt=lambda d: d.workload + "/" + d.prompt.astype(str)))
]
rows = []
for w, g in sets:
    t = bench.speedup_table(g, seed=SEED).set_index("method")
    r = bench.speedup(g, "HVD (feature head)", reference="feature head", seed=SEED)
    for m in t.index:
        rows.append(
            dict(
                workload=w,
                method=m,
                speedup=t.speedup[m],
                lo=t.lo[m],
                hi=t.hi[m],
                total_ratio=t.total_ratio[m],
                token_acceptance=t.token_acceptance[m],
                identical=t.identical[m],
                of=t.runs[m],
            )
        )
    rows.append(
        dict(
            workload=w,
            method="HVD (feature head) / feature head",
            speedup=r["speedup"],
            lo=r["lo"],
            hi=r["hi"],
            total_ratio=r["total_ratio"],
        )
    )
head_table = pd.DataFrame(rows)
results.save(head_table.assign(**meta), f"{NB}/head_policies")
display(head_table.pivot(index="method", columns="workload", values="speedup").round(2))

fig, axes = plt.subplots(1, 2, figsize=(13, 3.8))
names = ["feature head", "HVD (separate draft)", "HVD (feature head)"]
x = np.arange(len(sets))
for j, name in enumerate(names):
    g = head_table[head_table.method == name].set_index("workload").loc[[w for w, _ in sets]]
    axes[0].bar(x + (j - 1) * 0.27, g.speedup, 0.27, yerr=[g.speedup - g.lo, g.hi - g.speedup], capsize=3, label=name)
axes[0].axhline(1, color="k", lw=0.8)
axes[0].set_xticks(x, [w for w, _ in sets], fontsize=8)
axes[0].set(ylabel="speedup over AR (greedy)", title="Drafters per agentic workload")
axes[0].legend(fontsize=8)
g = head_table[head_table.method == "HVD (feature head) / feature head"].set_index("workload").loc[[w for w, _ in sets]]
axes[1].errorbar(
    x, g.speedup, yerr=[g.speedup - g.lo, g.hi - g.speedup], fmt="o", capsize=4, label="median per-prompt ratio, 95% CI"
)
axes[1].axhline(1, color="k", lw=0.8)
axes[1].set_xticks(x, [w for w, _ in sets], fontsize=8)
axes[1].set(ylabel="HVD (feature head) / feature head", title="Paired per prompt (95% CI)")
axes[1].legend(fontsize=8)
savefig(fig, f"{NB}_head")
plt.show()
ratio = head_table[head_table.method == "HVD (feature head) / feature head"].set_index("workload")
alone_h = head_table[head_table.method == "feature head"].set_index("workload")
ident = hr[hr.method != "AR"].same_as_reference
# does HVD's gain over the head follow how much the head leaves on the table? The paired gain's interval on
# the workload where the head alone accepts most against the one where it accepts least
acc = alone_h.token_acceptance.loc[agentic]
w_hi, w_lo = acc.idxmax(), acc.idxmin()


def gain(w):
    return f"{w} (head acceptance {acc[w]:.2f}; gain {ratio.speedup[w]:.2f}x, CI {ratio.lo[w]:.2f}–{ratio.hi[w]:.2f})"


apart = not (ratio.lo[w_hi] <= ratio.hi[w_lo] and ratio.lo[w_lo] <= ratio.hi[w_hi])
if w_hi == w_lo or not np.isfinite(ratio.loc[[w_hi, w_lo], ["lo", "hi"]].to_numpy()).all():
    follows = (
        "One workload, or intervals missing: the workbook cannot tell whether the gain follows the head's acceptance"
    )
elif not apart:
    follows = (
        f"The head accepts most on {gain(w_hi)} and least on {gain(w_lo)}: the intervals overlap, so the workbook "
        f"cannot tell whether the gain follows the head's acceptance"
    )
else:
    more = w_lo if ratio.speedup[w_lo] > ratio.speedup[w_hi] else w_hi
    follows = (
        f"The head accepts most on {gain(w_hi)} and least on {gain(w_lo)}: the intervals separate, and the gain is "
        f"larger where the head accepts {'less' if more == w_lo else 'more'}"
        + (
            " — as expected if a cache draft wins only the steps where its copied span is longer than what the "
            "head already gets accepted"
            if more == w_lo
            else ", the opposite of what the head leaving more on the table would predict"
        )
    )
display(
    Markdown(
        f"The head alone (per-token acceptance {hinfo.head_prior:.3f} on the fit prompts, {hinfo.head_token_ms:.2f} ms per drafted "
        f"token in the loop, against {hinfo.draft_token_ms:.2f} ms for the separate draft) runs at "
        + ", ".join(f"{w} {alone_h.speedup[w]:.2f}x" for w, _ in sets)
        + ". HVD with the head over the head alone, paired per prompt: "
        + "; ".join(f"{w} **{ratio.speedup[w]:.2f}x** (CI {ratio.lo[w]:.2f}–{ratio.hi[w]:.2f})" for w, _ in sets)
        + f". HVD is faster than the head alone on {int((ratio.speedup > 1).sum())} of {len(ratio)} rows, reliably (CI above 1) on "
        f"{int((ratio.lo > 1).sum())}. Does the gain follow how much the head leaves on the table? {follows}. "
        f"Outputs identical to AR: {int(ident.sum())}/{len(ident)}."
    )
)

# %% [markdown]
# ### One configuration, two runs
# HVD with the separate draft runs twice in this notebook, with the same drafters and predictor on the same
# prompts: in section 4's `policies` step (the number sections 4 and 5 report) and again in this section's
# `head_policies` step, so that every ratio here is paired within one block of runs. The two measurements
# differ by run-to-run noise (the machine's state, what ran before), and by nothing else the notebook
# controls: the table sets them side by side, each with its own 95% interval over prompts.

# %%
hvd_pooled = pooled.loc["HVD (ours)"]  # section 5: the agentic workloads pooled
twice = pd.DataFrame(
    [
        dict(workload=w, policies_step=hvd_w.speedup[w], policies_lo=hvd_w.lo[w], policies_hi=hvd_w.hi[w])
        for w in agentic
    ]
    + [
        dict(
            workload="agentic pooled",
            policies_step=hvd_pooled.speedup,
            policies_lo=hvd_pooled.lo,
            policies_hi=hvd_pooled.hi,
        )
    ]
).set_index("workload")
hsep = head_table[head_table.method == "HVD (separate draft)"].set_index("workload")
twice["head_step"], twice["head_lo"], twice["head_hi"] = hsep.speedup, hsep.lo, hsep.hi
twice["overlap"] = (twice.policies_lo <= twice.head_hi) & (twice.head_lo <= twice.policies_hi)
display(twice.round(3))
display(
    Markdown(
        "HVD with the separate draft, speedup over AR (median per-prompt ratio, 95% CI), measured twice — in the "
        "`policies` step and in the `head_policies` step, two runs of the same configuration on the same prompts: "
        + "; ".join(
            f"{w} {r.policies_step:.2f}x ({r.policies_lo:.2f}–{r.policies_hi:.2f}) and {r.head_step:.2f}x "
            f"({r.head_lo:.2f}–{r.head_hi:.2f})"
            for w, r in twice.iterrows()
        )
        + f". The intervals overlap on {int(twice.overlap.sum())} of {len(twice)} rows"
        + (
            ""
            if twice.overlap.all()
            else f" (apart on {', '.join(twice.index[~twice.overlap])}: a gap between two runs of one configuration that the "
            f"intervals over prompts do not cover)"
        )
        + f"; the pooled estimate moved by {twice.head_step['agentic pooled'] - twice.policies_step['agentic pooled']:+.2f}x "
        f"between the runs, a spread to keep in mind when reading any single speedup of this notebook."
    )
)

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
def training_free_runs():
    store, sa_s = datastore.build(TARGET, "stdlib")
    w0 = WORKLOADS[0]
    generate(target, prompts[w0]["fit"][0], MAX_NEW_TOKENS, sampling=GREEDY)  # untimed warm-up, throwaway drafters
    generate(
        target,
        prompts[w0]["fit"][0],
        MAX_NEW_TOKENS,
        drafter=rest.RestDrafter(store, nodes=REST_NODES),
        sampling=GREEDY,
    )
    frames, choices = [], []
    for w in WORKLOADS:
        warm = hvd_plumbing.warm_recycling(target, prompts[w]["fit"], MAX_NEW_TOKENS, 8, max(RECYCLING_NODES))
        ra = warm.fitted_rank_accept()
        acc = {n: expected_accepted(*recycling_template(n, ra), ra) for n in RECYCLING_NODES}
        predicted = {n: (1 + acc[n]) * lat[0] / lat[n] for n in RECYCLING_NODES}  # lat[n] = T(n + 1)
        nodes = max(predicted, key=predicted.get)
        choices += [
            dict(
                workload=w,
                nodes=n,
                expected_accepted=acc[n],
                predicted_speedup=predicted[n],
                first_candidate=ra[0],
                chosen=n == nodes,
            )
            for n in RECYCLING_NODES
        ]
        recycling = warm.with_template(nodes)
        drafters = {
            "prompt lookup": PromptLookupDrafter(3, MAX_SPEC),
            "token recycling": recycling,
            "REST": rest.RestDrafter(store, nodes=REST_NODES),
        }
        methods = {"AR": bench.Method(target, MAX_NEW_TOKENS)} | {
            m: bench.Method(target, MAX_NEW_TOKENS, d) for m, d in drafters.items()
        }
        r = bench.paired_runs(prompts[w]["eval"], methods, warmup=False, progress=tqdm)
        frames.append(r.assign(workload=w, recycling_nodes=nodes))
    info = pd.DataFrame([dict(tokens=len(store), megabytes=store.nbytes / 2**20, suffix_array_s=sa_s)])
    return {
        "tf_runs": pd.concat(frames, ignore_index=True).assign(**meta),
        "tf_choice": pd.DataFrame(choices).assign(**meta),
        "tf_store": info.assign(**meta),
    }


tf = study.step(
    "training_free", training_free_runs, uses=PROMPTS + ["RECYCLING_NODES", "REST_NODES", "LATENCY_REPEATS", "THREADS"]
)
tf_runs = tf["tf_runs"]
tf_speed = pd.concat(
    [bench.speedup_table(tf_runs[tf_runs.workload == w], seed=SEED).assign(workload=w) for w in WORKLOADS]
    + [
        bench.speedup_table(
            tf_runs[tf_runs.workload.isin(agentic)].assign(prompt=lambda d: d.workload + "/" + d.prompt.astype(str)),
            seed=SEED,
        ).assign(workload="agentic pooled")
    ],
    ignore_index=True,
)
results.save(tf_speed.assign(**meta), f"{NB}/training_free")
display(tf_speed.pivot(index="method", columns="workload", values="speedup").round(2))
display(tf_speed.pivot(index="method", columns="workload", values="tokens_per_call").round(2))
over_lookup = pd.DataFrame(
    [
        dict(
            workload=w,
            **bench.speedup(tf_runs[tf_runs.workload == w], "token recycling", reference="prompt lookup", seed=SEED),
        )
        for w in WORKLOADS
    ]
)
display(Markdown("Token Recycling over prompt lookup, paired per prompt (median ratio of tokens per second, 95% CI):"))
display(over_lookup[["workload", "speedup", "lo", "hi"]].round(2))
tf_choice = tf["tf_choice"]
chosen_nodes = tf_runs.groupby("workload").recycling_nodes.first()
store_info = tf["tf_store"].iloc[0]
tfp = tf_speed[tf_speed.workload == "agentic pooled"].set_index("method")
display(
    Markdown(
        f"REST's datastore: {int(store_info.tokens):,} tokens ({store_info.megabytes:.0f} MB with its suffix array, sorted in "
        f"{store_info.suffix_array_s:.1f} s). Token Recycling's tree size per workload (cost model): "
        + ", ".join(f"{w} {int(n)}" for w, n in chosen_nodes.items())
        + "; the target took a token's first candidate "
        + ", ".join(f"{w} {g.first_candidate.iloc[0]:.0%}" for w, g in tf_choice.groupby("workload", sort=False))
        + " of the time. "
        f"Pooled over the agentic workloads: prompt lookup {tfp.speedup['prompt lookup']:.2f}x, Token Recycling "
        f"{tfp.speedup['token recycling']:.2f}x ({tfp.tokens_per_call['token recycling']:.2f} tokens per call), REST "
        f"{tfp.speedup['REST']:.2f}x ({tfp.tokens_per_call['REST']:.2f}). Paired per prompt, Token Recycling is faster than "
        f"prompt lookup (whole interval above 1) on: {', '.join(over_lookup.workload[over_lookup.lo > 1]) or 'no workload'}; "
        f"slower (whole interval below 1) on: {', '.join(over_lookup.workload[over_lookup.hi < 1]) or 'no workload'}. Outputs identical to AR: "
        f"{int(tf_runs[tf_runs.method != 'AR'].same_as_reference.sum())}/{int((tf_runs.method != 'AR').sum())}."
    )
)
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
def every_source_runs():
    store, _ = datastore.build(TARGET, "stdlib")
    sources = ["prompt lookup", "suffix", "token recycling", "REST"]

    def t_of(n):  # T(n) from section 1's bare forward, interpolated
        return float(np.interp(n, ns, lat[:-1]))

    lookahead, warm, fit_rows = {}, {}, []
    for w in agentic:
        fit = prompts[w]["fit"]
        la = hvd_plumbing.choose_lookahead(target, fit, LOOKAHEAD_GRID, t_of, MAX_NEW_TOKENS)
        lookahead[w] = hvd_plumbing.chosen_lookahead(la)
        fit_rows.append(la.assign(workload=w))
        # Token Recycling as in section 7: warmed and its rank template measured on the fit prompts
        warm[w] = hvd_plumbing.warm_recycling(target, fit, MAX_NEW_TOKENS, 8, int(chosen_nodes[w]))

    def every_cache(w, first="prompt lookup"):
        made = {
            "prompt lookup": PromptLookupDrafter(3, MAX_SPEC),
            "suffix": SuffixDrafter(max_spec=MAX_SPEC),
            "token recycling": warm[w].with_template(int(chosen_nodes[w])),
            "REST": rest.RestDrafter(store, nodes=REST_NODES),
        }
        return hvd_plumbing.in_front(made, first)

    logs = pd.concat(
        [
            hvd_plumbing.every_source_logs(
                target, partial(every_cache, w), ModelDrafter(draft, K), prompts[w]["fit"], MAX_NEW_TOKENS, sources
            ).assign(workload=w)
            for w in agentic
        ],
        ignore_index=True,
    )
    every = hvd_plumbing.fit_payoff(logs, seed=SEED)

    frames, chosen = [], []
    for w in agentic:
        hvd_all = HybridDrafter(every_cache(w), ModelDrafter(draft, K), "hvd", every, costs, model_prior=model_prior)
        drafters = {
            "prompt lookup": PromptLookupDrafter(3, MAX_SPEC),
            "suffix": SuffixDrafter(max_spec=MAX_SPEC),
            "token recycling": warm[w].with_template(int(chosen_nodes[w])),
            "REST": rest.RestDrafter(store, nodes=REST_NODES),
            "lookahead": Lookahead(*lookahead[w]),
            "model": ModelDrafter(draft, K),
            "HVD (two sources)": HybridDrafter(
                caches(), ModelDrafter(draft, K), "hvd", predictor, costs, model_prior=model_prior
            ),
            "HVD (every source)": hvd_all,
        }

        methods = {"AR": bench.Method(target, MAX_NEW_TOKENS)} | {
            m: bench.Method(target, MAX_NEW_TOKENS, d) for m, d in drafters.items()
        }
        # HVD over every source also records what it verified each step, predicted and accepted
        methods["HVD (every source)"] = hvd_plumbing.RecordSteps(
            methods["HVD (every source)"], hvd_all, every, chosen, tags={"workload": w}
        )
        r = bench.paired_runs(prompts[w]["eval"], methods, warmup=False, progress=tqdm)
        frames.append(r.assign(workload=w, lookahead="W{} N{} G{}".format(*lookahead[w])))
    return {
        "es_runs": pd.concat(frames, ignore_index=True).assign(**meta),
        "es_lookahead": pd.concat(fit_rows, ignore_index=True).assign(**meta),
        "es_logs": logs.assign(**meta),
        "es_choice": pd.DataFrame(chosen).assign(**meta),
    }


es = study.step(
    "every_source",
    every_source_runs,
    uses=PROMPTS + ["DRAFT", "K", "RECYCLING_NODES", "REST_NODES", "LOOKAHEAD_GRID", "LATENCY_REPEATS", "THREADS"],
)
es_runs, es_choice, es_la = es["es_runs"], es["es_choice"], es["es_lookahead"]
assert es_runs[es_runs.method != "AR"].same_as_reference.all(), "a drafter changed the greedy output"
pooled_es = es_runs.assign(prompt=lambda d: d.workload + "/" + d.prompt.astype(str))
es_speed = bench.speedup_table(pooled_es, seed=SEED).set_index("method")
singles = ["prompt lookup", "suffix", "token recycling", "REST", "lookahead", "model"]
best_single = es_speed.loc[singles].speedup.idxmax()
over = pd.DataFrame(
    [
        dict(reference=m, **bench.speedup(pooled_es, "HVD (every source)", reference=m, seed=SEED))
        for m in singles + ["HVD (two sources)"]
    ]
).set_index("reference")
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

share = es_choice.groupby("source").size() / len(es_choice)
cal = es_choice.dropna(subset=["predicted"]).groupby("source")[["predicted", "accepted"]].mean()
overpromise = cal.predicted - cal.accepted  # tokens per verified step the predictor over-promised
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw=dict(width_ratios=[1.6, 1]))
order = es_speed.speedup.sort_values().index
axes[0].barh(
    order,
    es_speed.speedup[order],
    xerr=[es_speed.speedup[order] - es_speed.lo[order], es_speed.hi[order] - es_speed.speedup[order]],
    color=["C3" if m.startswith("HVD") else "C0" for m in order],
)
axes[0].axvline(1, color="k", lw=0.8)
axes[0].set_xlabel("speedup over AR (median over prompts, 95% CI)")
axes[0].set_title("agentic workloads pooled")
share_w = es_choice.groupby(["workload", "source"]).size().unstack(fill_value=0)
(share_w.div(share_w.sum(axis=1), axis=0)).plot.barh(stacked=True, ax=axes[1], width=0.7)
axes[1].set_xlabel("share of HVD's steps")
axes[1].set_title("what HVD (every source) verified")
axes[1].legend(fontsize=7, loc="lower right")
savefig(fig, f"{NB}_every_source")
plt.show()

h_all = over.loc[best_single]
never = [s for s in ["prompt_lookup", "suffix", "recycling", "rest", "model"] if s not in share.index]
la_chosen = es_la[es_la.chosen].set_index("workload")
display(
    Markdown(
        "**Reading.** Lookahead's settings from the fit prompts: "
        + "; ".join(
            f"{w} W = {int(r.window)}, N = {int(r.ngram)}, G = {int(r.guesses)} ({r.mean_nodes:.1f} nodes, {r.tokens_per_call:.2f} "
            f"tokens per call, predicted {r.predicted_speedup:.2f}x)"
            for w, r in la_chosen.iterrows()
        )
        + f"; on the evaluation prompts it runs at {es_speed.speedup['lookahead']:.2f}x AR "
        f"(CI {es_speed.lo['lookahead']:.2f}–{es_speed.hi['lookahead']:.2f}, {es_speed.tokens_per_call['lookahead']:.2f} tokens per call). "
        f"The best single source pooled is **{best_single}** at {es_speed.speedup[best_single]:.2f}x. HVD over every source runs at "
        f"**{es_speed.speedup['HVD (every source)']:.2f}x** AR and, paired per prompt, at **{h_all.speedup:.2f}x** {best_single} "
        f"(CI {h_all.lo:.2f}–{h_all.hi:.2f}): "
        + f"the 1.15x goal: {verdicts.goal(h_all, 1.15)}. "
        + f"Against HVD over two sources: {over.speedup['HVD (two sources)']:.2f}x (CI {over.lo['HVD (two sources)']:.2f}–"
        f"{over.hi['HVD (two sources)']:.2f}). It verified "
        + ", ".join(f"{s} {v:.0%}" for s, v in share.sort_values(ascending=False).items())
        + " of its steps"
        + (f" and never picked {', '.join(never)}" if never else "")
        + ". Per source, the predictor's expected "
        "accepted tokens against what was accepted when it verified that source: "
        + "; ".join(f"{s} {r.predicted:.2f} vs {r.accepted:.2f}" for s, r in cal.iterrows())
        + " (a source it over-promises on is "
        "verified too often, one it under-promises on too rarely)."
        + (
            f" The predictor was fitted on {len(es['es_logs']):,} logged candidates; it over-promised most on "
            f"{overpromise.idxmax()} ({overpromise.max():+.2f} tokens per verified step, {share.get(overpromise.idxmax(), 0):.0%} of "
            "the steps): those steps were chosen on payoffs they did not deliver, so at some of them another source would "
            "have been the better choice."
            if len(overpromise)
            else " It verified no cache candidate: every step used the model drafter."
        )
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
