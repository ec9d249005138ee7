"""The definition of tree_gdn: the gated delta rule walked node by node, fp32.

Convention (Qwen3-Next / Qwen3.5 Gated DeltaNet, as in fla's ``naive_recurrent_gated_delta_rule``):
the state S is [K, V]; for a token t with parent state S_p,

    a_t = exp(g_t)                              g_t = log-decay <= 0
    u_t = beta_t * (v_t - a_t S_p^T k_t)        the delta-rule correction, [V]
    S_t = a_t S_p + k_t u_t^T
    o_t = S_t^T q_t                             read AFTER the update

``q`` and ``k`` are taken as given: the caller L2-normalises them and scales q (fla's
``use_qk_l2norm_in_kernel`` and ``scale = K ** -0.5`` are NOT applied here).

On a forest, node i's parent state is its parent's state, or the committed state S0 when
parents[i] == -1. Everything here is a Python loop on purpose: it is the reference the fast
implementations are tested against, not something to run in a decoding loop.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from speclib.core.tree import path_to


class Factors(NamedTuple):
    """What ``fold`` needs to commit any root-to-leaf path (fp32).

    k: [B, N, H, K]   keys as used by the recurrence
    u: [B, N, H, V]   delta-rule corrections u_i
    G: [B, N, H]      inclusive path cumsum of g (log of the decay from S0 to node i)
    parents: [B, N]   int64, -1 = attached to the committed state (used to check fold's path)
    """

    k: torch.Tensor
    u: torch.Tensor
    G: torch.Tensor
    parents: torch.Tensor


def check_inputs(q, k, v, g, beta, parents, state) -> torch.Tensor:
    """Validate shapes and the forest; return parents as int64 [B, N] on q's device."""
    if q.dim() != 4:
        raise ValueError(f"q must be [B, N, H, K], got shape {tuple(q.shape)}")
    B, N, H, K = q.shape
    V = v.shape[-1] if v.dim() == 4 else -1
    want = {
        "k": (k, (B, N, H, K)),
        "v": (v, (B, N, H, V)),
        "g": (g, (B, N, H)),
        "beta": (beta, (B, N, H)),
        "state": (state, (B, H, K, V)),
    }
    for name, (t, shape) in want.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} (from q {tuple(q.shape)} and v), got {tuple(t.shape)}")
    return check_parents(parents, B, N, q.device)


def check_parents(parents, B: int, N: int, device) -> torch.Tensor:
    """parents: [N] or [B, N] integers with -1 <= parents[i] < i (topological order)."""
    parents = torch.as_tensor(parents)
    if parents.dtype.is_floating_point or parents.dtype.is_complex or parents.dtype == torch.bool:
        raise TypeError(f"parents must be an integer tensor, got {parents.dtype}")
    if parents.dim() == 1:
        parents = parents.unsqueeze(0).expand(B, -1)
    if tuple(parents.shape) != (B, N):
        raise ValueError(f"parents must have shape [N] or [B, N] = [{B}, {N}], got {tuple(parents.shape)}")
    # One host sync: a malformed forest would otherwise give silently wrong outputs.
    idx = torch.arange(N, device=parents.device)
    bad = (parents < -1) | (parents >= idx)
    if bool(bad.any()):
        b, i = (int(x) for x in bad.nonzero()[0])
        raise ValueError(
            f"parents must be in topological order with -1 <= parents[i] < i; "
            f"got parents[{b}, {i}] = {int(parents[b, i])}"
        )
    return parents.to(device=device, dtype=torch.int64).contiguous()


def recurrent_gated_delta_rule(q, k, v, g, beta, state):
    """The plain sequential rule over one chain, fp32.

    q, k: [T, H, K]; v: [T, H, V]; g, beta: [T, H]; state: [H, K, V].
    Returns (o [T, H, V], u [T, H, V], final state [H, K, V]).
    """
    S = state.float()
    o = q.new_zeros(q.shape[0], *v.shape[1:], dtype=torch.float32)
    u = torch.zeros_like(o)
    for t in range(q.shape[0]):
        S = g[t].float().exp()[:, None, None] * S  # decay first ...
        kt = k[t].float()
        u[t] = beta[t].float()[:, None] * (v[t].float() - torch.einsum("hkv,hk->hv", S, kt))
        S = S + kt[:, :, None] * u[t][:, None, :]  # ... then write
        o[t] = torch.einsum("hkv,hk->hv", S, q[t].float())  # read after the update
    return o, u, S


def tree_gdn_naive(q, k, v, g, beta, parents, state):
    """Gated delta rule on a forest, by walking each node's root-to-node path from S0.

    q, k: [B, N, H, K]; v: [B, N, H, V]; g, beta: [B, N, H]; parents: [N] or [B, N];
    state: [B, H, K, V]. Returns (o [B, N, H, V] in q's dtype, Factors in fp32).
    """
    par = check_inputs(q, k, v, g, beta, parents, state)
    B, N, H, _ = q.shape
    o = torch.zeros(B, N, H, v.shape[-1], dtype=torch.float32, device=q.device)
    u = torch.zeros_like(o)
    G = torch.zeros(B, N, H, dtype=torch.float32, device=q.device)
    for b in range(B):
        row = par[b].tolist()
        for i in range(N):
            p = path_to(row, i)
            ob, ub, _ = recurrent_gated_delta_rule(q[b, p], k[b, p], v[b, p], g[b, p], beta[b, p], state[b])
            o[b, i], u[b, i] = ob[-1], ub[-1]  # u_i depends only on i's ancestors: the same on every path
            G[b, i] = g[b, p].float().sum(0)
    return o.to(q.dtype), Factors(k.float(), u, G, par)
