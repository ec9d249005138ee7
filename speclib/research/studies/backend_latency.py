"""Notebook 05 (backend latency): one model pair on several runtimes. The runtimes that can run here, the
steps that time them (one pass over n tokens, the width check, threads, end-to-end runs per configuration)
and the tables, figures and prose the notebook builds from those steps."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from speclib.core import device as core_device
from speclib.lms import backends
from speclib.lms.backends import SerialLM
from speclib.lms.loading import load
from speclib.research import bench

SMOKE_BACKENDS = ["torch", "torch-int8", "onnx-int8", "llamacpp-q4_0", "serial:torch"]
SMOKE_CONFIGS = [
    ["torch", "torch"],
    ["onnx-int8", "onnx-int8"],
    ["llamacpp-q4_0", "llamacpp-q4_0"],
    ["serial:torch", "torch"],
]
# the torch runtimes place the model on DEVICE; the others run on the CPU only
ON_DEVICE = ("torch", "torch-bf16", "torch-compile")
WIDTH = 8  # tokens of the width check's wide pass
BEST_COLUMNS = [
    "config",
    "K",
    "speedup",
    "lo",
    "hi",
    "total_ratio",
    "spread_lo",
    "spread_hi",
    "predicted",
    "predicted_loop",
    "alpha",
    "c",
    "v",
    "c_loop",
    "v_loop",
    "tokens_per_call",
    "identical",
    "of",
]
CAUSE_COLUMNS = [
    "config",
    "K",
    "speedup",
    "decelerates",
    "c",
    "c_alone",
    "c_loop",
    "draft_cost",
    "v",
    "v_loop",
    "verify_excess",
    "predicted",
    "predicted_v1",
    "predicted_c0",
    "dominant_cause",
]
# notebook 01's saved speedup table must have these columns to be compared with
NEED_01 = ["mode", "split", "K", "speedup", "lo", "hi", "chosen", "c", "v", "token_acceptance"]
BREAK_EVEN_ALPHAS = (0.5, 0.7, 0.9)  # the acceptances at which the break-even table reads the map


def runtime(name: str) -> str:
    """The runtime under backend `name` ("serial:X" wraps runtime X)."""
    return name.split(":")[-1]


def smoke_backends(names: list[str]) -> tuple[list[str], list[list[str]]]:
    """SMOKE's backends (one per runtime family, among `names`) and the configurations they can run."""
    kept = [b for b in SMOKE_BACKENDS if b in names]
    return kept, [c for c in SMOKE_CONFIGS if set(c) <= set(kept)]


def backend_names(names: list[str], configs: list[list[str]]) -> list[str]:
    """Every backend named by `names` or a configuration, once, in order of first mention."""
    return list(dict.fromkeys(names + [b for cfg in configs for b in cfg]))


class Runtimes:
    """The target and draft on each backend, loaded once when first needed. The torch backends run on
    `device`, every other one on the CPU; `kinds` is each model's architecture, read from its torch load."""

    def __init__(self, target: str, draft: str, device: str = "auto"):
        self.target, self.draft, self.device = target, draft, device
        self._lms: dict = {}
        self.kinds: dict = {}
        self.kinds = {m: self.lm(m, "torch").model.config.model_type for m in (target, draft)}

    def lm(self, model: str, name: str):
        """The LM of `model` on backend `name` ("serial:X" = SerialLM over backend X), loaded once."""
        if (model, name) not in self._lms:
            self.require([name])
            rt = runtime(name)
            dev = self.device if rt in ON_DEVICE else "cpu"
            base = load(model, device=dev, backend=rt)
            self._lms[model, name] = SerialLM(base) if name.startswith("serial:") else base
        return self._lms[model, name]

    def unavailable(self, name: str) -> str | None:
        """Why backend `name` cannot run this pair on this machine, or None when it can. Every runtime but
        stock torch runs speclib's own Llama forward (exported, quantized or compiled), so a pair of other
        checkpoints (Qwen3, Mistral, a hybrid, ...) can be measured on "torch" and "serial:torch" only."""
        rt = runtime(name)
        if backends.missing(rt):
            return f"not installed (install it with: {backends.BACKENDS[rt].install})"
        if rt != "torch" and set(self.kinds.values()) != {"llama"}:
            return f"needs a Llama checkpoint; the pair is {self.kinds}"
        return None

    def require(self, names) -> None:
        """Stop before a step computes anything when one of the backends it needs cannot run here."""
        bad = {b: why for b in dict.fromkeys(names) if (why := self.unavailable(b))}
        if bad:
            raise ValueError(
                "; ".join(f"backend {b!r}: {why}" for b, why in bad.items()) + ". Install what is missing, "
                "or run with -p SKIP_MISSING True to drop the backends that cannot run here (that run's "
                "BACKENDS and CONFIGS are then not the shipped ones, so it writes under build/unpublished/)."
            )


