"""CoSpec: beyond lossless. Where draft and target disagree, a policy keeps the draft's token or the target's.

p = target, q = draft. `Arbiter(policy)` is an acceptor: where the two agree (greedy: same argmax;
sampled: the lossless test accepts) it is exactly `Lossless`; at a mismatch it asks the policy, over
the features below, for the probability of keeping the draft's token, and keeps it when that is > 0.5.
Keeping the draft continues the chain (the next drafted token is checked next); taking the target's
token ends the step as a rejection would. Lossless is the policy that never keeps the draft.

`arbitrate` is the same process, token by token, for a batch of prompts with both models in lockstep
(each position: target argmax t, draft argmax d; the chain position j decides whether the position was
drafted at all, as in the SD loop). Its outputs equal the SD loop's; it is what makes RL affordable:
`train_grpo` samples G trajectories per problem with a stochastic policy and pushes up the log-probs
of the decisions of the trajectories whose final answer was better than their group's mean.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import torch

from speclib.core.acceptance import accept_probability, residual
from speclib.core.sampling import sample

if TYPE_CHECKING:
    import pandas as pd

FEATURES = (
    "logp_target_tok",
    "logp_draft_tok",
    "logq_draft_tok",
    "logq_target_tok",
    "entropy_p",
    "entropy_q",
    "margin_p",
    "jsd",
    "chain_pos",
    "depth",
    "recent_agree",
)
RECENT = 8  # positions in the recent-agreement window


def features(p: torch.Tensor, q: torch.Tensor, t: torch.Tensor, d: torch.Tensor, chain_pos, depth, recent):
    """[M, len(FEATURES)] per mismatch. p, q: [M, V] softmax (temperature 1) of target and draft;
    t, d: [M] the target's and the draft's token; chain_pos: index of the drafted token in its chain;
    depth: tokens generated before it; recent: share of agreements among the last RECENT compared positions."""
    lp, lq = p.clamp_min(1e-12).log(), q.clamp_min(1e-12).log()

    def pick(x, i):
        return x.gather(-1, i[:, None])[:, 0]

    m = 0.5 * (p + q)
    lm = m.clamp_min(1e-12).log()
    jsd = 0.5 * ((p * (lp - lm)).sum(-1) + (q * (lq - lm)).sum(-1))

    def as_t(x):
        return torch.as_tensor(x, dtype=torch.float32).expand(len(t))

    return torch.stack(
        [
            pick(lp, t),
            pick(lp, d),
            pick(lq, d),
            pick(lq, t),
            -(p * lp).sum(-1),
            -(q * lq).sum(-1),
            pick(p, t) - pick(p, d),
            jsd,
            as_t(chain_pos),
            as_t(depth) / 100,
            as_t(recent),
        ],
        -1,
    )


# ---- policies: features [M, F] -> probability of keeping the draft's token [M] ---------------------


def always_target(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros(len(x))


class Typical:
    """Medusa's typical acceptance: keep the draft token x if p(x) > min(eps, delta * exp(-H(p)))."""

    def __init__(self, eps: float = 0.3, delta: float = 0.09):
        self.eps, self.delta = eps, delta

    def __call__(self, x):
        i = FEATURES.index
        bar = torch.minimum(torch.full((len(x),), self.eps), self.delta * torch.exp(-x[:, i("entropy_p")]))
        return (x[:, i("logp_draft_tok")].exp() > bar).float()


class Fuzzy:
    """Fuzzy speculative decoding: keep the draft token when JSD(p, q) at that position is below T."""

    def __init__(self, threshold: float):
        self.threshold = threshold

    def __call__(self, x):
        return (x[:, FEATURES.index("jsd")] < self.threshold).float()


class Policy(torch.nn.Module):
    """A tiny network over standardised features -> P(keep draft). hidden=0 is logistic regression
    (the AutoJudge-style classifier); CoSpec's arbiter uses a hidden layer."""

    def __init__(self, hidden: int = 32):
        super().__init__()
        n = len(FEATURES)
        self.register_buffer("mean", torch.zeros(n))
        self.register_buffer("std", torch.ones(n))
        self.register_buffer("bias_shift", torch.zeros(()))  # moves the decision threshold (see calibrate)
        self.net = (
            torch.nn.Sequential(torch.nn.Linear(n, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
            if hidden
            else torch.nn.Linear(n, 1)
        )

    def standardize_on(self, x: torch.Tensor) -> Policy:
        self.mean.copy_(x.mean(0))
        self.std.copy_(x.std(0).clamp_min(1e-3))
        return self

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.mean) / self.std)[:, 0] + self.bias_shift

    def __call__(self, x):
        return torch.sigmoid(self.logits(x))


