"""Training feature-level draft heads (EAGLE style); the module, its files and its LM view are in speclib.lms.head.

A head reads the target's hidden features (low / middle / high layers, fused as in EAGLE-3) with the
embedding of the next token, runs ONE decoder layer, and scores tokens through the target's frozen
final norm and LM head. `speclib.drafters.FeatureDrafter` drafts with it; docs/feature_drafting.md
has the maths, the training objective and why drafting with it stays lossless.

    head = speclib.load_head("code-target-head")       # data/checkpoints/code-target-head/
    python -m speclib train head code-target --minutes 30
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from speclib.lms.head import COUNTS, FeatureHead, new_head, save_head
from speclib.lms.lm import CHECKPOINTS
from speclib.research import training

STEP_DECAY = 0.8  # weight of unrolled step s in the loss: STEP_DECAY ** (s - 1)
FEATURE_WEIGHT = 0.2  # weight of the feature-regression term beside the distribution term
PROMPT_MIX = 0.5  # a pretrained target's head: share of each batch from instructions without answers


# --- training ------------------------------------------------------------------------------------
def unrolled_attention(q: torch.Tensor, keys: list, values: list) -> torch.Tensor:
    """Attention of unrolled step s = len(keys) for every anchor at once (q [B, H, T, hd]).

    Slot j at step s continues the draft anchored at slot c = j - s + 1: as when drafting, it sees the
    anchor's true-feature keys (step 1) at slots <= c, and its own chain: step m's key at slot
    j - (s - m) for m = 2..s. Slots with c < 0 see only themselves (they are left out of the loss)."""
    s, T = len(keys), q.shape[2]
    scale = q.shape[-1] ** -0.5
    idx = torch.arange(T, device=q.device)
    scores = [(q @ keys[0].transpose(-1, -2) * scale).masked_fill(idx[None] > idx[:, None] - (s - 1), float("-inf"))]
    shifted = []
    for m in range(2, s + 1):
        shift = s - m
        k, v = (F.pad(t, (0, 0, shift, 0))[:, :, :T] for t in (keys[m - 1], values[m - 1]))
        scores.append(((q * k).sum(-1, keepdim=True) * scale).masked_fill((idx < shift)[:, None], float("-inf")))
        shifted.append(v)
    att = torch.softmax(torch.cat(scores, -1), -1)
    o = att[..., :T] @ values[0]
    for i, v in enumerate(shifted):
        o = o + att[..., T + i : T + i + 1] * v
    return o


@torch.no_grad()
def target_pass(model, x: torch.Tensor, layers, autocast: bool, rows: torch.Tensor | None = None):
    """The target once over a batch x [B, T+1]: features [B, T+1, F], final normed state [B, T+1, d] and
    log-probabilities [B, T+1, V], all fp32; the expensive part of training, computed once per batch.
    rows: score only these token ids (a truncated vocabulary): log-probabilities [B, T+1, len(rows)] of
    the target's distribution renormalized over them, which is the softmax of those rows' logits."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if rows is None:
            out = model(input_ids=x, output_hidden_states=True)
            hs, logits = out.hidden_states, out.logits
        else:
            hs = model.model(input_ids=x, output_hidden_states=True).hidden_states
            logits = F.linear(hs[-1], model.lm_head.weight[rows])
    return torch.cat([hs[l] for l in layers], -1).float(), hs[-1].float(), F.log_softmax(logits.float(), -1)


def unrolled_states(head: FeatureHead, embed, x: torch.Tensor, feats: torch.Tensor, unroll: int) -> list:
    """The head's output states [B, T, d] of draft steps 1..unroll over a batch x [B, T+1] for every
    anchor at once. Slot j = 1..T (index j - 1) holds (feature f_{j-1}, token t_j) and scores t_{j+1};
    step 1 reads the target's features, step s > 1 the head's own step s - 1 output one slot earlier,
    and attends as `unrolled_attention` says: exactly what `HeadLM` computes when drafting."""
    T = x.shape[1] - 1
    emb = embed(x[:, 1:])
    pos = torch.arange(1, T + 1, device=x.device)
    fused = head.fuse(feats[:, :T])
    keys, values, states = [], [], []
    for s in range(1, unroll + 1):
        inp = fused if s == 1 else F.pad(states[-1], (0, 0, 1, 0))[:, :T]
        h_in = head.inp(torch.cat([inp, emb], -1))
        q, k, v = head.layer.qkv(h_in, pos)
        keys.append(k)
        values.append(v)
        states.append(head.layer.finish(h_in, unrolled_attention(q, keys, values)))
    return states


