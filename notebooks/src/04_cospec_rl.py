# %% [markdown]
# # 04 · Beyond lossless: CoSpec, an RL-trained arbitration policy
#
# **Question.** Lossless speculative decoding treats the target as the only authority: a drafted token
# survives only if the target would have produced it. But the draft is not uniformly worse token by
# token. At a disagreement, is the draft's token sometimes the one that leads to the right final
# answer — and can a small learned policy tell when, beating the target's own accuracy while keeping
# most of the speedup?
#
# **Method.** A verifiable task: generated multi-step arithmetic with worked solutions
# (`speclib.research.data.math_problems`, four difficulty levels, train / validation / test splits by seed, an
# independent evaluator). A shipped pair trained on it, `math-target` and `math-draft`; both make
# mistakes. Branch rollouts label each disagreement along the target's greedy solution: continue
# greedily from the draft's token and from the target's, compare final answers. `cospec.Arbiter(policy)`
# is an acceptor: lossless where the models agree; at a mismatch a tiny network over per-mismatch
# features (both models' probabilities of both tokens, entropies, margin, JSD, chain position, depth,
# recent agreement) keeps the draft's token or the target's. It is warm-started on the rollout labels
# and trained with a GRPO-style policy gradient (reward = correct final answer, group baseline) on the
# training split. Baselines run in the same loop: target-only and draft-only AR, lossless SD, typical
# acceptance (Medusa), a fuzzy JSD-threshold rule (swept), an AutoJudge-style classifier trained on the
# same labels, and the oracle branch choice. Everything is greedy; decisions are deterministic at test time.
#
# Accuracy comes from `cospec_rollouts.arbitrate`, the same process batched token by token (tested equal to the
# SD loop); wall-clock speed from the real SD loop (`speclib.generate` with the `Arbiter`) on a subset
# of the test problems, whose outputs are checked against the batched ones.
#
# **What is given up, and why it can be worth it.** Every other notebook keeps the lossless
# guarantee: the output is exactly what the target alone would produce
# ([the lossless rule](../docs/lossless.md)). Here that guarantee is dropped on purpose, at the
# mismatches only. The bet is that two imperfect models make *different* mistakes: where they
# disagree, the target is not always the one that is right, and a policy that knows when to trust
# the draft could end up more accurate than either model alone — while keeping the speed of
# speculative decoding, since the draft still proposes and the target still verifies in one pass.
# The price is that the output is no longer the target's, so it must be judged on a task with a
# checkable answer; that is why this notebook uses generated arithmetic, where correctness is exact.
#
# **How to read the notebook.** Sections 1–2 measure the raw material: how good each model is, and
# how often, at a disagreement, the draft's token is the better one (an upper bound on what any
# policy can gain). Section 3 trains and tunes the simple baselines; section 4 trains CoSpec by
# reinforcement learning; sections 5–6 score everything on held-out test problems for accuracy and
# for wall-clock speed; section 7 opens the policy up; section 8 states the verdict against a target
# fixed in advance. All accuracy intervals are bootstrap intervals over problems, and every
# comparison with the target is *paired* (the same problems), as explained in
# [the statistics notes](../docs/statistics.md).

# %% [markdown]
# ## About this notebook
#
# **What you will learn.**
#
# * What is given up when speculative decoding stops being lossless, and how to judge the result when
#   the output is no longer the target's: by final-answer correctness on a task that can be checked.
# * How to measure the raw material of any arbitration policy: how often, at a disagreement, the
#   draft's token is the one that leads to a right answer (branch rollouts), and the oracle bound.
# * How to train a tiny arbitration policy: supervised warm start on rollout labels, then policy
#   gradient with a group baseline on the final reward; and how to select checkpoints honestly
#   (validation split, test split untouched).
# * How to compare methods on accuracy and speed together, with paired intervals.
#
# **What to know first.** Notebook 01 (the rule, the speedup estimator). The idea of a policy
# gradient (REINFORCE: raise the log-probability of decisions in proportion to how much better than
# average their trajectory did); no prior reinforcement learning practice is needed.
#
# **How long it takes.** With `RESULTS = "auto"` (the default) and the shipped parameters every step
# (the batched baselines, the branch rollouts, the supervised policies, reinforcement learning, the
# test decoding and the timed runs) is read from `data/results/`, the trained policies included, and
# the notebook draws everything in about a minute. `"recompute"` runs every step: about 70 minutes on 2
# CPU cores, most of it the rollouts and reinforcement learning. Changing a parameter recomputes only
# the steps that use it (and the steps after them that read their results); a run whose parameters
# differ from the shipped ones writes under `build/unpublished/04_cospec_rl/…`. `"reuse"` never
# computes, and names the step and the parameters that differ when it cannot reuse. The table at the
# end of section 8 lists each step and how long it took when it was computed.

