"""One figure style and reproducible figure files.

`style()` sets the look every notebook uses; `savefig(fig, "01_baseline_speed")` writes
`figures/01_baseline_speed.png` and `.pdf` with the metadata that changes from run to run
(software version, creation date) stripped, so a re-run with the same numbers gives byte-identical
files and `git diff` shows only figures whose content changed.

Importing this module changes nothing: matplotlib's backend is left to matplotlib (Jupyter's inline
backend in notebooks, Agg on its own when there is no display), and the default output folder,
`root()`, is read when `savefig` is called: `$SPECLIB_OUT/figures` when SPECLIB_OUT is set (smoke
runs, tests), else `figures/`; tests pass `root=` to write elsewhere.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import seaborn as sns

from speclib.core.device import REPO

DPI = 150  # PNG resolution: sharp in print and on high-density screens
_NAME = re.compile(r"[A-Za-z0-9_\-]+")
_METADATA = {
    "png": {"Software": None},
    "pdf": {"Creator": None, "Producer": None, "CreationDate": None},
}

__all__ = ["root", "style", "savefig"]


def root() -> Path:
    """The default figures folder, read now: $SPECLIB_OUT/figures when SPECLIB_OUT is set, else
    figures/ in the repository."""
    out = os.environ.get("SPECLIB_OUT")
    return Path(out) / "figures" if out else REPO / "figures"


def _dir(given: str | Path | None) -> Path:
    """The folder `savefig` was given, else the default `root()`."""
    return Path(given) if given is not None else root()


def style() -> None:
    """Set the workbook's one style: seaborn whitegrid, notebook context, colorblind palette,
    120 dpi on screen."""
    sns.set_theme(style="whitegrid", context="notebook", palette="colorblind", rc={"figure.dpi": 120})


def savefig(fig, name: str, root: str | Path | None = None) -> list[Path]:
    """Write `fig` (a matplotlib Figure, or anything with its `savefig`, e.g. a seaborn grid) to
    `<root>/<name>.png` and `.pdf` (default root `root()`) at 150 dpi with a tight bounding box
    and reproducible metadata. `name` is a bare file name such as "01_baseline_speed": letters,
    digits, '_' and '-', no folder and no extension. Returns the two paths."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"name must be a bare figure name like '01_baseline_speed' (letters, "
            f"digits, '_', '-'; no '/' and no extension), got {name!r}"
        )
    if not callable(getattr(fig, "savefig", None)):
        raise TypeError(f"fig must be a matplotlib Figure (or have .savefig), got {type(fig).__name__}")
    out_dir = _dir(root)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext, metadata in _METADATA.items():
        p = out_dir / f"{name}.{ext}"
        fig.savefig(p, format=ext, dpi=DPI, bbox_inches="tight", metadata=metadata)
        paths.append(p)
    return paths