def unrolled_loss(head: FeatureHead, parts, x, feats, top, logp, unroll: int, rows: torch.Tensor | None = None):
    """Loss over a batch x [B, T+1] given the target's pass (feats, top, logp): per draft step s, the
    cross-entropy to the target's distribution at slot j's position + FEATURE_WEIGHT x a smooth-L1
    regression of the normed output onto the target's final normed state there, over the slots whose
    anchor exists (j >= s), weighted STEP_DECAY ** (s - 1). Returns (loss, per-step cross-entropy,
    per-step top-1 agreement with the target). rows: the truncated vocabulary `target_pass` scored (the
    head's distribution over the same rows; agreement is then within them)."""
    embed, norm, lm_head = parts
    weight = lm_head.weight if rows is None else lm_head.weight[rows]
    B, T = x.shape[0], x.shape[1] - 1
    p = logp[:, 1:].exp()
    total, ces, agree = 0.0, [], []
    for s, h in enumerate(unrolled_states(head, embed, x, feats, unroll), 1):
        normed = norm(h)
        logq = F.log_softmax(F.linear(normed, weight).float(), -1)
        valid = (torch.arange(T, device=x.device) >= s - 1).float()[None].expand(B, T)
        ce = -(p * logq).sum(-1)
        reg = F.smooth_l1_loss(normed.float(), top[:, 1:], reduction="none").mean(-1)
        total = total + STEP_DECAY ** (s - 1) * ((ce + FEATURE_WEIGHT * reg) * valid).sum() / valid.sum()
        ces.append(float((ce.detach() * valid).sum() / valid.sum()))
        agree.append(float(((logq.argmax(-1) == p.argmax(-1)).float() * valid).sum() / valid.sum()))
    return total, ces, agree


def fit(
    target,
    head: FeatureHead,
    train: np.ndarray,
    held: np.ndarray,
    state_dir,
    *,
    steps: int = 2000,
    minutes: float = 30,
    batch: int = 8,
    seq: int = 256,
    unroll: int = 3,
    lr: float = 1e-3,
    seed: int = 0,
    autocast: bool = True,
    eval_every: int = 100,
    n_eval: int = 16,
    extra: np.ndarray | None = None,
    mix: float = 0.0,
    rows: torch.Tensor | None = None,
    snapshots=(),
    start: dict | None = None,
    log=print,
) -> dict:
    """Train `head` on `target`'s features over token streams; resumable (state_dir/state.pt, written at
    least every training.SAVE_EVERY_S seconds and at the end, resumed when present). Stops after `steps`
    steps in all or `minutes` in this call. rows: train over these token ids only (FR-Spec's drafting
    vocabulary: the target's distribution renormalized over them; the output layer's cost in training
    shrinks by V / len(rows)). snapshots: token counts after which the head is also saved to
    state_dir/tokens-<N>/ (a learning curve's points). start: the progress record to continue when there is
    no state (weights already loaded into `head`, the optimizer fresh). Returns the run's record (steps, tokens, seconds,
    held-out)."""
    parts = target.frozen_parts()
    for m in parts:
        m.requires_grad_(False)
    model, layers = target.model, head.feature_layers
    opt = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = training.Checkpoint(state_dir / "state.pt", {"head": head, "opt": opt, "gen": gen})
    st = checkpoint.restore()
    if st is not None:
        log(f"resumed at step {st['step']}")
    elif start is not None:
        st = {"step": start["step"], "tokens": start["tokens"], "seconds": 0.0, "evals": []}
        st["snapshots"] = [n for n in snapshots if n <= st["tokens"]]  # taken by the committed run
        log(f"continuing the committed weights from step {st['step']} ({st['tokens']} tokens seen)")
    else:
        st = {"step": 0, "tokens": 0, "seconds": 0.0, "evals": []}
    starts = np.linspace(0, len(held) - seq - 2, n_eval).astype(int)
    held_x = torch.stack([torch.from_numpy(held[s : s + seq + 1].astype(np.int64)) for s in starts])

    def evaluate() -> dict:
        head.eval()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            runs = [
                unrolled_loss(head, parts, xb, *target_pass(model, xb, layers, autocast, rows), unroll, rows)[1:]
                for xb in held_x.split(batch)
            ]
        head.train()
        return {
            "step": st["step"],
            "tokens": st["tokens"],
            "ce": [round(float(np.mean(c)), 4) for c in zip(*(r[0] for r in runs))],
            "agreement": [round(float(np.mean(a)), 4) for a in zip(*(r[1] for r in runs))],
        }

    def step_loss():
        n_mix = int(round(mix * batch)) if extra is not None else 0
        x = training.batch(train, batch - n_mix, seq, gen)
        if n_mix:
            x = torch.cat([x, training.batch(extra, n_mix, seq, gen)])
        target_out = target_pass(model, x, layers, autocast, rows)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):  # AMX / bf16 units: ~3x
            loss, ces, _ = unrolled_loss(head, parts, x, *target_out, unroll, rows)
        return loss, ces

    def on_step(st, loss, ces):
        if st["step"] % 10 == 0 or st["step"] == 1:
            log(
                f"step {st['step']}: loss {loss.item():.4f}, ce per step {[round(c, 3) for c in ces]}, "
                f"{st['tokens'] / st['seconds']:.0f} tokens/s"
            )
        if st["step"] % eval_every == 0:
            st["evals"].append(evaluate())
            log(f"held-out: {st['evals'][-1]}")
        for n in training.snapshots_due(st, snapshots):
            if not st["evals"] or st["evals"][-1]["step"] != st["step"]:
                st["evals"].append(evaluate())
            save_head(head, state_dir / f"tokens-{n}")
            log(f"snapshot after {n} tokens: {state_dir / f'tokens-{n}'}")

    head.train()
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
    if not st["evals"] or st["evals"][-1]["step"] != st["step"]:
        st["evals"].append(evaluate())
        log(f"held-out: {st['evals'][-1]}")
        checkpoint.save(st)  # the saved record ends with this evaluation too
    return st