# %%
SMOKE = False  # True: tiny sizes, the whole notebook in under ~2 minutes on 2 CPU cores
SEED = 0
DEVICE = "auto"
TARGET = "math-target"  # model-specific: the arithmetic task's prompt and answer format are this pair's
DRAFT = "math-draft"  # (speclib.acceptors.cospec); another pair must be trained on that format to be judged fairly
K = 4  # draft length
MAX_NEW_TOKENS = 128
N_LABEL = 800  # training problems whose target solutions are branch-rolled for labels
N_VAL = 400  # validation problems: threshold and checkpoint choices
N_TEST = 2000  # held-out test problems: every reported accuracy (the first 2000 are kept out of training)
N_TIMED = 60  # test problems decoded by the real SD loop for wall-clock speed
RL_ITERS = 60
PROBLEMS_PER_ITER = 32
GROUP = 8
EVAL_EVERY = 10  # RL iterations between validation evaluations
FUZZY_T = [0.05, 0.1, 0.2, 0.4]
TYPICAL = [(0.3, 0.09), (0.1, 0.05)]  # (eps, delta)
THREADS = 1  # torch threads of the timed sections (0: every CPU); 1 keeps T(n) smooth on 2 cores (notebook 05)
RESULTS = "auto"  # auto: reuse results saved with these parameters, else compute; "recompute"; "reuse"
PUBLISH = False  # True: a run with non-default parameters also replaces data/results and figures/

# %%

import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import Markdown, display

import speclib
from speclib.acceptors import cospec
from speclib.research import data
from speclib.research.studies import cospec_rl
from speclib.workbook import results, verdicts
from speclib.workbook.plotting import savefig, style
from speclib.workbook.study import Study

if SMOKE:
    N_LABEL, N_VAL, N_TEST, N_TIMED, RL_ITERS, PROBLEMS_PER_ITER, GROUP, EVAL_EVERY = 24, 16, 32, 3, 2, 4, 4, 1
    FUZZY_T, TYPICAL = [0.1], [(0.3, 0.09)]
NB = "04_cospec_rl"
style()
torch.manual_seed(SEED)
torch.set_grad_enabled(False)
# the untimed batch work on every CPU ($SPECLIB_THREADS when set: torch's default of one thread per core
# would oversubscribe a machine whose other core is busy); timed sections run at THREADS
speclib.core.device.set_threads()
target, draft = speclib.load(TARGET, device=DEVICE), speclib.load(DRAFT, device=DEVICE)
dev = str(target.device)
meta = dict(seed=SEED, device=dev, target=TARGET, draft=DRAFT, k=K, smoke=SMOKE)
splits = {
    "train": data.math_problems("train", max(N_LABEL, 4000)),
    "validation": data.math_problems("validation", N_VAL),
    "test": data.math_problems("test", N_TEST),
}
task = cospec_rl.Task(target, draft, splits, K, MAX_NEW_TOKENS, SEED, meta)  # the pair, the problems, the decoding
study = Study(
    NB, globals(), mode=RESULTS, publish=PUBLISH, always=dict(SMOKE=SMOKE), calibrate=target
)  # target T(1) before/after each step
SOLVE = ["TARGET", "DRAFT", "K", "MAX_NEW_TOKENS"]  # what every decoding of the problems depends on
print(splits["test"][0]["question"] + splits["test"][0]["solution"])
print({s: len(p) for s, p in splits.items()}, f"device {dev}; results mode {RESULTS!r}: this run {study.where()}")

