"""Layer-subset self-speculation (speclib.drafters.layers) on a tiny random hybrid.

The model is a Qwen3.5 text hybrid with 8 decoder layers (GDN x3, attention, GDN x3, attention),
vocab 64, hidden 32, its weights perturbed as in test_hybrid so every part counts and the
distributions are far from uniform. The slow twin of a subset view is transformers' own model with
the skipped decoder layers removed from its ModuleList (its own modules, no cache, torch fallbacks),
with the exit adapter hooked in front of its final norm.

Statistical test: a chi-square statistic over whole runs with a paired permutation p-value, asserted
at alpha = 1e-3 on fixed seeds, i.e. a 0.1% false-positive rate under the null (lossless drafting);
with the seeds fixed the outcome is the same on every run. A power check beside it: the same test
rejects the subset's own samples against the target's.
"""

import copy
import random

import numpy as np
import pytest
import torch
from conftest import KeepFirstBranch, spread_hybrid, tiny_lm
from transformers import Qwen3_5ForCausalLM

from speclib import Sampling, generate
from speclib.core.analytic import predicted_speedup
from speclib.drafters.layers import KINDS, ExitAdapter, LayerSkipDrafter, subset
from speclib.lms.hybrid import HybridLM, extend_batch, tiny_config
from speclib.research.bench_tree import heldout_loss
from speclib.research.layer_search import (
    SubsetSearch,
    acceptance_proxy,
    flop_cost,
    proxy_measure,
    search_subsets,
    subset_loss,
    train_exit,
)
from speclib.research.stats import run_permutation_test

TOL = 1e-4
V = 64
GREEDY, T1 = Sampling(0.0), Sampling(1.0)
PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]]
SUBSETS = {
    "all": ("all", None),
    "linear": ("linear", None),
    "linear_early_exit": ("linear_early_exit", 3),
    "every_other": ("every_other", None),
    "first_n": ("first_n", 3),
}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = Qwen3_5ForCausalLM(tiny_config(num_hidden_layers=8, initializer_range=0.2)).eval()
    return spread_hybrid(m)


@pytest.fixture(scope="module")
def target(model):
    return HybridLM(model, None, "cpu")


def random_adapter(seed=0, rank=4):
    """An exit adapter whose up projection is not zero, so it changes the logits."""
    torch.manual_seed(seed)
    a = ExitAdapter(32, rank)
    with torch.no_grad():
        a.up.weight.normal_(0.0, 0.3)
    return a.eval()


def ablated(model, layers, exit=None):
    """transformers' model running only `layers` (the others removed), `exit` before its final norm."""
    m = copy.deepcopy(model)
    types = [model.config.layer_types[i] for i in layers]
    m.model.layers = torch.nn.ModuleList(m.model.layers[i] for i in layers)
    m.config.layer_types, m.config.num_hidden_layers = types, len(layers)
    for j, layer in enumerate(m.model.layers):
        (layer.linear_attn if types[j] == "linear_attention" else layer.self_attn).layer_idx = j
    if exit is not None:
        m.model.norm.register_forward_pre_hook(lambda mod, args: (exit(args[0]),))
    return m


@torch.inference_mode()
def ref_logits(model, seq) -> torch.Tensor:
    return model(input_ids=torch.tensor([list(seq)]), use_cache=False).logits[0].float()


def assert_tree_matches(view, twin, committed):
    """A tree of pending nodes extended on `view` (after `committed`) equals `twin`'s forward of
    committed + each node's path."""
    tokens, parents = [4, 9, 2, 6], [-1, 0, 0, 2]
    out = view.extend(tokens, parents)
    for j in range(len(tokens)):
        path, p = [], j
        while p >= 0:
            path.append(tokens[p])
            p = parents[p]
        assert (out[j] - ref_logits(twin, committed + path[::-1])[-1]).abs().max() < TOL


