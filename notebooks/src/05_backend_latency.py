# %% [markdown]
# # 05 · Why speculation wins on one backend and loses on another
#
# **Question.** Speculative decoding assumes that verifying K + 1 tokens in one pass costs about as
# much as generating one. Whether that holds is a property of the runtime — its kernels, its
# quantization, its per-call overhead — not of the model. Given two short measurements on your
# machine, can you predict whether speculation will pay, and when it does not, say why?
#
# **Method.** The same shipped pair (`code-target`, 27M parameters; `code-draft`, 1.6M) runs behind
# the same extend/commit protocol on several runtimes (`speclib.load(name, backend=...)`): torch eager
# fp32, bf16, dynamic int8 and `torch.compile`; ONNX Runtime fp32 and int8 (our own export, KV cache
# in and out); llama.cpp on GGUF files written from the checkpoints (f16, q8_0, q4_0); and `SerialLM`,
# a wrapper that verifies n tokens as n one-token passes — the "parallel pass that is not parallel"
# built on purpose. We time one pass over n = 1..16 new tokens at a cached prefix of 128 and 512
# tokens, then run greedy speculative decoding end to end for several draft/target backend pairings
# (mixing runtimes, as the seed study did) and put each measured speedup beside the analytic model
#
#     speedup(K) = E(α, K) / (K·c + v(K)),   E = (1 − α^{K+1}) / (1 − α),   v(K) = T_target(K+1) / T_target(1),
#
# with α the per-token acceptance, c = T_draft(1) / T_target(1), all measured in this run.
# Every timing is a median over repeats after warm-up, cases interleaved round-robin so machine noise
# hits them alike; the end-to-end speedups are ratios of total times over the same prompts with
# paired bootstrap intervals.

# %%
SMOKE = False           # True: tiny sizes, the whole notebook in under ~2 minutes on 2 CPU cores
SEED = 0
DEVICE = "auto"         # torch backends: auto = cuda, then mps, then cpu
TARGET = "code-target"
DRAFT = "code-draft"
BACKENDS = ["torch", "torch-bf16", "torch-int8", "torch-compile", "onnx", "onnx-int8",
            "llamacpp-f16", "llamacpp-q8_0", "llamacpp-q4_0", "serial:torch"]
# (target backend, draft backend) pairings for end-to-end decoding
CONFIGS = [["torch", "torch"], ["onnx", "llamacpp-q8_0"], ["onnx-int8", "onnx-int8"], ["torch-int8", "torch-int8"],
           ["torch-bf16", "torch-bf16"], ["llamacpp-f16", "llamacpp-q8_0"], ["llamacpp-q4_0", "llamacpp-q4_0"],
           ["llamacpp-q4_0", "torch"], ["serial:torch", "llamacpp-q8_0"]]
N_MAX = 16              # tokens per pass, 1..N_MAX
PREFIXES = [128, 512]   # cached prefix lengths
REPEATS = 20            # timed passes per case (after 5 warm-up passes)
K_MAX = 8               # draft lengths 1..K_MAX
N_PROMPTS = 12          # held-out stdlib prompts for end-to-end decoding
MAX_NEW_TOKENS = 128
THREADS = 2             # every runtime gets the same number of CPU threads

# %%
import time

import numpy as np
import pandas as pd
import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display
from tqdm.auto import tqdm

import speclib
from speclib import ModelDrafter, Sampling, backends, bench, data, generate, results, stats
from speclib.backends import SerialLM
from speclib.plotting import savefig, style

if SMOKE:
    BACKENDS = ["torch", "torch-int8", "onnx-int8", "llamacpp-q4_0", "serial:torch"]
    CONFIGS = [["torch", "torch"], ["onnx-int8", "onnx-int8"], ["llamacpp-q4_0", "llamacpp-q4_0"],
               ["serial:torch", "torch"]]
    N_MAX, PREFIXES, REPEATS, K_MAX, N_PROMPTS, MAX_NEW_TOKENS = 4, [128], 3, 3, 2, 24
NB = "05_backend_latency"
KS, NS = list(range(1, K_MAX + 1)), list(range(1, N_MAX + 1))
GREEDY = Sampling(0.0)
style()
torch.manual_seed(SEED)
torch.set_num_threads(THREADS)


def runtime(name):
    return name.split(":")[-1]


