"""The roofline's arithmetic exactly, and its measurements shaped right (their speed is not asserted)."""

from types import SimpleNamespace

import pandas as pd
import pytest

from speclib.research import roofline

SMOLLM2 = SimpleNamespace(  # SmolLM2-135M's config
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    vocab_size=49152,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
)


def test_smollm2s_footprint_is_269_mflop_and_538_mb_of_float32_weights_per_token():
    fp = roofline.model_footprint(SMOLLM2)
    per_layer = 576 * 576 + 2 * 576 * 192 + 576 * 576 + 3 * 576 * 1536  # q, k and v (3 kv heads), o; gate, up, down
    assert fp["matmul_params"] == 30 * per_layer + 576 * 49152  # the tied LM head is read once per token too
    assert fp["flops_per_token"] / 1e6 == pytest.approx(269.0, abs=0.1)
    assert fp["float32_bytes"] / 1e6 == pytest.approx(537.9, abs=0.1)
    assert fp["q4_0_bytes"] == fp["float32_bytes"] * 4.5 / 32
    no_gqa = roofline.model_footprint(SimpleNamespace(**{**vars(SMOLLM2), "num_key_value_heads": 9}))
    assert no_gqa["matmul_params"] - fp["matmul_params"] == 30 * 2 * 576 * (576 - 192)


def test_token_bound_is_the_slower_of_reading_and_computing():
    b = roofline.token_bound(weight_bytes=1e9, flops=1e9, gb_per_s=10, gflop_per_s=100)
    assert b == dict(memory_s=0.1, compute_s=0.01, bound_s=0.1, bound_by="memory")
    assert roofline.token_bound(1e6, 1e12, 10, 100)["bound_by"] == "compute"


def test_bounds_read_the_copy_bandwidth_and_the_decode_shaped_throughput():
    bw = pd.DataFrame(dict(kernel=["copy", "scale"], threads=[1, 1], median=[20.0, 99.0]))
    tp = pd.DataFrame(
        dict(dtype=["float32", "float32", "int8"], m=[32, 1024, 32], threads=[1, 1, 1], median=[50.0, 999.0, 200.0])
    )
    b = roofline.bounds(roofline.model_footprint(SMOLLM2), bw, tp).set_index("format")
    assert set(b.index) == {"float32", "int8", "q4_0"}  # no bfloat16 measured: no bfloat16 row
    assert (b.gb_per_s == 20.0).all() and b.gflop_per_s["float32"] == 50.0 and b.gflop_per_s["q4_0"] == 200.0
    assert b.memory_s["float32"] == pytest.approx(537.9e6 / 20e9, rel=1e-3)


def test_measurements_return_positive_rates_per_kernel_and_dtype():
    bw = roofline.bandwidth(threads=1, megabytes=4, repeats=2)
    assert list(bw.kernel) == ["copy", "scale"] and (bw["median"] > 0).all() and (bw.lo <= bw.hi).all()
    tp = roofline.throughput(threads=1, shapes=[(32, 64, 64)], repeats=2)
    assert list(tp.dtype) == ["float32", "bfloat16", "int8"] and (tp["median"] > 0).all()


def test_linear_widths_times_each_path_at_each_width():
    t = roofline.linear_widths(16, 32, widths=(1, 4), repeats=2)
    assert set(t.width) == {1, 4} and "F.linear" in set(t.path) and (t["median"] > 0).all()
    assert len(t) == 2 * t.path.nunique()


def test_each_backend_is_bounded_by_its_weight_format():
    fmt = {b: roofline.weight_format(b) for b in ("torch", "torch-bf16", "torch-int8", "torch-w8a8", "openvino",
                                                  "openvino-int8", "llamacpp-q8_0", "llamacpp-q4_0", "llamacpp-f16")}  # fmt: skip
    assert fmt == dict(torch="float32", **{"torch-bf16": "bfloat16", "torch-int8": "int8", "torch-w8a8": "int8",
                       "openvino": "float32", "openvino-int8": "int8", "llamacpp-q8_0": "int8",
                       "llamacpp-q4_0": "q4_0", "llamacpp-f16": "bfloat16"})  # fmt: skip


def test_backend_passes_times_every_backend_at_every_width_round_robin():
    from conftest import tiny_lm

    lms = {"torch": tiny_lm(impl="fast"), "torch-mkl": tiny_lm(impl="fast", seed=1)}
    t = roofline.backend_passes(lms, widths=(1, 3), rounds=2, repeats=2)
    assert list(zip(t.backend, t.n)) == [("torch", 1), ("torch", 3), ("torch-mkl", 1), ("torch-mkl", 3)]
    assert (t["median"] > 0).all() and (t.lo <= t["median"]).all() and (t["median"] <= t.hi).all()
    assert set(t.repeats) == {2}  # rounds, each a median over its repeats
