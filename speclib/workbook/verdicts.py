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
    crossings = {m: next((r for r in rates if at.tpot_lo[(m, r)] > 1), None) for m in spec if "adaptive" not in m}
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
        "Fixed budgets against AR as the load rises: "
        + "; ".join(
            f"{m} "
            + (f"slower than AR (interval above 1) from {r}/s" if r is not None else "never clearly slower than AR")
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


def chat_sweep_text(summary, methods, rates, target: str, agent: dict | None = None) -> str:
    """A chat model's load sweep in words, from `load_stats.summarize`'s table: AR's median TPOT per rate,
    then each method's TPOT over AR's with its interval and whether it is faster or slower at every rate;
    `agent`: method -> its ratio on the agent sessions at the lowest rate, named beside it."""
    cs = summary.set_index(["method", "rate"])
    words = [
        f"On {target}, AR's median TPOT is "
        + ", ".join(
            f"{cs.tpot_p50[('AR', r)] * 1e3:.0f} ms at {r}/s (mean batch {cs.mean_batch[('AR', r)]:.2f})" for r in rates
        )
        + "."
    ]
    for m in (m for m in methods if m != "AR"):
        below = [r for r in rates if cs.tpot_hi[(m, r)] < 1]
        above = [r for r in rates if cs.tpot_lo[(m, r)] > 1]
        if cs.tpot_lo[[(m, r) for r in rates]].isna().any():
            verdict = ": one session per rate, no interval."
        elif len(below) == len(rates):
            verdict = ": faster than AR at every rate (each interval below 1)."
        elif above:
            verdict = f": slower than AR at {', '.join(map(str, above))}/s (interval above 1)."
        else:
            across = ", ".join(f"{r}/s" for r in rates if r not in below)
            verdict = f": not clearly faster or slower than AR at {across} (interval across 1)."
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