# %% [markdown]
# ## 1 · The pair on the task
# Greedy accuracy of each model alone on the held-out test split, by level (a level-L problem has
# L + 1 computed steps), and the cost of one forward of each (c = draft / target).
#
# These two numbers frame everything that follows. The accuracy gap between target and draft says
# how much weaker the draft is overall; if it were as accurate as the target, there would be nothing
# to arbitrate. The cost ratio c, and v (verifying K + 1 tokens relative to one), are the quantities
# of [the analytic model](../docs/analytic_model.md) that bound how fast any speculative scheme on
# this pair can be: every method in this notebook drafts with the same model and verifies with the
# same target, so they differ in speed only through how many drafted tokens they keep.


# %%

base_table = study.step("baseline", task.baseline, uses=SOLVE + ["N_TEST"])
base = {m: cospec_rl.rows_of(base_table, m) for m in ["target AR", "draft AR"]}
acc_base = {m: task.accuracy(r, "test") for m, r in base.items()}
by_level = cospec_rl.accuracy_by_level(acc_base, splits["test"])
lat_table = study.step(
    "latency", lambda: task.latency(THREADS, 10 if SMOKE else 30), uses=["TARGET", "DRAFT", "K", "THREADS"]
)
lat, threads = lat_table.seconds.tolist(), int(lat_table.threads[0])
c, v = lat[1] / lat[0], lat[2] / lat[0]
results.save(by_level.reset_index().assign(c=c, v=v, threads=threads, **meta), f"{NB}/pair")
display(by_level.round(3))
env_s = study.summary().set_index("step").computed_s["baseline"]  # None for results recorded without a time
display(Markdown(cospec_rl.pair_reading(acc_base, lat, N_TEST, K, env_s)))

# %% [markdown]
# ## 2 · Disagreements: who is right?
# Along the target's greedy solution of each training problem, every position where the draft's
# argmax differs is a mismatch. Branch rollouts continue greedily with the target from the draft's
# token; the target's own solution is the other branch. The same labels on the test split give the
# oracle branch choice (swap in the draft's token at a mismatch whose draft branch is right and whose
# target branch is wrong).
#
# What a label means, and what it does not. A branch rollout asks a counterfactual: "had we kept the
# draft's token here and then let the target continue greedily, would the final answer be right?"
# Each mismatch thus gets two outcomes — draft branch right or wrong, target branch right or wrong —
# and four cases. Only the two *discordant* cases carry information about which token to keep: where
# both branches are right (or both wrong) the choice does not change the answer, only the text. The
# labels are conditional on everything before the mismatch being the target's own solution, so they
# describe the first disagreement along the target's path; once a policy has kept a draft token,
# later mismatches lie on a path the rollouts never visited. The oracle here is therefore an
# optimistic reference — it may switch at one mismatch per problem, with hindsight — not a bound
# that a policy cannot exceed.


# %%

label_table = study.step(
    "labels", lambda: task.labels(N_LABEL, N_TEST), uses=["TARGET", "DRAFT", "MAX_NEW_TOKENS", "N_LABEL", "N_TEST"]
)
labels = cospec_rl.labels_by_split(label_table)
share = cospec_rl.disagreement_shares(labels)
results.save(share.assign(**meta), f"{NB}/disagreements")
display(share.round(3))
lt = labels["test"]
acc_oracle = cospec_rl.oracle_accuracy(acc_base["target AR"], lt)
label_s = study.summary().set_index("step").computed_s["labels"]
display(Markdown(cospec_rl.disagreement_reading(labels, share, N_LABEL, label_s, acc_base["target AR"], acc_oracle)))

# %% [markdown]
# ## 3 · Rules and classifiers, tuned on validation
# Typical acceptance and the fuzzy rule need no training. The AutoJudge-style classifier (logistic
# regression on the same features) learns which mismatches are *unimportant* — the draft branch's
# answer is as correct as the target's — and keeps the draft there: a speed method. CoSpec's warm
# start learns, from the discordant mismatches only, which branch is the right one.
#
# The rules, in one line each: **typical acceptance** (Medusa) keeps the draft's token when the
# target gives it enough probability relative to the target's own entropy — a confident target
# rejects, an uncertain one accepts; **fuzzy** keeps it when the two models' next-token
# distributions are close (Jensen–Shannon divergence below a threshold T). Both are loosenings of the
# lossless test that trade accuracy for fewer rejections. The two learned policies see the same
# features: both models' probabilities of both candidate tokens, both entropies, the target's margin,
# the divergence, the position in the chain and in the output, and the recent agreement rate.
#
# Validation, not test, picks thresholds and checkpoints: the test split is touched only in
# sections 5–7, so its accuracy is an honest estimate for every method. The table below reports, per
# method on validation, accuracy, target calls per generated token (lower = fewer verify passes), and
# keep rate (share of mismatches where the draft's token was kept).

