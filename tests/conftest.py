import os

import torch

# Triton picks interpreted vs compiled mode when first imported (transformers imports it), so the
# CPU interpreter must be chosen before anything else is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from speclib.core.device import set_threads  # noqa: E402

# Under pytest-xdist (`make test` runs two workers) each worker, and the notebook kernels it starts, takes
# one thread: two workers at two threads each would oversubscribe the two cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("SPECLIB_THREADS", "1")
set_threads()  # torch's threads = the CPUs this process may use (affinity, cgroup quota), or $SPECLIB_THREADS

import pytest  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import speclib  # noqa: E402
from speclib.lms import LlamaLM  # noqa: E402
from speclib.lms.lm import HFLM  # noqa: E402

SHIPPED = {"code-target", "code-draft"} <= set(speclib.checkpoints())
needs_shipped = pytest.mark.skipif(not SHIPPED, reason="shipped checkpoints missing (python -m speclib train)")


def tiny_lm(hidden=32, layers=2, vocab=64, seed=0, max_pos=256, impl="hf") -> HFLM:
    """A random tiny Llama behind the LM protocol: fast, and with a flat-ish distribution.
    impl "hf" = the stock transformers forward (HFLM), "fast" = speclib's lean LlamaLM."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=max_pos,
        eos_token_id=None,
        bos_token_id=None,
    )
    cls = HFLM if impl == "hf" else LlamaLM
    return cls(LlamaForCausalLM(cfg).eval(), None, torch.device("cpu"))


def noisy_copy(seed=0, scale=0.3, impl="hf", **kw) -> HFLM:
    """tiny_lm(seed=seed, ...) with noise on its output head: a draft that agrees with that target often, not
    always (two independently seeded tiny models agree on almost no greedy token)."""
    lm = tiny_lm(seed=seed, impl=impl, **kw)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        w = lm.model.lm_head.weight
        w.add_(scale * w.std() * torch.randn(w.shape, generator=g))
    return lm


def token_at(target, drafter, pos, n_runs, sampling, seed0=0, acceptor=None) -> list[int]:
    """The token at new-token index `pos` of n_runs seeded runs from the prompt [3, 1, 4]: independent
    samples of one position's distribution, for the chi-square tests against AR."""
    return [
        speclib.generate(
            target, [3, 1, 4], pos + 1, drafter=drafter, sampling=sampling, seed=seed0 + s, acceptor=acceptor
        ).tokens[pos]
        for s in range(n_runs)
    ]


def accepted(gen) -> int:
    """Draft tokens accepted over a generate() run (its per-step stats)."""
    return sum(s["accepted"] for s in gen.stats.steps)


def spread_hybrid(m):
    """A random tiny hybrid with every part made to count: non-trivial norm weights, and slow decays
    (A in [0.05, 1]) so tokens several steps back still move the GDN state."""
    import math

    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
            elif name.endswith("A_log"):
                p.uniform_(math.log(0.05), math.log(1.0))
            elif name.endswith("dt_bias"):
                p.normal_(0.0, 0.5)
    return m


@pytest.fixture
def pair():
    return tiny_lm(32, 2, seed=0), tiny_lm(16, 1, seed=1)


@pytest.fixture(scope="session")
def shipped():
    return speclib.load("code-target"), speclib.load("code-draft")


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """`smoke_run("01_baseline")` runs that notebook with SMOKE=True once per test session and returns
    the folder holding the executed notebook (`01_baseline.ipynb`) and its results/ and figures/.
    Under pytest-xdist the folder and the runs are shared by the workers: a file lock per notebook
    makes the first worker to ask run it and the others wait for it."""
    from filelock import FileLock, Timeout

    from speclib.core.device import REPO
    from speclib.workbook.notebooks import run
    from speclib.workbook.study import broken_steps

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "smoke"
    root.mkdir(exist_ok=True)

    def run_once(name: str, block: bool = True):
        """The folder once `name` has run; with block=False, None when another worker is running it now."""
        done = root / f"{name}.done"
        lock = FileLock(str(root / f"{name}.lock"))
        try:
            lock.acquire(timeout=-1 if block else 0)
        except Timeout:
            return None
        try:
            if not done.exists():
                before = os.environ.get("SPECLIB_OUT")
                os.environ["SPECLIB_OUT"] = str(root)  # the notebook's kernel inherits it
                try:
                    run(REPO / "notebooks" / f"{name}.ipynb", root / f"{name}.ipynb", {"SMOKE": True})
                finally:
                    if before is None:
                        os.environ.pop("SPECLIB_OUT", None)
                    else:
                        os.environ["SPECLIB_OUT"] = before
                # a step whose table a later save overwrote (this notebook's steps only: another worker
                # may be writing its own notebook's results beside them)
                broken = [b for b in broken_steps(root / "results") if b.startswith(name + "/")]
                assert not broken, broken
                done.touch()
        finally:
            lock.release()
        return root

    return run_once


# Three tiers. `make test-unit` (-m "not slow and not integration"): the unit tests, under a minute;
# `make test-fast` (-m "not slow"): those and the integration tests (real models, foreign runtimes, the
# server, the shorter statistical tests), about three minutes; `make test`: everything, the notebook smoke
# runs, the book and browser, the Ray sweeps and the long statistical tests (SLOW_TESTS) included.
# Seconds beside each entry: its call time in `make test` on 2 cores (two workers), which decides its tier.
SLOW_MODULES = {"test_book.py", "test_sweep.py"}
SLOW_TESTS: dict[str, float] = {}
INTEGRATION_MODULES: set[str] = set()
INTEGRATION_TESTS: dict[str, float] = {}


def _name(item) -> str:
    """`test_file.py::test_function` (parameters and classes dropped)."""
    return f"{item.path.name}::{getattr(item, 'originalname', item.name).split('[')[0]}"


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = _name(item)
        if item.path.name in SLOW_MODULES or "smoke_run" in getattr(item, "fixturenames", ()) or name in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
        elif item.path.name in INTEGRATION_MODULES or name in INTEGRATION_TESTS:
            item.add_marker(pytest.mark.integration)
