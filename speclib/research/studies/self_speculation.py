"""What notebook 06 computes: a hybrid model drafting for itself through views of its own layers.

Each section's step (timed costs, the subset search, decoding runs, the exit adapter, context lengths,
perplexity, other hybrid families) is a function here, and so is every table, figure and paragraph the
notebook derives from the steps' saved tables, so a notebook cell only calls them:

    SUBSETS, ALIASES = catalogue(target, early_exit_ns=[2, 3], first_ns=[2, 4])
    runs = decode_runs(prompts.pilot, target, 128, all_configs(target, draft, SUBSETS, [1, 2], "draft"))
    pilot = pilot_table(runs, seed=0)  # the speedup of each drafter at each k, its fastest k marked
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr
from tqdm.auto import tqdm

from speclib.core.analytic import predicted_speedup
from speclib.core.generate import Generation, generate
from speclib.core.sampling import Sampling
from speclib.drafters.layers import ExitAdapter, LayerSkipDrafter, subset
from speclib.drafters.model import ModelDrafter
from speclib.lms.branches import BranchSkipLM
from speclib.lms.hybrid import HybridLM
from speclib.lms.lm import checkpoints
from speclib.lms.loading import HYBRID_TYPES, load, with_context
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

GREEDY = Sampling(0.0)
LEAD = 8192  # prompts' anchors start this many tokens into each half of the held-out stream
C_GRID = np.linspace(0.02, 1.1, 200)  # the cost ratios c at which the figures draw break-even curves
# The component-aware study's k = 2 acceptance of the linear subgraph, per family (section 6 tests it).
STUDY_ALPHA = {"falcon_h1": 0.68, "qwen3_5_text": 0.038}


# --- setup ---------------------------------------------------------------------------------------------
def load_models(target_name: str, draft_name: str, device: str, longest: int):
    """(target, draft, the target's configured context): both loaded, their context raised to `longest`;
    a target that speclib cannot run layer by layer is a ValueError."""
    target, draft = load(target_name, device=device), load(draft_name, device=device)
    if not isinstance(target, HybridLM):
        raise ValueError(
            f"TARGET {target_name!r} loads as {type(target).__name__}: layer-subset views need a Gated DeltaNet "
            f"hybrid that speclib runs with its own forward (HybridLM: {', '.join(HYBRID_TYPES)})"
        )
    trained_context = target.max_length
    return with_context(target, longest), with_context(draft, longest), trained_context


def describe_target(name: str, target: HybridLM, trained_context: int, longest: int, threads: int) -> str:
    layers = range(len(target.is_gdn))
    return (
        f"{name}: {len(layers)} layers, attention at {[i for i in layers if not target.is_gdn[i]]}; configured "
        f"context {trained_context} positions"
        + (f", raised to {longest} for this notebook's longest runs" if longest > trained_context else "")
        + f"; device {target.device}, {threads} thread(s)"
    )


@dataclass
class Prompts:
    """Windows of the held-out stream: the first half serves the choices (pilot prompts, the search's
    windows), the second half the reports. A prompt at context n is the n tokens before a fixed anchor,
    so across context lengths the same continuation point is decoded with more or less text before it."""

    held: np.ndarray
    pilot: list[list[int]]
    report: list[list[int]]
    context_anchors: np.ndarray
    search: list[list[int]]
    eval: list[list[int]]

    def at_context(self, n: int) -> list[list[int]]:
        """Section 4's prompts: the n tokens before each context anchor."""
        return [window(self.held, a, n) for a in self.context_anchors]


def window(held: np.ndarray, anchor: int, n: int) -> list[int]:
    return held[anchor - n : anchor].astype(np.int64).tolist()


def prompts(
    held: np.ndarray,
    n_pilot: int,
    n_prompts: int,
    context_prompts: int,
    context: int,
    max_new_tokens: int,
    search_windows: int,
    eval_windows: int,
    eval_len: int,
) -> Prompts:
    """Every prompt and window of the notebook. Anchors start LEAD tokens into each half, whatever the
    contexts are, so the prompts of sections 2-3 do not move with them."""
    half = len(held) // 2
    pilot_anchors = np.linspace(LEAD, half - max_new_tokens - 1, n_pilot).astype(int)
    report_anchors = np.linspace(half + LEAD, len(held) - max_new_tokens - 1, n_prompts).astype(int)
    context_anchors = np.linspace(half + LEAD, len(held) - max_new_tokens - 1, context_prompts).astype(int)
    return Prompts(
        held=held,
        pilot=[window(held, a, context) for a in pilot_anchors],
        report=[window(held, a, context) for a in report_anchors],
        context_anchors=context_anchors,
        search=[
            held[s : s + context].astype(np.int64).tolist()
            for s in np.linspace(0, half - context, search_windows + 2).astype(int)[1:-1]
        ],
        eval=[
            held[s : s + eval_len + 1].astype(np.int64).tolist()
            for s in np.linspace(half, len(held) - eval_len - 2, eval_windows).astype(int)
        ],
    )


def catalogue(target: HybridLM, early_exit_ns, first_ns) -> tuple[dict[str, list[int]], dict[str, list[str]]]:
    """(name -> layers, name -> the other names of the same layers): every named kind for this model,
    two kinds that name the same layers kept once, under the first name."""
    n_layers = len(target.is_gdn)
    named = [("linear", subset(target, "linear"))]
    named += [
        (f"linear_early_exit n={n}", subset(target, "linear_early_exit", n))
        for n in early_exit_ns
        if 1 <= n <= n_layers - 1
    ]
    named += [("every_other", subset(target, "every_other"))]
    named += [(f"first_n n={n}", subset(target, "first_n", n)) for n in first_ns if 1 <= n < n_layers]
    out: dict[str, list[int]] = {}
    aliases: dict[str, list[str]] = {}
    for name, layers in named:
        for first, got in out.items():
            if got == layers:
                aliases[first].append(name)
                break
        else:
            out[name], aliases[name] = layers, []
    return out, aliases


def subset_table(target: HybridLM, subsets: dict, aliases: dict) -> pd.DataFrame:
    return pd.DataFrame(
        [
            dict(
                subset=n,
                layers=str(layers),
                attention_kept=sum(not target.is_gdn[i] for i in layers),
                layers_kept=len(layers),
                also_named=", ".join(aliases[n]),
            )
            for n, layers in subsets.items()
        ]
    )


def parse_layers(text: str) -> list[int]:
    """'[0, 1, 2]' (a saved table's layers) -> [0, 1, 2]."""
    return [int(x) for x in text.strip("[]").split(",")]


def alpha_needed(k: int, c: float, v: float, speedup: float = 1.0, grid=None) -> float:
    """The smallest acceptance on `grid` at which the analytic model predicts `speedup` (NaN: none does)."""
    grid = np.linspace(0, 0.999, 400) if grid is None else grid
    return next((a for a in grid if predicted_speedup(a, k, c, v) >= speedup), np.nan)


def _log_contexts(ax, contexts, trained_context: int | None = None) -> None:
    ax.set(xscale="log", xlabel="context (tokens)")
    ax.set_xticks(contexts, [str(c) for c in contexts])
    ax.minorticks_off()
    if trained_context is not None and trained_context < max(contexts):
        ax.axvline(trained_context, color="grey", lw=0.8, ls=":")


# --- 1 · the cost structure ----------------------------------------------------------------------------
def cost_structure(
    target: HybridLM, full, draft, subsets: dict, contexts, ks, repeats: int, draft_name: str, meta: dict
) -> pd.DataFrame:
    """Seconds of one token of the full model (and of k + 1 tokens, the verify pass), of every subset view
    and of the separate draft at each context, timed round-robin; c over the full model's token."""
    views = {name: target.view(layers=layers, exit=None) for name, layers in subsets.items()}
    everything = str(list(range(len(target.is_gdn))))
    rows = []
    for ctx in tqdm(contexts, desc="contexts"):
        cases = [(full, 1)] + [(full, k + 1) for k in ks] + [(v, 1) for v in views.values()] + [(draft, 1)]
        secs = bench.latencies(cases, prefix_len=ctx, repeats=repeats, warmup=3)
        t1 = secs[0]
        rows.append(dict(context=ctx, subset="full model", layers=everything, n=1, seconds=t1, c=1.0, flop_c=1.0))
        rows += [
            dict(context=ctx, subset="full model", layers=everything, n=k + 1, seconds=s, c=s / t1, flop_c=np.nan)
            for k, s in zip(ks, secs[1 : 1 + len(ks)])
        ]
        rows += [
            dict(
                context=ctx,
                subset=name,
                layers=str(subsets[name]),
                n=1,
                seconds=s,
                c=s / t1,
                flop_c=flop_cost(target, subsets[name], ctx),
            )
            for name, s in zip(views, secs[1 + len(ks) : -1])
        ]
        rows.append(
            dict(context=ctx, subset=draft_name, layers="", n=1, seconds=secs[-1], c=secs[-1] / t1, flop_c=np.nan)
        )
    return pd.DataFrame(rows).assign(**meta)


def cost_tables(cost: pd.DataFrame, subsets: dict) -> dict[str, pd.DataFrame]:
    """Section 1's tables: measured c (subset x context), FLOP c, and the full model's ms per token with
    its verify ratios v(k)."""
    one = cost[cost.n == 1]
    vk = cost[cost.subset == "full model"].pivot_table(index="context", columns="n", values="c")
    return {
        "measured": one.pivot_table(index="subset", columns="context", values="c", sort=False),
        "flop": one[one.subset.isin(subsets)].pivot_table(
            index="subset", columns="context", values="flop_c", sort=False
        ),
        "full": pd.concat(
            [
                one[one.subset == "full model"].set_index("context").seconds.mul(1e3).rename("full model, ms / token"),
                vk.drop(columns=1).rename(columns=lambda n: f"v(k={n - 1})"),
            ],
            axis=1,
        ),
    }


def plot_cost(cost: pd.DataFrame, subsets: dict, draft_name: str, contexts, trained_context: int):
    """Measured c (left, the separate draft dashed black) and FLOP c (right) against the context."""
    one = cost[cost.n == 1]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for i, name in enumerate(subsets):
        g = one[one.subset == name]
        axes[0].plot(g.context, g.c, "o-", color=f"C{i}", label=name)
        axes[1].plot(g.context, g.flop_c, "s--", color=f"C{i}", label=name)
    g = one[one.subset.str.endswith("(separate draft)")]
    axes[0].plot(g.context, g.c, "k--", marker="x", label=draft_name)
    axes[0].set(title="measured (one token, wall clock)", ylabel="c = T_subset(1) / T_full(1)")
    axes[1].set(title="FLOP count (flop_cost)")
    for ax in axes:
        ax.set(xscale="log", xlabel="context (tokens)", ylim=(0, 1.05))
        ax.set_xticks(contexts, [str(c) for c in contexts])
        ax.minorticks_off()
        if trained_context < max(contexts):
            ax.axvline(trained_context, color="grey", lw=0.8, ls=":")
    axes[0].legend(fontsize=8, ncol=2)
    return fig


def cost_text(cost: pd.DataFrame, subsets: dict, draft_name: str, contexts) -> str:
    one = cost[cost.n == 1]
    c_tab = one.pivot_table(index="subset", columns="context", values="c", sort=False)
    lin = one[one.subset == "linear"].set_index("context")
    flop_gap = one[one.subset.isin(subsets)].c - one[one.subset.isin(subsets)].flop_c
    dr = one[one.subset.str.endswith("(separate draft)")].set_index("context").c
    longest = c_tab[contexts[-1]].drop(["full model", draft_name])
    full_s = one[one.subset == "full model"].seconds
    return (
        f"The linear subgraph (every attention layer skipped) costs c = {lin.c.iloc[0]:.2f} of the full model at "
        f"{lin.index[0]} tokens of context and {lin.c.iloc[-1]:.2f} at {lin.index[-1]}; its FLOP count says "
        f"{lin.flop_c.iloc[0]:.2f} and {lin.flop_c.iloc[-1]:.2f}. The full model's token costs "
        f"{full_s.iloc[0] * 1e3:.1f} ms at {contexts[0]} tokens and {full_s.iloc[-1] * 1e3:.1f} ms at {contexts[-1]}. "
        f"Across subsets and contexts, measured c minus FLOP c is {flop_gap.median():+.2f} at the median (range "
        f"{flop_gap.min():+.2f} to {flop_gap.max():+.2f}): "
        + (
            "the subsets cost more than their arithmetic, as a fixed overhead per layer run would make them. "
            if flop_gap.median() > 0.05
            else "the subsets cost less than their arithmetic says: the skipped layers cost more "
            "than their share of the FLOPs. "
            if flop_gap.median() < -0.05
            else "the FLOP count is a fair guide to the measured cost here. "
        )
        + f"The separate draft costs c = {dr.iloc[0]:.3f} at {dr.index[0]} tokens and {dr.iloc[-1]:.3f} at "
        f"{dr.index[-1]}; the cheapest subset at the longest context, **{longest.idxmin()}**, costs {longest.min():.3f}."
    )


# --- 2a · the greedy search ----------------------------------------------------------------------------
def search(
    target: HybridLM, full, windows, subsets: dict, context: int, repeats: int, budget: int, k: int, meta: dict
) -> pd.DataFrame:
    """Every subset the greedy search measured, then every named kind: teacher-forced greedy acceptance on
    `windows`, c timed beside the full model at `context`, the predicted speedup at k; `best` marks the
    search's choice."""
    pm = proxy_measure(target, windows, context=context, temperature=0.0)

    def measure(layers, prompts=None):
        a, _ = pm(layers)
        t_full, t_sub = bench.latencies(
            [(full, 1), (target.view(layers=layers, exit=None), 1)], prefix_len=context, repeats=repeats, warmup=2
        )
        return a, t_sub / t_full

    t1, tk = bench.latencies([(full, 1), (full, k + 1)], prefix_len=context, repeats=max(repeats, 5), warmup=2)
    v = tk / t1
    found = search_subsets(target, None, measure, budget=budget, k=k, v=v)
    named = [dict(layers=layers, **dict(zip(["alpha", "c"], measure(layers)))) for layers in subsets.values()]
    hist = pd.DataFrame(found.history).assign(source="search")
    named = pd.DataFrame(named).assign(
        source="named", predicted=lambda d: [predicted_speedup(a, k, c, v) for a, c in zip(d.alpha, d.c)]
    )
    out = pd.concat([hist, named], ignore_index=True)
    out["layers"] = out.layers.map(str)
    out["best"] = out.layers == str(found.layers)
    return out.assign(k=k, v=v, **meta)


def with_search_best(hist: pd.DataFrame, subsets: dict, aliases: dict):
    """(the search's best row, subsets, aliases): the search's best subset joins the catalogue as "search",
    or as another name of the named kind with its layers."""
    best_row = hist[(hist.source == "search")].sort_values("predicted").iloc[-1]
    best = parse_layers(best_row.layers)
    subsets, aliases = dict(subsets), {n: list(a) for n, a in aliases.items()}
    if all(best != layers for layers in subsets.values()):
        subsets["search"], aliases["search"] = best, []
    else:
        aliases[next(n for n, layers in subsets.items() if layers == best)].append("search")
    return best_row, subsets, aliases


def plot_search(hist: pd.DataFrame, subsets: dict, best_row, k: int):
    """Every measured subset: c against teacher-forced acceptance, coloured by its predicted speedup."""
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    sc = ax.scatter(hist.c, hist.alpha, c=hist.predicted, cmap="viridis", s=28, edgecolor="none")
    plt.colorbar(sc, ax=ax, label=f"predicted speedup at k = {k}")
    be = [alpha_needed(k, c, hist.v.iloc[0]) for c in C_GRID]
    ax.plot(C_GRID, be, color="grey", lw=1, label="break-even (predicted 1x)")
    for r, name in zip(hist[hist.source == "named"].itertuples(), subsets):
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
    return fig


def search_text(hist: pd.DataFrame, subsets: dict, best_row, k: int) -> str:
    named = hist[hist.source == "named"]
    return (
        f"The search measured {int((hist.source == 'search').sum())} subsets. Its best, layers {best_row.layers}, "
        f"predicts {best_row.predicted:.2f}x at k = {k} (teacher-forced acceptance {best_row.alpha:.2f}, "
        f"c = {best_row.c:.2f}); the full model it started from predicts "
        f"{hist[hist.source == 'search'].predicted.iloc[0]:.2f}x and the best named kind, "
        f"{list(subsets)[int(np.argmax(named.predicted.to_numpy()))]}, {named.predicted.max():.2f}x. "
        f"Of the {len(hist)} measurements, {int((hist.predicted > 1).sum())} predict a win over AR."
    )


# --- 2b · decoding with every subset -------------------------------------------------------------------
@dataclass(frozen=True)
class GreedyRun:
    """One method of `bench.paired_runs`: `target` decodes `max_new_tokens` greedily with EOS ignored (so
    every run has the same length), drafted by a fresh `drafter()` per run (None: AR)."""

    target: object
    max_new_tokens: int
    drafter: Callable | None = None

    def __call__(self, ids: list[int], index: int = 0) -> Generation:
        d = None if self.drafter is None else self.drafter()
        return generate(self.target, ids, self.max_new_tokens, drafter=d, sampling=GREEDY, eos_token_id=None)


def methods(target, max_new_tokens: int, configs: dict[str, Callable]) -> dict[str, GreedyRun]:
    """configs: name -> drafter factory; AR first."""
    return {"AR": GreedyRun(target, max_new_tokens)} | {
        name: GreedyRun(target, max_new_tokens, make) for name, make in configs.items()
    }


def decode_runs(prompts, target, max_new_tokens: int, configs: dict[str, Callable], meta: dict | None = None):
    """Paired runs (`bench.paired_runs`) of AR and every configuration on `prompts`, tagged with `meta`."""
    runs = bench.paired_runs(prompts, methods(target, max_new_tokens, configs), progress=tqdm)
    return runs if meta is None else runs.assign(**meta)


def self_drafter(target: HybridLM, layers, k: int, exit=None) -> Callable[[], LayerSkipDrafter]:
    return partial(LayerSkipDrafter, target, layers, k, exit=exit)


def label(drafter: str, k: int) -> str:
    return f"{drafter} | k={k}"


def split_label(df: pd.DataFrame) -> pd.DataFrame:
    """The table with `drafter` and `k` columns read from its "drafter | k=K" method names."""
    parts = df.method.str.rsplit(" | k=", n=1)
    return df.assign(drafter=parts.str[0], k=parts.str[1].astype(int))


def speedup_table(runs: pd.DataFrame, seed: int) -> pd.DataFrame:
    """`bench.speedup_table` of the runs, with their drafter and k."""
    return split_label(bench.speedup_table(runs, seed=seed))


def all_configs(target: HybridLM, draft, subsets: dict, ks, draft_name: str) -> dict[str, Callable]:
    """Every subset and the separate draft at every k (the pilot runs)."""
    cfgs = {label(name, k): self_drafter(target, layers, k) for name, layers in subsets.items() for k in ks}
    return cfgs | {label(draft_name, k): partial(ModelDrafter, draft, k) for k in ks}


def report_configs(target: HybridLM, draft, subsets: dict, chosen: dict, draft_name: str) -> dict[str, Callable]:
    """Every subset and the separate draft at its k chosen on the pilot prompts."""
    cfgs = {label(n, chosen[n]): self_drafter(target, layers, chosen[n]) for n, layers in subsets.items()}
    return cfgs | {label(draft_name, chosen[draft_name]): partial(ModelDrafter, draft, chosen[draft_name])}


def choose_k(pilot: pd.DataFrame) -> dict[str, int]:
    """drafter -> the k of its fastest pilot run."""
    chosen_k = pilot.loc[pilot.groupby("drafter", sort=False).speedup.idxmax()].set_index("drafter").k
    return {d: int(k) for d, k in chosen_k.items()}


def pilot_table(pilot_runs: pd.DataFrame, seed: int) -> pd.DataFrame:
    """The pilot's speedup table, `chosen` marking each drafter's fastest k."""
    pilot = speedup_table(pilot_runs, seed)
    chosen = choose_k(pilot)
    pilot["chosen"] = [chosen[d] == k for d, k in zip(pilot.drafter, pilot.k)]
    return pilot


def report_table(runs: pd.DataFrame, subsets: dict, seed: int) -> pd.DataFrame:
    """The reported runs' speedup table with each drafter's layers and the analytic model's prediction."""
    report = speedup_table(runs, seed)
    report["layers"] = report.drafter.map(lambda d: str(subsets.get(d, "")))
    report["predicted"] = [predicted_speedup(r.token_acceptance, r.k, r.c, r.v) for r in report.itertuples()]
    return report


def best_self_draft(pilot: pd.DataFrame, draft_name: str):
    """The pilot row of the fastest self-draft at its chosen k."""
    return pilot[(pilot.drafter != draft_name) & pilot.chosen].sort_values("speedup").iloc[-1]


def plot_subsets(report: pd.DataFrame, subsets: dict, draft_name: str, context: int, ks):
    """Speedups with their intervals (left) and decoding acceptance against in-loop c (right)."""

    def colour(d):
        return "k" if d == draft_name else f"C{list(subsets).index(d)}"

    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.6))
    order = report.sort_values("speedup")
    y = np.arange(len(order))
    axes[0].barh(y, order.speedup, color=[colour(d) for d in order.drafter], alpha=0.8)
    axes[0].errorbar(
        order.speedup, y, xerr=[order.speedup - order.lo, order.hi - order.speedup], fmt="none", ecolor="k", capsize=3
    )
    axes[0].set_yticks(y, [f"{d} (k = {k})" for d, k in zip(order.drafter, order.k)], fontsize=8)
    axes[0].axvline(1, color="k", lw=0.8)
    axes[0].set(xlabel="speedup over AR (median over reported prompts)", title=f"greedy, {context}-token prompts")
    for r in report.itertuples():
        marker = "x" if r.drafter == draft_name else "o"
        axes[1].scatter(r.c, r.token_acceptance, color=colour(r.drafter), s=50, marker=marker)
        axes[1].annotate(r.drafter, (r.c, r.token_acceptance), fontsize=7, xytext=(4, 3), textcoords="offset points")
    v_loop = report.v.median()
    for k, ls in [(ks[0], ":"), (ks[-1], "--")]:
        be = [alpha_needed(k, c, v_loop) for c in C_GRID]
        axes[1].plot(C_GRID, be, color="grey", ls=ls, lw=1, label=f"break-even, k = {k}")
    axes[1].set(
        xlabel="in-loop c (drafting per token / AR step)",
        ylabel="per-token acceptance α (decoding)",
        ylim=(0, 1.02),
        title="accuracy against cost",
    )
    axes[1].legend(fontsize=8)
    return fig