# %%

saved = study.step("supervised", lambda: task.supervised(labels["train"]), uses=["labels", "SEED"])
pols = cospec.policies_from_table(saved["policies_supervised"])
judge, warm = pols["judge"], pols["warm"]
validated = study.step(
    "validation",
    lambda: task.validation(judge, warm, FUZZY_T, TYPICAL),
    uses=["supervised", "N_VAL", "FUZZY_T", "TYPICAL"],
)
val = validated.set_index("method")[["accuracy", "calls_per_token", "keep_rate"]].to_dict("index")
print(cospec_rl.supervised_reading(saved["supervised_curves"], labels["train"]))
display(pd.DataFrame(val).T.round(3))

# %% [markdown]
# ## 4 · CoSpec: policy gradient with a group baseline
# From the warm start, each iteration samples GROUP trajectories (Bernoulli keep decisions at every
# mismatch) for PROBLEMS_PER_ITER training problems; reward = correct final answer; advantage =
# reward minus the group's mean, over its std. Every EVAL_EVERY iterations the deterministic policy is
# scored on validation; the best checkpoint is kept.
#
# Why reinforcement learning after supervised labels? The rollout labels of section 2 describe one
# decision at a time, along the target's own path, and ignore that decisions interact: keeping one
# draft token changes the text the next mismatch sees. The policy gradient optimises what we care
# about — the final answer of the whole trajectory — under the policy's own decisions. The group
# baseline is what makes this affordable with a tiny budget: the same problem is solved GROUP times
# with random keep decisions, and a trajectory is credited only for doing better than its siblings on
# the *same* problem, so problem difficulty cancels out (a hard problem that every sibling fails gives
# no gradient, rather than a misleading one). Everything is batched through `cospec_rollouts.arbitrate`, so an
# iteration costs a few batched greedy decodes, not PROBLEMS_PER_ITER × GROUP sequential SD runs.
#
# Caveat: the training reward is noisy (PROBLEMS_PER_ITER × GROUP sampled trajectories per
# iteration), and the checkpoint is chosen on validation accuracy among RL_ITERS / EVAL_EVERY
# evaluations — a mild selection effect that the untouched test split in section 5 corrects for.

# %%

saved = study.step(
    "rl",
    lambda: task.rl(warm, val["warm start"], RL_ITERS, PROBLEMS_PER_ITER, GROUP, EVAL_EVERY),
    uses=["supervised", "N_VAL", "RL_ITERS", "PROBLEMS_PER_ITER", "GROUP", "EVAL_EVERY", "SEED"],
)
policy = cospec.policies_from_table(saved["policy_rl"])["CoSpec (RL)"]
curve, val_curve = saved["rl_curve"], saved["rl_validation"]
best = cospec_rl.rl_best(saved["rl_best"])
print(cospec_rl.rl_summary(RL_ITERS, study.summary().set_index("step").computed_s["rl"], best))

# %% [markdown]
# ### The learning curve
# **Question.** Does the policy gradient improve on the warm start, on problems it is not trained on,
# and what does it change in the policy's behaviour?
#
# **How to read it.** Left: x = RL iteration; the thin line is the training reward (share of sampled
# trajectories with a correct answer, a 5-iteration moving average — noisy, and lower than the
# deterministic policy's accuracy because sampling adds random decisions); the dots are the
# deterministic policy's validation accuracy every EVAL_EVERY iterations (iteration 0 = the warm
# start); the dotted line is lossless SD on validation, i.e. the target's own accuracy. Validation dots
# above the dotted line mean the policy beats the target on unseen problems. Right: what the sampled
# policy does — the share of mismatches where it keeps the draft's token, and target calls per
# generated token. A falling keep rate means the policy learns to trust the draft *less often*; if
# accuracy rises at the same time, it is learning *where* to trust it.

# %%

fig = cospec_rl.plot_rl_curve(curve, val_curve, val["lossless"]["accuracy"])
savefig(fig, f"{NB}_rl_curve")
plt.show()
display(Markdown(cospec_rl.rl_reading(curve, val_curve, val, best, RL_ITERS, PROBLEMS_PER_ITER, GROUP)))

