"""Notebooks and parameter sweeps as Ray tasks: one machine by default, a cluster when given one.

    python -m speclib sweep notebooks/01_baseline.ipynb --grid K_MAX=2,4 --grid SEED=0,1 -p SMOKE True
    python -m speclib sweep notebooks/02_cache_hybrid.ipynb --grid TARGET+DRAFT=agent-target+agent-draft,code-target+code-draft
    python -m speclib sweep notebooks/01_baseline.ipynb --grid SEED=0,1 --address 10.0.0.5:6379 --resume

Every point of the grid (the Cartesian product of the `--grid` values, with the `-p` values fixed)
is one papermill execution of the notebook, run as a Ray task; `--grid A+B=a1+b1,a2+b2` varies two
parameters together (a target and its draft). Names and values are checked against
the notebook's parameters cell before Ray starts: an unknown name, a value of the wrong type or an
unreachable address is an error, and nothing runs or is written.

**Where it runs.** Without `--address` (and no `RAY_ADDRESS`), `ray.init()` starts Ray on this
machine by itself, with one "timing slot" (the custom resource `speclib_timing`); with an address it
joins that cluster, whose nodes must each offer one slot (`ray start ... --resources
'{"speclib_timing": 1}'`). A point of a timed sweep (the default) takes a slot, so it never shares a
node with another point: speedups measured beside another run are not speedups. `--untimed` packs
points by CPUs alone (acceptance, exact maths, anything that reads no clock). Each point sets torch,
OpenMP and MKL threads to its CPUs (`--cpus-per-run`, default: every CPU of the smallest node for a
timed sweep, 1 otherwise) and records the node, its host and its CPU count with its results. From
Python, a Ray the caller already started (`ray.init(...)`) is used as it is and left running.

**Code and checkpoints on the workers.** `--code shared` runs the repository where it lies: the
default on a cluster of this machine's own nodes, and right for any cluster that mounts the checkout
at the same path. `--code upload` ships the repository (code, `data/` with the checkpoints, the
notebooks; not `.git`, `.venv`, `build/`, `figures/` or earlier sweeps: about 200 MB, printed before
it starts) as a Ray runtime environment; the workers' Python must have speclib's dependencies
installed (the same `make venv`).

**Outputs.** `data/sweeps/SWEEP/POINT/` holds the point's executed notebook, `results/` and
`figures/`; `runs.parquet` one row per point (its parameters, status, seconds, node, host, CPUs,
error); `tables/NN_slug/<table>.parquet` each results table concatenated across the completed points
with the point's parameters as columns (prefixed `param.` where a table already has a column of that
name). A point's files come back to the driver through Ray and are written to a temporary folder,
then renamed: an interrupted sweep leaves no half-written point. A failing point is recorded with its
error (its executed notebook kept under `failed/POINT/`) and does not stop the others; `--resume`
runs only the points not done.

**make figures on a cluster.** `--publish` runs each notebook given as one point (no grid) on a node
of its own and writes its results and figures where a local run would: `data/results/` and
`figures/` when every parameter is at its committed default, else `build/unpublished/`.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import re
import shutil
import socket
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pandas as pd

from speclib.core.device import REPO
from speclib.workbook.notebooks import _value
from speclib.workbook.study import CONTROL, MODES, notebook_defaults

RESOURCE = "speclib_timing"  # one per node: a timed point holds its node alone
UPLOAD_EXCLUDES = [".git", ".venv", "build", "figures", "data/sweeps", "**/__pycache__", "**/.ipynb_checkpoints"]
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

__all__ = ["points", "point_name", "check", "run_sweep", "combine", "main"]


# ---------------------------------------------------------------- the grid, checked before anything runs


def _axes(grid: dict[str, list]) -> list[tuple[list[str], list[tuple]]]:
    """The grid's axes as (names, values): a key "A+B" is one axis whose values are (a, b) pairs,
    varied together (a model pair, say); any other key is one parameter."""
    axes = []
    for key, values in grid.items():
        names = key.split("+")
        rows = [tuple(v) if len(names) > 1 else (v,) for v in values]
        bad = [v for v in rows if len(v) != len(names)]
        if bad:
            raise ValueError(f"--grid {key}: each value needs {len(names)} parts joined by '+', got {bad[0]!r}")
        axes.append((names, rows))
    return axes


def varied_names(grid: dict[str, list]) -> list[str]:
    """The parameter names a grid varies, in order."""
    return [n for names, _ in _axes(grid) for n in names]


def points(grid: dict[str, list], fixed: dict | None = None) -> list[dict]:
    """Every combination of the grid's axes (first axis varies slowest), each with `fixed` added."""
    axes = _axes(grid)
    out = []
    for combo in itertools.product(*(rows for _, rows in axes)):
        p = dict(fixed or {})
        for (names, _), values in zip(axes, combo):
            p.update(zip(names, values))
        out.append(p)
    return out