skipped = {}
for name in dict.fromkeys(BACKENDS + [b for cfg in CONFIGS for b in cfg]):
    if runtime(name) not in backends.BACKENDS:
        raise ValueError(f"unknown backend {name!r}; the backends are:\n{backends.describe()}")
    if backends.missing(runtime(name)):
        skipped[name] = f"not installed ({backends.BACKENDS[runtime(name)].install})"
if skipped:
    print("skipped backends:", skipped)
BACKENDS = [b for b in BACKENDS if b not in skipped]
CONFIGS = [cfg for cfg in CONFIGS if not set(cfg) & set(skipped)]
_lms = {}


def lm(model, name):
    """The LM of `model` on backend `name` ("serial:X" = SerialLM over backend X), loaded once."""
    if (model, name) not in _lms:
        rt = runtime(name)
        dev = DEVICE if rt in ("torch", "torch-bf16", "torch-compile") else "cpu"
        base = speclib.load(model, device=dev, backend=rt)
        _lms[model, name] = SerialLM(base) if name.startswith("serial:") else base
    return _lms[model, name]


t0 = time.perf_counter()
for name in BACKENDS:
    lm(TARGET, name), lm(DRAFT, name)
dev = str(lm(TARGET, "torch").device)
meta = dict(seed=SEED, device=dev, target=TARGET, draft=DRAFT, threads=THREADS, smoke=SMOKE)
display(pd.DataFrame([dict(backend=b.name, runtime=b.about, trees=b.trees,
                           used="skipped: " + skipped[b.name] if b.name in skipped else ("yes" if b.name in BACKENDS else "no"))
                      for b in backends.BACKENDS.values()]))
print(f"loaded {len(_lms)} model/backend pairs in {time.perf_counter() - t0:.0f} s (exports cached under build/backends/); device {dev}")

# %% [markdown]
# ## 1 · One pass over n tokens: T(n) / T(1) per backend
# For each backend, model and prefix length: the median time of one `extend` that scores n new chain
# tokens over a cached prefix (random tokens; the time does not depend on which), each backend timed on
# its own (the n = 1..N_MAX cases interleaved). A backend is
# **parallel** when T(n)/T(1) stays near 1 (the pass is bound by reading the weights, or by per-call
# overhead, and extra tokens ride along), **serial** when it grows about linearly (each extra token
# costs about as much as a whole pass). A sudden step between n and n + 1 marks a kernel switch
# (e.g. matrix–vector to matrix–matrix).

# %%
lat_rows = []
for model in [TARGET, DRAFT]:
    for b in tqdm(BACKENDS, desc=model):
        for pre in PREFIXES:      # one backend at a time: see section 3 for what interleaving runtimes costs
            secs = bench.latencies([(lm(model, b), n) for n in NS], prefix_len=pre, repeats=REPEATS, warmup=5)
            lat_rows += [dict(model=model, role="target" if model == TARGET else "draft", backend=b, prefix=pre, n=n,
                              seconds=s) for n, s in zip(NS, secs)]
lat = pd.DataFrame(lat_rows)
lat["ratio"] = lat.seconds / lat.groupby(["model", "backend", "prefix"]).seconds.transform("first")
results.save(lat.assign(**meta), f"{NB}/latency")


def classify(g):
    """Least-squares slope of T(n)/T(1) over n, the ratio at N_MAX, and the largest single step."""
    g = g.sort_values("n")
    slope = np.polyfit(g.n, g.ratio, 1)[0]
    steps = g.ratio.to_numpy()[1:] / g.ratio.to_numpy()[:-1] - 1
    j = int(np.argmax(steps)) if len(steps) else 0
    kind = "serial" if slope > 0.6 else ("parallel" if g.ratio.iloc[-1] < 2 else "partly parallel")
    return pd.Series(dict(T1_ms=g.seconds.iloc[0] * 1e3, ratio_at_max=g.ratio.iloc[-1], slope=slope, kind=kind,
                          biggest_step=f"{g.n.iloc[j]}→{g.n.iloc[j] + 1}: +{steps[j]:.0%}" if len(steps) else ""))


shape = lat.groupby(["role", "backend", "prefix"], sort=False).apply(classify, include_groups=False).reset_index()
results.save(shape.assign(**meta), f"{NB}/classes")
display(shape.round(3))

