"""tree_gdn / fold / tree_conv1d: every implementation against the naive definition.

Tolerances: fp32 rtol = atol = 1e-5 (values are O(1)). bf16 inputs: the reference is naive on the
same bf16 values upcast to fp32, so the only extra error is rounding o to bf16 (eps 2^-8):
rtol = atol = 2e-2 on o, and the fp32 factors still at 1e-5 (they are computed in fp32).
On a GPU the Triton kernel runs on CUDA tensors; on CPU under TRITON_INTERPRET=1, which triton
reads when it is FIRST imported. conftest imports transformers, which imports triton, before this
module; unless TRITON_INTERPRET=1 was already in the environment, the Triton tests then re-run
themselves in a subprocess that has it (test_triton_in_subprocess).
"""

import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ON_GPU = torch.cuda.is_available()
if not ON_GPU and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # harmless without a GPU; must precede triton's import

from speclib.core.tree import ancestor_mask, path_to  # noqa: E402
from speclib.kernels.tree_gdn import fold, recurrent_gated_delta_rule, tree_conv1d, tree_conv1d_naive, tree_gdn

try:
    from speclib.kernels.tree_gdn.triton import interpreter_ready

    HAVE_TRITON = True
except ImportError:
    HAVE_TRITON = False
IN_PROCESS = HAVE_TRITON and (ON_GPU or interpreter_ready())

TRITON = pytest.param(
    "triton",
    marks=[
        pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed, so the Triton kernel cannot run"),
        pytest.mark.skipif(
            HAVE_TRITON and not IN_PROCESS,
            reason="triton was imported before TRITON_INTERPRET=1: these run in test_triton_in_subprocess",
        ),
    ],
)
FAST = ["chunk", TRITON]
TOL32 = dict(rtol=1e-5, atol=1e-5)
TOL16 = dict(rtol=2e-2, atol=2e-2)
DEV = "cuda" if ON_GPU else "cpu"


def on(impl, ts):
    """Triton's inputs go to the GPU when there is one; everything is compared on the CPU."""
    return [t.to(DEV) if impl == "triton" else t for t in ts]


@pytest.mark.skipif(not HAVE_TRITON or IN_PROCESS, reason="the Triton tests already run in this process")
def test_triton_in_subprocess():
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", "triton and not subprocess"],
        env=env,
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
        timeout=600,
    )
    assert r.returncode == 0 and " passed" in r.stdout and "skipped" not in r.stdout, (
        r.stdout[-3000:] + r.stderr[-2000:]
    )


def forest(n, roots=1, seed=0):
    """Random topological forest: nodes < roots are roots, the others pick any earlier node."""
    rng = random.Random(seed)
    return [-1 if i < roots else rng.randrange(i) for i in range(n)]


def inputs(B, N, H, K, V, seed=0, dtype=torch.float32, gscale=1.0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q = F.normalize(r(B, N, H, K), dim=-1) * K**-0.5  # the caller's job, see naive.py
    k = F.normalize(r(B, N, H, K), dim=-1)
    v = r(B, N, H, V)
    g = F.logsigmoid(r(B, N, H) + 2) * gscale  # log-decay <= 0
    beta = torch.sigmoid(r(B, N, H))
    S0 = r(B, H, K, V)
    return [t.to(dtype) for t in (q, k, v, g, beta, S0)]


def fla_recurrent(q, k, v, g, beta, S0):
    """fla's naive_recurrent_gated_delta_rule in [B, T, H, *] layout, written independently."""
    h = S0.float().clone()
    o = torch.zeros(*v.shape)
    for t in range(q.shape[1]):
        h = h * g[:, t].float().exp()[..., None, None]
        kt = k[:, t].float()
        vt = (v[:, t].float() - (h * kt[..., None]).sum(-2)) * beta[:, t].float()[..., None]
        h = h + kt[..., None] * vt[..., None, :]
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t].float(), h)
    return o, h


CASES = {  # name: (parents, B, H, K, V)
    "single": ([-1], 1, 1, 7, 7),
    "single_batched": ([-1], 3, 4, 7, 9),  # the AR-step fast path, several rows and heads
    "fan_depth1": ([-1] + [0] * 9, 2, 3, 5, 9),
    "roots_only": ([-1] * 6, 1, 3, 16, 16),
    "chain40": (list(range(-1, 39)), 2, 1, 7, 7),
    "wide_fans": ([-1, 0, 0, 0] + [1] * 12 + [2] * 12 + [3] * 12, 1, 3, 5, 9),
    "forest8": (forest(8, 2, 1), 2, 3, 16, 16),
    "forest23": (forest(23, 3, 2), 1, 1, 5, 9),
    "forest64": (forest(64, 4, 3), 2, 3, 7, 7),
    "forest40_deep": ([-1] + [max(0, i - random.Random(i).randrange(1, 3)) for i in range(1, 40)], 1, 3, 16, 16),
}


