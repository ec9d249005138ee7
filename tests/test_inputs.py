"""Bad inputs get clear errors before any work or state change; -inf logits (masked tokens) work."""

import numpy as np
import pytest
import torch
from conftest import tiny_lm
from transformers import Qwen3_5ForCausalLM

from speclib import ModelDrafter, Sampling, generate
from speclib.core.generate import prompt_list
from speclib.core.sampling import probs
from speclib.lms.backends import LlamaCppLM, OnnxLM, SerialLM
from speclib.lms.hybrid import HybridLM, tiny_config

NEG = float("-inf")


def hybrid_lm():
    torch.manual_seed(0)
    return HybridLM(Qwen3_5ForCausalLM(tiny_config()).eval(), None, "cpu")


# --- token ids outside the vocabulary -------------------------------------------------------------
@pytest.mark.parametrize("impl", ["hf", "fast"])
def test_out_of_vocab_ids_are_refused_and_change_nothing(impl):
    lm, ref = tiny_lm(impl=impl), tiny_lm(impl=impl)
    for bad in ([1, 64], [-1, 2]):
        with pytest.raises(ValueError, match=r"prompt_ids.*\[0, 64\)"):
            lm.reset(bad)
    lm.reset([1, 2, 3])
    lm.extend([4], [-1])
    lm.commit([0])
    for tokens, parents in (([64], [-1]), ([5, -2], [-1, 0]), ([5, 1000], [-1, -1])):
        with pytest.raises(ValueError, match=r"tokens.*\[0, 64\)"):
            lm.extend(tokens, parents)
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        lm.reset([7, 64])  # a refused reset keeps the old prefix too
    assert lm.n_committed == 4 and lm.pending_parents == []
    ref.reset([1, 2, 3, 4])
    assert torch.allclose(lm.extend([5, 6], [-1, 0]), ref.extend([5, 6], [-1, 0]), atol=1e-5)


def test_out_of_vocab_ids_hybrid():
    lm = hybrid_lm()
    with pytest.raises(ValueError, match=r"prompt_ids.*\[0, 64\)"):
        lm.reset([1, 64])
    lm.reset([1, 2])
    with pytest.raises(ValueError, match=r"tokens.*\[0, 64\)"):
        lm.extend([-3], [-1])


# --- extend / commit before reset -----------------------------------------------------------------
def _bare(cls):
    """A backend LM that was never reset (no runtime behind it: the check comes before any use)."""
    lm = cls.__new__(cls)
    lm.model, lm.device, lm.max_length = tiny_lm().model, torch.device("cpu"), 256
    lm._start(0)
    return lm


@pytest.mark.parametrize(
    "make",
    [
        lambda: tiny_lm(),
        lambda: tiny_lm(impl="fast"),
        hybrid_lm,
        lambda: SerialLM(tiny_lm()),
        lambda: _bare(OnnxLM),
        lambda: _bare(LlamaCppLM),
    ],
    ids=["hf", "fast", "hybrid", "serial", "onnx", "llamacpp"],
)
def test_extend_and_commit_before_reset(make):
    lm = make()
    with pytest.raises(RuntimeError, match=r"call reset\(prompt_ids\)"):
        lm.extend([1], [-1])
    for path in ([], [0]):
        with pytest.raises(RuntimeError, match=r"call reset\(prompt_ids\) first"):
            lm.commit(path)
    if not isinstance(lm, (OnnxLM, LlamaCppLM)):  # and reset still works afterwards
        lm.reset([1, 2])
        lm.extend([3], [-1])
        lm.commit([0])


