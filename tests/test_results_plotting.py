"""Tests for speclib.workbook.results and speclib.workbook.plotting; everything is written under pytest's tmp_path,
never into the real data/ or figures/ folders."""

import numpy as np
import pandas as pd
import pytest

from speclib.core.device import REPO
from speclib.workbook import plotting, results


@pytest.fixture(autouse=True)
def committed_results(monkeypatch):
    """Read the committed data/results, whatever an earlier test (a Study run) left in SPECLIB_OUT."""
    monkeypatch.delenv("SPECLIB_OUT", raising=False)


def _df():
    return pd.DataFrame(
        {"method": ["ar", "sd", "sd"], "k": [0, 4, 8], "seed": [0, 0, 0], "tokens_per_s": [10.5, 21.25, 19.0]}
    )


def test_save_load_roundtrip(tmp_path):
    df = _df()
    p = results.save(df, "01_baseline/speed", root=tmp_path)
    assert p == tmp_path / "01_baseline" / "speed.parquet" and p.is_file()
    assert "git_sha" not in df.columns  # the caller's frame is not modified
    back = results.load("01_baseline/speed", root=tmp_path)
    pd.testing.assert_frame_equal(back.drop(columns="git_sha"), df)
    assert (back["git_sha"] == results.git_sha()).all()
    assert "saved_at" not in back.columns
    assert list(tmp_path.rglob("*.tmp")) == []  # the temp file was renamed away
    assert results.available(root=tmp_path) == ["01_baseline/speed"]


def test_save_is_reproducible(tmp_path):
    p = results.save(_df(), "x/a", root=tmp_path)
    first = p.read_bytes()
    results.save(_df(), "x/a", root=tmp_path)
    assert p.read_bytes() == first


def test_load_missing_lists_available(tmp_path):
    results.save(_df(), "01_baseline/speed", root=tmp_path)
    results.save(_df(), "02_cache/accept", root=tmp_path)
    with pytest.raises(ValueError, match=r"available: 01_baseline/speed, 02_cache/accept"):
        results.load("01_baseline/nope", root=tmp_path)


@pytest.mark.parametrize("name", ["", "/abs", "a/../b", "a/b.parquet", "a//b", "a b", 3])
def test_bad_result_names(tmp_path, name):
    with pytest.raises(ValueError, match="name"):
        results.save(_df(), name, root=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_save_rejects_non_dataframe(tmp_path):
    with pytest.raises(TypeError, match="df"):
        results.save({"a": [1]}, "x/a", root=tmp_path)


def _figure():
    import matplotlib.pyplot as plt

    plotting.style()
    fig, ax = plt.subplots(figsize=(4, 3))
    x = np.linspace(0, 1, 50)
    ax.plot(x, x**2, label="x²")
    ax.set(title="speedup", xlabel="acceptance", ylabel="tokens/s")
    ax.legend()
    return fig


def test_savefig_writes_identical_bytes(tmp_path):
    import matplotlib.pyplot as plt

    fig = _figure()
    paths = plotting.savefig(fig, "01_baseline_speed", root=tmp_path)
    assert paths == [tmp_path / "01_baseline_speed.png", tmp_path / "01_baseline_speed.pdf"]
    first = [p.read_bytes() for p in paths]
    assert first[0].startswith(b"\x89PNG") and first[1].startswith(b"%PDF")
    plt.close(fig)
    fig2 = _figure()  # a fresh figure with the same numbers
    plotting.savefig(fig2, "01_baseline_speed", root=tmp_path)
    plt.close(fig2)
    assert [p.read_bytes() for p in paths] == first
    assert b"CreationDate" not in first[1] and b"Producer" not in first[1]


@pytest.mark.parametrize("name", ["a/b", "a.png", "", "x y", None])
def test_savefig_bad_names(tmp_path, name):
    import matplotlib.pyplot as plt

    fig = plt.figure()
    with pytest.raises(ValueError, match="name"):
        plotting.savefig(fig, name, root=tmp_path)
    plt.close(fig)
    assert list(tmp_path.iterdir()) == []


def test_default_roots_follow_speclib_out_at_call_time(tmp_path, monkeypatch):
    """SPECLIB_OUT is read when a function runs, not when the module was imported (it already was)."""
    import matplotlib.pyplot as plt

    monkeypatch.setenv("SPECLIB_OUT", str(tmp_path / "a"))
    assert results.root() == tmp_path / "a" / "results" and plotting.root() == tmp_path / "a" / "figures"
    monkeypatch.setenv("SPECLIB_OUT", str(tmp_path / "b"))
    assert results.save(_df(), "x/speed") == tmp_path / "b" / "results" / "x" / "speed.parquet"
    assert results.available() == ["x/speed"] and len(results.load("x/speed")) == 3
    fig = plt.figure()
    assert plotting.savefig(fig, "x_speed")[0] == tmp_path / "b" / "figures" / "x_speed.png"
    plt.close(fig)
    monkeypatch.delenv("SPECLIB_OUT")
    assert results.root() == REPO / "data" / "results" and plotting.root() == REPO / "figures"


def test_import_picks_no_backend(monkeypatch):
    """Re-importing plotting as in a fresh process (no backend chosen yet) leaves the choice to matplotlib."""
    import importlib

    import matplotlib

    monkeypatch.setattr(matplotlib, "get_backend", lambda *a, **k: None)
    monkeypatch.setattr(matplotlib.rcParams, "_get_backend_or_none", lambda: None, raising=False)
    monkeypatch.setattr(matplotlib, "use", lambda *a, **k: pytest.fail("importing plotting switched the backend"))
    importlib.reload(plotting)


def test_report_sweep_rows_figure_and_support_table(tmp_path):
    """The README's sweep rows, sweep figure and support-matrix table, from the committed files: one row
    per model pair, a figure file per format, one table line per checked family group."""
    from speclib.workbook import report

    pooled, _ = report._pairs_tables()
    rows = report._rows_sweeps()
    assert len(rows) == pooled.pair.nunique() == 2 and all("HVD (ours)" in m for m, _, _ in rows)
    paths = report.draw_pairs_sweep(root=tmp_path)
    assert [p.suffix for p in paths] == [".png", ".pdf"] and all(p.stat().st_size > 10_000 for p in paths)
    matrix = results.load("support_matrix")
    lines = report.support_table().splitlines()
    checked = matrix[matrix.chains.notna()]
    assert sum(line.split("|")[1].count(",") + 1 for line in lines[2:] if line.startswith("| ")) == len(checked)
    assert sum(line.startswith("- ") for line in lines) == matrix.chains.isna().sum()
