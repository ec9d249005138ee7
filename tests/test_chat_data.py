"""speclib.research.chat_data: the instructions a pretrained target answers to make its drafts' training data."""

import pytest

from speclib.lms.head import token_counts
from speclib.research import chat_data, spec_bench


def test_instructions_are_deterministic_varied_and_split_by_file():
    a, b = chat_data.instructions("train", 60, seed=0), chat_data.instructions("train", 60, seed=0)
    assert a == b and len(a) == 60
    assert {r["kind"] for r in a} == {k for k, _ in chat_data._KINDS}
    assert len({r["prompt"] for r in a}) == 60
    assert chat_data.instructions("train", 60, seed=1) != a
    held = chat_data.instructions("heldout", 30)
    # docstrings of held-out files never appear in training instructions (the stdlib split is by file)
    train_modules = {r["module"] for r in chat_data.instructions("train", 600)}
    held_modules = {r["module"] for r in held}
    assert not train_modules & held_modules
    with pytest.raises(ValueError, match="split"):
        chat_data.instructions("test", 3)


def test_instructions_are_not_spec_bench_questions():
    qs = spec_bench.questions()
    chat_data.check_disjoint(chat_data.instructions("train", 600), qs)
    clash = [{"id": "x", "kind": "qa", "prompt": qs[3]["turns"][0]}]
    with pytest.raises(ValueError, match="Spec-Bench"):
        chat_data.check_disjoint(clash, qs)


def test_missing_answers_and_counts_say_how_to_make_them(tmp_path, monkeypatch):
    monkeypatch.setattr(chat_data, "STATE", tmp_path)
    with pytest.raises(FileNotFoundError, match="python -m speclib chat_data"):
        chat_data.stream("smollm2-135m-instruct", "train")
    with pytest.raises(ValueError, match="token_counts.npy"):
        token_counts(tmp_path)
