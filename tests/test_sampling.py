import pytest
import torch

from speclib import ModelDrafter, Sampling
from speclib.core.sampling import probs


def reference(logits, t, k, top_p):
    """Obvious twin: loop over tokens in probability order."""
    z = logits.double() / t
    if k:
        kth = sorted(z.tolist(), reverse=True)[k - 1]
        z = torch.where(z >= kth, z, torch.tensor(float("-inf"), dtype=z.dtype))
    p = torch.softmax(z, -1)
    keep, mass = [], 0.0
    for i in sorted(range(len(p)), key=lambda i: -p[i].item()):
        if mass >= top_p:
            break
        keep.append(i)
        mass += p[i].item()
    out = torch.zeros_like(p)
    out[keep] = p[keep]
    return out / out.sum()


@pytest.mark.parametrize(
    "t,k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (1.0, 10, 0.5), (0.5, 1, 1.0), (2.0, 3, 0.99)]
)
def test_probs_matches_reference(t, k, top_p):
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(37, generator=gen) * 3
        assert torch.allclose(probs(logits, Sampling(t, k, top_p)).double(), reference(logits, t, k, top_p), atol=1e-6)


def test_greedy_is_one_hot_argmax():
    logits = torch.randn(4, 11)
    p = probs(logits, Sampling(0.0))
    assert torch.equal(p.argmax(-1), logits.argmax(-1)) and torch.equal(p.sum(-1), torch.ones(4))


def test_draft_q_is_the_processed_distribution(pair):
    """HF #47932: the q used for acceptance must be the top-k/top-p processed draft distribution."""
    target, draft = pair
    s = Sampling(1.0, top_k=5, top_p=0.9)
    drafter = ModelDrafter(draft, k=3)
    drafter.reset([1, 2, 3], s, torch.Generator().manual_seed(0))
    tree = drafter.draft([1, 2, 3, 4])
    assert ((tree.q > 0).sum(-1) <= 5).all()
    fresh = draft.reset([1, 2, 3, 4] + tree.tokens[:2])
    assert torch.allclose(tree.q[2], probs(fresh, s), atol=1e-5)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
    ],
)
def test_bad_sampling(kw, match):
    with pytest.raises(ValueError, match=match):
        Sampling(**kw)


def test_non_finite_logits():
    with pytest.raises(ValueError, match="non-finite"):
        probs(torch.tensor([0.0, float("nan")]), Sampling())