def run(impl, *args):
    o, f = tree_gdn(*on(impl, args), impl=impl)
    o, f = o.cpu(), type(f)(*(t.cpu() for t in f))
    for t in (o, f.u, f.G):
        assert torch.isfinite(t.float()).all(), f"{impl}: non-finite or unwritten output"
    return o, f


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("impl", FAST)
def test_matches_naive_fp32(impl, case):
    parents, B, H, K, V = CASES[case]
    q, k, v, g, beta, S0 = inputs(B, len(parents), H, K, V, seed=len(parents))
    o_ref, f_ref = tree_gdn(q, k, v, g, beta, torch.tensor(parents), S0, impl="naive")
    o, f = run(impl, q, k, v, g, beta, torch.tensor(parents), S0)
    torch.testing.assert_close(o, o_ref, **TOL32)
    torch.testing.assert_close(f.u, f_ref.u, **TOL32)
    torch.testing.assert_close(f.G, f_ref.G, **TOL32)


@pytest.mark.parametrize("case", ["fan_depth1", "forest23", "chain40"])
@pytest.mark.parametrize("impl", FAST)
def test_matches_naive_bf16(impl, case):
    parents, B, H, K, V = CASES[case]
    x16 = inputs(B, len(parents), H, K, V, seed=7, dtype=torch.bfloat16)
    o_ref, f_ref = tree_gdn(*[t.float() for t in x16[:5]], torch.tensor(parents), x16[5].float(), impl="naive")
    o, f = run(impl, *x16[:5], torch.tensor(parents), x16[5])
    assert o.dtype == torch.bfloat16
    torch.testing.assert_close(o.float(), o_ref, **TOL16)
    torch.testing.assert_close(f.u, f_ref.u, **TOL32)


@pytest.mark.parametrize("impl", FAST)
def test_per_batch_parents_and_huge_decay(impl):
    # Different forests per batch row; g ~ -40 per step makes non-ancestor G_i - G_j ~ +1e3,
    # which must be masked before exp (else inf * 0 = NaN).
    par = torch.tensor([forest(20, 2, 11), forest(20, 1, 12)])
    q, k, v, g, beta, S0 = inputs(2, 20, 3, 5, 9, seed=3)
    g[0, ::2] = -40.0
    o_ref, f_ref = tree_gdn(q, k, v, g, beta, par, S0, impl="naive")
    o, f = run(impl, q, k, v, g, beta, par, S0)
    torch.testing.assert_close(o, o_ref, **TOL32)
    torch.testing.assert_close(f.u, f_ref.u, **TOL32)


@pytest.mark.parametrize("impl", [TRITON])
def test_triton_writes_every_element(impl):
    from speclib.kernels.tree_gdn.triton import tree_gdn_triton

    par = torch.tensor(forest(37, 3, 5))
    q, k, v, g, beta, S0 = inputs(2, 37, 3, 5, 9, seed=5)
    out = [torch.full(s, math.nan, device=DEV) for s in ((2, 37, 3, 9), (2, 37, 3, 9), (2, 37, 3))]
    o, f = tree_gdn_triton(*on(impl, (q, k, v, g, beta, par, S0)), out=out)
    assert o is out[0] and all(torch.isfinite(t).all() for t in out), "an element was left unwritten"
    o_ref, f_ref = tree_gdn(q, k, v, g, beta, par, S0, impl="naive")
    torch.testing.assert_close(o.cpu(), o_ref, **TOL32)
    torch.testing.assert_close(f.G.cpu(), f_ref.G, **TOL32)


@pytest.mark.parametrize("impl", ["naive", "chunk", TRITON])
def test_chain_is_sequential_rule(impl):
    T = 25
    q, k, v, g, beta, S0 = inputs(2, T, 3, 5, 9, seed=9)
    o_ref, S_ref = fla_recurrent(q, k, v, g, beta, S0)
    o, f = run(impl, q, k, v, g, beta, torch.arange(-1, T - 1), S0)
    torch.testing.assert_close(o, o_ref, **TOL32)
    torch.testing.assert_close(fold(f, list(range(T)), S0), S_ref, **TOL32)


def random_path(parents, rng):
    return path_to(parents, rng.randrange(len(parents)))


def test_ancestor_mask_is_the_paths():
    """speclib.core.tree.ancestor_mask (the chunk kernel's mask): row i is exactly i's root-to-node path, for
    lists and [N] / [B, N] tensors, at every size the path doubling must cover (deep chains included)."""
    cases = [[], [-1], list(range(-1, 39)), forest(23, 3, 2), forest(64, 4, 3), CASES["forest40_deep"][0]]
    for parents in cases:
        n = len(parents)
        want = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            want[i, path_to(parents, i)] = True
        assert torch.equal(ancestor_mask(parents), want)
        assert torch.equal(ancestor_mask(torch.tensor(parents, dtype=torch.long)), want)
    batched = torch.tensor([forest(17, 1, 5), forest(17, 3, 6)])
    got = ancestor_mask(batched)
    assert got.shape == (2, 17, 17)
    assert all(torch.equal(got[b], ancestor_mask(batched[b].tolist())) for b in range(2))