def train_head(
    target_name: str,
    out=None,
    minutes: float = 30,
    steps: int = 2000,
    batch: int = 8,
    seq: int = 256,
    unroll: int = 3,
    lr: float = 1e-3,
    layers=None,
    seed: int = 0,
    autocast: bool = True,
    eval_every: int = 100,
    vocab: int | None = None,
    corpus: str = "chat_data",
    answer_tokens: int | None = None,
    snapshots=(),
    ff: int | None = None,
    n_eval: int = 16,
) -> Path:
    """Train (or resume) the head of a shipped target on the target's own training split (the preset's
    streams in `speclib.research.training`, its workload mix included) and write data/checkpoints/<target>-head/
    (or `out`) with a MODEL_CARD.md. State in build/train/<out name>/. A pretrained target
    (`speclib.lms.pretrained`) trains on its own chat answers: run `python -m speclib chat_data NAME` first.
    vocab: train over the `vocab` most frequent tokens of the training data only (config "train_vocab";
    draft with `FeatureDrafter(vocab=frequent_tokens(token_counts(head), vocab))`). ff: the head's MLP width
    (`new_head`); n_eval: held-out windows of `seq` tokens per evaluation."""
    from speclib.lms import pretrained
    from speclib.lms.loading import load
    from speclib.research import chat_data, draft_corpus

    if corpus not in ("chat_data", "draft_corpus"):
        raise ValueError(f"corpus must be 'chat_data' or 'draft_corpus', got {corpus!r}")
    lm = load(target_name, device="cpu", dtype=torch.float32)
    out = Path(out) if out is not None else CHECKPOINTS / f"{Path(target_name).name}-head"
    preset = training.PRESETS.get(target_name, {})
    extra, mix = (training.workload_stream("train", lm.tokenizer), preset["mix"]) if preset.get("mix") else (None, 0.0)
    if target_name in pretrained.MODELS and corpus == "draft_corpus":
        # its own answers to the shipped licensed prompts (speclib.research.draft_corpus), the first
        # `answer_tokens` of them when given
        train_s = draft_corpus.stream(target_name, "train", answer_tokens)
        held_s, extra, mix = draft_corpus.stream(target_name, "heldout"), None, 0.0
    elif target_name in pretrained.MODELS:
        # its own answers to instructions, and (half of each batch) more instructions without answers
        train_s, held_s = chat_data.stream(target_name, "train"), chat_data.stream(target_name, "heldout")
        extra, mix = chat_data.prompt_stream(target_name, "train"), PROMPT_MIX
    elif target_name in training.PRESETS:
        train_s, held_s = training.streams(target_name, lm.tokenizer)
    else:
        train_s, held_s = training.token_stream("train", lm.tokenizer), training.token_stream("heldout", lm.tokenizer)
    head = new_head(lm, Path(target_name).name, layers, seed, ff)
    start = committed_progress(head, out, training.STATE / out.name)
    seen = np.concatenate([train_s] + ([extra] if extra is not None else [])).astype(np.int64)
    counts = np.bincount(seen, minlength=head.config["vocab_size"]).astype(np.int64)
    rows = None
    if vocab is not None:
        from speclib.drafters import frequent_tokens

        rows = frequent_tokens(counts, vocab)
        head.config["train_vocab"] = int(vocab)
    st = fit(
        lm,
        head,
        train_s,
        held_s,
        training.STATE / out.name,
        steps=steps,
        minutes=minutes,
        batch=batch,
        seq=seq,
        unroll=unroll,
        lr=lr,
        seed=seed,
        autocast=autocast,
        eval_every=eval_every,
        extra=extra,
        mix=mix,
        rows=rows,
        snapshots=snapshots,
        start=start,
        n_eval=n_eval,
        log=lambda m: print(m, flush=True),
    )
    save_head(head, out)
    for folder in [out] + [training.STATE / out.name / f"tokens-{n}" for n in st.get("snapshots", [])]:
        np.save(folder / COUNTS, counts)
    knobs = dict(unroll=unroll, batch=batch, seq=seq, lr=lr)
    if rows is not None:
        knobs["vocab"] = (
            f"over the {vocab} most frequent tokens of the training data only ({seen[np.isin(seen, rows.numpy())].size / seen.size:.1%} "
            f"of its tokens; the target's distribution renormalized over them; draft with "
            f"`FeatureDrafter(vocab=frequent_tokens(token_counts(...), {vocab}))`)"
        )
    if target_name in pretrained.MODELS and corpus == "draft_corpus":
        knobs["data"] = (
            f"the target's own answers to the shipped licensed chat prompts of Spec-Bench's six kinds "
            f"(`speclib.research.draft_corpus`; {len(train_s) / 1e6:.2f}M tokens of conversations)"
        )
    elif target_name in pretrained.MODELS:
        knobs["data"] = (
            f"the target's own greedy answers to instructions built from the standard library's "
            f"docstrings (`speclib.research.chat_data`; {len(train_s) / 1e6:.2f}M tokens), half of each batch from "
            f"{len(extra) / 1e6:.2f}M tokens of further instructions in its chat template without answers"
        )
    write_card(out, head, st, knobs)
    return out


