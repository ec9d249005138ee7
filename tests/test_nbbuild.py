"""Every committed notebook is what tools/nbbuild.py builds from its source in notebooks/src/: an edit made
in JupyterLab and not carried back to the source (or the reverse) fails here."""

import sys
from pathlib import Path

import nbformat
import pytest

from speclib.core.device import REPO

sys.path.insert(0, str(REPO / "tools"))
import nbbuild  # noqa: E402

SOURCES = sorted((REPO / "notebooks" / "src").glob("[0-9][0-9]_*.py"))


def test_every_notebook_has_a_source():
    built = {p.stem for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    assert built == {p.stem for p in SOURCES}


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_notebook_rebuilds_from_its_source(src: Path, tmp_path):
    nbbuild.build(str(src), str(tmp_path / "nb.ipynb"))
    fresh = nbformat.read(tmp_path / "nb.ipynb", 4)
    committed = nbformat.read(REPO / "notebooks" / f"{src.stem}.ipynb", 4)
    assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in fresh.cells], (
        f"notebooks/{src.stem}.ipynb differs from its source: "
        f"python tools/nbbuild.py {src.relative_to(REPO)} notebooks/{src.stem}.ipynb"
    )
    assert committed.metadata == fresh.metadata
    assert all(not c.get("outputs") for c in committed.cells), "committed notebooks carry no outputs"


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_notebook_sets_its_torch_threads(src: Path):
    """torch's default, one thread per core, ignores $SPECLIB_THREADS: under `make test` (two workers at one
    thread each) a notebook that keeps it oversubscribes the cores, and notebook 04's smoke run took 723 s
    instead of 100 s. Every notebook sets its threads (speclib.core.device.set_threads, or torch directly)."""
    code = src.read_text()
    assert "set_threads(" in code or "torch.set_num_threads(" in code


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_notebook_reads_as_prose(src: Path):
    """The shape the notebooks are held to (tools/notebook_shape.py prints it): no more code than 1.5 times
    the markdown, no code cell over 40 lines besides the parameters cell, no function defined in a notebook
    (logic lives in speclib, written once)."""
    import notebook_shape

    s = notebook_shape.shape(src)
    assert s["ratio"] <= 1.5, s
    assert s["cells_over_40"] == 0, s
    assert s["defs"] == 0, s
