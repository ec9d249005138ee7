"""The workbook's conclusions, worded once: whether a measured ratio meets a goal, and how an interval is
written. A row `r` is what `speclib.research.bench.speedup` returns (speedup, lo, hi: the median ratio and
its 95% interval; lo and hi NaN where one prompt leaves no interval).

    verdicts.goal(r, 1.15)      # "met" | "not met" | "met by the estimate; the interval holds 1.15x" | ...
    verdicts.interval(r)        # "1.50x (95% CI 1.27–1.68)", the interval rounded outward (`ci`)

A goal is met only when the whole interval lies at or above it and not met only when the whole interval
lies below it; in between the data do not decide, and the wording says so, with the estimate's side.
"""

from __future__ import annotations

import math


def _get(r, key: str) -> float:
    return float(r[key] if isinstance(r, dict) else getattr(r, key))


def goal(r, target: float) -> str:
    """Whether ratio `r` reaches `target`, read from its interval first, then its estimate."""
    lo, hi, est = _get(r, "lo"), _get(r, "hi"), _get(r, "speedup")
    if math.isnan(lo) or math.isnan(hi):
        return f"{'met' if est >= target else 'missed'} by the estimate (one prompt: no interval)"
    if lo >= target:
        return "met"
    if hi < target:
        return "not met"
    return f"{'met' if est >= target else 'missed'} by the estimate; the interval holds {target:g}x"


def ci(lo: float, hi: float, digits: int = 2) -> str:
    """An interval rounded outward ("0.99–1.35" for 0.996–1.342), so a bound never reads as if it
    cleared a threshold (1, say) that it does not clear; "n/a" when it was not computed."""
    if not (lo == lo and hi == hi):
        return "n/a"
    f = 10**digits
    return f"{math.floor(lo * f + 1e-9) / f:.{digits}f}–{math.ceil(hi * f - 1e-9) / f:.{digits}f}"


def interval(r, digits: int = 2) -> str:
    """`r`'s estimate and 95% interval in the workbook's wording (the interval rounded outward, `ci`)."""
    est, lo, hi = _get(r, "speedup"), _get(r, "lo"), _get(r, "hi")
    if math.isnan(lo) or math.isnan(hi):
        return f"{est:.{digits}f}x (one prompt: no interval)"
    return f"{est:.{digits}f}x (95% CI {ci(lo, hi, digits)})"


def tokens(n: float) -> str:
    """A token count in words: 2.5M, 340M, 1.2B; "never" for inf (a line that does not rise)."""
    if n == float("inf") or n != n:
        return "never"
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.2g}{unit}" if n / scale < 10 else f"{n / scale:.0f}{unit}"
    return f"{n:.0f}"


GOALS = {"head": dict(tokens_per_pass=3.0, speedup=1.8), "draft": dict(speedup=1.3)}


def learning_curve_text(curves: dict, fits: dict, goals: dict = GOALS) -> str:
    """What a learning curve says, from its tables (`learning_curve.summarize` per kind) and fits
    (`learning_curve.fit` per (kind, column)): the last snapshot against the goals, the gain per tenfold
    data with its interval, and, where the gain is positive, the data the line reaches each goal at."""
    lines = []
    for kind, t in curves.items():
        t = t[t.tokens_seen > 0].sort_values("tokens_seen")
        last = t.iloc[-1]
        seen = last.tokens_seen
        said = (
            f"* **The {kind}** after {tokens(seen)} training tokens: {last.tokens_per_pass:.2f} tokens per target pass "
            f"(95% CI {ci(last.lo, last.hi)}), "
            + interval(dict(speedup=last.speedup, lo=last.speedup_lo, hi=last.speedup_hi))
            + " AR on the held-out prompts"
            + ("; every output equals AR's." if t.identical.all() else "; SOME OUTPUTS DIFFER FROM AR'S.")
        )
        for column, target in goals.get(kind, {}).items():
            f = fits.get((kind, column))
            unit = " tokens per pass" if column == "tokens_per_pass" else "x"
            if f is None:
                said += f" {column.replace('_', ' ').capitalize()}: one snapshot, no line to say when {target:g}{unit} comes."
                continue
            gain = f"{f['b']:+.2f}{unit} per tenfold data (95% CI {f['b_lo']:+.2f} to {f['b_hi']:+.2f})"
            if f["b_lo"] <= 0:
                said += f" {column.replace('_', ' ').capitalize()}: {gain}, not a clear gain; the fit cannot say when {target:g}{unit} comes."
                continue
            need, lo, hi = (f[f"tokens_for_{target:g}{s}"] for s in ("", "_lo", "_hi"))
            reach = (
                "already reached by the line"
                if need <= seen
                else f"the line reaches {target:g}{unit} at about {tokens(need)} tokens "
                f"(95% CI {tokens(lo)}–{tokens(hi)}), {need / seen:.0f} times the data seen: an extrapolation"
            )
            said += f" {column.replace('_', ' ').capitalize()}: {gain}; {reach}."
        lines.append(said)
    return "\n".join(lines)


