"""Build a notebook from a plain-text source: cells separated by lines '# %% [markdown]' / '# %%'.

    python tools/nbbuild.py notebooks/src/01_baseline.py notebooks/01_baseline.ipynb
    python tools/nbbuild.py --source notebooks/01_baseline.ipynb notebooks/src/01_baseline.py   (the reverse)

The first code cell is tagged `parameters` for papermill. Outputs are never written.
"""

import sys

import nbformat


def build(src: str, dst: str) -> None:
    cells, kind, buf = [], None, []

    def flush():
        text = "\n".join(buf).strip("\n")
        if kind is None or not text:
            return
        if kind == "md":
            text = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in text.splitlines())
            cells.append(nbformat.v4.new_markdown_cell(text))
        else:
            cell = nbformat.v4.new_code_cell(text)
            if not any(c.cell_type == "code" for c in cells):
                cell.metadata["tags"] = ["parameters"]
            cells.append(cell)

    for line in open(src).read().splitlines():
        if line.startswith("# %%"):
            flush()
            kind, buf = ("md" if "[markdown]" in line else "code"), []
        else:
            buf.append(line)
    flush()
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "speclib", "display_name": "speclib", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, c in enumerate(nb.cells):
        c["id"] = f"cell-{i:02d}"
    nbformat.write(nb, dst)


def source(src: str, dst: str) -> None:
    """Write a notebook's cells back as the plain-text source `build` reads."""
    parts = []
    for c in nbformat.read(src, 4).cells:
        if c.cell_type == "markdown":
            parts.append("# %% [markdown]\n" + "\n".join(("# " + l).rstrip() for l in c.source.splitlines()))
        else:
            parts.append("# %%\n" + c.source)
    open(dst, "w").write("\n\n".join(parts) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "--source":
        source(sys.argv[2], sys.argv[3])
    else:
        build(sys.argv[1], sys.argv[2])
