"""Every backend against torch fp32 on the shipped draft; extend/commit against a fresh forward on
the same backend; trees where supported; the serial-verification wrapper by forward-call counts."""

import random

import pytest
import torch
from conftest import needs_shipped, tiny_lm

import speclib
from speclib.core.tree import Tree
from speclib.lms import backends
from speclib.lms.backends import BACKENDS, SerialLM

# Tolerances on logits: max |difference| over every position, against torch fp32 (the shipped models'
# logits reach about +-16). Measured over 200 positions: code-draft / code-target max differences
# bf16 0.06 / 0.10, torch-int8 0.62 / 1.30, torch-w8a8 0.22 / 0.41, openvino 1e-5 / 2e-5, openvino-int8 0.12 / 0.23, onnx-int8 0.30 / 0.55, llamacpp f16 0.005 / 0.005,
# q8_0 0.10 / 0.18, q4_0 0.56 / 0.63, torch-mkl (against torch's oneDNN projections) 8e-6 / 2.4e-5. fp32 runtimes compute the same sums in another order; bf16 keeps
# 8 mantissa bits; int8 rounds weights to 1/127 of a row's or tensor's range and activations per call.
TOL = {
    "torch": 1e-5,
    "torch-mkl": 1e-4,
    "torch-compile": 1e-4,
    "onnx": 1e-4,
    "torch-bf16": 0.2,
    "torch-int8": 2.0,
    "torch-w8a8": 1.0,
    "onnx-int8": 1.0,
    "openvino": 1e-4,
    "openvino-int8": 0.5,
    "llamacpp-f16": 0.02,
    "llamacpp-q8_0": 0.4,
    "llamacpp-q4_0": 1.5,
}
# and the share of positions whose greedy token must equal fp32's (measured: >= 0.89 everywhere)
TOP1 = {
    "torch-bf16": 0.95,
    "torch-int8": 0.8,
    "torch-w8a8": 0.95,
    "onnx-int8": 0.9,
    "openvino-int8": 0.95,
    "llamacpp-q8_0": 0.95,
    "llamacpp-q4_0": 0.85,
}


def usable(name):
    return pytest.param(
        name, marks=pytest.mark.skipif(bool(backends.missing(name)), reason=f"{name} needs {BACKENDS[name].install}")
    )


ALL = [usable(n) for n in BACKENDS if n != "llamacpp-gguf"]  # a pretrained model's own GGUF: tests/test_pretrained.py


@pytest.fixture(scope="module")
def ref():
    return speclib.load("code-draft")


@pytest.fixture(scope="module")
def prompt(ref):
    import inspect

    return ref.encode(inspect.getsource(random.Random.shuffle))[:90]


_LOADED = {}


def load(name, model="code-draft"):
    if (name, model) not in _LOADED:
        _LOADED[name, model] = speclib.load(model, backend=name)
    return _LOADED[name, model]


@needs_shipped
@pytest.mark.parametrize("model", ["code-draft", "code-target"])
@pytest.mark.parametrize("name", ALL)
def test_logits_match_torch_fp32(name, model, ref, prompt, shipped):
    """Prefill, a 5-token chain, a commit and one more token: every row within TOL of torch fp32."""
    if model == "code-target" and name == "torch-compile":
        pytest.skip("compiling the target takes a minute; the draft covers torch.compile")
    lm, ref = load(name, model), (ref if model == "code-draft" else shipped[0])
    rows, want = [], []
    for m, out in ((lm, rows), (ref, want)):
        out.append(m.reset(prompt[:60])[None])
        out.append(m.extend(prompt[60:65], [-1, 0, 1, 2, 3]))
        m.commit([0, 1, 2])
        out.append(m.extend(prompt[63:64], [-1]))
    got, exp = torch.cat(rows).float(), torch.cat(want)
    assert (got - exp).abs().max() <= TOL[name], (got - exp).abs().max()
    assert (got.argmax(-1) == exp.argmax(-1)).float().mean() >= TOP1.get(name, 1.0)


