"""Feature-level drafting (EAGLE style): the targets' feature capability, the head drafting through
`HeadLM` exactly as it was trained, greedy identity, losslessness at temperature 1, tree budgets,
bad inputs, saving / loading and training.

Models are random tiny ones: a Llama target (lean `LlamaLM` and stock `HFLM`) whose output head is
sharpened (random tiny models are nearly uniform), and a Qwen3.5 text hybrid target. Heads are
trained for a few hundred steps on random token streams (about 2 s each), enough for the head to
agree with its target often, so accepted paths and partial commits are exercised.
Statistical tests: two-sample chi-square at alpha = 1e-3 on fixed seeds, i.e. a 0.1% false-positive
rate per assertion under the null (lossless drafting); with the seeds fixed the outcome is the same
on every run.
"""

import numpy as np
import pytest
import torch
from conftest import KeepFirstBranch, tiny_lm
from transformers import Qwen3_5ForCausalLM

import speclib
from speclib import FeatureDrafter, FeatureLM, Sampling, generate
from speclib.drafters import frequent_tokens
from speclib.lms.head import load_head, new_head, save_head
from speclib.lms.hybrid import HybridLM, tiny_config
from speclib.research.heads import fit, target_pass, unrolled_loss, unrolled_states
from speclib.research.stats import chi2_two_sample

GREEDY, T1 = Sampling(0.0), Sampling(1.0)
PROMPTS = [[1, 2, 3], [5, 9, 2, 33], list(range(20))]


def llama_target(impl="fast", seed=0):
    lm = tiny_lm(32, 2, seed=seed, impl=impl)
    with torch.no_grad():
        lm.model.lm_head.weight.mul_(40)
    return lm


def hybrid_target():
    torch.manual_seed(0)
    return HybridLM(Qwen3_5ForCausalLM(tiny_config(initializer_range=0.1)).eval(), None, "cpu")


def trained_head(target, steps=300, state_dir=None):
    head = new_head(target, "tiny")
    stream = np.random.default_rng(0).integers(0, target.vocab_size, 20000).astype(np.int16)
    fit(
        target,
        head,
        stream,
        stream[:2000],
        state_dir,
        steps=steps,
        batch=4,
        seq=32,
        lr=3e-3,
        autocast=False,
        eval_every=10**6,
        n_eval=4,
        log=lambda m: None,
    )
    return head.eval()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The fast and HF views of one tiny Llama (same weights) and a head trained on it."""
    fast, hf = llama_target("fast"), llama_target("hf")
    return fast, hf, trained_head(fast, state_dir=tmp_path_factory.mktemp("llama_head"))


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    target = hybrid_target()
    return target, trained_head(target, steps=150, state_dir=tmp_path_factory.mktemp("hybrid_head"))


# --- the feature capability ----------------------------------------------------------------------
def fresh_hidden(lm, ids, layers):
    """transformers' own hidden states over `ids`, concatenated as FeatureLM records them."""
    with torch.no_grad():
        hs = lm.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    return torch.cat([hs[l][0] for l in layers], -1).float()


@pytest.mark.parametrize("kind", ["fast", "hf", "hybrid"])
def test_features_equal_a_fresh_forward(kind):
    """After a prefill, a chain, a tree with a partial commit through a second sibling, and an
    autoregressive step, the committed features equal a fresh forward's hidden states."""
    lm = hybrid_target() if kind == "hybrid" else llama_target(kind)
    assert isinstance(lm, FeatureLM)
    L = lm.num_layers
    layers = (0, 1, L)
    with pytest.raises(RuntimeError, match="record_features"):
        lm.reset([1, 2])
        lm.committed_features()
    lm.record_features(layers)
    seq = [3, 1, 4, 1, 5]
    lm.reset(seq)
    lm.extend([9, 2, 6], [-1, 0, 1])
    lm.commit([0, 1])  # chain, partial accept
    seq += [9, 2]
    lm.extend([7, 8, 10, 11], [-1, -1, 1, 2])
    lm.commit([1, 2])  # tree: second sibling's path
    seq += [8, 10]
    lm.extend([12], [-1])
    lm.commit([0])
    seq += [12]
    want = fresh_hidden(lm, seq, layers)
    tol = dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lm.committed_features(0), want, **tol)
    torch.testing.assert_close(lm.committed_features(6), want[6:], **tol)
    assert lm.committed_features(0).shape == (len(seq), len(layers) * lm.hidden_size)
    with pytest.raises(ValueError, match="feature layers"):
        lm.record_features((L + 1,))
    lm.record_features(None)  # off again: plain decoding
    lm.reset(seq)
    with pytest.raises(RuntimeError, match="record_features"):
        lm.committed_features()


