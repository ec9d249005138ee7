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

import torch
import torch.nn.functional as F

from .acceptance import accept_probability, residual
from .sampling import sample

FEATURES = ("logp_target_tok", "logp_draft_tok", "logq_draft_tok", "logq_target_tok", "entropy_p", "entropy_q",
            "margin_p", "jsd", "chain_pos", "depth", "recent_agree")
RECENT = 8                      # positions in the recent-agreement window


def features(p: torch.Tensor, q: torch.Tensor, t: torch.Tensor, d: torch.Tensor, chain_pos, depth, recent):
    """[M, len(FEATURES)] per mismatch. p, q: [M, V] softmax (temperature 1) of target and draft;
    t, d: [M] the target's and the draft's token; chain_pos: index of the drafted token in its chain;
    depth: tokens generated before it; recent: share of agreements among the last RECENT compared positions."""
    lp, lq = p.clamp_min(1e-12).log(), q.clamp_min(1e-12).log()
    pick = lambda x, i: x.gather(-1, i[:, None])[:, 0]
    m = 0.5 * (p + q)
    lm = m.clamp_min(1e-12).log()
    jsd = 0.5 * ((p * (lp - lm)).sum(-1) + (q * (lq - lm)).sum(-1))
    as_t = lambda x: torch.as_tensor(x, dtype=torch.float32).expand(len(t))
    return torch.stack([pick(lp, t), pick(lp, d), pick(lq, d), pick(lq, t), -(p * lp).sum(-1), -(q * lq).sum(-1),
                        pick(p, t) - pick(p, d), jsd, as_t(chain_pos), as_t(depth) / 100, as_t(recent)], -1)


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
        self.register_buffer("bias_shift", torch.zeros(()))    # moves the decision threshold (see calibrate)
        self.net = (torch.nn.Sequential(torch.nn.Linear(n, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
                    if hidden else torch.nn.Linear(n, 1))

    def standardize_on(self, x: torch.Tensor) -> "Policy":
        self.mean.copy_(x.mean(0)); self.std.copy_(x.std(0).clamp_min(1e-3))
        return self

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.mean) / self.std)[:, 0] + self.bias_shift

    def __call__(self, x):
        return torch.sigmoid(self.logits(x))


def policies_table(policies: dict[str, Policy]) -> "pd.DataFrame":
    """Every tensor of each policy as one row (policy, hidden, tensor, shape, values): how a notebook
    saves trained policies beside its results (`speclib.study`) and reads them back with
    `policies_from_table`, exactly."""
    import pandas as pd
    rows = []
    for name, pol in policies.items():
        hidden = pol.net[0].out_features if isinstance(pol.net, torch.nn.Sequential) else 0
        for key, t in pol.state_dict().items():
            rows.append(dict(policy=name, hidden=hidden, tensor=key, shape=list(t.shape),
                             values=t.detach().double().flatten().tolist()))
    return pd.DataFrame(rows)


def policies_from_table(table) -> dict[str, Policy]:
    """The policies saved by `policies_table`."""
    out = {}
    for name, g in table.groupby("policy", sort=False):
        pol = Policy(hidden=int(g.hidden.iloc[0]))
        pol.load_state_dict({r.tensor: torch.tensor(list(r.values), dtype=torch.float32).reshape(tuple(int(x) for x in r.shape))
                             for r in g.itertuples()})
        out[name] = pol.eval()
    return out


def fit_supervised(policy: Policy, x: torch.Tensor, y: torch.Tensor, steps: int = 300, lr: float = 0.02,
                   weight_decay: float = 1e-3) -> list[float]:
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
        opt.zero_grad(); loss.backward(); opt.step()
        curve.append(loss.item())
    return curve


# ---- the acceptor ---------------------------------------------------------------------------------

class Arbiter:
    """Lossless where draft and target agree; at a mismatch the policy keeps the draft's token or the target's.

    Needs raw logits (the SD loop passes the target's; `ModelDrafter` stores the draft's on the tree)
    and chains (a tree's siblings have no single "draft token" to arbitrate). Counts decisions in
    `self.log` (one row per mismatch: features, kept)."""
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
            t = int(p[row].argmax())       # greedy: the target's token; sampled: its most likely one (a feature)
            agree = t == d if greedy else float(torch.rand((), generator=gen)) < accept_probability(p[row], tree.q[i], d)
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