fig, axes = plt.subplots(len(PREFIXES), 2, figsize=(11, 3.6 * len(PREFIXES)), squeeze=False, sharey=True)
colors = dict(zip(BACKENDS, plt.cm.tab10(np.linspace(0, 1, 10))))
for i, pre in enumerate(PREFIXES):
    for j, role in enumerate(["target", "draft"]):
        ax = axes[i, j]
        for b, g in lat[(lat.prefix == pre) & (lat.role == role)].groupby("backend", sort=False):
            ax.plot(g.n, g.ratio, marker="o", ms=3, color=colors[b], label=b,
                    ls="--" if b.startswith("serial") else "-")
        ax.plot(NS, NS, color="grey", lw=0.8, ls=":", label="T(n) = n·T(1)")
        ax.set_ylim(0.8, min(N_MAX, 8) + 0.2)
        ax.set(title=f"{role} ({TARGET if role == 'target' else DRAFT}), prefix {pre}", ylabel="T(n) / T(1)",
               xlabel="tokens per pass n" if i == len(PREFIXES) - 1 else "")
axes[0, 1].legend(fontsize=7, ncol=2)
fig.tight_layout()
savefig(fig, f"{NB}_latency"); plt.show()

# %%
t = shape[(shape.role == "target") & (shape.prefix == PREFIXES[0])].set_index("backend")
flat = t[t.kind == "parallel"].index.tolist()
steep = t.sort_values("ratio_at_max").index.tolist()[::-1][:3]
fastest = t.T1_ms.idxmin()
display(Markdown(
    f"At a {PREFIXES[0]}-token prefix the target's one-token pass takes from {t.T1_ms.min():.2f} ms ({fastest}) to "
    f"{t.T1_ms.max():.2f} ms ({t.T1_ms.idxmax()}). Parallel (T({N_MAX})/T(1) < 2): {', '.join(flat) or 'none'}. "
    f"Steepest: " + "; ".join(f"{b} T({N_MAX})/T(1) = {t.ratio_at_max[b]:.2f}, slope {t.slope[b]:.2f}, biggest step "
                              f"{t.biggest_step[b]}" for b in steep) + ". "
    f"The fastest one-token runtime is not the flattest: a backend that is quick at n = 1 because its matrix–vector "
    f"kernel is tuned for decoding can lose most of that edge once n > 1 switches it to a general matrix multiply."))

# %% [markdown]
# ### Does the width of a pass change the numbers?
# Speculation is lossless in exact arithmetic, but a verify pass over K + 1 tokens is a different
# computation from K + 1 one-token passes: sums in another order, and for dynamic int8 activation
# scales computed over the whole pass. Here: the largest logit difference between one 8-token pass and
# eight one-token passes (`SerialLM`) on the same backend, over a 128-token prefix, and how often the
# greedy token differs.

# %%
gen = torch.Generator().manual_seed(SEED)
prefix = torch.randint(0, 4096, (128,), generator=gen).tolist()
toks = torch.randint(0, 4096, (8,), generator=gen).tolist()
width = []
for b in [b for b in BACKENDS if not b.startswith("serial")]:
    m = lm(TARGET, b)
    m.reset(prefix)
    wide = m.extend(toks, list(range(-1, 7))).float()
    m.reset(prefix)
    narrow = SerialLM(m).extend(toks, list(range(-1, 7))).float()
    width.append(dict(backend=b, max_abs_diff=(wide - narrow).abs().max().item(),
                      argmax_differs=(wide.argmax(-1) != narrow.argmax(-1)).float().mean().item()))
width = pd.DataFrame(width)
results.save(width.assign(**meta), f"{NB}/width")
display(width)

# %% [markdown]
# ## 2 · End to end: predicted vs measured speedup per configuration
# Each configuration pairs a target backend with a draft backend. Per configuration, side by side:
# c and v(K) (one-token and (K+1)-token passes at a 128-token prefix, interleaved); then greedy AR on
# the target backend and greedy SD at K = 1..K_MAX on the same held-out prompts. α is the per-token
# acceptance (accepted / reached draft positions), the estimate the analytic model assumes. Each SD
# output is compared with the same target backend's own AR output.

