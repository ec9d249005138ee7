"""BranchSkipLM: the linear subgraph of a parallel hybrid (Falcon-H1) as a self-draft.

Its slow twin is the stock transformers forward over the whole sequence with every layer's attention
output multiplier set to 0 (the attention branch still runs, and adds nothing): the view must give the
same logits through resets, chain extends and partial commits, leave the target's own forward
untouched, and draft losslessly (greedy identity; a seeded permutation chi-square at temperature 1).
"""

import copy
import random

import pytest
import torch
from conftest import KeepFirstBranch

from speclib import ModelDrafter, Sampling, generate
from speclib.lms.branches import BranchSkipLM
from speclib.lms.hybrid import HybridLM, tiny_config
from speclib.lms.stateful import StatefulLM
from speclib.research.stats import run_permutation_test
from speclib.workbook.support import tiny_model

GREEDY, T1 = Sampling(temperature=0.0), Sampling(temperature=1.0)


@pytest.fixture(scope="module")
def model():
    return tiny_model("falcon_h1", seed=3)


@pytest.fixture(scope="module")
def target(model):
    return StatefulLM(model, None, "cpu")


def attention_free_twin(model):
    """The obvious reference: the same weights, attention output multiplied by 0 in every layer."""
    twin = copy.deepcopy(model)
    for layer in twin.model.layers:
        layer.attn_out_multiplier = 0.0
    return twin


@torch.inference_mode()
def full_logits(model, ids):
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


def test_view_equals_the_attention_free_forward_through_extends_and_commits(model, target):
    twin, view = attention_free_twin(model), BranchSkipLM(target)
    rng = random.Random(0)
    V = model.config.vocab_size
    seq = [rng.randrange(V) for _ in range(7)]
    got = [view.reset(seq)]
    ref = full_logits(twin, seq)
    assert torch.allclose(got[0], ref[-1], atol=1e-4, rtol=1e-4)
    for n_draft, keep in [(3, 1), (1, 1), (4, 0), (2, 2), (5, 3)]:  # awkward partial commits
        chain = [rng.randrange(V) for _ in range(n_draft)]
        out = view.extend(chain, list(range(-1, n_draft - 1)))
        ref = full_logits(twin, seq + chain)[len(seq) :]
        assert torch.allclose(out, ref, atol=1e-4, rtol=1e-4)
        view.commit(list(range(keep)))
        seq += chain[:keep]
    # after all that, the view continues from exactly the committed sequence
    nxt = view.extend([1], [-1])[-1]
    assert torch.allclose(nxt, full_logits(twin, seq + [1])[-1], atol=1e-4, rtol=1e-4)
    # the branch is really off (a different model), and the target's own forward is untouched
    assert not torch.allclose(full_logits(model, seq)[-1], full_logits(twin, seq)[-1], atol=1e-2)
    assert all(not isinstance(layer.self_attn, type(view._zero)) for layer in model.model.layers)
    assert torch.allclose(target.reset(seq), full_logits(model, seq)[-1], atol=1e-4, rtol=1e-4)


def test_greedy_sd_with_the_linear_subgraph_equals_ar(target):
    for prompt in ([3, 1, 4, 1, 5], [9, 2, 6], [7]):
        ar = generate(target, prompt, 16, sampling=GREEDY, eos_token_id=None).tokens
        for k in (1, 2, 3):
            drafter = ModelDrafter(BranchSkipLM(target), k)
            sd = generate(target, prompt, 16, drafter=drafter, sampling=GREEDY, eos_token_id=None)
            assert sd.tokens == ar
            assert drafter.lm.model is target.model  # a view: the same weights, no copy


def test_permutation_chi_square_ar_vs_linear_subgraph_sd(model):
    """24 seeded runs of 16 tokens each, AR vs SD drafted by the linear subgraph (k = 2) at temperature
    1, LM head scaled by 6 so the distributions are peaked and the subgraph's differs from the target's.
    Tokens inside a run are dependent, so the chi-square statistic gets a paired permutation p-value over
    runs (999 permutations): asserting p > 1e-3 has a 0.1% false-positive rate under the null (lossless
    drafting). Power: the same test must reject the subgraph's own samples (p < 1e-2), and (negative control)
    the same SD under a wrong rule that keeps every draft token (p < 1e-2)."""
    sharp = copy.deepcopy(model)
    with torch.no_grad():
        sharp.lm_head.weight.mul_(6)
    target = StatefulLM(sharp, None, "cpu")

    def runs(lm, make, seed0, acceptor=None):
        return [
            generate(
                lm,
                [3, 1, 4],
                16,
                drafter=make() if make else None,
                sampling=T1,
                seed=seed0 + s,
                acceptor=acceptor,
                eos_token_id=None,
            )
            for s in range(24)
        ]

    ar = [g.tokens for g in runs(target, None, 0)]
    sd = runs(target, lambda: ModelDrafter(BranchSkipLM(target), 2), 10**6)
    accepted = sum(s["accepted"] for g in sd for s in g.stats.steps)
    drafted = sum(s["drafted"] for g in sd for s in g.stats.steps)
    assert 0 < accepted < drafted  # both acceptances and rejections
    assert run_permutation_test(ar, [g.tokens for g in sd], n_perm=999, seed=0).p_permutation > 1e-3
    own = [g.tokens for g in runs(BranchSkipLM(target), None, 2 * 10**6)]
    assert run_permutation_test(ar, own, n_perm=999, seed=0).p_permutation < 1e-2
    # negative control: the same SD under a rule that keeps every draft token (KeepFirstBranch on a chain)
    kept = [g.tokens for g in runs(target, lambda: ModelDrafter(BranchSkipLM(target), 2), 10**6, KeepFirstBranch())]
    assert run_permutation_test(ar, kept, n_perm=999, seed=0).p_permutation < 1e-2


def test_other_layouts_are_clear_errors():
    from transformers import Qwen3_5ForCausalLM

    hybrid = HybridLM(Qwen3_5ForCausalLM(tiny_config()), None, "cpu")
    with pytest.raises(TypeError, match="LayerSkipDrafter"):
        BranchSkipLM(hybrid)
    with pytest.raises(TypeError, match="parallel hybrid"):
        BranchSkipLM(StatefulLM(tiny_model("mamba2"), None, "cpu"))
