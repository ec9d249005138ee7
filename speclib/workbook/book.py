"""Build the workbook as a static HTML book.

    python -m speclib book                  # execute every notebook (results mode "auto"), then build
    python -m speclib book --no-execute     # build from the notebooks executed last time

Each notebook runs through papermill with `RESULTS="auto"`: every expensive step is read from the
committed `data/results/` when its parameters match, so the whole book takes minutes, not hours.
The runs write their results and figures under `build/book/out/` (never over the committed ones).
Sphinx with MyST-NB then renders `book/index.md`, the maths pages of `docs/` and the executed
notebooks (nothing is executed again) into `build/book/html/`, with MathJax served from the book
itself: `build/book/html/index.html` opens from any static file server with no network.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

from speclib.core.device import REPO

BOOK = REPO / "book"
OUT = REPO / "build" / "book"

__all__ = ["notebooks", "execute", "build"]


def notebooks() -> list[Path]:
    """The workbook's notebooks, in file order."""
    return sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def execute(out: Path = OUT, names: list[Path] | None = None, parameters: dict | None = None) -> dict[str, float]:
    """Run each notebook with `parameters` (default: results mode "auto") into `out/executed/`, its
    results and figures under `out/out/`. Returns the seconds each took."""
    from speclib.workbook.notebooks import run

    parameters = {"RESULTS": "auto", **(parameters or {})}
    seconds = {}
    previous = os.environ.get("SPECLIB_OUT")
    os.environ["SPECLIB_OUT"] = str(out / "out")  # the kernels inherit it
    try:
        for nb in names or notebooks():
            t0 = time.perf_counter()
            run(nb, out / "executed" / nb.name, parameters)
            seconds[nb.stem] = time.perf_counter() - t0
            print(f"executed {nb.name} in {seconds[nb.stem]:.0f} s", flush=True)
    finally:
        if previous is None:
            os.environ.pop("SPECLIB_OUT", None)
        else:
            os.environ["SPECLIB_OUT"] = previous
    return seconds


def build(out: Path = OUT, executed: Path | None = None) -> Path:
    """Stage book/, docs/ and the executed notebooks (default `out/executed/`) in `out/src/` and
    render them to `out/html/`. Returns the path of the index page."""
    from sphinx.cmd.build import build_main

    executed = Path(executed or out / "executed")
    found = sorted(executed.glob("[0-9][0-9]_*.ipynb"))
    if not found:
        raise FileNotFoundError(f"no executed notebooks in {executed}: run `python -m speclib book` (it executes them)")
    src, html = out / "src", out / "html"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(BOOK, src, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "docs", src / "docs")
    (src / "figures").mkdir()
    for fig in (REPO / "figures").glob("*.png"):  # docs/ pages embed ../figures/*.png
        shutil.copy(fig, src / "figures" / fig.name)
    (src / "notebooks").mkdir()
    for nb in found:
        shutil.copy(nb, src / "notebooks" / nb.name)
    shutil.rmtree(html, ignore_errors=True)
    rc = build_main(["-b", "html", "-q", "-j", "1", str(src), str(html)])
    if rc:
        raise RuntimeError(f"sphinx-build failed (exit {rc}); the staged sources are in {src}")
    return html / "index.html"


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m speclib book", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--no-execute", action="store_true", help="build from the notebooks executed last time")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    if not a.no_execute:
        execute(a.out)
    index = build(a.out)
    print(
        f"book built in {time.perf_counter() - t0:.0f} s: {index} (serve it with "
        f"`python -m http.server -d {index.parent}` and open http://localhost:8000)"
    )


if __name__ == "__main__":
    main()
