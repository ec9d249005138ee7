"""Workloads where the output reuses the context (notebook 02), built from the standard library.

Every example is {"id", "workload", "split", "prompt", "reference"}: the prompt a model continues
and the exact continuation a correct agent would emit (used to fine-tune the shipped models on the
TRAIN split's files; the held-out files' examples are frozen to data/workloads/ for evaluation).

    agentic_edit     a code-editing agent: a read_file tool call returns a function; the task is
                     to rename an identifier and emit the whole patched function
    agentic_tools    JSON tool calls whose arguments quote the previous tool output (a listing of
                     the functions of a module), one call per matching function
    agentic_plan     a multi-turn plan re-emitted with its step statuses updated
    structured       JSON records of a module's functions rewritten as CSV or YAML

The split is stdlib's split by file (speclib.research.data.stdlib_split), so no held-out file was seen in training.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
from pathlib import Path

from speclib.research import data

WORKLOADS = ("agentic_edit", "agentic_tools", "agentic_plan", "structured")
END = "\n### End\n"
MAX_CHARS = 2400  # prompt + reference; about 800 tokens, inside the shipped models' 1024 context


def _functions(path: Path) -> list[dict]:
    """Top-level and method definitions: name, first line, last line, argument names."""
    try:
        tree = ast.parse(data.read_text(path))
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
            args = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
            out.append(dict(name=node.name, line=node.lineno, end=node.end_lineno, args=args))
    return sorted(out, key=lambda f: f["line"])


def _rel(path: Path) -> str:
    parts = path.parts
    return "/".join(parts[parts.index("lib") + 2 :]) if "lib" in parts else path.name


def agentic_edit(path: Path, rng: random.Random) -> dict | None:
    lines = data.read_text(path).splitlines()
    fns = [f for f in _functions(path) if 8 <= f["end"] - f["line"] + 1 <= 30]
    rng.shuffle(fns)
    for f in fns:
        body = "\n".join(lines[f["line"] - 1 : f["end"]])
        names = [a for a in f["args"] if a not in ("self", "cls") and len(a) > 1]
        names = [n for n in names if len(re.findall(rf"\b{re.escape(n)}\b", body)) >= 2]
        if not names:
            continue
        old = rng.choice(names)
        new = rng.choice(["value", "item", "arg", "obj", "data", "node", "entry"]) + f"_{rng.randrange(10)}"
        prompt = (
            f"### Task\nRename the parameter `{old}` of `{f['name']}` to `{new}` and return the whole "
            f"patched function.\n### Tool call\n"
            + json.dumps({"tool": "read_file", "args": {"path": _rel(path), "start": f["line"], "end": f["end"]}})
            + f"\n### Tool output\n{body}\n### Answer\n"
        )
        return dict(prompt=prompt, reference=re.sub(rf"\b{re.escape(old)}\b", new, body) + END)
    return None


def _listing(path: Path, rng: random.Random, n: int = 12) -> list[dict] | None:
    fns = _functions(path)
    if len(fns) < 4:
        return None
    start = rng.randrange(0, max(1, len(fns) - n))
    return [dict(name=f["name"], line=f["line"], args=f["args"]) for f in fns[start : start + n]]


def agentic_tools(path: Path, rng: random.Random) -> dict | None:
    listing = _listing(path, rng)
    if listing is None:
        return None
    k = rng.choice([1, 2])
    chosen = [f for f in listing if len([a for a in f["args"] if a != "self"]) >= k]
    if not chosen:
        return None
    prompt = (
        f"### Task\nCall `describe` on every function below that takes at least {k} argument(s) besides "
        f"self, one JSON call per line, quoting its name, line and arguments.\n### Tool call\n"
        + json.dumps({"tool": "list_functions", "args": {"path": _rel(path)}})
        + "\n### Tool output\n"
        + "\n".join(json.dumps(f) for f in listing)
        + "\n### Answer\n"
    )
    calls = [
        json.dumps({"tool": "describe", "args": {"name": f["name"], "line": f["line"], "args": f["args"]}})
        for f in chosen
    ]
    return dict(prompt=prompt, reference="\n".join(calls) + END)


def agentic_plan(path: Path, rng: random.Random) -> dict | None:
    listing = _listing(path, rng, n=8)
    if listing is None:
        return None
    steps = [f"review `{f['name']}` (line {f['line']})" for f in listing]
    done = rng.randrange(1, len(steps))

    def plan(n_done):
        return "\n".join(f"{i + 1}. [{'x' if i < n_done else ' '}] {s}" for i, s in enumerate(steps))

    prompt = (
        f"### Task\nAudit {_rel(path)}. Keep the plan up to date.\n### Plan\n{plan(done - 1)}\n"
        f"### Tool output\nstep {done} finished: `{listing[done - 1]['name']}` looks fine.\n### Updated plan\n"
    )
    return dict(prompt=prompt, reference=plan(done) + END)


def structured(path: Path, rng: random.Random) -> dict | None:
    listing = _listing(path, rng, n=10)
    if listing is None:
        return None
    fmt = rng.choice(["csv", "yaml"])
    prompt = (
        f"### Task\nRewrite these records as {fmt.upper()} with fields name, line, n_args.\n### Records\n"
        + json.dumps(listing, indent=1)
        + "\n### Answer\n"
    )
    if fmt == "csv":
        out = "name,line,n_args\n" + "\n".join(f"{f['name']},{f['line']},{len(f['args'])}" for f in listing)
    else:
        out = "\n".join(f"- name: {f['name']}\n  line: {f['line']}\n  n_args: {len(f['args'])}" for f in listing)
    return dict(prompt=prompt, reference=out + END)


MAKERS = {
    "agentic_edit": agentic_edit,
    "agentic_tools": agentic_tools,
    "agentic_plan": agentic_plan,
    "structured": structured,
}


def examples(workload: str, split: str, n: int | None = None, seed: int = 0) -> list[dict]:
    """Up to n examples of a workload from the split's files (one per file, files in seeded order)."""
    if workload not in MAKERS:
        raise ValueError(f"unknown workload {workload!r}; known: {sorted(MAKERS)}")
    rng = random.Random(f"{workload}/{split}/{seed}")
    files = data.stdlib_split(split)
    out = []
    for path in rng.sample(files, len(files)):
        ex = MAKERS[workload](path, rng)
        if ex is not None and len(ex["prompt"]) + len(ex["reference"]) <= MAX_CHARS:
            out.append(dict(id=f"{workload}/{path.stem}", workload=workload, split=split, **ex))
            if n is not None and len(out) == n:
                break
    return out


def build(n_heldout: int = 40) -> dict[str, Path]:
    """Freeze held-out examples of every workload to data/workloads/<workload>.jsonl."""
    data.WORKLOADS.mkdir(parents=True, exist_ok=True)
    paths = {}
    for w in WORKLOADS:
        rows = examples(w, "heldout", n_heldout)
        paths[w] = data.WORKLOADS / f"{w}.jsonl"
        paths[w].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def main(argv=None) -> None:
    argparse.ArgumentParser(
        prog="python -m speclib workloads",
        description="freeze the held-out agentic workload examples to data/workloads/",
    ).parse_args(argv)
    for name, p in build().items():
        print(name, p, sum(1 for _ in p.open()))


if __name__ == "__main__":
    main()
