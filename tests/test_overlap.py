"""OverlapDrafter: the draft LM in its own process, drafting while the target verifies. Lossless like the
sequential loop (greedy identity, chi-square at temperature 1 with a negative control), its hypothesis
bookkeeping on awkward timings (verify at once with nothing ready, wait for k, a short lookahead), and its
process always stopped."""

import pytest
import torch
from conftest import noisy_copy, tiny_lm

from speclib import ModelDrafter, Sampling, generate
from speclib.drafters import overlap
from speclib.drafters.overlap import OverlapDrafter
from speclib.research.stats import chi2_two_sample

GREEDY = Sampling(0.0)


@pytest.fixture(scope="module")
def models():
    return tiny_lm(32, 2, seed=0), noisy_copy(seed=0, scale=0.3)  # a draft that agrees often, not always


@pytest.mark.parametrize("k, wait_for, ahead", [(4, 0, None), (3, 3, 3), (8, 2, 20)])
def test_greedy_output_equals_ar(models, k, wait_for, ahead):
    target, draft = models
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6], [7] * 12, list(range(20))]
    with OverlapDrafter(draft, k=k, wait_for=wait_for, ahead=ahead) as d:
        for ids in prompts:
            ar = generate(target, ids, 60, sampling=GREEDY)
            out = generate(target, ids, 60, drafter=d, sampling=GREEDY)
            assert out.tokens == ar.tokens
            assert out.stats.new_tokens == 60 and max(s["drafted"] for s in out.stats.steps) <= k
        # the same drafts as the sequential drafter: accepted tokens per step can only come from q's argmax chain
        seq = generate(target, prompts[0], 60, drafter=ModelDrafter(draft, k), sampling=GREEDY)
        assert seq.stats.acceptance_rate > 0.3  # the pair agrees often: hypotheses survive verify passes


def _token_at(target, drafter, pos, n_runs, sampling, seed0=0, acceptor=None):
    return [
        generate(
            target, [3, 1, 4], pos + 1, drafter=drafter, sampling=sampling, seed=seed0 + s, acceptor=acceptor
        ).tokens[pos]
        for s in range(n_runs)
    ]


def token_zero_draft():
    """A draft whose q puts almost all its mass on token 0, whatever the context."""
    lm = tiny_lm(16, 1, seed=1)
    head = torch.nn.Linear(16, lm.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[0] = 10.0
    lm.model.lm_head = head
    return lm


class AcceptAll:
    """A wrong rule (keeps every draft token): the chi-square test must catch it."""

    def __call__(self, tree, p, greedy, gen, logits=None):
        return list(range(len(tree))), int(torch.multinomial(p[len(tree)], 1, generator=gen))


def test_chi_square_against_ar_at_temperature_1(models):
    """Tokens at new-token index 4 over independent seeded runs, as for the sequential loop
    (tests/test_generate.py); alpha = 1e-3 (0.1% false-positive rate)."""
    target, draft = models
    t1, n = Sampling(1.0), 800
    ar = _token_at(target, None, 4, n, t1)
    with OverlapDrafter(draft, k=3, wait_for=1) as d:
        over = _token_at(target, d, 4, n, t1, seed0=10**6)
    assert chi2_two_sample(ar, over).p > 1e-3
    # negative control: keeping every draft token of a draft that proposes token 0 is caught (wait_for = k = 3:
    # index 3 is always the third kept draft token). The tiny random target's marginal at an index barely
    # depends on the tokens before it, so a subtler wrong rule would need far more runs to be seen.
    with OverlapDrafter(token_zero_draft(), k=3, wait_for=3) as d:
        bad = _token_at(target, d, 3, n // 4, t1, seed0=10**6, acceptor=AcceptAll())
    assert chi2_two_sample(_token_at(target, None, 3, n // 4, t1), bad).p < 1e-3


def test_bad_inputs_and_too_few_cpus(models, monkeypatch):
    _, draft = models
    for kw, match in [
        (dict(k=0), "k must"),
        (dict(k=2, wait_for=3), "wait_for"),
        (dict(k=4, ahead=2), "ahead"),
        (dict(threads=0), "threads"),
    ]:
        with pytest.raises(ValueError, match=match):
            OverlapDrafter(draft, **kw)
    with pytest.raises(ValueError, match="vocabulary"):
        generate(tiny_lm(vocab=65), [1], 5, drafter=OverlapDrafter(draft, 2))
    monkeypatch.setattr(overlap, "cpu_count", lambda: 1)
    with pytest.raises(RuntimeError, match="2 usable CPUs"):
        OverlapDrafter(draft, 2)


def test_the_draft_process_stops(models):
    target, draft = models
    d = OverlapDrafter(draft, k=2)
    generate(target, [1, 2], 8, drafter=d, sampling=GREEDY)
    proc = d._proc
    d.close()
    assert not proc.is_alive()
    d2 = OverlapDrafter(draft, k=2)
    generate(target, [1, 2], 8, drafter=d2, sampling=GREEDY)
    d2._proc.kill()  # a crash on the draft side: the decoding side stops with an error, not a hang
    d2._proc.join()
    with pytest.raises(RuntimeError, match="draft process"):
        generate(target, [1, 2], 8, drafter=d2, sampling=GREEDY)
    d2.close()