def subsets_text(report: pd.DataFrame, pilot: pd.DataFrame, subsets: dict, draft_name: str) -> str:
    selfs = report[report.drafter != draft_name]
    piloted = best_self_draft(pilot, draft_name)
    best = piloted.drafter
    sep = report[report.drafter == draft_name].iloc[0]
    chosen = report[report.drafter == best].iloc[0]
    off = (report.predicted - report.speedup).abs()
    return (
        f"On the pilot prompts the best self-draft is **{best}** (layers {subsets[best]}) at k = {int(piloted.k)} "
        f"({piloted.speedup:.2f}x). On the reported prompts it runs at {chosen.speedup:.2f}x over AR (95% CI "
        f"{chosen.lo:.2f}–{chosen.hi:.2f}); the self-drafts span {selfs.speedup.min():.2f}x to "
        f"{selfs.speedup.max():.2f}x there, the separate draft {sep.speedup:.2f}x at k = {int(sep.k)} "
        f"(CI {sep.lo:.2f}–{sep.hi:.2f}). Per-token acceptance spans {selfs.token_acceptance.min():.2f}–"
        f"{selfs.token_acceptance.max():.2f} for the subsets ({sep.token_acceptance:.2f} for the separate draft) "
        f"while their in-loop c spans {selfs.c.min():.2f}–{selfs.c.max():.2f} ({sep.c:.3f}). The analytic model "
        f"with these in-loop α, c and v is off the measured speedup by {off.median():.2f} at the median and "
        f"{off.max():.2f} at most ({report.loc[off.idxmax()].drafter}). Outputs identical "
        f"to AR: {int(report.identical.sum())} / {int(report.runs.sum())} reported runs, "
        f"{int(pilot.identical.sum())} / {int(pilot.runs.sum())} pilot runs."
    )