def plan(
    target: str,
    draft: str,
    device: str,
    names: list[str],
    configs: list[list[str]],
    skip_missing: bool,
    mode: str,
) -> tuple[Runtimes, list[str], list[list[str]], dict]:
    """Decide what runs, before the Study records the parameters: the runtimes, the backends and
    configurations kept, and {backend: why} for those that cannot run here.

    A backend that is not installed, or that cannot run this model pair, is an error unless `skip_missing`
    drops it from `names` and `configs`. A run whose every step is read back from saved results loads no
    backend but torch, so it only warns; a step that has to compute calls `require` first and stops before
    timing anything."""
    every = backend_names(names, configs)
    for name in every:
        if runtime(name) not in backends.BACKENDS:
            raise ValueError(f"unknown backend {name!r}; the backends are:\n{backends.describe()}")
    rts = Runtimes(target, draft, device)
    skipped = {b: why for b in every if (why := rts.unavailable(b))}
    if skipped and skip_missing:
        print(
            "SKIP_MISSING: dropped from BACKENDS and CONFIGS, not measured in this run:\n"
            + "\n".join(f"  {b}: {why}" for b, why in skipped.items())
        )
        names = [b for b in names if b not in skipped]
        configs = [cfg for cfg in configs if not set(cfg) & set(skipped)]
        if not configs:
            raise ValueError("SKIP_MISSING dropped every configuration of CONFIGS: nothing left to run end to end")
    elif skipped and mode == "recompute":
        rts.require(skipped)
    elif skipped:
        print(
            "NOTE: backends that cannot run here: "
            + "; ".join(f"{b}: {why}" for b, why in skipped.items())
            + ". The steps that use them are read from saved results; a step that has to compute stops with an "
            "error (SKIP_MISSING = True drops them instead)."
        )
    return rts, names, configs, skipped


def backend_table(used: list[str], skipped: dict, skip_missing: bool) -> pd.DataFrame:
    """Every backend speclib knows, what runs it, whether it drafts trees, and whether this run uses it."""
    return pd.DataFrame(
        [
            dict(
                backend=b.name,
                runtime=b.about,
                trees=b.trees,
                used=("skipped: " if skip_missing else "not available here: ") + skipped[b.name]
                if b.name in skipped
                else ("yes" if b.name in used else "no"),
            )
            for b in backends.BACKENDS.values()
        ]
    )


# ---- section 1: one pass over n tokens


def pass_latencies(rts: Runtimes, names, ns, prefixes, repeats, meta) -> pd.DataFrame:
    """Step "latency": the median time of one pass over n = `ns` new tokens, per model, backend and prefix,
    and its ratio to the one-token pass."""
    rts.require(names)
    lat_rows = []
    for model in [rts.target, rts.draft]:
        for b in tqdm(names, desc=model):
            for pre in prefixes:  # one backend at a time: see section 3 for what interleaving runtimes costs
                secs = bench.latencies([(rts.lm(model, b), n) for n in ns], prefix_len=pre, repeats=repeats, warmup=5)
                lat_rows += [
                    dict(
                        model=model,
                        role="target" if model == rts.target else "draft",
                        backend=b,
                        prefix=pre,
                        n=n,
                        seconds=s,
                    )
                    for n, s in zip(ns, secs)
                ]
    lat = pd.DataFrame(lat_rows)
    lat["ratio"] = lat.seconds / lat.groupby(["model", "backend", "prefix"]).seconds.transform("first")
    return lat.assign(**meta)


def classify(g: pd.DataFrame) -> pd.Series:
    """Least-squares slope of T(n)/T(1) over n, the ratio at the largest n, and the largest single step."""
    g = g.sort_values("n")
    slope = np.polyfit(g.n, g.ratio, 1)[0]
    steps = g.ratio.to_numpy()[1:] / g.ratio.to_numpy()[:-1] - 1
    j = int(np.argmax(steps)) if len(steps) else 0
    kind = "serial" if slope > 0.6 else ("parallel" if g.ratio.iloc[-1] < 2 else "partly parallel")
    return pd.Series(
        dict(
            T1_ms=g.seconds.iloc[0] * 1e3,
            ratio_at_max=g.ratio.iloc[-1],
            slope=slope,
            kind=kind,
            biggest_step=f"{g.n.iloc[j]}→{g.n.iloc[j] + 1}: +{steps[j]:.0%}" if len(steps) else "",
        )
    )


def latency_shapes(lat: pd.DataFrame) -> pd.DataFrame:
    """`classify` per (role, backend, prefix): the table above section 1's figure."""
    return lat.groupby(["role", "backend", "prefix"], sort=False).apply(classify, include_groups=False).reset_index()


def backend_colors(lat: pd.DataFrame) -> dict:
    """One colour per backend, in the order section 1 measured them; every figure uses the same."""
    return dict(zip(lat.backend.unique(), plt.cm.tab10(np.linspace(0, 1, 10))))


