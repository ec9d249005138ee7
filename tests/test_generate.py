import dataclasses
import math

import pytest
import torch
from conftest import accepted, needs_shipped, noisy_copy, tiny_lm, token_at, token_zero_draft

import speclib
from speclib import ModelDrafter, Sampling, generate
from speclib.research.stats import chi2_two_sample, greedy_identity

GREEDY = Sampling(0.0)


@pytest.mark.parametrize("k", [1, 2, 5, 8])
def test_greedy_sd_equals_ar_tiny(pair, k):
    """The unrelated tiny draft has every draft token rejected (0 accepted: the correction path only); the
    target's noisy copy has many accepted (measured 32 / 44 / 54 / 53 over the three prompts at k = 1 / 2 /
    5 / 8), so partial and full accepts are exercised too."""
    target, draft = pair
    for d, least in ((draft, 0), (noisy_copy(seed=0), 10)):
        total = 0
        for prompt in ([1], [5, 9, 2, 33], list(range(20))):
            ar = generate(target, prompt, 30, sampling=GREEDY)
            sd = generate(target, prompt, 30, drafter=ModelDrafter(d, k), sampling=GREEDY)
            assert sd.tokens == ar.tokens
            total += accepted(sd)
        assert total >= least


@pytest.mark.parametrize("n", [1, 2, 7, 13])
def test_stops_exactly_at_max_new_tokens(n):
    target = tiny_lm()
    same = tiny_lm()  # identical weights: every draft token is accepted, blocks of k + 1
    for k in (1, 4):
        out = generate(target, [1, 2], n, drafter=ModelDrafter(same, k), sampling=Sampling(1.0), seed=3)
        assert len(out.tokens) == n
        if n > 1:  # n == 1: the prefill's token alone, no verify pass
            assert out.stats.acceptance_rate == 1.0


def test_stops_at_eos_inside_an_accepted_block():
    target, same = tiny_lm(), tiny_lm()
    ref = generate(target, [1, 2], 40, sampling=GREEDY).tokens
    eos = ref[6]  # an EOS that lands inside a block of k + 1 = 5
    want = ref[: ref.index(eos) + 1]
    sd = generate(target, [1, 2], 40, drafter=ModelDrafter(same, 4), sampling=GREEDY, eos_token_id=eos)
    ar = generate(target, [1, 2], 40, sampling=GREEDY, eos_token_id=eos)
    assert sd.tokens == ar.tokens == want


class AcceptAll:
    """A wrong rule (keeps every draft token): the chi-square test must catch it."""

    def __call__(self, tree, p, greedy, gen):
        return list(range(len(tree))), speclib.core.sampling.sample(p[len(tree)], gen)


@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.8, top_k=8, top_p=0.9)])
def test_chi_square_ar_vs_sd(pair, sampling):
    """Tokens at new-token index 4 over independent seeded runs: i.i.d., so the chi-square test is
    exact up to its approximation. alpha = 1e-3 (0.1% false-positive rate), fixed seeds. Negative control in
    both settings: the same test rejects a rule that keeps every draft token. At T=1 with the same draft
    (1200 runs); with top-k/top-p the token at index 4 of that draft is a mixture over many contexts, near
    uniform (measured p 0.58 at 400 runs, 0.015 at 1200), so there the draft proposes token 0 whatever the
    context and 400 runs suffice."""
    target, draft = pair
    n = 1200
    ar = token_at(target, None, 4, n, sampling)
    sd = token_at(target, ModelDrafter(draft, 3), 4, n, sampling, seed0=10**6)
    assert chi2_two_sample(ar, sd).p > 1e-3
    # negative control: the same test rejects a rule that is not lossless
    wrong, n_bad = (draft, n) if sampling.top_k == 0 else (token_zero_draft(), 400)
    bad = token_at(target, ModelDrafter(wrong, 3), 4, n_bad, sampling, seed0=10**6, acceptor=AcceptAll())
    assert chi2_two_sample(ar, bad).p < 1e-3