# --- 3 · a trained exit --------------------------------------------------------------------------------
def exit_tables(
    target: HybridLM,
    best: str,
    layers: list[int],
    k_best: int,
    p: Prompts,
    ks,
    max_new_tokens: int,
    *,
    steps: int,
    minutes: float,
    rank: int,
    seed: int,
    smoke: bool,
    meta: dict,
) -> dict[str, pd.DataFrame]:
    """Train an exit adapter for the subset `best` on the training stream, choose its k on the pilot
    prompts and decode the reported prompts with the subset without it (at `k_best`) and with it."""
    stream = train.token_stream("train", target.tokenizer)
    small = dict(batch=2, seq=64, n_eval=2) if smoke else {}
    adapter, rep = train_exit(target, layers, stream, steps, minutes=minutes, rank=rank, seed=seed, **small)
    weights = pd.DataFrame(
        [
            dict(name=n, shape=list(w.shape), values=w.detach().float().flatten().tolist())
            for n, w in adapter.state_dict().items()
        ]
    )
    rep = pd.DataFrame(
        [{**rep, "layers": str(rep["layers"]), "subset": best, "params": sum(w.numel() for w in adapter.parameters())}]
    )
    pilot_cfgs = {label(f"{best} + exit", k): self_drafter(target, layers, k, adapter) for k in ks}
    p_runs = decode_runs(p.pilot, target, max_new_tokens, pilot_cfgs)
    p_tab = speedup_table(p_runs, seed)
    k_exit = int(p_tab.loc[p_tab.speedup.idxmax()].k)
    r_cfgs = {
        label(best, k_best): self_drafter(target, layers, k_best),
        label(f"{best} + exit", k_exit): self_drafter(target, layers, k_exit, adapter),
    }
    r_runs = decode_runs(p.report, target, max_new_tokens, r_cfgs)
    return {
        "exit_report": rep.assign(k_exit=k_exit, **meta),
        "exit_weights": weights,
        "exit_pilot_runs": p_runs.assign(**meta),
        "exit_runs": r_runs.assign(**meta),
    }


