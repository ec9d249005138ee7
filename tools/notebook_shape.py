"""The shape of each notebook source: lines of code and of markdown, their ratio, the median and largest
code cell, cells over 40 lines, and functions defined (notebooks should read as prose with figures). The
first code cell is papermill's parameters cell (tools/nbbuild.py tags it): one line per parameter, so its
size is reported apart and left out of the largest cell and the cells over 40.

    python tools/notebook_shape.py            # one row per notebooks/src/NN_*.py
"""

import re
import statistics
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "notebooks" / "src"


def cells(path: Path) -> list[tuple[str, list[str]]]:
    """(kind, lines) per `# %%` cell; kind "markdown" for `# %% [markdown]`, else "code"."""
    out: list[tuple[str, list[str]]] = []
    for line in path.read_text().splitlines():
        if line.startswith("# %%"):
            out.append(("markdown" if "[markdown]" in line else "code", []))
        elif out:
            out[-1][1].append(line)
    return out


def shape(path: Path) -> dict:
    cs = cells(path)
    code = [[ln for ln in c if ln.strip()] for k, c in cs if k == "code"]
    md = sum(1 for k, c in cs if k == "markdown" for ln in c if ln.strip())
    sizes = [len(c) for c in code]
    params, rest = (sizes[0], sizes[1:]) if sizes else (0, [])
    return dict(
        notebook=path.stem,
        code_lines=sum(sizes),
        markdown_lines=md,
        ratio=sum(sizes) / max(md, 1),
        median_cell=statistics.median(sizes) if sizes else 0,
        parameters_cell=params,
        largest_cell=max(rest, default=0),
        cells_over_40=sum(n > 40 for n in rest),
        defs=sum(len(re.findall(r"^\s*def ", "\n".join(c), flags=re.M)) for c in code),
    )


if __name__ == "__main__":
    rows = [shape(p) for p in sorted(SRC.glob("[0-9][0-9]_*.py"))]
    cols = list(rows[0])
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols))
    sys.exit(0)
