"""One figure style and reproducible figure files (DESIGN.md section 7).

`style()` sets the look every notebook uses; `savefig(fig, "01_baseline_speed")` writes
`figures/01_baseline_speed.png` and `.pdf` with the metadata that changes from run to run
(software version, creation date) stripped, so a re-run with the same numbers gives byte-identical
files and `git diff` shows only figures whose content changed.

On import, the non-interactive Agg backend is selected only when no backend has been chosen yet
(plain scripts, papermill without a kernel setting); Jupyter's inline backend is left alone.
`FIGURES` is the default output folder; tests pass `root=` to write elsewhere.
"""
from __future__ import annotations

import re
import os
from pathlib import Path

import matplotlib


def _backend_chosen() -> bool:
    try:
        return matplotlib.get_backend(auto_select=False) is not None   # matplotlib >= 3.10
    except TypeError:
        return matplotlib.rcParams._get_backend_or_none() is not None  # older matplotlib


if not _backend_chosen():
    matplotlib.use("Agg")

import seaborn as sns  # noqa: E402  (after the backend choice)

REPO = Path(__file__).resolve().parent.parent
FIGURES = (Path(os.environ["SPECLIB_OUT"]) / "figures") if os.environ.get("SPECLIB_OUT") else REPO / "figures"
DPI = 150
_NAME = re.compile(r"[A-Za-z0-9_\-]+")
_METADATA = {
    "png": {"Software": None},
    "pdf": {"Creator": None, "Producer": None, "CreationDate": None},
}

__all__ = ["FIGURES", "style", "savefig"]


def style() -> None:
    """Set the workbook's one style: seaborn whitegrid, notebook context, colorblind palette,
    120 dpi on screen."""
    sns.set_theme(style="whitegrid", context="notebook", palette="colorblind",
                  rc={"figure.dpi": 120})


def savefig(fig, name: str, root: str | Path | None = None) -> list[Path]:
    """Write `fig` (a matplotlib Figure, or anything with its `savefig`, e.g. a seaborn grid) to
    `<root>/<name>.png` and `.pdf` (default root `FIGURES`) at 150 dpi with a tight bounding box
    and reproducible metadata. `name` is a bare file name such as "01_baseline_speed": letters,
    digits, '_' and '-', no folder and no extension. Returns the two paths."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"name must be a bare figure name like '01_baseline_speed' (letters, "
                         f"digits, '_', '-'; no '/' and no extension), got {name!r}")
    if not callable(getattr(fig, "savefig", None)):
        raise TypeError(f"fig must be a matplotlib Figure (or have .savefig), got {type(fig).__name__}")
    out_dir = Path(root) if root is not None else FIGURES
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext, metadata in _METADATA.items():
        p = out_dir / f"{name}.{ext}"
        fig.savefig(p, format=ext, dpi=DPI, bbox_inches="tight", metadata=metadata)
        paths.append(p)
    return paths