def _prefill(model, prompts: list[list[int]], pad: int):
    L = max(map(len, prompts))
    ids = torch.tensor([[pad] * (L - len(x)) + x for x in prompts])
    mask = torch.tensor([[0] * (L - len(x)) + [1] * len(x) for x in prompts])
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    return out.logits[:, -1].float(), out.cache, mask, pos[:, -1]


def _advance(model, tok, cache, mask, last_pos):
    mask = torch.cat([mask, torch.ones(len(tok), 1, dtype=mask.dtype)], 1)
    out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=(last_pos + 1)[:, None],
                cache=cache, use_cache=True)
    return out.logits[:, -1].float(), out.cache, mask, last_pos + 1


@torch.inference_mode()
def arbitrate(target, draft, prompts: list[list[int]], k: int, policy=always_target, max_new_tokens: int = 128,
              sample_policy: bool = False, gen: torch.Generator | None = None, batch_size: int = 128) -> list[dict]:
    """Run CoSpec decoding (greedy) for many prompts at once; one dict per prompt: tokens, mismatches
    (features [M, F], kept [M] as decided), target_calls (verify passes the SD loop would make after its
    prefill). draft=None decodes the target alone (greedy AR), which is what branch rollouts use.
    With sample_policy the keep decisions are Bernoulli draws from the policy (for RL), else p > 0.5."""
    out = []
    for s in range(0, len(prompts), batch_size):
        out += _arbitrate_chunk(target, draft, prompts[s:s + batch_size], k, policy, max_new_tokens, sample_policy, gen)
    return out


def _arbitrate_chunk(target, draft, prompts, k, policy, max_new_tokens, sample_policy, gen):
    B, eos = len(prompts), target.eos_token_id
    eos = -1 if eos is None else eos                 # a model without EOS runs to max_new_tokens
    tm, dm = target.model, draft.model if draft is not None else None
    pad = max(eos, 0)
    lt, tc, tmask, tpos = _prefill(tm, prompts, pad)
    if dm is not None:
        ld, dc, dmask, dpos = _prefill(dm, prompts, pad)
    rows = [dict(tokens=[], feats=[], kept=[], at=[]) for _ in range(B)]
    calls = torch.zeros(B, dtype=torch.long)         # verify passes after the prefill
    # position in the current chain; k = a target-only position (bonus or, at step 0, the prefill's token)
    j = torch.full((B,), k, dtype=torch.long)
    last_ended = torch.ones(B, dtype=torch.bool)
    recent = [deque(maxlen=RECENT) for _ in range(B)]
    alive = torch.ones(B, dtype=torch.bool)
    for step in range(max_new_tokens):
        t = lt.argmax(-1)
        tok = t.clone()
        if dm is not None:
            d = ld.argmax(-1)
            drafted = j < k
            mism = (drafted & (d != t) & alive).nonzero()[:, 0]
            keep = torch.zeros(B, dtype=torch.bool)
            if len(mism):
                rec = torch.tensor([sum(recent[b]) / len(recent[b]) if recent[b] else 1.0 for b in mism.tolist()])
                x = features(torch.softmax(lt[mism], -1), torch.softmax(ld[mism], -1), t[mism], d[mism],
                             j[mism].float(), torch.full((len(mism),), float(step)), rec)
                prob = policy(x).detach()
                kk = torch.bernoulli(prob, generator=gen).bool() if sample_policy else prob > 0.5
                keep[mism] = kk
                for n, b in enumerate(mism.tolist()):
                    rows[b]["feats"].append(x[n]); rows[b]["kept"].append(bool(kk[n]))
                    rows[b]["at"].append((step, int(d[b])))         # position and the draft's token
            tok = torch.where(keep, d, t)
            for b in (drafted & alive).nonzero()[:, 0].tolist():
                recent[b].append(int(d[b] == t[b]))
            ends_chain = ~drafted | ((d != t) & ~keep)        # a bonus token, or the target's correction
            if step:                                          # each verify pass ends one chain; step 0 is the prefill
                calls += ends_chain & alive
            last_ended = torch.where(alive, ends_chain, last_ended)
            j = torch.where(ends_chain, 0, j + 1)
        elif step:
            calls += alive
        for b in alive.nonzero()[:, 0].tolist():
            rows[b]["tokens"].append(int(tok[b]))
        alive &= tok != eos
        if not alive.any() or step + 1 == max_new_tokens:
            break
        tok = torch.where(alive, tok, pad)           # finished rows keep running on padding (ignored)
        lt, tc, tmask, tpos = _advance(tm, tok, tc, tmask, tpos)
        if dm is not None:
            ld, dc, dmask, dpos = _advance(dm, tok, dc, dmask, dpos)
    calls += ~last_ended                             # generation ended inside a chain: that pass still ran
    for b, r in enumerate(rows):
        r["target_calls"] = int(calls[b])
        r["feats"] = torch.stack(r["feats"]) if r["feats"] else torch.zeros(0, len(FEATURES))
        r["kept"] = torch.tensor(r["kept"], dtype=torch.bool)
    return rows