# %% [markdown]
# ## 5 · Every method on the held-out test split
# Accuracy with a 95% bootstrap interval, the paired difference to target-only AR (same problems),
# target calls per token, and the share of mismatches sent to the draft.
#
# Why the paired difference: two methods' accuracies on the same 2000 problems are strongly
# correlated — an easy problem is easy for both — so the interval of the *difference*, resampling
# problems, is much narrower than what comparing two separate intervals would suggest. A method beats
# the target reliably when the lower end of `diff_lo` is above zero. Lossless SD must show a
# difference of exactly zero (its greedy output is the target's, token for token): that row is a
# built-in correctness check of the whole pipeline. The fuzzy rule is run at every threshold so that
# its whole accuracy–keep-rate trade-off is visible; for the timed comparison below, one threshold is
# picked on validation.

# %%

fuzzy_best = cospec_rl.best_fuzzy(val, FUZZY_T)  # the one fuzzy threshold timed in section 6
methods = cospec_rl.test_methods(judge, warm, policy, FUZZY_T, TYPICAL)
test_table = study.step("test_rows", lambda: task.test_rows(methods), uses=["rl", "validation", "N_TEST"])
test_rows = {**base, **{name: cospec_rl.rows_of(test_table, name) for name in methods}}
acc = {**acc_base, **{name: task.accuracy(test_rows[name], "test") for name in methods}}
acc["oracle branch choice"] = acc_oracle
table = cospec_rl.accuracy_table(acc, test_rows, SEED)
lossless_same = all(a["tokens"] == b["tokens"] for a, b in zip(test_rows["lossless SD"], test_rows["target AR"]))
display(table.round(3))
print("lossless SD output identical to target AR on every test problem:", lossless_same)

# %% [markdown]
# ## 6 · Wall-clock speed in the real SD loop
# `speclib.generate` with a `ModelDrafter(draft, K)` and the `Arbiter` of each method, on the first
# N_TIMED test problems (target-only and draft-only AR without a drafter); each method's tokens are
# compared with the batched evaluation above.
#
# Accuracy was measured with the batched process because it is cheap; speed has to be measured in
# the real decoding loop, one problem at a time, because that is what a user would run. The
# `same_as_batched` column ties the two together: the share of timed problems whose output from the
# real loop equals the batched one token for token (it should be 1, up to rare numerical ties
# between near-equal logits). Speed is measured the workbook's one way (`bench.paired_runs` with
# target-only AR as the reference, then `bench.speedup_table`; [the statistics
# notes](../docs/statistics.md), notebook 01 section 4): per problem, every method back to back in
# alternating order after one warm-up run each, speedup = median over problems of the method's tokens
# per second over target AR's, with a 95% bootstrap interval over problems and the total-time ratio
# (`total_ratio`) beside it. Tokens per second, not time, because the methods that leave the target's
# output (and the draft alone) generate solutions of other lengths. Only a few methods are timed —
# the others differ from them only in the policy's decisions, which cost microseconds.

# %%

timed = cospec_rl.timed_methods(judge, policy, fuzzy_best, TYPICAL)
saved = study.step(
    "timed", lambda: task.timed(timed, test_rows, N_TIMED, THREADS), uses=["test_rows", "N_TIMED", "THREADS"]
)
table = cospec_rl.with_speed(table, saved["timed_runs"], saved["same_as_batched"], N_TIMED, SEED)
results.save(table.reset_index().assign(n_timed=N_TIMED, **meta), f"{NB}/methods")
display(table[cospec_rl.SHOWN_COLUMNS].round(3))

