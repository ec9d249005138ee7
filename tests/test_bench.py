"""The one speedup estimator and the paired runner (speclib.research.bench), and the device helpers.
No timing is asserted: the estimator is checked on hand-made rows with known answers."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import noisy_copy, tiny_lm

from speclib import ModelDrafter, Sampling, generate
from speclib.core import device
from speclib.research import bench, peers, stats


def _rows(ar_s, sd_s, tokens=64, rounds=1):
    rows = []
    for r in range(rounds):
        for p, (a, s) in enumerate(zip(ar_s, sd_s)):
            rows += [
                dict(
                    prompt=p,
                    round=r,
                    method="AR",
                    seconds=a,
                    new_tokens=tokens,
                    step_verify_s=0.010,
                    draft_token_s=np.nan,
                ),
                dict(
                    prompt=p,
                    round=r,
                    method="SD",
                    seconds=s,
                    new_tokens=tokens,
                    step_verify_s=0.015,
                    draft_token_s=0.002,
                ),
            ]
    df = pd.DataFrame(rows)
    df["tokens_per_s"] = df.new_tokens / df.seconds
    return df


def test_speedup_is_the_median_of_per_prompt_speed_ratios_with_total_time_beside_it():
    ar = np.array([1.0, 2.0, 3.0, 4.0, 10.0])
    sd = np.array([0.5, 1.0, 2.0, 1.0, 9.0])
    s = bench.speedup(_rows(ar, sd), "SD")
    assert s["speedup"] == pytest.approx(np.median(ar / sd))  # 2.0, not the ratio of medians
    assert s["total_ratio"] == pytest.approx(ar.sum() / sd.sum())
    assert s["lo"] <= s["speedup"] <= s["hi"]
    assert s["prompts"] == 5 and s["rounds"] == 1


def test_speedup_takes_the_median_over_rounds_and_reports_the_round_spread():
    ar = [1.0, 1.0, 1.0]
    runs = pd.concat(
        [
            _rows(ar, [0.5] * 3).assign(round=0),
            _rows(ar, [0.25] * 3).assign(round=1),
            _rows(ar, [1.0] * 3).assign(round=2),
        ]
    )
    s = bench.speedup(runs, "SD")
    assert s["speedup"] == pytest.approx(2.0)  # median of 2, 4, 1 per prompt
    assert (s["spread_lo"], s["spread_hi"]) == pytest.approx((1.0, 4.0))
    assert s["rounds"] == 3


def test_speed_ratio_uses_tokens_per_second_when_lengths_differ():
    runs = _rows([1.0, 1.0], [1.0, 1.0])
    runs.loc[runs.method == "SD", "new_tokens"] = 32  # same time, half the tokens: half the speed
    runs["tokens_per_s"] = runs.new_tokens / runs.seconds
    assert bench.speedup(runs, "SD")["speedup"] == pytest.approx(0.5)


def test_loop_costs_are_ratios_to_the_reference_step():
    c = bench.loop_costs(_rows([1.0, 2.0], [0.5, 1.0]), "SD")
    assert c["c"] == pytest.approx(0.2) and c["v"] == pytest.approx(1.5) and c["target_1"] == pytest.approx(0.01)


def test_ceiling_runs_charge_one_reference_step_per_target_pass_and_nothing_for_drafting():
    runs = _rows([1.0, 2.0], [0.9, 1.5], tokens=10)
    runs["target_calls"] = np.where(runs.method == "AR", 9.0, 4.0)  # AR: 10 tokens, the first from the prefill
    runs["verify_s"] = np.where(runs.method == "AR", [0.9, 0.9, 1.8, 1.8], [0.8, 0.8, 1.2, 1.2])
    peer = runs[runs.method == "SD"].assign(method="peer", target_calls=np.nan)
    ceiling = bench.ceiling_runs(pd.concat([runs, peer], ignore_index=True))
    assert set(ceiling.method) == {"AR", "SD"}  # a loop that does not count its passes has no ceiling
    ar, sd = (ceiling[ceiling.method == m].set_index("prompt") for m in ("AR", "SD"))
    assert ar.seconds.tolist() == [1.0, 2.0]  # the reference is untouched
    # outside the verify passes (0.1, 0.2) + 4 passes at AR's mean step (0.1, 0.2)
    assert sd.seconds.tolist() == pytest.approx([0.5, 1.0])
    assert sd.tokens_per_s.tolist() == pytest.approx([20.0, 10.0])
    assert bench.speedup(ceiling, "SD")["speedup"] == pytest.approx(2.0)
    same = runs.assign(target_calls=9.0, verify_s=np.where(runs.method == "AR", runs.verify_s, 0.0))
    assert bench.speedup(bench.ceiling_runs(same), "SD")["speedup"] == pytest.approx(1.0)  # as many passes as AR
    first_token_only = runs.assign(target_calls=np.where(runs.prompt == 0, 0.0, runs.target_calls))
    first_token_only.loc[first_token_only.prompt == 0, "verify_s"] = 0.0
    short = bench.ceiling_runs(first_token_only).set_index(["method", "prompt"]).seconds
    assert short["SD", 0] == pytest.approx(1.0) and short["SD", 1] == pytest.approx(1.0)  # no NaN from 0 / 0


def test_paired_runs_alternate_the_order_and_check_identity(pair):
    target, draft = pair
    calls = []

    def run(name, k):
        def f(ids, i):
            calls.append(name)
            if k == 0:
                return generate(target, ids, 6, sampling=Sampling(0.0), eos_token_id=None)
            return generate(target, ids, 6, drafter=ModelDrafter(draft, k), sampling=Sampling(0.0), eos_token_id=None)

        return f

    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    runs = bench.paired_runs(prompts, {"AR": run("AR", 0), "SD2": run("SD2", 2), "SD3": run("SD3", 3)}, rounds=2)
    assert calls[:3] == ["AR", "SD2", "SD3"]  # warm-up
    blocks = [calls[3 + 3 * i : 6 + 3 * i] for i in range(6)]
    assert blocks[0] == ["AR", "SD2", "SD3"] and blocks[1] == ["SD3", "SD2", "AR"]  # ABBA
    assert blocks[3] == ["SD3", "SD2", "AR"]  # round 1 starts where round 0 did not
    assert len(runs) == 3 * 2 * 3 and runs.same_as_reference.all()  # greedy SD = AR, every run
    table = bench.speedup_table(runs)
    assert set(table.method) == {"SD2", "SD3"} and (table.identical == table.runs).all()
    assert ((table.tokens_per_call >= 1) & (table.tokens_per_call <= 4)).all()


@pytest.mark.parametrize("k", [1, 3])
def test_transformers_assisted_generation_gives_greedy_ar_output(k):
    """The peer speclib's draft model is compared with: transformers' assisted generation, drafting a
    constant k, must reproduce greedy AR exactly (tiny random models: no near-ties in 24 tokens)."""
    target, draft = tiny_lm(seed=0), noisy_copy(seed=0)
    ar = generate(target, [3, 1, 4], 24, sampling=Sampling(0.0), eos_token_id=None).tokens
    g = peers.hf_assisted(target, draft, [3, 1, 4], 24, k)
    assert g.tokens == ar == peers.hf_generate(target, [3, 1, 4], 24).tokens
    assert draft.model.generation_config.num_assistant_tokens == k
    assert g.stats.new_tokens == 24 and g.stats.seconds > 0


def test_paired_runs_refuse_bad_input(pair):
    with pytest.raises(ValueError, match="reference"):
        bench.paired_runs([[1, 2]], {"SD": lambda ids, i: None})
    with pytest.raises(ValueError, match="rounds"):
        bench.paired_runs([[1, 2]], {"AR": lambda ids, i: None}, rounds=0)


def test_cpu_count_follows_the_affinity_mask_and_the_cgroup_quota(monkeypatch):
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from speclib.core.device import cpu_count; print(cpu_count())"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "1"
    )
    monkeypatch.setattr(device, "_cgroup_quota", lambda: 0.5)
    assert device.cpu_count() == 1
    monkeypatch.setattr(device, "_cgroup_quota", lambda: None)
    assert device.cpu_count() == len(__import__("os").sched_getaffinity(0))


def test_set_threads_refuses_bad_counts():
    with pytest.raises(ValueError, match="threads"):
        device.set_threads(0)


def test_max_threads_caps_every_count(monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.setenv("SPECLIB_MAX_THREADS", "1")
    with device.threads(2) as n:
        assert n == 1 and torch.get_num_threads() == 1
    monkeypatch.delenv("SPECLIB_MAX_THREADS")
    monkeypatch.setenv("SPECLIB_THREADS", "1")
    with device.threads(2) as n:  # $SPECLIB_THREADS is only the default
        assert n == 2 and torch.get_num_threads() == 2
    assert torch.get_num_threads() == before


def test_threads_context_sets_then_restores_the_count():
    import torch

    before = torch.get_num_threads()
    with device.threads(1) as n:
        assert n == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), device.threads(1):
        raise RuntimeError("the count is restored on errors too")
    assert torch.get_num_threads() == before


def test_analytic_model_closed_forms():
    """E = 1 + a + ... + a^k (a geometric sum, summed here term by term) and speedup E / (k c + v)."""
    from speclib.core.analytic import expected_tokens, predicted_speedup

    for a, k in [(0.0, 3), (0.5, 1), (0.73, 5), (1.0, 4)]:
        assert expected_tokens(a, k) == pytest.approx(sum(a**i for i in range(k + 1)))
    assert predicted_speedup(0.5, 2, 0.1, 1.3) == pytest.approx(1.75 / 1.5)


def test_acceptance_needed_inverts_the_predicted_speedup():
    """acceptance_needed is the inverse of predicted_speedup in alpha on random (k, c, v, alpha); nan
    past the chain's ceiling (k + 1) / (k c + v), 0 when one token per call already suffices."""
    import math

    from speclib.core.analytic import acceptance_needed, predicted_speedup

    rng = np.random.default_rng(0)
    for _ in range(50):
        k, c, v, a = int(rng.integers(1, 9)), rng.uniform(0, 0.5), rng.uniform(1, 2.5), rng.uniform(0.01, 0.99)
        assert acceptance_needed(predicted_speedup(a, k, c, v), k, c, v) == pytest.approx(a, abs=1e-9)
    assert math.isnan(acceptance_needed(1.01 * 3 / (2 * 0.1 + 1.2), 2, 0.1, 1.2))
    assert acceptance_needed(0.5, 3, 0.1, 1.0) == 0.0