def load_sweep_text(summary, steps, methods, rates, k: int, pass_table, b_max: int, drift: dict | None = None) -> str:
    """Where speculation stops paying in a load sweep, from `load_stats.summarize`'s table, the server's
    step log, the sweep's methods and rates (in the order the text names them), the chain length `k`, the verify-pass price table (nodes x batch, in plain steps) with its
    largest batch `b_max`, and AR's drift (rate -> (ratio, lo, hi) of its second pass against its first;
    None with one pass): the best method at the lowest rate against the 0.7 goal and why (its step
    economy), where each fixed budget becomes slower than AR, and the adaptive budgets against 1.05."""
    from speclib.research.load_stats import step_economy

    low, high = min(rates), max(rates)
    spec = [m for m in methods if m != "AR"]
    at = summary.set_index(["method", "rate"])
    passes = 2 if drift is not None else 1

    def ratio(m, r):
        x = at.loc[(m, r)]
        return f"{x.tpot_vs_ar:.2f} (95% CI {x.tpot_lo:.2f}–{x.tpot_hi:.2f})"

    st_primed = steps.groupby(["method", "rate"]).primed.sum() / passes  # per pass
    per_step = steps.groupby(["method", "rate"]).agg(draft_ms=("draft_s", "mean"), verify_ms=("verify_s", "mean")) * 1e3
    best_low = min(spec, key=lambda m: at.tpot_vs_ar[(m, low)])
    bl = at.loc[(best_low, low)]
    adaptive = [m for m in spec if "adaptive" in m]
    drift_at = {r: abs(d[0] - 1) for r, d in (drift or {}).items()}  # AR against itself, per rate
    # slower than AR: the interval above 1 by more than AR moved against itself at that rate
    crossings = {
        m: next((r for r in rates if at.tpot_lo[(m, r)] > 1 + drift_at.get(r, 0.0)), None)
        for m in spec
        if "adaptive" not in m
    }
    within = {
        m: [r for r in rates if 1 < at.tpot_lo[(m, r)] <= 1 + drift_at.get(r, 0.0)] for m in spec if "adaptive" not in m
    }
    lines, noise = [], 0.0
    if drift is not None:
        noise = max(abs(d[0] - 1) for d in drift.values())
        lines.append(
            "AR's second pass, the sweep's last run, against its first, the first run: TPOT "
            + ", ".join(f"{d[0]:.2f} (95% CI {d[1]:.2f}–{d[2]:.2f}) at {r}/s" for r, d in drift.items())
            + f" times the first. The machine moved by up to {noise:.0%} over the run; every comparison below pools "
            "both passes (ABBA), which cancels a drift linear in time but not faster fluctuations."
        )
    lines.append(
        f"At the lowest rate ({low}/s, mean batch {bl.mean_batch:.2f}) the best TPOT is **{best_low}**'s, "
        f"{ratio(best_low, low)} times AR's (acceptance {bl.acceptance:.2f}); the goal was at most 0.7: "
        + (
            "met, its whole interval below it."
            if bl.tpot_hi <= 0.7
            else "met by the estimate, though its interval reaches above it."
            if bl.tpot_vs_ar <= 0.7
            else f"missed by {bl.tpot_vs_ar - 0.7:.2f}."
        )
    )
    e_ar, e = step_economy(steps, "AR", low), step_economy(steps, best_low, low)
    per_token_ar = e_ar["seconds"] / e_ar["tokens"]
    lines.append(
        f"Why, from the server's own steps at {low}/s: {best_low} gains {e['tokens']:.2f} tokens per request-step at "
        f"{e['seconds'] * 1e3:.1f} ms per request-step (AR: {e_ar['tokens']:.2f} at {e_ar['seconds'] * 1e3:.1f} ms), "
        f"{e['seconds'] / e['tokens'] / per_token_ar:.2f} times AR's time per token inside the engine (the client's "
        f"TPOT adds the HTTP stream). {e['wasted']:.0%} of its drafting steps had the whole draft rejected, at "
        f"{e['wasted_s'] * 1e3:.1f} ms each against {e_ar['seconds'] * 1e3:.1f} for a plain step. At its price per step "
        f"0.7 would need {e['seconds'] / (0.7 * per_token_ar):.2f} tokens per step; or, at its tokens, a drafter that "
        f"knew in advance which drafts would be rejected whole and took plain steps instead would reach "
        f"{e['hindsight'] / e['tokens'] / per_token_ar:.2f} times AR's (a hindsight bound, not a method)."
    )
    lines.append(
        "Fixed budgets against AR as the load rises (slower only where the interval clears AR's own drift at "
        "that rate): "
        + "; ".join(
            f"{m} "
            + (f"slower than AR from {r}/s" if r is not None else "never clearly slower than AR")
            + (
                f" (above 1 but within AR's drift at {', '.join(f'{x}/s' for x in within[m])})"
                if within[m] and r is None
                else ""
            )
            for m, r in crossings.items()
        )
        + f". At the highest rate ({high}/s) AR's mean batch is {at.mean_batch[('AR', high)]:.2f}; section 1 prices "
        f"{k} draft tokens per request at {pass_table.loc[k, b_max]:.2f} plain steps at batch {b_max} against "
        f"{pass_table.loc[k, 1]:.2f} alone. Drafting is not batched: each request drafts in turn, so a step's drafting "
        "grows with the batch: "
        + "; ".join(
            f"{m} {per_step.draft_ms[(m, low)]:.1f} ms per step at {low}/s and {per_step.draft_ms[(m, high)]:.1f} ms at "
            f"{high}/s, against a verify pass of {per_step.verify_ms[(m, low)]:.1f} and {per_step.verify_ms[(m, high)]:.1f} ms"
            for m in spec
            if "adaptive" not in m
        )
        + "."
    )
    if adaptive:
        worst = max(((m, r) for m in adaptive for r in rates), key=lambda mr: at.tpot_vs_ar[mr])
        widest = max(((m, r) for m in adaptive for r in rates), key=lambda mr: at.tpot_hi[mr])
        if at.tpot_vs_ar[worst] <= 1.05:
            verdict = "met by every estimate" + (
                "."
                if at.tpot_hi[widest] <= 1.05
                else f", though the widest interval, {ratio(*widest)} ({widest[0]} at {widest[1]}/s), reaches above it."
            )
        elif at.tpot_vs_ar[worst] - 1 <= noise:
            verdict = (
                f"missed by the estimate, but AR against itself moved by up to {noise:.0%} in this run, so the run "
                "cannot resolve it."
            )
        else:
            verdict = "missed, by more than AR moved against itself."
        lines.append(
            f"The adaptive budgets' worst TPOT against AR is {ratio(*worst)} ({worst[0]} at {worst[1]}/s): the goal of "
            "never more than 1.05 is "
            + verdict
            + " Their mean draft budget per step: "
            + "; ".join(f"{m} " + ", ".join(f"{at.mean_nodes[(m, r)]:.1f} at {r}/s" for r in rates) for m in adaptive)
            + " nodes (0: a plain batched step, where the measured acceptance does not pay for the drafts). A request's "
            "draft model is prefilled only at the first step that drafts for it: "
            + "; ".join(
                f"{m} {int(st_primed[(m, r)])} prefills for {int(at.requests[(m, r)] / passes)} requests at {r}/s"
                for m in adaptive
                for r in (low, high)
            )
            + "."
        )
    return " ".join(lines)


def chat_sweep_text(summary, methods, rates, target: str, agent: dict | None = None, drift: dict | None = None) -> str:
    """A chat model's load sweep in words, from `load_stats.summarize`'s table: AR's median TPOT per rate and,
    with `drift` (rate -> (ratio, lo, hi) of AR's second pass over its first), how far AR moved against
    itself; then each method's TPOT over AR's with its interval, called faster or slower at a rate only where
    the interval clears 1 by more than AR's drift there; `agent`: method -> its ratio on the agent sessions
    at the lowest rate, named beside it."""
    cs = summary.set_index(["method", "rate"])
    noise = {r: abs(d[0] - 1) for r, d in (drift or {}).items()}
    words = [
        f"On {target}, AR's median TPOT is "
        + ", ".join(
            f"{cs.tpot_p50[('AR', r)] * 1e3:.0f} ms at {r}/s (mean batch {cs.mean_batch[('AR', r)]:.2f})" for r in rates
        )
        + "."
    ]
    if drift:
        words.append(
            "AR's second pass against its first: "
            + ", ".join(f"{d[0]:.2f} (95% CI {ci(d[1], d[2])}) at {r}/s" for r, d in drift.items())
            + "; a method is called faster or slower only beyond that."
        )
    for m in (m for m in methods if m != "AR"):
        below = [r for r in rates if cs.tpot_hi[(m, r)] < 1 - noise.get(r, 0.0)]
        above = [r for r in rates if cs.tpot_lo[(m, r)] > 1 + noise.get(r, 0.0)]
        drifted = [r for r in rates if r not in below + above and (cs.tpot_hi[(m, r)] < 1 or cs.tpot_lo[(m, r)] > 1)]
        if cs.tpot_lo[[(m, r) for r in rates]].isna().any():
            verdict = ": one session per rate, no interval."
        elif len(below) == len(rates):
            verdict = ": faster than AR at every rate (each interval below 1" + (
                ", beyond AR's drift)." if drift else ")."
            )
        elif above:
            verdict = f": slower than AR at {', '.join(map(str, above))}/s (interval above 1)."
        else:
            rest = [r for r in rates if r not in below + drifted]
            parts = [f"faster than AR at {', '.join(f'{r}/s' for r in below)}"] if below else []
            if drifted:
                parts.append(
                    f"at {', '.join(f'{r}/s' for r in drifted)} its interval clears 1 but not AR's own drift: the run "
                    "cannot tell"
                )
            if rest:
                parts.append(f"not clearly faster or slower at {', '.join(f'{r}/s' for r in rest)} (interval across 1)")
            verdict = ": " + "; ".join(parts) + "."
        words.append(
            f"{m}'s TPOT over AR's, paired per turn: "
            + "; ".join(
                f"{cs.tpot_vs_ar[(m, r)]:.2f} (95% CI {cs.tpot_lo[(m, r)]:.2f}–{cs.tpot_hi[(m, r)]:.2f}, "
                f"acceptance {cs.acceptance[(m, r)]:.2f}) at {r}/s"
                for r in rates
            )
            + verdict
        )
        if agent and m in agent:
            words.append(f"On the agent sessions above, at {min(agent[m])}/s, it was {agent[m][min(agent[m])]:.2f}.")
    return " ".join(words)


