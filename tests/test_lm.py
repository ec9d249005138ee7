"""extend/commit on random chains and trees must equal a fresh full forward of each path."""

import random
import re

import pytest
import torch
from conftest import accepted, noisy_copy, tiny_lm

from speclib.core.tree import Tree


def full_logits(lm, ids):
    with torch.no_grad():
        return lm.model(input_ids=torch.tensor([ids])).logits[0, -1].float()


@pytest.mark.parametrize("impl", ["hf", "fast"])
@pytest.mark.parametrize("seed", range(6))
def test_random_trees_and_commits(seed, impl):
    """Both implementations against the stock full forward: HFLM (4D mask over a DynamicCache) and
    the lean LlamaLM (preallocated cache, SDPA); the tiny model has grouped KV heads."""
    rnd = random.Random(seed)
    lm = tiny_lm(seed=seed, impl=impl)
    committed = [rnd.randrange(64) for _ in range(rnd.randint(1, 9))]
    assert torch.allclose(lm.reset(committed), full_logits(lm, committed), atol=1e-5)
    for _ in range(4):
        tokens, parents = [], []
        for _ in range(rnd.randint(1, 3)):  # several extends per round
            n = rnd.randint(1, 6)
            new_par = [rnd.randint(-1, len(parents) + i - 1) for i in range(n)]
            new_tok = [rnd.randrange(64) for _ in range(n)]
            logits = lm.extend(new_tok, new_par)
            tokens += new_tok
            parents += new_par
            tree = Tree(tokens, parents)
            for j in range(n):
                node = len(tokens) - n + j
                ids = committed + [tokens[i] for i in tree.path_to(node)]
                assert torch.allclose(logits[j], full_logits(lm, ids), atol=1e-5), (seed, node)
        path = tree.path_to(rnd.randrange(len(tokens)))
        lm.commit(path)
        committed += [tokens[i] for i in path]
        assert lm.n_committed == len(committed)


@pytest.mark.parametrize("impl", ["hf", "fast"])
def test_greedy_decode_fast_equals_hf(impl):
    from speclib import ModelDrafter, Sampling, generate

    ref = generate(tiny_lm(seed=3), list(range(1, 30)), 40, sampling=Sampling(0.0)).tokens
    target, draft = tiny_lm(seed=3, impl=impl), noisy_copy(seed=3, impl=impl)
    assert generate(target, list(range(1, 30)), 40, sampling=Sampling(0.0)).tokens == ref
    sd = generate(target, list(range(1, 30)), 40, drafter=ModelDrafter(draft, 3), sampling=Sampling(0.0))
    assert sd.tokens == ref
    # an unrelated tiny draft had all 117 draft tokens rejected; the target's noisy copy: 30 of 36 accepted
    assert accepted(sd) >= 10


def test_chain_commit_prefix_is_a_crop():
    lm = tiny_lm()
    lm.reset([1, 2, 3])
    lm.extend([4, 5, 6], [-1, 0, 1])
    lm.commit([0, 1])
    assert all(layer.keys.shape[2] == 5 for layer in lm.cache.layers)
    assert torch.allclose(lm.extend([9], [-1])[0], full_logits(lm, [1, 2, 3, 4, 5, 9]), atol=1e-5)


@pytest.mark.parametrize("parents", [[0], [-1, 1], [-1, -2], [-1, 0, 5]])
def test_parents_not_topological(parents):
    lm = tiny_lm()
    lm.reset([1, 2])
    with pytest.raises(ValueError, match="topological"):
        lm.extend([3] * len(parents), parents)


def test_bad_commit_path():
    lm = tiny_lm()
    lm.reset([1, 2])
    lm.extend([3, 4, 5], [-1, -1, 0])
    with pytest.raises(ValueError, match="root-to-node"):
        lm.commit([1, 2])


def test_empty_prompt_and_context():
    lm = tiny_lm(max_pos=16)
    with pytest.raises(ValueError, match="empty"):
        lm.reset([])
    lm.reset(list(range(15)))
    with pytest.raises(ValueError, match="context"):
        lm.extend([1, 2], [-1, 0])


