"""Batched greedy rollouts for CoSpec's training data: `arbitrate` runs the draft-then-arbitrate process
token by token for a batch of prompts with both models in lockstep (each position: target argmax t, draft
argmax d; the chain position j decides whether the position was drafted at all, as in the SD loop). Its
outputs equal `speclib.generate` with an `Arbiter`, token for token; it is what makes RL affordable.

It calls the Hugging Face model under each LM (`lm.model`, left-padded batches with one KV cache) instead
of going through the LM protocol, whose LMs decode one request at a time. `branch_labels` labels each
mismatch by rolling both branches out.
"""

from __future__ import annotations

from collections import deque

import torch

from speclib.acceptors.cospec import FEATURES, RECENT, always_target, features


def _prefill(model, prompts: list[list[int]], pad: int):
    L = max(map(len, prompts))
    ids = torch.tensor([[pad] * (L - len(x)) + x for x in prompts])
    mask = torch.tensor([[0] * (L - len(x)) + [1] * len(x) for x in prompts])
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    return out.logits[:, -1].float(), out.cache, mask, pos[:, -1]


def _advance(model, tok, cache, mask, last_pos):
    mask = torch.cat([mask, torch.ones(len(tok), 1, dtype=mask.dtype)], 1)
    out = model(
        input_ids=tok[:, None], attention_mask=mask, position_ids=(last_pos + 1)[:, None], cache=cache, use_cache=True
    )
    return out.logits[:, -1].float(), out.cache, mask, last_pos + 1


@torch.inference_mode()
def arbitrate(
    target,
    draft,
    prompts: list[list[int]],
    k: int,
    policy=always_target,
    max_new_tokens: int = 128,
    sample_policy: bool = False,
    gen: torch.Generator | None = None,
    batch_size: int = 128,
) -> list[dict]:
    """Run CoSpec decoding (greedy) for many prompts at once; one dict per prompt: tokens, mismatches
    (features [M, F], kept [M] as decided), target_calls (verify passes the SD loop would make after its
    prefill). draft=None decodes the target alone (greedy AR), which is what branch rollouts use.
    With sample_policy the keep decisions are Bernoulli draws from the policy (for RL), else p > 0.5."""
    out = []
    for s in range(0, len(prompts), batch_size):
        out += _arbitrate_chunk(
            target, draft, prompts[s : s + batch_size], k, policy, max_new_tokens, sample_policy, gen
        )
    return out


def _arbitrate_chunk(target, draft, prompts, k, policy, max_new_tokens, sample_policy, gen):
    B, eos = len(prompts), target.eos_token_id
    eos = -1 if eos is None else eos  # a model without EOS runs to max_new_tokens
    tm, dm = target.model, draft.model if draft is not None else None
    pad = max(eos, 0)
    lt, tc, tmask, tpos = _prefill(tm, prompts, pad)
    if dm is not None:
        ld, dc, dmask, dpos = _prefill(dm, prompts, pad)
    rows = [dict(tokens=[], feats=[], kept=[], at=[]) for _ in range(B)]
    calls = torch.zeros(B, dtype=torch.long)  # verify passes after the prefill
    # position in the current chain; k = a target-only position (bonus or, at step 0, the prefill's token)
    j = torch.full((B,), k, dtype=torch.long)
    last_ended = torch.ones(B, dtype=torch.bool)
    recent = [deque(maxlen=RECENT) for _ in range(B)]
    alive = torch.ones(B, dtype=torch.bool)
    for step in range(max_new_tokens):
        t = lt.argmax(-1)
        tok = t.clone()
        if dm is not None:
            d = ld.argmax(-1)
            drafted = j < k
            mism = (drafted & (d != t) & alive).nonzero()[:, 0]
            keep = torch.zeros(B, dtype=torch.bool)
            if len(mism):
                rec = torch.tensor([sum(recent[b]) / len(recent[b]) if recent[b] else 1.0 for b in mism.tolist()])
                x = features(
                    torch.softmax(lt[mism], -1),
                    torch.softmax(ld[mism], -1),
                    t[mism],
                    d[mism],
                    j[mism].float(),
                    torch.full((len(mism),), float(step)),
                    rec,
                )
                prob = policy(x).detach()
                kk = torch.bernoulli(prob, generator=gen).bool() if sample_policy else prob > 0.5
                keep[mism] = kk
                for n, b in enumerate(mism.tolist()):
                    rows[b]["feats"].append(x[n])
                    rows[b]["kept"].append(bool(kk[n]))
                    rows[b]["at"].append((step, int(d[b])))  # position and the draft's token
            tok = torch.where(keep, d, t)
            for b in (drafted & alive).nonzero()[:, 0].tolist():
                recent[b].append(int(d[b] == t[b]))
            ends_chain = ~drafted | ((d != t) & ~keep)  # a bonus token, or the target's correction
            if step:  # each verify pass ends one chain; step 0 is the prefill
                calls += ends_chain & alive
            last_ended = torch.where(alive, ends_chain, last_ended)
            j = torch.where(ends_chain, 0, j + 1)
        elif step:
            calls += alive
        for b in alive.nonzero()[:, 0].tolist():
            rows[b]["tokens"].append(int(tok[b]))
        alive &= tok != eos
        if not alive.any() or step + 1 == max_new_tokens:
            break
        tok = torch.where(alive, tok, pad)  # finished rows keep running on padding (ignored)
        lt, tc, tmask, tpos = _advance(tm, tok, tc, tmask, tpos)
        if dm is not None:
            ld, dc, dmask, dpos = _advance(dm, tok, dc, dmask, dpos)
    calls += ~last_ended  # generation ended inside a chain: that pass still ran
    for b, r in enumerate(rows):
        r["target_calls"] = int(calls[b])
        r["feats"] = torch.stack(r["feats"]) if r["feats"] else torch.zeros(0, len(FEATURES))
        r["kept"] = torch.tensor(r["kept"], dtype=torch.bool)
    return rows


def branch_labels(
    target, draft, prompts: list[list[int]], check, max_new_tokens: int = 128, batch_size: int = 128
) -> list[dict]:
    """Walk the target's greedy solution of each prompt; at every position where the draft's argmax
    differs, continue greedily with the target from the draft's token and judge both branches.

    check(i, tokens) -> bool says whether completion `tokens` of prompt i is correct. One dict per
    mismatch: problem, pos, features [F], draft_correct (the draft token's branch), target_correct
    (the target's own solution)."""
    base = arbitrate(target, draft, prompts, max_new_tokens + 1, always_target, max_new_tokens, batch_size=batch_size)
    todo = [(i, pos, dtok, x) for i, r in enumerate(base) for (pos, dtok), x in zip(r["at"], r["feats"])]
    heads = [base[i]["tokens"][:pos] + [dtok] for i, pos, dtok, _ in todo]
    rolls = arbitrate(
        target,
        None,
        [prompts[i] + h for (i, *_), h in zip(todo, heads)],
        1,
        always_target,
        max(1, max_new_tokens - min((len(h) for h in heads), default=1)),
        batch_size=batch_size,
    )
    target_ok = [check(i, r["tokens"]) for i, r in enumerate(base)]
    return [
        dict(
            problem=i,
            pos=pos,
            features=x,
            target_correct=target_ok[i],
            draft_correct=check(i, (h + r["tokens"])[:max_new_tokens]),
        )
        for (i, pos, _, x), h, r in zip(todo, heads, rolls)
    ]