def load_adapter(target: HybridLM, report: pd.Series, weights: pd.DataFrame) -> ExitAdapter:
    """The trained exit adapter, rebuilt from the exit step's saved weights."""
    adapter = ExitAdapter(target.config.hidden_size, int(report["rank"])).to(target.device)
    adapter.load_state_dict(
        {
            r["name"]: torch.tensor(np.asarray(r["values"], dtype=np.float32)).reshape([int(s) for s in r["shape"]])
            for _, r in weights.iterrows()
        }
    )
    return adapter.eval()


def plot_exit(rep: pd.Series, exit_tab: pd.DataFrame):
    """Teacher-forced KL and acceptance before and after training (left); decoding without and with the
    exit (right)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].bar([0, 1], [rep.kl_before, rep.kl_after], color=["C7", "C2"], width=0.35, label="KL(p ‖ q), nats")
    axes[0].bar([2, 3], [rep.acceptance_before, rep.acceptance_after], color=["C7", "C2"], width=0.35)
    axes[0].set_xticks([0, 1, 2, 3], ["KL before", "KL after", "Σmin(p,q) before", "Σmin(p,q) after"], fontsize=8)
    axes[0].set(title=f"teacher-forced, held-out windows ({int(rep.steps)} steps)")
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
    return fig


def exit_text(rep: pd.Series, exit_tab: pd.DataFrame, best: str) -> str:
    no, yes = exit_tab.iloc[0], exit_tab.iloc[1]
    return (
        f"Training the exit for {best} ({int(rep.params)} weights, {int(rep.steps)} steps, "
        f"{rep.seconds:.0f} s) moved the held-out KL from {rep.kl_before:.3f} to {rep.kl_after:.3f} "
        f"nats and the teacher-forced acceptance from {rep.acceptance_before:.3f} to {rep.acceptance_after:.3f}. In "
        f"decoding, per-token acceptance goes from {no.token_acceptance:.3f} (k = {int(no.k)}) to "
        f"{yes.token_acceptance:.3f} (k = {int(yes.k)}) and the speedup from {no.speedup:.2f}x (CI {no.lo:.2f}–"
        f"{no.hi:.2f}) to {yes.speedup:.2f}x (CI {yes.lo:.2f}–{yes.hi:.2f}); the exit's in-loop c is {yes.c:.3f} "
        f"against {no.c:.3f} without it. Outputs identical to AR: {int(exit_tab.identical.sum())} / "
        f"{int(exit_tab.runs.sum())}."
    )


# --- 4 · context length --------------------------------------------------------------------------------
def context_configs(
    target: HybridLM, draft, subsets: dict, best: str, chosen: dict, k_exit: int, adapter, draft_name: str
) -> dict[str, Callable]:
    """Section 4's drafters: the chosen subset, the same with its exit, the linear subgraph when it is not
    the chosen one, and the separate draft, each at its k chosen on the pilot prompts."""
    cfgs = {
        label(best, chosen[best]): self_drafter(target, subsets[best], chosen[best]),
        label(f"{best} + exit", k_exit): self_drafter(target, subsets[best], k_exit, adapter),
    }
    if best != "linear":
        cfgs[label("linear", chosen["linear"])] = self_drafter(target, subsets["linear"], chosen["linear"])
    cfgs[label(draft_name, chosen[draft_name])] = partial(ModelDrafter, draft, chosen[draft_name])
    return cfgs


def pilot_speeds(pilot: pd.DataFrame, exit_pilot: pd.DataFrame, best: str, chosen: dict, k_exit: int) -> dict:
    """Self-draft method -> its pilot speedup: the chosen subset at its k from section 2's pilot, the same
    with its exit from section 3's, and the linear subgraph when it is not the chosen subset."""
    speeds = {
        label(best, chosen[best]): float(pilot[(pilot.drafter == best) & pilot.chosen].speedup.iloc[0]),
        label(f"{best} + exit", k_exit): float(exit_pilot[exit_pilot.k == k_exit].speedup.iloc[0]),
    }
    if best != "linear":
        speeds[label("linear", chosen["linear"])] = float(
            pilot[(pilot.drafter == "linear") & pilot.chosen].speedup.iloc[0]
        )
    return speeds