# ---- notebook 07: a pretrained model on Spec-Bench (tables of speclib.research.studies.pretrained_spec_bench)


def pass_cost_text(costs) -> str:
    """Section 1: T(1) at the prefix measured, v(4), v(8), v(16) and the output layer's share of a pass."""
    from speclib.research.studies.pretrained_spec_bench import pass_curve

    passes, t1, head_s = pass_curve(costs)
    return (
        f"At a {int(costs.prefix_len.iloc[0])}-token prefix one pass takes T(1) = {t1 * 1e3:.1f} ms "
        f"({1 / t1:.1f} tokens/s at best); v(4) = {passes[4] / t1:.2f}, v(8) = {passes[8] / t1:.2f}, "
        f"v(16) = {passes[16] / t1:.2f}. The output layer alone (one token) takes {head_s * 1e3:.2f} ms, "
        f"{head_s / t1:.0%} of a pass."
    )


def _over_assisted(druns) -> dict:
    """speclib's draft-model rows over transformers' assisted generation with the same draft, paired per turn:
    "draft model" does the same work (full vocabulary: the like-for-like row); "draft model + FR-Spec" drafts
    from a smaller vocabulary, which assisted generation does not (a row of its own, not a comparison of loops)."""
    from speclib.research import bench

    return {
        m: bench.speedup(druns, m, "transformers assisted")
        for m in ["draft model", "draft model + FR-Spec"]
        if m in set(druns.method)
    }


def _assisted_words(over: dict) -> str:
    like = over["draft model"]
    words = (
        f"speclib's draft model (full vocabulary, the same work) runs at **{like['speedup']:.2f}x** its speed, "
        f"paired per turn (95% CI {ci(like['lo'], like['hi'])}; goal 1.2x: {goal(like, 1.2)})"
    )
    if "draft model + FR-Spec" in over:
        fr = over["draft model + FR-Spec"]
        words += (
            f"; drafting from FR-Spec's smaller vocabulary, which assisted generation does not do, "
            f"{fr['speedup']:.2f}x (95% CI {ci(fr['lo'], fr['hi'])})"
        )
    return words


def assisted_text(druns) -> str:
    """Section 4: transformers' assisted generation with the same draft against speclib's AR and against
    speclib's draft-model loops ("" when the step ran no assisted generation)."""
    from speclib.research import bench

    if "transformers assisted" not in set(druns.method):
        return ""
    hf_k = int(druns[druns.method == "transformers assisted"].chosen_k.iloc[0])
    return (
        f"transformers' assisted generation with the same draft (its k = {hf_k} chosen on the same pilot "
        f"turns) runs at {bench.speedup(druns, 'transformers assisted')['speedup']:.2f}x speclib's AR; "
        + _assisted_words(_over_assisted(druns))
        + "."
    )


def self_draft_text(self_cost, fruns) -> str:
    """Section 4: the chosen self-draft, its speedup over AR, per-token acceptance and draft cost c."""
    from speclib.research import bench

    r_self = bench.speedup(fruns, "self-draft")
    return (
        f"Chosen: {self_cost['subset']} at k = {self_cost['chosen_k']}. On the reported turns the self-draft runs at "
        f"{r_self['speedup']:.2f}x AR (95% CI {r_self['lo']:.2f}-{r_self['hi']:.2f}): per-token acceptance "
        f"{self_cost['token_acceptance']:.2f}, a draft step costing c = {self_cost['c']:.2f} target passes."
    )


def recycling_text(rsaved: dict, tasks: dict, top_k: int) -> str:
    """Section 4: Token Recycling's rank shares after the warm-up, the tree size the cost model chose and
    the measured speedup and tokens per step, carried over and cold."""
    from speclib.research import bench, spec_bench

    rruns, rchoice = rsaved["recycling_runs"], rsaved["recycling_choice"]
    rank_share = rsaved["recycling_ranks"].share.to_numpy()
    r_over = bench.speedup(rruns, "token recycling")
    chosen = rchoice[rchoice.chosen].iloc[0]
    tps = spec_bench.task_table(rruns, tasks).set_index(["task", "method"]).tokens_per_step
    return (
        f"After the warm-up the target's next token was a token's first candidate {rank_share[0]:.0%} of the time, its "
        f"second {rank_share[1]:.0%}, one of the other {top_k - 2} {rank_share[2:-1].sum():.0%}, and not among them "
        f"{rank_share[-1]:.0%}. The cost model chose **{int(chosen.nodes)} nodes** (predicted {chosen.predicted_speedup:.2f}x). "
        f"Measured on the reported turns: {r_over['speedup']:.2f}x over AR (95% CI {r_over['lo']:.2f}-{r_over['hi']:.2f}), "
        f"{tps['overall', 'token recycling']:.2f} tokens per step with the matrix carried over and "
        f"{tps['overall', 'token recycling (cold)']:.2f} from a cold start (the leaderboard: 2.73 on Vicuna-7B)."
    )


def rest_text(ssaved: dict, tasks: dict) -> str:
    """Section 4: REST's datastore, the tree size chosen on the pilot turns, its speedup and tokens per step."""
    from speclib.research import bench, spec_bench

    store_info = ssaved["rest_store"].iloc[0]
    r_rest = bench.speedup(ssaved["rest_runs"], "REST")
    tps = spec_bench.task_table(ssaved["rest_runs"], tasks).set_index(["task", "method"]).tokens_per_step
    return (
        f"The datastore: {int(store_info.tokens):,} tokens ({store_info.megabytes:.1f} MB with its suffix array, sorted in "
        f"{store_info.suffix_array_s:.2f} s). Chosen on the pilot turns: {int(store_info.nodes)} nodes. On the reported turns "
        f"REST runs at {r_rest['speedup']:.2f}x AR (95% CI {r_rest['lo']:.2f}-{r_rest['hi']:.2f}), "
        f"{tps['overall', 'REST']:.2f} "
        f"tokens per step (the leaderboard: 1.63 on Vicuna-7B with a 12 GB datastore of chat text)."
    )


def llamacpp_agreement_text(identity) -> str:
    """Section 4: on how many turns llama.cpp's greedy output equals the float32 model's ("" without it)."""
    ident = identity.set_index("method")
    if "llama.cpp AR" not in ident.index:
        return ""
    cpp_row = ident.loc["llama.cpp AR"]
    return (
        f"llama.cpp's greedy output on the Q4_1 file equals the dequantized float32 model's on "
        f"{cpp_row.identical} of {cpp_row.turns} turns; on average the two agree on the first "
        f"{cpp_row.mean_common_prefix:.0%} of the float32 answer before they part."
    )


