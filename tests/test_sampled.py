"""Sampled runs for the distribution tests: on several processes they are the very runs one process gives."""

from functools import partial

import pytest
from conftest import needs_shipped

import speclib
from speclib import PromptLookupDrafter, SuffixDrafter
from speclib.core.device import threads
from speclib.research.sampled import sample_runs, sample_runs_parallel

PROMPTS = [[5, 17, 22, 9, 17, 22], [40, 41, 42]]


@needs_shipped
def test_runs_on_two_processes_equal_the_runs_in_this_one():
    jobs = {
        "AR": dict(prompts=PROMPTS, n_tokens=50, seed0=3, max_new_tokens=16),
        "lookup": dict(
            prompts=PROMPTS, n_tokens=50, seed0=3, max_new_tokens=16, make_drafter=partial(PromptLookupDrafter, 2, 3)
        ),
        "suffix": dict(prompts=PROMPTS, n_tokens=30, seed0=7, max_new_tokens=16, make_drafter=SuffixDrafter),
    }
    got = sample_runs_parallel("code-draft", jobs, workers=2)
    target = speclib.load("code-draft", device="cpu")
    with threads(1):
        want = {name: sample_runs(target, **kw) for name, kw in jobs.items()}
    assert got == want
    assert sum(map(len, got["AR"])) >= 50 and all(len(r) <= 16 for r in got["AR"])
    assert len(got["suffix"]) == 2  # 16 tokens a run (EOS ignored): two runs reach 30


def test_bad_arguments():
    with pytest.raises(ValueError, match="prompts"):
        sample_runs(None, [], 10)
    with pytest.raises(ValueError, match="n_tokens"):
        sample_runs(None, [[1]], 0)
    with pytest.raises(ValueError, match="workers"):
        sample_runs_parallel("code-draft", {}, workers=0)
