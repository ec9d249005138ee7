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

`make_caches(first)` returns the cache drafters with `first` in front (`in_front`): HVD's log records which
source each verified cache draft came from, and a source that is never in front is never fitted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from speclib.core.generate import generate
from speclib.core.sampling import Sampling
from speclib.drafters.hybrid import FEATURES, HybridDrafter, PayoffPredictor, feature_matrix
from speclib.drafters.lookahead import Lookahead
from speclib.drafters.recycling import TokenRecycling

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
