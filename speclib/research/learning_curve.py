"""How much data a learned draft needs: its snapshots decoded end to end on held-out prompts.

`python -m speclib train head|draft ... --corpus draft_corpus --snapshots 100000,300000,1000000` saves the
weights after N training tokens (build/train/<out>/tokens-<N>/). `curve` decodes the same held-out prompts
of `speclib.research.draft_corpus` (the held-out split: never trained on, and none a Spec-Bench question)
greedily with each snapshot drafting for the target and reports tokens per target pass with a bootstrap
interval over prompts, and whether every output equals greedy AR's (it must: the drafts are verified).
Every snapshot runs paired with AR (`bench.paired_runs`), so a quiet machine gives speedups too.

    python -m speclib.research.learning_curve head build/train/smollm2-135m-instruct-head/tokens-*
    python -m speclib.research.learning_curve draft build/train/smollm2-draft/tokens-* --k 3
"""

from __future__ import annotations

import argparse
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from speclib.research import bench, draft_corpus


def heldout_prompts(per_task: int = 2, seed: int = 0) -> list[draft_corpus.Prompt]:
    """`per_task` held-out prompts of each of the corpus's tasks, drawn with `seed`; first user turn only."""
    rng = random.Random(seed)
    held = [p for p in draft_corpus.prompts() if draft_corpus.split(p) == "heldout"]
    out = []
    for task in draft_corpus.TASKS:
        rows = [p for p in held if p.task == task]
        out += rng.sample(rows, min(per_task, len(rows)))
    return out


def tokens_seen(folder: Path) -> int:
    """N of a snapshot folder tokens-<N>; for a final export its training record's tokens seen; -1 when
    neither says."""
    m = re.fullmatch(r"tokens-(\d+)", Path(folder).name)
    if m:
        return int(m.group(1))
    record = Path(folder) / "training.json"
    return int(json.loads(record.read_text()).get("tokens_seen", -1)) if record.exists() else -1


@dataclass(frozen=True)
class Recording:
    """A `bench.Method` whose target records the hidden states `layers` a feature head reads (None: none,
    so AR pays nothing for features only a head reads), switched on before each run."""

    method: bench.Method
    layers: tuple | None = None

    def __call__(self, ids: list[int], index: int = 0):
        self.method.target.record_features(self.layers)
        return self.method(ids, index)


def snapshot_methods(
    target, kind: str, folders, k: int = 3, vocab: int | None = 8192, max_new_tokens: int = 64
) -> dict:
    """AR and one greedy method per folder (a snapshot or a final export) of a feature head ("head") or a
    separate draft ("draft") for `target`, named "<parent>/<folder>", drafting `k` tokens from the folder's
    `vocab` most frequent training tokens (FR-Spec; None: the whole vocabulary)."""
    from speclib.drafters import FeatureDrafter, ModelDrafter, frequent_tokens
    from speclib.lms.head import load_head, token_counts
    from speclib.lms.loading import load

    if kind not in ("head", "draft"):
        raise ValueError(f"kind must be 'head' or 'draft', got {kind!r}")
    methods = {"AR": Recording(bench.Method(target, max_new_tokens))}
    for folder in sorted(map(Path, folders), key=tokens_seen):
        rows = frequent_tokens(token_counts(folder), vocab) if vocab else None
        if kind == "head":
            head = load_head(folder)
            drafter, layers = FeatureDrafter(target, head, k=k, vocab=rows), tuple(head.feature_layers)
        else:
            draft = load(str(folder), device="cpu")
            drafter, layers = ModelDrafter(draft.view().restrict_vocab(rows) if rows is not None else draft, k), None
        methods[f"{folder.parent.name}/{folder.name}"] = Recording(
            bench.Method(target, max_new_tokens, drafter), layers
        )
    return methods


def heldout_chat(target, per_task: int = 3, seed: int = 0) -> list[list[int]]:
    """`heldout_prompts` as the target's chat-template token ids (first user turn)."""
    from speclib.lms.pretrained import chat_ids

    rows = heldout_prompts(per_task, seed)
    return [chat_ids(target, [{"role": "user", "content": p.user_turns[0]}]) for p in rows]


def snapshot_runs(
    target, kind: str, folders, prompts, k: int = 3, vocab: int | None = 8192, max_new_tokens: int = 64, rounds: int = 1
):
    """`bench.paired_runs` of AR and every folder of `snapshot_methods` on `prompts`, with each row's
    tokens_seen (-1 for AR) and kind, so the saved runs alone give the curve (`summarize`)."""
    folders = [Path(f) for f in folders]
    missing = [str(f) for f in folders if not f.exists()]
    if missing:
        raise FileNotFoundError(
            f"no {kind} snapshot at {', '.join(missing)}: train with `python -m speclib train {kind} ... "
            f"--corpus draft_corpus --snapshots N,...` (snapshots go to build/train/<out>/tokens-<N>/)"
        )
    methods = snapshot_methods(target, kind, folders, k, vocab, max_new_tokens)
    runs = bench.paired_runs(prompts, methods, rounds=rounds)
    seen = {f"{f.parent.name}/{f.name}": tokens_seen(f) for f in folders}
    return runs.assign(kind=kind, tokens_seen=runs.method.map(seen).fillna(-1).astype(int))


