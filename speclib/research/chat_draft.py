"""A separate draft model for a pretrained chat target, distilled from the target's logits.

    python -m speclib train draft smollm2-135m-instruct --layers 4 --vocab 8192 --minutes 60

The draft is the target cut short: its token embedding (tied to the LM head), final norm and `layers`
of its decoder layers evenly spaced from the first to the last, as a standalone Llama of the target's
width and tokenizer. The embedding stays frozen (the target's); the layers and the norm are trained
to match the target's next-token distribution (KL), on the target's own answers to instructions and,
half of each batch, further instructions without answers (`speclib.research.chat_data`: built from
the standard library's docstrings, none a Spec-Bench question). With `vocab`, training scores only the
N most frequent tokens of that data (FR-Spec: both distributions renormalized over them), and the
draft should draft from them too (`LlamaLM.restrict_vocab(frequent_tokens(token_counts, N))`): the
LM head over the full vocabulary is most of a shallow draft's cost. Lossless either way: the target
verifies over its whole vocabulary.

Resumable like every trainer here (state in build/train/<out name>/); each call exports the current
weights in HF format with a MODEL_CARD.md and the training data's token counts (FR-Spec's ranking).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from speclib.lms.head import COUNTS
from speclib.lms.lm import CHECKPOINTS
from speclib.research import training

PROMPT_MIX = 0.5  # share of each batch from instructions without answers


def cut_layers(n_layers: int, keep: int) -> list[int]:
    """`keep` layer indices evenly spaced over 0..n_layers - 1, first and last included."""
    if not 1 <= keep <= n_layers:
        raise ValueError(f"layers must be in [1, {n_layers}], got {keep}")
    return sorted({round(i * (n_layers - 1) / max(keep - 1, 1)) for i in range(keep)})


def new_draft(teacher, keep: int):
    """A Llama with the teacher's width, tokenizer and embedding, and `keep` of its layers (copies)."""
    import copy

    import transformers

    layers = cut_layers(teacher.config.num_hidden_layers, keep)
    cfg = copy.deepcopy(teacher.config)
    cfg.num_hidden_layers = len(layers)
    cfg.layer_types = None
    draft = transformers.LlamaForCausalLM(cfg)
    draft.model.embed_tokens.load_state_dict(teacher.model.embed_tokens.state_dict())
    draft.model.norm.load_state_dict(teacher.model.norm.state_dict())
    for mine, theirs in zip(draft.model.layers, layers):
        mine.load_state_dict(teacher.model.layers[theirs].state_dict())
    draft.tie_weights()
    draft.model.embed_tokens.requires_grad_(False)
    return draft, layers