def implementations_text(impl) -> str:
    """Section 5: each implementation's median tokens per second with prompt lookup, the fastest, and
    speclib's against the others."""
    sp = impl.set_index("implementation")
    fastest = sp.lookup_tokens_per_s.idxmax()
    return (
        "Median tokens per second with prompt lookup: "
        + ", ".join(f"{i} {r.lookup_tokens_per_s:.1f}" for i, r in sp.iterrows())
        + f". The fastest here is **{fastest}**. speclib's prompt lookup runs at "
        f"{sp.lookup_tokens_per_s['speclib'] / sp.lookup_tokens_per_s['transformers']:.2f}x transformers' "
        + (
            f"and {sp.lookup_tokens_per_s['speclib'] / sp.lookup_tokens_per_s['llama.cpp']:.2f}x llama.cpp's "
            if "llama.cpp" in sp.index
            else ""
        )
        + "(ratios of median tokens per second over the same turns)."
    )


def profile_text(prof, table, board) -> str:
    """Section 6: per method, the rank correlation of its per-task speedups with its leaderboard row's and
    where each gains most; then Token Recycling against prompt lookup where answers copy little ("" with
    fewer than three tasks). `board`: `spec_bench.leaderboard()` indexed by method."""
    from scipy.stats import spearmanr

    from speclib.research.studies.pretrained_spec_bench import PROFILE_PAIRS

    if len(prof) < 3:
        return ""
    overall = table[table.task == "overall"].set_index("method")
    speed_of = table.pivot(index="task", columns="method", values="speedup")
    steps_of = table.pivot(index="task", columns="method", values="tokens_per_step")
    lines = []
    for m, b in PROFILE_PAIRS:
        rho = spearmanr(prof[f"here ({m})"], prof[f"leaderboard {b}"]).statistic
        lines.append(
            f"**{m}**: Spearman {rho:.2f} over {len(prof)} tasks; gains most on {prof[f'here ({m})'].idxmax()} here, "
            f"{prof[f'leaderboard {b}'].idxmax()} on the leaderboard; {overall.tokens_per_step[m]:.2f} tokens per step here, "
            f"{board.loc[b, 'tokens_per_step']:.2f} there."
        )
    uncopied = [t for t in ("translation", "qa", "math_reasoning") if t in speed_of.index]
    wins = [t for t in uncopied if speed_of.loc[t, "token recycling"] > speed_of.loc[t, "prompt lookup"]]
    lines.append(
        f"Where the answer copies little from the prompt ({', '.join(uncopied)}), Token Recycling's median speedup "
        f"over AR is above prompt lookup's on {len(wins)} of {len(uncopied)} tasks (each measured against its own "
        f"step's AR runs; the intervals are in `task_table`)"
        + (f" ({', '.join(wins)})" if wins else "")
        + "; tokens per step there: "
        + ", ".join(
            f"{t} {steps_of.loc[t, 'token recycling']:.2f} vs {steps_of.loc[t, 'prompt lookup']:.2f}" for t in uncopied
        )
        + "."
    )
    return "\n\n".join(lines)


def _ci_if(lo, hi) -> str:
    return f" (95% CI {lo:.2f}–{hi:.2f})" if lo == lo else ""


def long_answers_text(long_table, per_turn, table, long_tasks, short_cap: int, long_cap: int) -> str:
    """Section 6: prompt lookup over AR at the long cap per task beside the short cap, how many AR answers
    loop, and whether the gain follows the repetition across turns."""
    from scipy.stats import spearmanr

    lo_ = long_table[long_table.method == "prompt lookup"].set_index("task")
    short_pl = table[table.method == "prompt lookup"].set_index("task")
    loops = per_turn[per_turn.repeated > 0.5]
    rho_rep = spearmanr(per_turn.repeated, per_turn.lookup_long).statistic if len(per_turn) > 2 else float("nan")
    return (
        f"At {long_cap} new tokens, prompt lookup over AR: "
        + "; ".join(
            f"{t} **{lo_.speedup[t]:.2f}x**"
            + _ci_if(lo_.lo[t], lo_.hi[t])
            + f" at {lo_.tokens_per_step[t]:.2f} tokens per step (at {short_cap}: {short_pl.speedup[t]:.2f}x, "
            f"{short_pl.tokens_per_step[t]:.2f} tokens per step); prefill and bookkeeping {lo_.outside_share[t]:.0%} "
            "of AR's time"
            for t in long_tasks
            if t in lo_.index
        )
        + f". The AR answers average {per_turn.new_tokens.mean():.0f} tokens (at most {long_cap}); "
        f"{len(loops)} of {len(per_turn)} repeat more than half of their 4-grams"
        + (f" ({', '.join(f'{r.task} {r.question_id}' for r in loops.itertuples())})" if len(loops) else "")
        + (
            f", and across turns the gain follows the repetition (Spearman {rho_rep:.2f}): "
            "much of what the longer cap adds is the model copying its own loop."
            if rho_rep >= 0.5
            else f"; across turns the gain does not follow the repetition closely (Spearman {rho_rep:.2f})."
            if rho_rep == rho_rep
            else "."
        )
    )


def chi2_text(chi) -> str:
    """Section 7: which rows of the temperature-1 test reject at α = 0.05, and how to read a rejection."""
    rejected = chi[chi.p_permutation < 0.05].method.tolist()
    if not rejected:
        return "No row rejects at α = 0.05."
    return (
        f"Rejected at α = 0.05: {', '.join(rejected)} — a lossless method should be rejected 5% of the time, "
        "so one rejection among three rows is not evidence by itself; rerun with another SEED before concluding."
    )


def prediction_error_text(perr) -> str:
    """Section 8: the T(n) prediction's signed error per runtime and what it leaves out (`psb.prediction_error`)."""
    e = perr.set_index("runtime")
    high = e[e.error > 0].index.tolist()
    sign = (
        f"every one of the {len(e)} predictions is high"
        if len(high) == len(e)
        else f"{len(high)} of {len(e)} predictions are high, {len(e) - len(high)} low"
    )
    return (
        "Predicted against measured (prediction / measurement - 1): "
        + ", ".join(f"{b} {e.error[b]:+.0%}" for b in e.index)
        + f": {sign}. What the prediction leaves out, measured in the same runs: AR spends "
        f"{e.outside_share.min():.0%}–{e.outside_share.max():.0%} of its time outside its verify passes (mostly "
        "prefill, which both sides pay and which pulls a ratio toward 1); adding it brings the predictions to "
        + ", ".join(f"{b} {e.with_prefill[b]:.2f}x" for b in e.index)
        + ". Inside the loop a prompt lookup verify pass costs "
        + ", ".join(f"{b} {e.lookup_loop[b]:.2f}" for b in e.index)
        + " times its bare-pass price, AR's one-token step "
        + ", ".join(f"{b} {e.ar_loop[b]:.2f}" for b in e.index)
        + f" (bookkeeping, and a wide pass's cache writes); drafting is {e.draft_share.max():.1%} of prompt lookup's "
        "time at most. Together these give the pooled ratio of the runs ("
        + ", ".join(f"{b} {e.pooled[b]:.2f}x" for b in e.index)
        + "); the measured speedup is the median of per-turn ratios, which weighs every turn alike."
    )


def _runtime_rho(rt_t) -> float:
    """Spearman correlation of v(2) with prompt lookup's measured speedup over the runtimes (NaN below 3)."""
    from scipy.stats import spearmanr

    return spearmanr(rt_t.v2, rt_t.measured).statistic if len(rt_t) > 2 else float("nan")


