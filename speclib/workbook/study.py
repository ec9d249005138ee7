"""Results modes: a notebook's expensive steps are computed once, saved with the parameters that
produced them, and reused when those parameters come round again.

    study = Study("01_baseline", globals(), mode=RESULTS, publish=PUBLISH)
    tables = study.step("speed_runs", lambda: {"runs": run_everything()}, uses=["K_MAX", "N_PROMPTS"])
    runs = tables["runs"]                    # the same frame whether computed now or read back

A **step** is a function that returns a DataFrame or a dict of them (its **tables**), and the names
of the notebook parameters it depends on (`uses`, default: all of them; a step's name in `uses`
stands for that step's parameters, for a step that reads another's tables). The step writes its
tables as `NN_slug/<table>.parquet` (`speclib.workbook.results`) and a manifest `NN_slug/<step>.step.json`
with the values of the parameters it used, the complete parameter set of the run, the code
version (git commit, and whether the tree had uncommitted changes) and how long it took. Each
table carries the manifest's run id in its parquet metadata, so a table overwritten by another run
is never mistaken for this step's.

Modes:
- "recompute": always compute, then save.
- "reuse": read the saved tables; when there are none, or they were produced with other values of
  the step's parameters, raise an error naming the step and the parameters that differ.
- "auto" (default): reuse when the saved step's parameters equal this run's, else compute. A run
  with other parameters therefore never shows stale numbers, and a run that changes one parameter
  recomputes only the steps that use it.

Where results go: a run whose parameters all equal the notebook's committed defaults (its
"parameters" cell) **publishes**: it writes `data/results/` and `figures/`. Any other run (SMOKE,
a smaller N, ...) writes under `build/unpublished/<notebook>/<hash of its parameters>/` unless it
is asked to publish (`publish=True`), so a smoke run never overwrites the committed results, figures
or README table. `$SPECLIB_OUT`, when set, wins over both. "auto" and "reuse" look for saved steps
first where this run writes, then in the committed `data/results/`.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from speclib.core.device import REPO
from speclib.workbook import provenance, reach, results

MODES = ("auto", "recompute", "reuse")
# parameters that choose how a run is stored or checked, not what it computes (notebook 05's SKIP_MISSING
# drops backends from BACKENDS / CONFIGS, which are recorded themselves)
CONTROL = ("RESULTS", "PUBLISH", "SKIP_MISSING")
META_KEY = "speclib.step"  # parquet metadata key holding the producing step's run id
MANIFEST = ".step.json"

__all__ = ["MODES", "Study", "notebook_defaults", "StepMismatch", "broken_steps", "stale_steps"]


_routed: str | None = None  # the SPECLIB_OUT a Study set for an unpublished run in this process


class StepMismatch(ValueError):
    """`mode="reuse"` found no saved results for a step with this run's parameters."""


def notebook_defaults(notebook: str | Path) -> dict:
    """The parameters cell of a notebook (the code cell tagged "parameters"): {name: value}, values
    read with `ast.literal_eval` (a value that is not a literal is kept as its source text)."""
    nb = json.loads(Path(notebook).read_text())
    cells = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"{notebook}: expected one cell tagged 'parameters', found {len(cells)}")
    src = "".join(cells[0]["source"])
    out = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                out[node.targets[0].id] = ast.get_source_segment(src, node.value)
    return out


def _plain(value):
    """`value` as JSON would give it back (tuples become lists, ...), so saved and current values
    compare equal exactly when they mean the same."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _cpu_model() -> str:
    """The CPU's model name (a step's timings and even its ratios depend on it: the matrix library picks
    other kernels on another CPU)."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _measured_on(man: dict) -> str:
    """A step's calibration and CPU, as the summary shows them: steps computed on different machines or days
    carry different T(1), and each step's ratios are paired within the step only."""
    cal, cpu = man.get("calibration") or {}, (man.get("machine") or {}).get("cpu")
    parts = [f"target T(1) {cal['t1_ms_before']:.1f} ms before, {cal['t1_ms_after']:.1f} ms after"] if cal else []
    return "; ".join(parts + ([f"CPU {cpu}"] if cpu else []))


