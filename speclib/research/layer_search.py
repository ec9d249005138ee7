"""Searching layer subsets for self-speculation, and training their exit adapter (docs/self_speculation.md).

    best = search_subsets(target, prompts, proxy_measure(target, windows), budget=30)
    adapter, report = train_exit(target, layers, stream, steps=200)

Losses and acceptance proxies compare a subset view's next-token distribution with the full model's;
`flop_cost` is a subset's cost relative to the full model; `train_exit` distils the full model into an
`ExitAdapter` on the subset's last hidden state (the target's weights are untouched).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from speclib.core.analytic import predicted_speedup
from speclib.core.device import clock
from speclib.drafters.layers import ExitAdapter, _layered
from speclib.lms.hybrid import HybridLM, check_layers
from speclib.research.training import run_training


# --- teacher-forced measurements ------------------------------------------------------------------
def _logits(lm, window) -> torch.Tensor:
    """[len(window), V] fp32: the LM's next-token logits after every prefix of `window` (a reset on the
    first token, then one chain extend over the rest)."""
    w = [int(t) for t in window]
    first = lm.reset(w[:1])[None]
    if len(w) == 1:
        return first
    rest = lm.extend(w[1:], list(range(-1, len(w) - 2)))
    lm.commit([])
    return torch.cat([first, rest])


def _check_windows(windows, shortest: int) -> list:
    windows = list(windows)
    if not windows or any(len(w) < shortest for w in windows):
        raise ValueError(
            f"windows must be one or more token windows of >= {shortest} tokens each, got lengths "
            f"{[len(w) for w in windows]}"
        )
    return windows


def lm_loss(lm, windows) -> float:
    """Mean next-token loss (nats) of any chain LM over token windows (one reset + extend per window)."""
    windows = _check_windows(windows, 2)
    losses = [
        F.cross_entropy(_logits(lm, w)[:-1], torch.tensor([int(t) for t in w[1:]]), reduction="none") for w in windows
    ]
    return float(torch.cat(losses).mean())


def subset_loss(target: HybridLM, layers, windows, exit: torch.nn.Module | None = None) -> float:
    """Mean held-out next-token loss (nats) of the subset model over token windows: the same
    computation as `bench_tree.heldout_loss` on `target.view(layers=layers, exit=exit)`."""
    return lm_loss(
        _layered(target, "subset_loss").view(layers=check_layers(layers, len(target.is_gdn)), exit=exit), windows
    )


def _acceptance(p_logits: torch.Tensor, q_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per-position probability that a token drawn from q is accepted for p: sum_x min(p(x), q(x))
    (1 - total variation, the lossless rule's acceptance); at temperature 0, argmax agreement."""
    if temperature == 0:
        return (p_logits.argmax(-1) == q_logits.argmax(-1)).float()
    p, q = (torch.softmax(x / temperature, -1) for x in (p_logits, q_logits))
    return torch.minimum(p, q).sum(-1)


def lm_acceptance(full, draft, windows, temperature: float = 1.0) -> float:
    """Mean teacher-forced acceptance of `draft`'s distributions for `full`'s (any two chain LMs over one
    vocabulary) on token windows: at every position sum_x min(p, q), argmax agreement at temperature 0."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    windows = _check_windows(windows, 1)
    return float(torch.cat([_acceptance(_logits(full, w), _logits(draft, w), temperature) for w in windows]).mean())


def acceptance_proxy(
    target: HybridLM, layers, windows, exit: torch.nn.Module | None = None, temperature: float = 1.0
) -> float:
    """Mean teacher-forced acceptance of the subset's drafts on token windows: at every position,
    sum_x min(p, q) between the full model p and the subset q (argmax agreement at temperature 0).
    A cheap stand-in for the per-token acceptance a of decoding runs (it scores the windows' text, not
    the target's own continuations)."""
    _layered(target, "acceptance_proxy")
    full = target.view(layers=list(range(len(target.is_gdn))), exit=None)
    return lm_acceptance(full, target.view(layers=layers, exit=exit), windows, temperature)


def flop_cost(target: HybridLM, layers, context: int = 128) -> float:
    """Analytic cost ratio c of one subset token to one full-model token at a context of `context`
    tokens, in multiply-adds: 2 per weight of each layer run and of the LM head; per attention layer
    also 4 * heads * head_dim * context (scores and values over the cache: grows with the context);
    per GDN layer 4 * heads * K * V (its fixed-size state). Wall-clock c on a given machine also
    carries per-layer call overhead: time it (bench.latencies on the view) before trusting this."""
    if not isinstance(target, HybridLM):  # it prices GDN and attention layers from the hybrid's modules
        raise TypeError(f"flop_cost needs a HybridLM, got {type(target).__name__}")
    layers = check_layers(layers, len(target.is_gdn))
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"context must be an int >= 1, got {context!r}")

    def layer(i: int) -> float:
        mod = target.text.layers[i]
        w = 2.0 * sum(p.numel() for p in mod.parameters() if p.dim() > 1)
        if target.is_gdn[i]:
            la = mod.linear_attn
            return w + 4.0 * la.num_v_heads * la.head_k_dim * la.head_v_dim
        return w + 4.0 * target.config.num_attention_heads * mod.self_attn.head_dim * context

    head = 2.0 * target.model.lm_head.weight.numel()
    return (head + sum(layer(i) for i in layers)) / (head + sum(layer(i) for i in range(len(target.is_gdn))))


