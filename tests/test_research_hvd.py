"""speclib.research.hvd, the plumbing of HVD over every source that notebooks 02 and 07 share: the warm
start of Token Recycling, the Lookahead choice, the fitting logs and the per-step record, each checked
against what it stands for (greedy identity, a copied matrix, the cost model's argmax, the drafter's log)."""

import numpy as np
import pandas as pd
import pytest
from conftest import tiny_lm

from speclib import HybridDrafter, Lookahead, PromptLookupDrafter, Sampling, SuffixDrafter, TokenRecycling, generate
from speclib.drafters.hybrid import Costs
from speclib.research import hvd

GREEDY = Sampling(0.0)
PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 5, 5, 5], [3, 1, 4, 1, 5, 9, 2, 6]]


@pytest.fixture(scope="module")
def target():
    return tiny_lm(32, 2, vocab=16, seed=0)


def test_warm_start_copies_the_pilot_matrix_and_stays_lossless(target):
    warm = hvd.warm_recycling(target, PROMPTS[:2], 20, top_k=3, nodes=6)
    assert warm.rank_counts.sum() > 0 and (warm.matrix >= 0).any()
    hot, cold = warm.with_template(4), warm.with_template(4, shared=False)
    assert hot.max_nodes == 4 and hot.rank_accept == pytest.approx(warm.fitted_rank_accept())
    assert np.array_equal(hot.matrix, warm.matrix) and hot.matrix is not warm.matrix
    before = warm.matrix.copy()
    for prompt in PROMPTS:
        ar = generate(target, prompt, 30, sampling=GREEDY).tokens
        assert generate(target, prompt, 30, drafter=hot, sampling=GREEDY).tokens == ar
        assert generate(target, prompt, 30, drafter=cold, sampling=GREEDY).tokens == ar
    assert np.array_equal(warm.matrix, before)  # the drafters learned on copies
    # the warm start drafts from its first step; a fresh drafter has nothing to draft on a new prompt
    first = generate(target, PROMPTS[2], 10, drafter=warm.with_template(4), sampling=GREEDY).stats.steps[0]
    fresh = TokenRecycling(3, 4)
    assert first["drafted"] > 0
    assert generate(target, PROMPTS[2], 10, drafter=fresh, sampling=GREEDY).stats.steps[0]["drafted"] == 0
    with pytest.raises(RuntimeError, match="check_compatible"):
        TokenRecycling(3, 4).with_template(2)


def test_choose_lookahead_keeps_the_cost_models_argmax(target):
    grid = [(2, 2, 1), (3, 3, 2), (4, 3, 3)]
    table = hvd.choose_lookahead(target, PROMPTS, grid, lambda n: 1.0 + 0.1 * n, 20)
    assert len(table) == 3 and table.chosen.sum() == 1
    assert np.allclose(table.predicted_speedup, table.tokens_per_call * 1.1 / (1.0 + 0.1 * (table.mean_nodes + 1)))
    assert hvd.chosen_lookahead(table) == grid[int(table.predicted_speedup.idxmax())]


def test_every_source_logs_fit_a_predictor_and_the_record_matches_the_log(target):
    def caches(first="prompt lookup"):
        made = {"prompt lookup": PromptLookupDrafter(2, 5), "suffix": SuffixDrafter(max_spec=5)}
        return hvd.in_front(made, first)

    assert [type(d) for d in caches("suffix")] == [SuffixDrafter, PromptLookupDrafter]
    logs = hvd.every_source_logs(target, caches, None, PROMPTS, 30, ["prompt lookup", "suffix"])
    assert set(logs["first"]) == {"prompt lookup", "suffix"} and (logs.drafted > 0).all()
    predictor = hvd.fit_payoff(logs)
    costs = Costs({n: 1e-3 * (1 + 0.05 * n) for n in range(1, 20)}, model_token_s=0.0)
    d = HybridDrafter(caches(), None, "hvd", predictor, costs)
    ar = generate(target, PROMPTS[0], 30, sampling=GREEDY).tokens
    assert generate(target, PROMPTS[0], 30, drafter=d, sampling=GREEDY).tokens == ar
    rows = hvd.verified_steps(d, predictor, "plain step")
    assert len(rows) == len(d.log)
    assert [r["accepted"] for r in rows] == [s["accepted"] for s in d.log]
    for r, s in zip(rows, d.log):
        assert (r["source"] == "plain step") == (s["source"] != "cache")
        assert np.isnan(r["predicted"]) == (s["source"] != "cache")
    gens = [generate(target, p, 10, sampling=GREEDY) for p in PROMPTS]  # AR: one token per pass, prefill too
    assert hvd.tokens_per_call(gens) == pytest.approx(30 / sum(g.stats.target_calls + 1 for g in gens))


@pytest.mark.slow  # about a minute and a half on a shared CPU: two predictor fits
def test_every_source_runs_per_group_and_as_one_block(target):
    def made(group, pilot):
        return {
            "prompt lookup": PromptLookupDrafter(2, 5),
            "suffix": SuffixDrafter(max_spec=5),
            "token recycling": pilot.recycling.with_template(3),
        }

    def compared(group, pilot):
        return {"prompt lookup": PromptLookupDrafter(2, 5), "lookahead": Lookahead(*pilot.window)}

    costs = Costs({n: 1e-3 * (1 + 0.05 * n) for n in range(1, 20)}, model_token_s=0.0)
    common = dict(t_of=lambda n: 1.0 + 0.1 * n, lookahead_grid=[(2, 2, 1), (2, 3, 1)], max_new_tokens=8)
    sources = ["prompt lookup", "suffix", "token recycling"]
    groups = {"a": (PROMPTS[:2], PROMPTS[2:]), "b": (PROMPTS[1:], PROMPTS[:1])}
    es = hvd.every_source_runs(
        target, groups, made, compared, sources, costs, recycling_nodes={"a": 3, "b": 4}, **common
    )
    assert list(es["runs"].method.unique()) == ["AR", "prompt lookup", "lookahead", "HVD (every source)"]
    assert es["runs"].same_as_reference.all()
    assert set(es["lookahead"].workload) == set(es["logs"].workload) == {"a", "b"}
    assert (es["lookahead"].groupby("workload").chosen.sum() == 1).all()
    assert set(es["choice"].workload) <= {"a", "b"} and set(es["logs"]["first"]) <= set(sources)
    # notebook 07's shape: one block, no group column, a plain step as the alternative, a warm-up, wrapped runs
    seen = []

    def wrap(name, run):
        def wrapped(ids, i):
            seen.append((name, i))
            return run(ids, i)

        return wrapped

    one = hvd.every_source_runs(
        target,
        {"turns": groups["a"]},
        made,
        compared,
        sources,
        costs,
        recycling_nodes=3,
        alternative="plain step",
        group_column=None,
        warmup=True,
        wrap=wrap,
        per_turn=True,
        **common,
    )
    assert list(one["runs"].method.unique())[-1] == hvd.PER_TURN and one["runs"].same_as_reference.all()
    assert "workload" not in one["runs"] and "workload" not in one["logs"] and "workload" not in one["lookahead"]
    assert len(one["choice"]) == 0 or (one["choice"].prompt >= 0).all()  # the warm-up is not recorded
    assert all(i >= 0 for _, i in seen) and len(seen) == 5 * len(groups["a"][1])
    assert "model" not in set(one["choice"].get("source", pd.Series(dtype=str)))  # the alternative is named