def plot_latency(lat: pd.DataFrame, prefixes, ns, target: str, draft: str, colors: dict):
    """T(n)/T(1) per backend: one panel per prefix (rows) and model (target left, draft right)."""
    n_max = max(ns)
    fig, axes = plt.subplots(len(prefixes), 2, figsize=(11, 3.6 * len(prefixes)), squeeze=False, sharey=True)
    for i, pre in enumerate(prefixes):
        for j, role in enumerate(["target", "draft"]):
            ax = axes[i, j]
            for b, g in lat[(lat.prefix == pre) & (lat.role == role)].groupby("backend", sort=False):
                ax.plot(
                    g.n, g.ratio, marker="o", ms=3, color=colors[b], label=b, ls="--" if b.startswith("serial") else "-"
                )
            ax.plot(ns, ns, color="grey", lw=0.8, ls=":", label="T(n) = n·T(1)")
            ax.set_ylim(0.8, min(n_max, 8) + 0.2)
            ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
            ax.set(
                title=f"{role} ({target if role == 'target' else draft}), prefix {pre}",
                ylabel="T(n) / T(1)",
                xlabel="tokens per pass n" if i == len(prefixes) - 1 else "",
            )
    axes[0, 1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def latency_prose(shape: pd.DataFrame, prefix: int, n_max: int) -> str:
    """What section 1's table says about the target at `prefix`: the range of T(1), which backends are
    parallel, the steepest, and whether the fastest one-token runtime is also the flattest."""
    t = shape[(shape.role == "target") & (shape.prefix == prefix)].set_index("backend")
    flat = t[t.kind == "parallel"].index.tolist()
    steep = t.sort_values("ratio_at_max").index.tolist()[::-1][:3]
    fastest, flattest = t.T1_ms.idxmin(), t.ratio_at_max.idxmin()
    serial = [b for b in t.index if b.startswith("serial")]
    return (
        f"At a {prefix}-token prefix the target's one-token pass takes from {t.T1_ms.min():.2f} ms ({fastest}) to "
        f"{t.T1_ms.max():.2f} ms ({t.T1_ms.idxmax()}). Parallel (T({n_max})/T(1) < 2): {', '.join(flat) or 'none'}. "
        f"Steepest: "
        + "; ".join(
            f"{b} T({n_max})/T(1) = {t.ratio_at_max[b]:.2f}, slope {t.slope[b]:.2f}, biggest step {t.biggest_step[b]}"
            for b in steep
        )
        + ". "
        + (
            f"The fastest one-token runtime ({fastest}, T({n_max})/T(1) = {t.ratio_at_max[fastest]:.2f}) is not the "
            f"flattest ({flattest}, {t.ratio_at_max[flattest]:.2f}): a backend that is quick at n = 1 because its "
            f"matrix–vector kernel is tuned for decoding can lose much of that edge once n > 1 switches it to a "
            f"general matrix multiply."
            if fastest != flattest
            else f"The fastest one-token runtime, {fastest}, is also the flattest (T({n_max})/T(1) = "
            f"{t.ratio_at_max[fastest]:.2f})."
        )
        + "".join(
            f" The deliberately serial {b} reaches T({n_max})/T(1) = {t.ratio_at_max[b]:.2f} (a perfectly serial "
            f"pass: {n_max}), so the timing does see serial verification where it exists."
            for b in serial
        )
    )


def width_check(rts: Runtimes, names, seed: int, meta, width: int = WIDTH) -> pd.DataFrame:
    """Step "width": per backend, the largest logit difference between one `width`-token pass and `width`
    one-token passes over a random 128-token prefix, and the share of positions whose greedy token differs."""
    rts.require(names)
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, 4096, (128,), generator=gen).tolist()
    toks = torch.randint(0, 4096, (width,), generator=gen).tolist()
    rows = []
    for b in [b for b in names if not b.startswith("serial")]:
        m = rts.lm(rts.target, b)
        m.reset(prefix)
        wide = m.extend(toks, list(range(-1, width - 1))).float()
        m.reset(prefix)
        narrow = SerialLM(m).extend(toks, list(range(-1, width - 1))).float()
        rows.append(
            dict(
                backend=b,
                max_abs_diff=(wide - narrow).abs().max().item(),
                argmax_differs=(wide.argmax(-1) != narrow.argmax(-1)).float().mean().item(),
            )
        )
    return pd.DataFrame(rows).assign(**meta)


def width_prose(width: pd.DataFrame, n: int = WIDTH) -> str:
    """The range of the width check's logit differences and where the greedy token differs."""
    wd = width.set_index("backend")
    return (
        f"The largest logit difference between the wide pass and the one-token passes ranges from "
        f"{wd.max_abs_diff.min():.2g} ({wd.max_abs_diff.idxmin()}) to {wd.max_abs_diff.max():.2g} "
        f"({wd.max_abs_diff.idxmax()}); the greedy token differs at "
        + (
            ", ".join(
                f"{r.argmax_differs * n:.0f} of the {n} positions on {r.Index}"
                for r in wd[wd.argmax_differs > 0].itertuples()
            )
            if (wd.argmax_differs > 0).any()
            else "no position on any backend"
        )
        + "."
    )


# ---- section 1b: threads


def thread_latencies(rts: Runtimes, thread_counts, thread_rounds: int, ns, repeats: int, meta) -> pd.DataFrame:
    """Step "threads": the torch target's pass over n = `ns` tokens at a 128-token prefix with each thread
    count (capped at the CPUs available), in rounds that alternate the thread counts."""
    thread_rows = []
    counts = [t for t in thread_counts if t <= core_device.cpu_count()]
    for rnd in range(thread_rounds):
        for t in counts if rnd % 2 == 0 else counts[::-1]:
            with core_device.threads(t):
                secs = bench.latencies([(rts.lm(rts.target, "torch"), n) for n in ns], prefix_len=128, repeats=repeats)
            thread_rows += [dict(threads=t, round=rnd, n=n, seconds=x) for n, x in zip(ns, secs)]
    thr = pd.DataFrame(thread_rows)
    thr["v"] = thr.seconds / thr.groupby(["threads", "round"]).seconds.transform("first")
    # `meta` carries the notebook's THREADS; this table's own thread count must not be overwritten
    return thr.assign(**{k: v for k, v in meta.items() if k != "threads"})