def test_head_drafts_as_it_was_trained(llama):
    """HeadLM's draft logits at steps 1..3 (true features, then the head's own states) equal the
    unrolled training computation's for the same anchor and tokens."""
    target, _, head = llama
    x = torch.tensor([[7, 3, 9, 1, 4, 1, 5, 9, 2, 6, 5, 3]])
    states = unrolled_states(
        head, target.frozen_parts()[0], x, target_pass(target.model, x, head.feature_layers, autocast=False)[0], 3
    )
    _, norm, lm_head = target.frozen_parts()
    c = 6  # anchor slot: (f_5, t_6)
    d = FeatureDrafter(target, head, k=3)
    target.reset(x[0, :c].tolist())
    d.lm.reset(x[0, :c].tolist())
    got = [d.lm.extend([int(x[0, c])], [-1])[0]]
    for s in range(1, 3):
        got.append(d.lm.extend([int(x[0, c + s])], [s - 1])[0])
    for s, row in enumerate(got):
        want = lm_head(norm(states[s][0, c + s - 1])).float()
        torch.testing.assert_close(row, want, atol=1e-4, rtol=1e-4)


def test_truncated_vocab_training_is_the_renormalized_full_objective(llama):
    """Training over a token subset (FR-Spec's vocabulary): the target's pass gives the full
    distribution renormalized over the rows, features unchanged; over every row, the loss is the full one."""
    target, _, head = llama
    x = torch.tensor([[7, 3, 9, 1, 4, 1, 5, 9, 2, 6, 5, 3], [2, 2, 8, 1, 0, 4, 4, 6, 3, 9, 1, 7]])
    layers, parts = head.feature_layers, target.frozen_parts()
    feats, top, logp = target_pass(target.model, x, layers, autocast=False)
    rows = torch.tensor([0, 3, 5, 9, 17, 40, target.vocab_size - 1])
    f_r, top_r, logp_r = target_pass(target.model, x, layers, autocast=False, rows=rows)
    torch.testing.assert_close(f_r, feats)
    torch.testing.assert_close(top_r, top)
    torch.testing.assert_close(logp_r, torch.log_softmax(logp[..., rows], -1), atol=1e-5, rtol=1e-5)
    every = torch.arange(target.vocab_size)
    with torch.no_grad():
        full, ces, agree = unrolled_loss(head, parts, x, feats, top, logp, 3)
        same, ces2, agree2 = unrolled_loss(
            head, parts, x, *target_pass(target.model, x, layers, False, every), 3, every
        )
        sub = unrolled_loss(head, parts, x, f_r, top_r, logp_r, 3, rows)[0]
    torch.testing.assert_close(same, full, atol=1e-5, rtol=1e-5)
    assert np.allclose(ces2, ces, atol=1e-5) and agree2 == agree
    assert torch.isfinite(sub) and not torch.isclose(sub, full)