def runtimes_text(rtable) -> str:
    """Section 8: where prompt lookup pays or loses, whether it follows v(2), how close the T(n) prediction
    comes, the fastest runtime with and without it, and the greedy identity per runtime."""
    rt_t = rtable.set_index("runtime")
    wins = rt_t[rt_t.lo > 1].index.tolist()
    loses = rt_t[rt_t.hi < 1].index.tolist()
    fastest_rt = rt_t.lookup_tokens_per_s.idxmax()
    fastest_ar = rt_t.ar_tokens_per_s.idxmax()
    err = (rt_t.measured / rt_t.predicted - 1).abs()
    rho_v = _runtime_rho(rt_t)
    return (
        f"Prompt lookup pays (whole interval above 1) on: {', '.join(f'{b} {rt_t.measured[b]:.2f}x' for b in wins) or 'none'}; "
        f"it loses (whole interval below 1) on: {', '.join(f'{b} {rt_t.measured[b]:.2f}x' for b in loses) or 'none'}. "
        f"Spearman rank correlation of v(2) with the measured speedup: {rho_v:.2f} over {len(rt_t)} runtimes"
        + (
            " (the cheaper a two-token pass, the more speculation gains). "
            if rho_v <= -0.5
            else " (no clear ordering by v(2)). "
        )
        + f"The prediction from T(n) alone parts from the measurement by {err.median():.0%} at the median (worst: "
        f"{err.idxmax()}, {err.max():.0%}; signed, and what it leaves out, below). Fastest AR: **{fastest_ar}** at "
        f"{rt_t.ar_tokens_per_s[fastest_ar]:.1f} tokens/s; fastest with prompt lookup: **{fastest_rt}** at "
        f"{rt_t.lookup_tokens_per_s[fastest_rt]:.1f} tokens/s, {rt_t.lookup_over_torch_ar[fastest_rt]:.2f}x torch float32 AR "
        f"(medians of tokens per second, not paired). "
        + (
            f"The fastest way to run this model here is therefore {fastest_ar}'s plain AR: speculation does not pay on "
            f"the runtime that is fastest without it. "
            if rt_t.ar_tokens_per_s[fastest_ar] > rt_t.lookup_tokens_per_s[fastest_rt]
            else f"The fastest way to run this model here is {fastest_rt} with prompt lookup. "
        )
        + "Greedy prompt lookup equals its own runtime's AR on "
        + ", ".join(f"{b} {rt_t.identical[b]}/{rt_t.turns[b]}" for b in rt_t.index)
        + " turns."
        + (
            ""
            if (rt_t.identical == rt_t.turns).all()
            else " Where it does not, the runtime's rounding depends on the width of the pass (dynamic int8 takes one activation "
            "scale over all the rows of a pass, llama.cpp quantizes activations in blocks, bf16 keeps 8 bits of mantissa "
            "and a wider pass takes another kernel): a verify pass and a one-token AR pass can then break a near-tie "
            "differently, and from there the texts part. That is the runtime's arithmetic, not the acceptance rule "
            "(notebook 05, section 5), and the float32 rows must stay identical; on those runtimes the speedup compares "
            "two different texts of the same prompt."
        )
    )


def llamacpp_loops_text(cpp_loops, runtime_runs) -> str:
    """Section 8: speclib's prompt lookup loop against llama.cpp's on llama.cpp's own forward."""
    from speclib.research.studies.pretrained_spec_bench import llamacpp_over

    cpp_over = llamacpp_over(runtime_runs)
    cl = cpp_loops.set_index("loop")
    return (
        f"On llama.cpp's forward, speclib's prompt lookup runs at **{cpp_over['speedup']:.2f}x** llama.cpp's own "
        f"(paired per turn, 95% CI {cpp_over['lo']:.2f}–{cpp_over['hi']:.2f}, {cpp_over['prompts']} turns; "
        f"goal 1.0x: {goal(cpp_over, 1.0)}). "
        f"Over this runtime's AR: speclib's loop {cl.over_ar['speclib']:.2f}x, llama.cpp's {cl.over_ar['llama.cpp']:.2f}x. "
        f"Each equals the runtime's AR text on {cl.identical_to_ar['speclib']} and "
        f"{cl.identical_to_ar['llama.cpp']} of {cl.turns['speclib']} turns (llama.cpp rounds a wide pass "
        "differently from a narrow one, above)."
    )


def code_model_v8(lat05) -> str:
    """v(8) of notebook 05's code model at one thread in torch, from its saved latency table (None: not run)."""
    if lat05 is None:
        return "notebook 05 not run here"
    lat05 = lat05[(lat05.backend == "torch") & (lat05.role == "target") & (lat05.threads == 1)]
    return f"{lat05[lat05.n == 8].ratio.median():.2f} for notebook 05's 27.8M code model at one thread, as its saved run measured it"


SPEC_METHODS = (
    "prompt lookup",
    "suffix",
    "feature head",
    "feature head + FR-Spec",
    "draft model",
    "draft model + FR-Spec",
    "token recycling",
    "REST",
    "lookahead",
    "HVD (every source)",
)
CACHE_METHODS = ("prompt lookup", "suffix", "HVD (every source)")


TRAINING_FREE = ("prompt lookup", "suffix", "token recycling", "REST", "lookahead", "HVD (every source)")
# the single sources among them (HVD chooses among these), as the report's per-task rows pick from
SINGLE_SOURCES = ("prompt lookup", "suffix", "token recycling", "token recycling (cold)", "REST", "lookahead")


def best_held_out_text(best) -> str:
    """Section 4: the best training-free single source per task, picked on the reported turns, its interval,
    and what the pick makes when it is made on the task's other turns (`psb.best_held_out`)."""
    b = best.set_index("task")
    tasks = [t for t in b.index if t != "overall"]
    beats = [t for t in tasks if b.lo[t] > 1]
    return (
        "**Picking the best source, and the winner's curse.** The best of the single sources on a task's reported "
        "turns is partly the one whose noise was kindest there. Per task: the pick on its own turns, its "
        + (
            f"order-statistic interval ({b.coverage.min():.1%}–{b.coverage.max():.1%} for a source fixed in advance, "
            "a few points less for a pick among several)"
            if b.coverage.notna().any()
            else "order-statistic interval (none here: fewer than 6 turns reach 95%)"
        )
        + ", and in bold what the pick makes when each turn's pick is made on "
        "the task's other turns and measured on the one left out: "
        + "; ".join(
            f"{t} {b.in_sample[t]} {b.in_sample_speedup[t]:.2f}x ({ci(b.lo[t], b.hi[t])}), "
            f"**{b.held_out[t]:.2f}x** picked on the others ({b.picks[t]})"
            for t in tasks
        )
        + f". The pick's whole interval is above 1 in {len(beats)} of {len(tasks)} tasks"
        + (f" ({', '.join(beats)})" if beats else "")
        + (
            f"; overall the single best source is {b.in_sample['overall']} at {b.in_sample_speedup['overall']:.2f}x "
            f"({ci(b.lo['overall'], b.hi['overall'])}), {b.held_out['overall']:.2f}x picked turn by turn on the "
            f"other {int(b.turns['overall']) - 1}."
            if "overall" in b.index
            else "."
        )
    )


