"""HVD over every source, the parts notebooks 02 and 07 share: choosing Lookahead's (W, N, G) and Token
Recycling's warm start on pilot prompts, fitting the payoff predictor with each cache source verified in
front once, and the log of what HVD verified at every step.

    la = choose_lookahead(target, pilot, LOOKAHEAD_GRID, t_of, 128)     # one row per (W, N, G), "chosen"
    warm = warm_recycling(target, pilot, 128, top_k=8, nodes=64)       # its matrix filled on the pilot
    logs = every_source_logs(target, make_caches, None, pilot, 128, SOURCES)
    predictor = fit_payoff(logs, seed=0)
    hvd = HybridDrafter(make_caches("prompt lookup"), None, "hvd", predictor, costs)
    ...; rows = verified_steps(hvd, predictor)                           # after each generate()
    run = RecordSteps(bench.Method(target, 128, hvd), hvd, predictor, rows)  # or: record as it runs
    es = every_source_runs(target, {"turns": (pilot, reported)}, made, compared, SOURCES, costs, t_of=t_of,
                           lookahead_grid=LOOKAHEAD_GRID, max_new_tokens=128, recycling_nodes=8)  # all of it

`make_caches(first)` returns the cache drafters with `first` in front (`in_front`): HVD's log records which
source each verified cache draft came from, and a source that is never in front is never fitted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pandas as pd

from speclib.core.generate import generate
from speclib.core.sampling import Sampling
from speclib.drafters.hybrid import FEATURES, Costs, HybridDrafter, PayoffPredictor, feature_matrix
from speclib.drafters.lookahead import Lookahead
from speclib.drafters.recycling import TokenRecycling
from speclib.research import bench

GREEDY = Sampling(temperature=0.0)


def tokens_per_call(gens) -> float:
    """New tokens per target pass over a set of runs, the prefill counted as a pass."""
    return sum(g.stats.new_tokens for g in gens) / sum(g.stats.target_calls + 1 for g in gens)


def choose_lookahead(
    target, prompts: Sequence[list[int]], grid, t_of: Callable[[float], float], max_new_tokens: int
) -> pd.DataFrame:
    """Lookahead at every (W, N, G) of `grid` on `prompts`: the measured tokens per call, the mean nodes
    verified per pass, and the cost model's speedup, tokens per call x T(1) / T(mean nodes + 1), with `t_of`
    the pass cost. The row with the highest predicted speedup is `chosen`."""
    rows = []
    for W, N, G in grid:
        gens = [generate(target, ids, max_new_tokens, drafter=Lookahead(W, N, G), sampling=GREEDY) for ids in prompts]
        nodes = float(np.mean([s["drafted"] for g in gens for s in g.stats.steps]))
        tpc = tokens_per_call(gens)
        rows.append(
            dict(
                window=W,
                ngram=N,
                guesses=G,
                tokens_per_call=tpc,
                mean_nodes=nodes,
                predicted_speedup=tpc * t_of(1) / t_of(nodes + 1),
            )
        )
    table = pd.DataFrame(rows)
    return table.assign(chosen=table.index == table.predicted_speedup.idxmax())


def chosen_lookahead(table: pd.DataFrame) -> tuple[int, int, int]:
    """The (W, N, G) `choose_lookahead` chose."""
    best = table[table.chosen].iloc[0]
    return int(best.window), int(best.ngram), int(best.guesses)


def warm_recycling(
    target, prompts: Sequence[list[int]], max_new_tokens: int, top_k: int = 8, nodes: int = 64
) -> TokenRecycling:
    """Token Recycling run over `prompts` (its default template): its matrix holds the target's candidates
    and its rank counts give `fitted_rank_accept()`. Drafters for the reported prompts start from it with
    `.with_template(n)`."""
    warm = TokenRecycling(top_k, nodes)
    for ids in prompts:
        generate(target, ids, max_new_tokens, drafter=warm, sampling=GREEDY)
    return warm


def in_front(made: dict, first: str) -> list:
    """The drafters of `made` (name -> drafter), the one named `first` first."""
    return [made[first]] + [d for name, d in made.items() if name != first]


def every_source_logs(
    target,
    make_caches: Callable[[str], list],
    model,
    prompts: Sequence[list[int]],
    max_new_tokens: int,
    sources: Sequence[str],
) -> pd.DataFrame:
    """The logs HVD's payoff predictor is fitted on: for each name in `sources`, a "cache"-policy
    HybridDrafter over `make_caches(name)` (that source in front) and `model` (None: a plain step) runs
    `prompts`; every verified cache draft is a row (its features, accepted tokens, `prompt` and `first`)."""
    logs = []
    for first in sources:
        h = HybridDrafter(make_caches(first), model, "cache")
        for i, ids in enumerate(prompts):
            generate(target, ids, max_new_tokens, drafter=h, sampling=GREEDY)
            logs += [dict(prompt=i, first=first, **s) for s in h.log if s["drafted"] > 0]
    return pd.DataFrame(logs)


def fit_payoff(logs: pd.DataFrame, seed: int = 0) -> PayoffPredictor:
    """A payoff predictor fitted on `every_source_logs` rows: features to accepted tokens."""
    return PayoffPredictor(seed=seed).fit(feature_matrix(logs), logs.accepted.to_numpy())


def verified_steps(hvd: HybridDrafter, predictor: PayoffPredictor, alternative: str = "model") -> list[dict]:
    """What `hvd` verified at each step of its last run: the source (a cache's name, or `alternative` for a
    model draft or plain step), nodes drafted, tokens accepted and, for a cache draft, the payoff predicted."""
    if not hvd.log:
        return []
    predicted = predictor.predict(np.stack([[s[f] for f in FEATURES] for s in hvd.log]))
    return [
        dict(
            source=s["cache_source"] if s["source"] == "cache" else alternative,
            drafted=s["drafted"],
            accepted=s["accepted"],
            predicted=p if s["source"] == "cache" else np.nan,
        )
        for s, p in zip(hvd.log, predicted)
    ]


@dataclass
class RecordSteps:
    """A `paired_runs` method that, after each run, appends what `hvd` verified at every step
    (`verified_steps`) to `rows`, tagged with `tags` and the prompt's index."""

    method: Callable
    hvd: HybridDrafter
    predictor: PayoffPredictor
    rows: list
    alternative: str = "model"
    tags: dict = field(default_factory=dict)

    def __call__(self, ids: list[int], index: int = 0):
        g = self.method(ids, index)
        steps = verified_steps(self.hvd, self.predictor, self.alternative)
        self.rows.extend({**self.tags, "prompt": index, **r} for r in steps)
        return g