def test_overlap_model_closed_form_and_simulation_agree():
    """The event simulation of overlapped drafting against its closed form (wait_for = k, ahead <= 2k) on
    random (alpha, k, c, v), within Monte-Carlo error; and its limits: alpha = 0 is sequential SD (every
    hypothesis dies), a free draft never keeps the target waiting, and no draft token is ever verified
    before it exists."""
    from speclib.core.analytic import expected_tokens, overlap_step_time, simulate_overlap

    rng = np.random.default_rng(1)
    for _ in range(6):
        k, c, a = int(rng.integers(1, 7)), rng.uniform(0.03, 0.4), rng.uniform(0.3, 0.95)
        v = [1.0] + list(1 + np.cumsum(rng.uniform(0, 0.2, 8)))
        ahead = int(rng.integers(k, 2 * k + 1))
        sim = simulate_overlap(a, k, c, v, wait_for=k, ahead=ahead, steps=40000, seed=2)
        closed = expected_tokens(a, k) / overlap_step_time(a, k, c, v[k], ahead)
        assert sim["speedup"] == pytest.approx(closed, rel=0.02)
    v = [1.0, 1.3, 1.5, 1.6, 1.7]
    assert overlap_step_time(0.0, 3, 0.2, 1.6) == pytest.approx(3 * 0.2 + 1.6)
    assert simulate_overlap(0.0, 3, 0.2, v, wait_for=3)["speedup"] == pytest.approx(1 / (0.6 + 1.6))
    free = simulate_overlap(0.8, 4, 0.0, v, wait_for=4)
    assert free["idle"] == 0 and free["speedup"] == pytest.approx(expected_tokens(0.8, 4) / 1.7, rel=0.02)
    assert simulate_overlap(0.9, 4, 0.5, v, wait_for=0)["drafts_per_step"] < 4  # verifies what is ready, no more
    with pytest.raises(ValueError, match="ahead <= 2k"):
        overlap_step_time(0.5, 2, 0.1, 1.3, ahead=5)