# --- prompts that are not a 1-D sequence of ints --------------------------------------------------
@pytest.mark.parametrize("impl", ["hf", "fast"])
def test_prompt_types(impl):
    lm = tiny_lm(impl=impl)
    with pytest.raises(TypeError, match=r"encode it first with lm.encode\(text\)"):
        lm.reset("def f")
    for two_d in (torch.tensor([[1, 2, 3]]), [[1, 2, 3]], np.array([[1, 2, 3]]), [torch.tensor([1, 2])]):
        with pytest.raises(ValueError, match="1-D sequence of int token ids"):
            lm.reset(two_d)
    for floats in ([1.0, 2.0], torch.tensor([1.0, 2.0]), np.array([1.5])):
        with pytest.raises(TypeError, match="int token ids"):
            lm.reset(floats)
    ref = lm.reset([1, 2, 3])
    with pytest.raises(TypeError, match="tokens must be a 1-D sequence"):
        lm.extend("a", [-1])
    for ok in (torch.tensor([1, 2, 3]), np.array([1, 2, 3]), range(1, 4), [np.int64(1), 2, torch.tensor(3)]):
        assert torch.equal(lm.reset(ok), ref)


def test_prompt_list():
    assert prompt_list(torch.tensor([5, 6])) == [5, 6] and prompt_list(np.arange(3, dtype=np.int32)) == [0, 1, 2]
    assert all(type(t) is int for t in prompt_list([np.int64(1), torch.tensor(2)]))
    with pytest.raises(ValueError, match=r"shape \(\)"):
        prompt_list(torch.tensor(3))
    with pytest.raises(TypeError, match="got int"):
        prompt_list(3)


def test_generate_rejects_bad_prompts():
    target = tiny_lm()
    with pytest.raises(TypeError, match="encode it first"):
        generate(target, "def f", 3)
    with pytest.raises(ValueError, match="1-D"):
        generate(target, torch.tensor([[1, 2, 3]]), 3)


# --- -inf logits: masked tokens ------------------------------------------------------------------
@pytest.mark.parametrize(
    "s", [Sampling(), Sampling(0.7, 5), Sampling(1.3, 0, 0.8), Sampling(1.0, 10, 0.5), Sampling(1.0, 30), Sampling(0.0)]
)
def test_probs_with_masked_tokens_equal_the_reduced_vocabulary(s):
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(3, 37, generator=gen) * 3
        masked = torch.rand(3, 37, generator=gen) < 0.5
        masked[:, 0] = False  # keep a finite entry per row
        p = probs(logits.masked_fill(masked, NEG), s)
        for row in range(3):
            keep = ~masked[row]
            assert (p[row, masked[row]] == 0).all()
            assert torch.allclose(p[row, keep], probs(logits[row, keep], s), atol=1e-6)
    if s.greedy:  # the argmax among finite entries, even if all negative
        assert probs(torch.tensor([NEG, -5.0, NEG, -2.0, NEG]), s).argmax() == 3


@pytest.mark.parametrize(
    "row,match", [([NEG, NEG], "all -inf"), ([0.0, float("nan")], "NaN"), ([NEG, float("inf")], r"\+inf")]
)
def test_bad_logits_are_named(row, match):
    for s in (Sampling(), Sampling(0.0)):
        with pytest.raises(ValueError, match=match):
            probs(torch.tensor([[0.0, 1.0], row]), s)


class Masked:
    """An LM whose logits are -inf on `banned` (as a logits processor would leave them)."""

    def __init__(self, lm, banned):
        self.lm, self.banned = lm, banned

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def reset(self, prompt_ids):
        return self.lm.reset(prompt_ids).index_fill(-1, self.banned, NEG)

    def extend(self, tokens, parents):
        return self.lm.extend(tokens, parents).index_fill(-1, self.banned, NEG)


def test_generate_with_masked_target():
    banned = torch.arange(0, 64, 2)  # every even token
    target = Masked(tiny_lm(seed=3), banned)
    drafter = ModelDrafter(tiny_lm(16, 1, seed=4), 3)
    greedy = generate(target, [1, 3, 5], 30, sampling=Sampling(0.0)).tokens
    assert generate(target, [1, 3, 5], 30, drafter=drafter, sampling=Sampling(0.0)).tokens == greedy
    for s in (Sampling(), Sampling(0.8, 10, 0.9)):
        out = generate(target, [1, 3, 5], 30, drafter=drafter, sampling=s, seed=1).tokens
        assert len(out) == 30 and all(t % 2 for t in out + greedy)