@dataclass
class Pilot:
    """What one group's pilot prompts chose: `choose_lookahead`'s table and Token Recycling warmed on them."""

    lookahead: pd.DataFrame
    recycling: TokenRecycling

    @property
    def window(self) -> tuple[int, int, int]:
        """Lookahead's chosen (W, N, G)."""
        return chosen_lookahead(self.lookahead)


PER_TURN = "HVD (every source, per turn)"


def _fresh_hybrid(make_caches, model, predictor, costs, model_prior) -> HybridDrafter:
    """A new HVD over new caches (`every_source_runs`' per-turn variant, made for each prompt)."""
    return HybridDrafter(make_caches(), model and model(), "hvd", predictor, costs, model_prior=model_prior)


def every_source_runs(
    target,
    prompts: Mapping[str, tuple[Sequence[list[int]], Sequence[list[int]]]],
    made: Callable[[str, Pilot], dict],
    compared: Callable[[str, Pilot], dict],
    sources: Sequence[str],
    costs: Costs,
    *,
    t_of: Callable[[float], float],
    lookahead_grid,
    max_new_tokens: int,
    recycling_nodes: int | Mapping[str, int],  # or a Series indexed by group
    recycling_top_k: int = 8,
    model: Callable[[], object] | None = None,
    model_prior: float = 0.5,
    first: str = "prompt lookup",
    alternative: str = "model",
    seed: int = 0,
    group_column: str | None = "workload",
    warmup: bool = False,
    wrap: Callable[[str, Callable], Callable] | None = None,
    progress=None,
    per_turn: bool = False,
) -> dict[str, pd.DataFrame]:
    """HVD over every source, paired with AR and the methods it is compared with, per group of prompts.

    `prompts`: group -> (pilot prompts, reported prompts). On each group's pilot prompts, in group order:
    Lookahead's (W, N, G) from `lookahead_grid` by the cost model (`t_of`, the pass cost T(n)) and Token
    Recycling warmed with `recycling_nodes` (one size, or one per group). Then the payoff predictor is fitted
    (`seed`) on every group's `every_source_logs`, each of `sources` in front once, with a `model()` drafter
    (None: a plain step is the alternative). Then per group: HVD over `made(group, pilot)` (name -> a fresh
    cache drafter; `first` in front) with `costs`, `model()` and `model_prior`, and `compared(group, pilot)`
    (name -> a drafter or a factory, each a `bench.Method`) run by `bench.paired_runs` as AR, the compared
    methods in their order, then "HVD (every source)", which records what it verified at every step
    (`RecordSteps`, `alternative` naming a non-cache step). `warmup`: first run every method once, untimed, on
    the group's first pilot prompt (prompt index -1, not recorded). `wrap(name, run)` wraps each timed method.
    `per_turn`: also run PER_TURN, the same HVD built afresh for every prompt (its suffix tree new, Token
    Recycling from the pilot's matrix), which keeps no memory across the reported prompts, as a single source
    made per prompt keeps none: HVD's gain over a single source then measures its choice of source alone.

    Returns "runs" (paired_runs' rows), "lookahead" (choose_lookahead's rows), "logs" (the predictor's
    fitting rows) and "choice" (HVD's verified steps), each with a `group_column` holding the group unless
    it is None."""

    def tagged(group: str) -> dict:
        return {} if group_column is None else {group_column: group}

    pilots, tables = {}, []
    for group, (pilot, _) in prompts.items():
        table = choose_lookahead(target, pilot, lookahead_grid, t_of, max_new_tokens)
        nodes = recycling_nodes if isinstance(recycling_nodes, (int, np.integer)) else recycling_nodes[group]
        pilots[group] = Pilot(table, warm_recycling(target, pilot, max_new_tokens, recycling_top_k, int(nodes)))
        tables.append(table.assign(**tagged(group)))

    def caches(group: str, name: str) -> list:
        return in_front(made(group, pilots[group]), name)

    logs = pd.concat(
        [
            every_source_logs(target, partial(caches, group), model and model(), pilot, max_new_tokens, sources).assign(
                **tagged(group)
            )
            for group, (pilot, _) in prompts.items()
        ],
        ignore_index=True,
    )
    predictor = fit_payoff(logs, seed=seed)

    frames, chosen = [], []
    for group, (pilot, reported) in prompts.items():
        hvd = HybridDrafter(caches(group, first), model and model(), "hvd", predictor, costs, model_prior=model_prior)
        methods = {"AR": bench.Method(target, max_new_tokens)} | {
            name: bench.Method(target, max_new_tokens, d) for name, d in compared(group, pilots[group]).items()
        }
        rows = []
        methods["HVD (every source)"] = RecordSteps(
            bench.Method(target, max_new_tokens, hvd), hvd, predictor, rows, alternative, tags=tagged(group)
        )
        if per_turn:
            fresh = partial(_fresh_hybrid, partial(caches, group, first), model, predictor, costs, model_prior)
            methods[PER_TURN] = bench.Method(target, max_new_tokens, fresh)
        if warmup:  # untimed, on a pilot prompt: what a drafter learns must not come from a reported one
            for run in methods.values():
                run(pilot[0], -1)
            rows.clear()
        timed = methods if wrap is None else {name: wrap(name, run) for name, run in methods.items()}
        frames.append(bench.paired_runs(reported, timed, warmup=False, progress=progress).assign(**tagged(group)))
        chosen += rows
    return {
        "runs": pd.concat(frames, ignore_index=True),
        "lookahead": pd.concat(tables, ignore_index=True),
        "logs": logs,
        "choice": pd.DataFrame(chosen),
    }
