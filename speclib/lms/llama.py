"""A lean forward over a transformers Llama's weights, behind the LM protocol.

The stock forward spends most of a small model's step on per-call machinery (mask building, cache
objects, keyword plumbing): about 1 ms for a 2-layer draft whose arithmetic takes a fraction of that.
Here the KV cache is one preallocated tensor per layer (written in place), rotary tables are
precomputed, and attention is one scaled_dot_product_attention call with a boolean mask only when
needed. Norms, projections and MLPs are the transformers modules themselves, so the weights and the
numerics are the same; `HFLM` (the stock forward) is the slow twin it is tested against.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from speclib.lms.hybrid import _SAME, check_layers  # _SAME: view()'s "keep this LM's exit"
from speclib.lms.lm import HFLM

# On CPU the fp32 projections go through oneDNN with the weights reordered once into its blocked layout. The
# default path (MKL) is slow for the few-row products that verification is made of: on 2 cores of an AMD
# EPYC, agent-target scoring 9 tokens took 1.45x one token's time through MKL and 1.25x through oneDNN
# (notebook 05 has the table). Same weights; results equal to F.linear's to float rounding.
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
_packed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Linear -> (weight, its version, reordered)


def linear(mod: torch.nn.Module, x: torch.Tensor, packed: bool = True) -> torch.Tensor:
    """mod(x) for an nn.Linear, through oneDNN's reordered weights where that applies (fp32 on CPU, no
    gradient wanted, no autocast); any other module (a quantized Linear, a bf16 one) is simply called. The reordered copy
    is made on first use and again whenever the weight changes (a new tensor or an in-place update)."""
    w = getattr(mod, "weight", None)
    if (
        not (packed and _ONEDNN and type(mod) is torch.nn.Linear)
        or w.dtype != torch.float32
        or w.device.type != "cpu"
        or x.dtype != torch.float32
        or torch.is_autocast_enabled("cpu")  # autocast picks the matmul's dtype: leave it to F.linear
        or (w.requires_grad and torch.is_grad_enabled())
    ):
        return mod(x)
    hit = _packed.get(mod)
    if hit is None or hit[0] is not w or hit[1] != w._version:
        with torch.inference_mode():
            hit = _packed[mod] = (w, w._version, torch.ops.mkldnn._reorder_linear_weight(w.detach()))
    bias = None if mod.bias is None else mod.bias.detach()
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), hit[2], bias, "none", [], "")
    return y.view(*x.shape[:-1], y.shape[-1])


def rows_linear(lm_head: torch.nn.Module, rows: torch.Tensor) -> torch.nn.Linear:
    """A frozen Linear over the LM head's `rows` (FR-Spec's kept tokens), copied once so that a draft call
    neither gathers them again nor misses the reordered-weight path."""
    w = lm_head.weight.detach()[rows]
    out = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
    out.weight = torch.nn.Parameter(w.contiguous(), requires_grad=False)
    return out


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


class LlamaLM(HFLM):
    """Same protocol and results as HFLM for Llama-architecture models, with less overhead per call.

    `layers` (decoder-layer indices, default all) and `exit` (a module on the last hidden state [1, N, D]
    before the final norm and LM head, e.g. `speclib.drafters.layers.ExitAdapter`) make a layer-subset
    self-draft over the same weights (`view(layers=...)`, `LayerSkipDrafter`), as for `HybridLM`."""

    def __init__(self, model, tokenizer, device, path=None, layers=None, exit=None):
        super().__init__(model, tokenizer, device, path)
        cfg = model.config
        n_layers = cfg.num_hidden_layers
        self.layers = check_layers(range(n_layers) if layers is None else layers, n_layers)
        self.is_gdn = [False] * n_layers  # no linear-attention layer: the layer-subset tools read this
        self.exit = exit
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        inner = model.model
        with torch.inference_mode():
            pos = torch.arange(self.max_length, device=device)[None]
            probe = torch.zeros(1, device=device, dtype=self.dtype)
            cos, sin = inner.rotary_emb(probe, pos)  # [1, T, head_dim]
        self.cos, self.sin = cos[0], sin[0]
        shape = (len(self.layers), 2, self.n_kv, self.max_length, self.head_dim)
        self.kv = torch.empty(shape, device=device, dtype=self.dtype)  # [layers run, k/v, Hkv, T, hd]
        self._forward = _forward  # the decoder (module function); the torch-compile backend swaps in a compiled one
        self.vocab_rows = self._head_rows = None
        self.packed = True  # projections through oneDNN's reordered weights (`linear`); off for export and compile

    def view(self, layers=None, exit=_SAME) -> LlamaLM:
        """Another LlamaLM over the same weights with its own KV cache and decoding state (one per request
        in a batch: `extend_batch`, `speclib.core.generate.generate_batch`, the server's engine), or a
        self-draft running only `layers`. Unset arguments keep this LM's layers and exit; exit=None drops it."""
        out = type(self)(
            self.model,
            self.tokenizer,
            self.device,
            self.path,
            self.layers if layers is None else layers,
            self.exit if exit is _SAME else exit,
        )
        out.vocab_rows, out._head_rows, out.packed = self.vocab_rows, self._head_rows, self.packed
        return out

    def restrict_vocab(self, rows) -> LlamaLM:
        """FR-Spec for a draft: from now on score only the token ids `rows` through the LM head (logits -inf
        elsewhere), so a shallow draft stops paying for the full vocabulary's rows; None: the full head
        again. A target must never be restricted: it verifies over its whole vocabulary. Returns self."""
        if rows is None:
            self.vocab_rows = self._head_rows = None
            return self
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.device).unique()
        if rows.numel() == 0 or rows[0] < 0 or rows[-1] >= self.model.config.vocab_size:
            raise ValueError(f"rows must be token ids in [0, {self.model.config.vocab_size}), at least one")
        self.vocab_rows, self._head_rows = rows, rows_linear(self.model.lm_head, rows)
        return self

    @torch.inference_mode()
    def reset(self, prompt_ids) -> torch.Tensor:
        ids = self._prompt_ids(prompt_ids)
        self._start(0)
        self._feats_valid = self._features_on()
        logits = self._forward([(self, ids, torch.arange(ids.numel(), device=self.device), 0, "causal")], True)
        self._start(ids.numel())
        return logits[0][-1]

    @torch.inference_mode()
    def extend(self, tokens, parents) -> torch.Tensor:
        return self._forward([self._request(tokens, parents)])[0]

    @staticmethod
    def extend_batch(lms: list[LlamaLM], tokens: list, parents: list) -> list[torch.Tensor]:
        """Batched-extend capability (speclib.core.protocols.BatchedLM): `lms[r].extend(tokens[r],
        parents[r])` for every request in ONE forward. The projections, MLPs and LM head run once over
        all requests' new nodes (the weights are read once); attention runs per request over its own
        cache. The LMs must share one model (`view`). Returns one [n_r, V] fp32 logits tensor each."""
        if (
            not lms
            or not all(isinstance(lm, LlamaLM) for lm in lms)
            or len({(id(lm.model), tuple(lm.layers), id(lm.exit)) for lm in lms}) != 1
        ):
            raise ValueError(
                "extend_batch needs one or more LlamaLMs over the same model, layers and exit (make them with lm.view())"
            )
        if len(lms) != len(tokens) or len(lms) != len(parents):
            raise ValueError(f"got {len(lms)} LMs, {len(tokens)} token lists and {len(parents)} parent lists")
        if len({id(lm) for lm in lms}) != len(lms):
            raise ValueError("each request needs its own LlamaLM (decoding state); make them with lm.view()")
        reqs = []
        with torch.inference_mode():
            try:
                for lm, t, p in zip(lms, tokens, parents):
                    reqs.append(lm._request(t, p))
            except Exception:  # a bad request: undo the earlier ones, nothing is recorded
                for lm, _, _, start, _ in reqs:
                    old = start - lm.n_committed
                    del lm.pending_parents[old:], lm.pending_depths[old:]
                raise
            return lms[0]._forward(reqs)

    def _request(self, tokens, parents) -> tuple:
        """Check and record an extend's nodes: (lm, ids, positions, first cache slot, mask)."""
        ids, pos, old, chain = self._new_nodes(tokens, parents)
        if chain:
            mask = None if ids.numel() == 1 else "chain"
        else:
            mask = self._tree_allowed(old)  # bool: True = may attend
        return self, ids, pos, self.n_committed + old, mask

    # One layer in two halves, shared with the ONNX export (`backends`), which keeps its cache outside.
    def qkv(self, layer, x, cos, sin):
        """x [1, n, d] -> q [1, H, n, hd], k and v [1, Hkv, n, hd], rotary applied to q and k."""
        n, att, h = x.shape[1], layer.self_attn, layer.input_layernorm(x)
        q = self.linear(att.q_proj, h).view(1, n, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.linear(att.k_proj, h).view(1, n, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.linear(att.v_proj, h).view(1, n, self.n_kv, self.head_dim).transpose(1, 2)
        return _rope(q, cos, sin), _rope(k, cos, sin), v

    def linear(self, mod, x: torch.Tensor) -> torch.Tensor:
        return linear(mod, x, self.packed)

    def mlp(self, layer, x: torch.Tensor) -> torch.Tensor:
        """The layer's gated MLP on its post-attention norm of x."""
        m, h = layer.mlp, layer.post_attention_layernorm(x)
        return self.linear(m.down_proj, m.act_fn(self.linear(m.gate_proj, h)) * self.linear(m.up_proj, h))

    def attend_mlp(self, layer, x, q, keys, values, mask, causal: bool = False):
        """The rest of the layer: attention over keys/values [1, Hkv, T, hd] (bool mask [n, T], True =
        may attend), output projection, residuals and MLP."""
        x = x + self.linear(layer.self_attn.o_proj, self.attend(q, keys, values, mask, causal))
        return x + self.mlp(layer, x)

    def attend(self, q, keys, values, mask, causal: bool = False) -> torch.Tensor:
        """Attention of q [1, H, n, hd] over keys/values [1, Hkv, T, hd] -> [1, n, H * hd]."""
        o = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, is_causal=causal, enable_gqa=self.n_kv != self.n_heads
        )
        return o.transpose(1, 2).reshape(1, q.shape[2], -1)

    def _commit(self, path: list[int]) -> None:
        n, keep = self.n_committed, len(path)
        if path != list(range(keep)):  # a chain prefix needs no copy
            src = torch.tensor(path, device=self.device) + n
            self.kv[:, :, :, n : n + keep] = self.kv[:, :, :, src]
        self._commit_features(path)


def _forward(reqs: list[tuple], last_only: bool = False) -> list[torch.Tensor]:
    """The decoder over the requests' new tokens, concatenated along the token axis. reqs: (lm, ids [n],
    positions [n], first cache slot, mask: None, "chain", "causal" (a prefill from an empty cache) or bool
    [n, slot + n]); new keys go to each lm's cache slots start..start+n-1. Returns fp32 logits [n, V] each;
    last_only (one request, a prefill): [1, V] at the last token only (the LM head over every prompt
    position is about a fifth of SmolLM2's prefill arithmetic: 28M of 134M weights)."""
    lm0 = reqs[0][0]
    sizes = [r[1].numel() for r in reqs]
    ids, pos = torch.cat([r[1] for r in reqs]), torch.cat([r[2] for r in reqs])
    spans, masks = [], []
    for lm, rid, _, start, mask in reqs:
        end = start + rid.numel()
        if isinstance(mask, str) and mask == "chain":
            mask = torch.arange(end, device=lm.device)[None] <= torch.arange(start, end, device=lm.device)[:, None]
        spans.append((start, end))
        masks.append(mask)
    cos, sin = lm0.cos[pos][None], lm0.sin[pos][None]  # [1, N, hd]
    inner = lm0.model.model
    x = inner.embed_tokens(ids[None])
    features = any(r[0]._features_on() for r in reqs)
    hidden = [x[0]] if features else None  # transformers' hidden_states, [N, d] each
    for i, layer in enumerate(inner.layers[j] for j in lm0.layers):  # i: the layer's slot in each lm.kv
        q, k, v = lm0.qkv(layer, x, cos, sin)
        outs = []
        for (lm, *_), (start, end), mask, qr, kr, vr in zip(
            reqs, spans, masks, q.split(sizes, 2), k.split(sizes, 2), v.split(sizes, 2)
        ):
            lm.kv[i, 0, :, start:end], lm.kv[i, 1, :, start:end] = kr[0], vr[0]
            keys, values = lm.kv[i, 0, :, :end][None], lm.kv[i, 1, :, :end][None]
            causal = isinstance(mask, str)  # "causal": a prefill from an empty cache
            outs.append(lm.attend(qr, keys, values, None if causal else mask, causal))
        x = x + lm0.linear(layer.self_attn.o_proj, outs[0] if len(outs) == 1 else torch.cat(outs, 1))
        x = x + lm0.mlp(layer, x)
        if hidden is not None:
            hidden.append(x[0])
    if lm0.exit is not None:  # early-exit adapter of a layer-subset self-draft
        x = lm0.exit(x)
    x = inner.norm(x)
    if hidden is not None:
        hidden[-1] = x[0]  # the last one is the normed state
        for (lm, *_), (start, _), hs in zip(reqs, spans, zip(*(h.split(sizes) for h in hidden))):
            if lm._features_on():
                lm._write_features(list(hs), start)
    if last_only:
        x = x[:, -1:]
    if lm0.vocab_rows is None:
        logits = lm0.linear(lm0.model.lm_head, x)[0].float()
    else:  # FR-Spec: only the kept rows of the LM head
        logits = torch.full((x.shape[1], lm0.model.config.vocab_size), float("-inf"), device=x.device)
        logits[:, lm0.vocab_rows] = lm0.linear(lm0._head_rows, x[0]).float()
    return [logits] if len(reqs) == 1 else list(logits.split(sizes))
