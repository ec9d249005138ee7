"""Speculative decoding ON the hybrid model: tree SD (closed_form, materialize), chain SD (replay),
component-aware self-speculation, batched verification, and speclib.load's dispatch.

Models are random tiny ones (vocab 64): a Qwen3.5 text target (3 GDN + 1 attention layer) and a
tiny Llama draft. Statistical tests: two-sample chi-square at alpha = 1e-3 on fixed seeds (0.1%
false-positive rate per assertion under the null)."""

import pytest
import torch
from conftest import KeepFirstBranch, tiny_lm, token_zero_draft
from transformers import Qwen3_5ForCausalLM

import speclib
from speclib import ModelDrafter, Sampling, SelfDrafter, TreeDrafter, generate, generate_batch
from speclib.lms.hybrid import HybridLM, tiny_config
from speclib.research.stats import chi2_two_sample

GREEDY, T1 = Sampling(0.0), Sampling(1.0)
PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]]


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return HybridLM(Qwen3_5ForCausalLM(tiny_config(initializer_range=0.1)).eval(), None, "cpu")


@pytest.fixture(scope="module")
def draft():
    return tiny_lm(16, 1, seed=1)


@pytest.mark.parametrize(
    "strategy,drafter",
    [
        ("closed_form", lambda d: TreeDrafter(d, branching=(3, 2, 1))),
        ("closed_form", lambda d: TreeDrafter(d, budget=10, depth=4, top=3)),
        ("materialize", lambda d: TreeDrafter(d, branching=(2, 2, 2))),
        ("replay", lambda d: ModelDrafter(d, 4)),
        ("replay", "self"),  # the target as its own draft: every block accepted
    ],
)
def test_greedy_sd_equals_ar(target, draft, strategy, drafter):
    lm = target.view(strategy=strategy)
    accepted = 0
    for p in PROMPTS:
        ar = generate(lm, p, 24, sampling=GREEDY).tokens
        d = ModelDrafter(target.view(), 4) if drafter == "self" else drafter(draft)
        sd = generate(lm, p, 24, drafter=d, sampling=GREEDY)
        assert sd.tokens == ar
        accepted += sum(s["accepted"] for s in sd.stats.steps)
        if drafter == "self":
            assert sd.stats.acceptance_rate == 1.0
    assert accepted > 0  # commits of non-empty paths were exercised


def test_self_drafter(target):
    for p in PROMPTS:
        ar = generate(target, p, 20, sampling=GREEDY).tokens
        assert generate(target, p, 20, drafter=SelfDrafter(target, 3), sampling=GREEDY).tokens == ar
    d = SelfDrafter(target, 2)
    assert d.lm.model is target.model and d.lm.skip_attention and not target.skip_attention
    with pytest.raises(TypeError, match="hybrid"):
        SelfDrafter(tiny_lm(16, 1), 2)


def test_chi_square_ar_vs_tree_sd_on_hybrid(target, draft):
    """Token at new-token index 3 over 800 seeded runs, AR vs tree SD (closed_form) at T = 1."""

    def token_at(make, seed0):
        return [
            generate(target, [3, 1, 4], 4, drafter=make() if make else None, sampling=T1, seed=seed0 + s).tokens[3]
            for s in range(800)
        ]

    ar = token_at(None, 0)
    sd = token_at(lambda: TreeDrafter(draft, branching=(3, 2)), 10**6)
    assert chi2_two_sample(ar, sd).p > 1e-3
    # negative control: the same test rejects a rule that keeps every draft token of the first branch. The tiny
    # target and draft are near uniform, so the draft is one that proposes token 0: what the rule keeps shows
    zero = token_zero_draft()
    bad = [
        generate(target, [3, 1, 4], 4, drafter=TreeDrafter(zero, branching=(3, 2)), sampling=T1, seed=10**6 + s,
                 acceptor=KeepFirstBranch()).tokens[3]
        for s in range(800)
    ]  # fmt: skip
    assert chi2_two_sample(ar, bad).p < 1e-3


@pytest.mark.parametrize("sampling", [GREEDY, T1], ids=["greedy", "t1"])
def test_generate_batch_equals_generate(target, sampling):
    """Batched verification changes nothing per request: request r gets generate(..., seed=seed + r)
    (up to float32 GEMM blocking, which cannot flip a sample at these margins; tokens compared exactly)."""
    drafts = [tiny_lm(16, 1, seed=1) for _ in PROMPTS]
    views = [target.view() for _ in PROMPTS]
    batch = generate_batch(
        views, PROMPTS, 16, drafters=[TreeDrafter(d, branching=(2, 2)) for d in drafts], sampling=sampling, seed=5
    )
    for r, (p, g) in enumerate(zip(PROMPTS, batch)):
        solo = generate(
            target.view(),
            p,
            16,
            drafter=TreeDrafter(tiny_lm(16, 1, seed=1), branching=(2, 2)),
            sampling=sampling,
            seed=5 + r,
        )
        assert g.tokens == solo.tokens
        assert [s["accepted"] for s in g.stats.steps] == [s["accepted"] for s in solo.stats.steps]
    ar = generate_batch([target.view() for _ in PROMPTS], PROMPTS, 10, sampling=GREEDY)
    assert [g.tokens for g in ar] == [generate(target, p, 10, sampling=GREEDY).tokens for p in PROMPTS]
    with pytest.raises(ValueError, match="one target view"):
        generate_batch(views[:2], PROMPTS, 4)
    d = TreeDrafter(drafts[0], branching=(2,))
    with pytest.raises(ValueError, match="own drafter"):
        generate_batch(views, PROMPTS, 4, drafters=[d, d, d])


def test_load_dispatches_hybrid_checkpoints(tmp_path, target):
    target.model.save_pretrained(tmp_path)
    speclib.load("code-draft").tokenizer.save_pretrained(tmp_path)
    lm = speclib.load(str(tmp_path))
    assert isinstance(lm, HybridLM) and lm.strategy == "closed_form" and lm.path is not None
    assert (lm.reset([1, 2, 3]) - target.reset([1, 2, 3])).abs().max() < 1e-5
