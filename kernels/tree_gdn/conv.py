"""tree_conv1d: the short causal depthwise conv1d (width W, typically 4) of a Gated DeltaNet layer,
on a forest. Each node convolves over itself, its ancestors (nearest first) and then the committed
tail, i.e. over the sequence it would see if its root-to-node path had been decoded as a chain.

Layout as ``nn.Conv1d(D, D, W, groups=D, padding=W - 1)`` truncated to causal, with the weight
squeezed to [D, W]: weight[:, W - 1] multiplies the node itself and weight[:, W - 1 - s] the input
s steps back along the path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .naive import check_parents

ACTIVATIONS = ("silu", None)


def _check(x, parents, tail, weight, bias, activation):
    if x.dim() != 3:
        raise ValueError(f"x must be [B, N, D], got shape {tuple(x.shape)}")
    B, N, D = x.shape
    if weight.dim() != 2 or weight.shape[0] != D or weight.shape[1] < 1:
        raise ValueError(f"weight must be [D, W] = [{D}, W >= 1], got {tuple(weight.shape)}")
    W = weight.shape[1]
    if tuple(tail.shape) != (B, W - 1, D):
        raise ValueError(
            f"tail must be [B, W - 1, D] = {(B, W - 1, D)} (the last W - 1 committed inputs), got {tuple(tail.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (D,):
        raise ValueError(f"bias must be [D] = [{D}] or None, got {tuple(bias.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    return check_parents(parents, B, N, x.device)


def _finish(y, bias, activation, dtype):
    if bias is not None:
        y = y + bias.float()
    return (F.silu(y) if activation == "silu" else y).to(dtype)


def tree_conv1d_naive(x, parents, tail, weight, bias=None, activation="silu"):
    """Per-node loop (the definition). x: [B, N, D]; parents: [N] or [B, N]; tail: [B, W-1, D];
    weight: [D, W]; bias: [D] or None. Returns [B, N, D] in x's dtype (computed in fp32)."""
    par = _check(x, parents, tail, weight, bias, activation).tolist()
    B, N, D = x.shape
    W = weight.shape[1]
    y = torch.zeros(B, N, D, dtype=torch.float32, device=x.device)
    for b in range(B):
        for i in range(N):
            node, back = i, 0  # `back` counts steps taken into the tail once the path ends
            for s in range(W):
                if node >= 0:
                    inp = x[b, node]
                    node = par[b][node]
                else:
                    back += 1
                    inp = tail[b, W - 1 - back]
                y[b, i] += weight[:, W - 1 - s].float() * inp.float()
    return _finish(y, bias, activation, x.dtype)


def lookback_index(parents: torch.Tensor, W: int) -> torch.Tensor:
    """idx [B, N, W]: row s gives, for each node, the position s steps back along its path in the
    concatenation [tail, x] (length W - 1 + N). parents: [B, N] int64.

    Loops over the W - 1 steps back (W is small), never over nodes.
    """
    B, N = parents.shape
    T = W - 1  # node i sits at T + i, tail[-1] at T - 1
    cur = (T + torch.arange(N, device=parents.device)).expand(B, N)
    out = [cur]
    for _ in range(W - 1):
        in_tree = cur >= T
        p = torch.gather(parents, 1, (cur - T).clamp(min=0))
        # A node steps to its parent (or to tail[-1] from a root); a tail slot steps one back.
        cur = torch.where(in_tree, torch.where(p >= 0, T + p, T - 1), cur - 1)
        out.append(cur)
    return torch.stack(out, dim=-1)


def tree_conv1d(x, parents, tail, weight, bias=None, activation="silu"):
    """Path-dependent causal depthwise conv1d on a forest, vectorised (gather by distance).

    x: [B, N, D] pending inputs in topological order; parents: [N] or [B, N] (-1 = child of the
    committed tip); tail: [B, W-1, D] last W-1 committed inputs (oldest first); weight: [D, W];
    bias: [D] or None; activation: "silu" or None. Returns [B, N, D] in x's dtype.
    """
    par = _check(x, parents, tail, weight, bias, activation)
    B, N, D = x.shape
    W = weight.shape[1]
    seq = torch.cat([tail.float(), x.float()], dim=1)  # [B, W-1+N, D]
    if N == 1:  # one root (every AR step): the plain causal conv over tail + x
        return _finish((seq * weight.float().transpose(0, 1)).sum(1, keepdim=True), bias, activation, x.dtype)
    idx = lookback_index(par, W)  # [B, N, W]
    taps = torch.gather(seq, 1, idx.reshape(B, N * W, 1).expand(-1, -1, D)).reshape(B, N, W, D)
    w = weight.float().flip(-1).transpose(0, 1)  # [W, D]: row s = weight[:, W-1-s]
    y = (taps * w).sum(2)
    return _finish(y, bias, activation, x.dtype)