def plot_threads(thr: pd.DataFrame, ns, target: str):
    """T(n)/T(1) per thread count (median and range of rounds), and T(1) of every round."""
    counts = sorted(thr.threads.unique())
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for i, (t, g) in enumerate(thr.groupby("threads")):
        band = g.groupby("n").v.agg(["min", "median", "max"])
        axes[0].fill_between(band.index, band["min"], band["max"], color=f"C{i}", alpha=0.2)
        axes[0].plot(
            band.index, band["median"], "o-", ms=3, color=f"C{i}", label=f"{t} thread(s): median and range of rounds"
        )
        t1 = g[g.n == 1].seconds * 1e3
        axes[1].scatter([t] * len(t1), t1, color=f"C{i}")
    axes[0].set(xlabel="tokens per pass n", ylabel="T(n) / T(1)", title=f"{target}, torch, prefix 128")
    axes[0].set_xticks(ns)
    axes[0].legend(fontsize=8)
    axes[1].set(xlabel="torch threads", ylabel="T(1) per round (ms)", title="one-token pass", xticks=counts)
    return fig


def cheap_sizes(g: pd.DataFrame) -> list:
    """Sizes n that cost less than some smaller size in every round."""
    piv = g.pivot(index="round", columns="n", values="seconds")
    return [
        n
        for n in piv.columns
        if n > 1 and (piv[n].to_numpy()[:, None] < piv.loc[:, piv.columns < n].to_numpy()).any(1).all()
    ]


def threads_summary(thr: pd.DataFrame) -> pd.DataFrame:
    """Per thread count: T(1) and its spread over rounds, the largest spread of T(n)/T(1), whether the
    median T(n)/T(1) rises monotonically, and the reliably cheap sizes."""
    summary = []
    for t, g in thr.groupby("threads"):
        med = g.groupby("n").v.median()
        summary.append(
            dict(
                threads=t,
                T1_ms=g[g.n == 1].seconds.median() * 1e3,
                T1_spread_ms=np.ptp(g[g.n == 1].seconds) * 1e3,
                v_spread=g.groupby("n").v.agg(np.ptp).max(),
                monotone=bool(med.is_monotonic_increasing),
                cheap_sizes=", ".join(map(str, cheap_sizes(g))) or "none",
            )
        )
    return pd.DataFrame(summary)


def threads_prose(summary: pd.DataFrame, threads: int) -> str:
    """What the threads summary says, per thread count."""
    return (
        " ".join(
            f"With {r.threads} thread(s), T(1) = {r.T1_ms:.2f} ms (rounds within {r.T1_spread_ms:.2f} ms); T(n)/T(1) "
            f"{'rises monotonically' if r.monotone else 'is not monotone'} in n, the rounds disagree by up to "
            f"{r.v_spread:.2f} at some n, and the reliably cheap sizes are: {r.cheap_sizes}."
            for r in summary.itertuples()
        )
        + f" The timed sections of this notebook and of notebook 01 use {threads} thread(s) per job."
    )


# ---- section 2: end to end


def config_runs(rts: Runtimes, configs, ks, splits: dict, max_new_tokens: int, sampling, seed: int, repeats, meta):
    """Step "runs": per configuration (target backend, draft backend), the bare-pass costs c and v(K)
    ("profile") and AR and SD at every K in `ks` paired on the prompts of each split ("runs").
    `splits` is {split: (prompts, rounds)}."""
    rts.require([b for cfg in configs for b in cfg])
    frames, prof_rows = [], []
    for tb, db in tqdm(configs, desc="configurations"):
        target, draft = rts.lm(rts.target, tb), rts.lm(rts.draft, db)
        cfg = f"{tb} ← {db}"
        prof = bench.cost_profile(target, draft, ks, prefix_len=128, repeats=repeats)
        prof_rows += [
            dict(
                config=cfg,
                target_backend=tb,
                draft_backend=db,
                K=k,
                c=prof["c"],
                v=prof["v"][k],
                target_1_ms=prof["target_1"] * 1e3,
                draft_1_ms=prof["draft_1"] * 1e3,
            )
            for k in ks
        ]
        methods = bench.chain_methods(target, draft, ks, max_new_tokens, sampling, seed)
        for split, (ps, rounds) in splits.items():
            r = bench.paired_runs(ps, methods, rounds=rounds, progress=tqdm)
            frames.append(r.assign(config=cfg, target_backend=tb, draft_backend=db, split=split))
    runs = pd.concat(frames, ignore_index=True)
    runs["K"] = runs.method.str.extract(r"K=(\d+)", expand=False).fillna("0").astype(int)
    return {"runs": runs.assign(**meta), "profile": pd.DataFrame(prof_rows).assign(**meta)}


def speed_table(runs: pd.DataFrame, profile: pd.DataFrame, cfg: str, split: str, seed: int) -> pd.DataFrame:
    """The estimator on one (configuration, split), beside the bare-pass costs and the analytic predictions."""
    t = bench.speedup_table(runs[(runs.config == cfg) & (runs.split == split)], seed=seed)
    t = t.rename(columns={"c": "c_loop", "v": "v_loop", "runs": "of"})
    t["target_1_loop_ms"] = t.pop("target_1") * 1e3
    t["K"] = t.method.str.extract(r"K=(\d+)", expand=False).astype(int)
    t = profile[profile.config == cfg].merge(t, on="K").assign(split=split)
    t["alpha"] = t.token_acceptance
    t["predicted"] = [bench.predicted_speedup(r.alpha, r.K, r.c, r.v) for r in t.itertuples()]
    t["predicted_v1"] = [bench.predicted_speedup(r.alpha, r.K, r.c, 1.0) for r in t.itertuples()]
    t["predicted_c0"] = [bench.predicted_speedup(r.alpha, r.K, 0.0, r.v) for r in t.itertuples()]
    t["predicted_loop"] = [bench.predicted_speedup(r.alpha, r.K, r.c_loop, r.v_loop) for r in t.itertuples()]
    return t