# --- the view -------------------------------------------------------------------------------------------
def test_view_with_every_layer_is_the_full_model(target):
    tokens, parents = [4, 9, 2, 6, 1], [-1, 0, 0, 2, -1]
    view = target.view(layers=range(8))
    assert view.layers == target.layers and view.model is target.model
    assert torch.equal(view.reset(PROMPTS[2]), target.reset(PROMPTS[2]))
    assert torch.equal(view.extend(tokens, parents), target.extend(tokens, parents))


@pytest.mark.parametrize(
    "layers,exit",
    [
        ([0, 1, 2, 4, 5, 6], None),
        ([0, 2, 4, 6], None),
        ([0, 1, 2], None),
        ([1, 3, 6], None),
        ([0, 1, 2, 4], "adapter"),
        ([7], "adapter"),
    ],
)
def test_subset_equals_transformers_layer_by_layer(model, target, layers, exit):
    """Prefill and a tree of pending nodes on the subset view equal transformers' forward of the model
    with the other layers removed (every pending node against committed + its path)."""
    adapter = random_adapter() if exit else None
    twin = ablated(model, layers, adapter)
    view = target.view(layers=layers, exit=adapter)
    committed = [random.Random(5).randrange(V) for _ in range(9)]
    got = view.reset(committed)
    assert (got - ref_logits(twin, committed)[-1]).abs().max() < TOL
    assert (got - target.reset(committed)).abs().max() > 100 * TOL  # the skipped layers matter
    assert_tree_matches(view, twin, committed)


def test_skip_attention_stays_a_shorthand(target):
    lin = target.view(skip_attention=True)
    assert lin.layers == subset(target, "linear") == [0, 1, 2, 4, 5, 6] and lin.skip_attention
    assert target.view(layers=[0, 2]).view().layers == [0, 2]  # a view keeps its subset
    assert lin.view(skip_attention=False).layers == list(range(8))
    a = random_adapter()
    assert target.view(layers=[0, 2], exit=a).view().exit is a
    assert target.view(layers=[0, 2], exit=a).view(exit=None).exit is None
    assert target.view(layers=np.array([4, 0])).layers == [0, 4]  # any ints, run in model order
    sub, full = target.view(layers=[0, 2]), target.view()
    sub.reset([1, 2])
    full.reset([1, 2])
    with pytest.raises(ValueError, match="same model, layers and exit"):  # one forward runs one subset
        extend_batch([sub, full], [[1], [2]], [[-1], [-1]])


def test_subset_kinds(target):
    assert set(SUBSETS) == set(KINDS)  # every kind runs in test_greedy_sd_equals_ar
    assert subset(target, "all") == list(range(8))
    assert subset(target, "linear_early_exit", 3) == [0, 1, 2, 4]
    assert subset(target, "every_other") == [0, 2, 4, 6]
    assert subset(target, "first_n", 3) == [0, 1, 2]
    with pytest.raises(ValueError, match="kind must be one of"):
        subset(target, "middle")
    with pytest.raises(ValueError, match=r"needs n, an int in \[1, 7\]"):
        subset(target, "linear_early_exit")
    with pytest.raises(ValueError, match=r"needs n, an int in \[1, 8\]"):
        subset(target, "first_n", 9)
    with pytest.raises(ValueError, match="takes no n"):
        subset(target, "linear", 2)
    with pytest.raises(ValueError, match="leaves no decoder layer"):
        subset(
            HybridLM(Qwen3_5ForCausalLM(tiny_config(layer_types=["full_attention"] * 4)).eval(), None, "cpu"), "linear"
        )


@pytest.mark.parametrize(
    "layers,match",
    [
        ([], "empty subset"),
        ([8], r"ints in \[0, 8\)"),
        ([-1, 2], r"ints in \[0, 8\)"),
        ([1, 1], "repeat"),
        (["a"], r"ints in \[0, 8\)"),
    ],
)
def test_bad_layer_subsets_are_value_errors(target, layers, match):
    with pytest.raises(ValueError, match=match):
        target.view(layers=layers)
    with pytest.raises(ValueError, match=match):
        LayerSkipDrafter(target, layers, k=2)
    with pytest.raises(ValueError, match=match):
        subset_loss(target, layers, [[1, 2, 3]])


