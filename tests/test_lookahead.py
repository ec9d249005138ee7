"""Lookahead against a slow reference (tree, pool, window), greedy identity on chains and trees, the
permutation of outputs at T = 1 and bad inputs."""

import random

import pytest
import torch
from conftest import KeepFirstBranch, tiny_lm

from speclib import Lookahead, Sampling, generate
from speclib.core.protocols import VerifyObserver
from speclib.research.stats import chi2_two_sample

GREEDY = Sampling(0.0)
PROMPTS = ([1, 2, 3, 1, 2, 3, 1, 2], [5, 5, 5, 5], [3, 1, 4, 1, 5, 9, 2, 6])


class SlowLookahead:
    """The same method with lists: the pool an insertion-ordered list of n-grams, the tree a set of
    root-to-node token paths."""

    def __init__(self, diagonals, guesses, per_key):
        self.diagonals, self.guesses, self.per_key, self.pool = [list(d) for d in diagonals], guesses, per_key, []

    def paths(self, root):
        conts = [g[1:] for g in reversed(self.pool) if g[0] == root][: self.guesses]
        out = {tuple(c[:j]) for c in conts for j in range(1, len(c) + 1)}
        trunk = [d[0] for d in self.diagonals]
        for i, d in enumerate(self.diagonals):
            out |= {tuple(trunk[: i + 1] + d[1:j]) for j in range(1, len(d) + 1)}
        return out

    def ends(self):
        trunk = [d[0] for d in self.diagonals]
        return [tuple(trunk[: i + 1] + d[1:]) for i, d in enumerate(self.diagonals)]

    def update(self, guesses):
        for d, g in zip(self.diagonals, guesses):
            ngram = d + [g]
            if ngram in self.pool:
                self.pool.remove(ngram)
            self.pool.append(ngram)
            if sum(x[0] == ngram[0] for x in self.pool) > self.per_key:
                self.pool.remove(next(x for x in self.pool if x[0] == ngram[0]))
            d.append(g)
            del d[0]


def token_paths(tree):
    return [tuple(tree.tokens[j] for j in tree.path_to(i)) for i in range(len(tree))]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("window,ngram,guesses", [(1, 2, 0), (3, 3, 2), (4, 4, 4), (2, 5, 3)])
def test_tree_pool_and_window_match_a_slow_reference(seed, window, ngram, guesses):
    rng, V = random.Random(seed), 6  # a small vocabulary: repeated tokens, merged nodes
    per_key = max(guesses, 2)  # small: n-grams get evicted
    d = Lookahead(window, ngram, guesses, pool_per_key=per_key)
    d.reset([rng.randrange(V) for _ in range(5)], GREEDY, torch.Generator())
    slow = SlowLookahead(d.diagonals, guesses, per_key)
    for step in range(25):
        root = rng.randrange(V)
        tree = d.draft([root])
        paths = token_paths(tree)
        assert len(set(paths)) == len(paths)  # a trie: one node per token path
        assert set(paths) == slow.paths(root) and len(tree) <= d.max_nodes
        logits = torch.randn(len(tree) + 1, V, generator=torch.Generator().manual_seed(100 * seed + step))
        d.observe_verify([root] + tree.tokens, logits, [], 0)
        slow.update([int(logits[1 + paths.index(e)].argmax()) for e in slow.ends()])
        assert d.diagonals == slow.diagonals
        assert (
            {k: list(kept) for k, kept in d.pool.items()}
            == {  # per first token, oldest first
                k: [tuple(g[1:]) for g in slow.pool if g[0] == k] for k in {g[0] for g in slow.pool}
            }
        )


@pytest.mark.parametrize(
    "window,ngram,guesses", [(1, 2, 0), (1, 4, 0), (3, 3, 3), (4, 5, 6)], ids=["one-node", "chain", "tree", "wide"]
)
@pytest.mark.parametrize("shared", [True, False])
def test_greedy_identity(window, ngram, guesses, shared):
    target = tiny_lm(32, 2, vocab=16, seed=0)
    d = Lookahead(window, ngram, guesses, shared=shared)
    assert isinstance(d, VerifyObserver)
    accepted = 0
    for prompt in PROMPTS:
        ar = generate(target, prompt, 40, sampling=GREEDY)
        sd = generate(target, prompt, 40, drafter=d, sampling=GREEDY)
        assert sd.tokens == ar.tokens
        assert all(s["drafted"] <= d.max_nodes for s in sd.stats.steps)
        accepted += sum(s["accepted"] for s in sd.stats.steps)
    if guesses:
        assert accepted >= 10  # the tiny target cycles: its n-grams recur


def test_chi_square_at_temperature_one():
    """Token at new-token index 4 over 800 seeded runs at T = 1, AR vs Lookahead (a shared pool, warm
    from the earlier runs). alpha = 1e-3: a 0.1% false-positive rate under the null."""
    target = tiny_lm(32, 2, vocab=16, seed=0)
    t1 = Sampling(1.0)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3]
    ar = [generate(target, prompt, 5, sampling=t1, seed=s).tokens[4] for s in range(800)]
    d = Lookahead(3, 3, 4, shared=True)
    runs = [generate(target, prompt, 5, sampling=t1, seed=10**6 + s, drafter=d) for s in range(800)]
    assert sum(s["accepted"] for r in runs for s in r.stats.steps) > 200
    assert chi2_two_sample(ar, [r.tokens[4] for r in runs]).p > 1e-3

    # negative control: the same test rejects a rule that keeps every draft token of the first branch
    bad = [
        generate(target, prompt, 5, sampling=t1, seed=10**6 + s, drafter=d, acceptor=KeepFirstBranch()).tokens[4]
        for s in range(800)
    ]
    assert chi2_two_sample(ar, bad).p < 1e-3


def test_bad_inputs():
    for kw, match in [
        (dict(window=0), "window"),
        (dict(ngram=1), "ngram"),
        (dict(guesses=-1), "guesses"),
        (dict(pool_per_key=0), "pool_per_key"),
        (dict(guesses=5, pool_per_key=4), "exceed"),
        (dict(window=2.0), "window"),
        (dict(ngram=True), "ngram"),
    ]:
        with pytest.raises(ValueError, match=match):
            Lookahead(**kw)
    with pytest.raises(ValueError, match="non-empty prompt"):
        Lookahead().reset([], GREEDY, torch.Generator())
