"""speclib.workbook.sweep: grids checked before Ray starts, points as Ray tasks on this machine and on a
two-node cluster of this machine, failures recorded, --resume, combined tables.

Most tests run tests/notebooks/sweep_probe.ipynb (a results table and a figure in a few seconds);
one runs a real notebook's smoke sweep. Ray binds its nodes to this machine's own address; every
test stops what it started."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import needs_shipped

from speclib.core.device import REPO
from speclib.workbook import sweep

# every Ray test in one pytest-xdist worker, one after another: two local Ray clusters at once would share the two cores
pytestmark = pytest.mark.xdist_group("ray")

PROBE = REPO / "tests" / "notebooks" / "sweep_probe.ipynb"


def test_ray_tests_are_grouped_in_one_worker(request):
    """Under `--dist loadgroup` the group must reach the scheduler (pytest-xdist appends it to the node id;
    pytest 9.2 ignored that, and a two-node test's `ray stop --force` killed the other worker's Ray)."""
    if not request.config.getvalue("loadgroup"):
        pytest.skip("not running under pytest-xdist --dist loadgroup")
    assert request.node.nodeid.endswith("@ray"), request.node.nodeid


@pytest.fixture(autouse=True)
def no_cluster_in_env(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="class")
def local_ray():
    """One local Ray (with the timing slot) for the tests of TestOnOneLocalRay: the sweep uses a Ray it
    finds running and leaves it, which saves about 25 s of start-up per sweep. Class-scoped, so it is down
    before test_two_node_cluster_on_this_machine, whose `ray stop --force` would kill this driver too."""
    import ray

    sweep._init_ray(None)
    yield
    ray.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_points_names_and_types():
    pts = sweep.points({"A": [1, 2], "B": ["x", "y/z"]}, {"C": True})
    assert pts == [
        {"C": True, "A": 1, "B": "x"},
        {"C": True, "A": 1, "B": "y/z"},
        {"C": True, "A": 2, "B": "x"},
        {"C": True, "A": 2, "B": "y/z"},
    ]
    assert [sweep.point_name(p, ["A", "B"]) for p in pts][1] == "A-1__B-y_z"
    assert sweep.point_name({"A": 1}, []) == "run"
    pairs = sweep.points({"T+D": [("t1", "d1"), ("t2", "d2")], "S": [0, 1]})  # T and D vary together
    assert [(p["T"], p["D"], p["S"]) for p in pairs] == [
        ("t1", "d1", 0),
        ("t1", "d1", 1),
        ("t2", "d2", 0),
        ("t2", "d2", 1),
    ]
    assert sweep._grid_arg("T+D=a+b, c+d") == ("T+D", [("a", "b"), ("c", "d")])
    assert sweep.varied_names({"T+D": [], "S": []}) == ["T", "D", "S"]
    with pytest.raises(ValueError, match="2 parts"):
        sweep.points({"T+D": [("a",)]})
    assert sweep.check(PROBE, {"X": [1, 3]}, {"FAIL_IF_EXISTS": "f"}) == {
        "X": 1,
        "FAIL_IF_EXISTS": "",
        "RESULTS": "auto",
    }


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--grid", "NOPE=1,2"], "unknown parameter 'NOPE'"),
        (["--grid", "X=1,abc"], "bad value 'abc' for X"),
        (["--grid", "X=1,2", "-p", "X", "3"], "a parameter given twice"),
        (["-p", "RESULTS", "sometimes"], "bad value 'sometimes' for RESULTS"),
        (["--grid", "X=1", "--address", "127.0.0.1:PORT"], "no Ray cluster answers there"),
    ],
)
def test_bad_arguments_are_clear_errors_and_write_nothing(tmp_path, capsys, argv, message):
    import ray

    argv = [a.replace("PORT", str(free_port())) for a in argv]
    assert sweep.main([str(PROBE), "--out", str(tmp_path / "sweeps"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "sweeps").exists()
    assert not ray.is_initialized()


def test_combine_prefixes_parameters_a_table_already_has(tmp_path):
    for point, k in (("K-1", 1), ("K-2", 2)):
        (tmp_path / point / "results" / "nb").mkdir(parents=True)
        pd.DataFrame({"K": [10 * k], "v": [k]}).to_parquet(tmp_path / point / "results" / "nb" / "t.parquet")
    pd.DataFrame({"point": ["K-1", "K-2", "K-3"], "K": [1, 2, 3], "status": ["done", "done", "failed"]}).to_parquet(
        tmp_path / "runs.parquet"
    )
    [path] = sweep.combine(tmp_path, ["K"])
    df = pd.read_parquet(path)
    assert path == tmp_path / "tables" / "nb" / "t.parquet"
    assert df[["K", "param.K", "point", "v"]].values.tolist() == [[10, 1, "K-1", 1], [20, 2, "K-2", 2]]


class TestOnOneLocalRay:
    def test_failed_point_is_recorded_and_resume_runs_only_it(self, tmp_path, local_ray):
        flag = tmp_path / "fail-now"
        flag.touch()
        out = tmp_path / "sweeps"
        args = dict(
            grid={"X": [1, 2]}, fixed={"FAIL_IF_EXISTS": str(flag)}, name="s", out=out, timed=False, progress=False
        )
        runs = sweep.run_sweep(PROBE, **args)
        assert runs.point.tolist() == ["X-1", "X-2"] and runs.status.tolist() == ["done", "failed"]
        assert "probe asked to fail at X=2" in runs.error[1]
        s = out / "s"
        assert (s / "X-1" / "results" / "99_probe" / "values.parquet").is_file()
        assert (s / "X-1" / "figures" / "99_probe_line.png").is_file()
        assert not (s / "X-2").exists() and (s / "failed" / "X-2" / "sweep_probe.ipynb").is_file()
        assert set(pd.read_parquet(s / "tables" / "99_probe" / "values.parquet").X) == {1}
        first = (s / "X-1" / "sweep_probe.ipynb").stat().st_mtime_ns

        flag.unlink()
        again = sweep.run_sweep(PROBE, **args, resume=True)
        assert again.status.tolist() == ["done", "done"]
        pd.testing.assert_series_equal(again.iloc[0], runs.iloc[0], check_names=False)  # X-1 was not rerun
        assert (s / "X-1" / "sweep_probe.ipynb").stat().st_mtime_ns == first
        assert not (s / "failed" / "X-2").exists() and not list(s.glob(".tmp-*"))
        combined = pd.read_parquet(s / "tables" / "99_probe" / "values.parquet")
        assert combined[["point", "X", "x", "y"]].values.tolist() == [
            ["X-1", 1, 1, 1],
            ["X-1", 1, 1, 1],
            ["X-2", 2, 2, 4],
            ["X-2", 2, 2, 8],
        ]
        assert (combined.threads == "1").all()  # an untimed point's threads = its one CPU
        assert json.loads(again.params[1]) == {"FAIL_IF_EXISTS": str(flag), "RESULTS": "recompute", "X": 2}

    def test_publish_puts_results_where_a_local_run_would(self, tmp_path, local_ray):
        """`make figures RAY_ADDRESS=...`: each notebook one point; at its committed defaults into
        data/results/ and figures/, otherwise under build/unpublished/ (here under tmp_path, not the repo)."""
        runs = sweep.publish([PROBE], {"RESULTS": "recompute"}, root=tmp_path)
        assert runs.status.tolist() == ["done"]
        assert (tmp_path / "data" / "results" / "99_probe" / "values.parquet").is_file()
        assert (tmp_path / "figures" / "99_probe_line.png").is_file() and (tmp_path / "build" / PROBE.name).is_file()
        sweep.publish([PROBE], {"X": 3}, root=tmp_path)
        other = tmp_path / "build" / "unpublished" / PROBE.stem / "sweep"
        assert pd.read_parquet(other / "results" / "99_probe" / "values.parquet").x.tolist() == [3, 3]
        assert pd.read_parquet(tmp_path / "data" / "results" / "99_probe" / "values.parquet").x.tolist() == [1, 1]


def test_two_node_cluster_on_this_machine(tmp_path):
    """`ray start --head` and a second `ray start --address` (one CPU and one timing slot each), then
    the sweep's command line with --address: a timed two-point sweep runs one point on each node.
    The nodes and the driver (fresh processes: Ray caches its token per process) share a fresh token
    for Ray's token authentication, so nothing depends on ~/.ray."""
    import os
    import secrets

    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    ray_cli = str(Path(sys.executable).with_name("ray"))
    port = free_port()
    node = ["--num-cpus", "1", "--resources", json.dumps({sweep.RESOURCE: 1}), "--disable-usage-stats"]
    try:
        subprocess.run(
            [ray_cli, "start", "--head", "--port", str(port), "--include-dashboard", "false", *node],
            check=True,
            capture_output=True,
            timeout=180,
            env=env,
        )
        subprocess.run(
            [ray_cli, "start", "--address", f"127.0.0.1:{port}", *node],
            check=True,
            capture_output=True,
            timeout=180,
            env=env,
        )
        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "speclib.workbook.sweep",
                str(PROBE),
                "--grid",
                "X=1,2",
                "--name",
                "two",
                "--out",
                str(tmp_path),
                "--address",
                f"127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=REPO,
        )
    finally:
        subprocess.run([ray_cli, "stop", "--force"], capture_output=True, timeout=180, env=env)
    print(cli.stdout)
    assert cli.returncode == 0, cli.stderr[-3000:]
    runs = pd.read_parquet(tmp_path / "two" / "runs.parquet")
    print(runs[["point", "status", "seconds", "node", "host", "cpus"]].to_string(index=False))
    assert runs.status.tolist() == ["done", "done"], runs.error.tolist()
    assert runs.node.nunique() == 2 and (runs.cpus == 1).all()
    assert len(pd.read_parquet(tmp_path / "two" / "tables" / "99_probe" / "values.parquet")) == 4