def speedups(runs: pd.DataFrame, profile: pd.DataFrame, splits, seed: int) -> pd.DataFrame:
    """`speed_table` for every configuration and split, with `chosen` marking each configuration's K that
    has the highest speedup on the pilot prompts (in both splits)."""
    speed = pd.concat(
        [speed_table(runs, profile, cfg, split, seed) for cfg in runs.config.unique() for split in splits],
        ignore_index=True,
    )
    pilot = speed[speed.split == "pilot"]
    chosen_k = pilot.loc[pilot.groupby("config", sort=False).speedup.idxmax()].set_index("config").K
    speed["chosen"] = speed.K == speed.config.map(chosen_k)
    return speed


def plot_predicted_vs_measured(report: pd.DataFrame, ks, rounds: int):
    """Per configuration: the measured speedup over K with its interval, beside the analytic predictions,
    the K chosen on the pilot prompts ringed."""
    cfgs = list(report.config.unique())
    cols = min(3, len(cfgs))
    nrows = -(-len(cfgs) // cols)
    height = 3.1 * nrows + 0.7  # 0.7 inch under the panels for the shared legend
    fig, axes = plt.subplots(nrows, cols, figsize=(4.4 * cols, height), squeeze=False, sharex=True)
    for ax, cfg in zip(axes.flat, cfgs):
        g = report[report.config == cfg]
        if rounds > 1:
            ax.fill_between(g.K, g.spread_lo, g.spread_hi, color="C0", alpha=0.15, label="single rounds (min–max)")
        ax.errorbar(
            g.K,
            g.speedup,
            yerr=[(g.speedup - g.lo).fillna(0), (g.hi - g.speedup).fillna(0)],
            color="C0",
            marker="o",
            ms=4,
            capsize=2,
            label="measured (median, 95% CI)",
        )
        ax.plot(g.K, g.predicted, marker="s", ms=3, ls="--", color="C1", label="analytic, bare-pass c, v(K)")
        ax.plot(g.K, g.predicted_loop, marker="^", ms=3, ls="-.", color="C2", label="analytic, in-loop c, v(K)")
        ax.plot(g.K, g.predicted_v1, ls=":", color="grey", label="analytic, bare-pass c, v = 1")
        b = g[g.chosen].iloc[0]
        ax.scatter(
            [b.K],
            [b.speedup],
            s=150,
            facecolors="none",
            edgecolors="red",
            lw=1.8,
            zorder=3,
            label="K chosen on the pilot prompts",
        )
        ax.axhline(1, color="black", lw=0.7)
        ax.set_title(cfg, fontsize=10)
        ax.set(xlabel="draft length K", ylabel="speedup over AR")
        ax.set_xticks(ks)
    for ax in list(axes.flat)[len(cfgs) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.7 / height, 1, 1))
    return fig


def top_config(best: pd.DataFrame) -> pd.Series:
    """The configuration with the highest reported speedup at its chosen K."""
    return best.sort_values("speedup", ascending=False).iloc[0]


def speedup_prose(speed: pd.DataFrame) -> str:
    """Section 2's reading: the best configuration beside its predictions, how many decelerate, how close
    the analytic model comes, and what choosing K on the reported prompts would have added."""
    pilot = speed[speed.split == "pilot"]
    report = speed[speed.split == "report"].reset_index(drop=True)
    best = report[report.chosen].reset_index(drop=True)
    err = (report.speedup / report.predicted - 1).abs()
    err_loop = (report.speedup / report.predicted_loop - 1).abs()
    top = top_config(best)
    b_idx = best.set_index("config")
    in_sample = report.loc[report.groupby("config", sort=False).speedup.idxmax()].set_index("config")
    moved = in_sample[in_sample.K != b_idx.K.loc[in_sample.index]]
    gap = in_sample.speedup - b_idx.speedup.loc[in_sample.index]
    slow_all = report.groupby("config", sort=False).speedup.max().lt(1)
    spread = f"; single rounds {top.spread_lo:.2f}–{top.spread_hi:.2f}" if top.rounds > 1 else ""
    return (
        f"Each configuration's K was chosen on {int(pilot.prompts.iloc[0])} pilot prompt(s); the numbers are from "
        f"{int(top.prompts)} disjoint reported prompts x {int(top.rounds)} round(s). Best configuration: "
        f"**{top.config}**, **{top.speedup:.2f}x** at K = {int(top.K)} (95% CI {top.lo:.2f}–{top.hi:.2f}; total-time "
        f"ratio {top.total_ratio:.2f}x{spread}); the analytic model predicts {top.predicted:.2f}x from the bare passes "
        f"(α = {top.alpha:.2f}, c = {top.c:.3f}, v = {top.v:.2f}) and {top.predicted_loop:.2f}x from the in-loop costs "
        f"(c = {top.c_loop:.3f}, v = {top.v_loop:.2f}). Decelerating at the chosen K: {int((best.speedup < 1).sum())} "
        f"of {len(best)} configurations ({int((best.hi < 1).sum())} with the whole interval below 1); at every K: "
        f"{int(slow_all.sum())} ({', '.join(slow_all[slow_all].index) or 'none'}). "
        f"Across all {len(report)} reported (configuration, K) points the analytic model is within {err.median():.0%} "
        f"of the measured speedup at the median ({err.quantile(0.9):.0%} at the 90th percentile) with the bare-pass "
        f"costs, and within {err_loop.median():.0%} ({err_loop.quantile(0.9):.0%}) with the in-loop costs; the v = 1 "
        f"curve (Leviathan et al.) lies above the measured speedup at {(report.predicted_v1 > report.speedup).mean():.0%} "
        f"of the points. On the reported prompts themselves the highest median sits at another K than the pilot's for "
        f"{len(moved)} of {len(in_sample)} configurations"
        + (
            f" ({', '.join(f'{c}: K = {int(r.K)}' for c, r in moved.iterrows())}), whose median is higher than the "
            f"chosen K's by at most {gap.max():.2f}: what reporting the best K on the same prompts would have added, "
            f"part of it the winner's curse."
            if len(moved)
            else "."
        )
    )