def proxy_measure(target: HybridLM, windows, context: int = 128, temperature: float = 1.0) -> Callable:
    """A cheap `measure` for `search_subsets`: (acceptance_proxy, flop_cost) of a subset; the full
    model's logits on `windows` are computed once."""
    full = _layered(target, "proxy_measure").view(layers=list(range(len(target.is_gdn))), exit=None)
    windows = _check_windows(windows, 1)
    p = [_logits(full, w) for w in windows]

    def measure(layers, prompts=None) -> tuple[float, float]:
        view = target.view(layers=layers, exit=None)
        acc = torch.cat([_acceptance(pw, _logits(view, w), temperature) for pw, w in zip(p, windows)])
        return float(acc.mean()), flop_cost(target, layers, context)

    return measure


# --- the search -----------------------------------------------------------------------------------------
@dataclass
class SubsetSearch:
    """What `search_subsets` found: the best subset seen, where it started, and every measurement
    (rows of layers, alpha, c, predicted speedup) in order."""

    layers: list[int]
    predicted: float
    start: list[int]
    start_predicted: float
    history: list[dict] = field(default_factory=list)

    @property
    def evaluations(self) -> int:
        return len(self.history)


def search_subsets(
    target: HybridLM, prompts, measure: Callable, budget: int = 30, k: int = 2, v: float = 1.0, start=None
) -> SubsetSearch:
    """Greedy layer removal maximising the analytic predicted speedup E(a, k) / (k c + v).

    measure(layers, prompts) -> (a, c): per-token acceptance of the subset's drafts and its cost ratio
    to the full model (`proxy_measure` is a cheap one; a notebook plugs in timed decoding runs).
    From `start` (default: every layer), each round measures every subset with one more layer
    dropped and moves to the best of them, even when it predicts less than the current one (a
    descent can climb again later: the cost keeps falling); it stops when one layer is left or after
    `budget` measurements in all, and returns the best subset seen, so never one predicted below the
    start. v is the full model's verify ratio T(k+1)/T(1), the same for every subset."""
    _layered(target, "search_subsets")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget (measurements) must be an int >= 1, got {budget!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (draft length) must be an int >= 1, got {k!r}")
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"v (verify cost ratio) must be a finite number > 0, got {v!r}")
    L = len(target.is_gdn)
    current = check_layers(range(L) if start is None else start, L)
    history: list[dict] = []

    def score(layers: list[int]) -> float:
        a, c = measure(list(layers), prompts)
        if not (0 <= a <= 1 and c > 0 and math.isfinite(c)):
            raise ValueError(f"measure({layers}) must return (a in [0, 1], c > 0 finite), got ({a!r}, {c!r})")
        s = predicted_speedup(a, k, c, v)
        history.append(dict(layers=list(layers), alpha=float(a), c=float(c), predicted=s))
        return s

    best = (score(current), current)
    first = best
    now = current
    while len(now) > 1 and len(history) < budget:
        round_ = []
        for i in now:
            if len(history) >= budget:
                break
            cand = [j for j in now if j != i]
            round_.append((score(cand), cand))
        top = max(round_, key=lambda r: r[0])
        best = max(best, top, key=lambda r: r[0])
        now = top[1]
    return SubsetSearch(best[1], best[0], first[1], first[0], history)


class _Capture(torch.nn.Module):
    """An identity exit that keeps the last hidden state it saw (what a subset feeds its exit)."""

    def forward(self, h):
        self.h = h
        return h


def _hidden(view: HybridLM, window: list[int]) -> torch.Tensor:
    """[T, D] last hidden states of `view`'s layers over a window (its exit must be a _Capture)."""
    view.reset(window)
    return view.exit.h[0].clone()  # clone: a normal tensor out of inference mode, usable by autograd


def _windows(stream: np.ndarray, starts, seq: int) -> list[list[int]]:
    return [stream[s : s + seq].astype(np.int64).tolist() for s in starts]


