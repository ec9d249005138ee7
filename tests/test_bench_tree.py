"""Measurement helpers of notebook 03 (speclib.research.bench_tree) and the per-token acceptance estimate."""

import random

import pytest
import torch
from transformers import Qwen3_5ForCausalLM

from speclib.core.tree import check_parents
from speclib.lms.hybrid import HybridLM, tiny_config
from speclib.research import bench, bench_tree


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    return HybridLM(Qwen3_5ForCausalLM(tiny_config()).eval(), None, "cpu")


@pytest.mark.parametrize("n,depth", [(1, 6), (5, 6), (8, 2), (64, 6), (128, 8)])
def test_random_tree_shape(n, depth):
    parents = bench_tree.random_tree(n, depth, torch.Generator().manual_seed(n))
    assert len(parents) == n
    check_parents(parents)
    paths = bench_tree.leaf_paths(parents)
    assert max(len(p) for p in paths) == min(depth, n)
    assert set(j for p in paths for j in p) == set(range(n))  # every node lies on a branch


def test_verify_once_leaves_no_trace(lm, monkeypatch):
    """The clock is read twice on the views' device, around the verify forward only (a fake clock
    records the pending nodes at each read), and the returned seconds are the difference."""
    parents = bench_tree.random_tree(12, 4, torch.Generator().manual_seed(1))
    tokens = [random.Random(2).randrange(64) for _ in parents]
    reads = []

    def fake_clock(device):
        reads.append((torch.device(device), sum(len(v.pending_parents) for v in views)))
        return 10.0 * len(reads) ** 2

    monkeypatch.setattr(bench_tree, "clock", fake_clock)
    for strategy in ("closed_form", "materialize", "replay"):
        views = [lm.view(strategy=strategy) for _ in range(2)]
        fresh = lm.view()
        for v in views:
            v.reset([1, 2, 3])
        reads.clear()
        assert bench_tree.verify_once(views, tokens, parents) == 30.0  # 10 * 2**2 - 10 * 1**2
        # replay scores (and drops) one branch at a time; the tree strategies still hold every node at the second read
        held = 0 if strategy == "replay" else len(views) * len(parents)
        assert reads == [(torch.device("cpu"), 0), (torch.device("cpu"), held)]
        fresh.reset([1, 2, 3])
        for v in views:
            assert not v.pending_parents
            assert (v.extend([5], [-1]) - fresh.extend([5], [-1])).abs().max() < 1e-4
            v.commit([])
            fresh.commit([])


def test_state_bytes_per_strategy(lm):
    parents = bench_tree.random_tree(10, 4, torch.Generator().manual_seed(3))
    tokens = [7] * len(parents)
    held = {}
    for s in ("closed_form", "materialize"):
        v = lm.view(strategy=s)
        v.reset([1, 2])
        assert bench_tree.state_bytes(v) == 0
        v.extend(tokens, parents)
        held[s] = bench_tree.state_bytes(v)
    # tiny config: 3 GDN layers, 4 value heads, K = V = 8, conv dim 2*2*8 + 4*8 = 64
    per_node_conv = 64 * 4
    assert held["materialize"] == 3 * 10 * (4 * 8 * 8 * 4 + per_node_conv)
    assert held["closed_form"] == 3 * 10 * (4 * (8 + 8 + 1) * 4 + per_node_conv)


def test_layer_state_bytes_formula():
    r = bench_tree.layer_state_bytes(16, heads=4, dk=32, dv=16, time_it=False)
    assert r["materialize_bytes"] == 16 * 4 * 32 * 16 * 4
    assert r["closed_form_fp32_bytes"] == 16 * 4 * (32 + 16 + 1) * 4
    assert r["closed_form_bf16_bytes"] * 2 == r["closed_form_fp32_bytes"]


def test_choose_budget():
    # verification nearly free up to 16 nodes, then linear; acceptance saturates; drafting grows
    verify = {1: 1.0, 4: 1.02, 16: 1.2, 64: 3.0}
    tokens = {1: 1.6, 4: 2.4, 16: 3.2, 64: 3.4}
    draft = {1: 0.05, 4: 0.1, 16: 0.2, 64: 0.4}
    n, rate = bench_tree.choose_budget(verify, 1, tokens, draft)
    assert n == 16 and rate[16] == pytest.approx(3.2 / 1.4)
    # a batch of 4 shares the pass (here 4x the cost of one request's) but drafts 4 trees
    n4, _ = bench_tree.choose_budget(
        {k: 4 * v for k, v in verify.items()}, 4, tokens, {k: 8 * v for k, v in draft.items()}
    )
    assert n4 == 4
    with pytest.raises(ValueError, match="no budget"):
        bench_tree.choose_budget({8: 1.0}, 1, tokens, draft)


def test_heldout_loss_matches_full_forward(lm):
    rng = random.Random(4)
    windows = [[rng.randrange(64) for _ in range(n)] for n in (33, 20)]
    ours = bench_tree.heldout_loss(lm, windows)
    with torch.no_grad():
        ref = []
        for w in windows:
            w = torch.tensor([w])
            logits = lm.model(input_ids=w[:, :-1], use_cache=False).logits[0]
            ref.append(torch.nn.functional.cross_entropy(logits, w[0, 1:], reduction="none"))
    assert abs(ours - float(torch.cat(ref).mean())) < 1e-4


def test_token_acceptance_matches_position_counts():
    rng = random.Random(0)
    k = 5
    steps = [{"drafted": k, "accepted": rng.randint(0, k)} for _ in range(200)]
    reached = bench.reached_counts(steps, k)
    accepted = [sum(s["accepted"] > i for s in steps) for i in range(k)]  # Stats.accepted_at
    assert bench.token_acceptance(steps) == pytest.approx(sum(accepted) / sum(reached))
    # i.i.d. acceptance a: the estimate recovers a, the acceptance rate does not
    a, gen = 0.7, random.Random(1)
    steps = []
    for _ in range(4000):
        n = 0
        while n < k and gen.random() < a:
            n += 1
        steps.append({"drafted": k, "accepted": n})
    assert abs(bench.token_acceptance(steps) - a) < 0.02
    rate = sum(s["accepted"] for s in steps) / (k * len(steps))
    assert rate < a - 0.2