def test_bad_inputs(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="k"):
        ModelDrafter(draft, 0)
    with pytest.raises(ValueError, match="empty"):
        generate(target, [], 5)
    with pytest.raises(ValueError, match="context"):
        generate(target, [1] * 200, 60, drafter=ModelDrafter(draft, 4))
    with pytest.raises(ValueError, match="vocabulary"):
        generate(target, [1], 5, drafter=ModelDrafter(tiny_lm(vocab=65), 2))
    with pytest.raises(TypeError, match="Sampling"):
        generate(target, [1], 5, sampling=0.0)
    with pytest.raises(ValueError, match="shipped"):
        speclib.load("no-such-model")


def test_acceptor_is_checked_before_any_state_changes(pair):
    target, draft = pair
    target.reset([7, 8, 9])
    d = ModelDrafter(draft, 2)
    with pytest.raises(TypeError, match="acceptor must implement speclib.core.protocols.Acceptor, got str"):
        generate(target, [1], 5, drafter=d, acceptor="lossless")
    assert target.n_committed == 3 and not hasattr(d, "fed")  # neither target nor drafter was reset


def test_stats_count_accepted_positions():
    target = tiny_lm()
    for d, k in ((None, 0), (ModelDrafter(noisy_copy(seed=0), 4), 4), (ModelDrafter(tiny_lm(), 3), 3)):
        st = generate(target, list(range(20)), 30, drafter=d, sampling=GREEDY).stats
        acc = [s["accepted"] for s in st.steps]
        assert st.accepted_at == [sum(a > j for a in acc) for j in range(k)]
        assert st.target_calls == len(st.steps) and st.batch_seconds is None
        if d is None:  # no drafts: no mean acceptance length (as no acceptance rate)
            assert math.isnan(st.mean_accepted_length) and math.isnan(st.acceptance_rate)
        else:  # vLLM's: tokens per verify step, the bonus / correction included
            assert st.mean_accepted_length == pytest.approx(1 + sum(acc) / len(acc))
            assert st.accepted_at == sorted(st.accepted_at, reverse=True) and st.accepted_at[0] > 0
    assert set(dataclasses.asdict(st)) >= {
        "steps",
        "new_tokens",
        "target_calls",
        "acceptance_rate",
        "tokens_per_call",
        "seconds",
        "tokens_per_s",
    }


@needs_shipped
def test_tokenizer_mismatch(shipped):
    from transformers import AutoTokenizer

    target, draft = shipped
    other = speclib.load("code-draft")
    other.tokenizer = AutoTokenizer.from_pretrained(speclib.lms.lm.CHECKPOINTS / "code-draft")
    other.tokenizer.add_tokens(["<extra>"])
    with pytest.raises(ValueError, match="tokenizer"):
        generate(target, [1], 5, drafter=ModelDrafter(other, 2))


@needs_shipped
def test_greedy_identity_shipped_models(shipped):
    """Level 3: SD = AR = transformers generate(do_sample=False) on held-out prompts."""
    target, draft = shipped
    from speclib.research import data  # imported here: run alone, nothing else has imported it

    prompts = [r["prompt"] for r in data.load_workload("code_humaneval", 3)]
    ar, sd, hf, sd_runs = [], [], [], []
    for text in prompts:
        ids = target.encode(text)
        ar.append(generate(target, ids, 24, sampling=GREEDY).tokens)
        sd_runs.append(generate(target, ids, 24, drafter=ModelDrafter(draft, 4), sampling=GREEDY))
        sd.append(sd_runs[-1].tokens)
        out = target.model.generate(
            torch.tensor([ids]), max_new_tokens=24, do_sample=False, pad_token_id=target.eos_token_id
        )
        hf.append(out[0, len(ids) :].tolist())
    assert greedy_identity(ar, sd).all_identical
    assert sum(accepted(g) for g in sd_runs) >= 10  # measured: 45 of 108 draft tokens accepted
    assert greedy_identity(ar, hf).all_identical
