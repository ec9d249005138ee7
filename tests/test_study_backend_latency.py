"""Notebook 05's derived tables rebuilt from its committed step tables, and its helpers on awkward inputs."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from speclib.lms import backends
from speclib.research.studies import backend_latency as bl

ROOT = Path(__file__).resolve().parents[1] / "data" / "results"
RES = ROOT / "05_backend_latency"
META = ["seed", "device", "target", "draft", "threads", "smoke"]
SPLITS = ["pilot", "report"]
needs_results = pytest.mark.skipif(not (RES / "runs.parquet").is_file(), reason="no committed results")


def step(table: str) -> pd.DataFrame:
    """A committed step table, as the Study hands it back (git_sha included)."""
    return pd.read_parquet(RES / f"{table}.parquet")


def committed(table: str) -> pd.DataFrame:
    return pd.read_parquet(RES / f"{table}.parquet").drop(columns="git_sha")


def meta_of(df: pd.DataFrame) -> dict:
    return {k: df[k].iloc[0] for k in META}


def assert_saved(rebuilt: pd.DataFrame, table: str, own: tuple[str, ...] = ()):
    """`rebuilt`, with the notebook's meta columns (but the table's `own` columns), equals the committed table."""
    saved = committed(table)
    rebuilt = rebuilt.drop(columns="git_sha", errors="ignore")  # a step table's, carried by a merge
    meta = {k: v for k, v in meta_of(saved).items() if k not in own}
    pd.testing.assert_frame_equal(rebuilt.assign(**meta), saved, check_dtype=False)


@pytest.fixture(scope="module")
def speed():
    """The committed speedup table, as the notebook holds it before saving (its own rebuild is tested below)."""
    return committed("speedup").drop(columns=META)


@pytest.fixture(scope="module")
def best(speed):
    report = speed[speed.split == "report"].reset_index(drop=True)
    return report[report.chosen].reset_index(drop=True)


@needs_results
def test_latency_classes_rebuilt():
    assert_saved(bl.latency_shapes(step("latency")), "classes")


@needs_results
def test_threads_summary_rebuilt():
    summary = bl.threads_summary(step("threads"))
    assert list(summary.threads) == [1, 2]
    assert_saved(summary, "threads_summary", own=("threads",))  # its thread counts, not the notebook's THREADS


@needs_results
def test_speedup_table_rebuilt():
    """Rebuilt for two configurations (the bootstrap is the slow part): each one's rows depend on its own
    runs only, the K chosen included."""
    runs, saved = step("runs"), committed("speedup")
    configs = list(runs.config.unique())
    configs = [configs[0], configs[-1]]
    profile = step("profile").drop(columns=META + ["git_sha"])
    speed = bl.speedups(runs[runs.config.isin(configs)], profile, SPLITS, seed=int(runs.seed.iloc[0]))
    saved = saved[saved.config.isin(configs)].reset_index(drop=True)
    pd.testing.assert_frame_equal(speed.assign(**meta_of(saved)), saved, check_dtype=False)
    assert speed.groupby("config").chosen.sum().eq(2).all()  # the pilot's K, marked in both splits


@needs_results
def test_causes_rebuilt(best):
    assert_saved(bl.cost_causes(best, step("latency")), "causes")


@needs_results
def test_break_even_rebuilt(best):
    lat, ks = step("latency"), sorted(step("profile").K.unique())
    tv = bl.target_curves(lat, lat.prefix.iloc[0])
    assert_saved(bl.break_even_map(tv, ks, best.c.max()).table(), "break_even")


@needs_results
def test_agreement_and_seed_comparison_rebuilt(speed, best):
    assert_saved(bl.agreement(speed, step("width")), "agreement")
    assert_saved(bl.seed_comparison(best), "seed_comparison")


@needs_results
def test_prose_reads_the_tables(speed, best):
    """Every prose helper runs on the committed tables and quotes their numbers."""
    lat, width, ks = step("latency"), step("width"), sorted(step("profile").K.unique())
    top = bl.top_config(best)
    assert f"**{top.speedup:.2f}x**" in bl.speedup_prose(speed)
    assert "At a 128-token prefix" in bl.latency_prose(bl.latency_shapes(lat), 128, lat.n.max())
    assert f"{width.max_abs_diff.max():.2g}" in bl.width_prose(width)
    cause = bl.cost_causes(best, lat)
    assert all(c in bl.causes_prose(cause) for c in cause[cause.decelerates].config)
    tv = bl.target_curves(lat, 128)
    bmap = bl.break_even_map(tv, ks, best.c.max())
    text = bl.break_even_prose(bmap.table(), best, tv, ks, bmap.alphas.max())
    assert f"of {len(best)} configurations on the side of their curve" in text


@needs_results
def test_compare_with_01_on_committed_results(speed):
    path = ROOT / "01_baseline" / "speedup.parquet"
    if not path.is_file():
        pytest.skip("no committed results of notebook 01")
    report = speed[speed.split == "report"].reset_index(drop=True)
    meta = meta_of(committed("speedup"))
    vs01, text = bl.compare_with_01(pd.read_parquet(path), report, meta, "05_backend_latency")
    assert list(vs01.notebook) == ["01_baseline", "05_backend_latency"] and vs01.K.nunique() == 1
    assert text.startswith(f"At K = {vs01.K.iloc[0]} ")


def test_compare_with_01_says_why_it_cannot():
    report = pd.DataFrame(dict(config=["onnx ← onnx"], K=[1], chosen=[True]))
    meta = dict(threads=1, device="cpu", smoke=False)
    assert bl.compare_with_01(None, report, meta, "05")[0] is None
    vs01, text = bl.compare_with_01(pd.DataFrame(dict(K=[1])), report, meta, "05")
    assert vs01 is None and "no column(s) mode, split" in text
    full = pd.DataFrame({c: [1] for c in bl.NEED_01})
    vs01, text = bl.compare_with_01(full, report, meta, "05")
    assert vs01 is None and "not among this run's CONFIGS" in text


def test_runtime_and_backend_names():
    assert bl.runtime("serial:torch") == "torch" and bl.runtime("onnx-int8") == "onnx-int8"
    names = bl.backend_names(["onnx", "torch"], [["torch", "llamacpp-q8_0"], ["onnx", "onnx"]])
    assert names == ["onnx", "torch", "llamacpp-q8_0"]


def test_smoke_backends_keeps_only_what_backends_names():
    kept, configs = bl.smoke_backends(["serial:torch", "torch", "onnx"])
    assert kept == ["torch", "serial:torch"]  # in SMOKE's order, not the caller's
    assert configs == [["torch", "torch"], ["serial:torch", "torch"]]
    assert bl.smoke_backends([]) == ([], [])


def test_plan_rejects_an_unknown_backend_before_loading_anything():
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        bl.plan("no-such-target", "no-such-draft", "cpu", ["torch"], [["tpu", "torch"]], False, "auto")


def test_unavailable_names_a_pair_that_is_not_llama():
    rts = bl.Runtimes.__new__(bl.Runtimes)  # without loading: only `kinds` is read
    rts.kinds = {"a": "qwen3", "b": "llama"}
    assert bl.Runtimes.unavailable(rts, "serial:torch") is None
    if not backends.missing("torch-int8"):
        assert "needs a Llama checkpoint" in bl.Runtimes.unavailable(rts, "torch-int8")
    with pytest.raises(ValueError, match="backend 'torch-int8'"):
        bl.Runtimes.require(rts, ["torch-int8", "torch"])


def curve(ratios, t1=1e-3):
    n = np.arange(1, len(ratios) + 1)
    return pd.DataFrame(dict(n=n, ratio=ratios, seconds=t1 * np.asarray(ratios)))


def test_classify_on_awkward_curves():
    flat = bl.classify(curve([1.0, 1.0]))
    assert flat.kind == "parallel" and flat.slope == pytest.approx(0.0) and flat.biggest_step == "1→2: +0%"
    serial = bl.classify(curve([1.0, 2.0, 3.0, 4.0]).iloc[::-1])  # unsorted rows
    assert serial.kind == "serial" and serial.biggest_step == "1→2: +100%" and serial.ratio_at_max == 4.0
    partly = bl.classify(curve([1.0, 1.1, 1.2, 2.5]))
    assert partly.kind == "partly parallel" and partly.biggest_step == "3→4: +108%"


def test_cheap_sizes_needs_every_round():
    rows = [
        dict(round=r, n=n, seconds=s)
        for r, secs in enumerate([[1.0, 3.0, 2.0, 4.0], [1.0, 3.0, 3.5, 2.9]])
        for n, s in enumerate(secs, start=1)
    ]
    # n = 3 beats n = 2 in round 0 only, n = 4 beats n = 2 and 3 in round 1 only: neither is reliably cheap
    assert bl.cheap_sizes(pd.DataFrame(rows)) == []
    rows[6]["seconds"] = 2.8  # round 1's n = 3 now beats its n = 2 too
    assert bl.cheap_sizes(pd.DataFrame(rows)) == [3]


def test_break_even_map_on_a_serial_and_a_flat_runtime():
    n = np.arange(1, 10)
    tv = pd.concat(
        [
            pd.DataFrame(dict(backend="flat", n=n, ratio=1.0)),
            pd.DataFrame(dict(backend="serial", n=n, ratio=n.astype(float))),
        ]
    )
    bmap = bl.break_even_map(tv, range(1, 9), c_max=0.1)
    table = bmap.table().set_index(["backend", "alpha"]).max_c
    assert (table.loc["serial"] == 0.0).all()  # v(K) = K + 1: E < K + 1 for any α < 1
    assert table.loc["flat"].is_monotonic_increasing and table.loc["flat", 0.9] > table.loc["flat", 0.5] > 0
    assert np.isnan(bl.map_speedup(tv, [20], 0.8, 0.01, "flat"))  # no v(K + 1) measured for any K
    assert bl.map_speedup(tv, range(1, 9), 0.8, 0.0, "flat") > 1


def test_agreement_prose_skips_a_missing_width_check():
    speed = pd.DataFrame(
        dict(config=["a ← a", "a ← a", "s ← a"], target_backend=["a", "a", "s"], identical=[2, 3, 4], of=[3, 3, 4])
    )
    width = pd.DataFrame(dict(backend=["a"], max_abs_diff=[0.25], argmax_differs=[0.0]))
    agree = bl.agreement(speed, width)
    assert list(agree.agreement) == [5 / 6, 1.0]
    assert bl.agreement_prose(agree) == (
        "a ← a: SD = AR on 5 / 6 runs (8-token vs one-token passes: max |Δ logit| 0.25); s ← a: SD = AR on 4 / 4 runs."
    )


def test_width_prose_when_no_token_differs():
    width = pd.DataFrame(dict(backend=["x", "y"], max_abs_diff=[1e-6, 2e-3], argmax_differs=[0.0, 0.0]))
    assert bl.width_prose(width).endswith(
        "from 1e-06 (x) to 0.002 (y); the greedy token differs at no position on any backend."
    )