def degeneracy_text(degen, both, rho_copy: float, rho_repeat: float, threshold: float) -> str:
    """Section 4's degenerate answers: how many turns copy their prompt or loop, how the per-turn gains follow
    them, and the training-free methods' speedups on all turns and on the others (`psb.degeneracy`,
    `psb.degenerate_table`; `rho_*`: Spearman over turns of the copied share with prompt lookup's gain and of
    the repeated share with HVD's)."""
    bad = degen[degen.degenerate]
    copies, loops = int((bad.copied > threshold).sum()), int((bad.repeated > threshold).sum())
    per_task = ", ".join(f"{t} {int(g.degenerate.sum())} of {len(g)}" for t, g in degen.groupby("task", sort=False))
    o = both[both.task == "overall"].set_index("method")
    free = [m for m in TRAINING_FREE if m in o.index]

    def row(m):
        r = o.loc[m]
        return (
            f"{m} {r.speedup_all:.2f}x (95% CI {ci(r.lo_all, r.hi_all)}) on all turns, "
            f"**{r.speedup_clean:.2f}x** ({ci(r.lo_clean, r.hi_clean)}) on the others"
        )

    clean = o.loc[free].speedup_clean
    return (
        f"**{len(bad)} of {len(degen)} reported turns copy or loop**: AR's answer takes more than "
        f"{threshold:.0%} of its 4-grams from the prompt ({copies} turns) or repeats them from its own earlier "
        f"text ({loops}; a turn can do both). Per task: {per_task}. Over the turns, the share copied from the "
        f"prompt and prompt lookup's gain rank alike (Spearman {rho_copy:.2f}), and so do the share repeated and "
        f"HVD's gain ({rho_repeat:.2f}). Without those turns ({int(o.turns_clean.max())} left): "
        + "; ".join(row(m) for m in free)
        + f". On text that neither copies its prompt nor loops, expect the training-free methods at "
        f"{clean.min():.2f}–{clean.max():.2f}x AR rather than the {o.loc[free].speedup_all.min():.2f}–"
        f"{o.loc[free].speedup_all.max():.2f}x of all turns (per task in the table above; a task with fewer than "
        "two such turns has none)."
    )


def _best_line(overall, best_method) -> str:
    """The best method overall against the workbook's 2.0x goal."""
    est, lo = overall.speedup[best_method], overall.lo[best_method]
    return (
        f"* Best speculative method overall: **{best_method}**, {est:.2f}x over AR "
        f"(95% CI {lo:.2f}–{overall.hi[best_method]:.2f}); the workbook's goal of 2.0x is "
        + (
            "met."
            if lo >= 2.0
            else f"{'not ' if est < 2.0 else ''}met by the point estimate"
            + (f" (it would take {2.0 / est:.2f}x more)" if est < 2.0 else ", not by the whole interval")
            + "."
        )
    )


def _bound_line(overall, ceil_o, best_method, outside_share, tokens_needed) -> str:
    """What bounds the best method: its ceiling from acceptance alone, against the 2.0x goal."""
    return (
        f"* What bounds it: with drafting free and every verify pass as cheap as AR's step, {best_method}'s "
        f"acceptance ({overall.tokens_per_step[best_method]:.2f} tokens per target pass) allows "
        f"{ceil_o.ceiling[best_method]:.2f}x (95% CI {ceil_o.ceiling_lo[best_method]:.2f}–"
        f"{ceil_o.ceiling_hi[best_method]:.2f}); drafting and the wider pass cost the rest. AR spends "
        f"{outside_share['overall']:.0%} of its time outside its verify passes (mostly prefill), so 2.0x asks for about "
        f"{tokens_needed(2.0, 'overall'):.2f} tokens per pass even at no cost. The highest ceiling of any method "
        f"here is {ceil_o.ceiling.idxmax()}'s {ceil_o.ceiling.max():.2f}x: "
        + (
            "the goal lies above every method's whole interval, so no cost saving reaches it; only drafts the target "
            "accepts more often can."
            if ceil_o.ceiling_hi.max() < 2.0
            else "the goal lies above that estimate, inside its interval: even free drafting and a free wide pass would "
            "most likely miss it, and drafts the target accepts more often are what would reach it."
            if ceil_o.ceiling.max() < 2.0
            else "acceptance allows the goal; the costs of drafting and of the wider pass are what miss it."
            if overall.speedup[best_method] < 2.0
            else "acceptance allows it and it is reached."
        )
    )


def _cache_line(table, ceiling, overall, board, v8, tokens_needed, degen=None) -> str:
    """Where cache drafts pay: per task the best cache draft's speedup beside the share of answer 4-grams copied
    from the prompt (where `degen` is given), the 2.5x goal on summarization and RAG, and prompt lookup beside
    PLD."""
    from scipy.stats import spearmanr

    cache_methods = list(CACHE_METHODS)
    per_task = table[table.method.isin(cache_methods)].pivot(index="task", columns="method", values="speedup")
    copy_tasks = [t for t in ("summarization", "rag") if t in per_task.index]
    tasks_ = [t for t in per_task.index if t != "overall"]
    best = per_task.loc[tasks_].max(axis=1).sort_values(ascending=False)
    copied = degen.groupby("task").copied.mean() if degen is not None else None
    pl_steps, pld_steps = overall.tokens_per_step["prompt lookup"], board.loc["PLD", "tokens_per_step"]
    close = bool(overall.speedup["prompt lookup"] >= 0.85 * board.loc["PLD", "overall"])
    rho = spearmanr(best, copied.reindex(best.index)).statistic if copied is not None and len(best) > 2 else None
    return (
        "* Cache drafts per task, best of "
        + ", ".join(m for m in cache_methods if m in per_task.columns)
        + ": "
        + ", ".join(
            f"{t} {best[t]:.2f}x" + (f" (copied share {copied[t]:.2f})" if copied is not None else "")
            for t in best.index
        )
        + (
            f"; the tasks whose answers copy more of their prompt gain more (Spearman {rho:.2f} over {len(best)} tasks)"
            if rho is not None and rho >= 0.5
            else f"; the per-task gain does not follow the copied share (Spearman {rho:.2f} over {len(best)} tasks)"
            if rho is not None
            else ""
        )
        + (
            f"; the 2.5x goal on summarization and RAG is {'met' if all(best[t] >= 2.5 for t in copy_tasks) else 'not met'}"
            + " (acceptance alone allows "
            + ", ".join(
                f"{t} {cm.ceiling.max():.2f}x by {cm.ceiling.idxmax()}, where 2.5x needs about "
                f"{tokens_needed(2.5, t):.2f} tokens per pass against its {cm.tokens_per_step[cm.ceiling.idxmax()]:.2f}"
                for t in copy_tasks
                for cm in [ceiling[(ceiling.task == t) & ceiling.method.isin(cache_methods)].set_index("method")]
            )
            + ")"
            if copy_tasks
            else ""
        )
        + f". Mean tokens per target step: {pl_steps:.2f} for prompt lookup here, "
        f"{pld_steps:.2f} for PLD on the leaderboard"
        + (
            " — about the same: what the drafter gets accepted carries over from a 7B model on a GPU"
            if abs(pl_steps - pld_steps) < 0.15
            else ""
        )
        + f"; its speedup is {overall.speedup['prompt lookup']:.2f}x here, {board.loc['PLD', 'overall']:.2f}x there"
        + {
            (True, True): ", close: a wide verify pass costs little more than a narrow one here too (next line).",
            (
                True,
                False,
            ): ", close, though a verify pass over several tokens costs much more than one here (next line).",
            (False, True): ", lower, though a wide verify pass costs little more than a narrow one here (next line): "
            "the difference lies outside the verify pass.",
            (False, False): ", lower: here a verify pass over several tokens costs much more than one (next line).",
        }[(close, bool(v8 < 1.3))]
    )