def context_runs(target, configs: dict, p: Prompts, contexts, max_new_tokens: int, meta: dict) -> pd.DataFrame:
    """Paired runs of every configuration at every context length, on the same anchors."""
    frames = []
    for ctx in tqdm(contexts, desc="contexts"):
        runs = decode_runs(p.at_context(ctx), target, max_new_tokens, configs)
        frames.append(runs.assign(context=ctx))
    return pd.concat(frames, ignore_index=True).assign(**meta)


def decoding_only(runs: pd.DataFrame) -> pd.DataFrame:
    """The same rows with a run's time reduced to its drafting and verifying (prefill excluded)."""
    out = runs.copy()
    out["seconds"] = out.draft_s + out.verify_s
    out["tokens_per_s"] = out.new_tokens / out.seconds
    return out


def context_tables(ctx_runs: pd.DataFrame, ctx_self: str, separate: str, seed: int):
    """(speedups per context and timing, the paired ratio of `ctx_self` over the `separate` draft's method)."""
    rows, paired = [], []
    for ctx, g in ctx_runs.groupby("context"):
        for how, frame in [("end to end", g), ("decoding only", decoding_only(g))]:
            rows.append(speedup_table(frame, seed).assign(context=ctx, timing=how))
            pr = bench.speedup(frame, ctx_self, reference=separate, seed=seed)
            paired.append(
                dict(
                    context=ctx, timing=how, self_draft=ctx_self, over_separate=pr["speedup"], lo=pr["lo"], hi=pr["hi"]
                )
            )
    ctx_tab = pd.concat(rows, ignore_index=True)
    ctx_tab["chosen_on_pilot"] = ctx_tab.method == ctx_self
    return ctx_tab, pd.DataFrame(paired)