def row_logits(model, x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """Logits [b, n, V or len(rows)] of a causal LM over `rows` of its (tied) LM head only."""
    h = model.model(input_ids=x).last_hidden_state
    w = model.lm_head.weight
    return h @ (w if rows is None else w[rows]).T


def agreement(draft, teacher, x: torch.Tensor, rows) -> tuple[float, float]:
    """(KL(teacher || draft) per token over `rows`, top-1 agreement with the teacher's full-vocabulary argmax)."""
    with torch.no_grad():
        t_full = row_logits(teacher, x[:, :-1], None)
        t = t_full if rows is None else t_full[..., rows]
        d = row_logits(draft, x[:, :-1], rows)
        kl = F.kl_div(F.log_softmax(d, -1), F.log_softmax(t, -1), log_target=True, reduction="batchmean") / x.shape[1]
        pick = d.argmax(-1) if rows is None else rows[d.argmax(-1)]
        return kl.item(), (pick == t_full.argmax(-1)).float().mean().item()


def train_draft(
    target_name: str,
    out=None,
    layers: int = 4,
    vocab: int | None = 8192,
    minutes: float = 60,
    steps: int = 4000,
    batch: int = 8,
    seq: int = 256,
    lr: float = 5e-4,
    seed: int = 0,
    eval_every: int = 100,
    corpus: str = "chat_data",
    answer_tokens: int | None = None,
    snapshots=(),
    autocast: bool = False,
) -> Path:
    """Distil (or resume) the draft and export it to `out` (default data/checkpoints/<family>-draft);
    snapshots: token counts after which it is also exported to build/train/<out name>/tokens-<N>/.
    Without build/'s state it continues from the weights committed in `out` when they were distilled the
    same way (`committed_progress`). autocast: bf16 for the teacher's and the draft's passes (where the
    CPU has bf16 units the teacher's forward, most of a step, runs several times faster)."""
    from transformers import AutoModelForCausalLM

    from speclib.drafters import frequent_tokens
    from speclib.lms import pretrained
    from speclib.research import chat_data, draft_corpus

    if corpus not in ("chat_data", "draft_corpus"):
        raise ValueError(f"corpus must be 'chat_data' or 'draft_corpus', got {corpus!r}")
    if target_name not in pretrained.MODELS:
        raise ValueError(f"unknown pretrained target {target_name!r}: one of {', '.join(pretrained.MODELS)}")
    folder = pretrained.materialize(target_name)
    teacher = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval().requires_grad_(False)
    out = Path(out) if out is not None else CHECKPOINTS / f"{target_name.split('-')[0]}-draft"
    torch.manual_seed(seed)
    draft, kept = new_draft(teacher, layers)
    if corpus == "draft_corpus":  # the target's own answers to the shipped licensed prompts, nothing mixed in
        train_s = draft_corpus.stream(target_name, "train", answer_tokens)
        held_s, extra, mix = draft_corpus.stream(target_name, "heldout"), train_s[:0], 0.0
    else:
        train_s, held_s = chat_data.stream(target_name, "train"), chat_data.stream(target_name, "heldout")
        extra, mix = chat_data.prompt_stream(target_name, "train"), PROMPT_MIX
    seen = np.concatenate([train_s, extra]).astype(np.int64)
    counts = np.bincount(seen, minlength=teacher.config.vocab_size).astype(np.int64)
    rows = frequent_tokens(counts, vocab) if vocab else None
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    state_dir = training.STATE / out.name
    state_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = training.Checkpoint(state_dir / "state.pt", {"draft": draft, "opt": opt, "gen": gen})
    knobs = dict(vocab=vocab, batch=batch, seq=seq, lr=lr, target_layers=teacher.config.num_hidden_layers)
    knobs |= dict(answer_tokens=len(train_s), prompt_tokens=len(extra), corpus=corpus, autocast=autocast)
    st = checkpoint.restore() or committed_progress(draft, out, kept, corpus, snapshots)
    st = st or {"step": 0, "tokens": 0, "seconds": 0.0, "evals": []}
    starts = np.linspace(0, len(held_s) - seq - 2, 16).astype(int)
    held_x = torch.stack([torch.from_numpy(held_s[s : s + seq + 1].astype(np.int64)) for s in starts])

    def evaluate() -> dict:
        draft.eval()
        runs = [agreement(draft, teacher, xb, rows) for xb in held_x.split(batch)]
        draft.train()
        kl, agree = map(np.mean, zip(*runs))
        return {
            "step": st["step"],
            "tokens": st["tokens"],
            "kl": round(float(kl), 4),
            "agreement": round(float(agree), 4),
        }

    def step_loss():
        n_mix = int(round(mix * batch))
        x = training.batch(train_s, batch - n_mix, seq, gen)
        if n_mix:
            x = torch.cat([x, training.batch(extra, n_mix, seq, gen)])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            with torch.no_grad():
                t = row_logits(teacher, x[:, :-1], rows)
            d = row_logits(draft, x[:, :-1], rows)
        d, t = d.float(), t.float()  # the KL itself in fp32
        return F.kl_div(F.log_softmax(d, -1), F.log_softmax(t, -1), log_target=True, reduction="batchmean") / seq, None

    def on_step(st, loss, _):
        if st["step"] % 10 == 0 or st["step"] == 1:
            print(f"step {st['step']}: KL {loss.item():.4f}, {st['tokens'] / st['seconds']:.0f} tokens/s", flush=True)
        if st["step"] % eval_every == 0:
            st["evals"].append(evaluate())
            print(f"held-out: {st['evals'][-1]}", flush=True)
        for n in training.snapshots_due(st, snapshots):
            if st["evals"][-1]["step"] != st["step"]:
                st["evals"].append(evaluate())
            export(draft, folder, state_dir / f"tokens-{n}", target_name, kept, counts, st, knobs)

    if not st["evals"]:
        st["evals"].append(evaluate())  # step 0: the cut model before training
        print(f"held-out: {st['evals'][-1]}", flush=True)
    draft.train()
    training.run_training(
        step_loss,
        opt,
        st,
        steps=steps,
        minutes=minutes,
        tokens_per_step=batch * seq,
        lr=lr,
        warmup=min(100, steps // 10 + 1),
        on_step=on_step,
        checkpoint=checkpoint,
    )
    if st["evals"][-1]["step"] != st["step"]:
        st["evals"].append(evaluate())
        checkpoint.save(st)
    export(draft, folder, out, target_name, kept, counts, st, knobs)
    return out


def committed_progress(draft, out: Path, kept: list[int], corpus: str, snapshots=()) -> dict | None:
    """Continue from the draft committed in `out` (build/'s state is not committed): load its own
    weights into `draft` and return its progress record, when it was cut from the same layers and
    distilled on the same corpus; else None."""
    from safetensors.torch import load_file

    record = out / "training.json"
    if not record.exists():
        return None
    done = json.loads(record.read_text())
    if done.get("layers") != kept or done.get("corpus", "chat_data") != corpus:
        return None
    missing, unexpected = draft.load_state_dict(load_file(out / "model.safetensors"), strict=False)
    if unexpected or any("embed" not in k and "lm_head" not in k for k in missing):
        raise ValueError(f"{out}: its weights do not fit a {len(kept)}-layer draft ({missing or unexpected})")
    print(f"continuing {out} from step {done['steps']} ({done['tokens_seen']} tokens seen)", flush=True)
    st = {"step": done["steps"], "tokens": done["tokens_seen"], "seconds": done["train_minutes"] * 60}
    return st | {"evals": done["evals"], "snapshots": [n for n in snapshots if n <= done["tokens_seen"]]}


def export(draft, folder: Path, out: Path, target: str, kept: list[int], counts, st: dict, knobs: dict) -> None:
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    draft.config.embedding_from = target  # `speclib.load` copies it back in (`loading.attach_embedding`)
    draft.config.save_pretrained(out)
    own = {
        k: v.to(torch.bfloat16).contiguous()
        for k, v in draft.state_dict().items()
        if "embed" not in k and "lm_head" not in k
    }
    save_file(own, out / "model.safetensors", metadata={"format": "pt"})
    AutoTokenizer.from_pretrained(folder).save_pretrained(out)
    np.save(out / COUNTS, counts)
    first, last = st["evals"][0], st["evals"][-1]
    n_params = sum(p.numel() for p in draft.parameters())
    n_own = sum(p.numel() for n, p in draft.named_parameters() if "embed" not in n)
    fr = knobs["vocab"]
    data = (
        f"the target's own answers to the shipped licensed chat prompts (`speclib.research.draft_corpus`; "
        f"{knobs['answer_tokens'] / 1e6:.2f}M tokens of conversations)"
        if knobs.get("corpus") == "draft_corpus"
        else f"half the target's own greedy answers to instructions built from the standard library's docstrings "
        f"(`speclib.research.chat_data`; {knobs['answer_tokens'] / 1e6:.2f}M tokens), half further instructions "
        f"in its chat template without answers ({knobs['prompt_tokens'] / 1e6:.2f}M tokens)"
    )
    card = f"""# {out.name}

A separate draft for `{target}` (same tokenizer): the target cut to {len(kept)} of its {knobs["target_layers"]}
decoder layers (copies of its layers {kept}), its embedding (tied to the LM head, frozen) and
final norm, then distilled from the target's logits. {n_params / 1e6:.1f}M parameters, {n_own / 1e6:.1f}M of them its own,
stored here in bf16; the embedding ({draft.config.vocab_size:,} x {draft.config.hidden_size}, tied to the LM head) is the target's and
is not stored: `speclib.load` copies it from the target. See `speclib/research/chat_draft.py`.

- Command: `python -m speclib train {" ".join(sys.argv[1:]) or "draft " + target}` (resumable).
- Objective: KL(target || draft) per token{f" over the {fr} most frequent tokens of the training data (FR-Spec; both distributions renormalized over them; draft with `LlamaLM.restrict_vocab(frequent_tokens(token_counts, {fr}))`)" if fr else ""};
  batches of {knobs["batch"]} x {knobs["seq"]} tokens, {data}; AdamW, peak lr {knobs["lr"]}.
- Tokens seen: {st["tokens"] / 1e6:.2f}M in {st["step"]} steps; {st["seconds"] / 60:.1f} min on CPU{" in bf16 autocast" if knobs.get("autocast") else ""}
  ({st["tokens"] / max(st["seconds"], 1e-9):.0f} tokens/s, the target's forward included).
- Held-out (16 windows of the held-out answers): top-1 agreement with the target's greedy token
  **{last["agreement"]:.3f}** (the cut model before training: {first["agreement"]:.3f}); KL {last["kl"]:.3f} nats/token
  (before: {first["kl"]:.3f}). Agreement is teacher-forced: a proxy for greedy per-token acceptance.
"""
    (out / "MODEL_CARD.md").write_text(card)
    record = dict(target=target, layers=kept, steps=st["step"], tokens_seen=st["tokens"], parameters=n_params)
    record |= dict(train_minutes=round(st["seconds"] / 60, 1), evals=st["evals"], **knobs)
    (out / "training.json").write_text(json.dumps(record, indent=1))
    print(f"exported {out}: agreement {first['agreement']:.3f} -> {last['agreement']:.3f}", flush=True)