def test_bad_inputs(target):
    with pytest.raises(ValueError, match="not both"):
        HybridLM(target.model, None, "cpu", skip_attention=True, layers=[0])
    with pytest.raises(TypeError, match="HybridLM or a LlamaLM"):
        LayerSkipDrafter(object(), [0])
    with pytest.raises(ValueError, match="k"):
        LayerSkipDrafter(target, [0], k=0)
    with pytest.raises(ValueError, match="rank"):
        ExitAdapter(32, 0)
    with pytest.raises(ValueError, match="budget"):
        search_subsets(target, None, lambda layers, prompts: (0.5, 0.5), budget=0)
    with pytest.raises(ValueError, match="must return"):
        search_subsets(target, None, lambda layers, prompts: (float("nan"), 0.5), budget=3)
    with pytest.raises(ValueError, match="windows"):
        subset_loss(target, [0], [[1, 2], [3]])
    with pytest.raises(ValueError, match="windows"):
        acceptance_proxy(target, [0], [])
    with pytest.raises(ValueError, match="stream"):
        train_exit(target, [0, 1], np.arange(10), steps=1, seq=16)


# --- decoding -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [*SUBSETS, "explicit+exit"])
def test_greedy_sd_equals_ar(target, name):
    if name == "explicit+exit":
        layers, exit = [0, 3, 4, 5], random_adapter(1)
    else:
        layers, exit = subset(target, *SUBSETS[name]), None
    for p in PROMPTS:
        ar = generate(target, p, 16, sampling=GREEDY).tokens
        sd = generate(target, p, 16, drafter=LayerSkipDrafter(target, layers, k=3, exit=exit), sampling=GREEDY)
        assert sd.tokens == ar
        if name == "all":  # the full model drafting for itself: every block accepted
            assert sd.stats.acceptance_rate == 1.0
    d = LayerSkipDrafter(target, layers, k=2, exit=exit)
    assert d.lm.model is target.model and d.lm.layers == layers and d.lm.exit is exit


def test_permutation_chi_square_ar_vs_subset_sd(model):
    """24 seeded runs of 20 tokens each, AR vs SD drafted by the linear subgraph (k = 2) at temperature
    1, on a copy of the model whose LM head is scaled by 8 (peaked distributions, so the subset's own
    distribution is far from the target's). Tokens inside a run are dependent, so the chi-square
    statistic gets a paired permutation p-value over runs (999 permutations): asserting p > 1e-3 has a
    0.1% false-positive rate under the null (lossless drafting). Power: the same test must reject the
    subset's own samples (p < 1e-2), i.e. a drafter whose tokens went out uncorrected, and (negative
    control) the same SD under a wrong rule that keeps every draft token (p < 1e-2)."""
    sharp = copy.deepcopy(model)
    with torch.no_grad():
        sharp.lm_head.weight.mul_(8)
    target = HybridLM(sharp, None, "cpu")
    layers = subset(target, "linear")

    def runs(lm, make, seed0, acceptor=None):
        return [
            generate(
                lm, [3, 1, 4], 20, drafter=make() if make else None, sampling=T1, seed=seed0 + s, acceptor=acceptor
            )
            for s in range(24)
        ]

    ar = [g.tokens for g in runs(target, None, 0)]
    sd = runs(target, lambda: LayerSkipDrafter(target, layers, k=2), 10**6)
    accepted = sum(s["accepted"] for g in sd for s in g.stats.steps)
    drafted = sum(s["drafted"] for g in sd for s in g.stats.steps)
    assert 0 < accepted < drafted  # both acceptances and rejections
    assert run_permutation_test(ar, [g.tokens for g in sd], n_perm=999, seed=0).p_permutation > 1e-3
    own = [g.tokens for g in runs(target.view(layers=layers), None, 2 * 10**6)]
    assert run_permutation_test(ar, own, n_perm=999, seed=0).p_permutation < 1e-2
    # negative control: the same SD under a rule that keeps every draft token (KeepFirstBranch on a chain)
    kept = [g.tokens for g in runs(target, lambda: LayerSkipDrafter(target, layers, k=2), 10**6, KeepFirstBranch())]
    assert run_permutation_test(ar, kept, n_perm=999, seed=0).p_permutation < 1e-2


