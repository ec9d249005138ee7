"""Every notebook, SMOKE=True, through papermill; its results must exist and make sense.
Outputs go to a temporary folder (SPECLIB_OUT), never to the committed data/ and figures/."""
import os
from pathlib import Path

import pandas as pd
import pytest

from conftest import needs_shipped

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLIB_OUT", str(tmp_path))
    return tmp_path


def test_unknown_parameter_is_refused(out):
    from speclib.notebooks import run
    with pytest.raises(ValueError, match="unknown parameter.*K_MAXX"):
        run(REPO / "notebooks/01_baseline.ipynb", out / "x.ipynb", {"K_MAXX": 3})
    assert not (out / "x.ipynb").exists()


@needs_shipped
def test_01_baseline_smoke(out):
    from speclib.notebooks import run
    run(REPO / "notebooks/01_baseline.ipynb", out / "01.ipynb", {"SMOKE": True})
    res = out / "results" / "01_baseline"
    exact = pd.read_parquet(res / "exact_math.parquet")
    assert exact[exact.rule == "lossless"].max_abs_error.dropna().max() < 1e-9
    assert exact[exact.rule == "lossless"].max_tv.dropna().max() < 1e-9
    ident = pd.read_parquet(res / "identity.parquet")
    assert (ident.identical == ident["of"]).all()
    speed = pd.read_parquet(res / "speedup.parquet")
    assert set(speed["mode"]) == {"greedy", "temperature 1"} and speed.speedup.gt(0).all()
    assert speed.alpha.between(0, 1).all()
    chi = pd.read_parquet(res / "chi2.parquet")
    assert chi[chi.method == "speclib"].p.between(0, 1).all()
    for name in ["exact_math", "chi2", "speedup", "acceptance", "assisted"]:
        assert (out / "figures" / f"01_baseline_{name}.png").stat().st_size > 10_000
