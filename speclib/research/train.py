"""Train the shipped tokenizer and models on data the machine already has.

    python -m speclib train tokenizer
    python -m speclib train model code-target --steps 3000 --minutes 60
    python -m speclib train model code-draft --steps 2500 --distill-from code-target
    python -m speclib train head code-target --minutes 30          (a feature-level draft head: speclib.research.heads)
    python -m speclib train draft smollm2-135m-instruct --layers 4 (a pretrained target cut and distilled: chat_draft)

Training is resumable: state (weights, optimizer, step, RNG) lives in build/train/<name>/state.pt and
each invocation continues where the last stopped, for at most --minutes. Every invocation exports the
current weights in HF format to data/checkpoints/<name>/ with a MODEL_CARD.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from speclib.core.device import REPO
from speclib.research import data
from speclib.research.heads import train_head
from speclib.research.training import (
    MATH_TRAIN_PROBLEMS,
    PRESETS,
    STATE,
    VOCAB,
    Checkpoint,
    batch,
    run_training,
    streams,
    token_stream,  # noqa: F401  (notebooks and datastore.py read train.token_stream)
    workload_stream,
)

CHECKPOINTS = REPO / "data" / "checkpoints"
TOKENIZER_DIR = CHECKPOINTS / "tokenizer"
EOS = "<|endoftext|>"


def train_tokenizer(out: Path = TOKENIZER_DIR) -> Path:
    """Byte-level BPE (VOCAB tokens) on the training split only; shared by every shipped model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator((data.read_text(p) for p in data.stdlib_split("train")), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return out


def load_tokenizer(path: Path = TOKENIZER_DIR):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(path)


def make_model(name: str, tokenizer):
    import transformers

    if "init" in PRESETS[name]:  # fine-tuning: start from a shipped checkpoint's weights
        return transformers.AutoModelForCausalLM.from_pretrained(
            CHECKPOINTS / PRESETS[name]["init"], dtype=torch.float32
        )
    p = {k: v for k, v in PRESETS[name].items() if k not in ("lr", "arch", "data")}
    eos = tokenizer.eos_token_id
    common = dict(
        vocab_size=len(tokenizer),
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        **p,
    )
    if PRESETS[name].get("arch") == "qwen3_5":
        cfg = transformers.Qwen3_5TextConfig(**common)  # derives layer_types 3:1, rope from defaults
        return transformers.Qwen3_5ForCausalLM(cfg)
    if PRESETS[name].get("arch") == "falcon_h1":
        cfg = transformers.FalconH1Config(**common)
        return transformers.FalconH1ForCausalLM(cfg)
    cfg = transformers.LlamaConfig(rope_theta=10000.0, **common)
    return transformers.LlamaForCausalLM(cfg)


@torch.no_grad()
def heldout_loss(model, stream: np.ndarray, seq: int = 256, n: int = 64, autocast: bool = True) -> float:
    """Mean next-token loss over n fixed, evenly spaced held-out windows."""
    model.eval()
    starts = np.linspace(0, len(stream) - seq - 2, n).astype(int)
    x = torch.stack([torch.from_numpy(stream[s : s + seq + 1].astype(np.int64)) for s in starts])
    losses = []
    for chunk in x.split(16):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=chunk[:, :-1]).logits.float()
        losses.append(F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="none"))
    model.train()
    return torch.cat(losses).mean().item()


