"""Chat training data for drafts of a pretrained instruction model, from text this machine has.

A draft (a feature head, a distilled small model) learns the target's distribution where it drafts:
the target's own answers to instructions in its chat template. The instructions are built from the
docstrings of the Python standard library's files (`speclib.research.data`'s by-file split, so held-out
instructions come from files no training instruction saw) in the kinds of Spec-Bench's tasks:
summarize, translate, answer a question about a passage, explain, write, and small arithmetic word
problems. None is a Spec-Bench question (`check_disjoint`). The target answers each greedily once;
the answers are cached under build/train/ (resumable) and joined into token streams for training.

    python -m speclib chat_data smollm2-135m-instruct --n 400       # answers for the train split
"""

from __future__ import annotations

import ast
import functools
import json
import random
import sys
import sysconfig
from pathlib import Path

import numpy as np

from speclib.core.device import REPO
from speclib.research import data

STATE = REPO / "build" / "train"
HELDOUT_FRACTION = 0.1  # instructions of the held-out split per training instruction asked for

_KINDS = (
    ("summarize", "Summarize the following documentation in two or three sentences.\n\n{doc}"),
    ("translate", "Translate the following text into {lang}.\n\n{first}"),
    ("qa", "Read the passage and answer the question.\n\nPassage: {doc}\n\nQuestion: What is `{name}` used for?"),
    ("explain", "Explain to a beginner what the Python object `{qual}` does, with a short example."),
    ("write", "Write a short paragraph for a newsletter announcing the Python module `{module}`."),
    ("math", "{math}"),
)
_LANGS = ("French", "German", "Spanish", "Italian")


def module_name(path: Path) -> str:
    """The dotted module name of a stdlib file: json/__init__.py -> json, email/mime/text.py -> email.mime.text."""
    rel = path.relative_to(sysconfig.get_paths()["stdlib"]).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _docstrings(path: Path) -> list[tuple[str, str, str]]:
    """(module, qualified name, docstring) of a file's module, classes and functions with a docstring of 80+ chars."""
    try:
        tree = ast.parse(data.read_text(path))
    except (SyntaxError, ValueError):
        return []
    module, out = module_name(path), []
    for node in [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))]:
        doc = ast.get_docstring(node)
        if doc and len(doc) >= 80:
            out.append((module, module if isinstance(node, ast.Module) else f"{module}.{node.name}", doc[:1200]))
    return out


@functools.lru_cache(maxsize=2)
def _split_docstrings(split: str) -> tuple[tuple[str, str, str], ...]:
    return tuple(d for p in data.stdlib_split(split) for d in _docstrings(p))


def _word_problem(rng: random.Random) -> str:
    a, b = rng.randrange(3, 60), rng.randrange(2, 12)
    c = rng.randrange(1, a * (b + 1))
    who = rng.choice(("A baker", "A library", "A farmer", "A school", "A shop"))
    thing = rng.choice(("boxes", "books", "apples", "chairs", "tickets"))
    return (
        f"{who} has {a} {thing} and buys {b} times as many. Then {c} of them are given away. "
        f"How many {thing} are left? Explain step by step."
    )


def instructions(split: str, n: int, seed: int = 0) -> list[dict]:
    """`n` instructions ({"id", "kind", "module", "prompt"}) from the docstrings of the stdlib files of `split`
    ("train" or "heldout"), kinds in turn; deterministic for a seed."""
    rng = random.Random(f"{split}:{seed}")
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    docs = list(_split_docstrings(split))
    if not docs:
        raise ValueError(f"no docstrings found in the stdlib's {split} files")
    rng.shuffle(docs)
    out = []
    for i in range(n):
        kind, template = _KINDS[i % len(_KINDS)]
        module, qual, doc = docs[i % len(docs)]
        first = doc.split("\n\n")[0].replace("\n", " ")
        prompt = template.format(
            doc=doc,
            first=first,
            lang=rng.choice(_LANGS),
            name=qual.split(".")[-1],
            qual=qual,
            module=module,
            math=_word_problem(rng),
        )
        out.append({"id": f"{split}/{i}:{kind}:{qual}", "kind": kind, "module": module, "prompt": prompt})
    return out