# %% [markdown]
# ### Accuracy against speed: the trade-off in one picture
# **Question.** Which methods buy accuracy, which buy speed, and does any method beat the target's
# accuracy while running as fast as speculative decoding?
#
# **How to read it.** Each mark is one method on the test split, the same colour and marker in every
# panel (legend below); vertical whiskers are 95% bootstrap intervals of accuracy. The dotted black
# line is the target's own accuracy, the dashed red line the oracle branch choice (an optimistic
# reference, section 2). Left: x = wall-clock speedup over target-only AR in the real SD loop
# (timed methods only; median over problems of the tokens-per-second ratio), so up and to the right is better; target-only AR sits at x = 1 by definition
# and draft-only AR far to the right (fast, inaccurate). Middle: the same for the timed speculative
# methods only, zoomed in, with horizontal whiskers for the speedup's interval — marks whose
# whiskers overlap cannot be told apart in speed. Right: all speculative methods, x = target calls
# per generated token (axis reversed, so again right = less target work); this is the
# machine-independent view of speed, and it includes the methods that were not timed. A mark whose
# whole vertical whisker is above the dotted line beats the target; the speculative methods sit
# close together in x, because they share the drafter and the verify pass and differ only at the
# rare mismatches (mind the scale of the right panel's x axis).

# %%

fig = cospec_rl.plot_pareto(table)
savefig(fig, f"{NB}_pareto")
plt.show()
display(Markdown(cospec_rl.pareto_reading(table)))

# %% [markdown]
# ## 7 · What the policy learned
# Left: P(keep the draft's token) over the target's and the draft's confidence in their own tokens, the
# other features at their median over training mismatches. Right: permutation importance — how much
# the policy's agreement with the better branch on the discordant test mismatches drops when one
# feature is shuffled. Then, on the test runs: how often the policy sent a mismatch to the draft, and
# how often that was right (the draft's branch correct) by the test labels' branch rollouts, for the
# mismatches that lie on the target's own path.
#
# A tiny network is not a black box if it is asked the right questions. The map shows the policy's
# answer on a slice of its input space: the two most natural features, each model's confidence in
# its own token, with everything else held at a typical value. Permutation importance asks the
# complementary question over all features at once, on real test mismatches: shuffle one feature
# across mismatches (destroying its information while keeping its distribution), and see how much
# worse the policy picks the better branch. The last table is the acid test on the decoded test
# runs: of the mismatches where the policy kept the draft's token, how many were ones where that
# token's branch was right and the target's wrong?

# %%

policy_map = cospec_rl.policy_map(policy, cospec_rl.training_arrays(labels["train"])[0])
base_agree, importance = cospec_rl.permutation_importance(policy, lt, SEED)

# %% [markdown]
# ### The learned policy, opened up
# **Question.** When does CoSpec keep the draft's token, and which inputs does its decision rest on?
#
# **How to read it.** Left: a map of the policy's probability of keeping the draft's token (red: keep,
# blue: take the target's; the black line is the 0.5 decision boundary) as a function of the
# target's probability of *its own* token (x) and the draft's probability of *its own* token (y),
# every other feature at its median over training mismatches. Top-left is "the target is unsure, the
# draft is sure"; bottom-right the reverse. A policy that simply trusts the more confident model
# would be red above the diagonal and blue below it; departures from that are what it learned.
# Right: one bar per feature, the drop in the share of discordant test mismatches where the policy
# picks the better branch when that feature is shuffled (the title gives the unshuffled share). Long
# bars are features the decision relies on; bars near zero (or negative, which is noise) are features
# it ignores. One permutation per feature, so small differences between bars are not meaningful.

# %%

fig = cospec_rl.plot_policy(policy_map, importance, base_agree)
savefig(fig, f"{NB}_policy")
plt.show()
display(Markdown(cospec_rl.policy_reading(policy_map, importance, base_agree)))
kept_df = cospec_rl.kept_mismatches(test_rows["CoSpec (RL)"], base["target AR"], lt)
results.save(
    pd.DataFrame(dict(feature=importance.index, importance=importance.values)).assign(**meta), f"{NB}/importance"
)
summary = cospec_rl.kept_summary(kept_df)
display(pd.Series(summary).round(3))
display(Markdown(cospec_rl.kept_reading(summary, share)))

# %% [markdown]
# ## 8 · Verdict
# The performance target: on the held-out test problems CoSpec's accuracy above target-only AR by a
# margin whose 95% CI excludes zero (aim +2 points or more), while at least 1.5x faster than
# target-only AR in wall clock. Every row is reported above, including where CoSpec loses.
#
# The target was fixed before the experiment, and both parts are needed: an accuracy gain that
# costs the speedup would make CoSpec a slower, more accurate decoder (there are simpler ways to get
# that, e.g. a larger model), and a speedup without a gain is what lossless SD already delivers for
# free. The accuracy criterion uses the paired interval's lower end, so "met" means the gain is
# unlikely to be an accident of which test problems were drawn; it says nothing about other tasks or
# model pairs.

