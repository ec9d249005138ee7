"""Level 1: the exact math of the lossless rule, and the acceptor's code path against it."""

import numpy as np
import pytest
import torch

from speclib import Lossless, Tree
from speclib.core.acceptance import output_distribution, residual
from speclib.research.stats import chi2_two_sample


def random_pair(v, gen, zeros_p=0, zeros_q=0):
    p = torch.rand(v, generator=gen, dtype=torch.float64) ** 3
    q = torch.rand(v, generator=gen, dtype=torch.float64) ** 3
    p[torch.randperm(v, generator=gen)[:zeros_p]] = 0
    q[torch.randperm(v, generator=gen)[:zeros_q]] = 0
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize("v,zp,zq", [(2, 0, 0), (7, 0, 3), (7, 3, 0), (50, 20, 20), (1000, 500, 900), (5, 4, 4)])
def test_output_distribution_equals_p(v, zp, zq):
    gen = torch.Generator().manual_seed(v + zp + zq)
    for _ in range(50):
        p, q = random_pair(v, gen, zp, zq)
        assert torch.allclose(output_distribution(p, q), p, atol=1e-12)


def test_output_distribution_edge_cases():
    p = torch.tensor([0.0, 1.0, 0.0])
    q = torch.tensor([1.0, 0.0, 0.0])  # disjoint supports
    assert torch.allclose(output_distribution(p, q), p.double())
    p = torch.tensor([0.2, 0.3, 0.5])
    assert torch.allclose(output_distribution(p, p), p.double())  # q == p: always accept
    assert torch.allclose(residual(p, p), p)


def test_a_wrong_rule_is_caught():
    """The check above can fail: accepting every draft token emits q, not p."""
    p, q = random_pair(10, torch.Generator().manual_seed(0))
    assert not torch.allclose(q, p, atol=1e-3)


def _draws(acceptor, tree, p, n, seed=0, greedy=False):
    gen = torch.Generator().manual_seed(seed)
    first = []
    for _ in range(n):
        path, nxt = acceptor(tree, p, greedy, gen)
        first.append(tree.tokens[path[0]] if path else nxt)
    return np.array(first)


def test_chain_acceptor_samples_p_at_first_position():
    """Monte Carlo of the acceptor's code path: draft token x ~ q, emitted first token ~ p.
    Chi-square two-sample test against direct draws from p at alpha = 1e-3 (false-positive rate 0.1%)."""
    gen = torch.Generator().manual_seed(1)
    v, n = 12, 20000
    p, q = random_pair(v, gen, zeros_p=3, zeros_q=2)
    p, q = p.float(), q.float()
    xs = torch.multinomial(q, n, replacement=True, generator=gen).tolist()
    rng = torch.Generator().manual_seed(2)
    out = []
    for x in xs:
        tree = Tree.chain([x], q[None])
        path, nxt = Lossless()(tree, torch.stack([p, p]), False, rng)
        out.append(x if path else nxt)
    direct = torch.multinomial(p, n, replacement=True, generator=gen).tolist()
    assert chi2_two_sample(out, direct).p > 1e-3
    assert chi2_two_sample(xs, direct).p < 1e-6  # the draft's own tokens are not p


def test_point_mass_draft_is_lossless():
    """Cache drafts have no q: accept x with prob p(x), else sample p without x."""
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.zeros(4)
    q[1] = 1.0
    assert torch.allclose(output_distribution(p, q), p.double())
    tree = Tree.chain([1], None)
    out = _draws(Lossless(), tree, torch.stack([p, p]), 20000, seed=3)
    freq = np.bincount(out, minlength=4) / len(out)
    assert np.abs(freq - p.numpy()).max() < 0.015  # ~4.5 standard errors at n = 20000


def test_tree_two_siblings_is_lossless():
    """SpecInfer multi-draft: two i.i.d. children from q; the first emitted token must be ~ p."""
    gen = torch.Generator().manual_seed(4)
    p, q = random_pair(6, gen, 1, 1)
    p, q = p.float(), q.float()
    rng = torch.Generator().manual_seed(5)
    out = []
    firsts, naive = [], []
    for _ in range(15000):
        a, b = torch.multinomial(q, 2, replacement=True, generator=gen).tolist()
        tree = Tree([a, b], [-1, -1], torch.stack([q, q]))
        path, nxt = Lossless()(tree, torch.stack([p, p, p]), False, rng)
        out.append(tree.tokens[path[0]] if path else nxt)
        firsts.append(a)
        # a wrong multi-draft rule: each sibling tested against p itself, not against the residual left
        # after the siblings before it were rejected
        for x in (a, b):
            if torch.rand((), generator=rng) < min(1.0, float(p[x] / q[x])):
                naive.append(x)
                break
        else:
            naive.append(int(torch.multinomial(torch.clamp(p - q, min=0), 1, generator=rng)))
    direct = torch.multinomial(p, 15000, replacement=True, generator=gen).tolist()
    assert chi2_two_sample(out, direct).p > 1e-3
    # negative controls: the same test rejects the draft's own tokens and the rule without residuals
    assert chi2_two_sample(firsts, direct).p < 1e-6
    assert chi2_two_sample(naive, direct).p < 1e-3


def test_greedy_rule_walks_argmax():
    p = torch.eye(5)[[2, 3, 4, 0]]  # rows: argmax 2, then 3, then 4, then 0
    tree = Tree.chain([2, 3, 1])
    path, nxt = Lossless()(tree, p, True, None)
    assert path == [0, 1] and nxt == 4
    tree = Tree([1, 2, 3], [-1, -1, 1])  # second root child matches, then its child 3 matches
    path, nxt = Lossless()(tree, torch.eye(5)[[2, 0, 3, 4]], True, None)
    assert path == [1, 2] and nxt == 4
