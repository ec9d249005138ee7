"""OverlapDrafter: the draft LM in its own process, drafting while the target verifies. Lossless like the
sequential loop (greedy identity, chi-square at temperature 1 with a negative control), its hypothesis
bookkeeping on awkward timings (verify at once with nothing ready, wait for k, a short lookahead), and its
process always stopped."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from conftest import noisy_copy, tiny_lm, token_at, token_zero_draft

from speclib import ModelDrafter, Sampling, generate
from speclib.drafters import overlap
from speclib.drafters.overlap import OverlapDrafter
from speclib.lms.head import HeadLM
from speclib.research.stats import chi2_two_sample

GREEDY = Sampling(0.0)


@pytest.fixture(scope="module")
def models():
    return tiny_lm(32, 2, seed=0), noisy_copy(seed=0, scale=0.3)  # a draft that agrees often, not always


@pytest.mark.parametrize(
    "k, wait_for, ahead, backend", [(4, 0, None, "process"), (3, 3, 3, "thread"), (8, 2, 20, "process")]
)
def test_greedy_output_equals_ar(models, k, wait_for, ahead, backend):
    target, draft = models
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6], [7] * 12, list(range(20))]
    with OverlapDrafter(draft, k=k, wait_for=wait_for, ahead=ahead, backend=backend) as d:
        for ids in prompts:
            ar = generate(target, ids, 60, sampling=GREEDY)
            out = generate(target, ids, 60, drafter=d, sampling=GREEDY)
            assert out.tokens == ar.tokens
            assert out.stats.new_tokens == 60 and max(s["drafted"] for s in out.stats.steps) <= k
        # the same drafts as the sequential drafter: accepted tokens per step can only come from q's argmax chain
        seq = generate(target, prompts[0], 60, drafter=ModelDrafter(draft, k), sampling=GREEDY)
        assert seq.stats.acceptance_rate > 0.3  # the pair agrees often: hypotheses survive verify passes


class AcceptAll:
    """A wrong rule (keeps every draft token): the chi-square test must catch it."""

    def __call__(self, tree, p, greedy, gen, logits=None):
        return list(range(len(tree))), int(torch.multinomial(p[len(tree)], 1, generator=gen))


def test_chi_square_against_ar_at_temperature_1(models):
    """Tokens at new-token index 4 over independent seeded runs, as for the sequential loop
    (tests/test_generate.py); alpha = 1e-3 (0.1% false-positive rate)."""
    target, draft = models
    t1, n = Sampling(1.0), 800
    ar = token_at(target, None, 4, n, t1)
    with OverlapDrafter(draft, k=3, wait_for=1) as d:
        over = token_at(target, d, 4, n, t1, seed0=10**6)
    assert chi2_two_sample(ar, over).p > 1e-3
    # negative control: keeping every draft token of a draft that proposes token 0 is caught (wait_for = k = 3:
    # index 3 is always the third kept draft token). The tiny random target's marginal at an index barely
    # depends on the tokens before it, so a subtler wrong rule would need far more runs to be seen.
    with OverlapDrafter(token_zero_draft(), k=3, wait_for=3) as d:
        bad = token_at(target, d, 3, n // 4, t1, seed0=10**6, acceptor=AcceptAll())
    assert chi2_two_sample(token_at(target, None, 3, n // 4, t1), bad).p < 1e-3


def test_bad_inputs_and_too_few_cpus(models, monkeypatch):
    _, draft = models
    for kw, match in [
        (dict(k=0), "k must"),
        (dict(k=2, wait_for=3), "wait_for"),
        (dict(k=4, ahead=2), "ahead"),
        (dict(threads=0), "threads"),
        (dict(backend="gpu"), "backend"),
    ]:
        with pytest.raises(ValueError, match=match):
            OverlapDrafter(draft, **kw)
    with pytest.raises(ValueError, match="vocabulary"):
        generate(tiny_lm(vocab=65), [1], 5, drafter=OverlapDrafter(draft, 2))
    with pytest.raises(ValueError, match="FeatureDrafter"):  # a head reads features that verify has not made yet
        OverlapDrafter(HeadLM.__new__(HeadLM))
    monkeypatch.setattr(overlap, "cpu_count", lambda: 1)
    with pytest.raises(RuntimeError, match="2 usable CPUs"):
        OverlapDrafter(draft, 2)


def test_the_draft_process_stops(models):
    target, draft = models
    d = OverlapDrafter(draft, k=2)
    generate(target, [1, 2], 8, drafter=d, sampling=GREEDY)
    proc = d._proc
    d.close()
    assert not proc.is_alive()
    d2 = OverlapDrafter(draft, k=2)
    generate(target, [1, 2], 8, drafter=d2, sampling=GREEDY)
    d2._proc.kill()  # a crash on the draft side: the decoding side stops with an error, not a hang
    d2._proc.join()
    with pytest.raises(RuntimeError, match="draft process"):
        generate(target, [1, 2], 8, drafter=d2, sampling=GREEDY)
    d2.close()


class FailingLM:
    """Delegates to an LM, but its `calls`-th extend raises `error`."""

    def __init__(self, lm, calls, error):
        self.lm, self.calls, self.error = lm, calls, error

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def extend(self, *args):
        self.calls -= 1
        if self.calls == 0:
            raise self.error
        return self.lm.extend(*args)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the crash is the point
def test_a_crashed_draft_thread_and_an_interrupted_decoder(models):
    target, draft = models
    d = OverlapDrafter(FailingLM(draft, 5, ValueError("boom")), k=2, backend="thread")
    with pytest.raises(RuntimeError, match="draft thread"):  # not a hang
        generate(target, [1, 2], 40, drafter=d, sampling=GREEDY)
    d.close()
    for backend in ("process", "thread"):  # KeyboardInterrupt on the target's side: `with` stops the draft side
        with pytest.raises(KeyboardInterrupt), OverlapDrafter(draft, k=2, backend=backend) as d:
            generate(FailingLM(target, 3, KeyboardInterrupt()), [1, 2], 40, drafter=d, sampling=GREEDY)
        assert d._proc is None


class ResetPipe:
    """The decoder's end of a pipe whose peer closed with messages unread: the socket is reset (errno 104)."""

    def poll(self, timeout=0):
        return True

    def recv(self):
        raise ConnectionResetError(104, "Connection reset by peer")

    def send(self, msg):
        raise ConnectionResetError(104, "Connection reset by peer")

    def close(self):
        pass