# --- measurements, search, exit training -----------------------------------------------------------------
def test_subset_loss_is_heldout_loss_on_the_view(target):
    g = np.random.default_rng(0)
    windows = [g.integers(0, V, 24).tolist() for _ in range(3)]
    for layers in ([0, 2, 4, 6], list(range(8))):
        assert subset_loss(target, layers, windows) == pytest.approx(
            heldout_loss(target.view(layers=layers), windows), abs=1e-6
        )
    assert acceptance_proxy(target, range(8), windows) == pytest.approx(1.0, abs=1e-5)
    assert acceptance_proxy(target, range(8), windows, temperature=0) == 1.0
    assert 0 < acceptance_proxy(target, [0, 2], windows) < 1


def test_costs_against_context(target):
    assert flop_cost(target, range(8)) == pytest.approx(1.0)
    lin = subset(target, "linear")
    # Attention's per-token work grows with the context, the GDN layers' does not.
    assert flop_cost(target, lin, 4096) < flop_cost(target, lin, 128) < 1


def test_search_respects_its_budget_and_never_loses(target):
    # A fake measure: acceptance falls by 3% per layer dropped; the attention layers 3 and 7 cost 10 and
    # 12 GDN layers. Budget 12 = the start + round 1 (drop each of the 8 layers) + 3 of round 2.
    cost = {i: {3: 10.0, 7: 12.0}.get(i, 1.0) for i in range(8)}

    def fake(layers, prompts):
        return 0.97 ** (8 - len(layers)), sum(cost[i] for i in layers) / sum(cost.values())

    calls = []
    r = search_subsets(target, "p", lambda l, p: (calls.append(p), fake(l, p))[1], budget=12, k=2)
    assert isinstance(r, SubsetSearch) and r.evaluations == len(calls) == 12 and set(calls) == {"p"}
    assert r.start == list(range(8)) and r.start_predicted == pytest.approx(1.0)  # a = 1, c = 1, v = 1
    round1 = [[j for j in range(8) if j != i] for i in range(8)]
    round2 = [[j for j in range(7) if j != i] for i in range(3)]  # from the winner: 7 dropped
    assert [h["layers"] for h in r.history] == [list(range(8))] + round1 + round2
    best = max(r.history, key=lambda h: h["predicted"])
    assert r.layers == best["layers"] and r.predicted == best["predicted"] > r.start_predicted
    for h in r.history:
        a, c = fake(h["layers"], None)
        assert h["predicted"] == pytest.approx(predicted_speedup(a, 2, c, 1.0))
    g = np.random.default_rng(1)
    windows = [g.integers(0, V, 16).tolist() for _ in range(2)]
    r = search_subsets(target, None, proxy_measure(target, windows), budget=5, k=2, start=subset(target, "linear"))
    assert r.evaluations == 5 and r.predicted >= r.start_predicted and r.start == subset(target, "linear")
    one = search_subsets(target, None, fake, budget=1)
    assert one.evaluations == 1 and one.layers == list(range(8))


