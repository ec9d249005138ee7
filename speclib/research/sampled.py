"""Sampled runs for the distribution tests (the permutation chi-square), in this process or on every core.

    runs = sample_runs(target, prompts, 9200, make_drafter=partial(PromptLookupDrafter, max_ngram=2, k=4))
    by_method = sample_runs_parallel("smollm2-135m-instruct", {"AR": dict(prompts=prompts, n_tokens=9200),
                                                               "lookup": dict(prompts=prompts, n_tokens=9200,
                                                                              make_drafter=partial(...))})

Nothing here reads a clock, so the sets of runs a test compares can be sampled side by side: each job runs in a
process of its own at one thread (at most `workers` at once), with the target loaded there by name. A run's
tokens depend only on its prompt, its seed and the arithmetic, and one thread sums in the same order in every
process, so a job gives the very runs `sample_runs` gives in a process at one thread (tested).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

from speclib.core.device import set_threads
from speclib.core.generate import generate
from speclib.core.sampling import Sampling

_loaded: dict = {}  # a worker process's target, loaded once per name


def sample_runs(
    target,
    prompts: Sequence[Sequence[int]],
    n_tokens: int,
    make_drafter: Callable | None = None,
    sampling: Sampling = Sampling(1.0),  # noqa: B008 (Sampling is a frozen dataclass)
    seed0: int = 0,
    max_new_tokens: int = 64,
) -> list[list[int]]:
    """Runs of up to `max_new_tokens` sampled tokens (EOS ignored) until they hold `n_tokens` in all: run i starts
    from prompts[i % len(prompts)] with seed seed0 + i and a fresh `make_drafter()` (None: plain AR)."""
    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    if n_tokens < 1 or max_new_tokens < 1:
        raise ValueError(f"n_tokens and max_new_tokens must be >= 1, got {n_tokens} and {max_new_tokens}")
    runs, n, i = [], 0, 0
    while n < n_tokens:
        drafter = make_drafter() if make_drafter is not None else None
        g = generate(
            target,
            prompts[i % len(prompts)],
            max_new_tokens,
            drafter=drafter,
            sampling=sampling,
            seed=seed0 + i,
            eos_token_id=None,
        )
        runs.append(list(g.tokens))
        n += len(g.tokens)
        i += 1
    return runs


def _job(target_name: str, kwargs: dict) -> list[list[int]]:
    from speclib.lms.loading import load

    set_threads(1)
    if target_name not in _loaded:
        _loaded[target_name] = load(target_name, device="cpu")
    return sample_runs(_loaded[target_name], **kwargs)


def sample_runs_parallel(target_name: str, jobs: dict[str, dict], workers: int = 2) -> dict[str, list[list[int]]]:
    """`sample_runs(load(target_name), **job)` for each named job, in `workers` processes at one thread each
    (started fresh, so nothing of this process's state leaks in). The drafter factory must pickle: a class or a
    `functools.partial` of one, not a lambda. Returns {name: runs}."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    with ProcessPoolExecutor(min(workers, len(jobs)) or 1, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {name: pool.submit(_job, target_name, kwargs) for name, kwargs in jobs.items()}
        return {name: f.result() for name, f in futures.items()}