@pytest.mark.parametrize("impl", ["naive", "chunk", TRITON])
def test_fold_equals_state_after_path(impl):
    parents = forest(30, 3, 21)
    q, k, v, g, beta, S0 = inputs(2, 30, 3, 7, 7, seed=21)
    _, f = run(impl, q, k, v, g, beta, torch.tensor(parents), S0)
    rng = random.Random(0)
    paths = [[], [0], [2]] + [random_path(parents, rng) for _ in range(8)]
    for path in paths:
        _, S_ref = fla_recurrent(*(t[:, path] for t in (q, k, v, g, beta)), S0)
        torch.testing.assert_close(fold(f, path, S0), S_ref, **TOL32, msg=f"path {path}")
        torch.testing.assert_close(fold(f, torch.tensor(path, dtype=torch.long), S0), S_ref, **TOL32)
    # One path per batch row, of different lengths (one empty).
    per_row = [paths[-1], []]
    S = fold(f, per_row, S0)
    for b, path in enumerate(per_row):
        _, u, S_b = recurrent_gated_delta_rule(*(t[b, path] for t in (q, k, v, g, beta)), S0[b])
        torch.testing.assert_close(S[b], S_b, **TOL32)
    assert torch.equal(fold(f, [], S0), S0)


def test_fold_rejects_a_non_path():
    q, k, v, g, beta, S0 = inputs(1, 4, 1, 5, 5)
    _, f = tree_gdn(q, k, v, g, beta, torch.tensor([-1, 0, 0, 1]), S0, impl="chunk")
    for bad in ([1], [0, 3], [0, 1, 2], [0, 9]):
        with pytest.raises(ValueError, match="path"):
            fold(f, bad, S0)


@pytest.mark.parametrize("impl", ["naive", "chunk", TRITON, "auto"])
def test_bad_parents(impl):
    q, k, v, g, beta, S0 = inputs(1, 3, 1, 5, 5)
    for bad in ([-1, 2, 0], [-1, 1, 0], [-2, 0, 1], [-1, 0], [[-1, 0, 1]] * 2):
        with pytest.raises(ValueError, match="parents"):
            tree_gdn(*on(impl, (q, k, v, g, beta, torch.tensor(bad), S0)), impl=impl)
    with pytest.raises(TypeError, match="parents"):
        tree_gdn(*on(impl, (q, k, v, g, beta, torch.tensor([-1.0, 0.0, 1.0]), S0)), impl=impl)


def test_bad_impl_and_auto_is_chunk_on_cpu():
    q, k, v, g, beta, S0 = inputs(1, 5, 2, 5, 5)
    par = torch.tensor(forest(5, 1, 0))
    with pytest.raises(ValueError, match="impl"):
        tree_gdn(q, k, v, g, beta, par, S0, impl="cuda")
    assert torch.equal(tree_gdn(q, k, v, g, beta, par, S0)[0], tree_gdn(q, k, v, g, beta, par, S0, impl="chunk")[0])


@pytest.mark.parametrize("W", [1, 2, 4])
@pytest.mark.parametrize("activation,use_bias", [("silu", True), (None, False)])
def test_conv_naive_equals_vectorised(W, activation, use_bias):
    gen = torch.Generator().manual_seed(W)
    for parents in ([-1], forest(17, 2, W), [[-1] * 6, list(range(-1, 5))], forest(40, 3, 1)):
        par = torch.tensor(parents)
        B, N = (2, par.shape[-1]) if par.dim() == 2 else (2, len(parents))
        x, tail = torch.randn(B, N, 6, generator=gen), torch.randn(B, W - 1, 6, generator=gen)
        weight, bias = torch.randn(6, W, generator=gen), (torch.randn(6, generator=gen) if use_bias else None)
        y = tree_conv1d(x, par, tail, weight, bias, activation)
        assert torch.isfinite(y).all()
        torch.testing.assert_close(y, tree_conv1d_naive(x, par, tail, weight, bias, activation), **TOL32)


@pytest.mark.parametrize("W", [1, 3, 4])
def test_conv_chain_is_causal_conv1d(W):
    gen = torch.Generator().manual_seed(0)
    B, N, D = 2, 11, 5
    x, tail = torch.randn(B, N, D, generator=gen), torch.randn(B, W - 1, D, generator=gen)
    weight, bias = torch.randn(D, W, generator=gen), torch.randn(D, generator=gen)
    ref = F.silu(F.conv1d(torch.cat([tail, x], 1).transpose(1, 2), weight[:, None], bias, groups=D)).transpose(1, 2)
    for fn in (tree_conv1d, tree_conv1d_naive):
        torch.testing.assert_close(fn(x, torch.arange(-1, N - 1), tail, weight, bias), ref, **TOL32)


def test_conv_bad_input():
    x, tail, w = torch.randn(1, 3, 4), torch.randn(1, 3, 4), torch.randn(4, 4)
    with pytest.raises(ValueError, match="parents"):
        tree_conv1d(x, torch.tensor([-1, 2, 0]), tail, w)
    with pytest.raises(ValueError, match="tail"):
        tree_conv1d(x, torch.tensor([-1, 0, 1]), tail[:, :2], w)
    with pytest.raises(ValueError, match="activation"):
        tree_conv1d(x, torch.tensor([-1, 0, 1]), tail, w, activation="relu")
