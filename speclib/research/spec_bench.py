"""Spec-Bench, the benchmark the field reports speculative decoding on (data/workloads/spec_bench/).

480 questions in six tasks; each is {"question_id", "category", "turns": [str, ...]} (MT-bench's
questions have two turns, the others one). A question is asked through the model's own chat
template; a second turn is asked after the model's own first answer, as Spec-Bench does.

    qs = spec_bench.questions()
    pilot, reported = spec_bench.split(qs, per_task=8, pilot_per_task=2, seed=0)
    ids = spec_bench.turn_ids(lm, q, answers=[])          # the first turn's prompt
    ids = spec_bench.turn_ids(lm, q, answers=[first])     # the second, after the model's own answer

Every tuned setting is chosen on `pilot` and reported on `reported`: the two are disjoint.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from speclib.core.device import REPO

QUESTIONS = REPO / "data" / "workloads" / "spec_bench" / "question.jsonl"
TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def task_of(category: str) -> str:
    """The Spec-Bench task of a question category (MT-bench's eight categories are one task)."""
    if category in MT_BENCH_CATEGORIES:
        return "mt_bench"
    if category in TASKS:
        return category
    raise ValueError(f"unknown Spec-Bench category {category!r}: expected one of {MT_BENCH_CATEGORIES + TASKS[1:]}")


def check_question(q: dict, where: str = "question") -> dict:
    """`q` itself, after checking it has an id, a known category and a non-empty list of string turns."""
    if not isinstance(q, dict) or "question_id" not in q or "category" not in q:
        raise ValueError(f"{where}: a question needs 'question_id', 'category' and 'turns', got {q!r:.120}")
    turns = q.get("turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise ValueError(
            f"{where} (question_id {q['question_id']}): 'turns' must be a non-empty list of "
            f"non-empty strings, got {turns!r:.120}; fix the question file or drop the question"
        )
    task_of(q["category"])
    return q


def questions(path: str | Path = QUESTIONS) -> list[dict]:
    """The questions of a Spec-Bench question file (default: the shipped one), each with its "task"."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no Spec-Bench question file at {path}")
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                q = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{i}: not JSON ({exc})") from None
            q = check_question(q, f"{path}:{i}")
            out.append(q | {"task": task_of(q["category"])})
    ids = [q["question_id"] for q in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: repeated question ids")
    return out


def split(qs: list[dict], per_task: int | None, pilot_per_task: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(pilot, reported): per task, a seeded shuffle of its questions; the first `pilot_per_task` are
    pilot questions (for choosing settings), the next `per_task` are reported (None: all the rest).
    Disjoint by construction; both in the file's order."""
    if pilot_per_task < 0 or (per_task is not None and per_task < 1):
        raise ValueError(f"per_task must be >= 1 or None and pilot_per_task >= 0, got {per_task}, {pilot_per_task}")
    pilot, reported = [], []
    for task in TASKS:
        mine = [q for q in qs if q["task"] == task]
        if not mine:
            continue
        order = list(range(len(mine)))
        random.Random(f"{seed}-{task}").shuffle(order)
        if pilot_per_task + (per_task or 1) > len(mine):
            raise ValueError(
                f"task {task} has {len(mine)} questions: fewer than {pilot_per_task} pilot + {per_task or 1} reported"
            )
        p = set(order[:pilot_per_task])
        r = set(order[pilot_per_task:] if per_task is None else order[pilot_per_task : pilot_per_task + per_task])
        pilot += [q for i, q in enumerate(mine) if i in p]
        reported += [q for i, q in enumerate(mine) if i in r]
    return pilot, reported


def messages(q: dict, answers: list[str]) -> list[dict]:
    """The chat for the next turn of `q` after the model's own `answers` to its earlier turns."""
    check_question(q)
    if len(answers) >= len(q["turns"]):
        raise ValueError(f"question {q['question_id']} has {len(q['turns'])} turns; got {len(answers)} answers")
    out = []
    for turn, answer in zip(q["turns"], answers):
        out += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
    return out + [{"role": "user", "content": q["turns"][len(answers)]}]


def turn_ids(lm, q: dict, answers: list[str] = (), max_new_tokens: int = 0) -> list[int]:
    """Prompt ids of the next turn of `q` through `lm`'s chat template. A ValueError when the prompt
    plus `max_new_tokens` does not fit the model's context."""
    from speclib.lms.pretrained import chat_ids

    ids = chat_ids(lm, messages(q, list(answers)))
    limit = lm.max_length
    if len(ids) + max_new_tokens > limit:
        raise ValueError(
            f"question {q['question_id']}: {len(ids)} prompt tokens + {max_new_tokens} new exceed "
            f"the model's context of {limit}; drop the question or lower max_new_tokens"
        )
    return ids


# Spec-Bench's leaderboard on one RTX 3090 (Vicuna-7B-v1.3, greedy, fp16, batch 1; Leaderboard.md of the
# Spec-Bench repository at commit fd2c1cd7d220): speedup over AR per task, mean accepted tokens per step
# and overall speedup. For the per-task *profile* (which tasks favour which method), not absolute numbers.
LEADERBOARD_COLUMNS = TASKS + ("tokens_per_step", "overall")
LEADERBOARD = {
    "SAMD[EAGLE2]": (2.85, 1.83, 2.64, 2.15, 2.63, 2.10, 4.61, 2.38),
    "EAGLE2": (2.56, 1.78, 2.09, 2.07, 2.66, 1.86, 4.35, 2.19),
    "EAGLE": (2.31, 1.72, 2.00, 1.91, 2.38, 1.75, 3.57, 2.03),
    "Hydra": (2.18, 1.79, 1.66, 1.85, 2.28, 1.62, 3.26, 1.91),
    "SpS": (1.94, 1.37, 1.96, 1.86, 1.81, 1.83, 2.28, 1.79),
    "PLD": (1.64, 1.15, 2.46, 1.28, 1.72, 1.71, 1.73, 1.64),
    "Medusa": (1.61, 1.39, 1.28, 1.40, 1.64, 1.25, 2.32, 1.44),
    "Recycling": (1.42, 1.29, 1.43, 1.30, 1.59, 1.36, 2.73, 1.40),
    "REST": (1.44, 1.15, 1.17, 1.35, 1.30, 1.26, 1.63, 1.28),
    "Lookahead": (1.17, 1.00, 1.11, 1.06, 1.32, 1.06, 1.64, 1.13),
}


def leaderboard():
    """The leaderboard above as a DataFrame (one row per method)."""
    import pandas as pd

    return pd.DataFrame([dict(method=m, **dict(zip(LEADERBOARD_COLUMNS, v))) for m, v in LEADERBOARD.items()])


def repeated_share(tokens, n: int = 4) -> float:
    """The share of an answer's n-grams that already occurred earlier in the same answer: about 0 for text
    that never repeats itself, near 1 for a loop (a greedy small model's failure, and what a copying drafter
    accepts best). NaN for an answer shorter than n + 1 tokens."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if len(grams) < 2:
        return float("nan")
    seen: set = set()
    repeats = 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / len(grams)


def copied_share(prompt, tokens, n: int = 4) -> float:
    """The share of an answer's n-grams that occur in its prompt: about 0 for an answer in its own words, near
    1 for one that echoes its prompt (a translation that repeats the source, a second turn that re-emits the
    first answer), which is what prompt lookup accepts best. NaN for an answer shorter than n tokens."""
    prompt, tokens = list(prompt), list(tokens)
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return float("nan")
    source = {tuple(prompt[i : i + n]) for i in range(len(prompt) - n + 1)}
    return sum(g in source for g in grams) / len(grams)


def spec_bench_ratio(runs, method: str, reference: str = "AR") -> float:
    """Spec-Bench's own speedup: the mean over questions of the method's tokens/s over the same mean for
    the reference (a ratio of means, unpaired; `bench.speedup` is the workbook's paired estimator)."""
    m, r = runs[runs.method == method], runs[runs.method == reference]
    return float(m.tokens_per_s.mean() / r.tokens_per_s.mean())


def task_table(runs, tasks: dict[int, str], reference: str = "AR", seed: int = 0):
    """Per task and "overall", for every method of `paired_runs` rows (`tasks`: prompt index -> task):
    the workbook's speedup with its 95% CI, Spec-Bench's ratio of mean tokens/s, the mean tokens per
    target step (new tokens / target passes including the prefill's; AR: 1, NaN for loops that do not
    report their steps) and how many outputs equal the reference's."""
    import numpy as np
    import pandas as pd

    from speclib.research import bench

    runs = runs.assign(task=runs.prompt.map(tasks))
    rows = []
    for task in [t for t in TASKS if t in set(runs.task)] + ["overall"]:
        sub = runs if task == "overall" else runs[runs.task == task]
        for method in [m for m in sub.method.unique() if m != reference]:
            g = sub[sub.method == method]
            calls = g.target_calls.sum() + len(g)
            rows.append(
                dict(
                    task=task,
                    method=method,
                    **bench.speedup(sub, method, reference, seed),
                    spec_bench_ratio=spec_bench_ratio(sub, method, reference),
                    tokens_per_step=float(g.new_tokens.sum() / calls) if g.target_calls.notna().all() else np.nan,
                    identical=int(g.same_as_reference.sum()),
                    runs=len(g),
                )
            )
    return pd.DataFrame(rows)