def test_method_records_run_ar_fresh_and_shared_drafters():
    """A Method decodes like generate(); a drafter instance is shared across prompts (its matrix carries
    over), a class or partial makes a fresh one per prompt (each first step drafts nothing)."""
    from functools import partial

    from speclib import PromptLookupDrafter, TokenRecycling

    target = tiny_lm(32, 2, vocab=16, seed=0)
    prompts = [[1, 2, 3, 1, 2, 3], [3, 1, 4, 1, 5, 9]]
    ar = [generate(target, p, 20, sampling=Sampling(0.0)).tokens for p in prompts]
    shared = TokenRecycling(2, 4)
    methods = {
        "AR": bench.Method(target, 20),
        "lookup": bench.Method(target, 20, partial(PromptLookupDrafter, 2, 3)),
        "fresh": bench.Method(target, 20, partial(TokenRecycling, 2, 4)),
        "shared": bench.Method(target, 20, shared),
    }
    for name, m in methods.items():
        assert [m(p, i).tokens for i, p in enumerate(prompts)] == ar, name
    firsts = {n: methods[n](prompts[1]).stats.steps[0]["drafted"] for n in ("fresh", "shared")}
    assert firsts["fresh"] == 0 and firsts["shared"] > 0 and shared.rank_counts.sum() > 0
    runs = bench.paired_runs(prompts, methods, warmup=False)
    assert runs.same_as_reference.all() and set(runs.method) == set(methods)


