"""The support matrix (speclib/workbook/support.py) family by family, and StatefulLM's snapshot-replay against the
slow obvious twin: a fresh full forward over the whole sequence."""

import random

import pytest
import torch

from speclib.lms.stateful import StatefulLM
from speclib.workbook import support

CHECKED = [f for f, spec in support.FAMILIES.items() if not isinstance(spec, str)]
STATEFUL = {
    "mamba2",
    "falcon_h1",
    "bamba",
    "jamba",
    "zamba2",
    "granitemoehybrid",
    "nemotron_h",
    "lfm2",
    "minimax",
    "kimi_linear",
    "mamba",
    "falcon_mamba",
    "zamba",
    "lfm2_moe",
    "olmo_hybrid",
    "lfm3",
    "zaya",
    "lara_mini",
    "inkling_text",
    "inkling2_text",
    "inkling2_loop_text",
    "qwen4_exp_text",
    "bailing_hybrid",
}
HYBRID = {"qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"}  # speclib's own Gated DeltaNet forward
# Families whose trees must be refused: recurrent states (StatefulLM) or sliding-window attention layers.
NO_TREES = STATEFUL | {"mistral", "gemma2", "gemma3_text"}
LM_CLASS = {f: "StatefulLM" for f in STATEFUL} | {f: "HybridLM" for f in HYBRID} | {"llama": "LlamaLM"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("support")


@pytest.mark.parametrize("family", CHECKED)
def test_family(family, folder):
    row = support.check(family, folder)
    assert row["note"] is None, row["note"]
    assert row["lm_class"] == LM_CLASS.get(family, "HFLM")
    assert row["chains"] == "ok"
    assert row["sampling"] == "ok"
    assert row["vocab_check"] == "ok"
    if family in NO_TREES:
        assert row["trees"].startswith("unsupported:"), row["trees"]
    else:
        assert row["trees"] == "ok"
    assert row["batched"] == ("yes" if family in HYBRID | {"llama"} else "no")  # LlamaLM.extend_batch
    if family in STATEFUL:
        serial = family in {"jamba", "mamba", "falcon_mamba", "zamba"}
        assert row["strategy"] == "snapshot-replay" + (" (serial)" if serial else "")
    assert 0 <= row["sd_acceptance"] <= 1  # both commit paths are also checked directly in check_chains


def test_qwen3_5_multimodal_checkpoint_loads_as_hybrid(folder):
    assert support.check_qwen3_5_multimodal(folder) == "ok"


# --- StatefulLM on its own -------------------------------------------------------------------------
def fresh(lm, ids):
    return support.fresh_logits(lm, ids)


# layer snapshots; whole-cache deepcopy (MiniMaxCache); one token per pass (Jamba's scan restarts from zero)
@pytest.fixture(scope="module", params=["bamba", "minimax", "jamba"])
def stateful(request):
    return StatefulLM(support.tiny_model(request.param), None, torch.device("cpu"))


@pytest.mark.parametrize("seed", range(3))
def test_random_chains_partial_and_full_accept(stateful, seed):
    rnd = random.Random(seed)
    lm = stateful
    committed = [rnd.randrange(support.V) for _ in range(rnd.randint(1, 9))]
    assert torch.allclose(lm.reset(committed), fresh(lm, committed), atol=1e-4)
    for _ in range(5):
        chain = []
        for _ in range(rnd.randint(1, 3)):  # a chain built over several extends
            new = [rnd.randrange(support.V) for _ in range(rnd.randint(1, 4))]
            logits = lm.extend(new, list(range(len(chain) - 1, len(chain) + len(new) - 1)))
            chain += new
            for j in range(len(new)):
                ids = committed + chain[: len(chain) - len(new) + j + 1]
                assert torch.allclose(logits[j], fresh(lm, ids), atol=1e-4), (seed, j)
        keep = rnd.choice([len(chain), rnd.randrange(len(chain) + 1)])  # full accept half the time
        lm.commit(list(range(keep)))
        committed += chain[:keep]
        assert lm.n_committed == len(committed)
    t = rnd.randrange(support.V)
    assert torch.allclose(lm.extend([t], [-1])[0], fresh(lm, committed + [t]), atol=1e-4)
    lm.commit([])


def test_commit_nothing_restores(stateful):
    lm = stateful
    lm.reset([1, 2, 3])
    lm.extend([4, 5, 6], [-1, 0, 1])
    lm.commit([])
    assert lm.n_committed == 3
    assert torch.allclose(lm.extend([7], [-1])[0], fresh(lm, [1, 2, 3, 7]), atol=1e-4)
    lm.commit([0])
    lm.commit([])  # nothing pending: a no-op
    assert torch.allclose(lm.extend([8], [-1])[0], fresh(lm, [1, 2, 3, 7, 8]), atol=1e-4)


@pytest.mark.parametrize("family", ["jamba", "zamba", "mamba", "falcon_mamba"])
def test_serial_probe_finds_restarting_scans(family):
    """These Mamba-1 scans ignore the cached state on a multi-token input: the probe itself (not only
    SERIAL_TYPES) must catch it in fp32, or extends would be silently wrong on look-alike models."""
    import inspect

    from speclib.lms.stateful import _multi_token_probe

    model = support.tiny_model(family)
    takes_positions = "position_ids" in inspect.signature(model.forward).parameters
    assert _multi_token_probe(model, support.V, "cpu", takes_positions) is not None
    lm = StatefulLM(support.tiny_model(family), None, "cpu")
    lm.reset([1, 2])
    assert lm.serial


@pytest.mark.parametrize("family", ["mamba2", "qwen3_next", "zamba2"])
def test_serial_probe_passes_continuing_scans(family):
    lm = StatefulLM(support.tiny_model(family), None, "cpu")
    lm.reset([1, 2])
    assert lm.serial is False, lm.serial_reason


def test_snapshot_kind():
    lm = StatefulLM(support.tiny_model("bamba"), None, "cpu")
    lm.reset([1, 2])
    assert lm.snapshot_kind == "layers"
    lm = StatefulLM(support.tiny_model("minimax"), None, "cpu")
    lm.reset([1, 2])
    assert lm.snapshot_kind == "deepcopy"  # MiniMaxCache is a cache class of its own


def test_extend_before_reset():
    lm = StatefulLM(support.tiny_model("mamba2"), None, "cpu")
    with pytest.raises(RuntimeError, match="reset"):
        lm.extend([1], [-1])
    with pytest.raises(RuntimeError, match="reset"):
        lm.commit([])


def test_tree_is_refused_and_leaves_the_state(stateful):
    lm = stateful
    lm.reset([1, 2, 3])
    lm.extend([4], [-1])
    with pytest.raises(ValueError, match="chains only.*ONE recurrent state per layer"):
        lm.extend([5, 6], [-1, -1])
    with pytest.raises(ValueError, match="chains only"):
        lm.extend([5], [-1])  # a second root while node 0 is pending
    assert lm.pending_parents == [-1]
    assert torch.allclose(lm.extend([5], [0])[0], fresh(lm, [1, 2, 3, 4, 5]), atol=1e-4)
    lm.commit([0, 1])


def test_bad_input_before_state_change(stateful):
    lm = stateful
    lm.reset([1, 2])
    with pytest.raises(ValueError, match="topological"):
        lm.extend([3], [0])
    with pytest.raises(ValueError, match="vocabulary"):
        lm.extend([support.V + 5], [-1])
    assert lm.pending_parents == []
    assert torch.allclose(lm.extend([3], [-1])[0], fresh(lm, [1, 2, 3]), atol=1e-4)
    lm.commit([0])


def test_load_dispatches_stateful(tmp_path):
    import speclib

    target, _ = support.save_pair(support.tiny_model("mamba2"), tmp_path)
    lm = speclib.load(str(target))
    assert isinstance(lm, StatefulLM) and lm.strategy == "snapshot-replay"


def test_hub_id_offline_is_a_clear_error(monkeypatch, tmp_path):
    import huggingface_hub.constants

    import speclib

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ValueError, match="local folder|HF_HUB_OFFLINE") as err:
        speclib.load("speclib-nobody/no-such-model")
    assert "HF_HUB_OFFLINE=1" in str(err.value) and "speclib.load('DIR')" in str(err.value)


