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


@needs_shipped
def test_03_tree_hybrid_smoke(out):
    from speclib.notebooks import run
    run(REPO / "notebooks/03_tree_hybrid.ipynb", out / "03.ipynb", {"SMOKE": True})
    res = out / "results" / "03_tree_hybrid"
    layer = pd.read_parquet(res / "layer.parquet")
    assert (layer.materialize_bytes > layer.closed_form_fp32_bytes).all()
    qwen = layer[layer.dk == 128]
    assert (qwen.memory_ratio_bf16 > 120).all()          # K·V·2/(K+V+1) = 127.5 at K = V = 128
    verify = pd.read_parquet(res / "verify.parquet")
    assert set(verify.strategy) == {"closed_form", "materialize", "replay"} and verify.seconds.gt(0).all()
    budget = pd.read_parquet(res / "budget.parquet")
    assert budget.groupby("batch").chosen.sum().eq(1).all()
    decode = pd.read_parquet(res / "decode.parquet")
    assert (decode.identical == decode["of"]).all()      # every SD output equals AR, batch 1 and batch > 1
    assert set(decode.batch) == {1, 2}
    self_spec = pd.read_parquet(res / "selfspec.parquet")
    assert self_spec.acceptance_rate.between(0, 1).all()
    for name in ["layer", "verify", "budget", "decode", "selfspec"]:
        assert (out / "figures" / f"03_tree_hybrid_{name}.png").stat().st_size > 10_000


@needs_shipped
def test_02_cache_hybrid_smoke(out):
    from speclib.notebooks import run
    run(REPO / "notebooks/02_cache_hybrid.ipynb", out / "02.ipynb", {"SMOKE": True})
    res = out / "results" / "02_cache_hybrid"
    speed = pd.read_parquet(res / "speedup.parquet")
    assert {"model", "prompt lookup", "suffix", "ArcticInference rule", "SAM rule", "HVD (ours)",
            "oracle (hindsight)"} <= set(speed.policy)
    assert (speed.identical == speed["of"]).all()               # greedy identity for every policy
    pred = pd.read_parquet(res / "predictor.parquet")
    assert pred.spearman.between(-1, 1).all() and (pred.mae >= 0).all()
    logs = pd.read_parquet(res / "cache_logs.parquet")
    assert (logs.accepted <= logs.draft_len).all() and (logs.predicted <= logs.draft_len + 1e-9).all()
    for name in ["predictor", "payoff", "speedup"]:
        assert (out / "figures" / f"02_cache_hybrid_{name}.png").stat().st_size > 10_000


@pytest.mark.skipif(not {"math-target", "math-draft"} <= set(__import__("speclib").checkpoints()),
                    reason="math pair missing (python -m speclib.train model math-target / math-draft)")
def test_04_cospec_rl_smoke(out):
    from speclib.notebooks import run
    run(REPO / "notebooks/04_cospec_rl.ipynb", out / "04.ipynb", {"SMOKE": True})
    res = out / "results" / "04_cospec_rl"
    m = pd.read_parquet(res / "methods.parquet").set_index("method")
    assert {"target AR", "draft AR", "lossless SD", "AutoJudge (classifier)", "CoSpec (RL)",
            "oracle branch choice"} <= set(m.index)
    assert m.accuracy.between(0, 1).all()
    assert m.diff_vs_target["lossless SD"] == 0                 # greedy lossless SD is the target's output
    assert m.accuracy["oracle branch choice"] >= m.accuracy["target AR"]
    assert (m.same_as_batched.dropna() > 0.5).all()             # the real loop reproduces the batched process
    assert m.speedup.dropna().gt(0).all()
    curve = pd.read_parquet(res / "rl_curve.parquet")
    assert len(curve) >= 2 and curve.accuracy.between(0, 1).all()
    for name in ["rl_curve", "pareto", "policy"]:
        assert (out / "figures" / f"04_cospec_rl_{name}.png").stat().st_size > 10_000


@needs_shipped
def test_05_backend_latency_smoke(out):
    """Runs whichever of the smoke backends are installed (llama.cpp is optional: `make figures` installs it)."""
    from speclib.notebooks import run
    run(REPO / "notebooks/05_backend_latency.ipynb", out / "05.ipynb", {"SMOKE": True})
    res = out / "results" / "05_backend_latency"
    lat = pd.read_parquet(res / "latency.parquet")
    assert {"torch", "torch-int8", "serial:torch"} <= set(lat.backend) and lat.seconds.gt(0).all()
    assert (lat[lat.n == 1].ratio == 1).all()
    speed = pd.read_parquet(res / "speedup.parquet")
    assert speed.speedup.gt(0).all() and speed.alpha.between(0, 1).all() and speed.predicted.gt(0).all()
    fp32 = speed[speed.target_backend.isin(["torch", "serial:torch"])]
    assert (fp32.identical == fp32["of"]).all()                  # fp32 greedy SD reproduces AR
    serial = speed[speed.target_backend == "serial:torch"]
    assert (serial.v > 1 + 0.5 * serial.K).all()                 # forced serial verification: v(K) grows with K
    causes = pd.read_parquet(res / "causes.parquet")
    assert set(causes.dominant_cause) <= {"draft too slow relative to target", "verification not parallel"}
    for name in ["latency", "predicted_vs_measured", "break_even"]:
        assert (out / "figures" / f"05_backend_latency_{name}.png").stat().st_size > 10_000
