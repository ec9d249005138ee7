"""Timing, the one speedup estimator, and the analytic model of speculative decoding.

    python -m speclib bench [--prompts 12] [--pilot 4] [--rounds 3] [--max-new-tokens 96]   (also `make bench`)
    python -m speclib bench --target-backend llamacpp-q4_0 --draft-backend llamacpp-q4_0

Every speedup in the workbook is measured one way (docs/statistics.md):

- `paired_runs` runs the reference (AR) and every method on the same prompt back to back, the order
  alternating between prompts and rounds (A B C, then C B A: ABBA), after one warm-up run of each,
  and records one row per (prompt, round, method) with the loop's own per-step costs.
- `speedup_table` is the estimator: for each method, the median over prompts of the per-prompt speed
  ratio (method tokens/s over reference tokens/s, the median of the rounds), a 95% percentile
  bootstrap CI over prompts, the total-time ratio beside it, and the run-to-run spread (the same
  estimate computed on each round alone: min and max). It also reads c and v(K) from the same runs.
- Settings (best K, tree budget, ...) are chosen on pilot prompts and reported on disjoint ones:
  the maximum of several noisy medians is biased upward.

Every clock read goes through `speclib.core.device.clock`, which synchronises the device first.
The analytic model (docs/analytic_model.md): E = (1 - a^{K+1}) / (1 - a) tokens per target call,
speedup = E / (K c + v(K)). Nothing here is asserted as a test.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd
import torch

from speclib.core.analytic import expected_tokens, predicted_speedup  # noqa: F401  (part of bench's API)
from speclib.core.device import clock
from speclib.core.generate import Generation, Step, generate
from speclib.core.protocols import LM
from speclib.core.sampling import Sampling
from speclib.drafters import ModelDrafter
from speclib.research import peers, stats

WARMUP_PASSES = 5  # untimed passes before timing a latency case (allocator, caches, kernel choice)


def _timed_extend(lm: LM, tokens: list[int]) -> float:
    t0 = clock(lm.device)
    lm.extend(tokens, list(range(-1, len(tokens) - 1)))
    dt = clock(lm.device) - t0
    lm.commit([])
    return dt


def latencies(
    cases: list[tuple[LM, int]], prefix_len: int = 128, repeats: int = 30, warmup: int = WARMUP_PASSES
) -> list[float]:
    """Median seconds of one extend() scoring n new chain tokens over a cached prefix, for each
    (lm, n) case. The cases are timed round-robin, so a burst of machine noise hits them all alike
    instead of biasing whichever was being timed at that moment."""
    return [statistics.median(ts) for ts in latency_samples(cases, prefix_len, repeats, warmup)]


def latency_samples(
    cases: list[tuple[LM, int]], prefix_len: int = 128, repeats: int = 30, warmup: int = WARMUP_PASSES
) -> list[list[float]]:
    """Every timed repeat (seconds) of each (lm, n) case of `latencies`, warm-up excluded."""
    gen = torch.Generator().manual_seed(0)
    for lm in {id(lm): lm for lm, _ in cases}.values():
        lm.reset(torch.randint(0, lm.vocab_size, (prefix_len,), generator=gen).tolist())
    tokens = [torch.randint(0, lm.vocab_size, (n,), generator=gen).tolist() for lm, n in cases]
    times = [[] for _ in cases]
    for _ in range(warmup + repeats):
        for (lm, _), toks, ts in zip(cases, tokens, times):
            ts.append(_timed_extend(lm, toks))
    return [ts[warmup:] for ts in times]


def cost_profile(target: LM, draft: LM, ks=range(1, 9), prefix_len: int = 128, repeats: int = 30) -> dict:
    """c = T_draft(1)/T_target(1) and v(K) = T_target(K+1)/T_target(1), from bare passes timed side
    by side (`latencies`). `loop_costs` reads the same quantities from decoding runs."""
    ks = list(ks)
    t1, d1, *tk = latencies([(target, 1), (draft, 1)] + [(target, k + 1) for k in ks], prefix_len, repeats)
    return {"target_1": t1, "draft_1": d1, "c": d1 / t1, "v": {k: t / t1 for k, t in zip(ks, tk)}}


# --- paired runs and the estimator -------------------------------------------------------------


def _row(g: Generation) -> dict:
    """What one decoding run contributes to a paired-runs row: time, tokens, acceptance, and the
    loop's per-step costs (medians, robust to the odd slow step)."""
    steps = g.stats.steps
    drafted = sum(s["drafted"] for s in steps)
    per_token = [s["draft_s"] / s["drafted"] for s in steps if s["drafted"]]
    accepted = g.stats.accepted_at
    return dict(
        reached_by_position=reached_counts(steps, len(accepted)),
        accepted_by_position=list(accepted),
        seconds=g.stats.seconds,
        new_tokens=len(g.tokens),
        target_calls=g.stats.target_calls,
        tokens_per_call=g.stats.tokens_per_call,
        drafted=drafted,
        accepted=sum(s["accepted"] for s in steps),
        acceptance=g.stats.acceptance_rate,
        reached=sum(min(s["accepted"] + 1, s["drafted"]) for s in steps),
        token_acceptance=token_acceptance(steps),
        draft_s=sum(s["draft_s"] for s in steps),
        verify_s=sum(s["verify_s"] for s in steps),
        step_verify_s=statistics.median(s["verify_s"] for s in steps) if steps else np.nan,
        draft_token_s=statistics.median(per_token) if per_token else np.nan,
    )