def _machine() -> dict:
    """The machine a step ran on: platform, CPU model, CPUs this process may use, torch version, GPU."""
    import platform

    import torch

    from speclib.core.device import cpu_count

    return dict(
        platform=platform.platform(),
        cpu=_cpu_model(),
        cpus=cpu_count(),
        torch=torch.__version__,
        gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    )


def _source_hash(fn) -> str | None:
    """sha1 of a step function's source text (None when Python cannot find it)."""
    try:
        return hashlib.sha1(inspect.getsource(fn).encode()).hexdigest()[:12]
    except (OSError, TypeError):
        return None


def _differences(saved: dict, now: dict) -> dict:
    """{name: (saved value, this run's value)} for every parameter that differs or is on one side only."""
    missing = "(not used)"
    return {
        k: (saved.get(k, missing), now.get(k, missing))
        for k in sorted(set(saved) | set(now))
        if saved.get(k, missing) != now.get(k, missing)
    }


class Study:
    """One notebook run's steps: where they are stored and whether each is computed or reused.

    `namespace` is the notebook's `globals()` (or any dict): the values of the parameters declared in
    the notebook's parameters cell are read from it, so create the Study after any cell that changes
    them (SMOKE's smaller sizes): the values recorded are the ones the run used. `always` holds values
    every step depends on besides its parameters (SMOKE, so that a smoke run never reuses a full
    run's steps nor the other way round). The machine is not compared: a reader's run in "auto"
    reads the committed results, measured where the manifest's `machine` says. `defaults` (tests,
    scripts) replaces reading the parameters cell of `notebooks/<notebook>.ipynb`.

    `calibrate` (the target LM, or a function returning milliseconds) is timed before and after
    every computed step (`provenance.Calibration`: the target's one-token pass), and the manifest
    keeps both, so results from a faster or slower host, or one that slowed down mid-step, show.
    A reused step whose code or checkpoints changed since it ran (`provenance.check`) is reported
    with a visible note and logged as "reused (stale)"."""

    def __init__(
        self,
        notebook: str,
        namespace: dict,
        mode: str = "auto",
        publish: bool = False,
        always: dict | None = None,
        defaults: dict | None = None,
        calibrate=None,
    ):
        if mode not in MODES:
            raise ValueError(f"mode (RESULTS) must be one of {MODES}, got {mode!r}")
        if calibrate is not None and not callable(calibrate):
            # an LM: time its one-token pass (a smoke run's timings mean nothing: three passes will do)
            calibrate = provenance.Calibration(calibrate, repeats=3 if (always or {}).get("SMOKE") else 15)
        self.notebook, self.mode, self.calibrate = notebook, mode, calibrate
        self.code = provenance.loaded_code()  # the code this kernel imported
        provenance.module_fingerprints()  # hash what is loaded now, before any later edit
        self.reach = reach.Index()  # the sources parsed once for all of this run's steps (the code it runs)
        defaults = notebook_defaults(REPO / "notebooks" / f"{notebook}.ipynb") if defaults is None else defaults
        missing = [k for k in defaults if k not in namespace]
        if missing:
            raise ValueError(f"parameters {missing} of {notebook} are not defined in the namespace given")
        self.params = {k: _plain(namespace[k]) for k in defaults if k not in CONTROL}
        self.changed = _differences({k: _plain(v) for k, v in defaults.items() if k not in CONTROL}, self.params)
        self.published = publish or not self.changed
        self.always = {k: _plain(v) for k, v in (always or {}).items()}
        self.uses: dict[str, list[str]] = {}
        self.log: list[dict] = []  # one row per step: computed or reused, seconds
        global _routed
        given = os.environ.get("SPECLIB_OUT")
        if given and given == _routed:  # set by an earlier Study in this kernel, not by the user
            given = None
            os.environ.pop("SPECLIB_OUT")
        _routed = None
        if given:
            self.out = Path(given)
        elif self.published:
            self.out = None  # data/results and figures/ (results.root(), plotting.root())
        else:
            tag = hashlib.sha1(json.dumps(self.params, sort_keys=True).encode()).hexdigest()[:8]
            self.out = REPO / "build" / "unpublished" / notebook / tag
            _routed = os.environ["SPECLIB_OUT"] = str(self.out)  # every results.save / savefig of this kernel follows
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "params.json").write_text(json.dumps(self.params, indent=1, sort_keys=True) + "\n")

    # where saved steps are looked for: where this run writes, then the committed results
    def _roots(self) -> list[Path]:
        roots = [results.root(), REPO / "data" / "results"]
        return [r for i, r in enumerate(roots) if r.resolve() not in {x.resolve() for x in roots[:i]}]

    def where(self) -> str:
        """One line saying where this run writes and why."""
        if self.out is None:
            return "writes data/results/ and figures/ (every parameter at its committed default)"
        why = (
            "asked to publish"
            if self.published
            else "parameters differ from the committed defaults: "
            + ", ".join(f"{k}={v[1]!r}" for k, v in self.changed.items())
        )
        return f"writes {self.out.relative_to(REPO) if self.out.is_relative_to(REPO) else self.out} ({why})"

    def _used(self, uses) -> dict:
        if uses is None:
            return {**self.params, **self.always}
        names: set[str] = set()
        for u in uses:
            if u in self.uses:
                names |= set(self.uses[u])
            elif u in self.params:
                names.add(u)
            else:
                raise ValueError(
                    f"uses: {u!r} is neither a parameter of {self.notebook} ({sorted(self.params)}) "
                    f"nor an earlier step ({sorted(self.uses)})"
                )
        return {**{k: self.params[k] for k in sorted(names)}, **self.always}

    def _manifest_path(self, root: Path, name: str) -> Path:
        return root / self.notebook / (name + MANIFEST)

    def _read(self, name: str, used: dict):
        """(tables, manifest) of the first saved copy of step `name` whose parameters equal `used`,
        else (None, {differences of the nearest copy} or None when there is none)."""
        nearest = None
        for root in self._roots():
            mp = self._manifest_path(root, name)
            if not mp.is_file():
                continue
            man = json.loads(mp.read_text())
            diff = _differences(man["params"], used)
            if diff:
                nearest = nearest or diff
                continue
            tables = {}
            for t in man["tables"]:
                p = results.path(f"{self.notebook}/{t}", root)
                meta = (pq.read_schema(p).metadata or {}) if p.is_file() else {}
                if meta.get(META_KEY.encode(), b"").decode() != man["run_id"]:
                    break  # a table from another run: this copy is not whole
                tables[t] = pd.read_parquet(p)
            else:
                return tables, man
        return None, nearest

    def step(self, name: str, compute: Callable[[], pd.DataFrame | dict], uses: list[str] | None = None):
        """Run or reuse step `name`; returns what `compute` returns (a DataFrame, or a dict of them),
        read back from the saved parquet files in every mode, so later cells see identical frames."""
        used = self._used(uses)
        self.uses[name] = [k for k in used if k not in self.always]
        if self.mode != "recompute":
            tables, info = self._read(name, used)
            if tables is not None:
                state = provenance.check(info)
                src = _source_hash(compute)
                if state["status"] == "current" and info.get("step_source") and src and src != info["step_source"]:
                    state = dict(status="stale", reasons=["the step's function in the notebook changed"])
                action = "reused" if state["status"] == "current" else f"reused ({state['status']})"
                if action != "reused":
                    print(
                        f"NOTE: step {name!r} reused from commit {info['git_sha']}, "
                        f"{'provenance unknown' if state['status'] == 'unknown' else 'STALE'}: "
                        + "; ".join(state["reasons"])
                        + ". Recompute it with RESULTS='recompute'.",
                        flush=True,
                    )
                self.log.append(
                    dict(
                        step=name,
                        action=action,
                        seconds=0.0,
                        computed_s=info["seconds"],
                        git_sha=info["git_sha"],
                        note="; ".join(filter(None, [_measured_on(info), *state["reasons"]])),
                    )
                )
                return tables[name] if info["single"] else tables
            if self.mode == "reuse":
                detail = (
                    "no saved results"
                    if info is None
                    else "saved with other parameters: "
                    + "; ".join(f"{k} saved {a!r}, now {b!r}" for k, a, b in ((k, *v) for k, v in info.items()))
                )
                raise StepMismatch(
                    f"RESULTS='reuse': step {name!r} of {self.notebook} has {detail}. "
                    f"Run with RESULTS='auto' or 'recompute' to compute it."
                )
        adoptions = _adoptions()
        if name in adoptions:
            return self._adopt(name, used, adoptions[name])
        # read before computing: the code as the run starts, and a source it cannot read fails now, not hours later
        definitions = reach.step_definitions(provenance.notebook_source(self.notebook), name, self.reach)
        calib_before = self.calibrate() if self.calibrate else None
        t0 = time.perf_counter()
        out = compute()
        seconds = time.perf_counter() - t0
        calib_after = self.calibrate() if self.calibrate else None
        single = isinstance(out, pd.DataFrame)
        tables = {name: out} if single else out
        if not isinstance(tables, dict) or not tables or not all(isinstance(v, pd.DataFrame) for v in tables.values()):
            raise TypeError(f"step {name!r}: compute must return a DataFrame or a non-empty dict of DataFrames")
        # the run id is a digest of the parameters and the tables' contents: the same numbers give
        # byte-identical files, and a table written by any other computation carries another id
        digest = hashlib.sha1(json.dumps(used, sort_keys=True).encode())
        for t in sorted(tables):
            digest.update(t.encode() + tables[t].to_parquet())
        man = dict(
            notebook=self.notebook,
            step=name,
            params=used,
            notebook_params=self.params,
            tables=sorted(tables),
            single=single,
            seconds=round(seconds, 3),
            run_id=digest.hexdigest()[:16],
            **self.code,
            machine=_machine(),
            modules=provenance.module_fingerprints(),
            definitions=definitions,
            checkpoints=provenance.checkpoint_hashes(provenance.named_checkpoints(used)),
            step_source=_source_hash(compute),
            calibration=None
            if calib_before is None
            else dict(t1_ms_before=round(calib_before, 3), t1_ms_after=round(calib_after, 3)),
        )
        for t, df in tables.items():
            results.save(df, f"{self.notebook}/{t}", metadata={META_KEY: man["run_id"]})
        self._write_manifest(results.root(), name, man)
        self.log.append(
            dict(
                step=name,
                action="computed",
                seconds=seconds,
                computed_s=seconds,
                git_sha=man["git_sha"],
                note=_measured_on(man),
            )
        )
        back = {t: results.load(f"{self.notebook}/{t}") for t in tables}
        return back[name] if single else back

    def _adopt(self, name: str, used: dict, tables: list[str] | None):
        """Record tables saved before results modes existed as step `name`, produced with `used`
        (see `_adoptions`); they keep their own `git_sha` column, which the manifest repeats."""
        root = results.root()
        frames = {t: results.load(f"{self.notebook}/{t}", root) for t in (tables or [name])}
        shas = sorted({str(x) for f in frames.values() for x in f.get("git_sha", pd.Series(["unknown"])).unique()})
        digest = hashlib.sha1(json.dumps(used, sort_keys=True).encode())
        for t in sorted(frames):
            digest.update(t.encode() + frames[t].to_parquet())
        man = dict(
            notebook=self.notebook,
            step=name,
            params=used,
            notebook_params=self.params,
            tables=sorted(frames),
            single=tables is None,
            seconds=None,
            run_id=digest.hexdigest()[:16],
            git_sha=",".join(shas),
            dirty=None,
            adopted=True,
        )
        for t in frames:
            p = results.path(f"{self.notebook}/{t}", root)
            table = pq.read_table(p)
            table = table.replace_schema_metadata(
                {**(table.schema.metadata or {}), META_KEY.encode(): man["run_id"].encode()}
            )
            tmp = p.with_name(f".{p.stem}.adopt.tmp")
            pq.write_table(table, tmp)
            os.replace(tmp, p)
        self._write_manifest(root, name, man)
        self.log.append(
            dict(
                step=name,
                action="adopted",
                seconds=0.0,
                computed_s=None,
                git_sha=man["git_sha"],
                note="tables saved before results modes existed; code version unknown",
            )
        )
        tables, _ = self._read(name, used)
        return tables[name] if man["single"] else tables

    def _write_manifest(self, root: Path, name: str, man: dict) -> None:
        mp = self._manifest_path(root, name)
        tmp = mp.with_suffix(".tmp")
        tmp.write_text(json.dumps(man, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, mp)  # written last: a crash before it leaves no claimable step

    def summary(self) -> pd.DataFrame:
        """One row per step of this run: computed, reused, "reused (stale)" or "reused (unknown)" (see
        `provenance.check`), seconds now, seconds when computed, commit, and a note (the calibration
        of a computed step, the reasons a reused one is stale)."""
        return pd.DataFrame(self.log, columns=["step", "action", "seconds", "computed_s", "git_sha", "note"])


def broken_steps(root: str | Path) -> list[str]:
    """Saved steps under `root` (a results folder) that "auto" could never reuse: a table listed in a
    step's manifest is missing or was overwritten by another save (its run id is not the manifest's),
    e.g. a notebook saving a summary under its step's table name. One line per broken table."""
    out = []
    for mp in sorted(Path(root).glob(f"*/*{MANIFEST}")):
        man = json.loads(mp.read_text())
        for t in man["tables"]:
            p = mp.parent / f"{t}.parquet"
            got = (pq.read_schema(p).metadata or {}).get(META_KEY.encode(), b"").decode() if p.is_file() else "missing"
            if got != man["run_id"]:
                out.append(
                    f"{mp.parent.name}/{man['step']}: table {t} has run id {got or 'none'}, "
                    f"the manifest says {man['run_id']}"
                )
    return out


def stale_steps(root: str | Path | None = None) -> pd.DataFrame:
    """Every saved step under `root` (default: the committed data/results) with its provenance
    status against the checkout now (`provenance.check`): one row per step, with the commit it ran
    at, its calibration (the target's one-token pass before/after, ms) and the reasons."""
    rows, index = [], reach.Index()
    for mp in sorted(Path(root or REPO / "data" / "results").glob(f"*/*{MANIFEST}")):
        man = json.loads(mp.read_text())
        state = provenance.check(man, index)
        cal = man.get("calibration") or {}
        # manifests written before `dirty_files` existed counted the run's own outputs as changes: not shown
        rows.append(
            dict(
                notebook=mp.parent.name,
                step=man["step"],
                status=state["status"],
                git_sha=man.get("git_sha"),
                dirty=man.get("dirty") if "dirty_files" in man else None,
                adopted=bool(man.get("adopted")),
                seconds=man.get("seconds"),
                t1_ms_before=cal.get("t1_ms_before"),
                t1_ms_after=cal.get("t1_ms_after"),
                reasons="; ".join(state["reasons"]),
            )
        )
    return pd.DataFrame(
        rows,
        columns=[
            "notebook",
            "step",
            "status",
            "git_sha",
            "dirty",
            "adopted",
            "seconds",
            "t1_ms_before",
            "t1_ms_after",
            "reasons",
        ],
    )


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m speclib study", description="Provenance of saved steps.")
    ap.add_argument(
        "command",
        choices=["stale", "list"],
        help="stale: steps whose code or checkpoints changed since "
        "they ran, or whose provenance is unknown; list: every step",
    )
    ap.add_argument("--root", type=Path, default=None, help="results folder (default data/results)")
    a = ap.parse_args(argv)
    df = stale_steps(a.root)
    if a.command == "stale":
        df = df[df.status != "current"]
    for r in df.itertuples():
        cal = (
            ""
            if r.t1_ms_before is None or r.t1_ms_before != r.t1_ms_before
            else f", target T(1) {r.t1_ms_before:.1f}/{r.t1_ms_after:.1f} ms before/after"
        )
        print(
            f"{r.notebook}/{r.step}: {r.status} (commit {r.git_sha}{', dirty' if r.dirty else ''}{cal})"
            + (f": {r.reasons}" if r.reasons else "")
        )
    if not len(df):
        print("every saved step is current")
    return 0


def _adoptions() -> dict[str, list[str] | None]:
    """$SPECLIB_ADOPT, "step;step=table,table": a migration aid for results computed before
    their notebook was split into steps. A named step that has no saved copy with this run's
    parameters does not compute: its tables, already in the output folder, are recorded as produced
    with this run's parameters (the manifest says `adopted` and keeps their git_sha). Only true when
    those tables came from a run with exactly these parameters: use it once, on a full default run's
    committed results, and say so in the commit."""
    spec = os.environ.get("SPECLIB_ADOPT", "").strip()
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        step, eq, tables = part.partition("=")  # "step" alone: the step returns one table named like it
        out[step.strip()] = [t.strip() for t in tables.split(",") if t.strip()] if eq else None
    return out


if __name__ == "__main__":
    raise SystemExit(main())
