"""CoSpec (notebook 04): the arbiter, the batched arbitration process, branch labels, policy training,
and the arithmetic task's generator against an independent evaluator."""

import random

import pytest
import torch

import speclib
from speclib import Sampling, generate
from speclib.acceptors import cospec
from speclib.acceptors.cospec import FEATURES, Arbiter, Fuzzy, Policy, Typical
from speclib.drafters import ModelDrafter
from speclib.research import cospec_rollouts, cospec_training, data

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9], [2, 7]]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_arbiter_that_always_picks_the_target_is_lossless(pair, temperature):
    target, draft = pair
    for seed, prompt in enumerate(PROMPTS):
        kw = dict(max_new_tokens=24, sampling=Sampling(temperature), seed=seed)
        a = generate(target, prompt, drafter=ModelDrafter(draft, 3), **kw)
        b = generate(target, prompt, drafter=ModelDrafter(draft, 3), acceptor=Arbiter(), **kw)
        assert a.tokens == b.tokens
        assert [s["accepted"] for s in a.stats.steps] == [s["accepted"] for s in b.stats.steps]


def _keeps_sometimes(x):
    """Deterministic, and exercises the depth bookkeeping: keep the draft at every third position."""
    return (torch.round(x[:, FEATURES.index("depth")] * 100) % 3 == 0).float()


@pytest.mark.parametrize("k", [1, 3])
def test_batched_arbitration_equals_the_sd_loop(pair, k):
    """`arbitrate` (all prompts in lockstep, left-padded) gives each prompt exactly the tokens, decisions
    and verify-pass count of `generate` with Arbiter(policy) and a k-token ModelDrafter."""
    target, draft = pair
    policy = _keeps_sometimes
    rows = cospec_rollouts.arbitrate(target, draft, PROMPTS, k, policy, max_new_tokens=20)
    kept_total = 0
    for prompt, row in zip(PROMPTS, rows):
        arb = Arbiter(policy)
        g = generate(target, prompt, 20, drafter=ModelDrafter(draft, k), acceptor=arb, sampling=Sampling(0.0))
        assert g.tokens == row["tokens"]
        assert [kept for _, kept in arb.log] == row["kept"].tolist()
        torch.testing.assert_close(torch.stack([x for x, _ in arb.log]), row["feats"], atol=1e-4, rtol=1e-4)
        assert g.stats.target_calls == row["target_calls"]
        kept_total += int(row["kept"].sum())
    assert 0 < kept_total < sum(len(r["kept"]) for r in rows)  # the test exercised both decisions


def test_draft_none_is_target_greedy(pair):
    target, _ = pair
    rows = cospec_rollouts.arbitrate(target, None, PROMPTS, 1, max_new_tokens=12)
    for prompt, row in zip(PROMPTS, rows):
        assert row["tokens"] == generate(target, prompt, 12, sampling=Sampling(0.0)).tokens
        assert row["target_calls"] == 11


class _Scripted(torch.nn.Module):
    """A 'model' whose next token is table[last token]: hand-checkable rollouts."""

    def __init__(self, table, vocab=10):
        super().__init__()
        self.table, self.vocab = table, vocab
        self.config = type("C", (), {"vocab_size": vocab})()

    def forward(self, input_ids, **_):
        nxt = torch.tensor([[self.table[int(t)] for t in row] for row in input_ids])
        logits = torch.nn.functional.one_hot(nxt, self.vocab).float() * 5
        return type("O", (), {"logits": logits, "cache": None})()


class _ScriptedLM:
    eos_token_id = 9

    def __init__(self, table):
        self.model = _Scripted(table)


def test_branch_labels_on_a_hand_checkable_case():
    # target: 1 -> 2 -> 3 -> 9 (EOS); the draft says 1 -> 4 where the target says 2; from 4 the target
    # goes 4 -> 5 -> 9. Correct completions are those containing 5: the draft's branch is right there.
    target = _ScriptedLM({0: 1, 1: 2, 2: 3, 3: 9, 4: 5, 5: 9, 9: 9})
    draft = _ScriptedLM({0: 1, 1: 4, 2: 3, 3: 9, 4: 5, 5: 9, 9: 9})

    def check(i, toks):
        return 5 in toks

    labels = cospec_rollouts.branch_labels(target, draft, [[0]], check, max_new_tokens=8)
    assert len(labels) == 1
    (lab,) = labels
    assert lab["problem"] == 0 and lab["pos"] == 1
    assert lab["draft_correct"] and not lab["target_correct"]


