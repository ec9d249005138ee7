"""How much data a learned draft needs: its snapshots decoded end to end on held-out prompts.

`python -m speclib train head|draft ... --corpus draft_corpus --snapshots 100000,300000,1000000` saves the
weights after N training tokens (build/train/<out>/tokens-<N>/). `curve` decodes the same held-out prompts
of `speclib.research.draft_corpus` (the held-out split: never trained on, and none a Spec-Bench question)
greedily with each snapshot drafting for the target and reports tokens per target pass with a bootstrap
interval over prompts, and whether every output equals greedy AR's (it must: the drafts are verified).
Tokens per pass needs no quiet machine; a speedup does, and is measured in notebook 07.

    python -m speclib.research.learning_curve head build/train/smollm2-135m-instruct-head/tokens-*
    python -m speclib.research.learning_curve draft build/train/smollm2-draft/tokens-* --k 3
"""

from __future__ import annotations

import argparse
import random
import re
from pathlib import Path

import numpy as np
import pandas as pd

from speclib.research import draft_corpus


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
    """N of a snapshot folder tokens-<N>; -1 for any other folder (a final export)."""
    m = re.fullmatch(r"tokens-(\d+)", Path(folder).name)
    return int(m.group(1)) if m else -1


def interval(values, seed: int = 0, n: int = 2000) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the mean over prompts."""
    v = np.asarray(values, float)
    means = np.random.default_rng(seed).choice(v, (n, v.size)).mean(1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def curve(target, drafters: dict, prompts: list[list[int]], max_new_tokens: int = 96, log=None) -> pd.DataFrame:
    """One row per drafter: tokens per target pass (mean over prompts and its interval) and whether
    every output equals greedy AR's. drafters: name -> (before_run, drafter); before_run() readies the
    target for it (a head's feature recording). log: called with each drafter's row as it finishes."""
    from speclib.core.generate import generate
    from speclib.core.sampling import Sampling

    target.record_features(None)  # AR pays nothing for features only a head reads
    ar = [generate(target, ids, max_new_tokens, sampling=Sampling(0.0)).tokens for ids in prompts]
    rows = []
    for name, (before_run, drafter) in drafters.items():
        before_run()
        gens = [generate(target, ids, max_new_tokens, drafter=drafter, sampling=Sampling(0.0)) for ids in prompts]
        tpc = [g.stats.tokens_per_call for g in gens]
        lo, hi = interval(tpc)
        rows.append(
            dict(
                drafter=name,
                tokens_per_pass=float(np.mean(tpc)),
                lo=lo,
                hi=hi,
                prompts=len(prompts),
                identical=all(g.tokens == a for g, a in zip(gens, ar)),
            )
        )
        if log is not None:
            log(rows[-1])
    target.record_features(None)
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    from speclib.drafters import FeatureDrafter, ModelDrafter, frequent_tokens
    from speclib.lms.head import load_head, token_counts
    from speclib.lms.loading import load
    from speclib.lms.pretrained import chat_ids

    ap = argparse.ArgumentParser(prog="python -m speclib.research.learning_curve", description=__doc__)
    ap.add_argument("kind", choices=("head", "draft"))
    ap.add_argument("folders", nargs="+", type=Path, help="snapshot folders (and final exports) to compare")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--k", type=int, default=3, help="draft length")
    ap.add_argument("--vocab", type=int, default=8192, help="FR-Spec: draft from the N most frequent tokens (0: all)")
    ap.add_argument("--per-task", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    a = ap.parse_args(argv)
    target = load(a.target, device="cpu")
    prompts = [chat_ids(target, [{"role": "user", "content": p.user_turns[0]}]) for p in heldout_prompts(a.per_task)]
    drafters = {}
    for folder in sorted(a.folders, key=tokens_seen):
        vocab = frequent_tokens(token_counts(folder), a.vocab) if a.vocab else None
        name = f"{folder.parent.name}/{folder.name}"
        if a.kind == "head":
            head = load_head(folder)
            d = FeatureDrafter(target, head, k=a.k, vocab=vocab)
            drafters[name] = (lambda layers=head.feature_layers: target.record_features(layers), d)
        else:
            draft = load(str(folder), device="cpu")
            lm = draft.view().restrict_vocab(vocab) if vocab is not None else draft
            drafters[name] = (lambda: target.record_features(None), ModelDrafter(lm, a.k))
    table = curve(target, drafters, prompts, a.max_new_tokens, log=lambda row: print(row, flush=True))
    table.insert(1, "tokens_seen", [tokens_seen(Path(n)) for n in table.drafter])
    print(table.round(3).to_string(index=False))


if __name__ == "__main__":
    main()