def check_disjoint(rows: list[dict], questions: list[dict]) -> None:
    """Refuse instructions whose text equals a Spec-Bench turn (the benchmark must stay unseen)."""
    turns = {t.strip() for q in questions for t in q.get("turns", [])}
    clash = [r["id"] for r in rows if r["prompt"].strip() in turns]
    if clash:
        raise ValueError(f"{len(clash)} instructions are Spec-Bench turns, e.g. {clash[:3]}")


def answers_path(target: str, split: str) -> Path:
    return STATE / f"{target}-answers" / f"{split}.jsonl"


def answer(
    target: str, split: str, n: int, max_new_tokens: int = 192, batch: int = 8, seed: int = 0, log=print
) -> Path:
    """The target's greedy answers to `instructions(split, n)`, appended batch by batch to
    `answers_path(target, split)` (a rerun answers only what is missing). Each row: id, kind and the
    conversation's token ids (chat template, prompt and answer, ending at EOS or the token limit)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from speclib.lms import pretrained
    from speclib.research import spec_bench

    rows = instructions(split, n, seed)
    check_disjoint(rows, spec_bench.questions())
    path = answers_path(target, split)
    path.parent.mkdir(parents=True, exist_ok=True)
    done = {json.loads(line)["id"] for line in path.read_text().splitlines()} if path.exists() else set()
    todo = [r for r in rows if r["id"] not in done]
    if not todo:
        return path
    folder = pretrained.materialize(target)
    tok = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    with path.open("a") as f:
        for i in range(0, len(todo), batch):
            chunk = todo[i : i + batch]
            prompts = [
                tok.apply_chat_template(
                    [{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, tokenize=False
                )
                for r in chunk
            ]
            enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
            width = enc["input_ids"].shape[1]
            for r, ids, mask in zip(chunk, out, enc["attention_mask"]):
                prompt_ids = [int(t) for t, m in zip(ids[:width], mask) if m]
                new = [int(t) for t in ids[width:]]
                if tok.eos_token_id in new:
                    new = new[: new.index(tok.eos_token_id) + 1]
                f.write(
                    json.dumps({"id": r["id"], "kind": r["kind"], "ids": prompt_ids + new, "answer_tokens": len(new)})
                    + "\n"
                )
            f.flush()
            log(f"{split}: {min(i + batch, len(todo))}/{len(todo)} answered")
    return path


def stream(target: str, split: str, n: int | None = None) -> np.ndarray:
    """The cached conversations of a split joined into one token stream (int32), each ending at EOS; with
    n, those of `instructions(split, n)` only (a ValueError when some are not answered yet)."""
    path = answers_path(target, split)
    if not path.exists():
        raise FileNotFoundError(f"no answers at {path}: python -m speclib chat_data {target}")
    rows = {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}
    if n is not None:
        wanted = [r["id"] for r in instructions(split, n)]
        missing = [i for i in wanted if i not in rows]
        if missing:
            raise ValueError(
                f"{len(missing)} of the first {n} {split} instructions have no answer in {path}: "
                f"python -m speclib chat_data {target} --n {n}"
            )
        rows = {i: rows[i] for i in wanted}
    ids = [t for r in rows.values() for t in r["ids"]]
    return np.asarray(ids, dtype=np.int32)


def prompt_stream(target: str, split: str, n: int = 4000, seed: int = 0) -> np.ndarray:
    """`instructions(split, n)` through the target's chat template, without answers, joined into one token
    stream (int32): text in the chat format that costs no generation. A draft distilled from the target's
    distribution learns from any text; the answers (`stream`) are the part that looks like its output."""
    from transformers import AutoTokenizer

    from speclib.lms import pretrained

    tok = AutoTokenizer.from_pretrained(pretrained.materialize(target))
    ids = []
    for r in instructions(split, n, seed):
        ids += tok.apply_chat_template(
            [{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, tokenize=True, return_dict=False
        ) + [tok.eos_token_id]
    return np.asarray(ids, dtype=np.int32)


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m speclib chat_data", description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("--n", type=int, default=400, help="training instructions (held-out: a tenth as many)")
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--batch", type=int, default=8)
    a = ap.parse_args(argv)
    for split, n in (("heldout", max(8, int(a.n * HELDOUT_FRACTION))), ("train", a.n)):
        answer(a.target, split, n, a.max_new_tokens, a.batch)


if __name__ == "__main__":
    main(sys.argv[1:])