# --- decoding ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("tree", [None, 8], ids=["chain", "tree"])
@pytest.mark.parametrize("kind", ["fast", "hf", "hybrid"])
def test_greedy_sd_equals_ar(llama, hybrid, kind, tree):
    target, head = hybrid if kind == "hybrid" else (llama[0 if kind == "fast" else 1], llama[2])
    d = FeatureDrafter(target, head, k=4, tree=tree)
    accepted = 0
    for p in PROMPTS:
        ar = generate(target, p, 30, sampling=GREEDY).tokens
        sd = generate(target, p, 30, drafter=d, sampling=GREEDY)
        assert sd.tokens == ar
        accepted += sum(s["accepted"] for s in sd.stats.steps)
    assert accepted > 0  # accepted paths and partial commits exercised


class Recording(FeatureDrafter):
    def draft(self, context):
        tree = super().draft(context)
        self.trees.append(tree)
        return tree


@pytest.mark.parametrize("budget,k", [(1, 3), (5, 4), (12, 5)])
def test_tree_respects_the_node_budget(llama, budget, k):
    target, _, head = llama
    d = Recording(target, head, k=k, tree=budget, top=3)
    d.trees = []
    assert d.max_nodes == budget
    for sampling in (GREEDY, T1):
        generate(target, [3, 1, 4], 24, drafter=d, sampling=sampling)
    assert d.trees
    for tree in d.trees:
        assert 0 < len(tree) <= budget and max(tree.depths()) < k
        assert tree.q.shape == (len(tree), target.vocab_size)
        for kids in tree.children:
            assert len(kids) <= 3 and len({tree.tokens[c] for c in kids}) == len(kids)


@pytest.mark.parametrize("tree", [None, 6], ids=["chain", "tree"])
def test_chi_square_ar_vs_feature_sd(llama, tree):
    """Token at new-token index 4 over 800 independent seeded runs (i.i.d.), AR vs feature-head SD at
    temperature 1: two-sample chi-square, alpha = 1e-3 (0.1% false-positive rate under the null).
    Negative control (chains and trees): the same test rejects a rule that keeps the first drafted node."""
    target, _, head = llama
    d = FeatureDrafter(target, head, k=3, tree=tree)

    def token_at(drafter, seed0, acceptor=None):
        return [
            generate(target, [3, 1, 4], 5, drafter=drafter, sampling=T1, seed=seed0 + s, acceptor=acceptor).tokens[4]
            for s in range(800)
        ]

    ar = token_at(None, 0)
    assert chi2_two_sample(ar, token_at(d, 10**6)).p > 1e-3

    def accept_first(t, p, greedy, gen):  # keeps the first drafted node whatever p says: not lossless
        return (
            ([0], speclib.core.sampling.sample(p[1], gen)) if len(t) else ([], speclib.core.sampling.sample(p[0], gen))
        )

    assert chi2_two_sample(ar, token_at(d, 10**6, accept_first)).p < 1e-3


# --- FR-Spec: a truncated drafting vocabulary ----------------------------------------------------
def test_truncated_vocab_scores_are_the_full_heads_rows(llama):
    """HeadLM.scores with vocab = the full LM head's logits on those rows (the slow twin), -inf elsewhere;
    frequent_tokens ranks by count with ties broken by id."""
    target, _, head = llama
    rows = torch.tensor([0, 5, 6, 31, 63])
    d = FeatureDrafter(target, head, k=3, vocab=rows)
    h = torch.randn(4, target.hidden_size)
    full = target.frozen_parts()[2](h).float()
    got = d.lm.scores(h)
    torch.testing.assert_close(got[:, rows], full[:, rows])
    mask = torch.ones(target.vocab_size, dtype=torch.bool)
    mask[rows] = False
    assert torch.isinf(got[:, mask]).all() and (got[:, mask] < 0).all()
    assert frequent_tokens(torch.tensor([3, 9, 3, 0, 9]), 3).tolist() == [0, 1, 4]  # 9, 9, then the first 3
    assert frequent_tokens(torch.tensor([1, 0, 2, 2]), 2).tolist() == [2, 3]


