"""Token Recycling against slow references (template, matrix update, draft), greedy identity on chains and
trees, the permutation of outputs at T = 1, the verify-pass wiring and bad inputs."""

import itertools
import random

import numpy as np
import pytest
import torch
from conftest import KeepFirstBranch, tiny_lm

from speclib import Sampling, TokenRecycling, generate
from speclib.core.protocols import VerifyObserver
from speclib.drafters.recycling import expected_accepted, recycling_template
from speclib.research.stats import chi2_two_sample

GREEDY = Sampling(0.0)
PROMPTS = ([1, 2, 3, 1, 2, 3, 1, 2], [5, 5, 5, 5], [3, 1, 4, 1, 5, 9, 2, 6])


def all_path_values(rank_accept, depth):
    """Value (product of rank_accept along the path) of every rank path up to `depth` long."""
    return [
        float(np.prod([rank_accept[r] for r in path]))
        for d in range(1, depth + 1)
        for path in itertools.product(range(len(rank_accept)), repeat=d)
    ]


@pytest.mark.parametrize("nodes", [1, 3, 7, 12])
@pytest.mark.parametrize("rank_accept", [(0.6, 0.2, 0.1), (0.3, 0.3, 0.25), (0.9, 0.05)])
def test_template_holds_the_most_valuable_paths(nodes, rank_accept):
    parents, ranks = recycling_template(nodes, rank_accept)
    assert len(parents) == nodes and all(-1 <= p < i for i, p in enumerate(parents))
    children = {}
    for p, r in zip(parents, ranks):
        assert r not in children.setdefault(p, set())  # one node per (parent, rank)
        children[p].add(r)
    best = sorted(all_path_values(rank_accept, nodes), reverse=True)[:nodes]
    assert expected_accepted(parents, ranks, rank_accept) == pytest.approx(sum(best))


def slow_update(matrix, tokens, logits, path, k):
    """Every verified node's row becomes its top-k, the accepted chain's rows written last."""
    chain = [0] + [i + 1 for i in path]
    for i in [i for i in range(len(tokens)) if i not in chain] + chain:
        order = sorted(range(logits.shape[1]), key=lambda v: -float(logits[i, v]))
        matrix[tokens[i]] = order[:k]


def slow_draft(matrix, parents, ranks, root):
    """BFS over the template with dictionaries: a node exists when its parent does and its row has a candidate."""
    tok, out_tokens, out_parents, index = {-1: root}, [], [], {-1: -1}
    for i, (p, r) in enumerate(zip(parents, ranks)):
        if p in tok and matrix[tok[p]][r] >= 0:
            tok[i], index[i] = int(matrix[tok[p]][r]), len(out_tokens)
            out_tokens.append(tok[i])
            out_parents.append(index[p])
    return out_tokens, out_parents


class _Vocab:
    def __init__(self, v):
        self.vocab_size = v


@pytest.mark.parametrize("seed", range(5))
def test_matrix_update_and_draft_match_slow_references(seed):
    rng, V, k = random.Random(seed), 12, 3
    d = TokenRecycling(top_k=k, nodes=9, rank_accept=(0.5, 0.3, 0.2))
    d.check_compatible(_Vocab(V))
    d.reset([0], GREEDY, torch.Generator())
    slow = [[-1] * k for _ in range(V)]
    for step in range(30):
        root = rng.randrange(V)
        tree = d.draft([root])
        assert (tree.tokens, tree.parents) == slow_draft(slow, d.parents, d.ranks, root)
        # repeated tokens on purpose: a small vocabulary and extra random nodes
        tokens = [root] + tree.tokens + [rng.randrange(V) for _ in range(rng.randint(0, 4))]
        logits = torch.randn(len(tokens), V, generator=torch.Generator().manual_seed(100 * seed + step))
        depth_path = tree.path_to(len(tree) - 1) if len(tree) and rng.random() < 0.7 else []
        d.observe_verify(tokens, logits, depth_path, rng.randrange(V))
        slow_update(slow, tokens, logits, depth_path, k)
        assert d.matrix.tolist() == slow


def test_rank_counts_record_which_candidate_the_target_took():
    d = TokenRecycling(top_k=2, nodes=2, rank_accept=(0.5, 0.5))
    d.check_compatible(_Vocab(5))
    d.reset([0], GREEDY, torch.Generator())
    d.matrix[1] = [3, 4]
    d.matrix[3] = [2, 0]
    tree = d.draft([1])  # nodes: 3, 4 (children of the root)
    assert tree.tokens == [3, 4] and tree.parents == [-1, -1]
    logits = torch.arange(15.0).view(3, 5)
    d.observe_verify([1, 3, 4], logits, [0], 0)  # took 3 (rank 0 of row 1), then 0 (rank 1 of row 3)
    assert d.rank_counts.tolist() == [1, 1, 0]
    assert d.matrix[1].tolist() == [4, 3]  # rows rewritten with each node's top-2
    assert d.draft([2]).tokens == []  # row 2 never verified: no candidate
    d.observe_verify([2], logits[:1], [], 4)  # 4 was not among row 2's (empty) candidates
    assert d.rank_counts.tolist() == [1, 1, 1]
    assert d.fitted_rank_accept() == pytest.approx((1 / 3, 1 / 3))