def bf16_native() -> bool:
    """Whether this CPU has bf16 units (measured here: 17 GFLOPS in bf16 against 84 in fp32 on 2 AVX2 cores)."""
    return torch.cuda.is_available() or torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def train_model(
    name: str,
    steps: int,
    minutes: float,
    bsz: int = 8,
    seq: int = 256,
    distill_from: str | None = None,
    distill_weight: float = 0.9,
    seed: int = 0,
    eval_every: int = 200,
) -> Path:
    torch.manual_seed(seed)
    tok = load_tokenizer()
    train, held = streams(name, tok)
    mix = PRESETS[name].get("mix", 0.0)
    extra = workload_stream("train", tok) if mix else None
    model = make_model(name, tok)
    peak = PRESETS[name]["lr"]
    opt = torch.optim.AdamW(model.parameters(), lr=peak, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    state_dir = STATE / name
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / "log.jsonl"
    checkpoint = Checkpoint(state_dir / "state.pt", {"model": model, "opt": opt, "gen": gen})
    st = checkpoint.restore()
    if st is not None:
        print(f"resumed {name} at step {st['step']}", flush=True)
    teacher = None
    if distill_from:
        from transformers import AutoModelForCausalLM

        teacher = AutoModelForCausalLM.from_pretrained(CHECKPOINTS / distill_from, dtype=torch.bfloat16).eval()
    model.train()

    def step_loss():
        n_mix = int(round(mix * bsz))
        x = batch(train, bsz - n_mix, seq, gen)
        if n_mix:
            x = torch.cat([x, batch(extra, n_mix, seq, gen)])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=x[:, :-1]).logits.float()
        loss = ce = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        if teacher is not None:
            with torch.no_grad():
                t_logp = F.log_softmax(teacher(input_ids=x[:, :-1]).logits.float(), -1)
            kl = F.kl_div(F.log_softmax(logits, -1), t_logp, log_target=True, reduction="batchmean") / seq
            loss = (1 - distill_weight) * ce + distill_weight * kl
        return loss, ce

    def on_step(st, loss, ce):
        rec = {
            "step": st["step"],
            "tokens": st["tokens"],
            "seconds": round(st["seconds"], 1),
            "train_loss": round(ce.item(), 4),
        }
        if st["step"] % eval_every == 0 or st["step"] == steps:
            rec["heldout_loss"] = round(heldout_loss(model, held, seq), 4)
        if st["step"] % 20 == 0 or "heldout_loss" in rec:
            with open(log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(rec, flush=True)

    run_training(
        step_loss,
        opt,
        st,
        steps=steps,
        minutes=minutes,
        tokens_per_step=bsz * seq,
        lr=peak,
        on_step=on_step,
        checkpoint=checkpoint,
    )
    return export(name, model, tok, held, distill_from)


ARCH_NAMES = {
    "llama": "Llama",
    "qwen3_5_text": "Qwen3.5 text (Gated DeltaNet : gated attention = 3 : 1)",
    "falcon_h1": "Falcon-H1 (a Mamba2 mixer beside attention in every layer)",
}


def export(name: str, model, tok, held: np.ndarray, distill_from: str | None) -> Path:
    """HF folder (bf16 safetensors + tokenizer) and a model card written from the training log."""
    out = CHECKPOINTS / name
    model.eval()
    final = heldout_loss(model, held, autocast=False)
    mixed = "mix" in PRESETS.get(name, {})
    final_w = heldout_loss(model, workload_stream("heldout", tok), autocast=False) if mixed else None
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    model.float()
    log = [json.loads(l) for l in (STATE / name / "log.jsonl").read_text().splitlines()]
    evals = [r for r in log if "heldout_loss" in r]
    curve = ", ".join(
        f"{r['tokens'] / 1e6:.2f}M tok: {r['heldout_loss']:.3f}" for r in evals[:: max(1, len(evals) // 8)]
    )
    samples, is_math = [], PRESETS.get(name, {}).get("data") == "math"
    prompts = ["def fibonacci(n):\n", "import os\n\n\ndef list_files(path):\n"]
    if is_math:
        prompts = [p["question"] for p in data.math_problems("validation", 2)]
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=48, do_sample=False, pad_token_id=tok.eos_token_id)
        samples.append(tok.decode(gen[0]))
    n_params = sum(p.numel() for p in model.parameters())
    last = log[-1]
    init_note = ""
    if mixed:
        init_note = (
            f"\n- Fine-tuned from `{PRESETS[name]['init']}`: {PRESETS[name]['mix']:.0%} of each batch from the "
            f"train-split examples of `speclib.research.workloads` (agentic edit, JSON tool calls, plans, structured "
            f"rewriting), the rest plain stdlib source. Tokens below count the fine-tuning only."
        )
    data_line = (
        f"the Python {sys.version.split()[0]} standard library's non-test source, split by file (every\n"
        f"  {data.HELDOUT_EVERY}th file held out)"
    )
    if is_math:
        acc = math_accuracy(model, tok, data.math_problems("validation", 200))
        data_line = (
            f"{MATH_TRAIN_PROBLEMS} generated arithmetic problems with worked solutions "
            f"(`speclib.research.data.math_problems('train', ...)`, levels {data.MATH_LEVELS}); held-out loss on the "
            f"validation split. Greedy final-answer accuracy on 200 validation problems: **{acc:.1%}**"
        )
    card = f"""# {name}

{ARCH_NAMES.get(model.config.model_type, model.config.model_type)} architecture, {n_params / 1e6:.2f}M parameters (tied embeddings), {model.config.num_hidden_layers} layers,
hidden {model.config.hidden_size}, vocabulary {model.config.vocab_size} (the shared byte-level BPE in `data/checkpoints/tokenizer`).
Weights stored in bf16.

- Command: `python -m speclib train {" ".join(sys.argv[1:]) or "model " + name}` (resumable; preset `{name}` in `speclib/research/training.py`).
- Data: {data_line}; {"distilled from `" + distill_from + "` (KL to its softmax, mixed with next-token loss)" if distill_from else "next-token loss"}.{init_note}
- Tokens seen: {last["tokens"] / 1e6:.2f}M in {last["step"]} steps; training wall time {last["seconds"] / 60:.1f} min on 2 CPU cores (bf16 autocast).
- Held-out loss (fp32, 64 windows of 256 tokens): **{final:.3f}** nats/token{f"; on the held-out workload examples of notebook 02: **{final_w:.3f}**" if mixed else ""}.
- Held-out loss curve: {curve}.

## Greedy samples

""" + "\n".join(f"```python\n{s}\n```\n" for s in samples)
    (out / "MODEL_CARD.md").write_text(card)
    (out / "training.json").write_text(
        json.dumps(
            {
                "name": name,
                "parameters": n_params,
                "heldout_loss": round(final, 4),
                "tokens_seen": last["tokens"],
                "heldout_loss_workloads": round(final_w, 4) if mixed else None,
                "init_from": PRESETS[name].get("init"),
                "steps": last["step"],
                "train_minutes": round(last["seconds"] / 60, 1),
                "distilled_from": distill_from,
                "python": sys.version.split()[0],
                **({"validation_accuracy": round(acc, 4)} if is_math else {}),
            },
            indent=1,
        )
    )
    print(f"exported {name}: held-out loss {final:.3f}", flush=True)
    return out


@torch.no_grad()
def math_accuracy(model, tok, problems: list[dict], max_new_tokens: int = 96) -> float:
    """Greedy final-answer accuracy (left-padded batches through `generate`)."""
    model.eval()
    tok.padding_side, right = "left", 0
    for i in range(0, len(problems), 50):
        chunk = problems[i : i + 50]
        enc = tok([p["question"] for p in chunk], return_tensors="pt", padding=True)
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id)
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        right += sum(data.math_answer(t) == p["answer"] for t, p in zip(texts, chunk))
    tok.padding_side = "right"
    return right / len(problems)


def _corpus_args(p):
    p.add_argument(
        "--corpus",
        choices=("chat_data", "draft_corpus"),
        default="chat_data",
        help="a pretrained target's data: answers to docstring instructions (chat_data) or to the shipped "
        "licensed chat prompts (draft_corpus)",
    )
    p.add_argument("--answer-tokens", type=int, default=None, help="draft_corpus: its first N answer tokens only")
    p.add_argument(
        "--snapshots",
        default="",
        help="comma-separated token counts after which the weights are also saved to build/train/<out>/tokens-<N>/",
    )


def _counts(text: str) -> tuple[int, ...]:
    return tuple(int(float(x)) for x in text.split(",") if x.strip())


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m speclib train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("tokenizer")
    m = sub.add_parser("model")
    m.add_argument("name", choices=sorted(PRESETS))
    m.add_argument("--steps", type=int, default=3000)
    m.add_argument("--minutes", type=float, default=60)
    m.add_argument("--batch", type=int, default=8)
    m.add_argument("--distill-from", default=None)
    m.add_argument("--distill-weight", type=float, default=0.9)
    m.add_argument("--threads", type=int, default=0)
    h = sub.add_parser("head", help="an EAGLE-style draft head for a target (speclib.research.heads.train_head)")
    h.add_argument("name", help="the target: a shipped checkpoint name or a folder")
    h.add_argument("--out", default=None, help="default data/checkpoints/<target>-head")
    h.add_argument("--steps", type=int, default=2000)
    h.add_argument("--minutes", type=float, default=30)
    h.add_argument("--batch", type=int, default=8)
    h.add_argument("--seq", type=int, default=256)
    h.add_argument("--unroll", type=int, default=3, help="draft steps unrolled in training")
    h.add_argument("--ff", type=int, default=None, help="the head's MLP width (default the target's)")
    h.add_argument("--eval-windows", type=int, default=16, help="held-out windows of --seq tokens per evaluation")
    h.add_argument("--lr", type=float, default=1e-3)
    h.add_argument(
        "--autocast",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bf16 autocast for the target's pass and the head (default: where the CPU has bf16 units, "
        "AVX512-BF16 or AMX; without them bf16 matmuls run about 5x slower than fp32)",
    )
    h.add_argument(
        "--vocab",
        type=int,
        default=None,
        help="train over the N most frequent tokens of the training data only (FR-Spec's drafting "
        "vocabulary): the output layer's share of training shrinks by V / N",
    )
    _corpus_args(h)
    h.add_argument("--threads", type=int, default=0)
    d = sub.add_parser("draft", help="a pretrained target's layers cut and distilled (speclib.research.chat_draft)")
    d.add_argument("name", help="the pretrained target (speclib.lms.pretrained)")
    d.add_argument("--out", default=None, help="default data/checkpoints/<family>-draft")
    d.add_argument("--layers", type=int, default=4, help="target layers kept, evenly spaced")
    d.add_argument("--vocab", type=int, default=8192, help="FR-Spec: train over the N most frequent tokens (0: all)")
    d.add_argument("--steps", type=int, default=4000)
    d.add_argument("--minutes", type=float, default=60)
    d.add_argument("--lr", type=float, default=5e-4)
    d.add_argument(
        "--autocast",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bf16 autocast for the teacher's and the draft's passes (default: where the CPU has bf16 units)",
    )
    _corpus_args(d)
    d.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)
    if getattr(a, "threads", 0):
        torch.set_num_threads(a.threads)
    if a.cmd == "tokenizer":
        print(train_tokenizer())
    elif a.cmd == "draft":
        from speclib.research.chat_draft import train_draft

        print(
            train_draft(
                a.name,
                a.out,
                a.layers,
                a.vocab or None,
                a.minutes,
                a.steps,
                lr=a.lr,
                corpus=a.corpus,
                answer_tokens=a.answer_tokens,
                snapshots=_counts(a.snapshots),
                autocast=bf16_native() if a.autocast is None else a.autocast,
            )
        )
    elif a.cmd == "head":
        print(
            train_head(
                a.name,
                a.out,
                a.minutes,
                a.steps,
                a.batch,
                a.seq,
                a.unroll,
                a.lr,
                autocast=bf16_native() if a.autocast is None else a.autocast,
                vocab=a.vocab,
                corpus=a.corpus,
                answer_tokens=a.answer_tokens,
                snapshots=_counts(a.snapshots),
                ff=a.ff,
                n_eval=a.eval_windows,
            )
        )
    else:
        train_model(a.name, a.steps, a.minutes, a.batch, distill_from=a.distill_from, distill_weight=a.distill_weight)


if __name__ == "__main__":
    main()