def point_name(params: dict, varied: list[str]) -> str:
    """A folder name for a point from its varied parameters: "K_MAX-4__SEED-1" (just "run" when none vary)."""
    if not varied:
        return "run"
    text = "__".join(f"{k}-{params[k]}" for k in varied)
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", text)


def _type_ok(default, value) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    if isinstance(default, str):
        return isinstance(value, str)
    return True  # a default that is not a literal: anything goes


def check(notebook: str | Path, grid: dict[str, list], fixed: dict) -> dict:
    """The notebook's declared parameters; raises ValueError for an unknown name, a value whose type
    differs from the default's, an empty grid axis or a results mode that does not exist."""
    nb = Path(notebook)
    if not nb.is_file():
        raise ValueError(f"no notebook {notebook}")
    declared = notebook_defaults(nb)
    axes = _axes(grid)
    gridded = varied_names(grid)
    both = sorted(set(gridded) & set(fixed))
    if both or len(set(gridded)) != len(gridded):
        raise ValueError(f"{both or gridded}: a parameter given twice (in --grid, or in --grid and -p)")
    singles = [(n, [row[i] for row in rows]) for names, rows in axes for i, n in enumerate(names)]
    for name, values in [*singles, *((k, [v]) for k, v in fixed.items())]:
        if name not in declared:
            raise ValueError(f"unknown parameter {name!r} for {nb.name}; it declares {sorted(declared)}")
        if not values:
            raise ValueError(f"--grid {name}: no values")
        for v in values:
            if not _type_ok(declared[name], v):
                raise ValueError(
                    f"bad value {v!r} for {name} of {nb.name}: expected a {type(declared[name]).__name__} "
                    f"like its default {declared[name]!r}"
                )
            if name == "RESULTS" and v not in MODES:
                raise ValueError(f"bad value {v!r} for RESULTS: one of {MODES}")
    return declared


def _reachable(address: str, timeout: float = 5.0) -> None:
    """Raise ValueError unless something accepts TCP connections at `address` ("host:port" or
    "ray://host:port"); "auto" and "local" are left to Ray."""
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--address {address!r}: expected HOST:PORT (or ray://HOST:PORT)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise ValueError(
            f"--address {address}: no Ray cluster answers there ({e}). Start one with "
            f"`ray start --head --resources '{{\"{RESOURCE}\": 1}}'`, or leave --address out "
            f"to run on this machine"
        ) from None


# ---------------------------------------------------------------- one point, on a worker


def _pack(folder: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder, arcname=".")
    return buf.getvalue()


def _execute(repo: str | None, notebook: str, params: dict, cpus: int) -> dict:
    """Run one point (inside a Ray task): papermill in a subprocess whose results and figures go to a
    fresh folder, with threads set to `cpus`. Returns status, timings, where it ran and the folder's
    files as a gzipped tar. `repo` None: the uploaded working directory (the task's cwd)."""
    import subprocess

    import ray

    repo = Path(repo or os.getcwd())
    if not (repo / "speclib").is_dir():
        raise RuntimeError(
            f"no speclib checkout at {repo} on {socket.gethostname()}: use --code upload "
            f"or mount the repository at the same path on every node"
        )
    out = Path(tempfile.mkdtemp(prefix="speclib-point-"))
    executed = out / Path(notebook).name
    env = {
        **os.environ,
        "SPECLIB_OUT": str(out),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])),
        **{v: str(cpus) for v in THREAD_VARS},
    }
    cmd = [sys.executable, "-m", "speclib.workbook.notebooks", str(repo / notebook), str(executed)]
    for k, v in params.items():
        cmd += ["-p", k, repr(v)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    error = None
    if proc.returncode:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        error = "\n".join(lines[-12:]) or f"exit status {proc.returncode}"
    try:
        archive = _pack(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return dict(
        status="failed" if error else "done",
        seconds=round(seconds, 2),
        error=error,
        node=ray.get_runtime_context().get_node_id(),
        host=socket.gethostname(),
        node_cpus=os.cpu_count(),
        cpus=cpus,
        archive=archive,
    )


def _unpack(archive: bytes, dest: Path) -> None:
    """Extract a point's archive to `dest` through a temporary sibling folder and a rename."""
    tmp = dest.parent / f".tmp-{dest.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        tar.extractall(tmp, filter="data")
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)


# ---------------------------------------------------------------- the sweep, on the driver


def _init_ray(address: str | None):
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    t0 = time.perf_counter()
    if address:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        if ray.cluster_resources().get(RESOURCE, 0) < 1:
            ray.shutdown()
            raise ValueError(
                f"the cluster at {address} offers no {RESOURCE!r} slot: start each node with "
                f"`ray start ... --resources '{{\"{RESOURCE}\": 1}}'`, or pass --untimed"
            )
    else:
        ray.init(resources={RESOURCE: 1}, include_dashboard=False, log_to_driver=False)
    return time.perf_counter() - t0


def _local_cluster() -> bool:
    """True when every live node of the connected cluster has this machine's address."""
    import ray

    mine = {"127.0.0.1", ray.util.get_node_ip_address()}
    return all(n["NodeManagerAddress"] in mine for n in ray.nodes() if n["Alive"])


def _upload_size() -> int:
    skip = {REPO / e for e in UPLOAD_EXCLUDES if "*" not in e}
    total = 0
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if Path(root, d) not in skip and d not in ("__pycache__", ".ipynb_checkpoints")]
        total += sum(os.path.getsize(Path(root, f)) for f in files if not Path(root, f).is_symlink())
    return total


