"""What the training recipes share: the one optimisation loop (`run_training`), its learning-rate
schedule, resumable state (`Checkpoint`), random training windows, and the shipped models' presets and
token streams.

`train.train_model` (the workbook's LMs), `heads.fit` (feature heads) and `layer_search.train_exit`
(exit adapters) each run `run_training` with their own loss, optimizer, logging and evaluation. The
presets and streams live here rather than in train.py because `heads.train_head` trains on a shipped
target's own data while train.py's command line imports heads: both read them from this module, which
imports neither.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from speclib.core.device import REPO, clock
from speclib.research import data

STATE = REPO / "build" / "train"  # resumable training state, one folder per model or head
VOCAB = 4096  # the shared tokenizer's size
SAVE_EVERY_S = 300  # resumable state is written at least this often: a killed run loses little

# Presets (Llama unless arch says otherwise). The target is sized so its 1-token forward is >= 8x
# slower than the draft's; hybrid-target is the Qwen3.5 text architecture (Gated DeltaNet : gated
# attention = 3 : 1) at about code-target's size, for notebook 03.
PRESETS = {
    "code-target": dict(
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        intermediate_size=1408,
        lr=1.5e-3,
    ),
    "code-draft": dict(
        hidden_size=192,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=3,
        intermediate_size=512,
        lr=3e-3,
    ),
    "hybrid-target": dict(
        arch="qwen3_5",
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_conv_kernel_dim=4,
        intermediate_size=1408,
        lr=1.5e-3,
    ),
    # A second hybrid family for notebook 06: Falcon-H1 runs a Mamba2 mixer beside attention in every
    # layer (outputs summed), sized and trained like hybrid-target (same data, same distillation).
    "falcon-h1-tiny": dict(
        arch="falcon_h1",
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        mamba_d_ssm=512,
        mamba_n_heads=8,
        mamba_d_head=64,
        mamba_d_state=64,
        mamba_n_groups=1,
        mamba_chunk_size=64,
        intermediate_size=1024,
        lr=1.5e-3,
    ),
    # The same with the released Falcon-H1 models' width ratio (0.5B: 24 Mamba heads, 8 attention heads):
    # the SSM branch three times as wide as attention, the parameter count kept.
    "falcon-h1-tiny-wide-ssm": dict(
        arch="falcon_h1",
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        mamba_d_ssm=768,
        mamba_n_heads=12,
        mamba_d_head=64,
        mamba_d_state=64,
        mamba_n_groups=1,
        mamba_chunk_size=64,
        intermediate_size=1024,
        lr=1.5e-3,
    ),
    # Fine-tuned from the code pair on the workloads of notebook 02 (train-split files only), half the
    # batches from those workloads and half from plain stdlib source so the code skill is kept.
    "agent-target": dict(init="code-target", mix=0.5, lr=5e-4),
    "agent-draft": dict(init="code-draft", mix=0.5, lr=1e-3),
    # Notebook 04's pair, trained on the arithmetic task only (`data.math_problems`): small enough
    # that both still make mistakes, the draft's forward several times cheaper than the target's.
    "math-target": dict(
        data="math",
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=6,
        intermediate_size=1024,
        lr=2e-3,
    ),
    "math-draft": dict(
        data="math",
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=384,
        lr=3e-3,
    ),
}
MATH_TRAIN_PROBLEMS = 200_000
MATH_VALIDATION_PROBLEMS = 1000  # the math presets' held-out loss stream (a fixed prefix of the split)


# --- token streams ---------------------------------------------------------------------------------
def _cached_stream(name: str, texts, tokenizer) -> np.ndarray:
    """Texts tokenized and joined by EOS, cached as build/tokens_<name>.npy (texts is only read on a miss);
    another tokenizer than the project's gets a cache of its own."""
    if len(tokenizer) != VOCAB:
        name = f"{name}_{Path(tokenizer.name_or_path).name}_{len(tokenizer)}"
    cache = REPO / "build" / f"tokens_{name}.npy"
    if cache.exists():
        return np.load(cache)
    ids = []
    for text in texts():
        ids.extend(tokenizer(text)["input_ids"] + [tokenizer.eos_token_id])
    arr = np.asarray(ids, dtype=np.int16 if len(tokenizer) < 2**15 else np.int32)
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(cache, arr)
    return arr


def token_stream(split: str, tokenizer) -> np.ndarray:
    """All stdlib files of a split, tokenized and joined by EOS; cached in build/."""
    return _cached_stream(split, lambda: (data.read_text(p) for p in data.stdlib_split(split)), tokenizer)


def workload_stream(split: str, tokenizer) -> np.ndarray:
    """Notebook 02's workload examples (prompt + reference) of a split, EOS-joined; cached in build/."""
    from speclib.research import workloads

    return _cached_stream(
        f"workloads_{split}",
        lambda: (ex["prompt"] + ex["reference"] for w in workloads.WORKLOADS for ex in workloads.examples(w, split)),
        tokenizer,
    )