def _forward_failing_on_4d_mask(model, exc):
    """model.forward, except that a call with a 4D attention mask (the tree probe's) raises `exc`."""
    inner = model.forward

    def forward(*args, attention_mask=None, **kw):
        if attention_mask is not None and attention_mask.dim() == 4:
            raise exc
        return inner(*args, attention_mask=attention_mask, **kw)

    return forward


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        torch.OutOfMemoryError("CUDA out of memory"),
        MemoryError(),
        KeyError("bug"),
    ],
    ids=["runtime", "oom", "memory", "bug"],
)
def test_tree_probe_lets_real_failures_propagate(exc, monkeypatch):
    """Only "this model cannot take a custom 4D mask" means chains only; any other failure of the masked
    forward (a real bug, out of memory) propagates instead of quietly turning trees off."""
    lm = tiny_lm()
    monkeypatch.setattr(lm.model, "forward", _forward_failing_on_4d_mask(lm.model, exc))
    lm.reset([1, 2, 3])
    with pytest.raises(type(exc)):
        lm.extend([4, 5], [-1, -1])
    with pytest.raises(type(exc)):
        lm.trees_unsupported()  # not cached as "unsupported" either


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("too many values to unpack (expected 2)"),
        TypeError("forward() got an unexpected keyword argument"),
        NotImplementedError("custom masks"),
    ],
)
def test_tree_probe_unsupported_mask_gives_the_reason(exc, monkeypatch):
    lm = tiny_lm()
    monkeypatch.setattr(lm.model, "forward", _forward_failing_on_4d_mask(lm.model, exc))
    lm.reset([1, 2, 3])
    want = re.escape(f"custom 4D attention mask fails on it ({type(exc).__name__}: {str(exc)[:20]}")
    with pytest.raises(ValueError, match="chains only.*" + want):
        lm.extend([4, 5], [-1, -1])
    assert lm.extend([4, 5], [-1, 0]).shape[0] == 2  # chains still work


def test_tree_probe_on_a_model_that_unpacks_the_mask_as_2d():
    """Bloom builds its ALiBi bias from a [batch, seq] mask: transformers raises ValueError on a 4D one."""
    from transformers import BloomConfig, BloomForCausalLM

    from speclib.lms.lm import HFLM

    torch.manual_seed(0)
    lm = HFLM(
        BloomForCausalLM(BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4)).eval(),
        None,
        torch.device("cpu"),
    )
    assert lm.trees_unsupported().startswith("a custom 4D attention mask fails on it (ValueError: too many values")


def test_llama_extend_batch_equals_separate_extends():
    """Three requests (different prompt lengths, a tree, a single node, a chain, an earlier pending tree)
    verified in one LlamaLM forward give each what its own extend gives; commits and recorded features stay
    per request; a bad request anywhere records nothing for any."""
    from speclib.lms import LlamaLM

    rng = random.Random(5)
    base = tiny_lm(seed=5, impl="fast")
    lms, solo = [base.view() for _ in range(3)], [base.view() for _ in range(3)]
    for lm in lms[:1] + solo[:1]:
        lm.record_features([0, 2])
    prompts = [[rng.randrange(64) for _ in range(n)] for n in (3, 11, 6)]
    for lm, s, p in zip(lms, solo, prompts):
        assert (lm.reset(p) - s.reset(p)).abs().max() == 0
    for step in range(3):
        toks = [[rng.randrange(64) for _ in range(n)] for n in (4, 1, 3)]
        pars = [[-1, -1, 0, 2], [-1], [-1, 0, 1]]
        together = LlamaLM.extend_batch(lms, toks, pars)
        for s, t, p, out in zip(solo, toks, pars, together):
            assert out.shape == (len(t), 64)
            assert (out - s.extend(t, p)).abs().max() < 1e-5  # float32 GEMMs block differently
        paths = [[0, 2], [0] if step else [], list(range(step % 3 + 1))]
        for lm, s, path in zip(lms, solo, paths):
            lm.commit(path)
            s.commit(path)
    assert torch.allclose(lms[0].committed_features(), solo[0].committed_features(), atol=1e-5)
    assert lms[0].n_committed == solo[0].n_committed
    with pytest.raises(ValueError, match="own LlamaLM"):
        LlamaLM.extend_batch([lms[0], lms[0]], [[1], [2]], [[-1], [-1]])
    other = tiny_lm(seed=6, impl="fast")
    other.reset([1, 2])
    with pytest.raises(ValueError, match="same model"):
        LlamaLM.extend_batch([lms[0], other], [[1], [2]], [[-1], [-1]])
    with pytest.raises(ValueError, match="topological"):
        LlamaLM.extend_batch(lms, [[1], [2], [3]], [[-1], [-1], [5]])
    assert all(not lm.pending_parents for lm in lms)
    for lm, s in zip(lms, solo):
        assert (lm.extend([7], [-1]) - s.extend([7], [-1])).abs().max() < 1e-5


def test_llama_generate_batch_equals_generate():
    """generate_batch over LlamaLM views (continuous batching's machinery) gives each request its own
    generate output, with and without a draft model."""
    from speclib import ModelDrafter, Sampling, generate, generate_batch

    target, draft = tiny_lm(seed=3, impl="fast"), noisy_copy(seed=3, impl="fast")
    prompts = [list(range(1, 30)), [5, 9, 2], list(range(40, 3, -3))]
    greedy = Sampling(0.0)
    ref = [generate(target.view(), p, 20, sampling=greedy).tokens for p in prompts]
    ar = generate_batch([target.view() for _ in prompts], prompts, 20, sampling=greedy)
    assert [g.tokens for g in ar] == ref
    drafters = [ModelDrafter(draft.view(), 3) for _ in prompts]
    sd = generate_batch([target.view() for _ in prompts], prompts, 20, drafters=drafters, sampling=greedy)
    assert [g.tokens for g in sd] == ref


