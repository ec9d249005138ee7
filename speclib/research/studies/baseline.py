"""Notebook 01 (lossless speculative decoding from scratch): its steps, tables, figures and generated text.

Each step function takes what it measures as arguments (the notebook binds them with `functools.partial`
for `Study.step`) and returns the tables the step saves; the other functions derive the notebook's
tables from those, draw its figures (returned, for the notebook to save and show) and write the
sentences of its generated text cells from this run's numbers."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from speclib.core import analytic, device
from speclib.core.acceptance import output_distribution
from speclib.core.generate import generate
from speclib.core.sampling import Sampling, probs
from speclib.drafters.feature import FeatureDrafter
from speclib.drafters.model import ModelDrafter
from speclib.drafters.overlap import OverlapDrafter
from speclib.lms.loading import describe
from speclib.research import bench, data, stats

GREEDY, T1 = Sampling(0.0), Sampling(1.0)
LOSSLESS, RAW_Q_BUG = "lossless", "raw-q bug (#47932)"
# the seed study's published chi-square test (a quotation, not a measurement of this workbook)
SEED_STUDY_CHI2 = dict(chi2=162.5, dof=200, p=0.976, tokens_per_method=9200)


def k_of(method: pd.Series) -> pd.Series:
    """The draft length in method names such as "SD K=3" (0 where a name has none, e.g. "AR")."""
    return method.str.extract(r"K=(\d+)", expand=False).fillna(0).astype(int)


def code_prompts(target, n: int) -> list[list[int]]:
    """The first `n` prompts, encoded with the target's tokenizer: held-out standard-library excerpts and
    HumanEval problems, interleaved so that the pilot and the reported sets both mix the two sources."""
    stdlib_rows, humaneval_rows = data.load_workload("code_stdlib", n), data.load_workload("code_humaneval", n)
    prompt_rows = [r for pair in zip(stdlib_rows, humaneval_rows) for r in pair][:n]
    return [target.encode(r["prompt"]) for r in prompt_rows]


# ---- section 1: the pair and its costs ---------------------------------------------------------


def measure_costs(target, draft, ks, repeats, meta) -> dict:
    """Step "cost": each model's card and bare one-token latency, and c, v(K) for every K."""
    prof = bench.cost_profile(target, draft, ks, prefix_len=128, repeats=repeats)
    models = pd.DataFrame(
        [
            dict(role="target", **describe(target), latency_ms=prof["target_1"] * 1e3),
            dict(role="draft", **describe(draft), latency_ms=prof["draft_1"] * 1e3),
        ]
    )
    cost = pd.DataFrame([dict(K=k, v=prof["v"][k], c=prof["c"]) for k in ks])
    return {"models": models.assign(**meta), "cost": cost.assign(**meta)}


def bare_profile(models: pd.DataFrame, cost: pd.DataFrame) -> dict:
    """The saved cost step as `bench.cost_profile` returns it: seconds per token, c, and {K: v(K)}."""
    return dict(
        target_1=models.latency_ms[0] / 1e3,
        draft_1=models.latency_ms[1] / 1e3,
        c=cost.c[0],
        v=dict(zip(cost.K, cost.v)),
    )


def cost_text(models: pd.DataFrame, prof: dict, ks) -> str:
    v_text = ", ".join(f"{prof['v'][k]:.2f}" for k in ks)
    return (
        f"The target has {models.parameters[0] / 1e6:.1f}M parameters and held-out loss "
        f"{models.heldout_loss[0]:.3f}; the draft {models.parameters[1] / 1e6:.2f}M and {models.heldout_loss[1]:.3f} "
        f"(nan: a checkpoint that did not record one). "
        f"One target token costs {prof['target_1'] * 1e3:.2f} ms, one draft token {prof['draft_1'] * 1e3:.2f} ms: "
        f"**c = {prof['c']:.3f}** (the target is {1 / prof['c']:.1f}x slower). Verifying K + 1 tokens costs "
        f"v(K) = {v_text} times one token for K = 1..{max(ks)}."
    )


# ---- section 2: the exact math of the rule --------------------------------------------------------

# (family, vocabulary size, zeros forced into p, zeros forced into q)
PAIR_FAMILIES = [
    ("dense", 16, 0, 0),
    ("q zero where p > 0", 16, 0, 8),
    ("p zero where q > 0", 16, 8, 0),
    ("both sparse", 256, 200, 200),
    ("full vocabulary", 4096, 0, 0),
]