def need_table(ctx_tab: pd.DataFrame, draft_name: str, speedup: float = 1.3) -> pd.DataFrame:
    """What `speedup` over AR would need, per context: the acceptance the analytic model asks of each
    self-draft at the c and v(k) it paid inside the runs (decoding only), and what α = 1 would give."""
    need = []
    for r in ctx_tab[(ctx_tab.timing == "decoding only") & (ctx_tab.drafter != draft_name)].itertuples():
        need.append(
            dict(
                context=r.context,
                drafter=r.drafter,
                k=r.k,
                c=r.c,
                v=r.v,
                alpha_measured=r.token_acceptance,
                alpha_for_1_3x=alpha_needed(r.k, r.c, r.v, speedup, grid=np.linspace(0, 0.9999, 2000)),
                best_possible=predicted_speedup(1.0, r.k, r.c, r.v),
            )
        )
    return pd.DataFrame(need)


def plot_context(ctx_tab: pd.DataFrame, contexts, draft_name: str, trained_context: int):
    """End-to-end (left) and decoding-only (middle) speedups, and acceptance (right), against the context."""
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
                color="k" if d == draft_name else f"C{i}",
                ls="--" if d == draft_name else "-",
                label=f"{d} (k = {int(g.k.iloc[0])})",
            )
        ax.axhline(1, color="k", lw=0.8)
        if trained_context < max(contexts):
            ax.axvline(trained_context, color="grey", lw=0.8, ls=":")
        ax.set(xscale="log", xlabel="context (tokens)", title=how)
        ax.set_xticks(contexts, [str(c) for c in contexts])
        ax.minorticks_off()
    axes[0].set_ylabel("speedup over AR (median over prompts)")
    axes[1].legend(fontsize=8)
    t = ctx_tab[ctx_tab.timing == "end to end"]
    for i, (d, g) in enumerate(t.groupby("drafter", sort=False)):
        g = g.sort_values("context")
        axes[2].plot(
            g.context,
            g.token_acceptance,
            "o-" if d != draft_name else "x--",
            color="k" if d == draft_name else f"C{i}",
            label=d,
        )
    axes[2].set(
        xscale="log", xlabel="context (tokens)", ylabel="per-token acceptance α", ylim=(0, 1.02), title="acceptance"
    )
    axes[2].set_xticks(contexts, [str(c) for c in contexts])
    axes[2].minorticks_off()
    return fig