def train_exit(
    target: HybridLM,
    layers,
    stream: np.ndarray,
    steps: int,
    *,
    held: np.ndarray | None = None,
    minutes: float = 10.0,
    rank: int = 16,
    batch: int = 8,
    seq: int = 128,
    lr: float = 3e-3,
    n_eval: int = 8,
    seed: int = 0,
    log=None,
) -> tuple[ExitAdapter, dict]:
    """Train an `ExitAdapter` for the subset `layers` by distillation: minimise KL(p_full || q_subset)
    per position, p the full model's next-token softmax, q the subset's through the adapter and the
    frozen final norm + LM head. Only the adapter's weights change. Training windows are sampled from
    `stream` (the training split, e.g. train.token_stream("train", tok)); `held` (default: the last
    10% of `stream`, then not trained on) gives `n_eval` evenly spaced evaluation windows. Stops after
    `steps` steps or `minutes`. Returns (adapter, report): KL and acceptance proxy (sum min(p, q))
    on the held-out windows before and after, steps, tokens, seconds."""
    _layered(target, "train_exit")
    layers = check_layers(layers, len(target.is_gdn))
    for name, val, lo in (("steps", steps, 1), ("batch", batch, 1), ("seq", seq, 2), ("n_eval", n_eval, 1)):
        if isinstance(val, bool) or not isinstance(val, int) or val < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {val!r}")
    if not minutes > 0:
        raise ValueError(f"minutes must be > 0, got {minutes!r}")
    stream = np.asarray(stream)
    if held is None:
        cut = int(len(stream) * 0.9)
        stream, held = stream[:cut], stream[cut:]
    held = np.asarray(held)
    for name, s in (("stream", stream), ("held", held)):
        if len(s) < seq + 1:
            raise ValueError(f"{name} has {len(s)} tokens, fewer than seq + 1 = {seq + 1}")
    if seq > target.max_length:
        raise ValueError(f"seq ({seq}) is beyond the model's context of {target.max_length}")

    adapter = ExitAdapter(target.hidden_size, rank, seed=seed).to(target.device)
    full = target.view(layers=list(range(len(target.is_gdn))), exit=_Capture())
    sub = target.view(layers=layers, exit=_Capture())
    _, norm, lm_head = target.frozen_parts()

    def pair(window) -> tuple[torch.Tensor, torch.Tensor]:
        """(log p of the full model [T, V], the subset's last hidden states [T, D]) over one window."""
        with torch.no_grad():
            logp = F.log_softmax(lm_head(norm(_hidden(full, window))).float(), -1)
        return logp, _hidden(sub, window)

    def q_logprobs(h: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(lm_head(norm(adapter(h))).float(), -1)

    eval_pairs = [pair(w) for w in _windows(held, np.linspace(0, len(held) - seq, n_eval).astype(int), seq)]

    @torch.no_grad()
    def evaluate() -> tuple[float, float]:
        kl, acc = [], []
        for logp, h in eval_pairs:
            logq = q_logprobs(h)
            kl.append((logp.exp() * (logp - logq)).sum(-1))
            acc.append(torch.minimum(logp.exp(), logq.exp()).sum(-1))
        return float(torch.cat(kl).mean()), float(torch.cat(acc).mean())

    kl_before, acc_before = evaluate()
    opt = torch.optim.AdamW(adapter.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)

    def step_loss():
        starts = torch.randint(0, len(stream) - seq + 1, (batch,), generator=gen).tolist()
        pairs = [pair(w) for w in _windows(stream, starts, seq)]
        logp = torch.cat([p for p, _ in pairs])
        logq = q_logprobs(torch.cat([h for _, h in pairs]))
        return (logp.exp() * (logp - logq)).sum(-1).mean(), None

    def on_step(st, loss, _):
        if log is not None and (st["step"] % 10 == 0 or st["step"] == 1):
            log(f"step {st['step']}: KL {loss.item():.4f}")

    t0 = clock()
    # A constant lr and no clipping: the recipe the exit adapters were tuned with.
    st = run_training(
        step_loss, opt, steps=steps, minutes=minutes, tokens_per_step=batch * seq, clip=None, on_step=on_step
    )
    kl_after, acc_after = evaluate()
    report = dict(
        layers=layers,
        rank=rank,
        steps=st["step"],
        tokens=st["tokens"],
        seconds=clock() - t0,
        kl_before=kl_before,
        kl_after=kl_after,
        acceptance_before=acc_before,
        acceptance_after=acc_after,
        eval_windows=n_eval,
        seq=seq,
    )
    return adapter.eval(), report