@dataclass(frozen=True)
class Method:
    """One method of `paired_runs`, declared instead of written as a closure: `target` decodes
    `max_new_tokens` under `sampling`, drafted by `drafter`. A drafter that is a Drafter instance is shared
    by every prompt (what it learns carries over: Token Recycling's matrix, HVD's suffix tree); a callable
    that is not one (a class, a `functools.partial`) makes a fresh drafter for each prompt; None is AR.

        methods = {"AR": Method(target, 128), "prompt lookup": Method(target, 128, partial(PromptLookupDrafter, 3, 5))}
        runs = paired_runs(prompts, methods)
    """

    target: LM
    max_new_tokens: int
    drafter: object = None
    sampling: Sampling = Sampling(0.0)
    seed: int = 0  # prompt i decodes with seed + i (what a sampled run draws)
    acceptor: object = None

    def __call__(self, ids: list[int], index: int = 0) -> Generation:
        d = self.drafter
        if d is not None and (isinstance(d, type) or not hasattr(d, "draft")):  # a factory: fresh per prompt
            d = d()
        return generate(
            self.target,
            ids,
            self.max_new_tokens,
            drafter=d,
            acceptor=self.acceptor,
            sampling=self.sampling,
            seed=self.seed + index,
        )


@dataclass(frozen=True)
class Loop:
    """Another library's loop as a `paired_runs` method: `loop(prompt_ids, max_new_tokens) -> Generation`,
    e.g. `Loop(partial(peers.hf_generate, target), 128)` or `Loop(peers.LlamaCpp(path).generate, 128)`."""

    loop: Callable
    max_new_tokens: int

    def __call__(self, ids: list[int], index: int = 0) -> Generation:
        return self.loop(ids, self.max_new_tokens)


def paired_runs(
    prompts: list,
    methods: dict[str, Callable[[list[int], int], Generation]],
    reference: str = "AR",
    rounds: int = 1,
    warmup: bool = True,
    progress=None,
) -> pd.DataFrame:
    """Run every method on every prompt, the reference back to back with the others.

    methods: name -> run(prompt_ids, prompt_index) -> Generation (a `Method`, or any such callable, e.g. another
    library's loop); it must include `reference`. Per
    (prompt, round) the methods run in the order [reference, *others], reversed on every other
    (prompt + round), so each method precedes and follows the reference equally often (ABBA) and a
    slow drift of the machine cancels. `warmup` first runs each method once on prompts[0], untimed.
    `progress`: a tqdm-like class for a progress bar over prompts x rounds, or None.

    Returns one row per (prompt, round, method): seconds, new_tokens, tokens_per_s, target_calls,
    tokens_per_call, drafted, accepted, reached (draft positions verified), acceptance (rate),
    token_acceptance, draft_s / verify_s (summed
    over steps), step_verify_s (median verify pass incl. acceptance and commit), draft_token_s (median
    drafting seconds per drafted token), reached_by_position / accepted_by_position (lists: per draft
    position, how many steps verified it and accepted it; the latter is `Stats.accepted_at`),
    order (position in its block) and same_as_reference (the
    token lists are equal: the greedy identity check when the method is lossless and greedy).
    """
    if reference not in methods:
        raise ValueError(f"methods must include the reference {reference!r}, got {sorted(methods)}")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    if not prompts:
        raise ValueError("prompts is empty")
    names = [reference] + [m for m in methods if m != reference]
    if warmup:
        for m in names:
            methods[m](list(prompts[0]), 0)
    rows = []
    bar = progress(total=len(prompts) * rounds, desc="paired runs", leave=False) if progress else None
    for r in range(rounds):
        for pi, ids in enumerate(prompts):
            order = names if (pi + r) % 2 == 0 else names[::-1]
            out = {m: methods[m](list(ids), pi) for m in order}
            for m in names:
                rows.append(
                    dict(
                        prompt=pi,
                        round=r,
                        method=m,
                        order=order.index(m),
                        **_row(out[m]),
                        same_as_reference=out[m].tokens == out[reference].tokens,
                    )
                )
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    df = pd.DataFrame(rows)
    df["tokens_per_s"] = df.new_tokens / df.seconds
    return df