def test_held_out_choice_picks_on_the_other_prompts_and_shrinks_a_lucky_winner():
    r = pd.DataFrame({"a": [1.0, 1.1, 1.2, 3.0], "b": [1.3, 1.3, 1.3, 1.3]}, index=[10, 11, 12, 13])
    held = bench.held_out_choice(r).set_index("prompt")
    # without prompt 13 b looks best and is measured on 13; with it a's median (1.15) still loses to b
    assert list(held.chosen) == ["b", "b", "b", "b"] and held.ratio[13] == 1.3
    # five equally fast methods (true median ratio 1) on six prompts, 600 times: the best one's median on the
    # prompts it was picked on reads high (measured 1.12), the held-out pick much less (1.02), and the pick's
    # order-statistic interval holds 1 less often than the 96.9% it has for a method fixed in advance (0.95)
    rng = np.random.default_rng(0)
    in_sample, held_out, covered = [], [], []
    for _ in range(600):
        noisy = pd.DataFrame(rng.lognormal(0, 0.2, (6, 5)))
        best = noisy.median().idxmax()
        _, lo, hi = stats.median_ci(noisy[best])
        in_sample.append(noisy[best].median())
        held_out.append(bench.held_out_choice(noisy).ratio.median())
        covered.append(lo <= 1 <= hi)
    assert np.mean(in_sample) > 1.09 and np.mean(held_out) < 1.05
    assert 0.9 < np.mean(covered) < stats.median_ci_coverage(6) - 0.01