# %%

verdict = cospec_rl.verdict_table(table, RL_ITERS, best["iteration"], meta)
results.save(verdict, f"{NB}/verdict")
r = table.loc["CoSpec (RL)"]
speed_goal = verdicts.goal(dict(speedup=r.speedup, lo=r.speed_lo, hi=r.speed_hi), 1.5)
display(Markdown(cospec_rl.verdict_reading(table, speed_goal)))

# %% [markdown]
# ### This run's steps
# Each expensive step, whether this run computed it or read it from saved results (and from which
# commit), and how long it took when it was computed.

# %%
display(study.summary())

# %% [markdown]
# ## What to take away
#
# * **Disagreements carry information.** Section 2 measures how often, at a mismatch, the draft's
#   token is the one that leads to the right answer; the oracle branch choice turns that into an
#   upper reference for any arbitration policy. If that share were negligible, no policy could help.
# * **Loosening acceptance is not the same as arbitrating.** Typical acceptance, fuzzy thresholds and
#   the AutoJudge classifier keep the draft where it is *harmless* or *likely*; CoSpec is trained to
#   keep it where it is *better*. The test table shows what each of these buys and costs in accuracy.
# * **Speed is nearly fixed by the pair.** All speculative methods share the drafter, K and the
#   verify pass, and mismatches are a small share of positions, so their wall-clock speedups can
#   only differ a little (section 6 measures how little); the choice between them is about accuracy.
# * **The guarantee is gone.** Unlike every other notebook, the output is no longer the target's;
#   the comparison is only meaningful on tasks with a checkable answer, and a policy trained on one
#   task and pair must be re-validated before use on another.
#
# Caveats: one seed, one synthetic task with exact answers, small models, labels from greedy
# rollouts along the target's path only, a short RL run with checkpoint selection on validation, and
# wall-clock speed on `N_TIMED` problems on a CPU.


# %% [markdown]
# ## Exercises
#
# Run from the repository root. A run with changed parameters writes under
# `build/unpublished/04_cospec_rl/<hash>/` and recomputes only the steps that use the changed
# parameters (and those that read their results). Predict before running.
#
# 1. **Longer training.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/04_cospec_rl.ipynb build/04_rl.ipynb -p RL_ITERS 120
#    ```
#
#    The baselines, rollouts and supervised policies are reused; RL and everything after it is
#    recomputed. *Look for:* whether the best validation checkpoint moves later and whether test
#    accuracy moves beyond its interval. *Why:* with a few thousand mismatches to learn from and a
#    reward that is one bit per solution, the gradient is noisy; more iterations help only if the
#    signal, not the noise, was the limit.
#
# 2. **A longer draft.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/04_cospec_rl.ipynb build/04_k.ipynb -p K 8
#    ```
#
#    Everything is recomputed (K changes every decoding). *Look for:* lossless SD's speed, and
#    whether keeping the draft's token at mismatches now buys speed as well as accuracy. *Why:* with
#    longer drafts each rejection throws away more drafted tokens, so a policy that keeps the draft's
#    token at a mismatch also saves verify passes.
#
# 3. **Fewer labels for the warm start.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/04_cospec_rl.ipynb build/04_labels.ipynb -p N_LABEL 200
#    ```
#
#    *Look for:* the AutoJudge classifier and the warm start on validation, and how much RL recovers.
#    *Why:* supervised learning needs the rare draft-right mismatches as examples; RL learns from the
#    final reward on any problem, so it depends less on them.
#
# 4. **Stricter fuzzy thresholds.**
#
#    ```bash
#    .venv/bin/python -m speclib notebooks notebooks/04_cospec_rl.ipynb build/04_fuzzy.ipynb -p FUZZY_T "[0.01, 0.02, 0.05]"
#    ```
#
#    The rollouts, the supervised policies and RL are reused; validation, the test decoding and the
#    timed runs are recomputed. *Look for:* the fuzzy rule's keep rate falling towards zero and its accuracy converging to lossless
#    SD's. *Why:* a JSD threshold keeps the draft's token only where the two distributions are close;
#    as it shrinks the rule becomes the lossless one.