def ratios(runs: pd.DataFrame, method: str, reference: str) -> pd.DataFrame:
    """[prompt x round] method tokens/s over reference tokens/s, run by run."""
    speed = runs.pivot_table(index=["prompt", "round"], columns="method", values="tokens_per_s")
    return (speed[method] / speed[reference]).unstack("round")


def speedup(runs: pd.DataFrame, method: str, reference: str = "AR", seed: int = 0) -> dict:
    """The workbook's speedup of `method` over `reference` from `paired_runs` rows:
    speedup      median over prompts of the per-prompt speed ratio (median over rounds)
    lo, hi       95% percentile bootstrap CI, resampling prompts
    total_ratio  (sum of method tokens / sum of its seconds) / (the same for the reference)
    spread_lo/hi the estimate computed on each round alone: its minimum and maximum (run-to-run spread)
    """
    r = ratios(runs, method, reference)
    per_prompt = r.median(axis=1).to_numpy()
    est, lo, hi = stats.bootstrap_ci(per_prompt, seed=seed) if len(per_prompt) > 1 else (per_prompt[0], np.nan, np.nan)
    by_round = r.median(axis=0)
    m, a = runs[runs.method == method], runs[runs.method == reference]
    total = (m.new_tokens.sum() / m.seconds.sum()) / (a.new_tokens.sum() / a.seconds.sum())
    return dict(
        speedup=float(est),
        lo=float(lo),
        hi=float(hi),
        total_ratio=float(total),
        spread_lo=float(by_round.min()),
        spread_hi=float(by_round.max()),
        prompts=int(r.shape[0]),
        rounds=int(r.shape[1]),
    )


def held_out_choice(per_prompt: pd.DataFrame) -> pd.DataFrame:
    """The best method chosen without the winner's curse, by leaving one prompt out. `per_prompt` is
    [prompt x method] speed ratios, each over its own reference. For every prompt the method with the highest
    median ratio on the *other* prompts is chosen, and its ratio on the left-out prompt kept: rows prompt,
    chosen, ratio. Their median says what picking the best of these methods on such data delivers on a
    prompt the pick never saw; the best method's median on all prompts, picked on those same prompts, is
    biased upward (docs/statistics.md: the winner's curse). It takes most of that bias away, not all (a
    median of mostly one method's ratios still leans toward the prompts that made it win), and gives no
    interval of its own: the picks share prompts (tests/test_bench.py measures both)."""
    rows = []
    for p in per_prompt.index:
        chosen = per_prompt.drop(index=p).median().idxmax()
        rows.append(dict(prompt=p, chosen=chosen, ratio=float(per_prompt.at[p, chosen])))
    return pd.DataFrame(rows)


def loop_costs(runs: pd.DataFrame, method: str, reference: str = "AR") -> dict:
    """c and v measured inside the decoding runs themselves: per prompt, the method's median
    drafting seconds per drafted token and median verify step over the reference's median step
    (one token), then the median over prompts and rounds. v here is the in-loop verify cost of the
    method's usual draft size, acceptance and commit included."""
    idx = ["prompt", "round"]
    m, a = runs[runs.method == method].set_index(idx), runs[runs.method == reference].set_index(idx)
    return dict(
        c=float((m.draft_token_s / a.step_verify_s).median()),
        v=float((m.step_verify_s / a.step_verify_s).median()),
        target_1=float(a.step_verify_s.median()),
    )


