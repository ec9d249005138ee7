"""The learning curve's pieces: snapshots taken once each, snapshot names, held-out prompts, the curve."""

from pathlib import Path

import speclib
from speclib.research import draft_corpus, learning_curve, training


def test_snapshots_are_taken_once_each_and_resume():
    st = {"tokens": 0}
    assert training.snapshots_due(st, (100, 300)) == []
    st["tokens"] = 350  # one step can pass two thresholds: both are taken
    assert training.snapshots_due(st, (300, 100)) == [100, 300]
    assert training.snapshots_due(st, (100, 300)) == []
    st["tokens"] = 1000
    assert training.snapshots_due(dict(st), (100, 300, 1000)) == [1000]  # a resumed record keeps what it took


def test_tokens_seen_reads_snapshot_folders_only():
    assert learning_curve.tokens_seen(Path("build/train/x/tokens-300000")) == 300000
    assert learning_curve.tokens_seen(Path("data/checkpoints/smollm2-draft")) == -1


def test_heldout_prompts_are_held_out_and_cover_every_task():
    rows = learning_curve.heldout_prompts(per_task=2, seed=1)
    assert {p.task for p in rows} == set(draft_corpus.TASKS)
    assert all(draft_corpus.split(p) == "heldout" for p in rows)
    assert len({p.id for p in rows}) == len(rows) == 2 * len(draft_corpus.TASKS)


def test_curve_is_lossless_and_counts_passes(pair):
    target, draft = pair
    prompts = [[1, 5, 9, 2], [3, 3, 7]]
    good = speclib.ModelDrafter(draft, 3)
    table = learning_curve.curve(target, {"draft": (lambda: None, good)}, prompts, max_new_tokens=12)
    row = table.iloc[0]
    assert row.identical and row.prompts == 2
    assert 1.0 <= row.lo <= row.tokens_per_pass <= row.hi <= 4.0