def context_text(
    ctx_tab: pd.DataFrame, ctx_pair: pd.DataFrame, need: pd.DataFrame, ctx_self: str, best: str, draft_name: str
) -> str:
    """Section 4's paragraphs: speedups by context and timing, acceptance by context, and the acceptance
    1.3x would need."""
    text = []
    for how in ["end to end", "decoding only"]:
        top = ctx_tab[(ctx_tab.timing == how) & ctx_tab.chosen_on_pilot].set_index("context")
        sep_t = ctx_tab[(ctx_tab.timing == how) & (ctx_tab.drafter == draft_name)].set_index("context")
        pr = ctx_pair[ctx_pair.timing == how].set_index("context")
        hits = top.index[top.lo > 1]
        over_ar = int(hits.min()) if len(hits) else None
        over_sep = next((c for c in pr.index if pr.lo[c] > 1), None)
        text.append(
            f"**{how.capitalize()}.** The self-draft chosen on the pilot prompts ({ctx_self}) runs at "
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
    acc = ctx_tab[ctx_tab.timing == "end to end"].pivot_table(
        index="drafter", columns="context", values="token_acceptance", sort=False
    )
    text.append(
        "**Acceptance by context.** Per-token α of the separate draft: "
        + ", ".join(f"{acc.loc[draft_name, c]:.2f} at {c}" for c in acc.columns)
        + f"; of {best}: "
        + ", ".join(f"{acc.loc[best, c]:.2f} at {c}" for c in acc.columns)
        + ". "
        + (
            "Contexts above 256 tokens lie beyond both models' training windows, so these runs also measure how "
            "each model extrapolates."
            if max(acc.columns) > 256
            else ""
        )
    )
    n_best = need.groupby("context").apply(lambda g: g.loc[g.best_possible.idxmax()], include_groups=False)
    text.append(
        "**Why, in the analytic model's terms.** For the most favourable self-draft at each context (at the c and "
        "v(k) it paid in these runs), 1.3x over AR would need: "
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
    return "\n\n".join(text)


# --- 5 · perplexity against acceptance -----------------------------------------------------------------
def perplexity(
    target: HybridLM, hist: pd.DataFrame, subsets: dict, best: str, adapter, windows, context: int, meta: dict
) -> pd.DataFrame:
    """Held-out loss and teacher-forced greedy acceptance of the full model, every subset the search
    measured, every named kind, and the chosen subset with its exit."""
    pm = proxy_measure(target, windows, context=context, temperature=0.0)
    todo = dict.fromkeys(
        [str(list(range(len(target.is_gdn))))] + list(hist.layers) + [str(s) for s in subsets.values()]
    )
    rows = []
    for s in tqdm(todo, desc="subsets"):
        layers = parse_layers(s)
        rows.append(dict(layers=s, exit=False, loss=subset_loss(target, layers, windows), tf_acceptance=pm(layers)[0]))
    rows.append(
        dict(
            layers=str(subsets[best]),
            exit=True,
            loss=subset_loss(target, subsets[best], windows, exit=adapter),
            tf_acceptance=acceptance_proxy(target, subsets[best], windows, exit=adapter, temperature=0.0),
        )
    )
    return pd.DataFrame(rows).assign(**meta)


def perplexity_tables(
    ppl: pd.DataFrame, subsets: dict, report: pd.DataFrame, exit_tab: pd.DataFrame, draft_name: str
) -> dict:
    """The points (every subset's degradation over the full model), the decoding points (subsets that
    decoded, with their α), Spearman's ρ of both against acceptance, and the full model's loss."""
    everything = ppl.layers.iloc[0]  # the step measures the full model first
    full_loss = float(ppl[(ppl.layers == everything) & ~ppl.exit].loss.iloc[0])
    ppl = ppl.assign(degradation=ppl.loss - full_loss, perplexity=np.exp(ppl.loss))
    ppl = ppl[~((ppl.layers == everything) & ~ppl.exit)]
    name_of = {str(s): n for n, s in subsets.items()}
    ppl = ppl.assign(subset=[name_of.get(s, "") + (" + exit" if e else "") for s, e in zip(ppl.layers, ppl.exit)])
    dec = pd.concat(
        [
            report[report.drafter != draft_name][["drafter", "token_acceptance"]],
            exit_tab[exit_tab.drafter.str.endswith("+ exit")][["drafter", "token_acceptance"]],
        ]
    )
    dec = dec.merge(ppl[ppl.subset != ""][["subset", "degradation", "loss"]], left_on="drafter", right_on="subset")
    rho_dec = spearmanr(dec.degradation, dec.token_acceptance) if len(dec) > 2 else None
    rho_tf = spearmanr(ppl.degradation, ppl.tf_acceptance)
    corr = pd.DataFrame(
        [
            dict(
                acceptance="decoding α (section 2–3 subsets)", n=len(dec), rho=rho_dec.statistic if rho_dec else np.nan
            ),
            dict(acceptance="teacher-forced greedy (every subset measured)", n=len(ppl), rho=rho_tf.statistic),
        ]
    )
    return dict(points=ppl, decoding=dec, correlation=corr, full_loss=full_loss)


def plot_perplexity(t: dict, best: str):
    """Degradation against decoding α (left) and against teacher-forced acceptance (right)."""
    ppl, dec, corr = t["points"], t["decoding"], t["correlation"]
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
    axes[1].scatter(ppl[ppl.exit].degradation, ppl[ppl.exit].tf_acceptance, s=60, color="C3", label=f"{best} + exit")
    axes[1].set(
        title=f"teacher-forced: Spearman ρ = {corr.rho[1]:.2f} (n = {len(ppl)})",
        ylabel="teacher-forced greedy acceptance",
        xlabel="log(PPL_subset / PPL_full), nats",
    )
    axes[1].legend(fontsize=8)
    for ax in axes:
        ax.set_ylim(0, 1.02)
    return fig


def perplexity_text(t: dict, best: str) -> str:
    ppl, dec, corr, full_loss = t["points"], t["decoding"], t["correlation"], t["full_loss"]
    lin = ppl[(ppl.subset == "linear")].iloc[0]
    d_plain, a_plain = ppl[(ppl.subset == best)][["degradation", "tf_acceptance"]].iloc[0]
    d_exit, a_exit = ppl[ppl.exit][["degradation", "tf_acceptance"]].iloc[0]
    return (
        f"The full model's held-out loss is {full_loss:.3f} nats (perplexity {np.exp(full_loss):.1f}); skipping the "
        f"attention layers raises it by {lin.degradation:.3f} nats (perplexity {lin.perplexity:.1f}). Across the "
        f"{len(ppl)} subsets measured, the rank correlation between degradation and teacher-forced acceptance is "
        f"ρ = {corr.rho[1]:.2f}; over the {len(dec)} subsets that decoded, between degradation and decoding α, "
        f"ρ = {corr.rho[0]:.2f}. "
        + (
            "Both are negative: on these windows and prompts, the more a subset degrades the model, the less often "
            "its drafts are kept, as the component-aware study found. "
            if corr.rho.max() < 0
            else "The two correlations do not agree in sign, so the ablated perplexity does not rank acceptance "
            "consistently here. "
            if corr.rho.min() < 0
            else "Neither is negative: the ablated perplexity does not rank acceptance on this model. "
        )
        + "How far the ranking generalises beyond these windows is not tested: the subsets lie along one search path "
        "and share the windows they are scored on, so the points are not independent and no p-value is given. "
        + f"The trained exit moves its subset's degradation from {d_plain:.3f} to {d_exit:.3f} nats and its "
        f"teacher-forced acceptance from {a_plain:.3f} to {a_exit:.3f}."
    )


# --- 6 · other hybrid families -------------------------------------------------------------------------
def load_families(names, device: str) -> dict:
    """name -> LM for every other family; a name that is not a shipped checkpoint is a ValueError."""
    shipped = checkpoints()
    missing = [name for name in names if name not in shipped]
    if missing:
        raise ValueError(
            f"OTHER_FAMILIES {missing} are not shipped checkpoints ({', '.join(shipped)}); train them with "
            f"`python -m speclib train model NAME ...` (presets in speclib/research/training.py, commands in "
            f"`make train`)"
        )
    return {name: load(name, device=device) for name in names}


def linear_subgraph(lm):
    """A model's linear subgraph as an LM: layer views for Qwen3.5-style hybrids, the attention branch
    switched off for parallel hybrids (Falcon-H1)."""
    if isinstance(lm, HybridLM):
        return lm.view(layers=subset(lm, "linear"), exit=None)
    return BranchSkipLM(lm)


def _full(lm):
    return lm.view(layers=list(range(len(lm.is_gdn))), exit=None) if isinstance(lm, HybridLM) else lm


def families(models: dict, windows, context: int, repeats: int, meta: dict) -> dict[str, pd.DataFrame]:
    """Per model: the full model's and its linear subgraph's held-out loss (per window too), their
    teacher-forced acceptance at temperatures 0 and 1, and the subgraph's timed cost c."""
    rows, per_window = [], []
    for name, lm in models.items():
        full, sub = _full(lm), linear_subgraph(lm)
        t_full, t_sub = bench.latencies([(full, 1), (sub, 1)], prefix_len=context, repeats=repeats, warmup=3)
        # per window (all windows have the same length, so their mean is the pooled loss): the degradation
        # of two models compared window by window, with a paired interval
        for i, w in enumerate(windows):
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
                tf_acceptance_t0=lm_acceptance(full, sub, windows, temperature=0.0),
                tf_acceptance_t1=lm_acceptance(full, sub, windows, temperature=1.0),
                c=t_sub / t_full,
            )
        )
    return {"families": pd.DataFrame(rows).assign(**meta), "family_windows": pd.DataFrame(per_window).assign(**meta)}


def family_runs(models: dict, prompts, ks, max_new_tokens: int, meta: dict) -> dict[str, pd.DataFrame]:
    """Every run's row (paired_runs), one model after another: its AR and its linear subgraph at every k
    (`family_runs_table` summarises them)."""
    frames = []
    for name, lm in models.items():
        sub = linear_subgraph(lm)
        cfgs = {label("linear", k): partial(ModelDrafter, sub, k) for k in ks}
        frames.append(decode_runs(prompts, lm, max_new_tokens, cfgs).assign(model=name))
    return {"family_run_rows": pd.concat(frames, ignore_index=True).assign(**meta)}