def ceiling_runs(runs: pd.DataFrame, reference: str = "AR") -> pd.DataFrame:
    """`paired_runs` rows with each method's seconds replaced by what its acceptance alone allows: the
    reference's seconds outside its verify passes (prefill, sampling, bookkeeping) plus, per target pass
    the method made, the reference's mean verify step. That is the method with drafting free and a verify
    pass over k + 1 tokens as cheap as one over a single token; `speedup` on these rows is its ceiling.
    Loops that do not count their target passes (other libraries') are left out; the reference is kept."""
    idx = ["prompt", "round"]
    ref = runs[runs.method == reference].set_index(idx)
    # a run that ended at its first token made no verify pass: charge the pooled step there
    pooled = ref.verify_s.sum() / max(ref.target_calls.sum(), 1)
    step = (ref.verify_s / ref.target_calls).where(ref.target_calls > 0).fillna(pooled)
    outside = ref.seconds - ref.verify_s
    out = runs[(runs.method == reference) | runs.target_calls.notna()].copy()
    key = pd.MultiIndex.from_frame(out[idx])
    ceiling = outside.reindex(key).to_numpy() + out.target_calls.to_numpy() * step.reindex(key).to_numpy()
    others = (out.method != reference).to_numpy()
    out.loc[others, "seconds"] = ceiling[others]
    out["tokens_per_s"] = out.new_tokens / out.seconds
    return out


def speedup_table(runs: pd.DataFrame, reference: str = "AR", seed: int = 0) -> pd.DataFrame:
    """`speedup` and `loop_costs` for every method of `paired_runs` rows, plus the acceptance rate
    (accepted / drafted), the per-token acceptance (accepted / reached positions, pooled over runs),
    mean tokens per call and how many outputs equal the reference's."""
    rows = []
    for method in (m for m in runs.method.unique() if m != reference):
        g = runs[runs.method == method]
        acc, drafted, reached = g.accepted.sum(), g.drafted.sum(), g.reached.sum()
        rows.append(
            dict(
                method=method,
                **speedup(runs, method, reference, seed),
                **loop_costs(runs, method, reference),
                acceptance=acc / drafted if drafted else np.nan,
                token_acceptance=acc / reached if reached else np.nan,
                tokens_per_call=float(g.tokens_per_call.mean()),
                identical=int(g.same_as_reference.sum()),
                runs=len(g),
            )
        )
    return pd.DataFrame(rows)


def token_acceptance(steps: list[Step]) -> float:
    """Per-token acceptance a = accepted / reached draft positions (a position is reached when every
    draft token before it was accepted): the maximum-likelihood a of the i.i.d. model that
    `expected_tokens` assumes. The acceptance RATE accepted / drafted is smaller and falls with K,
    because it counts the positions after the first rejection as failures."""
    accepted = sum(s["accepted"] for s in steps)
    reached = sum(min(s["accepted"] + 1, s["drafted"]) for s in steps)
    return accepted / reached if reached else float("nan")


def reached_counts(steps: list[Step], k: int) -> list[int]:
    """Per draft position i = 1..k: how many steps verified it (drafted it, every token before it
    accepted); how many accepted it is `Stats.accepted_at`."""
    return [sum(s["drafted"] > i and s["accepted"] >= i for s in steps) for i in range(k)]


