"""REST: the suffix array and retrieval against brute force, the draft against a brute-force trie,
greedy identity, the chi-square at T = 1, the datastore file and bad inputs."""

import random
from collections import Counter

import numpy as np
import pytest
from conftest import KeepFirstBranch, tiny_lm

from speclib import Sampling, generate
from speclib.drafters.rest import Datastore, RestDrafter, suffix_array
from speclib.research.stats import chi2_two_sample

GREEDY = Sampling(0.0)


def stream(seed, n, alphabet):
    rng = random.Random(seed)
    return [rng.randrange(alphabet) for _ in range(n)]


@pytest.mark.parametrize(
    "seed,n,alphabet,max_len", [(0, 1, 3, 4), (1, 50, 2, 3), (2, 200, 4, 5), (3, 300, 6, 16), (4, 64, 1, 8)]
)
def test_suffix_array_and_occurrences_match_brute_force(seed, n, alphabet, max_len):
    t = stream(seed, n, alphabet)
    assert suffix_array(np.array(t), max_len).tolist() == sorted(range(n), key=lambda i: (t[i : i + max_len], i))
    store = Datastore(t, max_len)
    rng = random.Random(seed)
    for _ in range(20):
        m = rng.randint(1, max_len)
        s = t[(i := rng.randrange(n)) : i + m] if rng.random() < 0.7 else stream(rng.random(), m, alphabet)
        assert store.occurrences(s).tolist() == [i for i in range(n - len(s) + 1) if t[i : i + len(s)] == s]


def brute_draft(t, context, max_suffix, min_suffix, depth, nodes, max_candidates):
    for m in range(min(max_suffix, len(context)), min_suffix - 1, -1):
        s = context[-m:]
        starts = [i for i in range(len(t) - m) if t[i : i + m] == s][:max_candidates]
        if starts:
            counts = Counter(
                tuple(t[i + m : i + m + d]) for i in starts for d in range(1, depth + 1) if i + m + d <= len(t)
            )
            return sorted(counts, key=lambda pre: (-counts[pre], pre))[:nodes]
    return []


@pytest.mark.parametrize("seed", range(6))
def test_draft_holds_the_most_frequent_continuations(seed):
    t = stream(seed, 400, 3 + seed % 3)
    store = Datastore(t, 8)
    d = RestDrafter(store, max_suffix=6, min_suffix=1 + seed % 2, depth=4, nodes=7, max_candidates=15)
    rng = random.Random(seed)
    for _ in range(15):
        context = stream(rng.random(), rng.randint(1, 10), 3 + seed % 3)
        tree = d.draft(context)
        prefixes = [tuple(tree.tokens[j] for j in tree.path_to(i)) for i in range(len(tree))]
        assert prefixes == brute_draft(t, context, 6, 1 + seed % 2, 4, 7, 15)


def test_greedy_identity_and_acceptance_from_the_targets_own_text():
    target = tiny_lm(32, 2, vocab=16, seed=0)
    prompts = ([1, 2, 3, 1, 2, 3, 1, 2], [5, 5, 5, 5], [3, 1, 4, 1, 5, 9, 2, 6])
    texts = [generate(target, p, 60, sampling=GREEDY).tokens for p in ([2, 7, 1], [9, 9, 4], [1, 2, 3])]
    store = Datastore(np.concatenate(texts), 8)
    accepted = 0
    for nodes in (1, 6):  # a chain and a tree
        for prompt in prompts:
            ar = generate(target, prompt, 40, sampling=GREEDY)
            sd = generate(target, prompt, 40, drafter=RestDrafter(store, 6, 1, 5, nodes), sampling=GREEDY)
            assert sd.tokens == ar.tokens
            accepted += sum(s["accepted"] for s in sd.stats.steps)
    assert accepted >= 20


def test_chi_square_at_temperature_one():
    """Token at new-token index 4 over 800 seeded runs at T = 1, AR vs REST over a datastore of the target's
    own samples. alpha = 1e-3: a 0.1% false-positive rate under the null."""
    target = tiny_lm(32, 2, vocab=16, seed=0)
    t1, prompt = Sampling(1.0), [1, 2, 3, 4, 5, 1, 2, 3]
    store = Datastore(np.concatenate([generate(target, prompt, 20, sampling=t1, seed=s).tokens for s in range(50)]), 8)
    ar = [generate(target, prompt, 5, sampling=t1, seed=s).tokens[4] for s in range(800)]
    runs = [
        generate(target, prompt, 5, sampling=t1, seed=10**6 + s, drafter=RestDrafter(store, 6, 1, 4, 6))
        for s in range(800)
    ]
    assert sum(s["accepted"] for r in runs for s in r.stats.steps) > 200
    assert chi2_two_sample(ar, [r.tokens[4] for r in runs]).p > 1e-3

    # negative control: the same test rejects a rule that keeps every draft token of the first branch
    bad = [
        generate(
            target,
            prompt,
            5,
            sampling=t1,
            seed=10**6 + s,
            drafter=RestDrafter(store, 6, 1, 4, 6),
            acceptor=KeepFirstBranch(),
        ).tokens[4]
        for s in range(800)
    ]
    assert chi2_two_sample(ar, bad).p < 1e-3


def test_datastore_file_round_trip_and_bad_inputs(tmp_path):
    store = Datastore([1, 2, 3, 1, 2, 4], 4)
    loaded = Datastore.load(store.save(tmp_path / "ds.npz"))
    assert loaded.tokens.tolist() == store.tokens.tolist() and loaded.sa.tolist() == store.sa.tolist()
    assert loaded.max_len == 4
    (tmp_path / "bad.npz").write_bytes(b"not a datastore")
    for path in (tmp_path / "bad.npz", tmp_path / "missing.npz"):
        with pytest.raises(ValueError, match="cannot read a datastore"):
            Datastore.load(path)
    with pytest.raises(ValueError, match="non-empty"):
        Datastore([])
    with pytest.raises(ValueError, match="max_len"):
        Datastore([1], 0)
    with pytest.raises(ValueError, match="1 to max_len"):
        store.occurrences([1] * 5)
    for kw, match in [
        (dict(nodes=0), "nodes"),
        (dict(depth=0), "depth"),
        (dict(min_suffix=3, max_suffix=2), "min_suffix"),
        (dict(max_suffix=5), "max_len"),
    ]:
        with pytest.raises(ValueError, match=match):
            RestDrafter(store, **kw) if "max_suffix" in kw else RestDrafter(store, max_suffix=4, **kw)
    with pytest.raises(TypeError, match="Datastore"):
        RestDrafter([1, 2, 3])
    with pytest.raises(ValueError, match="another tokenizer"):
        RestDrafter(Datastore([1, 99], 2), max_suffix=2, min_suffix=1).check_compatible(tiny_lm(vocab=16))
    assert RestDrafter(store, max_suffix=4).draft([7, 7]).tokens == []  # nothing found: an empty draft