# %%
prompt_rows = data.load_workload("code_stdlib", N_PROMPTS)
prompts = [lm(TARGET, "torch").encode(r["prompt"]) for r in prompt_rows]
e2e, prof_rows = [], []
for tb, db in tqdm(CONFIGS, desc="configurations"):
    target, draft = lm(TARGET, tb), lm(DRAFT, db)
    cfg = f"{tb} ← {db}"
    prof = bench.cost_profile(target, draft, KS, prefix_len=128, repeats=REPEATS)
    prof_rows += [dict(config=cfg, target_backend=tb, draft_backend=db, K=k, c=prof["c"], v=prof["v"][k],
                       target_1_ms=prof["target_1"] * 1e3, draft_1_ms=prof["draft_1"] * 1e3) for k in KS]
    generate(target, prompts[0], 8, drafter=ModelDrafter(draft, 2), sampling=GREEDY)       # warm-up
    for pi, ids in enumerate(prompts):
        ar = generate(target, ids, MAX_NEW_TOKENS, sampling=GREEDY)
        e2e.append(dict(config=cfg, prompt=pi, K=0, seconds=ar.stats["seconds"], new_tokens=len(ar.tokens),
                        reached=0, accepted=0, target_calls=len(ar.stats["steps"]), identical=True))
        for k in KS:
            sd = generate(target, ids, MAX_NEW_TOKENS, drafter=ModelDrafter(draft, k), sampling=GREEDY)
            reached, accepted = bench.position_counts(sd.stats["steps"], k)
            e2e.append(dict(config=cfg, prompt=pi, K=k, seconds=sd.stats["seconds"], new_tokens=len(sd.tokens),
                            reached=int(reached.sum()), accepted=int(accepted.sum()),
                            target_calls=len(sd.stats["steps"]), identical=sd.tokens == ar.tokens))
e2e, profile = pd.DataFrame(e2e), pd.DataFrame(prof_rows)
results.save(e2e.assign(**meta), f"{NB}/runs")

rows = []
for cfg, g in e2e.groupby("config", sort=False):
    ar = g[g.K == 0].set_index("prompt")
    for k in KS:
        sd = g[g.K == k].set_index("prompt").loc[ar.index]
        est, lo, hi = stats.bootstrap_ratio_ci(ar.seconds.to_numpy(), sd.seconds.to_numpy(), stat=np.sum, seed=SEED)
        p = profile[(profile.config == cfg) & (profile.K == k)].iloc[0]
        alpha = sd.accepted.sum() / max(sd.reached.sum(), 1)
        rows.append(dict(config=cfg, target_backend=p.target_backend, draft_backend=p.draft_backend, K=k,
                         speedup=est, lo=lo, hi=hi, alpha=alpha, c=p.c, v=p.v,
                         predicted=bench.predicted_speedup(alpha, k, p.c, p.v),
                         predicted_v1=bench.predicted_speedup(alpha, k, p.c, 1.0),
                         predicted_c0=bench.predicted_speedup(alpha, k, 0.0, p.v),
                         tokens_per_call=sd.new_tokens.sum() / sd.target_calls.sum(),
                         identical=int(sd.identical.sum()), of=len(sd),
                         target_1_ms=p.target_1_ms, draft_1_ms=p.draft_1_ms))
speed = pd.DataFrame(rows)
results.save(speed.assign(**meta), f"{NB}/speedup")
best = speed.loc[speed.groupby("config", sort=False).speedup.idxmax()].reset_index(drop=True)
display(best[["config", "K", "speedup", "lo", "hi", "predicted", "alpha", "c", "v", "tokens_per_call",
              "identical", "of"]].round(3))