def position_totals(runs: pd.DataFrame, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per draft position 1..k, how often it was reached and accepted, summed over `paired_runs` rows
    (their per-run lists are shorter when a run drafted fewer positions, e.g. one that ended at once)."""
    reached, accepted = np.zeros(k, int), np.zeros(k, int)
    for r, a in zip(runs.reached_by_position, runs.accepted_by_position):
        reached[: len(r)] += np.asarray(r[:k], int)
        accepted[: len(a)] += np.asarray(a[:k], int)
    return reached, accepted


def chain_methods(
    target: LM, draft: LM, ks, max_new_tokens: int, sampling: Sampling, seed: int = 0, assisted: bool = False
) -> dict:
    """AR and speclib chain SD at each K (and transformers assisted generation at each K, greedy
    only) as `paired_runs` methods; run i uses seed + i, the same for every method."""
    methods = {"AR": Method(target, max_new_tokens, None, sampling, seed)}
    for k in ks:
        methods[f"SD K={k}"] = Method(target, max_new_tokens, partial(ModelDrafter, draft, k), sampling, seed)
        if assisted:
            methods[f"assisted K={k}"] = Loop(partial(peers.hf_assisted, target, draft, k=k), max_new_tokens)
    return methods


def main(argv=None):
    from tqdm.auto import tqdm

    from speclib.core.device import cpu_count, set_threads, threads
    from speclib.drafters.overlap import OverlapDrafter
    from speclib.lms.loading import load
    from speclib.research import data

    ap = argparse.ArgumentParser(
        prog="python -m speclib bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--target", default="code-target")
    ap.add_argument("--draft", default="code-draft")
    ap.add_argument("--prompts", type=int, default=12, help="reported prompts (held-out stdlib continuations)")
    ap.add_argument("--pilot", type=int, default=4, help="pilot prompts (disjoint) that choose K")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved repeats of the reported runs")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--k-max", type=int, default=6)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the CPUs available)")
    ap.add_argument("--target-backend", default="torch")
    ap.add_argument("--draft-backend", default="torch")
    a = ap.parse_args(argv)
    print(f"torch threads: {set_threads(a.threads)}")
    target, draft = load(a.target, backend=a.target_backend), load(a.draft, backend=a.draft_backend)
    with_hf = a.target_backend == a.draft_backend == "torch"  # assisted generation needs the torch models
    rows = data.load_workload("code_stdlib", a.pilot + a.prompts)
    prompts = [target.encode(r["prompt"]) for r in rows]
    pilot, report = prompts[: a.pilot], prompts[a.pilot :]
    ks = range(1, a.k_max + 1)
    greedy = Sampling(0.0)
    prof = cost_profile(target, draft, ks)
    print(
        f"bare passes: T_target(1) = {prof['target_1'] * 1e3:.2f} ms, T_draft(1) = {prof['draft_1'] * 1e3:.2f} ms, "
        f"c = {prof['c']:.3f}, v(K) = " + ", ".join(f"{prof['v'][k]:.2f}" for k in ks)
    )
    methods = chain_methods(target, draft, ks, a.max_new_tokens, greedy, assisted=with_hf)
    table = speedup_table(paired_runs(pilot, methods, progress=tqdm))
    best = table[table.method.str.startswith("SD")].sort_values("speedup").method.iloc[-1]
    print(f"pilot ({len(pilot)} prompts): best {best}, {table.set_index('method').speedup[best]:.2f}x")
    # the overlapped row: the draft at the pilot's K in a process of its own, the target at one thread
    k_best, overlap = int(best.split("=")[1]), None
    if cpu_count() >= 2 and a.draft_backend == "torch":
        overlap = OverlapDrafter(draft, k=k_best, wait_for=k_best)

        def overlapped(ids, i):
            with threads(1):
                return generate(target, ids, a.max_new_tokens, drafter=overlap, sampling=greedy)

        methods[f"overlap K={k_best}"] = overlapped
    try:
        table = speedup_table(paired_runs(report, methods, rounds=a.rounds, progress=tqdm))
    finally:
        if overlap is not None:
            overlap.close()
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(
            table[
                [
                    "method",
                    "speedup",
                    "lo",
                    "hi",
                    "total_ratio",
                    "spread_lo",
                    "spread_hi",
                    "c",
                    "v",
                    "token_acceptance",
                    "tokens_per_call",
                    "identical",
                    "runs",
                ]
            ]
            .round(3)
            .to_string(index=False)
        )
    row = table.set_index("method").loc[best]
    k = int(best.split("=")[1])
    pred = predicted_speedup(row.token_acceptance, k, row.c, row.v)
    print(
        f"reported ({len(report)} prompts x {a.rounds} rounds), K chosen on the pilot: {best} {row.speedup:.2f}x "
        f"(95% CI {row.lo:.2f}-{row.hi:.2f}; total time {row.total_ratio:.2f}x; rounds {row.spread_lo:.2f}-"
        f"{row.spread_hi:.2f}); analytic with in-loop c, v: {pred:.2f}x"
    )


if __name__ == "__main__":
    main()