def test_a_reset_pipe_reads_as_a_stopped_draft_thread(models):
    """A crash can reach the decoder as a reset socket rather than end of file (a race seen under load)."""
    target, draft = models
    with OverlapDrafter(draft, k=2, backend="thread") as d:
        d.reset([1, 2], GREEDY, torch.Generator())
        d._conn, real = ResetPipe(), d._conn
        with pytest.raises(RuntimeError, match="draft thread stopped"):
            d.draft([1, 2, 3])
        d._conn = real


def _as_from_a_terminal():
    """Ctrl-C as a script run from a shell gets it: an ignored or blocked SIGINT is inherited across exec, and
    the process running the tests may have either (in two full `make test` runs the script never saw it)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_leaves_no_draft_process(tmp_path):
    """A script (no __main__ guard, no `with`) interrupted mid-generation: it exits, its draft process too."""
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {os.path.dirname(__file__)!r})
            from conftest import noisy_copy, tiny_lm, token_at
            from speclib import Sampling, generate
            from speclib.drafters.overlap import OverlapDrafter
            target, d = tiny_lm(32, 2, seed=0), OverlapDrafter(noisy_copy(seed=0, scale=0.3), k=3)
            generate(target, [1, 2], 4, drafter=d, sampling=Sampling(0.0))
            print(d._proc.pid, flush=True)
            while True:
                generate(target, [1, 2], 50, drafter=d, sampling=Sampling(0.0))
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_from_a_terminal,
    )
    child = int(proc.stdout.readline())
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    for _ in range(50):  # the orphaned child, if any, is reaped by init
        if not os.path.exists(f"/proc/{child}") or "Z" in open(f"/proc/{child}/stat").read().split()[2]:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"draft process {child} still running after the script exited")


def test_timeline(models):
    target, draft = models
    with OverlapDrafter(draft, k=3) as d:
        out = generate(target, list(range(10)), 40, drafter=d, sampling=GREEDY)
        tl = d.timeline()
    assert len(tl["wait"]) == len(out.stats.steps)
    for ivs in tl.values():
        assert all(0 <= a <= b for a, b in ivs) and all(b1 <= a2 for (_, b1), (a2, _) in zip(ivs, ivs[1:]))
    assert len(tl["draft"]) >= sum(s["drafted"] for s in out.stats.steps)  # one call per drafted token at least