def math_stream(split: str, tokenizer) -> np.ndarray:
    """Arithmetic problems (question + worked solution) of a split, EOS-joined; cached in build/."""
    n = MATH_TRAIN_PROBLEMS if split == "train" else MATH_VALIDATION_PROBLEMS
    return _cached_stream(
        f"math_{split}_{n}", lambda: (p["question"] + p["solution"] for p in data.math_problems(split, n)), tokenizer
    )


def streams(name: str, tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) token streams of a preset."""
    if PRESETS[name].get("data") == "math":
        return math_stream("train", tokenizer), math_stream("validation", tokenizer)
    return token_stream("train", tokenizer), token_stream("heldout", tokenizer)


def batch(stream: np.ndarray, bsz: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    """[bsz, seq + 1] random windows of a token stream."""
    starts = torch.randint(0, len(stream) - seq - 1, (bsz,), generator=gen)
    return torch.stack([torch.from_numpy(stream[s : s + seq + 1].astype(np.int64)) for s in starts.tolist()])


def snapshots_due(st: dict, at) -> list[int]:
    """The token counts of `at` that st["tokens"] has reached and st["snapshots"] does not hold yet; they
    are recorded there as taken. A learning curve's points from one run: the weights as they were after
    N training tokens (within a first epoch, each token seen about once, N is also the data seen)."""
    taken = st.setdefault("snapshots", [])
    due = [n for n in sorted(at) if st["tokens"] >= n and n not in taken]
    taken.extend(due)
    return due


# --- the loop ----------------------------------------------------------------------------------------
def lr_at(step: int, total: int, peak: float, warmup: int = 100) -> float:
    """Linear warmup to `peak` over `warmup` steps, then cosine decay to 0.1 x peak at step `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


@dataclass
class Checkpoint:
    """Resumable training state in one file: `parts` (name -> module, optimizer or torch.Generator) and
    the progress record under "st"."""

    path: Path
    parts: dict

    def restore(self) -> dict | None:
        """Load a saved state into the parts; the saved progress record, or None when there is none."""
        if not self.path.exists():
            return None
        ck = torch.load(self.path, weights_only=False)
        for name, part in self.parts.items():
            if isinstance(part, torch.Generator):
                part.set_state(ck[name])
            else:
                part.load_state_dict(ck[name])
        return ck["st"]

    def save(self, st: dict) -> None:
        tmp = self.path.with_suffix(".tmp")  # written whole, then renamed: a kill never leaves half a file
        state = {
            name: part.get_state() if isinstance(part, torch.Generator) else part.state_dict()
            for name, part in self.parts.items()
        }
        torch.save({**state, "st": st}, tmp)
        tmp.replace(self.path)


def run_training(
    step_loss: Callable[[], tuple[torch.Tensor, Any]],
    opt: torch.optim.Optimizer,
    st: dict | None = None,
    *,
    steps: int,
    minutes: float,
    tokens_per_step: int,
    lr: float | None = None,
    warmup: int = 100,
    clip: float | None = 1.0,
    on_step: Callable[[dict, torch.Tensor, Any], None] | None = None,
    checkpoint: Checkpoint | None = None,
) -> dict:
    """Optimizer steps on `opt`'s parameters until st["step"] reaches `steps` or `minutes` have passed
    in this call.

    step_loss() samples a batch and returns (loss, info); on_step(st, loss, info) runs after each step
    (logging, evaluation). lr: the peak of `lr_at`'s schedule over `steps` (None: `opt`'s own lr, kept);
    clip: the gradients' max norm (None: not clipped). st: the progress record {"step", "tokens",
    "seconds", ...} to continue (None: a fresh one), updated in place and returned. checkpoint: saved at
    least every SAVE_EVERY_S seconds and at the end."""
    st = {"step": 0, "tokens": 0, "seconds": 0.0} if st is None else st
    params = [p for g in opt.param_groups for p in g["params"]]
    t_end = clock() + 60 * minutes
    last_save = clock()
    while st["step"] < steps and clock() < t_end:
        t0 = clock()
        if lr is not None:
            for g in opt.param_groups:
                g["lr"] = lr_at(st["step"], steps, lr, warmup)
        loss, info = step_loss()
        # Gradients of the trained parameters only: frozen weights on the loss's path (a target's final
        # norm and LM head) get no .grad.
        for p, g in zip(params, torch.autograd.grad(loss, params, allow_unused=True)):
            p.grad = g
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        st["step"] += 1
        st["tokens"] += tokens_per_step
        st["seconds"] += clock() - t0
        if on_step is not None:
            on_step(st, loss, info)
        if checkpoint is not None and clock() - last_save > SAVE_EVERY_S:
            checkpoint.save(st)
            last_save = clock()
    if checkpoint is not None:
        checkpoint.save(st)
    return st
