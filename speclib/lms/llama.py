"""A lean forward over a transformers Llama's weights, behind the LM protocol.

The stock forward spends most of a small model's step on per-call machinery (mask building, cache
objects, keyword plumbing): about 1 ms for a 2-layer draft whose arithmetic takes a fraction of that.
Here the KV cache is one preallocated tensor per layer (written in place), rotary tables are
precomputed, and attention is one scaled_dot_product_attention call with a boolean mask only when
needed. Norms, projections and MLPs are the transformers modules themselves, so the weights and the
numerics are the same; `HFLM` (the stock forward) is the slow twin it is tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from speclib.lms.lm import HFLM


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


class LlamaLM(HFLM):
    """Same protocol and results as HFLM for Llama-architecture models, with less overhead per call."""

    def __init__(self, model, tokenizer, device, path=None):
        super().__init__(model, tokenizer, device, path)
        cfg = model.config
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        inner = model.model
        with torch.inference_mode():
            pos = torch.arange(self.max_length, device=device)[None]
            probe = torch.zeros(1, device=device, dtype=self.dtype)
            cos, sin = inner.rotary_emb(probe, pos)  # [1, T, head_dim]
        self.cos, self.sin = cos[0], sin[0]
        shape = (cfg.num_hidden_layers, 2, self.n_kv, self.max_length, self.head_dim)
        self.kv = torch.empty(shape, device=device, dtype=self.dtype)  # [L, k/v, Hkv, T, hd]

    @torch.inference_mode()
    def reset(self, prompt_ids) -> torch.Tensor:
        ids = self._prompt_ids(prompt_ids)
        self._start(0)
        self._feats_valid = self._features_on()
        logits = self._forward(ids, torch.arange(ids.numel(), device=self.device), 0, "causal")
        self._start(ids.numel())
        return logits[-1]

    @torch.inference_mode()
    def extend(self, tokens, parents) -> torch.Tensor:
        ids, pos, old, chain = self._new_nodes(tokens, parents)
        if chain:
            mask = None if ids.numel() == 1 else "chain"
        else:
            mask = self._tree_allowed(old)  # bool: True = may attend
        return self._forward(ids, pos, self.n_committed + old, mask)

    def _forward(self, ids, pos, start: int, mask) -> torch.Tensor:
        """ids, pos: [n]; new keys go to cache slots start..start+n-1; returns fp32 logits [n, V]."""
        end = start + ids.numel()
        if isinstance(mask, str) and mask == "chain":
            mask = torch.arange(end, device=self.device)[None] <= torch.arange(start, end, device=self.device)[:, None]
        causal = isinstance(mask, str)  # prefill from an empty cache
        cos, sin = self.cos[pos][None], self.sin[pos][None]  # [1, n, hd]
        inner = self.model.model
        x = inner.embed_tokens(ids[None])
        hidden = [x[0]] if self._features_on() else None  # transformers' hidden_states, [n, d] each
        for i, layer in enumerate(inner.layers):
            q, k, v = self.qkv(layer, x, cos, sin)
            self.kv[i, 0, :, start:end], self.kv[i, 1, :, start:end] = k[0], v[0]
            keys, values = self.kv[i, 0, :, :end][None], self.kv[i, 1, :, :end][None]
            x = self.attend_mlp(layer, x, q, keys, values, None if causal else mask, causal)
            if hidden is not None:
                hidden.append(x[0])
        x = inner.norm(x)
        if hidden is not None:
            hidden[-1] = x[0]  # the last one is the normed state
            self._write_features(hidden, start)
        return self.model.lm_head(x)[0].float()

    # One layer in two halves, shared with the ONNX export (`backends`), which keeps its cache outside.
    def qkv(self, layer, x, cos, sin):
        """x [1, n, d] -> q [1, H, n, hd], k and v [1, Hkv, n, hd], rotary applied to q and k."""
        n, att, h = x.shape[1], layer.self_attn, layer.input_layernorm(x)
        q = att.q_proj(h).view(1, n, self.n_heads, self.head_dim).transpose(1, 2)
        k = att.k_proj(h).view(1, n, self.n_kv, self.head_dim).transpose(1, 2)
        v = att.v_proj(h).view(1, n, self.n_kv, self.head_dim).transpose(1, 2)
        return _rope(q, cos, sin), _rope(k, cos, sin), v

    def attend_mlp(self, layer, x, q, keys, values, mask, causal: bool = False):
        """The rest of the layer: attention over keys/values [1, Hkv, T, hd] (bool mask [n, T], True =
        may attend), output projection, residuals and MLP."""
        o = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, is_causal=causal, enable_gqa=self.n_kv != self.n_heads
        )
        x = x + layer.self_attn.o_proj(o.transpose(1, 2).reshape(1, x.shape[1], -1))
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def _commit(self, path: list[int]) -> None:
        n, keep = self.n_committed, len(path)
        if path != list(range(keep)):  # a chain prefix needs no copy
            src = torch.tensor(path, device=self.device) + n
            self.kv[:, :, :, n : n + keep] = self.kv[:, :, :, src]
        self._commit_features(path)