def summarize(runs: pd.DataFrame, seen: dict | None = None, seed: int = 0) -> pd.DataFrame:
    """One row per method of `bench.paired_runs` rows but AR: the training tokens it saw (`seen`: name ->
    tokens; default the runs' own tokens_seen column), tokens per target pass (mean over prompts of the median over rounds, a 95% bootstrap
    interval over prompts), the speedup over AR (`bench.speedup`: median of per-prompt ratios and its
    interval), whether every output equals AR's, and the per-prompt values `fit` resamples."""
    if seen is None:
        seen = runs.groupby("method").tokens_seen.first().to_dict()
    table = bench.speedup_table(runs, seed=seed).set_index("method")
    out = []
    for name in (m for m in runs.method.unique() if m != "AR"):
        tpp = runs[runs.method == name].groupby("prompt").tokens_per_call.median()
        ratio = bench.ratios(runs, name, "AR").median(axis=1)
        lo, hi = interval(tpp.to_numpy(), seed)
        row = table.loc[name]
        out.append(
            dict(
                drafter=name,
                tokens_seen=int(seen.get(name, -1)),
                tokens_per_pass=float(tpp.mean()),
                lo=lo,
                hi=hi,
                speedup=row.speedup,
                speedup_lo=row.lo,
                speedup_hi=row.hi,
                prompts=len(tpp),
                identical=bool(row.identical == row.runs),
                tokens_per_pass_per_prompt=[float(v) for v in tpp],
                speedup_per_prompt=[float(v) for v in ratio.loc[tpp.index]],
            )
        )
    return pd.DataFrame(out)


def interval(values, seed: int = 0, n: int = 2000) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the mean over prompts."""
    v = np.asarray(values, float)
    means = np.random.default_rng(seed).choice(v, (n, v.size)).mean(1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def fit(
    table: pd.DataFrame, goals=(2.0, 3.0), column: str = "tokens_per_pass", n_boot: int = 2000, seed: int = 0
) -> dict:
    """`column` (tokens per pass, its mean over prompts; or speedup, its median) against training tokens
    seen, fitted as y = a + b * log10(tokens) by least squares over the rows with tokens_seen > 0 (one per
    snapshot; the same prompts decoded by each, values in `<column>_per_prompt`). The interval resamples
    prompts jointly across rows (the rows are paired by prompt), refitting each time. Returns a, b (the
    gain per tenfold data) with b's 95% interval, and for each goal the training tokens the line reaches
    it at, with an interval (an extrapolation: the line need not hold beyond the data; inf when the
    slope is not positive)."""
    rows = table[table.tokens_seen > 0].sort_values("tokens_seen")
    if len(rows) < 2:
        raise ValueError(f"a fit needs at least two snapshots with tokens seen, got {len(rows)}")
    x = np.log10(rows.tokens_seen.to_numpy(float))
    y = np.stack([np.asarray(v, float) for v in rows[f"{column}_per_prompt"]])  # [snapshots, prompts]
    stat = np.median if column == "speedup" else np.mean  # each column's own estimator

    def line(ys):
        b, a = np.polyfit(x, ys, 1)
        return a, b

    def needed(a, b, goal):
        return float(10 ** ((goal - a) / b)) if b > 0 else float("inf")

    a, b = line(stat(y, 1))
    pick = np.random.default_rng(seed).integers(0, y.shape[1], (n_boot, y.shape[1]))
    boot = np.array([line(stat(y[:, i], 1)) for i in pick])
    out = dict(a=a, b=b, b_lo=float(np.quantile(boot[:, 1], 0.025)), b_hi=float(np.quantile(boot[:, 1], 0.975)))
    out["points"] = len(rows)
    out["max_tokens"] = int(rows.tokens_seen.max())
    for goal in goals:
        tokens = [needed(ba, bb, goal) for ba, bb in boot]
        out[f"tokens_for_{goal:g}"] = needed(a, b, goal)
        out[f"tokens_for_{goal:g}_lo"], out[f"tokens_for_{goal:g}_hi"] = map(float, np.quantile(tokens, [0.025, 0.975]))
    return out


def main(argv=None) -> None:
    from speclib.lms.loading import load

    ap = argparse.ArgumentParser(prog="python -m speclib.research.learning_curve", description=__doc__)
    ap.add_argument("kind", choices=("head", "draft"))
    ap.add_argument("folders", nargs="+", type=Path, help="snapshot folders (and final exports) to compare")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--k", type=int, default=3, help="draft length")
    ap.add_argument("--vocab", type=int, default=8192, help="FR-Spec: draft from the N most frequent tokens (0: all)")
    ap.add_argument("--per-task", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="also write the paired runs to this parquet file")
    a = ap.parse_args(argv)
    target = load(a.target, device="cpu")
    prompts = heldout_chat(target, a.per_task)
    runs = snapshot_runs(target, a.kind, a.folders, prompts, a.k, a.vocab or None, a.max_new_tokens, a.rounds)
    table = summarize(runs)
    print(table.drop(columns=["tokens_per_pass_per_prompt", "speedup_per_prompt"]).round(3).to_string(index=False))
    if (table.tokens_seen > 0).sum() >= 2:
        for column in ("tokens_per_pass", "speedup"):
            print(column, {k: round(v, 3) if isinstance(v, float) else v for k, v in fit(table, column=column).items()})
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        runs.assign(kind=a.kind, k=a.k, vocab=a.vocab).to_parquet(a.out)


if __name__ == "__main__":
    main()
