"""tree_gdn as one Triton kernel: one program per (batch, head) computes every node.

The same closed form as chunk.py (see there), entirely in registers: the ancestor matrix and path
cumsum are built by one pass in topological order (row i = row parents[i] plus i), the unit
lower-triangular system is solved by forward substitution in the same order, and the products use
tl.dot. Correctness first: the whole forest must fit in one block (N <= MAX_NODES); the "auto"
dispatcher falls back to chunk beyond that. fp32 dots use input_precision="ieee" (no TF32).

Runs on CUDA, and on CPU tensors under TRITON_INTERPRET=1. Triton decides interpreter vs compiler
for its own standard library (tl.zeros, tl.sum, ...) when triton is FIRST imported, so the variable
must be set before anything imports triton (importing a transformers model does); `interpreter_ready()`
says whether it was. Our kernel itself is jitted on first use, per mode.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton import knobs

from .naive import Factors, check_inputs

MAX_NODES = 128
MAX_DIM = 256


def _tree_gdn_fwd(
    q,
    k,
    v,
    g,
    beta,
    par,
    s0,
    o,
    u,
    G,
    N,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    rv = tl.arange(0, BV)
    mn = rn < N
    mk = rk < K
    mv = rv < V
    tok = (b * N + rn) * H + h  # [BN] token-major [B, N, H] index
    mnk = mn[:, None] & mk[None, :]
    mnv = mn[:, None] & mv[None, :]
    Q = tl.load(q + tok[:, None] * K + rk[None, :], mask=mnk, other=0.0).to(tl.float32)
    Kt = tl.load(k + tok[:, None] * K + rk[None, :], mask=mnk, other=0.0).to(tl.float32)
    Vt = tl.load(v + tok[:, None] * V + rv[None, :], mask=mnv, other=0.0).to(tl.float32)
    gv = tl.load(g + tok, mask=mn, other=0.0).to(tl.float32)
    bv = tl.load(beta + tok, mask=mn, other=0.0).to(tl.float32)
    S0 = tl.load(s0 + ((b * H + h) * K + rk[:, None]) * V + rv[None, :], mask=mk[:, None] & mv[None, :], other=0.0).to(
        tl.float32
    )

    # Ancestor-or-self matrix M and path cumsum Gv, in topological order (parents[i] < i).
    M = tl.zeros([BN, BN], dtype=tl.float32)
    Gv = tl.zeros([BN], dtype=tl.float32)
    for i in range(0, N):
        p = tl.load(par + b * N + i)  # -1 matches no row
        is_p = rn == p
        is_i = rn == i
        row = tl.sum(tl.where(is_p[:, None], M, 0.0), axis=0)
        row = tl.where(is_i, 1.0, row)
        Gi = tl.sum(tl.where(is_p, Gv, 0.0), axis=0) + tl.sum(tl.where(is_i, gv, 0.0), axis=0)
        M = tl.where(is_i[:, None], row[None, :], M)
        Gv = tl.where(is_i, Gi, Gv)

    anc = M > 0.5
    # Mask before exp: non-ancestor differences can be large and positive.
    D = tl.where(anc, tl.exp(tl.where(anc, Gv[:, None] - Gv[None, :], 0.0)), 0.0)
    eG = tl.exp(Gv)
    KK = tl.dot(Kt, tl.trans(Kt), input_precision="ieee")
    A = tl.where(rn[:, None] == rn[None, :], 0.0, D * KK) * bv[:, None]
    KS = tl.dot(Kt, S0, input_precision="ieee")
    rhs = bv[:, None] * (Vt - eG[:, None] * KS)

    # Forward substitution: u_i = rhs_i - sum_{j < i} A_ij u_j (rows not yet solved are zero).
    U = tl.zeros([BN, BV], dtype=tl.float32)
    for i in range(0, N):
        is_i = rn == i
        a_row = tl.sum(tl.where(is_i[:, None], A, 0.0), axis=0)
        r = tl.sum(tl.where(is_i[:, None], rhs, 0.0), axis=0)
        ui = r - tl.sum(a_row[:, None] * U, axis=0)
        U = tl.where(is_i[:, None], ui[None, :], U)

    QK = tl.dot(Q, tl.trans(Kt), input_precision="ieee")
    O = eG[:, None] * tl.dot(Q, S0, input_precision="ieee") + tl.dot(D * QK, U, input_precision="ieee")
    tl.store(o + tok[:, None] * V + rv[None, :], O.to(o.dtype.element_ty), mask=mnv)
    tl.store(u + tok[:, None] * V + rv[None, :], U, mask=mnv)
    tl.store(G + tok, Gv, mask=mn)


_KERNELS: dict[bool, object] = {}


def interpreter_ready() -> bool:
    """True when CPU tensors can run: TRITON_INTERPRET=1 now AND when triton was imported."""
    from triton.runtime.interpreter import InterpretedFunction

    return bool(knobs.runtime.interpret) and isinstance(tl.zeros, InterpretedFunction)


def _kernel():
    # Jit lazily and per mode: triton picks interpreter vs compiler when a function is decorated.
    interp = bool(knobs.runtime.interpret)
    if interp not in _KERNELS:
        _KERNELS[interp] = triton.jit(_tree_gdn_fwd)
    return _KERNELS[interp]


def _block(n: int) -> int:
    return max(16, triton.next_power_of_2(n))  # tl.dot needs >= 16 per dim


def tree_gdn_triton(q, k, v, g, beta, parents, state, out=None):
    """Gated delta rule on a forest in one Triton launch (grid = B * H).

    Shapes as tree_gdn: q, k [B, N, H, K]; v [B, N, H, V]; g, beta [B, N, H]; parents [N] or
    [B, N]; state [B, H, K, V]. ``out`` = (o, u, G) preallocated buffers ([B, N, H, V] in q's
    dtype, [B, N, H, V] fp32, [B, N, H] fp32), for tests that poison them. Returns (o, Factors).
    """
    par = check_inputs(q, k, v, g, beta, parents, state)
    B, N, H, K = q.shape
    V = v.shape[-1]
    if N > MAX_NODES or K > MAX_DIM or V > MAX_DIM:
        raise ValueError(
            f"impl='triton' handles N <= {MAX_NODES} nodes and K, V <= {MAX_DIM}; "
            f"got N={N}, K={K}, V={V} (use impl='chunk')"
        )
    if not (q.is_cuda or interpreter_ready()):
        raise ValueError(
            "impl='triton' needs CUDA tensors, or for CPU tensors TRITON_INTERPRET=1 set before "
            "triton is first imported (use impl='chunk' on CPU)"
        )
    if out is None:
        out = (
            torch.empty(B, N, H, V, dtype=q.dtype, device=q.device),
            torch.empty(B, N, H, V, dtype=torch.float32, device=q.device),
            torch.empty(B, N, H, dtype=torch.float32, device=q.device),
        )
    o, u, G = out
    if N > 0 and B * H > 0:
        q, k, v, g, beta, state = (t.contiguous() for t in (q, k, v, g, beta, state))
        _kernel()[(B * H,)](
            q, k, v, g, beta, par, state, o, u, G, N, H=H, K=K, V=V, BN=_block(N), BK=_block(K), BV=_block(V)
        )
    return o, Factors(k.float(), u, G, par)
