"""Where a saved result came from, and whether the code and models behind it have changed since.

A step's manifest (`speclib.workbook.study`) records:

- `code`: the commit the kernel loaded (read when the first `Study` of the process starts, i.e. when
  the notebook had just imported speclib, not when the table is saved) and whether the tracked files
  differed from it then, ignoring the run's own outputs (`OUTPUTS`: results, figures, the README
  block);
- `modules`: a fingerprint (sha1 of the file as first seen by this process) of every speclib module
  the kernel had imported by the end of the step;
- `definitions`: the fingerprint of every definition the step's statement in the notebook source reaches
  (`speclib.workbook.reach`), which `check` compares in place of `modules` where it was recorded: a
  change to code the step never uses, or a move or rename of a module, leaves the step current;
- `checkpoints`: the sha256 of the weight and config files of every shipped checkpoint the step's
  parameters name or the process loaded;
- `calibration`: the target's one-token pass time before and after the step (`Calibration`), so runs
  on a faster or slower host, or a host that slowed down during the step, can be told apart.

`check(manifest)` compares a manifest with the checkout as it is now and returns the reasons it is
stale (module or checkpoint changed), or says why it cannot tell (a manifest written before these
fields existed: then the speclib files changed in git since its commit are listed instead).

    python -m speclib study stale       # every committed step that is stale or of unknown provenance
"""

from __future__ import annotations

import hashlib
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from speclib.core.device import REPO
from speclib.workbook import reach

# a run's own writes: a dirty flag that counted them would say "dirty" for every published run
OUTPUTS = ("data/results", "data/sweeps", "figures", "README.md", "build")
CODE_DIRS = ("speclib", "kernels")
GIT_TIMEOUT_S = 10

_file_hashes: dict[str, str] = {}  # path relative to the repo -> sha1 of the bytes first seen
_loaded_code: dict | None = None  # the commit and dirty flag when the first Study started
_weights_cache: dict[tuple, str] = {}  # (path, size, mtime_ns) -> sha256


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO, check=True, capture_output=True, text=True, timeout=GIT_TIMEOUT_S
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def code_state() -> dict:
    """{"git_sha", "dirty", "dirty_files"}: HEAD and the tracked files that differ from it, outputs
    (`OUTPUTS`) excluded. Unknown values are None (no git)."""
    sha = _git("rev-parse", "--short", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", *(f":(exclude){p}" for p in OUTPUTS))
    files = None if status is None else sorted(line[3:] for line in status.splitlines() if line.strip())
    return dict(
        git_sha=(sha or "").strip() or "unknown", dirty=None if files is None else bool(files), dirty_files=files
    )


def loaded_code() -> dict:
    """`code_state()` as it was when this process first asked (the first Study of a notebook kernel,
    created right after its imports): the code the kernel runs, whatever is committed later."""
    global _loaded_code
    if _loaded_code is None:
        _loaded_code = code_state()
    return _loaded_code


def run_sha() -> str:
    """The commit a result of this process belongs to: the one the kernel loaded when a Study has
    started (`loaded_code`), else HEAD now."""
    return (_loaded_code or code_state())["git_sha"]


def _sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()[:12]


def module_fingerprints() -> dict[str, str]:
    """{repo-relative file: sha1} of every speclib module imported in this process, each file hashed
    the first time it is seen here (so a file edited after the kernel imported it keeps the hash of
    what the kernel ran)."""
    out = {}
    for name, mod in list(sys.modules.items()):
        if not (name == "speclib" or name.startswith("speclib.")):
            continue
        f = getattr(mod, "__file__", None)
        if not f or not Path(f).resolve().is_relative_to(REPO):
            continue
        rel = Path(f).resolve().relative_to(REPO).as_posix()
        if rel not in _file_hashes:
            _file_hashes[rel] = _sha1(REPO / rel)
        out[rel] = _file_hashes[rel]
    return dict(sorted(out.items()))


def checkpoint_hash(folder: Path) -> str:
    """sha256 (16 hex digits) over a checkpoint folder's files other than its markdown card."""
    h = hashlib.sha256()
    for p in sorted(q for q in Path(folder).rglob("*") if q.is_file() and q.suffix != ".md"):
        st = p.stat()
        key = (str(p), st.st_size, st.st_mtime_ns)
        if key not in _weights_cache:
            _weights_cache[key] = hashlib.sha256(p.read_bytes()).hexdigest()
        h.update(p.relative_to(folder).as_posix().encode() + _weights_cache[key].encode())
    return h.hexdigest()[:16]


def named_checkpoints(params: dict) -> list[str]:
    """Shipped checkpoint and pretrained model names among the values of `params` (strings, or lists of strings), plus the
    checkpoints this process loaded by name (`speclib.lms.loading.OPENED`)."""
    from speclib.lms.lm import checkpoints
    from speclib.lms.loading import OPENED
    from speclib.lms.pretrained import MODELS

    shipped = set(checkpoints()) | set(MODELS)
    found = set(OPENED)
    for v in params.values():
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, str) and x in shipped:
                found.add(x)
    return sorted(found)