def random_pair(v: int, gen: torch.Generator, zp: int, zq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random float64 (p, q) over `v` tokens, with `zp` entries of p and `zq` of q set to zero."""
    p = torch.rand(v, generator=gen, dtype=torch.float64) ** 3
    q = torch.rand(v, generator=gen, dtype=torch.float64) ** 3
    p[torch.randperm(v, generator=gen)[:zp]] = 0
    q[torch.randperm(v, generator=gen)[:zq]] = 0
    return p / p.sum(), q / q.sum()


def raw_q_bug(p: torch.Tensor, q_drawn: torch.Tensor, q_raw: torch.Tensor) -> torch.Tensor:
    """Output distribution when tokens come from q_drawn but the ratio uses q_raw."""
    acc = q_drawn * (p / q_raw).clamp(max=1)
    r = (p - q_raw).clamp_min(0)
    return acc + (1 - acc.sum()) * r / r.sum()


def exact_math(target, draft, prompts, seed, n_pairs, meta) -> dict:
    """Step "exact_math": the rule's exact output distribution against p, on random pairs of every family
    and on the real models' processed pairs at every position of half the prompts (and the raw-q bug there)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for family, v, zp, zq in PAIR_FAMILIES:
        n = max(10, n_pairs // 5)
        errs = []
        for _ in range(n):
            p, q = random_pair(v, gen, zp, zq)
            errs.append(float((output_distribution(p, q) - p).abs().max()))
        rows.append(dict(family=family, vocab=v, pairs=n, rule=LOSSLESS, max_abs_error=max(errs)))

    # real distributions from the two models, processed with top-k 20 / top-p 0.95
    s_proc = Sampling(1.0, top_k=20, top_p=0.95)
    tv_ok, tv_bug = [], []
    for ids in prompts[: max(2, len(prompts) // 2)]:
        with torch.inference_mode():
            lp = target.model(input_ids=torch.tensor([ids], device=target.device)).logits[0].float().cpu()
            lq = draft.model(input_ids=torch.tensor([ids], device=draft.device)).logits[0].float().cpu()
        # float64 and renormalised, so the check measures the rule, not float32 round-off of the inputs
        P, Q = probs(lp, s_proc).double(), probs(lq, s_proc).double()
        P, Q = P / P.sum(-1, keepdim=True), Q / Q.sum(-1, keepdim=True)
        Qraw = torch.softmax(lq.double(), -1)
        for p, q, qr in zip(P, Q, Qraw):
            tv_ok.append(0.5 * float((output_distribution(p, q) - p).abs().sum()))
            tv_bug.append(0.5 * float((raw_q_bug(p, q, qr) - p).abs().sum()))
    family = "real models, top-k 20 / top-p 0.95"
    for rule, tvs in [(LOSSLESS, tv_ok), (RAW_Q_BUG, tv_bug)]:
        rows.append(
            dict(family=family, vocab=target.vocab_size, pairs=len(tvs), rule=rule, max_abs_error=None, max_tv=max(tvs))
        )
    tv = pd.DataFrame({"rule": [LOSSLESS] * len(tv_ok) + [RAW_Q_BUG] * len(tv_bug), "tv": tv_ok + tv_bug})
    return {"exact_math": pd.DataFrame(rows).assign(**meta), "exact_tv": tv.assign(**meta)}


def split_tv(tv: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The saved per-position TVs: (lossless rule, raw-q bug)."""
    return tv[tv.rule == LOSSLESS].tv.to_numpy(), tv[tv.rule != LOSSLESS].tv.to_numpy()


def plot_exact_math(tv: pd.DataFrame):
    tv_ok, tv_bug = split_tv(tv)
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    bins = np.linspace(0, max(max(tv_bug), 1e-3), 40)
    ax.hist(tv_bug, bins=bins, alpha=0.7, label="ratio with raw q (HF #47932)")
    ax.axvline(max(tv_ok), color="k", ls="--", label=f"speclib: max TV {max(tv_ok):.1e}")
    ax.set(
        xlabel="total variation between emitted and target distribution",
        ylabel="positions",
        title="Exact output distribution at each position of the prompts",
    )
    ax.legend()
    return fig


def exact_math_text(exact: pd.DataFrame, tv: pd.DataFrame) -> str:
    tv_ok, tv_bug = split_tv(tv)
    random_rows = exact[~exact.family.str.startswith("real models")]
    return (
        f"Over {random_rows.pairs.sum()} random pairs the largest deviation from `p` is "
        f"{random_rows.max_abs_error.max():.1e} (float64 round-off). On {len(tv_ok)} real positions "
        f"the lossless rule stays within total variation {max(tv_ok):.1e} of the target, while the raw-q bug "
        f"reaches {max(tv_bug):.3f} (median {np.median(tv_bug):.3f})."
    )


# ---- section 3: two-sample chi-square on real-model tokens ----------------------------------------


def sample_pairs(target, prompts, sampling, n_tokens, seed0, make_drafter, sd_target=None):
    """Paired runs (same prompt, own seeds) until BOTH methods have at least n_tokens tokens: AR on
    `target`, SD on `sd_target` (default: the target) drafted by make_drafter()."""
    ar_runs, sd_runs = [], []
    bar = tqdm(total=n_tokens, desc="AR/SD runs", leave=False)
    while min(sum(map(len, ar_runs)), sum(map(len, sd_runs))) < n_tokens:
        i, ids = len(ar_runs), prompts[len(ar_runs) % len(prompts)]
        ar_runs.append(generate(target, ids, 64, sampling=sampling, seed=seed0 + i).tokens)
        sd_runs.append(
            generate(
                sd_target or target, ids, 64, drafter=make_drafter(), sampling=sampling, seed=seed0 + 500_000 + i
            ).tokens
        )
        bar.n = min(sum(map(len, ar_runs)), sum(map(len, sd_runs)))
        bar.refresh()
    bar.close()
    return ar_runs, sd_runs


def chi2_row(setting: str, method: str, r, n_runs: int) -> dict:
    """One row of the chi-square table from a `stats.run_permutation_test` result."""
    return dict(
        setting=setting,
        method=method,
        chi2=r.chi2,
        dof=r.dof,
        p=r.p_asymptotic,
        p_permutation=r.p_permutation,
        tokens_ar=r.n_a,
        tokens_sd=r.n_b,
        runs=n_runs,
    )


def chi_square(target, draft, prompts, seed, n_tokens, chi2_k, n_calibration, meta) -> dict:
    """Step "chi2": AR against SD in two sampling settings, and the test's calibration on AR-vs-AR splits."""
    chi_rows, calib_rows = [], []
    for name, s in [("temperature 1", T1), ("temperature 1, top-k 50, top-p 0.9", Sampling(1.0, top_k=50, top_p=0.9))]:
        ar_runs, sd_runs = sample_pairs(
            target, prompts, s, n_tokens, seed * 10**6, partial(ModelDrafter, draft, chi2_k)
        )
        n_runs = len(ar_runs)
        r = stats.run_permutation_test(ar_runs, sd_runs, n_perm=999, paired=True, seed=seed)
        chi_rows.append(chi2_row(name, "speclib", r, n_runs))
        rng = np.random.default_rng(seed)
        for trial in range(n_calibration):
            perm = rng.permutation(n_runs)
            a, b = [ar_runs[j] for j in perm[: n_runs // 2]], [ar_runs[j] for j in perm[n_runs // 2 :]]
            try:
                c = stats.run_permutation_test(a, b, n_perm=99, paired=False, seed=trial)
                calib_rows.append(
                    dict(setting=name, trial=trial, p_asymptotic=c.p_asymptotic, p_permutation=c.p_permutation)
                )
            except ValueError:  # a split too small to keep two bins (smoke sizes only)
                pass
    chi = pd.DataFrame(chi_rows).assign(**meta)
    calib = pd.DataFrame(calib_rows).assign(**meta)
    return {"chi2": chi, "calibration": calib}


def measured_chi2(chi: pd.DataFrame) -> pd.DataFrame:
    """This run's measurements only: tables saved before the step stopped writing it carry a "reference"
    row with the seed study's published figures (`SEED_STUDY_CHI2`), which is not a measurement."""
    return chi[chi.method == "speclib"].reset_index(drop=True)


def plot_chi2(calib: pd.DataFrame, chi: pd.DataFrame):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for (name, g), color in zip(calib.groupby("setting", sort=False), ["C0", "C1"]):
        axes[0].hist(
            g.p_asymptotic,
            bins=20,
            range=(0, 1),
            histtype="step",
            lw=2,
            ls="--",
            color=color,
            label=f"{name}: textbook χ²",
        )
        axes[0].hist(
            g.p_permutation, bins=20, range=(0, 1), histtype="step", lw=2, color=color, label=f"{name}: permutation"
        )
    axes[0].axhline(len(calib) / calib.setting.nunique() / 20, color="k", ls=":", label="uniform")
    axes[0].set(xlabel="p-value (AR vs AR, random splits)", ylabel="splits", title="Null calibration")
    axes[0].legend(fontsize=7)
    x = np.arange(len(chi))
    axes[1].bar(x - 0.2, chi.p, 0.4, label="textbook χ²")
    axes[1].bar(x + 0.2, chi.p_permutation, 0.4, label="permutation")
    axes[1].axhline(0.05, color="C3", ls="--", label="α = 0.05")
    axes[1].set_xticks(x, [s.replace(", ", "\n") for s in chi.setting], fontsize=8)
    axes[1].set(ylabel="p-value (AR vs SD)", ylim=(0, 1), title="Two-sample test, AR vs SD")
    axes[1].legend(fontsize=8)
    return fig


def false_positive_rates(calib: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Per setting, the share of AR-vs-AR splits each test rejects at level `alpha`."""
    return calib.groupby("setting", sort=False)[["p_asymptotic", "p_permutation"]].agg(lambda p: (p < alpha).mean())


def chi2_text(chi: pd.DataFrame, calib: pd.DataFrame) -> str:
    fpr = false_positive_rates(calib)
    return "; ".join(
        f"**{r.setting}**: χ² = {r.chi2:.1f}, dof = {r.dof}, p = {r.p:.3f} (permutation p = {r.p_permutation:.3f}) over "
        f"{r.tokens_ar} AR and {r.tokens_sd} SD tokens; on AR-vs-AR splits the textbook test rejects "
        f"{fpr.p_asymptotic[r.setting]:.1%} and the permutation test {fpr.p_permutation[r.setting]:.1%} at α = 0.05"
        for r in chi.itertuples()
    ) + (
        f". The seed study reported χ² = {SEED_STUDY_CHI2['chi2']}, dof = {SEED_STUDY_CHI2['dof']}, "
        f"p = {SEED_STUDY_CHI2['p']} over about {SEED_STUDY_CHI2['tokens_per_method']:,} tokens per method."
    )


# ---- section 4: speed and acceptance versus K ----------------------------------------------------


def timed_runs(target, draft, ks, pilot_prompts, report_prompts, rounds, max_new_tokens, seed, meta) -> pd.DataFrame:
    """Step "runs": AR and SD at every K, greedy and at temperature 1, on the pilot (one round) and the
    reported prompts (`rounds` rounds)."""
    frames = []
    for mode, s in [("greedy", GREEDY), ("temperature 1", T1)]:
        methods = bench.chain_methods(target, draft, ks, max_new_tokens, s, seed=seed)
        for split, ps, n_rounds in [("pilot", pilot_prompts, 1), ("report", report_prompts, rounds)]:
            r = bench.paired_runs(ps, methods, rounds=n_rounds, progress=tqdm)
            frames.append(r.assign(mode=mode, split=split))
    runs = pd.concat(frames, ignore_index=True)
    runs["K"] = k_of(runs.method)
    return runs.assign(**meta)


def speed_table(runs: pd.DataFrame, mode: str, split: str, prof: dict, seed: int) -> pd.DataFrame:
    """`bench.speedup_table` of one (mode, split) of the timed runs, beside the analytic model's prediction."""
    t = bench.speedup_table(runs[(runs["mode"] == mode) & (runs.split == split)], seed=seed)
    t["K"] = t.method.str.extract(r"K=(\d+)", expand=False).astype(int)
    # the analytic model with the per-token acceptance and the costs measured in these runs (and, for
    # comparison, with the bare-pass costs of section 1)
    t["predicted"] = [bench.predicted_speedup(r.token_acceptance, r.K, r.c, r.v) for r in t.itertuples()]
    t["v_bare"] = t.K.map(prof["v"])
    t["predicted_bare"] = [
        bench.predicted_speedup(r.token_acceptance, r.K, prof["c"], r.v_bare) for r in t.itertuples()
    ]
    t["predicted_tokens_per_call"] = [bench.expected_tokens(r.token_acceptance, r.K) for r in t.itertuples()]
    return t.assign(mode=mode, split=split)


def speed_tables(runs: pd.DataFrame, prof: dict, seed: int) -> pd.DataFrame:
    """Every (mode, split)'s speed table, with `chosen` marking, in both splits, the K of the pilot's
    highest median in each mode."""
    speed = pd.concat(
        [speed_table(runs, m, sp, prof, seed) for m in ["greedy", "temperature 1"] for sp in ["pilot", "report"]],
        ignore_index=True,
    )
    speed["measured_over_predicted"] = speed.speedup / speed.predicted
    pilot = speed[speed.split == "pilot"]
    pilot_best = pilot.loc[pilot.groupby("mode").speedup.idxmax()][["mode", "K"]]
    speed["chosen"] = False
    for r in pilot_best.itertuples():
        speed.loc[(speed["mode"] == r.mode) & (speed.K == r.K), "chosen"] = True
    return speed


def plot_speedup(report: pd.DataFrame, best: pd.DataFrame, n_prompts: int, rounds: int):
    """Measured speedup against K per mode, with the analytic curves and the pilot's K."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, mode in zip(axes, ["greedy", "temperature 1"]):
        g = report[report["mode"] == mode]
        ax.fill_between(g.K, g.spread_lo, g.spread_hi, color="C0", alpha=0.15, label="single rounds (min–max)")
        ax.errorbar(
            g.K,
            g.speedup,
            yerr=[g.speedup - g.lo, g.hi - g.speedup],
            marker="o",
            capsize=3,
            label="measured (median, 95% CI)",
        )
        ax.plot(g.K, g.predicted, "s--", label="analytic, in-loop c and v(K)")
        ax.plot(g.K, g.predicted_bare, ":", color="grey", label="analytic, bare-pass c and v(K)")
        b = best.loc[mode]
        ax.scatter(
            [b.K],
            [b.speedup],
            s=200,
            facecolors="none",
            edgecolors="C3",
            lw=2,
            label=f"K chosen on the pilot = {int(b.K)}",
            zorder=3,
        )
        ax.axhline(1, color="k", lw=0.8)
        ax.set(xlabel="draft length K", title=f"{mode} ({n_prompts} reported prompts x {rounds} rounds)")
    axes[0].set_ylabel("speedup over AR (same target)")
    axes[0].legend(fontsize=7)
    return fig


def versus_top(chosen: pd.Series, top: pd.Series) -> str:
    """The reported prompts' highest median (`top`) against the pilot's K (`chosen`), in words, judged
    by their two intervals."""
    c, m = chosen, top
    if int(m.K) == int(c.K):
        return f"at the chosen K = {int(c.K)}"
    words = f"at K = {int(m.K)} ({m.speedup:.2f}x, CI {m.lo:.2f}–{m.hi:.2f}, against {c.speedup:.2f}x at the chosen K)"
    if not np.isfinite([m.lo, m.hi, c.lo, c.hi]).all():
        return words + ", without intervals to compare"
    return words + (
        ", the two intervals overlapping: the data cannot tell the two K apart"
        if m.lo <= c.hi and c.lo <= m.hi
        else ", the two intervals apart: the pilot's choice cost speed that noise does not explain"
    )


def speed_text(report: pd.DataFrame, best: pd.DataFrame, prof: dict) -> str:
    g, t = best.loc["greedy"], best.loc["temperature 1"]
    top_k = report.loc[report.groupby("mode").speedup.idxmax()].set_index("mode")
    return (
        f"Greedy, at the K chosen on the pilot prompts (**K = {int(g.K)}**): **{g.speedup:.2f}x** (95% CI {g.lo:.2f}–{g.hi:.2f}; "
        f"total-time ratio {g.total_ratio:.2f}x; single rounds {g.spread_lo:.2f}–{g.spread_hi:.2f}), acceptance rate "
        f"{g.acceptance:.3f}, per-token acceptance {g.token_acceptance:.3f}, {g.tokens_per_call:.2f} tokens per target call. "
        f"Inside these runs c = {g.c:.3f} and v({int(g.K)}) = {g.v:.2f} (bare passes, section 1: c = {prof['c']:.3f}, "
        f"v = {g.v_bare:.2f}); the analytic model with the in-loop costs predicts {g.predicted:.2f}x (measured/predicted "
        f"{g.measured_over_predicted:.2f}). Temperature 1 at K = {int(t.K)}: **{t.speedup:.2f}x** (CI {t.lo:.2f}–{t.hi:.2f}; "
        f"single rounds {t.spread_lo:.2f}–{t.spread_hi:.2f}). On the reported prompts themselves the highest greedy median sits "
        f"{versus_top(g, top_k.loc['greedy'])}; the highest at temperature 1 "
        f"{versus_top(t, top_k.loc['temperature 1'])}."
    )


def positions(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (mode, K) of the reported SD runs, how often each draft position was reached and accepted."""
    sd_runs = runs[(runs.split == "report") & (runs.K > 0)]
    pos_rows = []
    for (mode, k), g in sd_runs.groupby(["mode", "K"]):
        reached, accepted = bench.position_totals(g, k)
        pos_rows += [
            dict(mode=mode, K=k, position=i + 1, reached=int(reached[i]), accepted=int(accepted[i]))
            for i in range(len(reached))
        ]
    pos = pd.DataFrame(pos_rows)
    pos["rate"] = pos.accepted / pos.reached.clip(lower=1)
    return pos


def plot_acceptance(report: pd.DataFrame, pos: pd.DataFrame, k_max: int):
    """Acceptance rate against K beside the constant-a prediction, and per-position acceptance at K_MAX."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, (mode, g) in enumerate(report.groupby("mode", sort=False)):
        axes[0].plot(g.K, g.acceptance, "o-", color=f"C{i}", label=f"speclib, {mode}")
        a_tok = g.token_acceptance.mean()
        axes[0].plot(
            g.K,
            (a_tok - a_tok ** (g.K + 1)) / ((1 - a_tok) * g.K),
            ":",
            color=f"C{i}",
            label=f"constant per-token a = {a_tok:.2f}",
        )
    axes[0].set(xlabel="draft length K", ylabel="acceptance rate α(K)", ylim=(0, 1), title="Acceptance vs K")
    axes[0].legend(fontsize=8)
    for mode, g in pos[pos.K == k_max].groupby("mode", sort=False):
        axes[1].plot(g.position, g.rate, "o-", label=mode)
    axes[1].set(
        xlabel=f"draft position (K = {k_max})",
        ylabel="P(accept | reached)",
        ylim=(0, 1),
        title="Per-position acceptance",
    )
    axes[1].legend(fontsize=8)
    return fig


def acceptance_text(report: pd.DataFrame, pos: pd.DataFrame, k_max: int) -> str:
    a = report.set_index(["mode", "K"]).acceptance
    rates = pos[(pos.K == k_max) & (pos["mode"] == "greedy")].rate.to_numpy()
    return (
        f"Greedy acceptance falls from {a['greedy', 1]:.3f} at K = 1 to {a['greedy', k_max]:.3f} at K = {k_max}; "
        f"at temperature 1 from {a['temperature 1', 1]:.3f} to {a['temperature 1', k_max]:.3f}. The per-token "
        f"acceptance stays between {report.token_acceptance.min():.3f} and {report.token_acceptance.max():.3f} over every K "
        f"and mode. Per position (K = {k_max}, greedy) the rate runs "
        f"{', '.join(f'{r:.2f}' for r in rates)}: "
        + (
            "within 0.15 of each other, so a constant per-token acceptance is a fair model of this pair."
            if np.ptp(rates) <= 0.15
            else f"a range of {np.ptp(rates):.2f}, so the i.i.d. model is only a first approximation for this pair."
        )
    )


# ---- section 5: greedy identity, and transformers as a peer --------------------------------------


def transformers_generate(target, report_prompts, max_new_tokens, meta) -> pd.DataFrame:
    """Step "transformers_generate": does speclib's greedy AR equal `transformers` generate(do_sample=False)?"""
    rows = []
    for i, ids in enumerate(tqdm(report_prompts, desc="transformers generate")):
        ar_tokens = generate(target, ids, max_new_tokens, sampling=GREEDY).tokens
        with torch.inference_mode():
            plain = target.model.generate(
                torch.tensor([ids], device=target.device),
                do_sample=False,
                max_new_tokens=len(ar_tokens),
                pad_token_id=target.eos_token_id,
            )
        rows.append(dict(prompt=i, tokens=len(ar_tokens), identical=plain[0, len(ids) :].tolist() == ar_tokens))
    return pd.DataFrame(rows).assign(**meta)


def assisted_runs(target, draft, ks, report_prompts, max_new_tokens, seed, meta) -> pd.DataFrame:
    """Step "assisted": speclib SD and `transformers` assisted generation at every K, paired, greedy."""
    hf = bench.paired_runs(
        report_prompts,
        bench.chain_methods(target, draft, ks, max_new_tokens, GREEDY, seed, assisted=True),
        progress=tqdm,
    )
    hf["K"] = k_of(hf.method)
    return hf.assign(**meta)


def assisted_ratio(hf: pd.DataFrame, ks, seed: int) -> pd.DataFrame:
    """Per K, speclib's speed over `transformers`' (median of per-prompt ratios, bootstrap interval)."""
    return pd.DataFrame(
        [dict(K=k, **bench.speedup(hf, f"SD K={k}", reference=f"assisted K={k}", seed=seed)) for k in ks]
    )


def identity_table(runs: pd.DataFrame, plain_ok: pd.Series, hf: pd.DataFrame) -> pd.DataFrame:
    """The three greedy identities: speclib SD = AR, AR = transformers generate, assisted = AR."""
    greedy_sd = runs[(runs["mode"] == "greedy") & (runs.K > 0)]
    assisted = hf[hf.method.str.startswith("assisted")]
    return pd.DataFrame(
        [
            dict(
                check="speclib SD = AR (greedy, every K)",
                identical=int(greedy_sd.same_as_reference.sum()),
                of=len(greedy_sd),
            ),
            dict(check="AR = transformers generate(do_sample=False)", identical=int(sum(plain_ok)), of=len(plain_ok)),
            dict(
                check="transformers assisted = AR (every K)",
                identical=int(assisted.same_as_reference.sum()),
                of=len(assisted),
            ),
        ]
    )


def plot_assisted(ratio: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.errorbar(
        ratio.K, ratio.speedup, yerr=[ratio.speedup - ratio.lo, ratio.hi - ratio.speedup], marker="o", capsize=3
    )
    ax.axhline(1, color="k", lw=0.8)
    ax.set(
        xlabel="draft length K",
        ylabel="speclib speed / transformers speed",
        title="speclib vs transformers assisted generation (greedy)",
    )
    return fig


def interval_vs_one(lo: float, hi: float) -> str:
    """Where an interval of a speed ratio lies against parity, in words."""
    if lo <= 1 <= hi:
        return "an interval that holds 1: not distinguishable from it"
    return "the whole interval above 1: faster" if lo > 1 else "the whole interval below 1: slower"


def assisted_text(identity: pd.DataFrame, ratio: pd.DataFrame, bk: int) -> str:
    rk = ratio.set_index("K")
    return (
        f"{identity.identical[0]}/{identity.of[0]} greedy SD runs equal AR; {identity.identical[1]}/{identity.of[1]} prompts "
        f"agree with `transformers` greedy generate; {identity.identical[2]}/{identity.of[2]} assisted runs equal AR. "
        f"At the chosen K = {bk}, speclib is **{rk.speedup[bk]:.2f}x** as fast as `transformers` assisted generation "
        f"(95% CI {rk.lo[bk]:.2f}–{rk.hi[bk]:.2f}, {interval_vs_one(rk.lo[bk], rk.hi[bk])}"
        f"); across K the ratio spans {ratio.speedup.min():.2f}–{ratio.speedup.max():.2f}, reliably above 1 at "
        f"{int((ratio.lo > 1).sum())} and reliably below 1 at {int((ratio.hi < 1).sum())} of {len(ratio)} K. "
        f"Both decode the same tokens with the same weights, so a gap lies in what each call costs besides the arithmetic "
        f"(speclib's own Llama forward and preallocated cache against the stock forward and its generation machinery); "
        f"this notebook does not time those parts apart."
    )


# ---- section 6: what limits the speedup ----------------------------------------------------------


def limits_table(runs: pd.DataFrame, report: pd.DataFrame) -> pd.DataFrame:
    """Per K, greedy SD's drafting, verification, overhead and total time as fractions of AR's, beside
    section 4's acceptance, costs and speedups."""
    gr = runs[(runs["mode"] == "greedy") & (runs.split == "report")]
    g = gr[gr.K > 0].groupby("K")[["draft_s", "verify_s", "seconds"]].sum()
    limits = (g / gr[gr.K == 0].seconds.sum()).rename(columns=lambda c: c + "_over_ar").reset_index()
    limits = limits.merge(
        report[report["mode"] == "greedy"][["K", "acceptance", "token_acceptance", "c", "v", "predicted", "speedup"]],
        on="K",
    )
    limits["overhead_over_ar"] = limits.seconds_over_ar - limits.draft_s_over_ar - limits.verify_s_over_ar
    return limits


def limits_text(limits: pd.DataFrame, bk: int) -> str:
    bl = limits.set_index("K").loc[bk]
    return (
        f"At K = {bk} drafting takes {bl.draft_s_over_ar:.2f} and verification {bl.verify_s_over_ar:.2f} of the AR run's time "
        f"(the rest, {bl.overhead_over_ar:.2f}, is prefill and bookkeeping). With c = {bl.c:.3f} and v = {bl.v:.2f}, "
        f"even perfect acceptance would give at most {(bk + 1) / (bk * bl.c + bl.v):.2f}x at this K: the draft's cost "
        f"and the verify pass's growth with K, not acceptance alone, cap the speedup on this machine."
    )


# ---- section 7: a feature head on the target's own features --------------------------------------


@dataclass(frozen=True)
class HeadPair:
    """What section 7 races: AR on `target`, the separate `draft` at `sep_k`, and `head` drafting for
    `target_f` (a copy of the target that records the head's features), `top` children per tree node."""

    target: object
    target_f: object
    draft: object
    head: object
    sep_k: int
    max_new_tokens: int
    seed: int
    top: int


def head_methods(pair: HeadPair, sampling: Sampling, chains, trees) -> dict:
    """AR, the separate draft, the head's chains of every K in `chains` and its trees [(depth, budget)]."""

    def method(lm, d=None):
        return bench.Method(lm, pair.max_new_tokens, d, sampling, seed=pair.seed)

    m = {
        "AR": method(pair.target),
        f"separate K={pair.sep_k}": method(pair.target, ModelDrafter(pair.draft, pair.sep_k)),
    }
    for k in chains:
        m[f"head K={k}"] = method(pair.target_f, FeatureDrafter(pair.target_f, pair.head, k=k))
    for depth, budget in trees:
        m[f"head tree d={depth} n={budget}"] = method(
            pair.target_f, FeatureDrafter(pair.target_f, pair.head, k=depth, tree=budget, top=pair.top)
        )
    return m


def head_runs(pair: HeadPair, ks, trees, pilot_prompts, report_prompts, rounds, meta) -> pd.DataFrame:
    """Step "head_runs": greedy on the pilot and reported prompts; then, at temperature 1, the chain the
    greedy pilot ranks first."""
    frames = []
    for split, ps, n_rounds in [("pilot", pilot_prompts, 1), ("report", report_prompts, rounds)]:
        r = bench.paired_runs(ps, head_methods(pair, GREEDY, ks, trees), rounds=n_rounds, progress=tqdm)
        frames.append(r.assign(mode="greedy", split=split))
    pilot = bench.speedup_table(frames[0], seed=pair.seed)
    chosen = pilot[pilot.method.str.startswith("head")].sort_values("speedup").method.iloc[-1]
    # temperature 1 at the greedy pilot's choice among chains (a tree's siblings are drawn without replacement)
    chain_k = int(pilot[pilot.method.str.match(r"head K=\d+$")].sort_values("speedup").method.iloc[-1].split("=")[1])
    r = bench.paired_runs(report_prompts, head_methods(pair, T1, [chain_k], []), rounds=rounds, progress=tqdm)
    frames.append(r.assign(mode="temperature 1", split="report"))
    return pd.concat(frames, ignore_index=True).assign(chosen=chosen, chosen_chain=chain_k, **meta)


def head_chi2(pair: HeadPair, prompts, n_tokens, chi2_k, meta) -> pd.DataFrame:
    """Step "head_chi2": AR against head-drafted SD at temperature 1, run-level permutation test."""
    make = partial(FeatureDrafter, pair.target_f, pair.head, k=chi2_k)
    ar_runs, sd_runs = sample_pairs(pair.target, prompts, T1, n_tokens, pair.seed * 10**6 + 7, make, pair.target_f)
    r = stats.run_permutation_test(ar_runs, sd_runs, n_perm=999, paired=True, seed=pair.seed)
    return pd.DataFrame([chi2_row("temperature 1", "feature head", r, len(ar_runs))]).assign(**meta)


def head_table(hruns: pd.DataFrame, mode: str, split: str, seed: int) -> pd.DataFrame:
    """`bench.speedup_table` of one (mode, split) of the head runs, with each method's kind, depth, budget."""
    t = bench.speedup_table(hruns[(hruns["mode"] == mode) & (hruns.split == split)], seed=seed)
    t["kind"] = np.where(
        t.method.str.contains("tree"), "head tree", np.where(t.method.str.startswith("head"), "head chain", "separate")
    )
    t["depth"] = t.method.str.extract(r"(?:K|d)=(\d+)", expand=False).astype(int)
    t["budget"] = t.method.str.extract(r"n=(\d+)", expand=False).astype(float)
    return t.assign(mode=mode, split=split)


def head_tables(hruns: pd.DataFrame, seed: int) -> pd.DataFrame:
    return pd.concat(
        [
            head_table(hruns, "greedy", "pilot", seed),
            head_table(hruns, "greedy", "report", seed),
            head_table(hruns, "temperature 1", "report", seed),
        ],
        ignore_index=True,
    )


def time_parts(greedy_rep: pd.DataFrame, methods) -> pd.DataFrame:
    """Per method, its drafting, verification and remaining time as fractions of AR's total."""
    ar_s = greedy_rep[greedy_rep.method == "AR"].seconds.sum()
    parts = []
    for name in methods:
        g = greedy_rep[greedy_rep.method == name]
        parts.append(
            dict(
                method=name,
                drafting=g.draft_s.sum() / ar_s,
                verification=g.verify_s.sum() / ar_s,
                rest=(g.seconds.sum() - g.draft_s.sum() - g.verify_s.sum()) / ar_s,
            )
        )
    return pd.DataFrame(parts).drop_duplicates("method").set_index("method")


def plot_head(hrep, greedy_rep, sep_k, k_max, chosen, chain_k, n_prompts, rounds):
    """Speedup of the head's chains and trees against the separate draft; per-position acceptance;
    where the time goes."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    ch = hrep[hrep.kind == "head chain"].sort_values("depth")
    axes[0].fill_between(ch.depth, ch.spread_lo, ch.spread_hi, color="C1", alpha=0.15)
    axes[0].errorbar(
        ch.depth,
        ch.speedup,
        yerr=[ch.speedup - ch.lo, ch.hi - ch.speedup],
        marker="o",
        capsize=3,
        color="C1",
        label="feature head, chain",
    )
    tr = hrep[hrep.kind == "head tree"]
    axes[0].errorbar(
        tr.depth + 0.1,
        tr.speedup,
        yerr=[tr.speedup - tr.lo, tr.hi - tr.speedup],
        fmt="s",
        capsize=3,
        color="C2",
        label="feature head, tree (at its depth)",
    )
    for r in tr.itertuples():
        axes[0].annotate(f"n={int(r.budget)}", (r.depth + 0.15, r.speedup), fontsize=7)
    sep = hrep[hrep.kind == "separate"].iloc[0]
    axes[0].axhline(sep.speedup, color="C0", ls="--", label=f"separate draft, K = {sep_k}")
    axes[0].axhline(1, color="k", lw=0.8)
    axes[0].set(
        xlabel="draft depth K",
        ylabel="speedup over AR (greedy)",
        title=f"{n_prompts} reported prompts x {rounds} rounds",
    )
    axes[0].legend(fontsize=7)
    for name, color in [(f"head K={k_max}", "C1"), (f"separate K={sep_k}", "C0")]:
        g = greedy_rep[greedy_rep.method == name]
        if len(g):
            reached, accepted = bench.position_totals(g, int(name.split("=")[1]))
            axes[1].plot(
                np.arange(1, len(reached) + 1), accepted / np.clip(reached, 1, None), "o-", color=color, label=name
            )
    axes[1].set(
        xlabel="draft position", ylabel="P(accept | reached)", ylim=(0, 1), title="Per-position acceptance (greedy)"
    )
    axes[1].legend(fontsize=8)
    parts = time_parts(greedy_rep, [f"separate K={sep_k}", chosen, f"head K={chain_k}"])
    parts.plot.barh(stacked=True, ax=axes[2], color=["C1", "C0", "C7"])
    axes[2].axvline(1, color="k", lw=0.8)
    axes[2].set(xlabel="time / AR's time (greedy, reported prompts)", ylabel="", title="Where the time goes")
    axes[2].legend(fontsize=7)
    return fig


def head_text(hruns, hspeed, hchi, sep_k) -> str:
    chosen, chain_k = hruns.chosen.iloc[0], int(hruns.chosen_chain.iloc[0])
    hrep = hspeed[(hspeed.split == "report") & (hspeed["mode"] == "greedy")].set_index("method")
    sep = hrep[hrep.kind == "separate"].iloc[0]
    c_best = hrep.loc[chosen]
    t1 = hspeed[(hspeed["mode"] == "temperature 1") & (hspeed.method == f"head K={chain_k}")].iloc[0]
    identical = hruns[(hruns["mode"] == "greedy") & (hruns.method != "AR")]
    chi_h = hchi.iloc[0]
    return (
        f"Chosen on the pilot prompts: **{chosen}**. On the reported prompts it runs at **{c_best.speedup:.2f}x** over AR "
        f"(95% CI {c_best.lo:.2f}–{c_best.hi:.2f}; total-time ratio {c_best.total_ratio:.2f}x; single rounds "
        f"{c_best.spread_lo:.2f}–{c_best.spread_hi:.2f}), per-token acceptance {c_best.token_acceptance:.3f}, "
        f"{c_best.tokens_per_call:.2f} tokens per target call, c = {c_best.c:.3f} per drafted token and v = {c_best.v:.2f}; "
        f"the separate draft at K = {sep_k}: {sep.speedup:.2f}x (CI {sep.lo:.2f}–{sep.hi:.2f}), per-token acceptance "
        f"{sep.token_acceptance:.3f}, c = {sep.c:.3f}. At temperature 1 the head's chain at K = {chain_k} runs at "
        f"{t1.speedup:.2f}x (CI {t1.lo:.2f}–{t1.hi:.2f}). Greedy head SD equals AR on "
        f"{int(identical.same_as_reference.sum())}/{len(identical)} runs; AR vs head SD at temperature 1: χ² = {chi_h.chi2:.1f}, "
        f"dof = {chi_h.dof}, permutation p = {chi_h.p_permutation:.3f} over {chi_h.tokens_ar} and {chi_h.tokens_sd} tokens."
    )


CEILING_COLUMNS = [
    "depth",
    "token_acceptance",
    "tokens_per_call",
    "c",
    "v",
    "speedup",
    "ceiling_at_c",
    "ceiling_free",
    "alpha_for_2x",
    "alpha_for_2_5x",
]


def head_ceiling(hrep: pd.DataFrame) -> pd.DataFrame:
    """Per head chain: its ceilings at perfect acceptance (at its c, and free) and the per-token
    acceptance it would need for 2x and 2.5x."""
    ceil = hrep[hrep.kind == "head chain"].sort_values("depth")
    return ceil.assign(
        ceiling_at_c=(ceil.depth + 1) / (ceil.depth * ceil.c + ceil.v),
        ceiling_free=(ceil.depth + 1) / ceil.v,
        alpha_for_2x=[analytic.acceptance_needed(2.0, int(r.depth), r.c, r.v) for r in ceil.itertuples()],
        alpha_for_2_5x=[analytic.acceptance_needed(2.5, int(r.depth), r.c, r.v) for r in ceil.itertuples()],
    )


def ceiling_text(ceil: pd.DataFrame, chain_k: int) -> str:
    cb = ceil.loc[f"head K={chain_k}"]
    free_at_alpha = max(
        analytic.predicted_speedup(r.token_acceptance, int(r.depth), 0.0, r.v) for r in ceil.itertuples()
    )
    best2 = ceil.loc[ceil.alpha_for_2x.idxmin()] if ceil.alpha_for_2x.notna().any() else None
    return (
        f"At its chosen K = {chain_k} the head reaches {cb.speedup:.2f}x of a {cb.ceiling_at_c:.2f}x ceiling at its own "
        f"c = {cb.c:.3f}, with {cb.tokens_per_call:.2f} of {chain_k + 1} possible tokens per call (per-token acceptance "
        f"{cb.token_acceptance:.3f}; the per-position curve above shows where it drops). Verifying K + 1 tokens costs "
        f"v(K) = " + ", ".join(f"{r.v:.2f}" for r in ceil.itertuples()) + f" single-token passes for K = "
        f"{int(ceil.depth.min())}..{int(ceil.depth.max())} on this CPU, so short chains cap low (K = 2: at most "
        f"{ceil.set_index('depth').ceiling_at_c.get(2, float('nan')):.2f}x at the head's c) and long ones need nearly "
        f"every token right: "
        + (
            f"2x needs a per-token acceptance of at least {best2.alpha_for_2x:.3f} (at K = {int(best2.depth)}), "
            if best2 is not None
            else "2x is above every chain's ceiling, "
        )
        + f"against the head's {ceil.token_acceptance.max():.3f} at best. A free head (c = 0) at the acceptance it has "
        f"would give at most {free_at_alpha:.2f}x: a cheaper pass (the head runs one decoder layer, the feature fusion "
        f"and the full LM head) buys part of the gap, and the rest takes a head that agrees with the target more often."
    )


# ---- section 8: both cores, drafting while the target verifies ------------------------------------


@dataclass(frozen=True)
class AtThreads:
    """A `paired_runs` method run with torch at `n` threads, the count restored after it."""

    n: int
    run: object

    def __call__(self, ids, i=0):
        with device.threads(self.n):
            return self.run(ids, i)


def overlap_name(k: int, w: int) -> str:
    return f"overlap k={k} w={w}"


def sequential_lane(i: int, steps: list[dict]) -> list[dict]:
    """Sequential SD's timeline on one core: draft, then verify, step after step, from 0."""
    t = np.cumsum([0.0] + [x for s in steps for x in (s["draft_s"], s["verify_s"])])
    kinds = ["draft", "verify"] * len(steps)
    return [dict(prompt=i, lane="sequential", kind=kd, start=a, end=b) for kd, a, b in zip(kinds, t, t[1:])]


def overlap_lanes(i: int, tl: dict, last_verify_s: float) -> tuple[list[dict], dict]:
    """An overlapped run's timeline on its two cores (from `OverlapDrafter.timeline()`), from its first
    step, and the busy totals of the run."""
    waits = tl["wait"]  # the decoder verifies from each wait's end to the next wait's start
    ends = [a for a, _ in waits[1:]] + [waits[-1][1] + last_verify_s]
    lanes = [("draft core", "draft", a, b) for a, b in tl["draft"]]
    lanes += [("target core", "wait", a, b) for a, b in waits]
    lanes += [("target core", "verify", b, e) for (_, b), e in zip(waits, ends)]
    t0 = waits[0][0]  # the first step, as for the sequential lane (the draft's prefill starts earlier)
    rows = [dict(prompt=i, lane=ln, kind=kd, start=a - t0, end=b - t0) for ln, kd, a, b in lanes]
    busy = dict(
        prompt=i,
        seconds=ends[-1] - t0,
        draft_busy=sum(min(b, ends[-1]) - max(a, t0) for a, b in tl["draft"] if b > t0 and a < ends[-1]),
        target_wait=sum(b - a for a, b in waits),
    )
    return rows, busy


def overlap_runs(
    target, draft, settings, k_seq, pilot_prompts, report_prompts, rounds, max_new_tokens, seed, meta
) -> dict:
    """Step "overlap": the overlapped settings against sequential SD on the pilot prompts; on the reported
    prompts AR and SD at 1 and 2 threads and the chosen overlap in a process and a thread; then one pass
    recording every step's verify time and both cores' timelines."""

    def sd_run(k):
        return bench.Method(target, max_new_tokens, partial(ModelDrafter, draft, k))

    def drafter_run(d):
        return bench.Method(target, max_new_tokens, d)

    ar_run = bench.Method(target, max_new_tokens)
    opened = {overlap_name(k, w): OverlapDrafter(draft, k=k, wait_for=w) for k, w in settings}
    try:
        methods = {"AR": ar_run, f"SD K={k_seq}": sd_run(k_seq)} | {n: drafter_run(d) for n, d in opened.items()}
        pilot = bench.paired_runs(pilot_prompts, methods, rounds=1, progress=tqdm)
        ratios = {n: bench.speedup(pilot, n, seed=seed)["speedup"] for n in opened}
        k, w = settings[list(opened).index(max(ratios, key=ratios.get))]
        opened["thread"] = OverlapDrafter(draft, k=k, wait_for=w, backend="thread")
        chosen = opened[overlap_name(k, w)]
        methods = {
            "AR, 1 thread": ar_run,
            "AR, 2 threads": AtThreads(2, ar_run),
            "SD, 1 thread": sd_run(k_seq),
            "SD, 2 threads": AtThreads(2, sd_run(k_seq)),
            "overlap, process": drafter_run(chosen),
            "overlap, thread": drafter_run(opened["thread"]),
        }
        report = bench.paired_runs(report_prompts, methods, reference="AR, 1 thread", rounds=rounds, progress=tqdm)
        # one more untimed-for-speed pass: both sides' intervals, and every step's verify time
        steps, busy, timeline = [], [], []
        for i, ids in enumerate(report_prompts):
            for method, run in [("SD", sd_run(k)), ("overlap", drafter_run(chosen))]:
                g = run(ids, i)
                steps += [
                    dict(prompt=i, method=method, drafted=s["drafted"], verify_s=s["verify_s"]) for s in g.stats.steps
                ]
                if method == "SD":  # one core: draft, then verify, step after step
                    timeline += sequential_lane(i, g.stats.steps)
                    continue
                rows, totals = overlap_lanes(i, chosen.timeline(), g.stats.steps[-1]["verify_s"])
                timeline += rows
                busy.append(totals)
    finally:
        for d in opened.values():
            d.close()
    pilot["split"], report["split"] = "pilot", "report"
    return {
        "overlap_runs": pd.concat([pilot, report], ignore_index=True).assign(k=k, wait_for=w, **meta),
        "overlap_steps": pd.DataFrame(steps).assign(k=k, wait_for=w, **meta),
        "overlap_busy": pd.DataFrame(busy).assign(**meta),
        "overlap_timeline": pd.DataFrame(timeline).assign(**meta),
    }


@dataclass
class Overlap:
    """Section 8's numbers, derived from the saved overlap step and section 4's greedy speed table."""

    k: int
    wait_for: int
    k_seq: int
    fast_ar: str
    ar_speed: pd.Series
    table: pd.DataFrame  # speedup over the faster AR, per method (reported prompts)
    pilot_table: pd.DataFrame
    gain: dict  # overlap over sequential SD, paired
    model: dict  # the timeline model's gain, without and with contention
    ceiling: float
    contention: float
    alpha: float
    c_loop: float
    busy_target: float
    busy_draft: float
    summary: pd.DataFrame
    timeline: pd.DataFrame


def overlap_analysis(ov: dict, report: pd.DataFrame, ks, k_seq: int, seed: int) -> Overlap:
    oruns, osteps, obusy = ov["overlap_runs"], ov["overlap_steps"], ov["overlap_busy"]
    k_ov, w_ov = int(oruns.k.iloc[0]), int(oruns.wait_for.iloc[0])
    rep = oruns[oruns.split == "report"]
    pil = oruns[oruns.split == "pilot"]
    ar_speed = rep.groupby("method").tokens_per_s.median()
    fast_ar = max(["AR, 1 thread", "AR, 2 threads"], key=lambda m: ar_speed[m])
    otable = bench.speedup_table(rep, reference=fast_ar, seed=seed)
    pilot_table = bench.speedup_table(pil, seed=seed)[["method", "speedup", "tokens_per_call", "acceptance"]]
    gain = bench.speedup(rep, "overlap, process", reference="SD, 1 thread", seed=seed)
    # the timeline model, fed with section 4's in-loop costs at every draft length and this run's acceptance
    g4 = report[report["mode"] == "greedy"].set_index("K")
    v_loop = [1.0] + [float(g4.v.get(n, np.nan)) for n in range(1, max(ks) + 1)]
    c_loop, alpha = float(g4.c.loc[k_seq]), float(otable.set_index("method").token_acceptance["SD, 1 thread"])
    st = osteps[osteps.drafted == k_ov].groupby("method").verify_s.median()
    contention = float(st["overlap"] / st["SD"])  # a verify pass with the draft busy on the other core
    seq_model = analytic.expected_tokens(alpha, k_seq) / (k_seq * c_loop + v_loop[k_seq])
    model = {
        name: analytic.simulate_overlap(alpha, k_ov, c_loop, [x * f for x in v_loop], wait_for=w_ov, seed=seed)[
            "speedup"
        ]
        / seq_model
        for name, f in [("timeline model", 1.0), ("model + contention", contention)]
    }
    ceiling = (k_seq * c_loop + v_loop[k_seq]) / v_loop[k_seq]  # no waiting at all, no token lost
    fr = obusy[["seconds", "draft_busy", "target_wait"]].sum()
    busy_draft, busy_target = fr.draft_busy / fr.seconds, 1 - fr.target_wait / fr.seconds
    summary = pd.DataFrame(
        [
            dict(
                quantity="gain, overlap over sequential SD (measured)",
                value=gain["speedup"],
                lo=gain["lo"],
                hi=gain["hi"],
            ),
            *[dict(quantity=f"gain predicted: {n}", value=x) for n, x in model.items()],
            dict(quantity="ceiling: no wait at all", value=ceiling),
            dict(quantity="contention: verify pass with the draft busy / alone", value=contention),
            dict(quantity="target core busy (overlap)", value=busy_target),
            dict(quantity="draft core busy (overlap)", value=busy_draft),
        ]
    )
    return Overlap(
        k=k_ov,
        wait_for=w_ov,
        k_seq=k_seq,
        fast_ar=fast_ar,
        ar_speed=ar_speed,
        table=otable,
        pilot_table=pilot_table,
        gain=gain,
        model=model,
        ceiling=ceiling,
        contention=contention,
        alpha=alpha,
        c_loop=c_loop,
        busy_target=busy_target,
        busy_draft=busy_draft,
        summary=summary,
        timeline=ov["overlap_timeline"],
    )


def plot_overlap(o: Overlap):
    """The first steps of reported prompt 0 on both timelines, and the measured gain beside the model's."""
    otl, gain = o.timeline, o.gain
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 3.6), gridspec_kw=dict(width_ratios=[2.2, 1]))
    p0 = otl[otl.prompt == 0]
    horizon = p0[p0.lane == "sequential"].end.iloc[min(23, len(p0[p0.lane == "sequential"]) - 1)]
    colours = dict(draft="C1", verify="C0", wait="lightgrey")
    for y, lane in enumerate(["sequential", "target core", "draft core"]):
        for kind, g in p0[(p0.lane == lane) & (p0.start < horizon) & (p0.end > 0)].groupby("kind"):
            ax.broken_barh(list(zip(g.start * 1e3, (g.end - g.start) * 1e3)), (y - 0.35, 0.7), color=colours[kind])
    ax.set(
        yticks=[0, 1, 2],
        yticklabels=["sequential SD\n(one core)", "overlap:\ntarget core", "overlap:\ndraft core"],
        xlabel="ms from the first step",
        xlim=(0, horizon * 1e3),
        title=f"first steps of a reported prompt (K = {o.k})",
    )
    ax.invert_yaxis()
    ax.legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()],
        labels=["draft", "verify (+ loop)", "target waits"],
        fontsize=7,
        loc="upper right",
    )
    names = ["measured", *o.model, "ceiling"]
    vals = [gain["speedup"], *o.model.values(), o.ceiling]
    bx.bar(names, vals, color=["C0", "C2", "C2", "grey"])
    bx.errorbar(
        [0],
        [gain["speedup"]],
        yerr=[[gain["speedup"] - gain["lo"]], [gain["hi"] - gain["speedup"]]],
        color="k",
        capsize=4,
    )
    bx.axhline(1, color="k", lw=0.8)
    bx.axhline(1.25, color="C3", lw=0.8, ls="--", label="goal 1.25x")
    bx.set(ylabel="overlap / sequential SD", title="gain from the second core")
    bx.tick_params(axis="x", labelrotation=20, labelsize=7)
    bx.legend(fontsize=7)
    return fig


def overlap_text(o: Overlap) -> str:
    otable, gain, model, contention, ceiling = o.table, o.gain, o.model, o.contention, o.ceiling
    orow = otable.set_index("method")
    best_method = otable.loc[otable.speedup.idxmax()]
    best_seq = max(["SD, 1 thread", "SD, 2 threads"], key=lambda m: orow.speedup[m])
    vs_best = orow.speedup["overlap, process"] / orow.speedup[best_seq]
    two_threads = orow.loc["SD, 2 threads"]
    other_ar = [m for m in ("AR, 1 thread", "AR, 2 threads") if m != o.fast_ar][0]
    with_contention = model["model + contention"]
    return (
        f"Faster AR on the reported prompts: **{o.fast_ar}** (median {o.ar_speed[o.fast_ar]:.1f} tokens/s against "
        f"{o.ar_speed[other_ar]:.1f}). Over it, sequential SD at "
        f"K = {o.k_seq} reaches {orow.speedup['SD, 1 thread']:.2f}x at one thread and {two_threads.speedup:.2f}x at two; "
        f"overlapped SD (k = {o.k}, wait_for = {o.wait_for}) {orow.speedup['overlap, process']:.2f}x with the draft in a "
        f"process (CI {orow.lo['overlap, process']:.2f}–{orow.hi['overlap, process']:.2f}) and "
        f"{orow.speedup['overlap, thread']:.2f}x in a thread. The fastest here is **{best_method.method}**. "
        f"Greedy outputs identical to AR: {int(otable.identical.sum())} of {int(otable.runs.sum())}. "
        f"Overlap over sequential SD, paired: **{gain['speedup']:.3f}x** (CI {gain['lo']:.3f}–{gain['hi']:.3f}), against "
        f"{model['timeline model']:.3f}x from the timeline model at this run's acceptance ({o.alpha:.3f}), "
        f"c = {o.c_loop:.3f} and v(K), and {with_contention:.3f}x once each verify pass is {contention:.3f} times slower "
        f"with the draft busy beside it. Even a draft that never kept the target waiting would gain at most "
        f"{ceiling:.2f}x: drafting is {1 - 1 / ceiling:.0%} of a sequential step. The target core is busy "
        f"{o.busy_target:.0%} of the time and the draft core {o.busy_draft:.0%}. "
        + (
            "The model with contention lies inside the measured gain's interval, so within this run's noise the "
            "timeline accounts for what overlap earned: "
            if gain["lo"] <= with_contention <= gain["hi"]
            else f"The measured gain lies {'below' if gain['speedup'] < with_contention else 'above'} "
            "the model with contention by more than its interval, so something the model leaves out "
            "(the pipe between the processes, the draft's restarts, Python in the loop) "
            f"{'eats' if gain['speedup'] < with_contention else 'adds'} the difference: "
        )
        + f"a hypothesis survives a step only with probability α^(k+1) = {o.alpha ** (o.k + 1):.2f}, so most steps "
        f"still wait for their draft. Against the best sequential SD ({best_seq}, {orow.speedup[best_seq]:.2f}x), "
        f"overlap reaches {vs_best:.2f} times its speedup; the goal of 1.25 times is "
        + ("met." if vs_best >= 1.25 else f"missed by {1.25 - vs_best:.2f}.")
    )