# ---- branch rollouts: what each choice at a mismatch leads to -------------------------------------------

def branch_labels(target, draft, prompts: list[list[int]], check, max_new_tokens: int = 128,
                  batch_size: int = 128) -> list[dict]:
    """Walk the target's greedy solution of each prompt; at every position where the draft's argmax
    differs, continue greedily with the target from the draft's token and judge both branches.

    check(i, tokens) -> bool says whether completion `tokens` of prompt i is correct. One dict per
    mismatch: problem, pos, features [F], draft_correct (the draft token's branch), target_correct
    (the target's own solution)."""
    base = arbitrate(target, draft, prompts, max_new_tokens + 1, always_target, max_new_tokens, batch_size=batch_size)
    todo = [(i, pos, dtok, x) for i, r in enumerate(base) for (pos, dtok), x in zip(r["at"], r["feats"])]
    heads = [base[i]["tokens"][:pos] + [dtok] for i, pos, dtok, _ in todo]
    rolls = arbitrate(target, None, [prompts[i] + h for (i, *_), h in zip(todo, heads)], 1, always_target,
                      max(1, max_new_tokens - min((len(h) for h in heads), default=1)), batch_size=batch_size)
    target_ok = [check(i, r["tokens"]) for i, r in enumerate(base)]
    return [dict(problem=i, pos=pos, features=x, target_correct=target_ok[i],
                 draft_correct=check(i, (h + r["tokens"])[:max_new_tokens]))
            for (i, pos, _, x), h, r in zip(todo, heads, rolls)]


# ---- reinforcement learning: GRPO-style policy gradient with a group baseline -------------------------

def grpo_loss(policy: Policy, feats: list[torch.Tensor], kept: list[torch.Tensor], advantage: torch.Tensor):
    """-mean over decisions of advantage(trajectory) * log pi(decision | features)."""
    n = torch.tensor([len(f) for f in feats])
    if n.sum() == 0:
        return torch.zeros((), requires_grad=True)
    x, a = torch.cat(feats).clone(), torch.cat(kept).float()
    logit = policy.logits(x)
    logp = a * F.logsigmoid(logit) + (1 - a) * F.logsigmoid(-logit)
    return -(advantage.repeat_interleave(n) * logp).sum() / n.sum()


def train_grpo(policy: Policy, target, draft, prompts: list[list[int]], check, k: int, iterations: int,
               problems_per_iter: int = 32, group: int = 8, lr: float = 3e-3, call_cost: float = 0.0,
               max_new_tokens: int = 128, seed: int = 0, callback=None) -> list[dict]:
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
        rows = arbitrate(target, draft, [prompts[i] for i in batch], k, policy, max_new_tokens,
                         sample_policy=True, gen=gen, batch_size=len(batch))
        correct = torch.tensor([float(check(i, r["tokens"])) for i, r in zip(batch, rows)])
        calls = torch.tensor([r["target_calls"] / max(1, len(r["tokens"])) for r in rows])
        reward = (correct - call_cost * calls).view(-1, group)
        adv = ((reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-6)).flatten()
        loss = grpo_loss(policy, [r["feats"] for r in rows], [r["kept"] for r in rows], adv)
        opt.zero_grad(); loss.backward(); opt.step()
        n_dec = sum(len(r["kept"]) for r in rows)
        rec = dict(iteration=it + 1, reward=reward.mean().item(), accuracy=correct.mean().item(),
                   keep_rate=sum(int(r["kept"].sum()) for r in rows) / max(1, n_dec),
                   mismatches_per_traj=n_dec / len(rows), calls_per_token=calls.mean().item(), loss=loss.item())
        if callback is not None:
            rec.update(callback(it + 1, policy) or {})
        curve.append(rec)
    return curve
