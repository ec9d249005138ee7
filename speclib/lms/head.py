"""Feature-level draft heads (EAGLE style): the module, its files, and `HeadLM`, the head behind the LM protocol.

A head reads the target's hidden features (low / middle / high layers, fused as in EAGLE-3) with the
embedding of the next token, runs ONE decoder layer, and scores tokens through the target's frozen
final norm and LM head. `speclib.drafters.FeatureDrafter` drafts with a `HeadLM`; docs/feature_drafting.md
has the maths, and speclib.research.heads trains heads.

    head = speclib.load_head("code-target-head")       # data/checkpoints/code-target-head/
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from speclib.core.protocols import FeatureLM
from speclib.lms.llama import linear, rows_linear
from speclib.lms.lm import CHECKPOINTS, BaseLM

KIND = "speclib-feature-head"


WEIGHTS = "head.safetensors"


COUNTS = "token_counts.npy"  # the training stream's token frequencies (FR-Spec)


class HeadLayer(nn.Module):
    """One pre-norm Llama decoder layer (RoPE attention + SwiGLU MLP), split in two halves so the
    caller owns the attention: `qkv` (projections + RoPE) and `finish` (output projection + MLP)."""

    def __init__(self, d: int, n_heads: int, ff: int, eps: float, theta: float):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d // n_heads
        self.input_norm, self.post_norm = nn.RMSNorm(d, eps=eps), nn.RMSNorm(d, eps=eps)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up, self.down = (
            nn.Linear(d, ff, bias=False),
            nn.Linear(d, ff, bias=False),
            nn.Linear(ff, d, bias=False),
        )
        inv = theta ** -(torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        self.register_buffer("inv_freq", inv, persistent=False)

    def qkv(self, x: torch.Tensor, pos: torch.Tensor):
        """x [B, T, d], pos [T] -> q, k, v [B, H, T, hd], RoPE (rotate-half convention) on q and k."""
        B, T, _ = x.shape
        h = self.input_norm(x)
        q, k, v = (
            linear(m, h).view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for m in (self.q, self.k, self.v)
        )
        ang = pos.float()[:, None] * self.inv_freq[None]
        cos, sin = (torch.cat([f(ang)] * 2, -1).to(x.dtype) for f in (torch.cos, torch.sin))

        def rope(t):
            half = t.shape[-1] // 2
            return t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin

        return rope(q), rope(k), v

    def finish(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """x [B, T, d] the layer's input, o [B, H, T, hd] the attention output -> the layer's output."""
        x = x + linear(self.o, o.transpose(1, 2).reshape(x.shape))
        h = self.post_norm(x)
        return x + linear(self.down, F.silu(linear(self.gate, h)) * linear(self.up, h))


class FeatureHead(nn.Module):
    """fuse: Linear(len(feature_layers) * d, d) over the target's concatenated features (EAGLE-3);
    inp: Linear(2d, d) over [feature, embedding of the next token] (EAGLE); one decoder layer.
    Steps 2..k of a draft feed the head's own output state in place of the fused feature.
    `config`: hidden_size, num_heads, intermediate_size, vocab_size, feature_layers, rms_eps,
    rope_theta, target (a name) and fingerprint (the target's `weights_fingerprint()`)."""

    def __init__(self, config: dict):
        super().__init__()
        self.config = dict(config)
        d = config["hidden_size"]
        if d % config["num_heads"]:
            raise ValueError(f"hidden_size {d} is not divisible by num_heads {config['num_heads']}")
        self.fuse = nn.Linear(len(config["feature_layers"]) * d, d, bias=False)
        self.inp = nn.Linear(2 * d, d, bias=False)
        self.layer = HeadLayer(
            d, config["num_heads"], config["intermediate_size"], config["rms_eps"], config["rope_theta"]
        )

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return tuple(self.config["feature_layers"])

    def inputs(self, feature: torch.Tensor, emb: torch.Tensor, fused: bool) -> torch.Tensor:
        """The layer's input from a target feature (fused=True: [.., F], fused here) or the head's own
        output state (fused=False: [.., d]), and the next token's embedding [.., d]."""
        return self.inp(torch.cat([self.fuse(feature) if fused else feature, emb], -1))


def new_head(target, name: str | None = None, layers=None, seed: int = 0, ff: int | None = None) -> FeatureHead:
    """A freshly initialised head for `target` (a `speclib.core.protocols.FeatureLM`). layers: the hidden
    states it reads (default low / middle / high: L//4, L//2 and the final normed state L); ff: its MLP's
    width (default the target's intermediate size; its hidden size is always the target's)."""
    cfg = target._text_config()
    L = target.num_layers
    layers = tuple(layers) if layers is not None else (max(1, L // 4), max(1, L // 2), L)
    torch.manual_seed(seed)
    return FeatureHead(
        dict(
            hidden_size=target.hidden_size,
            num_heads=cfg.num_attention_heads,
            intermediate_size=ff or cfg.intermediate_size,
            vocab_size=target.vocab_size,
            feature_layers=list(layers),
            rms_eps=float(cfg.rms_norm_eps),
            rope_theta=10000.0,
            target=name or (target.path.name if getattr(target, "path", None) else "unnamed"),
            fingerprint=target.weights_fingerprint(),
        )
    )


# --- saving and loading ------------------------------------------------------------------------
def heads() -> list[str]:
    """Names of the heads shipped under data/checkpoints/."""
    return sorted(p.parent.name for p in CHECKPOINTS.glob(f"*/{WEIGHTS}")) if CHECKPOINTS.exists() else []


def save_head(head: FeatureHead, folder) -> Path:
    """config.json (kind, config) + head.safetensors (bf16, like the shipped models)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"kind": KIND, **head.config}, indent=1))
    save_file(
        {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in head.state_dict().items()}, folder / WEIGHTS
    )
    return folder


def load_head(name_or_path, device="cpu", dtype=torch.float32) -> FeatureHead:
    """A shipped head name (see `heads()`, e.g. "code-target-head") or a folder written by `save_head`."""
    from safetensors.torch import load_file

    shipped = heads()
    folder = CHECKPOINTS / name_or_path if name_or_path in shipped else Path(name_or_path)
    if name_or_path in shipped:
        from speclib.lms.loading import OPENED

        OPENED.add(name_or_path)
    if not (folder / WEIGHTS).exists():
        raise ValueError(
            f"unknown head {name_or_path!r}: not a shipped head {shipped}, nor a folder with {WEIGHTS} "
            f"(train one: python -m speclib train head TARGET)"
        )
    cfg = json.loads((folder / "config.json").read_text())
    if cfg.pop("kind", None) != KIND:
        raise ValueError(f"{folder / 'config.json'} is not a {KIND} config")
    head = FeatureHead(cfg)
    head.load_state_dict({k: v.float() for k, v in load_file(folder / WEIGHTS).items()})
    return head.to(device=device, dtype=dtype).eval()


def token_counts(name_or_path) -> np.ndarray:
    """How often each token occurs in the head's training stream [V] (saved by `train_head`): FR-Spec's
    frequency ranking (`speclib.drafters.frequent_tokens`)."""
    folder = CHECKPOINTS / name_or_path if name_or_path in heads() else Path(name_or_path)
    if not (folder / COUNTS).exists():
        raise ValueError(
            f"{folder} has no {COUNTS}: heads trained by `python -m speclib train head` since the "
            f"FR-Spec option save it; retrain, or pass the token ids to draft from yourself"
        )
    return np.load(folder / COUNTS)


class HeadLM(BaseLM):
    """A `FeatureHead` behind the LM protocol, reading `target`'s committed features.

    State: the head layer's KV cache [2, H, max_length, hd] and each slot's output state [max_length, d].
    Slot 0 (token 0 has no earlier feature) is never attended. reset(prompt) fills slots 1..N-1 from the
    target's features of the prompt (the target must have been reset on it, recording features)."""

    def __init__(self, head, target: FeatureLM, vocab: torch.Tensor | None = None):
        self.head, self.target = head, target
        self.embed, self.norm, self.lm_head = target.frozen_parts()
        # FR-Spec: score only `vocab` (token ids) through the LM head's rows, -inf elsewhere
        self.rows = None if vocab is None else torch.as_tensor(vocab, device=target.device).long()
        self._rows_head = None if vocab is None else rows_linear(self.lm_head, self.rows)
        self.tokenizer, self.device, self.max_length = target.tokenizer, target.device, target.max_length
        self.dtype = next(target.frozen_parts()[2].parameters()).dtype
        head.to(device=self.device, dtype=self.dtype).eval()
        H, hd, d = head.layer.n_heads, head.layer.head_dim, head.config["hidden_size"]
        self.kv = torch.zeros(2, H, self.max_length, hd, device=self.device, dtype=self.dtype)
        self.hidden = torch.zeros(self.max_length, d, device=self.device, dtype=self.dtype)
        self._start(0)

    @property
    def vocab_size(self) -> int:
        return self.head.config["vocab_size"]

    @torch.inference_mode()
    def reset(self, prompt_ids) -> torch.Tensor:
        """Fill slots 1..N-1; returns the logits [V] of the last slot (its guess of token N + 1), or zeros
        for a one-token prompt."""
        ids = self._prompt_ids(prompt_ids)
        self._start(1)  # slot 0: token 0, no feature, never attended
        logits = torch.zeros(self.vocab_size, device=self.device)
        if ids.numel() > 1:
            logits = self.extend(ids[1:].tolist(), list(range(-1, ids.numel() - 2)))[-1]
        self._start(ids.numel())
        return logits

    @torch.inference_mode()
    def extend(self, tokens, parents) -> torch.Tensor:
        ids, pos, old, chain = self._new_nodes(tokens, parents)
        start = self.n_committed + old
        end = start + ids.numel()
        feats = self.target.committed_features(0)  # [n_target, F], a view
        true = pos - 1 < feats.shape[0]  # the target has this node's feature
        parents = torch.tensor(self.pending_parents[old:], device=self.device)
        if not bool(true.all()) and bool((parents[~true] < 0).any()):
            raise RuntimeError(
                "HeadLM: a node after the committed tip has no target feature; draft() must feed "
                "the context's tail first"
            )
        inp = torch.empty(ids.numel(), self.hidden.shape[1], device=self.device, dtype=self.dtype)
        if bool(true.any()):
            inp[true] = linear(self.head.fuse, feats[pos[true] - 1].to(self.dtype))
        if not bool(true.all()):
            inp[~true] = self.hidden[self.n_committed + parents[~true]]
        x = linear(self.head.inp, torch.cat([inp, self.embed(ids)], -1))[None]
        q, k, v = self.head.layer.qkv(x, pos)
        self.kv[0, :, start:end], self.kv[1, :, start:end] = k[0], v[0]
        if chain:
            allowed = (
                torch.arange(end, device=self.device)[None] <= torch.arange(start, end, device=self.device)[:, None]
            )
        else:
            allowed = self._tree_allowed(old)
        allowed[:, 0] = False  # slot 0 holds no feature
        o = F.scaled_dot_product_attention(q, self.kv[0, :, :end][None], self.kv[1, :, :end][None], attn_mask=allowed)
        h = self.head.layer.finish(x, o)
        self.hidden[start:end] = h[0]
        return self.scores(self.norm(h)[0])

    def scores(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits [n, V] of normed states [n, d]: the full LM head, or (FR-Spec) only its `vocab` rows."""
        if self.rows is None:
            return linear(self.lm_head, normed).float()
        out = torch.full((normed.shape[0], self.vocab_size), float("-inf"), device=normed.device)
        out[:, self.rows] = linear(self._rows_head, normed).float()
        return out

    def _commit(self, path: list[int]) -> None:
        n, keep = self.n_committed, len(path)
        if path != list(range(keep)):
            src = torch.tensor(path, device=self.device) + n
            self.kv[:, :, n : n + keep] = self.kv[:, :, src]
            self.hidden[n : n + keep] = self.hidden[src]