@pytest.mark.parametrize("rank_accept,nodes", [((0.8,), 6), ((0.5, 0.3, 0.2), 10)], ids=["chain", "tree"])
@pytest.mark.parametrize("shared", [True, False])
def test_greedy_identity(rank_accept, nodes, shared):
    target = tiny_lm(32, 2, vocab=16, seed=0)
    d = TokenRecycling(top_k=len(rank_accept), nodes=nodes, rank_accept=rank_accept, shared=shared)
    if len(rank_accept) == 1:
        assert d.parents == list(range(-1, nodes - 1))  # one candidate per token: the template is a chain
    accepted = 0
    for prompt in PROMPTS:
        ar = generate(target, prompt, 40, sampling=GREEDY)
        sd = generate(target, prompt, 40, drafter=d, sampling=GREEDY)
        assert sd.tokens == ar.tokens
        accepted += sum(s["accepted"] for s in sd.stats.steps)
    assert accepted >= 10  # the tiny target cycles: its own candidates predict it well
    assert d.rank_counts.sum() > 0


def test_shared_matrix_carries_over_and_unshared_does_not():
    target = tiny_lm(32, 2, vocab=16, seed=0)
    shared, cold = TokenRecycling(top_k=2, nodes=4), TokenRecycling(top_k=2, nodes=4, shared=False)
    for d in (shared, cold):
        generate(target, PROMPTS[0], 20, drafter=d, sampling=GREEDY)
    first_steps = {}
    for name, d in (("shared", shared), ("cold", cold)):
        first_steps[name] = generate(target, PROMPTS[0], 20, drafter=d, sampling=GREEDY).stats.steps[0]["drafted"]
    assert first_steps["shared"] > 0 and first_steps["cold"] == 0


class _Spy(TokenRecycling):
    def observe_verify(self, tokens, logits, path, next_token):
        self.seen.append((list(tokens), logits.clone(), list(path), next_token))
        super().observe_verify(tokens, logits, path, next_token)


def test_the_loop_hands_over_each_verify_pass():
    """Greedy: each accepted token is the argmax after its parent, and the next token the argmax after
    the last accepted one; the logits are the target's over the verified nodes."""
    target = tiny_lm(32, 2, vocab=16, seed=0)
    d = _Spy(top_k=2, nodes=5)
    d.seen = []
    assert isinstance(d, VerifyObserver)
    out = generate(target, PROMPTS[0], 30, drafter=d, sampling=GREEDY)
    assert len(d.seen) == len(out.stats.steps)
    for tokens, logits, path, nxt in d.seen:
        chain = [0] + [i + 1 for i in path]
        assert [tokens[i] for i in chain[1:]] + [nxt] == [int(logits[i].argmax()) for i in chain]


def test_chi_square_at_temperature_one():
    """The tokens at new-token indices 3 and 4, as one pair, over 800 seeded runs at T = 1, AR vs Token Recycling
    (one drafter, its matrix warm from the earlier runs): the joint, because the tiny target's marginal at one
    index barely depends on the tokens before it, so a wrong rule would not show in it. alpha = 1e-3: a 0.1% false-positive rate under the null."""
    target = tiny_lm(32, 2, vocab=16, seed=0)
    t1 = Sampling(1.0)

    def pair(g):
        return g.tokens[3] * target.vocab_size + g.tokens[4]

    prompt = [1, 2, 3, 4, 5, 1, 2, 3]
    ar = [pair(generate(target, prompt, 5, sampling=t1, seed=s)) for s in range(800)]
    d = TokenRecycling(top_k=3, nodes=8, rank_accept=(0.5, 0.3, 0.2))
    runs = [generate(target, prompt, 5, sampling=t1, seed=10**6 + s, drafter=d) for s in range(800)]
    assert sum(s["accepted"] for r in runs for s in r.stats.steps) > 200
    assert chi2_two_sample(ar, [pair(r) for r in runs]).p > 1e-3

    # negative control: the same test rejects a rule that keeps every draft token of the first branch
    bad = [
        pair(generate(target, prompt, 5, sampling=t1, seed=10**6 + s, drafter=d, acceptor=KeepFirstBranch()))
        for s in range(800)
    ]
    assert chi2_two_sample(ar, bad).p < 1e-3


def test_bad_inputs():
    for kw, match in [
        (dict(top_k=0), "top_k"),
        (dict(nodes=0), "nodes"),
        (dict(rank_accept=(1.5,)), "rank_accept"),
        (dict(rank_accept=()), "rank_accept"),
        (dict(top_k=2, rank_accept=(0.5, 0.2, 0.1)), "rank_accept"),
        (dict(rank_accept=(0.0,)), "rank_accept"),
    ]:
        with pytest.raises(ValueError, match=match):
            TokenRecycling(**kw)
    with pytest.raises(RuntimeError, match="check_compatible"):
        TokenRecycling().reset([1], GREEDY, torch.Generator())
    with pytest.raises(ValueError, match="no verify pass"):
        TokenRecycling().fitted_rank_accept()


def test_draft_score_is_the_expected_accepted_tokens_of_the_nodes_kept():
    d = TokenRecycling(top_k=2, nodes=6, rank_accept=(0.6, 0.3))
    d.check_compatible(_Vocab(5))
    d.reset([0], GREEDY, torch.Generator())
    d.matrix[:] = [[1, 2]] * 5  # every row full: the whole template is kept
    assert len(d.draft([0])) == 6 and d.last["score"] == pytest.approx(
        expected_accepted(d.parents, d.ranks, d.rank_accept)
    )
    d.matrix[:, 1] = -1  # only rank-0 candidates: the rank-0 chain
    tree = d.draft([0])
    assert tree.is_chain and d.last["score"] == pytest.approx(sum(0.6**j for j in range(1, len(tree) + 1)))
