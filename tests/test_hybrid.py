"""HybridLM (our Qwen3.5 text forward with tree speculation) against transformers' own full forward.

The reference is always ``Qwen3_5ForCausalLM(input_ids=committed + path, use_cache=False)``: no cache,
so on CPU it runs transformers' torch fallbacks (chunked gated delta rule, F.conv1d), an
implementation independent of ours. Tolerance 1e-4 on logits whose spread is O(1) (checked), fp32.
The random weights are perturbed so every part counts: non-trivial norm weights, and slow decays
(A in [0.05, 1]) so that tokens several steps back still move the GDN state.
"""

import random

import pytest
import torch
from conftest import spread_hybrid
from transformers import Qwen3_5ForCausalLM

from speclib.core.tree import path_to
from speclib.lms.hybrid import STRATEGIES, HybridLM, extend_batch, tiny_config

TOL = 1e-4
V = 64


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = Qwen3_5ForCausalLM(tiny_config(initializer_range=0.2)).eval()
    return spread_hybrid(m)


@torch.inference_mode()
def ref_logits(model, seq) -> torch.Tensor:
    """[len(seq), V]: transformers' full forward, no cache."""
    return model(input_ids=torch.tensor([list(seq)]), use_cache=False).logits[0].float()


@pytest.mark.parametrize("n", [1, 3, 17, 70])  # 70 crosses the 64-token prefill chunk
def test_prefill_matches_transformers(model, n):
    g = torch.Generator().manual_seed(n)
    ids = torch.randint(0, V, (n,), generator=g).tolist()
    ref = ref_logits(model, ids)
    assert ref[-1].std() > 0.3  # logits are O(1): 1e-4 is a real test
    ours = HybridLM(model, None, "cpu").reset(ids)
    assert ours.shape == (V,)
    assert (ours - ref[-1]).abs().max() < TOL


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_token_by_token_decode(model, strategy):
    rng = random.Random(1)
    seq = [rng.randrange(V) for _ in range(20)]
    ref = ref_logits(model, seq)  # causal: row t = logits after seq[:t + 1]
    lm = HybridLM(model, None, "cpu", strategy=strategy)
    errs = [(lm.reset(seq[:4]) - ref[3]).abs().max()]
    for t in range(4, len(seq)):
        out = lm.extend([seq[t]], [-1])
        lm.commit([0])
        assert out.shape == (1, V)
        errs.append((out[0] - ref[t]).abs().max())
    assert max(errs) < TOL, max(errs)


def _check_nodes(model, lm, committed, tokens, parents, logits, first):
    """Each new node's logits (rows of `logits`, nodes first..) equal a fresh forward of committed + its path."""
    worst = 0.0
    for r, node in enumerate(range(first, first + logits.shape[0])):
        seq = committed + [tokens[j] for j in path_to(parents, node)]
        worst = max(worst, float((logits[r] - ref_logits(model, seq)[-1]).abs().max()))
    assert worst < TOL, worst
    return worst


@pytest.mark.parametrize("strategy", ["closed_form", "materialize"])
def test_random_trees(model, strategy):
    rng = random.Random(7)
    lm = HybridLM(model, None, "cpu", strategy=strategy)
    committed = [rng.randrange(V) for _ in range(6)]
    lm.reset(committed)
    sensitivity = 0.0
    for _ in range(3):
        tokens, parents = [], []
        for e in range(3):  # several extends, attaching anywhere in the forest
            n = rng.randint(1, 5)
            new_par = [rng.randint(-1, len(parents) + i - 1) for i in range(n)]
            if e == 0 and n >= 2:
                new_par[:2] = [-1, -1]  # at least two roots
            new_tok = [rng.randrange(V) for _ in range(n)]
            first = len(tokens)
            tokens += new_tok
            parents += new_par
            out = lm.extend(new_tok, new_par)
            assert out.shape == (n, V)
            _check_nodes(model, lm, committed, tokens, parents, out, first)
            deep = max(range(first, len(tokens)), key=lambda j: len(path_to(parents, j)))
            if len(path_to(parents, deep)) > 1:  # the same token without its ancestors: must differ
                alone = ref_logits(model, committed + [tokens[deep]])[-1]
                sensitivity = max(sensitivity, float((out[deep - first] - alone).abs().max()))
        pending = [st for st in lm.gdn.values()]
        if strategy == "closed_form":  # factors per node, never a state per node
            assert all(st.k.shape[1] == len(tokens) and not st.states for st in pending)
        else:
            assert all(len(st.states) == len(tokens) for st in pending)
        path = path_to(parents, rng.randrange(len(tokens)))
        lm.commit(path)
        committed += [tokens[j] for j in path]
    assert sensitivity > 100 * TOL  # the comparison can fail
    # After three commits, one more step still matches.
    out = lm.extend([5], [-1])
    assert (out[0] - ref_logits(model, committed + [5])[-1]).abs().max() < TOL