def _dispatch(
    jobs: list[tuple[Path, str, str, dict]],
    address: str | None,
    cpus_per_run: int | None,
    gpus_per_run: float,
    timed: bool,
    code: str | None,
    desc: str,
    progress: bool,
) -> list[dict]:
    """Run `jobs`, each (folder, point, notebook relative to the repository, parameters), as Ray tasks
    (all submitted at once; Ray places them). A done point's files land in folder/point, a failed
    one's in folder/failed/point. Returns one row per job, in the order they finished."""
    import ray
    from tqdm.auto import tqdm

    if code not in (None, "shared", "upload"):
        raise ValueError(f"--code must be 'shared' or 'upload', got {code!r}")
    # a Ray the caller already connected (a notebook, a test session) is used as it is, and left running
    own = not ray.is_initialized()
    init_s = _init_ray(address) if own else 0.0
    try:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        if cpus_per_run is None:
            cpus_per_run = int(min(n["Resources"].get("CPU", 1) for n in nodes)) if timed else 1
        code = code or ("shared" if _local_cluster() else "upload")
        opts = dict(num_cpus=cpus_per_run, num_gpus=gpus_per_run, max_retries=0)
        if timed:
            opts["resources"] = {RESOURCE: 1}
        if code == "upload":
            print(
                f"uploading {_upload_size() / 2**20:.0f} MiB (code, notebooks, data/ with the checkpoints) "
                f"as a Ray runtime environment"
            )
            opts["runtime_env"] = {"working_dir": str(REPO), "excludes": UPLOAD_EXCLUDES}
        task = ray.remote(_execute).options(**opts)
        for folder in {j[0] for j in jobs}:
            folder.mkdir(parents=True, exist_ok=True)
            for stale in folder.glob(".tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
        print(
            f"{desc}: {len(jobs)} point(s) to run; Ray up in {init_s:.1f} s ({len(nodes)} node(s), code {code}, "
            f"{cpus_per_run} CPU(s) per point{', timed: one point per node' if timed else ''})"
        )
        repo = None if code == "upload" else str(REPO)
        pending = {
            task.remote(repo, rel, params, cpus_per_run): (folder, point, params) for folder, point, rel, params in jobs
        }
        rows = []
        bar = tqdm(total=len(pending), desc=desc, unit="point", disable=not progress)
        while pending:
            [ref], _ = ray.wait(list(pending), num_returns=1)
            folder, point, params = pending.pop(ref)
            try:
                res = ray.get(ref)
            except Exception as e:  # the task itself died (worker lost, no checkout, ...)
                res = dict(
                    status="failed",
                    seconds=None,
                    error=f"{type(e).__name__}: {e}"[-2000:],
                    node=None,
                    host=None,
                    node_cpus=None,
                    cpus=cpus_per_run,
                    archive=None,
                )
            archive = res.pop("archive")
            if archive is not None:
                _unpack(archive, folder / point if res["status"] == "done" else folder / "failed" / point)
            if res["status"] == "done":
                shutil.rmtree(folder / "failed" / point, ignore_errors=True)
            rows.append(dict(folder=folder, point=point, params=params, **res))
            bar.update(1)
        bar.close()
    finally:
        if own:
            ray.shutdown()
    return rows


def run_sweep(
    notebook: str | Path,
    grid: dict[str, list],
    fixed: dict | None = None,
    name: str | None = None,
    address: str | None = None,
    cpus_per_run: int | None = None,
    gpus_per_run: float = 0,
    timed: bool = True,
    code: str | None = None,
    resume: bool = False,
    out: str | Path | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Run the sweep; returns `runs` (one row per point). See the module docstring."""
    fixed = dict(fixed or {})
    nb = Path(notebook).resolve()
    declared = check(nb, grid, fixed)
    if not nb.is_relative_to(REPO):
        raise ValueError(f"{notebook}: the notebook must lie inside the repository ({REPO})")
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        _reachable(address)
    varied = varied_names(grid)
    if "RESULTS" in declared and "RESULTS" not in fixed and "RESULTS" not in varied:
        fixed["RESULTS"] = "recompute"  # each point computes what it reports
    every = [(point_name(p, varied), p) for p in points(grid, fixed)]
    if len({n for n, _ in every}) != len(every):
        raise ValueError("two points map to the same folder name: give values that differ as text")
    name = name or "-".join([nb.stem, *varied])
    folder = (Path(out) if out else REPO / "data" / "sweeps") / name
    old = pd.read_parquet(folder / "runs.parquet") if resume and (folder / "runs.parquet").is_file() else None
    done = set(old.loc[old.status == "done", "point"]) if old is not None else set()
    rel = str(nb.relative_to(REPO))
    jobs = [(folder, n, rel, p) for n, p in every if not (n in done and (folder / n).is_dir())]
    rows = _dispatch(
        jobs,
        address,
        cpus_per_run,
        gpus_per_run,
        timed,
        code,
        f"sweep {name} ({len(every) - len(jobs)} done before)",
        progress,
    )
    runs = pd.DataFrame(
        [
            dict(
                point=r["point"],
                **{k: r["params"][k] for k in varied},
                params=json.dumps(r["params"], sort_keys=True),
                **{k: v for k, v in r.items() if k not in ("folder", "point", "params")},
            )
            for r in rows
        ]
    )
    if old is not None and len(old):
        runs = pd.concat([old[~old.point.isin(runs.point)] if len(runs) else old, runs], ignore_index=True)
    order = {n: i for i, (n, _) in enumerate(every)}
    runs = runs.sort_values("point", key=lambda col: col.map(order)).reset_index(drop=True)
    _atomic_parquet(runs, folder / "runs.parquet")
    combine(folder, varied)
    return runs


def _atomic_parquet(df: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    df.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def combine(folder: str | Path, varied: list[str]) -> list[Path]:
    """Concatenate each results table across the completed points of the sweep in `folder` into
    `tables/<name>.parquet`, with a `point` column and the varied parameters as columns."""
    folder = Path(folder)
    runs = pd.read_parquet(folder / "runs.parquet")
    frames: dict[str, list[pd.DataFrame]] = {}
    for _, row in runs[runs.status == "done"].iterrows():
        res = folder / row.point / "results"
        for p in sorted(res.rglob("*.parquet")) if res.is_dir() else []:
            df = pd.read_parquet(p)
            cols = {("param." + k if k in df.columns else k): row[k] for k in varied}
            frames.setdefault(p.relative_to(res).with_suffix("").as_posix(), []).append(
                df.assign(point=row.point, **cols)
            )
    written = []
    shutil.rmtree(folder / "tables", ignore_errors=True)
    for table, parts in frames.items():
        path = folder / "tables" / f"{table}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_parquet(pd.concat(parts, ignore_index=True), path)
        written.append(path)
    return written


def publish(
    notebooks: list[str | Path],
    fixed: dict | None = None,
    address: str | None = None,
    cpus_per_run: int | None = None,
    gpus_per_run: float = 0,
    code: str | None = None,
    root: Path = REPO,
) -> pd.DataFrame:
    """`make figures` on a cluster: every notebook one timed point, all submitted at once (one per
    node at a time). Each one's results and figures are copied where a local run writes them (every
    parameter at its committed default, or PUBLISH: data/results/ and figures/; otherwise
    build/unpublished/<notebook>/sweep/), its executed notebook to build/; all under `root`."""
    fixed = dict(fixed or {})
    nbs = [Path(nb).resolve() for nb in notebooks]
    for nb in nbs:
        check(nb, {}, fixed)
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        _reachable(address)
    staging = root / "build" / "sweeps"
    jobs = [(staging / nb.stem, "run", str(nb.relative_to(REPO)), fixed) for nb in nbs]
    rows = _dispatch(jobs, address, cpus_per_run, gpus_per_run, True, code, "make figures", progress=True)
    for row in rows:
        stem = row["folder"].name
        nb = next(n for n in nbs if n.stem == stem)
        if row["status"] != "done":
            print(f"{nb.name} failed:\n{row['error']}")
            continue
        src = row["folder"] / "run"
        defaults = {k: v for k, v in notebook_defaults(nb).items() if k not in CONTROL}
        at_defaults = fixed.get("PUBLISH") or all(defaults.get(k) == v for k, v in fixed.items() if k not in CONTROL)
        results_dir = (
            root / "data" / "results" if at_defaults else root / "build" / "unpublished" / stem / "sweep" / "results"
        )
        figures_dir = root / "figures" if at_defaults else results_dir.parent / "figures"
        for sub, dest in (("results", results_dir), ("figures", figures_dir)):
            for f in sorted((src / sub).rglob("*")) if (src / sub).is_dir() else []:
                if f.is_file():
                    target = dest / f.relative_to(src / sub)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, target.with_name(target.name + ".tmp"))
                    os.replace(target.with_name(target.name + ".tmp"), target)
        if (src / nb.name).is_file():
            shutil.copy2(src / nb.name, root / "build" / nb.name)
        print(f"{nb.name}: {row['seconds']:.0f} s on {row['host']}, results in {results_dir}")
    return pd.DataFrame([{k: v for k, v in r.items() if k != "folder"} | {"point": r["folder"].name} for r in rows])


# ---------------------------------------------------------------- command line


def _grid_arg(text: str) -> tuple[str, list]:
    """NAME=v1,v2,... or NAME+NAME2=a1+b1,a2+b2 (values varied together)."""
    name, eq, values = text.partition("=")
    if not eq or not name.strip():
        raise argparse.ArgumentTypeError(f"--grid {text!r}: expected NAME=v1,v2,... or A+B=a1+b1,a2+b2")
    name = "+".join(n.strip() for n in name.split("+"))
    parts = [v.strip() for v in values.split(",") if v.strip()]
    if "+" in name:
        return name, [tuple(_value(x.strip()) for x in v.split("+")) for v in parts]
    return name, [_value(v) for v in parts]


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m speclib sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("notebook", nargs="+", help="one notebook; several only with --publish")
    ap.add_argument("--grid", type=_grid_arg, action="append", default=[], metavar="NAME=v1,v2,...")
    ap.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    ap.add_argument("--name", help="the sweep's folder under data/sweeps/ (default: notebook and grid names)")
    ap.add_argument("--address", help="a Ray cluster to join (default: $RAY_ADDRESS, else Ray on this machine)")
    ap.add_argument("--cpus-per-run", type=int)
    ap.add_argument("--gpus-per-run", type=float, default=0)
    ap.add_argument("--untimed", action="store_true", help="points may share a node (nothing they report is a timing)")
    ap.add_argument(
        "--code",
        choices=["shared", "upload"],
        help="how workers get the repository (default: shared on this machine's own nodes, upload otherwise)",
    )
    ap.add_argument("--resume", action="store_true", help="run only the points not done")
    ap.add_argument("--out", help="folder holding the sweeps (default data/sweeps)")
    ap.add_argument(
        "--publish",
        action="store_true",
        help="make figures: each notebook one point, results where a local run puts them",
    )
    a = ap.parse_args(argv)
    fixed = {k: _value(v) for k, v in a.p}
    grid = dict(a.grid)
    if len(grid) != len(a.grid):
        ap.error("a parameter given twice with --grid")
    try:
        if a.publish:
            if grid:
                ap.error("--publish runs each notebook once: no --grid")
            runs = publish(a.notebook, fixed, a.address, a.cpus_per_run, a.gpus_per_run, a.code)
        else:
            if len(a.notebook) != 1:
                ap.error("a sweep runs one notebook (several only with --publish)")
            runs = run_sweep(
                a.notebook[0],
                grid,
                fixed,
                a.name,
                a.address,
                a.cpus_per_run,
                a.gpus_per_run,
                not a.untimed,
                a.code,
                a.resume,
                a.out,
            )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cols = [c for c in ("point", "status", "seconds", "host", "cpus", "error") if c in runs]
    print(runs[cols].to_string(index=False))
    return 1 if (runs.status != "done").any() else 0


if __name__ == "__main__":
    sys.exit(main())