@pytest.mark.parametrize("tree", [None, 6], ids=["chain", "tree"])
def test_truncated_vocab_stays_lossless(llama, tree):
    """A drafting vocabulary that leaves out half the tokens, among them some AR picks: greedy output still
    equals AR; at temperature 1 the token at new-token index 4 over 800 seeded runs passes the two-sample
    chi-square against AR (alpha = 1e-3: a 0.1% false-positive rate under the null). Negative control: the
    same test rejects the same drafter under a rule that keeps every draft token of the first branch."""
    target, _, head = llama
    ar_runs = [generate(target, p, 30, sampling=GREEDY).tokens for p in PROMPTS]
    picked = sorted({t for r in ar_runs for t in r})
    vocab = [t for t in range(target.vocab_size) if t % 2 == 0]
    assert set(picked) - set(vocab)  # some target tokens cannot be drafted
    d = FeatureDrafter(target, head, k=3, tree=tree, vocab=vocab)
    accepted = 0
    for p, ar in zip(PROMPTS, ar_runs):
        sd = generate(target, p, 30, drafter=d, sampling=GREEDY)
        assert sd.tokens == ar
        accepted += sum(s["accepted"] for s in sd.stats.steps)
    assert accepted > 0
    ar_t = [generate(target, [3, 1, 4], 5, sampling=T1, seed=s).tokens[4] for s in range(800)]
    sd_t = [generate(target, [3, 1, 4], 5, drafter=d, sampling=T1, seed=10**6 + s).tokens[4] for s in range(800)]
    assert chi2_two_sample(ar_t, sd_t).p > 1e-3
    bad = KeepFirstBranch()
    bad_t = [
        generate(target, [3, 1, 4], 5, drafter=d, sampling=T1, seed=10**6 + s, acceptor=bad).tokens[4]
        for s in range(800)
    ]
    assert chi2_two_sample(ar_t, bad_t).p < 1e-3
    with pytest.raises(ValueError, match="vocab"):
        FeatureDrafter(target, head, vocab=[1, 1, 2])
    with pytest.raises(ValueError, match="vocab"):
        FeatureDrafter(target, head, vocab=[target.vocab_size])


