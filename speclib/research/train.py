"""Train the shipped tokenizer and models on data the machine already has.

    python -m speclib train tokenizer
    python -m speclib train model code-target --steps 3000 --minutes 60
    python -m speclib train model code-draft --steps 2500 --distill-from code-target
    python -m speclib train head code-target --minutes 30          (a feature-level draft head: speclib.research.heads)

Training is resumable: state (weights, optimizer, step, RNG) lives in build/train/<name>/state.pt and
each invocation continues where the last stopped, for at most --minutes. Every invocation exports the
current weights in HF format to data/checkpoints/<name>/ with a MODEL_CARD.md.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from speclib.research import data
from speclib.core.device import REPO

CHECKPOINTS = REPO / "data" / "checkpoints"
TOKENIZER_DIR = CHECKPOINTS / "tokenizer"
STATE = REPO / "build" / "train"
EOS = "<|endoftext|>"
VOCAB = 4096

# Presets (Llama unless arch says otherwise). The target is sized so its 1-token forward is >= 8x
# slower than the draft's; hybrid-target is the Qwen3.5 text architecture (Gated DeltaNet : gated
# attention = 3 : 1) at about code-target's size, for notebook 03.
PRESETS = {
    "code-target": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                        num_key_value_heads=8, intermediate_size=1408, lr=1.5e-3),
    "code-draft": dict(hidden_size=192, num_hidden_layers=2, num_attention_heads=3,
                       num_key_value_heads=3, intermediate_size=512, lr=3e-3),
    "hybrid-target": dict(arch="qwen3_5", hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                          num_key_value_heads=2, head_dim=64, linear_num_key_heads=4,
                          linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64,
                          linear_conv_kernel_dim=4, intermediate_size=1408, lr=1.5e-3),
    # A second hybrid family for notebook 06: Falcon-H1 runs a Mamba2 mixer beside attention in every
    # layer (outputs summed), sized and trained like hybrid-target (same data, same distillation).
    "falcon-h1-tiny": dict(arch="falcon_h1", hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                           num_key_value_heads=2, head_dim=64, mamba_d_ssm=512, mamba_n_heads=8,
                           mamba_d_head=64, mamba_d_state=64, mamba_n_groups=1, mamba_chunk_size=64,
                           intermediate_size=1024, lr=1.5e-3),
    # The same with the released Falcon-H1 models' width ratio (0.5B: 24 Mamba heads, 8 attention heads):
    # the SSM branch three times as wide as attention, the parameter count kept.
    "falcon-h1-tiny-wide-ssm": dict(arch="falcon_h1", hidden_size=512, num_hidden_layers=8, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=64, mamba_d_ssm=768, mamba_n_heads=12,
                                    mamba_d_head=64, mamba_d_state=64, mamba_n_groups=1, mamba_chunk_size=64,
                                    intermediate_size=1024, lr=1.5e-3),
    # Fine-tuned from the code pair on the workloads of notebook 02 (train-split files only), half the
    # batches from those workloads and half from plain stdlib source so the code skill is kept.
    "agent-target": dict(init="code-target", mix=0.5, lr=5e-4),
    "agent-draft": dict(init="code-draft", mix=0.5, lr=1e-3),
    # Notebook 04's pair, trained on the arithmetic task only (`data.math_problems`): small enough
    # that both still make mistakes, the draft's forward several times cheaper than the target's.
    "math-target": dict(data="math", hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
                        num_key_value_heads=6, intermediate_size=1024, lr=2e-3),
    "math-draft": dict(data="math", hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=4, intermediate_size=384, lr=3e-3),
}
MATH_TRAIN_PROBLEMS = 200_000
MATH_VALIDATION_PROBLEMS = 1000   # the math presets' held-out loss stream (a fixed prefix of the split)
SAVE_EVERY_S = 300                # resumable state is written at least this often: a killed run loses little


def train_tokenizer(out: Path = TOKENIZER_DIR) -> Path:
    """Byte-level BPE (VOCAB tokens) on the training split only; shared by every shipped model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((data.read_text(p) for p in data.stdlib_split("train")), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return out


def load_tokenizer(path: Path = TOKENIZER_DIR):
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast.from_pretrained(path)


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


def make_model(name: str, tokenizer):
    import transformers
    if "init" in PRESETS[name]:          # fine-tuning: start from a shipped checkpoint's weights
        return transformers.AutoModelForCausalLM.from_pretrained(CHECKPOINTS / PRESETS[name]["init"],
                                                                 dtype=torch.float32)
    p = {k: v for k, v in PRESETS[name].items() if k not in ("lr", "arch", "data")}
    eos = tokenizer.eos_token_id
    common = dict(vocab_size=len(tokenizer), max_position_embeddings=1024, tie_word_embeddings=True,
                  bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, **p)
    if PRESETS[name].get("arch") == "qwen3_5":
        cfg = transformers.Qwen3_5TextConfig(**common)   # derives layer_types 3:1, rope from defaults
        return transformers.Qwen3_5ForCausalLM(cfg)
    if PRESETS[name].get("arch") == "falcon_h1":
        cfg = transformers.FalconH1Config(**common)
        return transformers.FalconH1ForCausalLM(cfg)
    cfg = transformers.LlamaConfig(rope_theta=10000.0, **common)
    return transformers.LlamaForCausalLM(cfg)


def workload_stream(split: str, tokenizer) -> np.ndarray:
    """Notebook 02's workload examples (prompt + reference) of a split, EOS-joined; cached in build/."""
    from speclib.research import workloads
    return _cached_stream(f"workloads_{split}", lambda: (ex["prompt"] + ex["reference"] for w in workloads.WORKLOADS
                                                         for ex in workloads.examples(w, split)), tokenizer)


def math_stream(split: str, tokenizer) -> np.ndarray:
    """Arithmetic problems (question + worked solution) of a split, EOS-joined; cached in build/."""
    n = MATH_TRAIN_PROBLEMS if split == "train" else MATH_VALIDATION_PROBLEMS
    return _cached_stream(f"math_{split}_{n}", lambda: (p["question"] + p["solution"]
                                                        for p in data.math_problems(split, n)), tokenizer)


def streams(name: str, tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) token streams of a preset."""
    if PRESETS[name].get("data") == "math":
        return math_stream("train", tokenizer), math_stream("validation", tokenizer)
    return token_stream("train", tokenizer), token_stream("heldout", tokenizer)


def batch(stream: np.ndarray, bsz: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - seq - 1, (bsz,), generator=gen)
    return torch.stack([torch.from_numpy(stream[s:s + seq + 1].astype(np.int64)) for s in starts.tolist()])


@torch.no_grad()
def heldout_loss(model, stream: np.ndarray, seq: int = 256, n: int = 64, autocast: bool = True) -> float:
    """Mean next-token loss over n fixed, evenly spaced held-out windows."""
    model.eval()
    starts = np.linspace(0, len(stream) - seq - 2, n).astype(int)
    x = torch.stack([torch.from_numpy(stream[s:s + seq + 1].astype(np.int64)) for s in starts])
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


def lr_at(step: int, total: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train_model(name: str, steps: int, minutes: float, bsz: int = 8, seq: int = 256,
                distill_from: str | None = None, distill_weight: float = 0.9, seed: int = 0,
                eval_every: int = 200) -> Path:
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
    state_path, log_path = state_dir / "state.pt", state_dir / "log.jsonl"
    st = {"step": 0, "tokens": 0, "seconds": 0.0}
    if state_path.exists():
        ck = torch.load(state_path, weights_only=False)
        model.load_state_dict(ck["model"]); opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"]); st = ck["st"]
        print(f"resumed {name} at step {st['step']}", flush=True)
    teacher = None
    if distill_from:
        from transformers import AutoModelForCausalLM
        teacher = AutoModelForCausalLM.from_pretrained(CHECKPOINTS / distill_from, dtype=torch.bfloat16).eval()
    model.train()

    def save():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                    "st": st}, state_path.with_suffix(".tmp"))
        state_path.with_suffix(".tmp").replace(state_path)

    t_end = time.time() + 60 * minutes
    last_save = time.time()
    while st["step"] < steps and time.time() < t_end:
        t0 = time.time()
        for g in opt.param_groups:
            g["lr"] = lr_at(st["step"], steps, peak)
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
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        st["step"] += 1; st["tokens"] += bsz * seq; st["seconds"] += time.time() - t0
        rec = {"step": st["step"], "tokens": st["tokens"], "seconds": round(st["seconds"], 1),
               "train_loss": round(ce.item(), 4)}
        if st["step"] % eval_every == 0 or st["step"] == steps:
            rec["heldout_loss"] = round(heldout_loss(model, held, seq), 4)
        if st["step"] % 20 == 0 or "heldout_loss" in rec:
            with open(log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(rec, flush=True)
        if time.time() - last_save > SAVE_EVERY_S:
            save(); last_save = time.time()
    save()
    return export(name, model, tok, held, distill_from)


ARCH_NAMES = {"llama": "Llama", "qwen3_5_text": "Qwen3.5 text (Gated DeltaNet : gated attention = 3 : 1)",
              "falcon_h1": "Falcon-H1 (a Mamba2 mixer beside attention in every layer)"}


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
    curve = ", ".join(f"{r['tokens'] / 1e6:.2f}M tok: {r['heldout_loss']:.3f}" for r in evals[:: max(1, len(evals) // 8)])
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
        init_note = (f"\n- Fine-tuned from `{PRESETS[name]['init']}`: {PRESETS[name]['mix']:.0%} of each batch from the "
                     f"train-split examples of `speclib.research.workloads` (agentic edit, JSON tool calls, plans, structured "
                     f"rewriting), the rest plain stdlib source. Tokens below count the fine-tuning only.")
    data_line = (f"the Python {sys.version.split()[0]} standard library's non-test source, split by file (every\n"
                 f"  {data.HELDOUT_EVERY}th file held out)")
    if is_math:
        acc = math_accuracy(model, tok, data.math_problems("validation", 200))
        data_line = (f"{MATH_TRAIN_PROBLEMS} generated arithmetic problems with worked solutions "
                     f"(`speclib.research.data.math_problems('train', ...)`, levels {data.MATH_LEVELS}); held-out loss on the "
                     f"validation split. Greedy final-answer accuracy on 200 validation problems: **{acc:.1%}**")
    card = f"""# {name}

{ARCH_NAMES.get(model.config.model_type, model.config.model_type)} architecture, {n_params / 1e6:.2f}M parameters (tied embeddings), {model.config.num_hidden_layers} layers,
hidden {model.config.hidden_size}, vocabulary {model.config.vocab_size} (the shared byte-level BPE in `data/checkpoints/tokenizer`).
Weights stored in bf16.

- Command: `python -m speclib train {' '.join(sys.argv[1:]) or 'model ' + name}` (resumable; preset `{name}` in `speclib/research/train.py`).
- Data: {data_line}; {'distilled from `' + distill_from + '` (KL to its softmax, mixed with next-token loss)' if distill_from else 'next-token loss'}.{init_note}
- Tokens seen: {last['tokens'] / 1e6:.2f}M in {last['step']} steps; training wall time {last['seconds'] / 60:.1f} min on 2 CPU cores (bf16 autocast).
- Held-out loss (fp32, 64 windows of 256 tokens): **{final:.3f}** nats/token{f"; on the held-out workload examples of notebook 02: **{final_w:.3f}**" if mixed else ""}.
- Held-out loss curve: {curve}.

## Greedy samples

""" + "\n".join(f"```python\n{s}\n```\n" for s in samples)
    (out / "MODEL_CARD.md").write_text(card)
    (out / "training.json").write_text(json.dumps({
        "name": name, "parameters": n_params, "heldout_loss": round(final, 4), "tokens_seen": last["tokens"],
        "heldout_loss_workloads": round(final_w, 4) if mixed else None, "init_from": PRESETS[name].get("init"),
        "steps": last["step"], "train_minutes": round(last["seconds"] / 60, 1), "distilled_from": distill_from,
        "python": sys.version.split()[0], **({"validation_accuracy": round(acc, 4)} if is_math else {})}, indent=1))
    print(f"exported {name}: held-out loss {final:.3f}", flush=True)
    return out


@torch.no_grad()
def math_accuracy(model, tok, problems: list[dict], max_new_tokens: int = 96) -> float:
    """Greedy final-answer accuracy (left-padded batches through `generate`)."""
    model.eval()
    tok.padding_side, right = "left", 0
    for i in range(0, len(problems), 50):
        chunk = problems[i:i + 50]
        enc = tok([p["question"] for p in chunk], return_tensors="pt", padding=True)
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id)
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        right += sum(data.math_answer(t) == p["answer"] for t, p in zip(texts, chunk))
    tok.padding_side = "right"
    return right / len(problems)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m speclib train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
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
    h.add_argument("--lr", type=float, default=1e-3)
    h.add_argument("--autocast", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 autocast for the target's pass and the head (default: where the CPU has bf16 units, "
                        "AVX512-BF16 or AMX; without them bf16 matmuls run about 5x slower than fp32)")
    h.add_argument("--vocab", type=int, default=None,
                   help="train over the N most frequent tokens of the training data only (FR-Spec's drafting "
                        "vocabulary): the output layer's share of training shrinks by V / N")
    h.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)
    if a.cmd == "tokenizer":
        print(train_tokenizer())
    elif a.cmd == "head":
        from speclib.research.heads import train_head
        if a.threads:
            torch.set_num_threads(a.threads)
        print(train_head(a.name, a.out, a.minutes, a.steps, a.batch, a.seq, a.unroll, a.lr,
                         autocast=bf16_native() if a.autocast is None else a.autocast, vocab=a.vocab))
    else:
        if a.threads:
            torch.set_num_threads(a.threads)
        train_model(a.name, a.steps, a.minutes, a.batch, distill_from=a.distill_from,
                    distill_weight=a.distill_weight)


if __name__ == "__main__":
    main()