def compare_with_01(nb01: pd.DataFrame | None, report: pd.DataFrame, meta: dict, notebook: str):
    """The torch ← torch configuration beside notebook 01's greedy speedup at 01's chosen K (or, when this
    run lacks it, at this run's chosen K, else the largest K both measured): (table, prose), or
    (None, why there is nothing to compare)."""
    ours = report[report.config == "torch ← torch"].set_index("K")
    if nb01 is None:
        return None, (
            "Notebook 01 has no saved result `01_baseline/speedup` in this results folder: run notebook 01 first "
            "to compare with it."
        )
    if missing := [c for c in NEED_01 if c not in nb01.columns]:
        return None, (
            f"Notebook 01's saved result predates the paired estimator (no column(s) {', '.join(missing)}): "
            "re-run notebook 01 to compare with it."
        )
    if ours.empty:
        return (
            None,
            "The torch ← torch configuration is not among this run's CONFIGS: nothing to compare with notebook 01.",
        )
    g01 = nb01[(nb01["mode"] == "greedy") & (nb01.split == "report")].set_index("K")
    common = sorted(set(g01.index) & set(ours.index))
    k01, k05 = int(g01.index[g01.chosen][0]), int(ours.index[ours.chosen][0])
    k = k01 if k01 in common else (k05 if k05 in common else common[-1])
    a, b = g01.loc[k], ours.loc[k]

    def info(col):
        return nb01[col].iloc[0] if col in nb01.columns else "?"

    vs01 = pd.DataFrame(
        [
            dict(
                notebook="01_baseline",
                K=k,
                chosen_K=k01,
                speedup=a.speedup,
                lo=a.lo,
                hi=a.hi,
                token_acceptance=a.token_acceptance,
                c_loop=a.c,
                v_loop=a.v,
                prompts=a.get("prompts", np.nan),
                rounds=a.get("rounds", np.nan),
                threads=info("threads"),
                device=info("device"),
                smoke=info("smoke"),
            ),
            dict(
                notebook=notebook,
                K=k,
                chosen_K=k05,
                speedup=b.speedup,
                lo=b.lo,
                hi=b.hi,
                token_acceptance=b.token_acceptance,
                c_loop=b.c_loop,
                v_loop=b.v_loop,
                prompts=b.prompts,
                rounds=b.rounds,
                threads=meta["threads"],
                device=meta["device"],
                smoke=meta["smoke"],
            ),
        ]
    )
    no_nan = bool(np.isfinite([a.lo, a.hi, b.lo, b.hi]).all())
    overlap = bool(a.lo <= b.hi and b.lo <= a.hi)
    d = vs01.set_index("notebook")
    text = (
        f"At K = {k} (greedy, reported prompts; notebook 01 chose K = {k01}, this notebook K = {k05} for torch ← torch): "
        f"notebook 01 measured **{a.speedup:.2f}x** (95% CI {a.lo:.2f}–{a.hi:.2f}, {d.prompts.iloc[0]:.0f} prompts x "
        f"{d.rounds.iloc[0]:.0f} rounds, {d.threads.iloc[0]} threads), this notebook **{b.speedup:.2f}x** "
        f"(95% CI {b.lo:.2f}–{b.hi:.2f}, {b.prompts:.0f} prompts x {b.rounds:.0f} rounds, {meta['threads']} threads). "
        + (
            "One interval is missing (a single reported prompt), so overlap cannot be judged. "
            if not no_nan
            else "The intervals overlap: the two measurements agree within their noise. "
            if overlap
            else f"The intervals do not overlap: a difference of {b.speedup - a.speedup:+.2f}x that noise does not explain. "
        )
        + f"Per-token acceptance {a.token_acceptance:.3f} (01) vs {b.token_acceptance:.3f} (05), which the prompts set; "
        f"in-loop costs c = {a.c:.3f} vs {b.c_loop:.3f} and v({k}) = {a.v:.2f} vs {b.v_loop:.2f}, which the threads and "
        f"the machine set. Notebook 01 uses stdlib and HumanEval prompts, this one stdlib only"
        + (
            f"; notebook 01's saved result is {'a smoke run' if d.smoke.iloc[0] else 'a full run'} and this one "
            f"{'a smoke run' if meta['smoke'] else 'a full run'}, so sizes differ too"
            if d.smoke.iloc[0] != meta["smoke"]
            else ""
        )
        + "."
    )
    return vs01, text


# ---- section 3: causes


def cost_causes(best: pd.DataFrame, lat: pd.DataFrame) -> pd.DataFrame:
    """Each configuration at its chosen K with its costs split into drafting (K·c) and the verify pass's
    excess (v − 1), the larger named, beside c from the one-token passes timed alone (prefix 128)."""
    cause = best.copy()
    alone = lat[(lat.prefix == 128) & (lat.n == 1)].set_index(["role", "backend"]).seconds * 1e3
    cause["target_1_alone_ms"] = [alone.get(("target", b), np.nan) for b in cause.target_backend]
    cause["draft_1_alone_ms"] = [alone.get(("draft", b), np.nan) for b in cause.draft_backend]
    cause["c_alone"] = cause.draft_1_alone_ms / cause.target_1_alone_ms
    cause["draft_cost"] = cause.K * cause.c
    cause["verify_excess"] = cause.v - 1
    cause["dominant_cause"] = np.where(
        cause.draft_cost > cause.verify_excess, "draft too slow relative to target", "verification not parallel"
    )
    cause["decelerates"] = cause.speedup < 1
    return cause


