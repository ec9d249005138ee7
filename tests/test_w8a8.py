"""torch-w8a8: its int8 product against its twin and the float one, and the property it exists for: a token's
logits do not depend on the pass that scored it, so greedy speculation reproduces plain decoding exactly."""

import importlib.util
import inspect
import random

import pytest
import torch
from conftest import needs_shipped, tiny_lm

import speclib
from speclib.core.generate import generate
from speclib.core.sampling import Sampling
from speclib.drafters.cache import PromptLookupDrafter
from speclib.drafters.model import ModelDrafter
from speclib.lms import pretrained
from speclib.lms.w8a8 import W8A8LM, Int8Rows, quantize

SMOL = "smollm2-135m-instruct"


def awkward_rows():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(17, 40, generator=g)
    x[3] = 0  # a zero row: its scale is clamped, its output is the bias
    x[5] *= 1e4  # a large row and a tiny one quantize on their own scales
    x[6] *= 1e-5
    x[7, 11] = 300.0  # one outlier takes the whole row's range
    return x


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 3, 16, 17])
def test_packed_product_equals_its_twin_and_rows_are_independent(bias, rows):
    torch.manual_seed(1)
    lin = torch.nn.Linear(40, 24, bias=bias)
    mod = Int8Rows(lin.weight, lin.bias)
    x = awkward_rows()[:rows]
    y = mod(x)
    if mod.packed:  # oneDNN's packed product and torch._int_mm give the same floats
        assert torch.equal(y, mod(x, packed=False))
    assert torch.equal(torch.cat([mod(r[None]) for r in x]), y)  # each row alone: bit for bit
    assert torch.equal(mod(x[None]), y[None])  # leading axes kept
    # within int8's error of the float product: |x| |W| rounding, half a step each way per element
    w_err = (lin.weight - mod.q.float() * mod.scale[:, None]).abs()
    s = x.abs().amax(1, keepdim=True) / 127
    bound = (x.abs() @ w_err.t()) + 0.5 * s * lin.weight.abs().sum(1) + 1e-6 * y.abs()
    assert ((y - lin(x)).abs() <= bound * 1.01).all()


def test_quantize_keeps_the_float_model_and_embeddings():
    base = tiny_lm(impl="fast")
    before = {k: v.clone() for k, v in base.model.state_dict().items()}
    q = quantize(base.model)
    assert all(torch.equal(v, base.model.state_dict()[k]) for k, v in before.items())  # a copy: untouched
    assert isinstance(q.lm_head, Int8Rows) and not hasattr(q.model.layers[0].self_attn, "q_proj")
    assert q.model.embed_tokens.weight.dtype == torch.float32


def one_token_logits(lm, prompt, tokens):
    lm.reset(prompt)
    out = []
    for t in tokens:
        out.append(lm.extend([t], [-1])[0])
        lm.commit([0])
    return torch.stack(out)


@pytest.mark.parametrize("seed", range(3))
def test_a_pass_scores_each_token_as_a_one_token_pass_would(seed):
    """Bit for bit: chains of every width, trees, a batched extend beside another request, and the prefill."""
    base = tiny_lm(impl="fast", seed=seed, layers=3)
    lm, rnd = W8A8LM(quantize(base.model), base.tokenizer, base.device), random.Random(seed)
    prompt = [rnd.randrange(64) for _ in range(rnd.randint(1, 30))]
    toks = [rnd.randrange(64) for _ in range(12)]
    one = one_token_logits(lm, prompt, toks)
    for width in (2, 3, 5, 12):
        lm.reset(prompt)
        got = []
        for s in range(0, len(toks), width):
            c = toks[s : s + width]
            got.append(lm.extend(c, list(range(-1, len(c) - 1))))
            lm.commit(range(len(c)))
        assert torch.equal(torch.cat(got), one)
    lm.reset(prompt)  # a tree: the chain's first 4 tokens as one branch beside two others
    tree = lm.extend(toks[:4] + [1, 2, 3], [-1, 0, 1, 2, -1, 4, 0])
    assert torch.equal(tree[:4], one[:4])
    lm.commit([0, 1, 2, 3])
    assert torch.equal(lm.extend(toks[4:6], [-1, 0]), one[4:6])
    assert torch.equal(lm.reset(prompt + toks[:7]), one[6])  # a prefill row too
    other = lm.view()
    assert type(other) is W8A8LM
    lm.reset(prompt)
    other.reset(prompt[:1])
    a, _ = W8A8LM.extend_batch([lm, other], [toks[:3], [9] * 5], [[-1, 0, 1], [-1, 0, 1, 2, 3]])
    assert torch.equal(a, one[:3])


def test_restricted_vocabulary_is_refused():
    base = tiny_lm(impl="fast")
    with pytest.raises(ValueError, match="whole vocabulary"):
        W8A8LM(quantize(base.model), base.tokenizer, base.device).restrict_vocab([1, 2])


@needs_shipped
def test_greedy_speculation_equals_plain_decoding_on_int8(shipped):
    """code-target on torch-w8a8 with a draft model and prompt lookup: the same tokens as its own AR."""
    target, draft = speclib.load("code-target", backend="torch-w8a8"), shipped[1]
    for fn in (random.Random.shuffle, random.Random.choices, inspect.getsource):
        prompt = target.encode(inspect.getsource(fn))[:120]
        ar = generate(target, prompt, 40, sampling=Sampling(0.0), eos_token_id=None).tokens
        for drafter in (ModelDrafter(draft, 4), PromptLookupDrafter(3, 5)):
            sd = generate(target, prompt, 40, drafter=drafter, sampling=Sampling(0.0), eos_token_id=None)
            assert sd.tokens == ar


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec(pretrained.MODELS[SMOL].module) is None, reason=pretrained.MODELS[SMOL].install_command()
)
def test_smollm2_speculation_equals_plain_decoding_on_int8():
    """The real model, on chat requests, prompt lookup: on these four, prompt lookup changed all four answers
    on torch.ao's int8 (torch-int8) and two on torch-bf16; this backend must change none."""
    lm = speclib.load(SMOL, backend="torch-w8a8")
    asks = [
        "Write a Python function that reverses a string, then explain it.",
        "Translate into English: Der Hund spielt im Garten mit dem Ball.",
        "List three facts about the Moon.",
        "Summarize: The meeting moved the launch to May because the tests failed twice.",
    ]
    for ask in asks:
        prompt = pretrained.chat_ids(lm, ask)
        ar = generate(lm, prompt, 48, sampling=Sampling(0.0), eos_token_id=None).tokens
        sd = generate(lm, prompt, 48, drafter=PromptLookupDrafter(3, 5), sampling=Sampling(0.0), eos_token_id=None)
        assert sd.tokens == ar
