"""The draft corpus: shipped prompts disjoint from Spec-Bench and split cleanly; shards atomic, resumable, fingerprinted."""

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from speclib.research import draft_corpus as dc
from speclib.research import spec_bench


@pytest.fixture(scope="module")
def rows():
    return dc.prompts()


def test_shipped_prompts_cover_the_six_tasks_with_their_licences(rows):
    assert len(rows) == 66_429
    assert {p.task for p in rows} == set(dc.TASKS)
    assert len({p.id for p in rows}) == len(rows)
    licences = {f.stem for f in (dc.ROOT / "LICENSES").glob("*.txt")}
    assert {p.source for p in rows} <= licences  # every shipped source has its licence text
    sources_md = (dc.ROOT / "SOURCES.md").read_text()
    assert all(f"`{s}`" in sources_md for s in {p.source for p in rows})


def test_no_prompt_shares_a_spec_bench_turn_or_its_first_60_characters(rows):
    questions = spec_bench.questions()
    assert len(questions) == 480
    turns = [t for q in questions for t in q["turns"]]
    dc.check_disjoint(rows, turns)  # raises on any clash
    with pytest.raises(ValueError, match="share a Spec-Bench turn"):  # the check can fail
        dc.check_disjoint([dc.Prompt("x/1", "x", "chat", ({"role": "user", "content": turns[7].upper()},))], turns)


def test_heldout_split_is_about_two_percent_and_shares_no_text_with_training(rows):
    held = [p for p in rows if dc.split(p) == "heldout"]
    assert 0.015 < len(held) / len(rows) < 0.025

    def asked(p):  # the user turns the target answers (a dialogue is cut after its MAX_USER_TURNS-th)
        return p.user_turns[: dc.MAX_USER_TURNS]

    train_text = {dc.normalize(u) for p in rows if dc.split(p) == "train" for u in asked(p)}
    # no held-out request (a turn of 40+ characters: not "Thank you" or "Oakland.") is a training turn
    shared = [p.id for p in held for u in asked(p) if len(u) >= 40 and dc.normalize(u) in train_text]
    assert not shared
    assert {p.task for p in held} == set(dc.TASKS)


def test_order_is_a_deterministic_permutation_that_weighs_hh_rlhf_down(rows):
    a, b = dc.order(rows, "train"), dc.order(rows, "train")
    assert [p.id for p in a] == [p.id for p in b]
    assert sorted(p.id for p in a) == sorted(p.id for p in rows if dc.split(p) == "train")

    def share(ps):
        return sum(p.source == "hh_rlhf_harmless_test" for p in ps) / len(ps)

    assert share(a[:8000]) < 0.6 * share(a)  # weight 0.25: well under its overall share in any early prefix


@pytest.mark.parametrize(
    "line, why",
    [
        ("{not json", "not JSON"),
        ('{"source": "s", "task": "poetry", "messages": [{"role": "user", "content": "hi"}]}', "task must be"),
        ('{"source": "s", "task": "chat", "messages": []}', "non-empty list"),
        (
            '{"source": "s", "task": "chat", "messages": [{"role": "user", "content": "hi"}, '
            '{"role": "assistant", "content": "yo"}]}',
            "last message must be a user turn",
        ),
    ],
)
def test_a_malformed_prompt_line_names_its_file_and_line(tmp_path, line, why):
    good = '{"source": "s", "task": "chat", "messages": [{"role": "user", "content": "hi"}]}'
    path = tmp_path / "s.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(good + "\n" + line + "\n")
    with pytest.raises(ValueError, match=rf"s\.jsonl\.gz:2: .*{why}"):
        dc.read_prompts(path)


def _meta(n, fp=None):
    return {"prompt_ids": [f"s/{i}" for i in range(n)], "fingerprints": fp or {"tokenizer": "t1", "weights": "w1"}}


def test_shard_round_trip_and_refusal_of_other_fingerprints(tmp_path):
    ids = [[1, 2, 3, 65535], [7], [9, 9]]
    gen = [[0, 0, 1, 1], [1], [0, 1]]
    path = tmp_path / "00000.npz"
    dc.write_shard(path, ids, gen, _meta(3))
    s = dc.read_shard(path, {"tokenizer": "t1", "weights": "w1"})
    assert [c.tolist() for c, _ in s.conversations()] == ids
    assert [m.astype(int).tolist() for _, m in s.conversations()] == gen
    assert s.answer_tokens == 4
    with pytest.raises(ValueError, match="another tokenizer .*t1.*t2"):
        dc.read_shard(path, {"tokenizer": "t2", "weights": "w1"})
    with pytest.raises(ValueError, match="another weights"):
        dc.read_shard(path, {"tokenizer": "t1", "weights": "w9"})
    with pytest.raises(ValueError, match="uint16"):
        dc.write_shard(tmp_path / "x.npz", [[70000]], [[1]], _meta(1))
    assert not list(tmp_path.glob(".*.tmp"))  # a refused write leaves nothing behind


def test_a_writer_killed_mid_shard_leaves_no_shard_and_the_complete_ones_intact(tmp_path):
    """kill -9 while the third shard is being written: the two finished shards read back unchanged, the
    third does not exist (only a temporary file, which `generate` removes before it resumes)."""
    script = textwrap.dedent(
        f"""
        import numpy as np, time
        from speclib.research import draft_corpus as dc
        from pathlib import Path
        d = Path({str(tmp_path)!r})
        for i in range(2):
            dc.write_shard(d / f"{{i:05d}}.npz", [[i, 1, 2]], [[0, 1, 1]], {{"prompt_ids": ["s/1"], "fingerprints": {{}}}})
        real = np.savez_compressed
        def slow(f, **kw):
            f.write(b"partial")
            f.flush()
            print("writing", flush=True)
            time.sleep(60)
        np.savez_compressed = slow
        dc.write_shard(d / "00002.npz", [[5]], [[1]], {{"prompt_ids": ["s/1"], "fingerprints": {{}}}})
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "00002.npz").exists()
    assert len(list(tmp_path.glob(".*.tmp"))) == 1
    assert [dc.read_shard(tmp_path / f"{i:05d}.npz").ids.tolist() for i in range(2)] == [[0, 1, 2], [1, 1, 2]]


def test_settings_sample_every_eighth_shard_at_temperature_one():
    temps = [dc.shard_settings(i, 256, 0, "float32")["temperature"] for i in range(16)]
    assert temps.count(1.0) == 2 and temps[7] == temps[15] == 1.0
    assert len({dc.shard_settings(i, 256, 0, "float32")["seed"] for i in range(16)}) == 16


def test_committed_shards_are_a_prefix_of_the_generation_order(rows):
    """Whatever has been generated and committed: shard i answers prompts order[64 i : 64 (i + 1)], with the
    target's tokens masked, under one tokenizer and one set of weights."""
    for which in ("train", "heldout"):
        folder = dc.shard_dir("smollm2-135m-instruct", which)
        got = dc.shards("smollm2-135m-instruct", which)
        if not got:
            continue
        want = [p.id for p in dc.order(rows, which)]
        for s in got:
            i = s.meta["index"]
            assert s.meta["prompt_ids"] == want[i * dc.SHARD : (i + 1) * dc.SHARD]
            assert 0 < s.answer_tokens < s.ids.size
        assert len({json.dumps(s.meta["fingerprints"], sort_keys=True) for s in got}) == 1, folder
        assert np.all([s.meta["settings"]["max_new_tokens"] >= 256 for s in got])
