"""tree_gdn: the gated delta rule (Qwen3-Next / Qwen3.5 Gated DeltaNet) over a forest of pending
nodes attached to a committed state, ``fold`` to commit one accepted path, and ``tree_conv1d``,
the path-dependent short causal conv that precedes the rule.

    o, factors = tree_gdn(q, k, v, g, beta, parents, state)   # verify a draft tree
    new_state = fold(factors, path, state)                     # commit the accepted root-to-leaf path

Implementations (they agree; tests/test_tree_gdn.py): "naive" (the definition, per-node loop),
"chunk" (PyTorch closed form), "triton" (one kernel; CUDA, or CPU under TRITON_INTERPRET=1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .chunk import tree_gdn_chunk
from .conv import tree_conv1d, tree_conv1d_naive
from .naive import Factors, recurrent_gated_delta_rule, tree_gdn_naive

__all__ = [
    "tree_gdn",
    "fold",
    "tree_conv1d",
    "Factors",
    "IMPLS",
    "tree_gdn_naive",
    "tree_gdn_chunk",
    "tree_conv1d_naive",
    "recurrent_gated_delta_rule",
]

IMPLS = ("auto", "naive", "chunk", "triton")


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # ImportError, or a broken install failing on import
        return False
    return True


def tree_gdn(q, k, v, g, beta, parents, state, impl: str = "auto"):
    """Gated delta rule over a forest of pending nodes attached to the committed state.

    q, k: [B, N, H, K], already L2-normalised, q already scaled (e.g. by K ** -0.5);
    v: [B, N, H, V]; g: [B, N, H] log-decay (<= 0); beta: [B, N, H] in (0, 1);
    parents: LongTensor [N] or [B, N], -1 = child of the committed state, parents[i] < i;
    state S0: [B, H, K, V] (fla layout: o = S^T q).
    impl: "auto" (triton for CUDA tensors when triton imports, else chunk), "naive", "chunk", "triton".

    Returns (o [B, N, H, V] in q's dtype, Factors(k, u, G, parents) in fp32). S0 is not changed.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        impl = "chunk"
        if q.is_cuda and _triton_available():
            from .triton import MAX_NODES

            impl = "triton" if q.shape[1] <= MAX_NODES else "chunk"
    if impl == "naive":
        return tree_gdn_naive(q, k, v, g, beta, parents, state)
    if impl == "chunk":
        return tree_gdn_chunk(q, k, v, g, beta, parents, state)
    if not _triton_available():
        raise ValueError("impl='triton' needs the triton package (pip install triton)")
    from .triton import tree_gdn_triton  # imported late: triton is optional and slow to import

    return tree_gdn_triton(q, k, v, g, beta, parents, state)


def _paths(path, B: int) -> list[list[int]]:
    """One path shared by the batch ([L] ints or 1-D tensor), or B paths (list of sequences)."""
    if isinstance(path, torch.Tensor):
        if path.dim() == 2:
            return [list(map(int, row)) for row in path.tolist()]
        return [list(map(int, path.tolist()))] * B
    path = list(path)
    if path and all(isinstance(p, (Sequence, torch.Tensor)) for p in path):
        if len(path) != B:
            raise ValueError(f"path: a per-batch list needs B = {B} paths, got {len(path)}")
        return [[int(x) for x in p] for p in path]
    return [[int(x) for x in path]] * B


def fold(factors: Factors, path, state: torch.Tensor) -> torch.Tensor:
    """Commit one root-to-leaf path: S* = exp(G_leaf) S0 + sum_{j in path} exp(G_leaf - G_j) k_j u_j^T.

    factors: from tree_gdn on the same state; path: node indices root-to-leaf (a list/1-D tensor
    shared by the batch, or a list of B such paths, possibly of different lengths; empty = nothing
    accepted); state S0: [B, H, K, V]. Returns the new state [B, H, K, V] in state's dtype; equals
    running the recurrence along the path. Only the path's factors are read.
    """
    B, N, H, _ = factors.k.shape
    paths = _paths(path, B)
    par = factors.parents.tolist()
    for b, p in enumerate(paths):
        for t, node in enumerate(p):
            want = p[t - 1] if t else -1
            if not 0 <= node < N or par[b][node] != want:
                raise ValueError(
                    f"path must run root-to-leaf through the forest (node indices 0..{N - 1}); "
                    f"batch {b} step {t}: node {node} is not a child of {want}"
                )
    L = max((len(p) for p in paths), default=0)
    if L == 0:
        return state.clone()
    dev = factors.k.device
    if all(len(p) == 1 for p in paths):  # one node per row (every AR step): S* = e^G S0 + k u^T
        bidx, node = torch.arange(B, device=dev), torch.tensor([p[0] for p in paths], device=dev)
        kk, uu, GG = factors.k[bidx, node], factors.u[bidx, node], factors.G[bidx, node]  # [B, H, *]
        S = GG.exp()[..., None, None] * state.float() + kk.unsqueeze(-1) * uu.unsqueeze(-2)
        return S.to(state.dtype)
    idx = torch.tensor([p + [0] * (L - len(p)) for p in paths], device=dev)  # [B, L]
    live = torch.tensor([[1.0] * len(p) + [0.0] * (L - len(p)) for p in paths], device=dev)
    leaf = torch.tensor([p[-1] if p else 0 for p in paths], device=dev)
    bidx = torch.arange(B, device=dev)
    G_leaf = factors.G[bidx, leaf] * (live.sum(1) > 0).unsqueeze(-1)  # [B, H]; 0 if empty
    kk, uu, GG = (t[bidx[:, None], idx] for t in (factors.k, factors.u, factors.G))  # [B, L, H, *]
    # Mask before exp (padding positions may have GG anywhere), then zero them.
    w = torch.where(live[..., None] > 0, G_leaf[:, None] - GG, torch.zeros_like(GG)).exp() * live[..., None]
    S = G_leaf.exp()[..., None, None] * state.float() + torch.einsum("blh,blhk,blhv->bhkv", w, kk, uu)
    return S.to(state.dtype)