def family_runs_table(rows: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Each model's speedup table over its own AR."""
    return pd.concat(
        [speedup_table(g.drop(columns="model"), seed).assign(model=m) for m, g in rows.groupby("model", sort=False)],
        ignore_index=True,
    )


def family_k(runs_tab: pd.DataFrame) -> int:
    """The component-aware study's k = 2 when it was run, else the smallest k."""
    ks = sorted(runs_tab.k.unique())
    return 2 if 2 in ks else int(ks[0])


def per_prompt(rows: pd.DataFrame, model: str, k: int) -> pd.DataFrame:
    """One model's linear-subgraph runs at draft length k, one row per prompt, in prompt order."""
    g = rows[(rows.model == model) & (rows.method == label("linear", k))]
    return g.groupby("prompt")[["accepted", "drafted", "reached"]].sum().sort_index()


def sign(lo: float, hi: float) -> int:
    """1 when the interval lies above 0, -1 below it, 0 when it holds 0."""
    return 1 if lo > 0 else -1 if hi < 0 else 0


def family_pairs(rows: pd.DataFrame, windows: pd.DataFrame, names: list[str], k: int, seed: int) -> pd.DataFrame:
    """Every pair of models (a before b in `names`): the paired differences, with 95% intervals, of pooled
    acceptance (accepted / drafted), per-token acceptance (accepted / reached) over the same prompts and
    of loss degradation over the same windows, and the order each interval gives."""

    def acceptance_diff(a, b, den):
        pa, pb = per_prompt(rows, a, k), per_prompt(rows, b, k)
        return stats.paired_difference_ci(
            dict(num=pa.accepted, den=pa[den]), dict(num=pb.accepted, den=pb[den]), seed=seed
        )

    def degradation_diff(a, b):
        wa, wb = (windows[windows.model == m].sort_values("window") for m in (a, b))
        return stats.paired_difference_ci(
            dict(num=(wa.loss_linear - wa.loss_full).to_numpy(), den=np.ones(len(wa))),
            dict(num=(wb.loss_linear - wb.loss_full).to_numpy(), den=np.ones(len(wb))),
            seed=seed,
        )

    pairs = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            row = dict(a=a, b=b, k=k)
            for what, (d, lo, hi) in [
                ("acceptance", acceptance_diff(a, b, "drafted")),
                ("token_acceptance", acceptance_diff(a, b, "reached")),
                ("degradation", degradation_diff(a, b)),
            ]:
                row |= {f"{what}_diff": d, f"{what}_lo": lo, f"{what}_hi": hi}
            pairs.append(row)
    pairs = pd.DataFrame(pairs)
    pairs["acceptance_order"] = [sign(r.acceptance_lo, r.acceptance_hi) for r in pairs.itertuples()]
    pairs["token_order"] = [sign(r.token_acceptance_lo, r.token_acceptance_hi) for r in pairs.itertuples()]
    pairs["degradation_order"] = [sign(r.degradation_lo, r.degradation_hi) for r in pairs.itertuples()]
    return pairs


def acceptance_ci(rows: pd.DataFrame, model: str, k: int, seed: int) -> tuple[float, float, float]:
    """(acceptance, lo, hi): accepted / drafted pooled over prompts, 95% bootstrap interval over prompts."""
    p = per_prompt(rows, model, k)
    acc, dr = p.accepted.to_numpy(), p.drafted.to_numpy()
    return stats.bootstrap_ci(
        np.arange(len(p)), stat=lambda ix: acc[ix.astype(int)].sum() / dr[ix.astype(int)].sum(), seed=seed
    )


def _compare(r, what: str) -> str:
    """A phrase comparing r.a with r.b on `what` ("acceptance", "token_acceptance", "degradation")."""
    d, lo, hi = getattr(r, f"{what}_diff"), getattr(r, f"{what}_lo"), getattr(r, f"{what}_hi")
    verdict = "higher" if lo > 0 else "lower" if hi < 0 else "not distinguishable (the interval holds 0)"
    return f"{d:+.3f} (95% CI {lo:+.3f} to {hi:+.3f}): {verdict}"


def family_text(
    fam: pd.DataFrame, rows: pd.DataFrame, runs_tab: pd.DataFrame, pairs: pd.DataFrame, target: str, ks, seed: int
) -> str:
    """Section 6's paragraphs: each model's acceptance with its interval, against the component-aware
    study's for its family, the paired comparisons, section 5's rule checked on them, and the speedups."""
    models = list(fam.model)
    k2 = family_k(runs_tab)
    acc = runs_tab.pivot(index="k", columns="model", values="acceptance").loc[k2]
    sp, f2 = runs_tab.set_index(["model", "k"]), fam.set_index("model")
    ci = {m: acceptance_ci(rows, m, k2, seed) for m in models}
    lines = [
        f"Acceptance of the linear subgraph at k = {k2} on the same {len(per_prompt(rows, target, k2))} reported "
        f"prompts, with a 95% bootstrap interval over prompts: "
        + "; ".join(
            f"`{m}` {acc[m]:.3f} (CI {ci[m][1]:.3f}–{ci[m][2]:.3f}; teacher-forced greedy agreement "
            f"{f2.tf_acceptance_t0[m]:.3f}, degradation {f2.degradation[m]:.2f} nats, c = {f2.c[m]:.2f})"
            for m in models
        )
        + "."
    ]
    for m in models:
        ref = STUDY_ALPHA.get(f2.architecture[m])
        if ref is not None:
            _, lo, hi = ci[m]
            where = "lies above it" if lo > ref else "lies below it" if hi < ref else "holds it"
            lines.append(
                f"`{m}` against the component-aware study's {ref} for its family: its interval {where} ({lo:.3f}–{hi:.3f})."
            )
    lines.append(
        "Paired comparisons (first model minus second; acceptance rate accepted / drafted, per-token acceptance "
        "accepted / reached, loss degradation over the same windows): "
        + " ".join(
            f"`{r.a}` − `{r.b}`: acceptance {_compare(r, 'acceptance')}; per-token "
            f"{_compare(r, 'token_acceptance')}; degradation {_compare(r, 'degradation')}."
            for r in pairs.itertuples()
        )
    )
    resolved = pairs[(pairs.degradation_order != 0) & (pairs.acceptance_order != 0)]
    agree = int((resolved.degradation_order == -resolved.acceptance_order).sum())
    unresolved = len(pairs) - len(resolved)
    lines.append(
        f"Section 5's rule (the subgraph that degrades its model more drafts worse) can be checked on {len(resolved)} "
        f"of the {len(pairs)} pairs of models, those where both intervals exclude 0: it holds on {agree} and fails on "
        f"{len(resolved) - agree}"
        + (f"; on the other {unresolved} the data cannot order the pair." if unresolved else ".")
    )
    lines.append(
        f"Speedups over each model's own AR at the study's k = {k2} (fixed in advance, not tuned): "
        + ", ".join(
            f"`{m}` {sp.loc[(m, k2)].speedup:.2f}x (CI {sp.loc[(m, k2)].lo:.2f}–{sp.loc[(m, k2)].hi:.2f})"
            for m in models
        )
        + "; at every k of KS: "
        + "; ".join(f"`{m}` " + ", ".join(f"{sp.loc[(m, k)].speedup:.2f}x (k = {k})" for k in ks) for m in models)
        + f". Every greedy output identical to AR's ({int(runs_tab.identical.sum())}/{int(runs_tab.runs.sum())})."
    )
    return "\n\n".join(lines)