cfgs = list(speed.config.unique())
cols = min(3, len(cfgs))
fig, axes = plt.subplots(-(-len(cfgs) // cols), cols, figsize=(4.2 * cols, 3.2 * -(-len(cfgs) // cols)),
                         squeeze=False, sharex=True)
for ax, cfg in zip(axes.flat, cfgs):
    g = speed[speed.config == cfg]
    ax.errorbar(g.K, g.speedup, yerr=[g.speedup - g.lo, g.hi - g.speedup], marker="o", ms=4, capsize=2, label="measured")
    ax.plot(g.K, g.predicted, marker="s", ms=3, ls="--", label="analytic, measured v(K)")
    ax.plot(g.K, g.predicted_v1, ls=":", color="grey", label="analytic, v = 1")
    ax.axhline(1, color="black", lw=0.7)
    ax.set_title(cfg, fontsize=9)
    ax.set(xlabel="K", ylabel="speedup over AR")
for ax in list(axes.flat)[len(cfgs):]:
    ax.axis("off")
axes.flat[0].legend(fontsize=7)
savefig(fig, f"{NB}_predicted_vs_measured"); plt.show()

# %%
err = (speed.speedup / speed.predicted - 1).abs()
top = best.sort_values("speedup", ascending=False).iloc[0]
display(Markdown(
    f"Best configuration: **{top.config}**, **{top.speedup:.2f}x** at K = {int(top.K)} (95% CI {top.lo:.2f}–{top.hi:.2f}; "
    f"analytic {top.predicted:.2f}x with α = {top.alpha:.2f}, c = {top.c:.3f}, v = {top.v:.2f}). "
    f"{int((best.speedup < 1).sum())} of {len(best)} configurations decelerate at every K. Across all "
    f"{len(speed)} (configuration, K) points the analytic model is within {err.median():.0%} of the measured speedup "
    f"at the median ({err.quantile(0.9):.0%} at the 90th percentile); the v = 1 curve (Leviathan et al.) "
    f"over-predicts wherever verification is not flat."))

# %% [markdown]
# ## 3 · Which cause dominates where speculation loses?
# The analytic denominator K·c + v(K) splits the cost of one SD step into drafting (K·c target-passes'
# worth) and verification (v(K), of which v(K) − 1 is the excess over a one-token pass). For every
# configuration, at its best K: the predicted speedup if verification were flat (v = 1) and if drafting
# were free (c = 0). The larger gain names the dominant cause.

# %%
cause = best.copy()
alone = lat[(lat.prefix == 128) & (lat.n == 1)].set_index(["role", "backend"]).seconds * 1e3
cause["target_1_alone_ms"] = [alone.get(("target", b), np.nan) for b in cause.target_backend]
cause["draft_1_alone_ms"] = [alone.get(("draft", b), np.nan) for b in cause.draft_backend]
cause["c_alone"] = cause.draft_1_alone_ms / cause.target_1_alone_ms
cause["draft_cost"] = cause.K * cause.c
cause["verify_excess"] = cause.v - 1
cause["dominant_cause"] = np.where(cause.draft_cost > cause.verify_excess, "draft too slow relative to target",
                                   "verification not parallel")
cause["decelerates"] = cause.speedup < 1
results.save(cause.assign(**meta), f"{NB}/causes")
display(cause[["config", "K", "speedup", "decelerates", "c", "c_alone", "draft_cost", "v", "verify_excess", "predicted",
               "predicted_v1", "predicted_c0", "dominant_cause"]].round(3))
worst = cause.assign(inflation=cause.c / cause.c_alone).sort_values("inflation").iloc[-1]
slow = cause[cause.decelerates]
display(Markdown(
    (("Decelerating: " + "; ".join(
        f"**{r.config}** ({r.speedup:.2f}x at K = {int(r.K)}): {r.dominant_cause} — drafting costs K·c = "
        f"{r.draft_cost:.2f} target passes, verification v = {r.v:.2f}; flat verification would give "
        f"{r.predicted_v1:.2f}x, free drafting {r.predicted_c0:.2f}x" for r in slow.itertuples()) + ".")
    if len(slow) else "No configuration decelerates at its best K.") +
    f" A hidden cost of alternating two models, each with its own worker threads: c is measured with the two "
    f"interleaved, as SD runs them; each "
    f"timed alone (section 1) gives `c_alone`. The largest gap is **{worst.config}**: c = {worst.c:.3f} "
    f"interleaved vs {worst.c_alone:.3f} alone (one-token passes {worst.target_1_ms:.2f} / {worst.draft_1_ms:.2f} ms "
    f"vs {worst.target_1_alone_ms:.2f} / {worst.draft_1_alone_ms:.2f} ms alone). Part of such a gap is idle worker "
    f"threads that keep spinning after a pass and take the cores from the other model's pool: with ONNX Runtime's "
    f"default spinning, a llama.cpp draft pass right after an ORT target pass took 2.7 ms instead of 0.24 ms, so the "
    f"ORT sessions here are built with spinning off (that brought it to about 0.5 ms). The rest — caches refilled "
    f"with the other model's weights, sleeping threads woken — this notebook does not separate. torch's OpenMP pool "
    f"and llama.cpp's are left as shipped: OMP_WAIT_POLICY=PASSIVE made every runtime slower (a llama.cpp q4_0 target "
    f"pass 1.1 -> 5.8 ms)."))

# %% [markdown]
# ## 4 · Break-even map
# Where in (α, c) does speculation win at all? For each target backend's measured v(K) (prefix 128),
# the curve is the boundary max_K E(α, K) / (K·c + v(K)) = 1: below and right of it speculation wins.
# Points are the configurations' measured (α, c), coloured by their target backend.

# %%
alphas, cs = np.linspace(0.05, 0.98, 120), np.logspace(-2.3, 0, 120)
A, C = np.meshgrid(alphas, cs)
tv = lat[(lat.role == "target") & (lat.prefix == PREFIXES[0])]
fig, ax = plt.subplots(figsize=(7, 4.6))
be_rows = []
for b, g in tv.groupby("backend", sort=False):
    v = g.set_index("n").ratio
    best_s = np.max([(1 - A ** (k + 1)) / (1 - A) / (k * C + v[k + 1]) for k in KS if k + 1 in v.index], axis=0)
    cs_ = ax.contour(A, C, best_s, levels=[1.0], colors=[colors[b]], linewidths=1.4,
                     linestyles="--" if b.startswith("serial") else "-")
    ax.plot([], [], color=colors[b], label=b, ls="--" if b.startswith("serial") else "-")
    for a in (0.5, 0.7, 0.9):          # the largest c at which speculation still wins, per α
        col = best_s[:, np.argmin(np.abs(alphas - a))]
        be_rows.append(dict(backend=b, alpha=a, max_c=float(cs[col > 1].max()) if (col > 1).any() else 0.0))
for r in best.itertuples():
    ax.scatter(r.alpha, r.c, color=colors.get(r.target_backend, "k"), edgecolor="black", zorder=3,
               marker="o" if r.speedup >= 1 else "X", s=50)
ax.set(xscale="linear", yscale="log", xlabel="per-token acceptance α", ylabel="cost ratio c = T_draft(1) / T_target(1)",
       title="speculation wins below each curve (o = measured win, x = measured loss)")
ax.legend(fontsize=7, ncol=2, loc="upper left")
savefig(fig, f"{NB}_break_even"); plt.show()
breakeven = pd.DataFrame(be_rows)
results.save(breakeven.assign(**meta), f"{NB}/break_even")
display(breakeven.pivot(index="backend", columns="alpha", values="max_c").round(3))

# %% [markdown]
# ## 5 · Output agreement
# Greedy SD should reproduce the target's greedy AR output token for token. On an fp32 backend it does
# up to ties broken by rounding; on a quantized backend the verify pass over K + 1 tokens can compute a
# different logit from the one-token AR pass (section 1's width check), and a near-tie can flip.

# %%
agree = speed.groupby(["config", "target_backend"], sort=False).agg(identical=("identical", "sum"), of=("of", "sum")).reset_index()
agree = agree.merge(width.rename(columns={"backend": "target_backend"}), on="target_backend", how="left")
agree["agreement"] = agree.identical / agree["of"]
results.save(agree.assign(**meta), f"{NB}/agreement")
display(agree.round(4))
display(Markdown("; ".join(f"{r.config}: SD = AR on {r.identical} / {r.of} runs" + (
    f" (8-token vs one-token passes: max |Δ logit| {r.max_abs_diff:.2g})" if r.max_abs_diff == r.max_abs_diff else "")
    for r in agree.itertuples()) + "."))

# %% [markdown]
# ## 6 · Beside the seed study
# The seed study ran five draft/target backend configurations: the best reached 1.61x at K = 6, and three
# of five decelerated.

# %%
seed_tbl = pd.DataFrame([
    dict(study="seed", best_config="(not named)", best_speedup=1.61, best_K=6, decelerating="3 of 5"),
    dict(study="speclib (this run)", best_config=top.config, best_speedup=round(top.speedup, 2), best_K=int(top.K),
         decelerating=f"{int((best.speedup < 1).sum())} of {len(best)}: " + ", ".join(best[best.speedup < 1].config)),
])
results.save(seed_tbl.assign(**meta), f"{NB}/seed_comparison")
display(seed_tbl)