def test_rules():
    p = torch.tensor([[0.6, 0.3, 0.1]])
    q = torch.tensor([[0.2, 0.7, 0.1]])
    x = cospec.features(p, q, torch.tensor([0]), torch.tensor([1]), 0, 5, 1.0)
    assert x.shape == (1, len(FEATURES))
    h = -(p * p.log()).sum()
    assert float(Typical(0.3, 0.5)(x)[0]) == float(0.3 > min(0.3, 0.5 * torch.exp(-h)))
    assert Typical(0.9, 0.9)(x)[0] == 0  # 0.3 is below min(0.9, 0.9 e^-H)
    jsd = float(x[0, FEATURES.index("jsd")])
    assert Fuzzy(jsd + 1e-3)(x)[0] == 1 and Fuzzy(jsd - 1e-3)(x)[0] == 0
    assert float(x[0, FEATURES.index("margin_p")]) == pytest.approx(0.3)


def test_policy_training_reduces_loss_on_a_fixed_batch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, len(FEATURES), generator=g)
    y = (x[:, 0] - x[:, 2] > 0.3).float()
    curve = cospec_training.fit_supervised(Policy(16), x, y, steps=60)
    assert curve[-1] < 0.6 * curve[0]
    # policy gradient: advantages favour keeping where feature 0 is large; a few steps raise that log-prob
    pol = Policy(16).standardize_on(x)
    feats, kept = list(x.split(32)), [torch.ones(32, dtype=torch.bool)] * 8
    adv = torch.tensor([1.0, -1.0] * 4)
    opt = torch.optim.Adam(pol.net.parameters(), lr=0.01)
    losses = []
    for _ in range(20):
        loss = cospec_training.grpo_loss(pol, feats, kept, adv)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_math_task_answers_match_an_independent_evaluator():
    for split in ("train", "validation", "test"):
        for p in data.math_problems(split, 300):
            assert data.solve_math(p["question"]) == p["answer"]
            assert data.math_answer(p["solution"]) == p["answer"]
    test_q = {p["question"] for p in data.math_problems("test", 2000)}
    assert not test_q & {p["question"] for p in data.math_problems("train", 3000)}
    assert data.math_answer("A: x = 1 + 2 = 3 .\nAnswer: 3") == 3 and data.math_answer("A: x = 1 +") is None
    with pytest.raises(ValueError, match="level"):
        data.math_problem(random.Random(0), 7)
    with pytest.raises(ValueError, match="split"):
        data.math_problems("dev", 3)


def test_arbiter_refuses_trees_and_missing_logits():
    tree = speclib.Tree([1, 2], [-1, -1])
    p = torch.full((3, 8), 1 / 8)
    with pytest.raises(ValueError, match="chains only"):
        Arbiter()(tree, p, True, None, logits=p)
    with pytest.raises(ValueError, match="raw logits"):
        Arbiter()(speclib.Tree.chain([1, 2]), p, True, None)


def test_policies_survive_a_parquet_round_trip(tmp_path):
    import pandas as pd

    from speclib.acceptors.cospec import FEATURES, Policy, policies_from_table, policies_table

    torch.manual_seed(0)
    pols = {"judge": Policy(hidden=0), "arbiter": Policy(hidden=5)}
    pols["arbiter"].standardize_on(torch.randn(20, len(FEATURES)))
    pols["arbiter"].bias_shift.fill_(0.25)
    policies_table(pols).to_parquet(tmp_path / "p.parquet")
    back = policies_from_table(pd.read_parquet(tmp_path / "p.parquet"))
    x = torch.randn(7, len(FEATURES))
    for name, pol in pols.items():
        assert torch.equal(back[name](x), pol(x)), name