def test_llama_restrict_vocab_scores_only_the_kept_rows_and_stays_lossless_as_a_draft():
    """FR-Spec: a restricted LlamaLM's logits equal the full head's on the kept rows and are -inf elsewhere
    (in extend, in a view, in extend_batch); a restricted draft drafts kept tokens only and leaves greedy
    output equal to the target's own (at temperature 1 it is one more draft distribution q, zero off the
    kept rows, which the lossless rule's residual covers); bad rows are refused."""
    from speclib import ModelDrafter, Sampling, generate

    full, lm = tiny_lm(seed=4, impl="fast"), tiny_lm(seed=4, impl="fast")
    rows = [3, 0, 17, 63, 17, 40]  # unsorted, repeated: taken as the set
    lm.restrict_vocab(rows)
    kept = torch.zeros(64, dtype=torch.bool)
    kept[rows] = True
    ctx = [5, 9, 2, 33]
    want, got = full.reset(ctx), lm.reset(ctx)
    assert torch.isinf(got[~kept]).all() and torch.allclose(got[kept], want[kept], atol=1e-5)
    tree = ([7, 8, 9], [-1, 0, 0])
    want, got = full.extend(*tree), lm.extend(*tree)
    assert torch.isinf(got[:, ~kept]).all() and torch.allclose(got[:, kept], want[:, kept], atol=1e-5)
    views = [lm.view(), lm.view()]
    for v in views:
        v.reset(ctx)
    for out in type(lm).extend_batch(views, [[1, 2], [3]], [[-1, 0], [-1]]):
        assert torch.isinf(out[:, ~kept]).all()
    assert lm.restrict_vocab(None).vocab_rows is None
    for bad in ([], [64], [-1, 2]):
        with pytest.raises(ValueError, match="token ids"):
            tiny_lm(impl="fast").restrict_vocab(bad)
    target, draft = tiny_lm(seed=3, impl="fast"), noisy_copy(seed=3, impl="fast")
    draft.restrict_vocab(range(0, 64, 2))
    prompt = list(range(1, 30))
    d = ModelDrafter(draft.view(), 3)
    d.reset(prompt, Sampling(1.0), torch.Generator().manual_seed(0))
    assert all(t % 2 == 0 for t in d.draft(prompt + [5]).tokens)
    ref = generate(target.view(), prompt, 24, sampling=Sampling(0.0)).tokens
    sd = generate(target.view(), prompt, 24, drafter=ModelDrafter(draft.view(), 3), sampling=Sampling(0.0))
    assert sd.tokens == ref and sum(s["accepted"] for s in sd.stats.steps) > 0


def test_onednn_linear_equals_f_linear():
    """The reordered-weight projection against F.linear: 1, 2, 9 and 33 rows, 3-D input, a bias; a weight
    updated in place or replaced is re-reordered; gradients and non-fp32 weights take the plain module."""
    from speclib.lms import llama

    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 80)
    for shape in [(1, 48), (2, 48), (9, 48), (1, 33, 48)]:
        x = torch.randn(shape)
        with torch.inference_mode():
            assert torch.allclose(llama.linear(lin, x), lin(x), atol=1e-5)
    assert lin in llama._packed  # the oneDNN path was taken
    with torch.no_grad():
        lin.weight.mul_(-2.0)  # in place: a new version of the same tensor
        x = torch.randn(5, 48)
        assert torch.allclose(llama.linear(lin, x), lin(x), atol=1e-5)
        lin.weight = torch.nn.Parameter(torch.randn(80, 48))
        assert torch.allclose(llama.linear(lin, x), lin(x), atol=1e-5)
    y = llama.linear(lin, x)  # gradient wanted: the module itself, so backward works
    y.sum().backward()
    assert lin.weight.grad is not None
    half = torch.nn.Linear(48, 80).to(torch.bfloat16)
    with torch.inference_mode():
        xb = torch.randn(3, 48, dtype=torch.bfloat16)
        assert torch.equal(llama.linear(half, xb), half(xb))
        assert torch.equal(llama.linear(lin, x, packed=False), lin(x))


def test_lean_forward_with_and_without_reordered_weights():
    """The same LlamaLM with oneDNN projections and with plain F.linear: equal logits on a tree extend."""
    from speclib.lms import llama

    lm = tiny_lm(seed=3, impl="fast")
    plain = lm.view()
    plain.packed = False
    ids, tokens, parents = [5, 9, 2, 7], [3, 4, 8, 1, 6], [-1, 0, 0, 2, 3]
    got = [lm.reset(ids), lm.extend(tokens, parents)]
    want = [plain.reset(ids), plain.extend(tokens, parents)]
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-5)
    assert lm.model.model.layers[0].mlp.down_proj in llama._packed