def test_exit_adapter_starts_as_identity_and_training_lowers_kl(target):
    layers = [0, 1, 2]
    plain, adapted = target.view(layers=layers), target.view(layers=layers, exit=ExitAdapter(32, 8))
    assert torch.equal(plain.reset(PROMPTS[0]), adapted.reset(PROMPTS[0]))
    before = {k: v.clone() for k, v in target.model.state_dict().items()}
    stream = np.random.default_rng(0).integers(0, V, 4000).astype(np.int16)
    adapter, rep = train_exit(target, layers, stream, steps=25, rank=8, batch=4, seq=32, lr=1e-2, n_eval=4)
    assert rep["steps"] == 25 and rep["kl_after"] < 0.95 * rep["kl_before"]
    assert rep["acceptance_after"] > rep["acceptance_before"]
    after = target.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the target is untouched
    assert all(p.grad is None for p in target.model.parameters())
    # The trained exit drafts losslessly.
    for p in PROMPTS[:2]:
        ar = generate(target, p, 16, sampling=GREEDY).tokens
        assert (
            generate(target, p, 16, drafter=LayerSkipDrafter(target, layers, 3, exit=adapter), sampling=GREEDY).tokens
            == ar
        )


# --- the same self-drafts on a Llama (speclib.lms.LlamaLM) ------------------------------------------------
@pytest.fixture(scope="module")
def llama():
    """A tiny random Llama with its weights spread (std 0.2), so its layers change the distribution a lot."""
    lm = tiny_lm(32, 4, seed=3, impl="fast")
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for w in lm.model.parameters():
            if w.dim() == 2:
                w.copy_(0.2 * torch.randn(w.shape, generator=g))
    return lm


def ablated_llama(model, layers, exit=None):
    """transformers' Llama running only `layers` (the others removed), `exit` before its final norm."""
    m = copy.deepcopy(model)
    m.model.layers = torch.nn.ModuleList(m.model.layers[i] for i in layers)
    m.config.num_hidden_layers = len(layers)
    for j, layer in enumerate(m.model.layers):
        layer.self_attn.layer_idx = j
    if exit is not None:
        m.model.norm.register_forward_pre_hook(lambda mod, args: (exit(args[0]),))
    return m


@pytest.mark.parametrize("layers,exit", [([0, 1, 2, 3], None), ([0, 2], None), ([1], "adapter"), ([0, 3], "adapter")])
def test_llama_subset_equals_transformers_layer_by_layer(llama, layers, exit):
    adapter = random_adapter() if exit else None
    twin = ablated_llama(llama.model, layers, adapter)
    view = llama.view(layers=layers, exit=adapter)
    assert view.model is llama.model and view.layers == layers and view.kv.shape[0] == len(layers)
    committed = [random.Random(5).randrange(V) for _ in range(9)]
    got = view.reset(committed)
    assert (got - ref_logits(twin, committed)[-1]).abs().max() < TOL
    if len(layers) < 4 or exit:
        assert (got - llama.reset(committed)).abs().max() > 100 * TOL  # the skipped layers matter
    assert_tree_matches(view, twin, committed)
    assert view.view().layers == layers and view.view(exit=None).exit is None  # views keep the subset


def test_llama_self_draft_is_lossless_and_its_exit_trains(llama):
    assert subset(llama, "first_n", 2) == [0, 1] and subset(llama, "every_other") == [0, 2]
    with pytest.raises(ValueError, match="no decoder layer"):
        subset(llama, "linear")  # a Llama has no linear-attention layer
    adapter, rep = train_exit(
        llama, [0, 1], np.random.default_rng(0).integers(0, V, 3000), steps=25, rank=8, batch=4, seq=32, lr=1e-2
    )
    assert rep["kl_after"] < 0.95 * rep["kl_before"] and rep["acceptance_after"] > rep["acceptance_before"]
    for p in PROMPTS:
        ar = generate(llama, p, 16, sampling=GREEDY).tokens
        for exit in (None, adapter):
            d = LayerSkipDrafter(llama, [0, 1], k=3, exit=exit)
            assert generate(llama, p, 16, drafter=d, sampling=GREEDY).tokens == ar
    with pytest.raises(ValueError, match="same model, layers and exit"):
        type(llama).extend_batch([llama.view(), llama.view(layers=[0])], [[1], [2]], [[-1], [-1]])
