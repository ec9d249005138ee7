"""An int8 Llama forward whose logits do not depend on how many tokens a pass scores (backend "torch-w8a8").

Greedy speculation is lossless only if the verify pass over n tokens gives each token the logits a one-token
pass would. torch.ao's dynamic int8 (backend "torch-int8") does not: it scales the activations of the whole
pass by one number, so a token's logits change with the other tokens in its pass (up to 8 logits on SmolLM2),
and near-ties flip. Here every product is batch-invariant by construction:

- weights int8 per output channel, activations int8 per row (token), products in int32 (oneDNN's quantized
  linear; `torch._int_mm` is its twin):
  integer sums are exact, so a row's result cannot depend on the other rows or on the kernel that ran it;
- attention in float64 over a float64 KV cache, rounded to float32 at its output: the kernels' row-count
  dependent rounding (about 1e-16 relative) almost never reaches a float32 rounding boundary;
- norms, rotary embedding, SiLU and residuals are per-row elementwise or last-axis reductions.

q/k/v share one product and one activation quantization per layer, as do gate/up (fewer eager calls). The
float32 `LlamaLM` is the slow twin: logits agree within int8's tolerance (tests/test_backends.py).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from speclib.lms.llama import LlamaLM, _rope

_QLINEAR = torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")


class Int8Rows(torch.nn.Module):
    """x @ W.T for a float weight W [N, K] held as int8 per output channel; x quantized to int8 per row.

    The int32 product runs through oneDNN's quantized linear on weights packed once (activations shifted to
    uint8 with zero point 128, as its x86 kernels take them); `torch._int_mm` on the plain int8 weights is the
    twin (`packed=False`). Both give (acc * w_scale) * x_scale, the same floats."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        w = weight.detach().float()
        scale = w.abs().amax(1).clamp_min(1e-12) / 127
        self.register_buffer("q", torch.round(w / scale[:, None]).to(torch.int8))  # [N, K]
        self.register_buffer("scale", scale.contiguous())  # [N]
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.packed = _QLINEAR and w.device.type == "cpu"
        if self.packed:
            self._w = torch.ops.onednn.qlinear_prepack(self.q, None)
            self._zero = torch.zeros(len(scale), dtype=torch.long)

    def forward(self, x: torch.Tensor, packed: bool | None = None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float()
        s = rows.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127  # |rows / s| <= 127: no clamp needed
        q = torch.round(rows / s)
        if self.packed if packed is None else packed:
            y = torch.ops.onednn.qlinear_pointwise(
                (q + 128).to(torch.uint8),
                1.0,
                128,
                self._w,
                self.scale,
                self._zero,
                None,
                1.0,
                0,
                torch.float32,
                "none",
                [],
                "",
            )
        else:
            y = torch._int_mm(q.to(torch.int8), self.q.t()) * self.scale
        y.mul_(s)
        if self.bias is not None:
            y += self.bias
        return y.view(*x.shape[:-1], y.shape[-1])


def quantize(model):
    """A copy of a transformers Llama with int8 products (`Int8Rows`): q/k/v fused into `self_attn.qkv8`,
    gate/up into `mlp.gate_up8`, o_proj / down_proj / lm_head replaced. The embeddings stay float32."""
    model = copy.deepcopy(model)
    for layer in model.model.layers:
        att, mlp = layer.self_attn, layer.mlp
        projs = [att.q_proj, att.k_proj, att.v_proj]
        bias = None if projs[0].bias is None else torch.cat([p.bias for p in projs])
        att.qkv8 = Int8Rows(torch.cat([p.weight for p in projs]), bias)
        att.o_proj = Int8Rows(att.o_proj.weight, att.o_proj.bias)
        mlp.gate_up8 = Int8Rows(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        mlp.down_proj = Int8Rows(mlp.down_proj.weight, mlp.down_proj.bias)
        del att.q_proj, att.k_proj, att.v_proj, mlp.gate_proj, mlp.up_proj
    model.lm_head = Int8Rows(model.lm_head.weight)  # a copy: unties it from the float32 embeddings
    return model


class W8A8LM(LlamaLM):
    """LlamaLM over a `quantize`d model: the same protocol, batched extend and views."""

    def __init__(self, model, tokenizer, device, path=None, layers=None, exit=None):
        super().__init__(model, tokenizer, device, path, layers, exit)
        self.kv = torch.zeros(self.kv.shape, dtype=torch.float64, device=device)  # zeros: never NaN under a mask
        self.packed = False

    def restrict_vocab(self, rows):
        raise ValueError("torch-w8a8 runs targets, which verify over the whole vocabulary; FR-Spec is for float drafts")

    def qkv(self, layer, x, cos, sin):
        n, att = x.shape[1], layer.self_attn
        q, k, v = att.qkv8(layer.input_layernorm(x)).split(
            [self.n_heads * self.head_dim, *[self.n_kv * self.head_dim] * 2], -1
        )
        q = q.view(1, n, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(1, n, self.n_kv, self.head_dim).transpose(1, 2)
        v = v.view(1, n, self.n_kv, self.head_dim).transpose(1, 2)
        return _rope(q, cos, sin), _rope(k, cos, sin), v

    def mlp(self, layer, x):
        m = layer.mlp
        gate, up = m.gate_up8(layer.post_attention_layernorm(x)).chunk(2, -1)
        return m.down_proj(m.act_fn(gate) * up)

    def attend(self, q, keys, values, mask, causal: bool = False) -> torch.Tensor:
        o = F.scaled_dot_product_attention(
            q.double(), keys, values, attn_mask=mask, is_causal=causal, enable_gqa=self.n_kv != self.n_heads
        )
        return o.float().transpose(1, 2).reshape(1, q.shape[2], -1)