def test_unsupported_family_is_a_clear_error():
    from transformers import AutoConfig, AutoModelForCausalLM

    from speclib.lms.loading import wrap

    cfg = AutoConfig.for_model(
        "rwkv",
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        attention_hidden_size=32,
        intermediate_size=64,
        context_length=64,
    )
    with pytest.raises(ValueError, match="not supported.*Cache"):
        wrap(AutoModelForCausalLM.from_config(cfg), None, torch.device("cpu"))


@pytest.mark.parametrize("family", ["gemma2", "mistral"])
def test_sliding_window_chains_past_the_window(family):
    """HFLM on sliding-window layers, well past a 6-token window: rejections must leave the cache exactly
    as a fresh forward sees the sequence (positions counted by the layer itself are reset on commit)."""
    from speclib import ModelDrafter, Sampling, generate
    from speclib.lms.lm import HFLM

    lm = HFLM(support.tiny_model(family, sliding_window=6), None, torch.device("cpu"))
    rnd = random.Random(0)
    committed = [rnd.randrange(support.V) for _ in range(10)]
    lm.reset(committed)
    for keep in (2, 0, 4, 1):
        chain = [rnd.randrange(support.V) for _ in range(4)]
        logits = lm.extend(chain, [-1, 0, 1, 2])
        for j in range(4):
            assert torch.allclose(logits[j], fresh(lm, committed + chain[: j + 1]), atol=1e-4), (keep, j)
        lm.commit(list(range(keep)))
        committed += chain[:keep]
    assert lm.trees_unsupported() is not None
    with pytest.raises(ValueError, match="chains only.*sliding"):
        lm.extend([1, 2], [-1, -1])
    draft = HFLM(support.perturbed(lm.model), None, torch.device("cpu"))
    ar = generate(lm, committed, 12, sampling=Sampling(0.0), eos_token_id=None).tokens
    sd = generate(lm, committed, 12, drafter=ModelDrafter(draft, 3), sampling=Sampling(0.0), eos_token_id=None)
    assert sd.tokens == ar


@pytest.mark.parametrize("family", sorted(HYBRID - {"qwen3_5_text"}))  # qwen3_5_text: tests/test_hybrid.py
@pytest.mark.parametrize("strategy", ["materialize", "replay"])
def test_hybrid_families_every_strategy(family, strategy):
    """The matrix checks the closed form; the other strategies share the GDN maths but not the input
    projections (Qwen3-Next fuses them), so each is checked against fresh forwards too."""
    from speclib.lms.hybrid import HybridLM

    lm = HybridLM(support.tiny_model(family), None, "cpu", strategy=strategy)
    prompt = list(range(10, 22))
    if strategy == "replay":  # chains only
        lm.reset(prompt)
        out = lm.extend([5, 6, 7], [-1, 0, 1])
        for i in range(3):
            assert support._close(out[i], support.fresh_logits(lm, prompt + [5, 6, 7][: i + 1]))
        lm.commit([0])
        assert support._close(lm.extend([9], [-1])[0], support.fresh_logits(lm, prompt + [5, 9]))
    else:
        assert support.check_trees(lm, prompt) == "ok"