def weights_hash(name: str) -> str | None:
    """A shipped checkpoint's folder hash, or a pretrained model's GGUF sha256 (16 hex digits, from the
    card of its dequantized cache); None when neither exists here."""
    from speclib.lms import pretrained
    from speclib.lms.lm import CHECKPOINTS

    if (CHECKPOINTS / name).is_dir():
        return checkpoint_hash(CHECKPOINTS / name)
    if name in pretrained.MODELS:
        return pretrained.card(name).get(pretrained.CARD_KEY, "")[:16] or None
    return None


def checkpoint_hashes(names: list[str]) -> dict[str, str]:
    return {n: h for n in names if (h := weights_hash(n)) is not None}


@dataclass
class Calibration:
    """The target's one-token pass time (median of `repeats` passes over a `prefix_len` cache),
    measured before and after each computed step. Costs about `repeats` target passes each time."""

    lm: object
    prefix_len: int = 128
    repeats: int = 15

    def __call__(self) -> float:
        from speclib.research.bench import latency_samples

        return statistics.median(latency_samples([(self.lm, 1)], self.prefix_len, self.repeats, warmup=3)[0]) * 1e3


def changed_since(sha: str) -> list[str] | None:
    """speclib and kernel files that differ between commit `sha` and the working tree (None when git
    cannot tell, e.g. the commit is not in this clone)."""
    out = _git("diff", "--name-only", sha, "--", *CODE_DIRS)
    return None if out is None else sorted(out.split())


def notebook_source(notebook: str) -> Path:
    """The source a notebook is built from (`notebooks/src/NN_slug.py`)."""
    return REPO / "notebooks" / "src" / f"{notebook}.py"


def check(man: dict, index=None) -> dict:
    """{"status": "current" | "stale" | "unknown", "reasons": [...]} for one step manifest against
    the checkout as it is now: by the definitions the step reaches where the manifest records them
    (`index`: a `reach.Index` shared across calls), else by the files of the modules it had loaded.
    A manifest without fingerprints (written before they were recorded, or adopted) is "unknown";
    its reasons list the code files changed in git since its commit."""
    reasons = []
    mods, ckpts = man.get("modules"), man.get("checkpoints")
    if man.get("definitions"):
        mods = {}  # the definitions decide; the loaded files' hashes are kept for the record only
        reasons += reach.changed(man["definitions"], notebook_source(man["notebook"]), index)
    if mods is None:
        shas = [s for s in str(man.get("git_sha", "")).split(",") if s and s != "unknown"]
        why = (
            "adopted (tables saved before results modes existed)"
            if man.get("adopted")
            else "recorded before code fingerprints existed"
        )
        changed = sorted({f for s in shas for f in (changed_since(s) or [])})
        reasons.append(
            f"{why}; commit {', '.join(shas) or 'unknown'}"
            + (
                f"; {len(changed)} code files changed since ({', '.join(changed[:4])}"
                + (", ..." if len(changed) > 4 else "")
                + ")"
                if changed
                else "; no code change since in git"
            )
        )
        return dict(status="unknown", reasons=reasons)
    for rel, h in mods.items():
        p = REPO / rel
        if not p.is_file():
            reasons.append(f"{rel} removed")
        elif _sha1(p) != h:
            reasons.append(f"{rel} changed")
    for name, h in (ckpts or {}).items():
        now = weights_hash(name)
        if now is None:
            reasons.append(f"checkpoint {name} removed")
        elif now != h:
            reasons.append(f"checkpoint {name} changed")
    return dict(status="stale" if reasons else "current", reasons=reasons)