def policies_table(policies: dict[str, Policy]) -> pd.DataFrame:
    """Every tensor of each policy as one row (policy, hidden, tensor, shape, values): how a notebook
    saves trained policies beside its results (`speclib.workbook.study`) and reads them back with
    `policies_from_table`, exactly."""
    import pandas as pd

    rows = []
    for name, pol in policies.items():
        hidden = pol.net[0].out_features if isinstance(pol.net, torch.nn.Sequential) else 0
        for key, t in pol.state_dict().items():
            rows.append(
                dict(
                    policy=name,
                    hidden=hidden,
                    tensor=key,
                    shape=list(t.shape),
                    values=t.detach().double().flatten().tolist(),
                )
            )
    return pd.DataFrame(rows)


def policies_from_table(table) -> dict[str, Policy]:
    """The policies saved by `policies_table`."""
    out = {}
    for name, g in table.groupby("policy", sort=False):
        pol = Policy(hidden=int(g.hidden.iloc[0]))
        pol.load_state_dict(
            {
                r.tensor: torch.tensor(list(r.values), dtype=torch.float32).reshape(tuple(int(x) for x in r.shape))
                for r in g.itertuples()
            }
        )
        out[name] = pol.eval()
    return out


# ---- the acceptor ---------------------------------------------------------------------------------


class Arbiter:
    """Lossless where draft and target agree; at a mismatch the policy keeps the draft's token or the target's.

    Needs raw logits (the `logits` keyword of `speclib.core.protocols.Acceptor`, which the SD loop passes;
    `ModelDrafter` stores the draft's on the tree) and chains (a tree's siblings have no single "draft
    token" to arbitrate). Counts decisions in `self.log` (one row per mismatch: features, kept)."""

    uses_logits = True

    def __init__(self, policy=always_target):
        self.policy = policy
        self.log: list[tuple[torch.Tensor, bool]] = []
        self.reset([])

    def reset(self, prompt) -> None:
        # depth = position of the current root among the new tokens (the prefill's token is position 0)
        self.depth, self.recent = 0, deque(maxlen=RECENT)

    def _keep(self, logits_row, draft_logits_row, t: int, d: int, j: int) -> bool:
        p, q = torch.softmax(logits_row.float(), -1)[None], torch.softmax(draft_logits_row.float(), -1)[None]
        recent = sum(self.recent) / len(self.recent) if self.recent else 1.0
        x = features(p, q, torch.tensor([t]), torch.tensor([d]), j, self.depth + 1 + j, recent)
        keep = bool(self.policy(x)[0] > 0.5)
        self.log.append((x[0], keep))
        return keep

    def __call__(self, tree, p, greedy, gen, logits=None):
        if not tree.is_chain:
            raise ValueError("Arbiter verifies chains only (ModelDrafter, SelfDrafter); got a branching tree")
        if len(tree) and (logits is None or tree.draft_logits is None):
            raise ValueError("Arbiter needs raw logits: use it through speclib.generate with a ModelDrafter")
        path, row = [], 0
        for i, d in enumerate(tree.tokens):
            t = int(p[row].argmax())  # greedy: the target's token; sampled: its most likely one (a feature)
            agree = (
                t == d if greedy else float(torch.rand((), generator=gen)) < accept_probability(p[row], tree.q[i], d)
            )
            if not agree and not self._keep(logits[row], tree.draft_logits[i], t, d, i):
                self.recent.append(0)
                self.depth += len(path) + 1
                return path, t if greedy else sample(residual(p[row], tree.q[i]), gen)
            self.recent.append(1 if agree else 0)
            path.append(i)
            row = i + 1
        self.depth += len(path) + 1
        return path, int(p[row].argmax()) if greedy else sample(p[row], gen)


# ---- the same process, batched token by token --------------------------------------------------------


# ---- branch rollouts: what each choice at a mismatch leads to -------------------------------------------


# ---- reinforcement learning: GRPO-style policy gradient with a group baseline -------------------------
