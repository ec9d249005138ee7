"""tree_gdn in closed form, PyTorch only (the fast path on CPU and MPS).

The chain algorithm (WY/UT transform of fla's chunk_gated_delta_rule) with two substitutions:
a path cumsum instead of a sequence cumsum, and an ancestor mask instead of a causal mask
(derivation: docs/gdn_tree.md). With M the ancestor-or-self matrix (M_ij = 1 iff j is i or an ancestor):

    G = M g                                             path cumsum, [N]
    D_ij = M_ij exp(G_i - G_j)                          decay from j to i along i's path
    A_ij = beta_i D_ij (k_i . k_j)   for j a proper ancestor of i
    (I + A) U = beta * (V - exp(G) K S0)                unit lower-triangular in topological order
    o_i = exp(G_i) q_i^T S0 + sum_j D_ij (q_i . k_j) u_j

Computed in fp32 whatever the input dtype; o is returned in q's dtype.
"""

from __future__ import annotations

import math

import torch

from speclib.core.tree import ancestor_mask

from .naive import Factors, check_inputs


def tree_gdn_chunk(q, k, v, g, beta, parents, state):
    """Gated delta rule on a forest, all nodes at once.

    q, k: [B, N, H, K]; v: [B, N, H, V]; g, beta: [B, N, H] (g = log-decay <= 0);
    parents: [N] or [B, N], -1 = attached to the committed state, topological;
    state S0: [B, H, K, V]. Returns (o [B, N, H, V] in q's dtype, Factors in fp32).
    """
    par = check_inputs(q, k, v, g, beta, parents, state)
    B, N, H, K = q.shape
    if N == 0:
        return v.new_zeros(v.shape, dtype=q.dtype), Factors(k.float(), v.float(), g.float(), par)
    if N == 1:
        # One node on the committed state (every AR step): the recurrence step itself, no N x N machinery.
        qf, kf, vf, S0 = q[:, 0].float(), k[:, 0].float(), v[:, 0].float(), state.float()  # [B, H, *]
        a = g[:, 0].float().exp().unsqueeze(-1)  # [B, H, 1]
        u = beta[:, 0].float().unsqueeze(-1) * (vf - a * torch.einsum("bhk,bhkv->bhv", kf, S0))
        o = a * torch.einsum("bhk,bhkv->bhv", qf, S0) + (qf * kf).sum(-1, keepdim=True) * u
        return o.unsqueeze(1).to(q.dtype), Factors(k.float(), u.unsqueeze(1), g.float(), par)
    # Head-major fp32 views for batched matmuls: [B, H, N, *].
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    gf, bf = (t.float().transpose(1, 2) for t in (g, beta))  # [B, H, N]
    S0 = state.float()

    M = ancestor_mask(par)  # [B, N, N] bool
    G = torch.einsum("bij,bhj->bhi", M.float(), gf)  # [B, H, N]
    anc = M.unsqueeze(1)  # [B, 1, N, N]
    # Mask BEFORE exp: for non-ancestor pairs G_i - G_j can be large and positive (inf * 0 = NaN).
    diff = G.unsqueeze(-1) - G.unsqueeze(-2)
    D = torch.where(anc, diff, torch.full_like(diff, -math.inf)).exp()  # [B, H, N, N]
    strict = D * (1.0 - torch.eye(N, device=q.device))  # proper ancestors only

    eG = G.exp()
    A = bf.unsqueeze(-1) * strict * (kf @ kf.transpose(-1, -2))
    rhs = bf.unsqueeze(-1) * (vf - eG.unsqueeze(-1) * (kf @ S0))  # [B, H, N, V]
    eye = torch.eye(N, device=q.device)
    U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)

    o = eG.unsqueeze(-1) * (qf @ S0) + (D * (qf @ kf.transpose(-1, -2))) @ U
    factors = Factors(k.float(), U.transpose(1, 2).contiguous(), G.transpose(1, 2).contiguous(), par)
    return o.transpose(1, 2).to(q.dtype).contiguous(), factors