def causes_prose(cause: pd.DataFrame) -> str:
    """The cause of each loss, and the largest gap between c interleaved and c alone."""
    worst = cause.assign(inflation=cause.c / cause.c_alone).sort_values("inflation", na_position="first").iloc[-1]
    slow = cause[cause.decelerates]
    in_loop = cause.c_loop / cause.c
    return (
        (
            (
                "Median below 1 at the chosen K (whole interval below 1: decelerating; an interval that holds 1: not "
                "distinguishable from AR): "
                + "; ".join(
                    f"**{r.config}** ({r.speedup:.2f}x at K = {int(r.K)}, CI {r.lo:.2f}–{r.hi:.2f}: "
                    f"{'decelerating' if r.hi < 1 else 'not distinguishable from AR' if r.hi >= 1 else 'no interval'}): "
                    f"{r.dominant_cause} — drafting costs K·c = "
                    f"{r.draft_cost:.2f} target passes, verification v = {r.v:.2f}; flat verification would give "
                    f"{r.predicted_v1:.2f}x, free drafting {r.predicted_c0:.2f}x"
                    for r in slow.itertuples()
                )
                + "."
            )
            if len(slow)
            else "No configuration has a median below 1 at its chosen K."
        )
        + f" A hidden cost of alternating two models, each with its own worker threads: c is measured with the two "
        f"interleaved, as SD runs them; each timed alone (section 1) gives `c_alone`. The largest gap is "
        f"**{worst.config}**: c = {worst.c:.3f} interleaved vs {worst.c_alone:.3f} alone (one-token passes "
        f"{worst.target_1_ms:.2f} / {worst.draft_1_ms:.2f} ms vs {worst.target_1_alone_ms:.2f} / "
        f"{worst.draft_1_alone_ms:.2f} ms alone), and inside the decoding loop SD paid c = {worst.c_loop:.3f} per drafted "
        f"token. Across configurations the in-loop c is {in_loop.median():.2f} times the interleaved "
        f"bare-pass c at the median (range {in_loop.min():.2f}–{in_loop.max():.2f})."
    )


# ---- section 4: the break-even map


def target_curves(lat: pd.DataFrame, prefix: int) -> pd.DataFrame:
    """Section 1's target rows at `prefix`: each target backend's v(K) = T(K+1)/T(1), timed alone."""
    return lat[(lat.role == "target") & (lat.prefix == prefix)]


@dataclass
class BreakEvenMap:
    """The best analytic speedup over K on an (α, c) grid, per target backend (`speedup[b]`, shaped like
    the grid: rows over c, columns over α)."""

    alphas: np.ndarray
    cs: np.ndarray
    speedup: dict

    def table(self) -> pd.DataFrame:
        """The largest c on the grid at which speculation still wins, per backend and α in BREAK_EVEN_ALPHAS
        (0 where it wins nowhere)."""
        rows = []
        for b, best_s in self.speedup.items():
            for a in BREAK_EVEN_ALPHAS:
                col = best_s[:, np.argmin(np.abs(self.alphas - a))]
                rows.append(dict(backend=b, alpha=a, max_c=float(self.cs[col > 1].max()) if (col > 1).any() else 0.0))
        return pd.DataFrame(rows)


def break_even_map(tv: pd.DataFrame, ks, c_max: float) -> BreakEvenMap:
    """The map over α in [0.05, 0.98] and c from 10^-2.3 to max(1, 1.5 `c_max`), each target backend of
    `tv` with its measured v(K), the best K in `ks` at every point."""
    alphas = np.linspace(0.05, 0.98, 120)
    cs = np.logspace(-2.3, np.log10(max(1.0, 1.5 * c_max)), 120)
    A, C = np.meshgrid(alphas, cs)
    grids = {}
    for b, g in tv.groupby("backend", sort=False):
        v = g.set_index("n").ratio
        grids[b] = np.max([(1 - A ** (k + 1)) / (1 - A) / (k * C + v[k + 1]) for k in ks if k + 1 in v.index], axis=0)
    return BreakEvenMap(alphas, cs, grids)


def plot_break_even(bmap: BreakEvenMap, best: pd.DataFrame, colors: dict):
    """Each target backend's break-even curve, and the configurations at their chosen K (o: a measured win,
    X: a measured loss), labelled."""
    A, C = np.meshgrid(bmap.alphas, bmap.cs)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for b, best_s in bmap.speedup.items():
        ls = "--" if b.startswith("serial") else "-"
        ax.contour(A, C, best_s, levels=[1.0], colors=[colors[b]], linewidths=1.4, linestyles=ls)
        ax.plot([], [], color=colors[b], label=b, ls=ls)
    label_y = []  # label heights (log10 c), at least 0.07 apart so they stay legible
    for r in best.sort_values("c").itertuples():
        ax.scatter(
            r.alpha,
            r.c,
            color=colors.get(r.target_backend, "k"),
            edgecolor="black",
            s=60,
            marker="o" if r.speedup >= 1 else "X",
            zorder=3 if r.speedup >= 1 else 4,
        )  # a loss stays visible
        label_y.append(max(np.log10(r.c), label_y[-1] + 0.07) if label_y else np.log10(r.c))
        ax.annotate(
            r.config,
            (r.alpha, r.c),
            xytext=(r.alpha - 0.03, 10 ** label_y[-1]),
            ha="right",
            va="center",
            fontsize=7,
            arrowprops=dict(arrowstyle="-", color="grey", lw=0.6),
        )
    ax.set(
        xscale="linear",
        yscale="log",
        xlabel="per-token acceptance α",
        ylabel="cost ratio c = T_draft(1) / T_target(1)",
        title="speculation wins below each curve (o = measured win, x = measured loss)",
    )
    ax.legend(fontsize=8, ncol=2, loc="upper left")
    return fig