def committed_progress(head: FeatureHead, out: Path, state_dir: Path) -> dict | None:
    """On a machine without the training state (build/ is not committed), continue from the committed
    weights in `out`: load them into `head` and return their progress record (training.json); None when
    there is state to resume or nothing committed for this target."""
    from speclib.lms.head import load_head

    record = out / "training.json"
    if (state_dir / "state.pt").exists() or not record.exists():
        return None
    committed = json.loads((out / "config.json").read_text())
    if committed.get("target") != head.config.get("target"):
        return None
    if committed.get("intermediate_size") != head.config["intermediate_size"]:
        raise ValueError(
            f"the head committed in {out} has MLP width {committed.get('intermediate_size')}, this run asks for "
            f"{head.config['intermediate_size']}: give the same --ff, or another --out"
        )
    head.load_state_dict(load_head(out).state_dict())
    return json.loads(record.read_text())


def write_card(out: Path, head: FeatureHead, st: dict, knobs: dict) -> None:
    c, last = head.config, st["evals"][-1]
    n_params = sum(p.numel() for p in head.parameters())
    curve = ", ".join(
        f"{e['tokens'] / 1e6:.2f}M tok: {e['ce'][0]:.3f}" for e in st["evals"][:: max(1, len(st["evals"]) // 8)]
    )
    card = f"""# {out.name}

EAGLE-style feature-level draft head for `{c["target"]}` (weights fingerprint `{c["fingerprint"]}`):
fuse(features of hidden states {c["feature_layers"]}) and the next token's embedding -> one Llama decoder
layer (hidden {c["hidden_size"]}, {c["num_heads"]} heads, MLP {c["intermediate_size"]}) -> the target's frozen
final norm and LM head. {n_params / 1e6:.2f}M parameters of its own, stored in bf16. See docs/feature_drafting.md.

- Command: `python -m speclib train {" ".join(sys.argv[1:]) or "head " + c["target"]}` (resumable).
- Objective: cross-entropy to the target's next-token distribution{" " + knobs["vocab"] if "vocab" in knobs else ""} + {FEATURE_WEIGHT} x smooth-L1 regression onto
  the target's final normed state, over {knobs["unroll"]} unrolled draft steps (step s weighted {STEP_DECAY}^(s-1));
  batches of {knobs["batch"]} x {knobs["seq"]} tokens from {knobs.get("data", "the target's training split")}, AdamW, peak lr {knobs["lr"]}.
- Tokens seen: {st["tokens"] / 1e6:.2f}M in {st["step"]} steps; training wall time {st["seconds"] / 60:.1f} min on CPU
  ({st["tokens"] / max(st["seconds"], 1e-9):.0f} tokens/s, the target's forward included).
- Held-out ({len(st["evals"])} evaluations, 16 windows): cross-entropy to the target per draft step
  **{last["ce"]}** nats/token; top-1 agreement with the target per draft step **{last["agreement"]}**
  (teacher-forced on the data's tokens: a proxy for the greedy acceptance rate at draft position s).
- Step-1 cross-entropy curve: {curve}.
"""
    (out / "MODEL_CARD.md").write_text(card)
    (out / "training.json").write_text(
        json.dumps(
            {
                "target": c["target"],
                "steps": st["step"],
                "tokens_seen": st["tokens"],
                "train_minutes": round(st["seconds"] / 60, 1),
                "heldout": last,
                "parameters": n_params,
                **knobs,
            },
            indent=1,
        )
    )
