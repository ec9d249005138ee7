"""Tidy experiment results as parquet files under `data/results/`.

A notebook calls `save(df, "01_baseline/speed")`, which writes
`data/results/01_baseline/speed.parquet`, and `load("01_baseline/speed")` reads it back. Writes are
atomic (temp file in the same folder, then `os.replace`), so a crashed run never leaves a
half-written file. Each row gets the `git_sha` of the code that produced it (the commit a notebook's kernel loaded:
`speclib.workbook.provenance.run_sha`); no timestamp is
added, so a re-run with the same numbers gives the same file.

The default root, `root()`, is read when a function is called (nothing happens on import):
`$SPECLIB_OUT/results` when SPECLIB_OUT is set (smoke runs, tests), else `data/results/`; tests
pass `root=` to write elsewhere.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from speclib.core.device import REPO

SUFFIX = ".parquet"
_NAME = re.compile(r"[A-Za-z0-9_\-]+(/[A-Za-z0-9_\-]+)*")
GIT_TIMEOUT_S = 10  # `git rev-parse` answers in milliseconds; a hung git must not hang a notebook

__all__ = ["root", "git_sha", "available", "path", "save", "load", "MissingResult"]


class MissingResult(ValueError):
    """`load` found no saved result under that name (the notebook that makes it has not run here)."""


def root() -> Path:
    """The default results folder, read now: $SPECLIB_OUT/results when SPECLIB_OUT is set, else
    data/results/ in the repository."""
    out = os.environ.get("SPECLIB_OUT")
    return Path(out) / "results" if out else REPO / "data" / "results"


def _dir(given: str | Path | None) -> Path:
    """The folder a function was given, else the default `root()`."""
    return Path(given) if given is not None else root()


def git_sha() -> str:
    """Short commit hash of the repository's HEAD, or "unknown" (no git, no commit yet, ...)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def available(root: str | Path | None = None) -> list[str]:
    """Names of the saved results under `root` (default `root()`), sorted."""
    folder = _dir(root)
    if not folder.is_dir():
        return []
    return sorted(p.relative_to(folder).with_suffix("").as_posix() for p in folder.rglob("*" + SUFFIX))


def path(name: str, root: str | Path | None = None) -> Path:
    """The parquet path of result `name` ("NN_slug/name": letters, digits, _ and -, folders
    separated by /, no extension)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"name must look like 'NN_slug/name' (letters, digits, '_', '-', "
            f"folders separated by '/', no extension), got {name!r}"
        )
    return _dir(root) / (name + SUFFIX)


def save(df: pd.DataFrame, name: str, root: str | Path | None = None, metadata: dict[str, str] | None = None) -> Path:
    """Write `df` with a `git_sha` column added (overwriting any existing one) to
    `<root>/<name>.parquet`, atomically; `metadata` goes into the file's parquet key-value metadata
    (`speclib.workbook.study` tags each table with the step that produced it). Returns the path written."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame, got {type(df).__name__}")
    out = path(name, root)
    from speclib.workbook.provenance import run_sha

    df = df.assign(git_sha=run_sha())
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.stem}.", suffix=".tmp")
    os.close(fd)
    try:
        table = pa.Table.from_pandas(df)
        if metadata:
            table = table.replace_schema_metadata(
                {**(table.schema.metadata or {}), **{k.encode(): v.encode() for k, v in metadata.items()}}
            )
        pq.write_table(table, tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are ordinary readable files
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def load(name: str, root: str | Path | None = None) -> pd.DataFrame:
    """Read result `name`; a ValueError lists the available names when it does not exist."""
    p = path(name, root)
    if not p.is_file():
        names = available(root)
        raise MissingResult(f"name: no result {name!r} at {p}; available: {', '.join(names) if names else '(none)'}")
    return pd.read_parquet(p)