def _long_line(long_table, long_turns, long_tasks, long_cap) -> str:
    """Prompt lookup at Spec-Bench's own cap against 2.5x, and how many AR answers loop."""
    lo_ = long_table[long_table.method == "prompt lookup"].set_index("task")
    loops = long_turns[long_turns.repeated > 0.5]
    return (
        f"* At Spec-Bench's own cap of {long_cap} tokens (section 6) prompt lookup reaches "
        + ", ".join(f"{t} {lo_.speedup[t]:.2f}x" + _ci_if(lo_.lo[t], lo_.hi[t]) for t in long_tasks if t in lo_.index)
        + (
            f", below 2.5x on {' and '.join(t for t in long_tasks if lo_.speedup.get(t, 2.5) < 2.5)}, "
            if (lo_.speedup.reindex(long_tasks) < 2.5).any()
            else ", 2.5x or more on each, "
        )
        + f"with {len(loops)} of {len(long_turns)} AR answers repeating more than half of their 4-grams: "
        + (
            "the longer cap gives the copy more to copy, part of it the model's own loops."
            if len(loops)
            else "the longer cap gives the copy more to copy, and none of it is a loop."
        )
    )


def _trained_lines(tables, overall, fr_vocab) -> list[str]:
    """The feature head, the separate draft model (and transformers' assisted generation) and the
    self-draft, each where its step ran."""
    lines = []
    if "head_cost" in tables:
        hc = tables["head_cost"].set_index("method")
        lines.append(
            f"* The trained feature head: {overall.speedup['feature head']:.2f}x over AR with "
            f"{overall.tokens_per_step['feature head']:.2f} tokens per target step (k = {hc.chosen_k['feature head']}), "
            f"its draft step costing c = {hc.c['feature head']:.2f} target passes"
            + (
                f"; drafting from the {fr_vocab} most frequent tokens (FR-Spec) brings c to "
                f"{hc.c['feature head + FR-Spec']:.2f} and the speedup to {overall.speedup['feature head + FR-Spec']:.2f}x "
                f"({overall.tokens_per_step['feature head + FR-Spec']:.2f} tokens per step)."
                if fr_vocab
                else "."
            )
        )
    if "draft_cost" in tables:
        dc = tables["draft_cost"].set_index("method")
        lines.append(
            "* The separate draft model (SmolLM2 cut to 4 layers, distilled): "
            + "; ".join(
                f"{m} {overall.speedup[m]:.2f}x over AR ({overall.tokens_per_step[m]:.2f} tokens per step at "
                f"k = {dc.chosen_k[m]}, per-token acceptance {dc.token_acceptance[m]:.2f}, c = {dc.c[m]:.2f})"
                for m in dc.index
            )
            + "."
        )
        if "transformers assisted" in overall.index:
            lines.append(
                "* Against transformers' assisted generation with the same draft: "
                + _assisted_words(_over_assisted(tables["draft_runs"]))
                + f"; assisted generation itself at {overall.speedup['transformers assisted']:.2f}x speclib's AR."
            )
    if "self_cost" in tables:
        sc = tables["self_cost"]
        sc = sc.iloc[0] if hasattr(sc, "columns") else sc
        lines.append(
            f"* Self-speculation with SmolLM2's own layers ({sc['subset']} with a trained exit, k = "
            f"{sc['chosen_k']}): {overall.speedup['self-draft']:.2f}x over AR, "
            f"{overall.tokens_per_step['self-draft']:.2f} tokens per step at a per-token acceptance of "
            f"{sc['token_acceptance']:.2f} and c = {sc['c']:.2f}"
            + (
                "; it pays, as it did not on notebook 06's hybrid model at long contexts."
                if overall.lo["self-draft"] > 1
                else "; like notebook 06's self-drafts it does not pay: a subset cheap enough to draft with agrees too "
                "rarely with the whole model."
                if overall.hi["self-draft"] < 1
                else "; it neither clearly wins nor clearly loses."
            )
        )
    return lines


def _peer_lines(tables, overall) -> list[str]:
    """speclib against transformers on the same weights, and against llama.cpp on its own numbers."""
    from speclib.research import bench
    from speclib.research.studies.pretrained_spec_bench import llamacpp_over

    sp = tables["implementations"].set_index("implementation")
    over_tf = bench.speedup(tables["runs"], "prompt lookup", "transformers prompt lookup")
    lines = [
        f"* Against transformers on the same float32 weights: speclib's prompt lookup at {over_tf['speedup']:.2f}x its "
        f"prompt lookup's speed, paired per turn (95% CI {over_tf['lo']:.2f}–{over_tf['hi']:.2f}; goal 1.2x: "
        f"{goal(over_tf, 1.2)}; ratio of median tokens per second "
        f"{sp.lookup_tokens_per_s['speclib'] / sp.lookup_tokens_per_s['transformers']:.2f}x); transformers' AR at "
        f"{overall.speedup['transformers AR']:.2f}x speclib's, its prompt lookup at "
        f"{sp.lookup_over_own_ar['transformers']:.2f}x its own AR."
    ]
    if "llama.cpp" in sp.index:
        loops = tables.get("llamacpp_loops")
        if loops is not None and len(loops):
            cpp_over = llamacpp_over(tables["runtime_runs"])
            own = (
                f"; run on llama.cpp's own forward (section 8), speclib's prompt lookup is {cpp_over['speedup']:.2f}x "
                f"llama.cpp's at the same n-gram and k (paired, 95% CI {cpp_over['lo']:.2f}–{cpp_over['hi']:.2f}; goal 1.0x: "
                f"{goal(cpp_over, 1.0)})."
            )
        else:
            own = " (goal 1.0x, which asks for the same quantized numbers: section 8 did not run llama.cpp here)."
        lines.append(
            f"* llama.cpp is another runtime on other numbers: the 4-bit file's weights with activations rounded to "
            f"8 bits. Its plain AR already runs at {overall.speedup['llama.cpp AR']:.2f}x speclib's float32 AR "
            f"(a backend effect, notebook 05's subject, not speculation), and its prompt lookup at "
            f"{sp.lookup_over_own_ar['llama.cpp']:.2f}x its own AR; speclib's prompt lookup reaches "
            f"{sp.lookup_tokens_per_s['speclib'] / sp.lookup_tokens_per_s['llama.cpp']:.2f}x llama.cpp's tokens per "
            "second in float32" + own
        )
    return lines


def _runtime_line(rtable) -> str:
    """Whether speculation pays per runtime, and on the fastest one."""
    rt_t = rtable.set_index("runtime")
    rho_v = _runtime_rho(rt_t)
    fastest_ar = rt_t.ar_tokens_per_s.idxmax()
    return (
        "* The runtime decides whether speculation pays (section 8): prompt lookup over its own AR "
        + ", ".join(f"{b} {rt_t.measured[b]:.2f}x (v(2) = {rt_t.v2[b]:.2f})" for b in rt_t.index)
        + (". It pays most where a wide pass is cheapest" if rho_v <= -0.5 else ". Its gain does not follow v(2) here")
        + f"; the fastest runtime ({fastest_ar}, "
        f"{rt_t.ar_tokens_per_s[fastest_ar] / rt_t.ar_tokens_per_s.get('torch', float('nan')):.2f}x torch float32 AR's "
        "tokens per second) "
        + (
            "is one where it loses."
            if rt_t.hi[fastest_ar] < 1
            else "is one where it pays."
            if rt_t.lo[fastest_ar] > 1
            else "is one where it neither clearly pays nor loses."
        )
    )


def _identity_line(identity) -> str:
    """Whether every speclib method's greedy output equals AR's on every turn."""
    from speclib.research.studies.pretrained_spec_bench import speclib_methods

    ident = identity.set_index("method")
    mine = [m for m in speclib_methods(ident.index) if m in ident.index]
    turns = int(ident.turns.max())
    differ = [m for m in mine if ident.identical[m] != turns]
    if not differ:
        return f"* Greedy output of every speclib method equals AR's on all {turns} turns."
    return f"* Greedy output DIFFERS from AR's for {', '.join(differ)}: a lossless method changed the output."