def map_speedup(tv: pd.DataFrame, ks, alpha: float, c: float, backend: str) -> float:
    """The map's verdict at one point: the best analytic speedup over K with the backend's section-1 v(K)."""
    v = tv[tv.backend == backend].set_index("n").ratio
    ks = [k for k in ks if k + 1 in v.index]
    return max(bench.predicted_speedup(alpha, k, c, v[k + 1]) for k in ks) if ks else np.nan


def break_even_prose(breakeven: pd.DataFrame, best: pd.DataFrame, tv: pd.DataFrame, ks, alpha_max: float) -> str:
    """Which runtime tolerates the dearest draft at α = 0.7, which cannot win anywhere, how α varies over
    the configurations, and on how many the map agrees with the measurement."""
    verdict = best.assign(map_speedup=[map_speedup(tv, ks, r.alpha, r.c, r.target_backend) for r in best.itertuples()])
    verdict = verdict.dropna(subset=["map_speedup"])
    verdict["map_win"], verdict["measured_win"] = verdict.map_speedup > 1, verdict.speedup >= 1
    wrong = verdict[verdict.map_win != verdict.measured_win]
    tol = breakeven[breakeven.alpha == 0.7].set_index("backend").max_c.sort_values()
    never = breakeven.groupby("backend").max_c.max().loc[lambda s: s == 0].index.tolist()
    return (
        f"At α = 0.7 the most tolerant target runtime, **{tol.index[-1]}**, still wins with a draft up to c = "
        f"{tol.iloc[-1]:.3f}; the least tolerant, **{tol.index[0]}**, "
        + (f"needs c < {tol.iloc[0]:.3f}. " if tol.iloc[0] > 0 else "cannot win at any c on the map. ")
        + (
            f"No acceptance up to {alpha_max:.2f} makes speculation pay on {', '.join(never)}: its verify pass grows "
            f"too fast with K. "
            if never
            else ""
        )
        + "Every configuration runs the same model pair, "
        + (
            f"and its measured acceptance is α = {best.alpha.iloc[0]:.3f} in every one"
            if best.alpha.max() - best.alpha.min() < 5e-4
            else f"and its measured acceptance spans only α = {best.alpha.min():.3f}–{best.alpha.max():.3f} (a runtime's "
            f"rounding can flip a near-tie and change a few tokens)"
        )
        + ": on this map the configurations differ in c and in where their target's curve lies, not in α. The map puts "
        f"{len(verdict) - len(wrong)} of {len(verdict)} configurations on the side of their curve where they were measured"
        + (
            ": it disagrees on "
            + "; ".join(
                f"{r.config} (map {r.map_speedup:.2f}x at its best K, measured {r.speedup:.2f}x at K = {int(r.K)})"
                for r in wrong.itertuples()
            )
            + ". The map uses the target's v(K) timed alone and the best K with hindsight, while the runs pay the "
            "in-loop costs at the K chosen on the pilot prompts; a point near its curve can land on either side."
            if len(wrong)
            else "."
        )
    )


# ---- sections 5 and 6: output agreement, the seed study


def agreement(speed: pd.DataFrame, width: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: on how many SD runs (every split, K and round) the output equals the target
    backend's AR output, beside that backend's width check."""
    agree = (
        speed.groupby(["config", "target_backend"], sort=False)
        .agg(identical=("identical", "sum"), of=("of", "sum"))
        .reset_index()
    )
    agree = agree.merge(width.rename(columns={"backend": "target_backend"}), on="target_backend", how="left")
    agree["agreement"] = agree.identical / agree["of"]
    return agree


def agreement_prose(agree: pd.DataFrame) -> str:
    """SD = AR counts per configuration, with the width check's logit difference where there is one."""
    return (
        "; ".join(
            f"{r.config}: SD = AR on {r.identical} / {r.of} runs"
            + (
                f" (8-token vs one-token passes: max |Δ logit| {r.max_abs_diff:.2g})"
                if r.max_abs_diff == r.max_abs_diff  # NaN where the width check has no row (serial backends)
                else ""
            )
            for r in agree.itertuples()
        )
        + "."
    )


def seed_comparison(best: pd.DataFrame) -> pd.DataFrame:
    """The seed study's quoted result beside this run's best configuration and its decelerating ones."""
    top = top_config(best)
    return pd.DataFrame(
        [
            dict(study="seed", best_config="(not named)", best_speedup=1.61, best_K=6, decelerating="3 of 5"),
            dict(
                study="speclib (this run, K chosen on pilot prompts)",
                best_config=top.config,
                best_speedup=round(top.speedup, 2),
                best_K=int(top.K),
                decelerating=f"{int((best.speedup < 1).sum())} of {len(best)}: "
                + ", ".join(best[best.speedup < 1].config),
            ),
        ]
    )