# --- bad input --------------------------------------------------------------------------------------
def test_bad_inputs(llama):
    target, hf, head = llama
    for bad in (dict(k=0), dict(k=-1), dict(k=2.0), dict(tree=0), dict(tree=-3), dict(top=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            FeatureDrafter(target, head, **bad)
    other = llama_target("fast", seed=5)  # same shapes, other weights
    with pytest.raises(ValueError, match="trained for 'tiny'"):
        FeatureDrafter(other, head)
    d = FeatureDrafter(target, head)
    with pytest.raises(ValueError, match="built with"):
        generate(hf, [1, 2], 5, drafter=d)  # features come from the drafter's own target
    wrapped = speclib.StatefulLM(target.model, None, torch.device("cpu"))
    assert not isinstance(wrapped, FeatureLM)
    with pytest.raises(ValueError, match="FeatureLM"):
        FeatureDrafter(wrapped, head)
    with pytest.raises(ValueError, match="unknown head"):
        load_head("no-such-head")


# --- saving, loading, training ----------------------------------------------------------------------
def test_save_load_round_trip(llama, tmp_path):
    target, _, head = llama
    save_head(head, tmp_path / "h")
    back = load_head(tmp_path / "h")
    assert back.config == head.config and back.feature_layers == head.feature_layers
    for (name, a), (_, b) in zip(head.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a.to(torch.bfloat16).float(), b), name  # stored in bf16
    assert "tiny" not in speclib.checkpoints()
    ar = generate(target, [1, 2, 3], 20, sampling=GREEDY).tokens
    assert generate(target, [1, 2, 3], 20, drafter=FeatureDrafter(target, back, k=3), sampling=GREEDY).tokens == ar


def test_training_reduces_loss_and_resumes(tmp_path):
    target = llama_target("fast", seed=3)
    head = new_head(target, "tiny")
    stream = np.random.default_rng(1).integers(0, 64, 8000).astype(np.int16)
    logs = []
    kw = dict(batch=4, seq=32, lr=3e-3, autocast=False, eval_every=40, n_eval=4, log=logs.append)
    st = fit(target, head, stream, stream[:1000], tmp_path, steps=80, **kw)
    ce = [e["ce"][0] for e in st["evals"]]
    assert st["step"] == 80 and (tmp_path / "state.pt").exists()
    st0 = fit(target, new_head(target, "tiny"), stream, stream[:1000], tmp_path / "fresh", steps=1, **kw)
    assert ce[-1] < st0["evals"][0]["ce"][0] - 0.1  # trained vs one step from initialisation
    again = new_head(target, "tiny")
    st2 = fit(target, again, stream, stream[:1000], tmp_path, steps=90, **kw)
    assert any("resumed at step 80" in m for m in logs) and st2["step"] == 90 and st2["tokens"] == 90 * 4 * 32


def test_a_new_machine_continues_from_the_committed_weights(tmp_path):
    """Without build/'s training state, training picks up the committed head and its progress record,
    and keeps the snapshots that run took; with state present, or another target's head, it does not."""
    import json

    from speclib.lms.head import load_head, save_head
    from speclib.research.heads import committed_progress

    target = llama_target("fast", seed=3)
    out = save_head(new_head(target, "tiny", seed=1), tmp_path / "out")
    (out / "training.json").write_text(json.dumps({"step": 7, "tokens": 7 * 128}))
    head = new_head(target, "tiny", seed=2)
    start = committed_progress(head, out, tmp_path / "state")
    assert start["step"] == 7
    for (name, a), (_, b) in zip(head.state_dict().items(), load_head(out).state_dict().items()):
        assert torch.equal(a, b), name
    stream = np.random.default_rng(1).integers(0, 64, 4000).astype(np.int16)
    kw = dict(batch=4, seq=32, autocast=False, eval_every=100, n_eval=2, log=lambda m: None)
    st = fit(target, head, stream, stream[:500], tmp_path / "state", steps=9, snapshots=(500, 1000), start=start, **kw)
    assert st["step"] == 9 and st["tokens"] == 9 * 128 and st["snapshots"] == [500, 1000]
    assert (tmp_path / "state" / "tokens-1000").exists() and not (tmp_path / "state" / "tokens-500").exists()
    assert committed_progress(new_head(target, "tiny"), out, tmp_path / "state") is None  # state.pt now there
    assert committed_progress(new_head(target, "other"), out, tmp_path / "elsewhere") is None
    wide = new_head(target, "tiny", ff=3 * target.hidden_size)  # a wider MLP than the committed head's
    assert wide.config["intermediate_size"] == 3 * target.hidden_size != head.config["intermediate_size"]
    assert wide.layer.gate.out_features == 3 * target.hidden_size
    with pytest.raises(ValueError, match="MLP width"):
        committed_progress(wide, out, tmp_path / "elsewhere")


def test_frozen_parts_finds_each_architectures_final_norm():
    """The final norm under the names transformers uses (Llama `norm`, GPT-2 `ln_f`), and a clear error
    for a model that has none of them."""
    from speclib.lms.lm import HFLM
    from speclib.workbook.support import tiny_model

    for family, name in [("llama", "norm"), ("gpt2", "ln_f")]:
        model = tiny_model(family)
        embed, norm, lm_head = HFLM(model, None, "cpu").frozen_parts()
        assert norm is getattr(model.base_model, name) and lm_head is model.lm_head
        assert embed is model.get_input_embeddings()
    model = tiny_model("llama")
    model.model.norm = None
    with pytest.raises(TypeError, match="final norm"):
        HFLM(model, None, "cpu").frozen_parts()