def spec_bench_text(
    tables: dict, tasks: dict, board, lat05=None, *, lookup_k: int, fr_vocab=None, long_tasks=(), long_cap=None
) -> str:
    """Section 9 of notebook 07, what carries over, from its tables (named as saved: task_table, ceiling,
    identity, implementations, runtime_table, and the steps' runs, pass_costs, runtime_runs; where their
    steps ran, head_cost, draft_cost with draft_runs, self_cost, llamacpp_loops, long_table with long_turns).
    `tasks`: reported turn -> task; `board`: `spec_bench.leaderboard()` indexed by method; `lat05`: notebook
    05's latency table or None; `lookup_k`: prompt lookup's chosen k."""
    from speclib.research.studies.pretrained_spec_bench import outside_shares, pass_curve

    table = tables["task_table"]
    overall = table[table.task == "overall"].set_index("method")
    ceiling = tables["ceiling"]
    ceil_o = ceiling[ceiling.task == "overall"].set_index("method").sort_values("ceiling")
    passes, t1, _ = pass_curve(tables["pass_costs"])
    outside_share = outside_shares(tables["runs"], tasks)

    def tokens_needed(g, task):
        s = outside_share[task]
        return (1 - s) / (1 / g - s) if 1 / g > s else float("inf")

    best_method = overall.loc[[m for m in SPEC_METHODS if m in overall.index]].speedup.idxmax()
    v8 = passes[8] / t1
    lines = [
        _best_line(overall, best_method),
        _bound_line(overall, ceil_o, best_method, outside_share, tokens_needed),
        _cache_line(table, ceiling, overall, board, v8, tokens_needed, tables.get("degeneracy")),
    ]
    if long_cap and "long_table" in tables:
        lines.append(_long_line(tables["long_table"], tables["long_turns"], long_tasks, long_cap))
    lines += [
        f"* One verify pass over 8 tokens costs v(8) = {v8:.2f} passes over one here ({code_model_v8(lat05)}): "
        + (
            "the extra rows of a verify pass are nearly free at this size, so a rejected copy costs little"
            if v8 < 1.3
            else "the extra rows of a verify pass are far from free, so a rejected long copy costs nearly what it would "
            "have gained"
        )
        + f"; k was chosen on the pilot questions ({lookup_k}). The same forward through plain `F.linear` "
        "(backend torch-mkl, section 8) prices the same rows differently: which matrix-multiply library runs the "
        "projections is part of the backend.",
        _identity_line(tables["identity"]),
        *_trained_lines(tables, overall, fr_vocab),
        *_peer_lines(tables, overall),
        _runtime_line(tables["runtime_table"]),
    ]
    return "\n".join(lines)


def _per_turn_memory(es_speed, es_over, best_single: str) -> str:
    """HVD with its caches kept across the reported turns against the same HVD made afresh each turn, that one
    against the best single source (both rebuilt per turn): the gain of source choice alone; and HVD against
    the suffix tree kept across turns too, where the step ran it (memory against memory)."""
    per_turn = "HVD (every source, per turn)"
    if per_turn not in es_speed.index:
        return ""
    hvd_rows = es_over[es_over.method == "HVD (every source)"]
    memory, alone = hvd_rows.loc[per_turn], es_over[es_over.method == per_turn].loc[best_single]
    text = (
        f"Its suffix tree and Token Recycling matrix persist across the turns, where the single sources start each "
        f"turn afresh; made afresh every turn too, HVD runs at {es_speed.speedup[per_turn]:.2f}x AR "
        f"(CI {ci(es_speed.lo[per_turn], es_speed.hi[per_turn])}), so its memory across turns is worth "
        f"{memory.speedup:.2f}x (CI {ci(memory.lo, memory.hi)}), and choosing the source alone, like for like, "
        f"{alone.speedup:.2f}x {best_single} (CI {ci(alone.lo, alone.hi)}; the 1.15x goal: {goal(alone, 1.15)}). "
    )
    if "suffix (across turns)" in hvd_rows.index:
        kept = hvd_rows.loc["suffix (across turns)"]
        text += (
            f"Against the suffix tree kept across the turns as well, HVD runs at {kept.speedup:.2f}x "
            f"(CI {ci(kept.lo, kept.hi)}): memory against memory. "
        )
    return text


def every_source_text(es_la, es_speed, es_over, es_choice, best_single: str, n_logs: int) -> str:
    """Notebook 07's account of HVD over every source: Lookahead's chosen window and speed, HVD against AR and
    against the best single source (the 1.15x goal), what it verified, and how far its predictor over-promised."""
    over = es_over[es_over.method == "HVD (every source)"]
    h = over.loc[best_single]
    share = es_choice.groupby("source").size() / len(es_choice)
    cal = es_choice.dropna(subset=["predicted"]).groupby("source")[["predicted", "accepted"]].mean()
    overpromise = cal.predicted - cal.accepted  # tokens per verified step the predictor over-promised
    la_best = es_la[es_la.chosen].iloc[0]
    never = [s for s in ["prompt_lookup", "suffix", "recycling", "rest"] if s not in share.index]
    return (
        f"Lookahead, chosen on the pilot turns: W = {int(la_best.window)}, N = {int(la_best.ngram)}, G = {int(la_best.guesses)} "
        f"({la_best.mean_nodes:.1f} nodes, {la_best.tokens_per_call:.2f} tokens per call, predicted {la_best.predicted_speedup:.2f}x); "
        f"on the reported turns {es_speed.speedup['lookahead']:.2f}x AR (CI {es_speed.lo['lookahead']:.2f}–{es_speed.hi['lookahead']:.2f}), "
        f"{es_speed.tokens_per_call['lookahead']:.2f} tokens per call (the leaderboard: 1.64 tokens per step, 1.13x on Vicuna-7B). "
        f"HVD over every source runs at {es_speed.speedup['HVD (every source)']:.2f}x AR "
        f"(CI {es_speed.lo['HVD (every source)']:.2f}–{es_speed.hi['HVD (every source)']:.2f}); paired per turn it runs at "
        f"**{h.speedup:.2f}x** the best single source of this step, {best_single} (CI {h.lo:.2f}–{h.hi:.2f}): "
        + f"the 1.15x goal: {goal(h, 1.15)}. "
        + _per_turn_memory(es_speed, es_over, best_single)
        + "It verified "
        + ", ".join(f"{s} {v:.0%}" for s, v in share.sort_values(ascending=False).items())
        + " of its steps"
        + (f" and never picked {', '.join(never)}" if never else "")
        + ". Predicted against accepted tokens when it verified "
        "each source: "
        + "; ".join(f"{s} {r.predicted:.2f} vs {r.accepted:.2f}" for s, r in cal.iterrows())
        + "."
        + (
            f" The predictor was fitted on {n_logs:,} logged candidates; it over-promised most on "
            f"{overpromise.idxmax()} ({overpromise.max():+.2f} tokens per verified step, {share.get(overpromise.idxmax(), 0):.0%} of "
            "the steps): those steps were chosen on payoffs they did not deliver, so at some of them a plain step or another "
            "source would have been the better choice."
            if len(overpromise) and overpromise.max() > 0
            else f" The predictor was fitted on {n_logs:,} logged candidates and promised no source more than it "
            "delivered on average."
            if len(overpromise)
            else " It verified no cache candidate: every step was a plain one."
        )
    )