def test_replay_chains(model):
    rng = random.Random(3)
    lm = HybridLM(model, None, "cpu", strategy="replay")
    committed = [rng.randrange(V) for _ in range(5)]
    lm.reset(committed)
    for keep_rule in ("partial", "all", "none"):
        tokens = []
        for _ in range(2):  # a draft chain grown over two extends
            n = rng.randint(2, 4)
            new_tok = [rng.randrange(V) for _ in range(n)]
            new_par = list(range(len(tokens) - 1, len(tokens) + n - 1))
            out = lm.extend(new_tok, new_par)
            _check_nodes(model, lm, committed, tokens + new_tok, list(range(-1, len(tokens) + n - 1)), out, len(tokens))
            tokens += new_tok
        m = {"partial": rng.randint(1, len(tokens) - 1), "all": len(tokens), "none": 0}[keep_rule]
        lm.commit(list(range(m)))
        committed += tokens[:m]
    out = lm.extend([9], [-1])
    assert (out[0] - ref_logits(model, committed + [9])[-1]).abs().max() < TOL
    # Trees are refused, naming the alternative, and leave the state untouched.
    with pytest.raises(ValueError, match="closed_form"):
        lm.extend([1, 2], [-1, -1])
    with pytest.raises(ValueError, match="closed_form"):
        lm.extend([1], [-1])  # a second root beside pending node 0
    out = lm.extend([4], [0])
    assert (out[0] - ref_logits(model, committed + [9, 4])[-1]).abs().max() < TOL


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bad_input(model, strategy):
    lm = HybridLM(model, None, "cpu", strategy=strategy)
    with pytest.raises(RuntimeError, match="reset"):
        lm.extend([1], [-1])
    with pytest.raises(ValueError, match="empty"):
        lm.reset([])
    with pytest.raises(ValueError, match="token ids"):
        lm.reset([1, V])
    committed = [3, 1, 4]
    lm.reset(committed)
    with pytest.raises(ValueError, match="topological"):
        lm.extend([1, 2], [-1, 1])  # a node its own parent
    with pytest.raises(ValueError, match="topological"):
        lm.extend([1], [0])  # no pending node 0 yet
    with pytest.raises(ValueError, match="as many parents"):
        lm.extend([1, 2], [-1])
    with pytest.raises(ValueError, match="token ids"):
        lm.extend([V], [-1])
    out = lm.extend([7, 8], [-1, 0])  # the failed calls left nothing behind
    ref = ref_logits(model, committed + [7, 8])
    assert (out - ref[-2:]).abs().max() < TOL
    for bad in ([1], [0, 0], [2], [-1]):
        with pytest.raises(ValueError, match="commit path"):
            lm.commit(bad)
    lm.commit([0, 1])
    with pytest.raises(ValueError, match="strategy"):
        HybridLM(model, None, "cpu", strategy="tree")


def test_extend_batch_equals_separate_extends(model):
    """Three requests (different prompts, strategies, tree shapes, an earlier pending tree) verified in
    one forward give each request exactly what its own extend gives, and commits stay independent."""
    rng = random.Random(11)
    base = HybridLM(model, None, "cpu")
    lms = [base.view(), base.view(strategy="materialize"), base.view(strategy="replay")]
    solo = [base.view(), base.view(strategy="materialize"), base.view(strategy="replay")]
    prompts = [[rng.randrange(V) for _ in range(n)] for n in (3, 9, 5)]
    for lm, s, p in zip(lms, solo, prompts):
        assert (lm.reset(p) - s.reset(p)).abs().max() == 0
    for step in range(3):
        toks = [[rng.randrange(V) for _ in range(n)] for n in (4, 1, 3)]
        pars = [[-1, -1, 0, 2], [-1], [-1, 0, 1]]  # a forest, one node, a chain (replay)
        together = extend_batch(lms, toks, pars)
        for s, t, p, out in zip(solo, toks, pars, together):
            assert out.shape == (len(t), V)
            assert (out - s.extend(t, p)).abs().max() < TOL  # float32 GEMMs block differently
        paths = [[0, 2], [0] if step else [], list(range(step % 3 + 1))]
        for lm, s, path in zip(lms, solo, paths):
            lm.commit(path)
            s.commit(path)
    with pytest.raises(ValueError, match="own HybridLM"):
        extend_batch([lms[0], lms[0]], [[1], [2]], [[-1], [-1]])
    other = HybridLM(Qwen3_5ForCausalLM(tiny_config()).eval(), None, "cpu")
    other.reset([1, 2])
    with pytest.raises(ValueError, match="same model"):
        extend_batch([lms[0], other], [[1], [2]], [[-1], [-1]])
    # A bad request anywhere in the batch records nothing for any request.
    with pytest.raises(ValueError, match="topological"):
        extend_batch(lms, [[1], [2], [3]], [[-1], [-1], [5]])
    assert all(not lm.pending_parents for lm in lms)
    for lm, s in zip(lms, solo):
        assert (lm.extend([7], [-1]) - s.extend([7], [-1])).abs().max() < TOL


def test_skip_attention_is_the_linear_subgraph(model):
    """skip_attention=True equals transformers' forward of the same model with its full-attention
    decoder layers removed (the self-speculative draft of component-aware speculation)."""
    import copy

    ablated = copy.deepcopy(model)
    keep = [i for i, t in enumerate(model.config.layer_types) if t == "linear_attention"]
    ablated.model.layers = torch.nn.ModuleList(ablated.model.layers[i] for i in keep)
    ablated.config.layer_types = ["linear_attention"] * len(keep)
    ablated.config.num_hidden_layers = len(keep)
    for j, layer in enumerate(ablated.model.layers):
        layer.linear_attn.layer_idx = j
    rng = random.Random(5)
    committed = [rng.randrange(V) for _ in range(7)]
    lm = HybridLM(model, None, "cpu").view(skip_attention=True)
    assert lm.kv == {} or lm.kv is None
    assert (lm.reset(committed) - ref_logits(ablated, committed)[-1]).abs().max() < TOL
    full = HybridLM(model, None, "cpu").reset(committed)
    assert (lm.reset(committed) - full).abs().max() > 100 * TOL  # skipping the layers matters
    tokens, parents = [4, 9, 2, 6], [-1, 0, 0, 2]
    out = lm.extend(tokens, parents)
    _check_nodes(ablated, lm, committed, tokens, parents, out, 0)
