"""The shared training loop (speclib.research.training.run_training) on a tiny linear model over a random
token stream: the step and time budgets, the learning-rate schedule, gradient clipping, frozen weights
left without gradients, and resuming a killed run to the same weights as an uninterrupted one."""

import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from speclib.research import training
from speclib.research.training import Checkpoint, lr_at, run_training

STREAM = np.random.default_rng(0).integers(0, 16, 2000).astype(np.int16)


def tiny_run(seed=0, lr=1e-2):
    """(model, optimizer, generator, step_loss): a bigram model trained on random windows of STREAM."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)

    def step_loss():
        x = training.batch(STREAM, 4, 8, gen)
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        return loss, None

    return model, opt, gen, step_loss


def test_stops_at_the_step_budget_and_continues_a_record():
    model, opt, _, step_loss = tiny_run()
    seen = []
    st = run_training(
        step_loss, opt, steps=7, minutes=10, tokens_per_step=32, on_step=lambda st, loss, info: seen.append(st["step"])
    )
    assert seen == list(range(1, 8)) and st["step"] == 7 and st["tokens"] == 7 * 32 and st["seconds"] > 0
    assert run_training(step_loss, opt, st, steps=7, minutes=10, tokens_per_step=32)["step"] == 7  # nothing left
    assert run_training(step_loss, opt, st, steps=9, minutes=10, tokens_per_step=32)["tokens"] == 9 * 32


def test_stops_at_the_time_budget():
    _, opt, _, step_loss = tiny_run()
    assert run_training(step_loss, opt, steps=100, minutes=0, tokens_per_step=1)["step"] == 0

    def slow():
        time.sleep(0.05)
        return step_loss()

    t0 = time.perf_counter()
    st = run_training(slow, opt, steps=10**6, minutes=0.3 / 60, tokens_per_step=1)
    assert 2 <= st["step"] < 10**6 and time.perf_counter() - t0 < 0.3 + 0.5  # at most one step past 0.3 s


def test_learning_rate_follows_lr_at_and_a_none_keeps_the_optimizers():
    _, opt, _, step_loss = tiny_run()
    lrs = []

    def record():
        lrs.append(opt.param_groups[0]["lr"])
        return step_loss()

    run_training(record, opt, steps=30, minutes=10, tokens_per_step=1, lr=0.5, warmup=5)
    assert lrs == [lr_at(s, 30, 0.5, 5) for s in range(30)]
    assert lrs[:5] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])  # linear warmup to the peak
    assert all(a > b for a, b in zip(lrs[5:], lrs[6:])) and lrs[-1] > 0.05  # cosine decay ...
    assert lr_at(30, 30, 0.5, 5) == pytest.approx(0.05)  # ... to 0.1 x peak at the end
    lrs.clear()
    run_training(record, opt, {"step": 0, "tokens": 0, "seconds": 0.0}, steps=3, minutes=10, tokens_per_step=1)
    assert lrs == [lr_at(29, 30, 0.5, 5)] * 3  # lr=None: the optimizer's, kept


def test_gradients_are_clipped():
    def norm_after(clip):
        model, opt, _, step_loss = tiny_run()
        run_training(lambda: (1000 * step_loss()[0], None), opt, steps=1, minutes=10, tokens_per_step=1, clip=clip)
        return float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()])))

    assert norm_after(1.0) == pytest.approx(1.0, rel=1e-4) and norm_after(None) > 10


def test_weights_outside_the_optimizer_get_no_gradient():
    model, _, _, step_loss = tiny_run()
    opt = torch.optim.AdamW(model[1].parameters())  # the embedding stays frozen
    run_training(step_loss, opt, steps=2, minutes=10, tokens_per_step=1)
    assert model[0].weight.grad is None and model[1].weight.grad is not None


def test_a_killed_run_resumes_to_the_same_weights(tmp_path, monkeypatch):
    steps = 12
    whole, opt, gen, step_loss = tiny_run()
    run_training(step_loss, opt, steps=steps, minutes=10, tokens_per_step=1, lr=1e-2, warmup=3)

    monkeypatch.setattr(training, "SAVE_EVERY_S", 0)  # a save after every step
    model, opt, gen, step_loss = tiny_run()
    ckpt = Checkpoint(tmp_path / "state.pt", {"model": model, "opt": opt, "gen": gen})

    calls = []

    def killed_in_step_6():  # after step 5's save
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return step_loss()

    with pytest.raises(KeyboardInterrupt):
        run_training(
            killed_in_step_6, opt, steps=steps, minutes=10, tokens_per_step=1, lr=1e-2, warmup=3, checkpoint=ckpt
        )
    assert set(torch.load(tmp_path / "state.pt", weights_only=False)) == {"model", "opt", "gen", "st"}

    model, opt, gen, step_loss = tiny_run(seed=1)  # fresh objects, other weights
    ckpt = Checkpoint(tmp_path / "state.pt", {"model": model, "opt": opt, "gen": gen})
    st = ckpt.restore()
    assert st["step"] == 5
    run_training(step_loss, opt, st, steps=steps, minutes=10, tokens_per_step=1, lr=1e-2, warmup=3, checkpoint=ckpt)
    assert st["step"] == steps and ckpt.restore()["step"] == steps
    for a, b in zip(whole.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
