"""Training CoSpec's arbitration policies: supervised on branch labels (`fit_supervised`) and by GRPO
(`train_grpo`: G trajectories per problem from a stochastic policy; the log-probs of the decisions of the
trajectories whose final answer beat their group's mean are pushed up)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from speclib.acceptors.cospec import Policy
from speclib.research.cospec_rollouts import arbitrate


def fit_supervised(
    policy: Policy, x: torch.Tensor, y: torch.Tensor, steps: int = 300, lr: float = 0.02, weight_decay: float = 1e-3
) -> list[float]:
    """Full-batch Adam on binary cross-entropy (classes balanced by weight); returns the loss curve.
    With fewer than two examples of either class there is nothing to learn: the policy becomes the
    constant majority decision (target when there are no examples) and the curve is empty."""
    if len(y) == 0 or y.min() == y.max() or min(int(y.sum()), int((1 - y).sum())) < 2:
        policy.bias_shift.fill_(20.0 if len(y) and y.float().mean() > 0.5 else -20.0)
        return []
    policy.standardize_on(x)
    opt = torch.optim.Adam(policy.net.parameters(), lr=lr, weight_decay=weight_decay)
    pos = y.float().mean().clamp(1e-3, 1 - 1e-3)
    w = torch.where(y > 0.5, 0.5 / pos, 0.5 / (1 - pos))
    curve = []
    for _ in range(steps):
        loss = F.binary_cross_entropy_with_logits(policy.logits(x), y.float(), weight=w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        curve.append(loss.item())
    return curve


def grpo_loss(policy: Policy, feats: list[torch.Tensor], kept: list[torch.Tensor], advantage: torch.Tensor):
    """-mean over decisions of advantage(trajectory) * log pi(decision | features)."""
    n = torch.tensor([len(f) for f in feats])
    if n.sum() == 0:
        return torch.zeros((), requires_grad=True)
    x, a = torch.cat(feats).clone(), torch.cat(kept).float()
    logit = policy.logits(x)
    logp = a * F.logsigmoid(logit) + (1 - a) * F.logsigmoid(-logit)
    return -(advantage.repeat_interleave(n) * logp).sum() / n.sum()


def train_grpo(
    policy: Policy,
    target,
    draft,
    prompts: list[list[int]],
    check,
    k: int,
    iterations: int,
    problems_per_iter: int = 32,
    group: int = 8,
    lr: float = 3e-3,
    call_cost: float = 0.0,
    max_new_tokens: int = 128,
    seed: int = 0,
    callback=None,
) -> list[dict]:
    """Each iteration: `group` sampled trajectories for each of `problems_per_iter` training problems;
    reward = correct final answer - call_cost * target calls per token; advantage = (reward - group
    mean) / group std (0 where the whole group agrees); one Adam step on `grpo_loss`. Returns the
    learning curve (reward, accuracy, keep rate per iteration); callback(iteration, policy) may evaluate."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(policy.net.parameters(), lr=lr)
    curve = []
    for it in range(iterations):
        idx = torch.randperm(len(prompts), generator=gen)[:problems_per_iter].tolist()
        batch = [i for i in idx for _ in range(group)]
        rows = arbitrate(
            target,
            draft,
            [prompts[i] for i in batch],
            k,
            policy,
            max_new_tokens,
            sample_policy=True,
            gen=gen,
            batch_size=len(batch),
        )
        correct = torch.tensor([float(check(i, r["tokens"])) for i, r in zip(batch, rows)])
        calls = torch.tensor([r["target_calls"] / max(1, len(r["tokens"])) for r in rows])
        reward = (correct - call_cost * calls).view(-1, group)
        adv = ((reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-6)).flatten()
        loss = grpo_loss(policy, [r["feats"] for r in rows], [r["kept"] for r in rows], adv)
        opt.zero_grad()
        loss.backward()
        opt.step()
        n_dec = sum(len(r["kept"]) for r in rows)
        rec = dict(
            iteration=it + 1,
            reward=reward.mean().item(),
            accuracy=correct.mean().item(),
            keep_rate=sum(int(r["kept"].sum()) for r in rows) / max(1, n_dec),
            mismatches_per_traj=n_dec / len(rows),
            calls_per_token=calls.mean().item(),
            loss=loss.item(),
        )
        if callback is not None:
            rec.update(callback(it + 1, policy) or {})
        curve.append(rec)
    return curve