@needs_shipped
@pytest.mark.parametrize("name", ALL)
def test_chain_extend_commit_equals_fresh_forward(name, prompt):
    """Decoding state built by extends and partial commits gives what a fresh prefill of the same
    tokens gives, on the same backend (quantized ones within their tolerance: a pass of another width
    quantizes its activations differently)."""
    lm = load(name)
    lm.reset(prompt[:40])
    committed = list(prompt[:40])
    rnd = random.Random(1)
    for _ in range(4):
        n = rnd.randint(1, 6)
        toks = [rnd.randrange(lm.vocab_size) for _ in range(n)]
        last = lm.extend(toks, list(range(-1, n - 1)))[-1]
        keep = rnd.randint(0, n)
        lm.commit(list(range(keep)))
        fresh = lm.reset(committed + toks)
        assert (last.float() - fresh.float()).abs().max() <= TOL[name]
        committed += toks[:keep]
        lm.reset(committed)


@needs_shipped
@pytest.mark.parametrize("name", ALL)
def test_trees(name, ref, prompt):
    """A random tree verified in one pass equals torch fp32 per node; chain-only backends refuse."""
    lm = load(name)
    tree = Tree(prompt[50:58], [-1, 0, 0, 1, -1, 4, 2, 2])
    lm.reset(prompt[:50])
    if not BACKENDS[name].trees:
        with pytest.raises(NotImplementedError, match="chains only"):
            lm.extend(tree.tokens, tree.parents)
        return
    ref.reset(prompt[:50])
    got, exp = lm.extend(tree.tokens, tree.parents).float(), ref.extend(tree.tokens, tree.parents)
    assert (got - exp).abs().max() <= TOL[name]
    lm.commit([4, 5])
    ref.commit([4, 5])
    assert (lm.extend([7], [-1]).float() - ref.extend([7], [-1])).abs().max() <= TOL[name]


@pytest.mark.skipif(bool(backends.missing("onnx")), reason="needs pip install 'speclib[onnx]'")
@pytest.mark.parametrize("seed", range(3))
def test_onnx_random_trees_grouped_heads(seed, tmp_path, monkeypatch):
    """The exported graph on a random tiny Llama with grouped KV heads: random trees and commits."""
    monkeypatch.setattr(backends, "CACHE", tmp_path)
    base = tiny_lm(seed=seed, impl="fast")
    lm, rnd = backends.OnnxLM(base), random.Random(seed)
    prompt = [rnd.randrange(64) for _ in range(rnd.randint(1, 9))]
    assert torch.allclose(lm.reset(prompt), base.reset(prompt), atol=1e-5)
    for _ in range(4):
        n = rnd.randint(1, 6)
        toks, par = [rnd.randrange(64) for _ in range(n)], [rnd.randint(-1, i - 1) for i in range(n)]
        assert torch.allclose(lm.extend(toks, par), base.extend(toks, par), atol=1e-5)
        path = Tree(toks, par).path_to(rnd.randrange(n))
        lm.commit(path)
        base.commit(path)


def test_serial_wrapper_counts_forward_calls():
    """SerialLM turns a pass over n nodes into n one-node passes (T(n)/T(1) ~ n by construction),
    with the same logits; counted, not timed."""
    lm = tiny_lm(impl="fast")
    calls = []
    inner_forward = lm._forward
    lm._forward = lambda reqs, *a: calls.append(sum(r[1].numel() for r in reqs)) or inner_forward(reqs, *a)
    serial = SerialLM(lm)
    for n in (1, 4, 9):
        for m in (lm, serial):
            m.reset([1, 2, 3])
            calls.clear()
            out = m.extend(list(range(5, 5 + n)), [-1, 0, 0, 1, 2, 2, 3, 6, 7][:n])
            if m is lm:
                want = out
                assert calls == [n]
            else:
                assert calls == [1] * n
                assert torch.allclose(out, want, atol=1e-5)


def test_bad_backend_names(monkeypatch):
    with pytest.raises(ValueError, match="unknown backend 'tensorrt'") as e:
        speclib.load("code-draft", backend="tensorrt")
    assert all(n in str(e.value) for n in BACKENDS)
    monkeypatch.setitem(
        BACKENDS, "onnx", backends.Backend("onnx", "x", ("speclib_no_such_module",), "pip install 'speclib[onnx]'")
    )
    with pytest.raises(ImportError, match=r"pip install 'speclib\[onnx\]'"):
        speclib.load("code-draft", backend="onnx")


@needs_shipped
def test_backend_needs_a_llama_checkpoint():
    with pytest.raises(ValueError, match="needs a Llama checkpoint"):
        speclib.load("hybrid-target", backend="torch-int8")