@needs_shipped
def test_smoke_sweep_of_a_workbook_notebook(tmp_path):
    """One SMOKE point of notebook 05 (stock torch only: the other runtimes' exports take a minute a
    point) on local Ray, started and stopped by the sweep itself. Combining several points' tables is
    checked on the probe notebook (TestOnOneLocalRay); a second real point would only add a minute."""
    import ray

    fixed = {"SMOKE": True, "BACKENDS": ["torch", "serial:torch"], "REAL_MODEL": ""}  # "": no section 7
    runs = sweep.run_sweep(
        REPO / "notebooks" / "05_backend_latency.ipynb",
        {"SEED": [1]},
        fixed,
        name="smoke",
        out=tmp_path,
        progress=False,
    )
    assert not ray.is_initialized()
    assert runs.status.tolist() == ["done"], runs.error.tolist()
    assert {"point", "SEED", "params", "seconds", "node", "host", "node_cpus", "cpus"} <= set(runs.columns)
    s = tmp_path / "smoke"
    assert (s / "SEED-1" / "05_backend_latency.ipynb").is_file()
    assert list((s / "SEED-1" / "results" / "05_backend_latency").glob("*.parquet"))
    tables = sorted((s / "tables" / "05_backend_latency").glob("*.parquet"))
    assert tables
    for t in tables:
        df = pd.read_parquet(t)
        assert set(df.SEED) == {1} and set(df.point) == {"SEED-1"}, t.name
