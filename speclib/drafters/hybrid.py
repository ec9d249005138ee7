"""Choosing the draft source at every step: Hybrid Verified Decoding and the rules it is compared with.

    HybridDrafter(cache, model, policy="hvd", predictor=PayoffPredictor(...), costs=Costs(...))

`cache` is one parameter-free drafter or a list of them: chains (SuffixDrafter, PromptLookupDrafter)
or trees (TokenRecycling, RestDrafter). Each step every cache drafter proposes a candidate for free;
the policy decides which one to verify, or to run the model drafter instead (`model=None`: no model
drafter, the alternative is a plain one-token step; policies "model" and "arctic" then make no sense):

    "model"    always the model drafter             "cache"    always the first cache's draft (maybe empty)
    "arctic"   first cache iff its score >= model k "sam"      first cache iff its match length >= 4
               (ArcticInference's hybrid rule)                 (SAM-Decoding's rule)
    "hvd"      the most expected tokens per second: for each cache candidate and each length m of its
               prefix, (1 + the predictor's expected payoff of verifying m tokens) over the measured
               cost of drafting plus verifying m + 1 tokens (with `cut=False`, whole candidates only;
               a tree is always verified whole: n nodes cost a pass over n + 1 tokens and pay its
               expected accepted depth);
               for the model drafter, the same from its running per-token acceptance (starting from
               `model_prior`, measured offline). Verifying tokens that will not be accepted costs
               time on a compute-bound target; verify cost need not grow with m, so the best prefix
               is found by trying every length
    "oracle"   hindsight (greedy only): whichever candidate the target's own greedy continuation accepts
               furthest, given that continuation as `reference` (an upper bound, not a decoder)

`log` records, for every step, the features of the cache candidate the policy ranked first (for the
fixed rules: the first cache's), the chosen source, and after verification the accepted length: the
training data of the predictor. The features of a candidate include how far it agrees with the other
caches' candidates (a tree by its spine, the first child at every depth): two independent sources
proposing the same continuation is strong evidence. A tree's draft_len is its depth, the most it can
accept; `nodes` is its size.

Cache drafters that learn from verify passes (Token Recycling: `VerifyObserver`) are handed every pass,
whichever source drafted the verified tree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from speclib.core.protocols import LM, ScoredDrafter, VerifyObserver
from speclib.core.sampling import Sampling
from speclib.core.tree import Tree

POLICIES = ("model", "cache", "arctic", "sam", "hvd", "oracle")
FEATURES = (
    "suffix_source",
    "score",
    "match_len",
    "draft_len",
    "p_first",
    "p_last",
    "p_mean",
    "position",
    "global_tree",
    "agree",
    "other_len",
    "source_recent",
    "recycling_source",
    "rest_source",
    "nodes",
)


def feature_matrix(logs) -> np.ndarray:
    """[n, len(FEATURES)] from logged steps (a DataFrame of `HybridDrafter.log` rows). Logs recorded
    before the tree sources existed lack their columns; they get the values the code logs now for a
    chain: not recycling, not REST, as many nodes as draft_len."""
    df = logs.copy()
    for col in ("recycling_source", "rest_source"):
        if col not in df:
            df[col] = 0.0
    if "nodes" not in df:
        df["nodes"] = df["draft_len"]
    return df[list(FEATURES)].to_numpy(dtype=float)


@dataclass
class Costs:
    """Seconds: verify_s[n] one step verifying n tokens (n = 1..max), model_token_s one model-drafter
    token, cache_s one cache draft. Measure them (`fitted` through a benchmark, `from_steps` from the
    loop's own logs)."""

    verify_s: dict[int, float]
    model_token_s: float
    cache_s: float = 0.0

    def verify(self, n: int) -> float:
        return self.verify_s[min(max(n, 1), max(self.verify_s))]

    @classmethod
    def fitted(cls, ns, seconds, model_token_s: float, cache_s: float = 0.0, n_max: int | None = None) -> Costs:
        """verify_s[1..n_max] (default: the largest n measured) from a least-squares line a + b (n - 1),
        b >= 0, through measured T(n): on a shared machine single medians are noisy enough to make 16
        tokens look cheaper than 4."""
        ns, t = np.asarray(ns, float), np.asarray(seconds, float)
        b, a = np.polyfit(ns - 1, t, 1)
        if b < 0:
            b, a = 0.0, float(t.mean())
        n_max = int(ns.max()) if n_max is None else n_max
        return cls({n: float(a + b * (n - 1)) for n in range(1, n_max + 1)}, model_token_s, cache_s)

    @classmethod
    def from_steps(cls, steps, min_count: int = 20) -> Costs:
        """Costs as the decoding loop itself paid them, from logged steps (`Generation.stats.steps` of
        cache-drafted and model-drafted runs). verify_s[n], n = drafted + 1: the median verify_s of the
        steps of that size where at least `min_count` were seen, else the line fitted through those
        medians. verify_s covers the target pass, acceptance, commit and the drafters' updates, and is
        not smooth in n (on a CPU, matmul kernels for 2-4 rows can cost more than for 5), so measured
        sizes keep their own value. model_token_s = median draft_s / drafted over model steps (with the
        draft model's catch-up); cache_s = median draft_s over cache steps."""
        by_n: dict[int, list[float]] = {}
        model, cache = [], []
        for s in steps:
            if s["drafted"]:
                by_n.setdefault(s["drafted"] + 1, []).append(s["verify_s"])
                (model if s["source"] == "model" else cache).append(
                    s["draft_s"] / (s["drafted"] if s["source"] == "model" else 1)
                )
        ns = sorted(n for n, v in by_n.items() if len(v) >= min_count)
        if len(ns) < 2 or not model:
            raise ValueError(f"need model-drafted steps and >= 2 draft sizes seen >= {min_count} times, got sizes {ns}")
        med = {n: float(np.median(by_n[n])) for n in ns}
        out = cls.fitted(
            ns, list(med.values()), float(np.median(model)), float(np.median(cache)) if cache else 0.0, n_max=max(by_n)
        )
        out.verify_s.update(med)
        return out


class PayoffPredictor:
    """The distribution of a cache draft's accepted length from its features: a discrete-time
    survival model. A tiny MLP (features -> 32 -> 32 -> L, ReLU) gives, for every draft position l,
    the probability h_l that token l is accepted given that the l - 1 before it were; then
    P(accepted >= l) = h_1 ... h_l, and the expected payoff of verifying the first m tokens is
    sum_{l <= m} P(accepted >= l). Fitted with torch on logged steps (each logged draft contributes
    one Bernoulli outcome per position it reached: binary cross-entropy, full batch, seeded, stopped
    where the loss on a held-out `val_frac` of the rows is lowest) and
    evaluated in numpy, so a prediction costs microseconds inside the decoding loop. A distribution,
    not a point estimate, is what deciding how many tokens to verify needs: token l is worth its
    verification cost when P(accepted >= l) is high enough, whatever the mean.

    A feature constant in the training logs carries no information and is ignored: standardising it
    by its (zero) spread would turn any other value met while decoding into an enormous input."""

    def __init__(
        self,
        hidden: int = 32,
        steps: int = 600,
        lr: float = 1e-2,
        weight_decay: float = 1e-3,
        val_frac: float = 0.2,
        seed: int = 0,
    ):
        self.hidden, self.steps, self.lr, self.seed = hidden, steps, lr, seed
        self.weight_decay, self.val_frac = weight_decay, val_frac
        self.weights: list[np.ndarray] | None = None

    def fit(self, X: np.ndarray, accepted: np.ndarray) -> PayoffPredictor:
        """X [n, len(FEATURES)]; accepted [n] ints, 0 <= accepted <= draft_len."""
        X, y = np.asarray(X, float), np.asarray(accepted)
        if len(X) < 2 or X.ndim != 2 or X.shape[1] != len(FEATURES):
            raise ValueError(f"need >= 2 rows of {len(FEATURES)} features, got shape {X.shape}")
        n = X[:, FEATURES.index("draft_len")].astype(int)
        if y.shape != (len(X),) or (y != np.round(y)).any() or (y < 0).any() or (y > n).any():
            raise ValueError("accepted must hold one integer per row, between 0 and that row's draft_len")
        self.L = max(1, int(n.max()))
        self.mu, sd = X.mean(0), X.std(0)
        self.scale = np.divide(1, sd, out=np.zeros_like(sd), where=sd > 1e-9)  # 0: ignored
        pos = np.arange(1, self.L + 1)
        reached = pos[None] <= np.minimum(y + 1, n)[:, None]  # position l was verified
        target = torch.tensor(pos[None] <= y[:, None], dtype=torch.float32)  # and accepted
        mask = torch.tensor(reached, dtype=torch.float32)
        g = torch.Generator().manual_seed(self.seed)
        sizes = [X.shape[1], self.hidden, self.hidden, self.L]
        params = []
        for i, o in zip(sizes, sizes[1:]):
            params += [
                (torch.randn(i, o, generator=g) * (2 / i) ** 0.5).requires_grad_(),
                torch.zeros(o, requires_grad=True),
            ]
        xt = torch.tensor((X - self.mu) * self.scale, dtype=torch.float32)
        # early stopping on a held-out share of the rows: the hazards of late positions rest on few
        # drafts and overfit quickly
        val = torch.rand(len(X), generator=g) < self.val_frac if len(X) >= 10 else torch.zeros(len(X), dtype=torch.bool)

        def losses():
            h = xt
            for j in range(0, len(params), 2):
                h = h @ params[j] + params[j + 1]
                if j + 2 < len(params):
                    h = torch.relu(h)
            bce = torch.nn.functional.binary_cross_entropy_with_logits(h, target, reduction="none") * mask
            fit, held = bce[~val].sum() / mask[~val].sum().clamp(min=1), bce[val].sum() / mask[val].sum().clamp(min=1)
            return fit, held

        opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        best, self.weights = float("inf"), None
        for _ in range(self.steps):
            fit, held = losses()
            if not val.any() or held.item() < best:
                best, self.weights = held.item(), [p.detach().numpy().astype(np.float64) for p in params]
            opt.zero_grad()
            fit.backward()
            opt.step()
        return self

    def survival(self, X: np.ndarray) -> np.ndarray:
        """[n, W]: P(accepted >= l) for l = 1..W, 0 beyond each row's draft_len; W = the longest draft
        of the fit logs or of X (positions beyond the fit's keep its last per-position probability)."""
        if self.weights is None:
            raise RuntimeError("PayoffPredictor.survival before fit")
        X = np.asarray(X, float)
        h = (X - self.mu) * self.scale
        w = self.weights
        for j in range(0, len(w), 2):
            h = h @ w[j] + w[j + 1]
            if j + 2 < len(w):
                h = np.maximum(h, 0)
        n = X[:, [FEATURES.index("draft_len")]]
        W = max(self.L, int(n.max(initial=0)))
        h = np.concatenate([h, np.repeat(h[:, -1:], W - self.L, 1)], 1)
        return np.cumprod(1 / (1 + np.exp(-h)), 1) * (np.arange(1, W + 1)[None] <= n)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Expected accepted length of the whole draft, in [0, draft_len]."""
        if self.weights is None:
            raise RuntimeError("PayoffPredictor.predict before fit")
        return self.survival(X).sum(1)

    def save(self, path) -> None:
        """The fitted predictor as one .npz (what `load` reads back; a server takes it with --predictor)."""
        if self.weights is None:
            raise RuntimeError("PayoffPredictor.save before fit")
        w = {f"w{i}": a for i, a in enumerate(self.weights)}
        np.savez(path, features=np.array(FEATURES), L=self.L, mu=self.mu, scale=self.scale, **w)

    @classmethod
    def load(cls, path) -> PayoffPredictor:
        with np.load(path) as z:
            if tuple(z["features"]) != FEATURES:
                raise ValueError(f"{path} was fitted on other features ({list(z['features'])}); refit it")
            p = cls()
            p.L, p.mu, p.scale = int(z["L"]), z["mu"], z["scale"]
            p.weights = [z[f"w{i}"] for i in range(sum(k.startswith("w") for k in z.files))]
        return p


@dataclass
class _Recent:
    """Exponential moving averages of per-token acceptance per draft source (Tree.source)."""

    decay: float = 0.9
    rate: dict = field(default_factory=dict)

    def get(self, source: str) -> float:
        return self.rate.get(source, 0.5)

    def update(self, source: str, accepted: int, drafted: int) -> None:
        if drafted:
            reached = min(accepted + 1, drafted)
            self.rate[source] = self.decay * self.get(source) + (1 - self.decay) * accepted / reached


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def spine(tree: Tree) -> list[int]:
    """A tree's first-child path (a chain's tokens): the drafters order children best first."""
    out, kids = [], tree.children[0]
    while kids:
        out.append(tree.tokens[kids[0]])
        kids = tree.children[kids[0] + 1]
    return out


def accepted_greedy(tree: Tree, future: list[int]) -> int:
    """How many tokens greedy verification accepts from `tree` when the target continues with `future`."""
    n, kids = 0, tree.children[0]
    while n < len(future) and (hit := [i for i in kids if tree.tokens[i] == future[n]]):
        n, kids = n + 1, tree.children[hit[0] + 1]
    return n


class HybridDrafter:
    def __init__(
        self,
        cache,
        model,
        policy: str = "hvd",
        predictor: PayoffPredictor | None = None,
        costs: Costs | None = None,
        reference: list[int] | None = None,
        model_prior: float = 0.5,
        cut: bool = True,
    ):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if policy == "hvd" and (predictor is None or costs is None):
            raise ValueError("policy 'hvd' needs a fitted predictor and measured costs")
        if policy == "oracle" and reference is None:
            raise ValueError("policy 'oracle' needs the target's greedy continuation as `reference`")
        if not 0 <= model_prior < 1:
            raise ValueError(
                f"model_prior (per-token acceptance of the model drafter) must lie in [0, 1), got {model_prior!r}"
            )
        self.caches = list(cache) if isinstance(cache, (list, tuple)) else [cache]
        if not self.caches:
            raise ValueError("give at least one cache drafter")
        if model is None and policy in ("model", "arctic"):
            raise ValueError(f"policy {policy!r} needs a model drafter")
        self.model, self.policy = model, policy
        self._models = [] if model is None else [model]
        self._observers = [c for c in self.caches if isinstance(c, VerifyObserver)]
        self.predictor, self.costs, self.reference = predictor, costs, reference
        self.model_prior = model_prior  # where the model's running acceptance starts each request
        self.cut = cut  # False: verify cache candidates whole

    @property
    def max_nodes(self) -> int:
        return max(c.max_nodes for c in self.caches + self._models)

    def check_compatible(self, target: LM) -> None:
        for d in self.caches + self._models:
            d.check_compatible(target)

    def reset(self, prompt: list[int], sampling: Sampling, gen: torch.Generator) -> None:
        if self.policy == "oracle" and not sampling.greedy:
            raise ValueError("the hindsight oracle is defined for greedy decoding only")
        for c in self.caches + self._models:
            c.reset(prompt, sampling, gen)
        self._scored = [isinstance(c, ScoredDrafter) for c in self.caches]  # `last` may appear at reset
        self.prompt_len, self.recent, self.log = len(prompt), _Recent(), []
        self.recent.rate["model"] = self.model_prior
        self._peek = None

    def candidates(self, trees: list[Tree]) -> None:
        """This step's cache candidates, one per cache, with their spines and depths."""
        self._cands = trees
        self._spines = [c.tokens if c.is_chain else spine(c) for c in trees]
        self._depth = [len(c) if c.is_chain else max(c.depths(), default=-1) + 1 for c in trees]

    def features(self, i: int, context: list[int]) -> np.ndarray:
        """The features of cache candidate i (see FEATURES)."""
        cand, cache = self._cands[i], self.caches[i]
        last = cache.last if self._scored[i] else {}
        probs = last.get("probs", [1.0] * len(cand)) or [0.0]
        others = [s for j, s in enumerate(self._spines) if j != i]
        agree = max((_common_prefix(self._spines[i], o) for o in others), default=0)
        other_len = max((len(o) for o in others), default=0)
        return np.array(
            [
                float(cand.source == "suffix"),
                last.get("score", float(len(cand))),
                last.get("match_len", 0),
                self._depth[i],
                probs[0],
                probs[-1],
                float(np.mean(probs)),
                len(context) - self.prompt_len,
                float(last.get("tree") == "global"),
                agree,
                other_len,
                self.recent.get(cand.source),
                float(cand.source == "recycling"),
                float(cand.source == "rest"),
                len(cand),
            ],
            dtype=float,
        )

    def draft(self, context: list[int]) -> Tree:
        t0 = time.perf_counter()
        self.candidates([c.draft(context) for c in self.caches])
        self._cache_s = time.perf_counter() - t0
        X = np.stack([self.features(i, context) for i in range(len(self._cands))])
        best, use_cache = self._choose(X, context)
        if use_cache:
            tree = self._cands[best]
            if self._keep is not None and self._keep < len(tree) and tree.is_chain:  # a point-mass chain: cut it
                tree = Tree.chain(tree.tokens[: self._keep], None, source=tree.source)
        elif self.model is None:  # no model drafter: a plain step
            tree = Tree([], [], None, source="none")
        else:  # the oracle may already have drafted from the model
            tree = self._peek if self._peek is not None else self.model.draft(context)
        self._used = tree.source if use_cache else "model" if self.model is not None else "none"
        self.log.append(
            dict(
                zip(FEATURES, X[best].tolist()),
                source="cache" if use_cache else self._used,
                cache_source=self._cands[best].source,
                drafted=len(tree),
                cache_s=self._cache_s,
            )
        )
        return tree

    def _choose(self, X: np.ndarray, context: list[int]) -> tuple[int, bool]:
        """(index of the cache candidate ranked first, whether to verify it instead of the model draft);
        sets self._keep, how many of its tokens to verify (None: all)."""
        n, self._keep = len(self._cands[0]), None
        if self.policy == "cache":
            return 0, True
        if self.policy == "model" or not any(len(c) for c in self._cands):
            return 0, False
        if self.policy == "arctic":
            return 0, n > 0 and X[0, FEATURES.index("score")] >= self.model.max_nodes
        if self.policy == "sam":
            return 0, n > 0 and X[0, FEATURES.index("match_len")] >= 4
        if self.policy == "oracle":
            return self._oracle(context)
        c = self.costs
        gain = np.cumsum(self.predictor.survival(X), 1)  # [i, m - 1]: expected payoff of m tokens
        best, rate = 0, -1.0
        for i, cand in enumerate(self._cands):
            if not len(cand):
                continue
            if not cand.is_chain:  # a tree: whole, its expected accepted depth for its size
                r = (gain[i, self._depth[i] - 1] + 1) / (self._cache_s + c.verify(len(cand) + 1))
                if r > rate:
                    best, rate, self._keep = i, r, None
                continue
            for m in range(1, len(cand) + 1) if self.cut else [len(cand)]:
                r = (gain[i, m - 1] + 1) / (self._cache_s + c.verify(m + 1))
                if r > rate:
                    best, rate, self._keep = i, r, m
        if self.model is None:  # the alternative: a plain step, one token per pass
            return best, bool(rate > 1 / (self._cache_s + c.verify(1)))
        a, k = min(self.recent.get("model"), 0.999), self.model.max_nodes
        e_model = (a - a ** (k + 1)) / (1 - a)  # expected accepted, i.i.d. a
        rate_model = (e_model + 1) / (self._cache_s + k * c.model_token_s + c.verify(k + 1))
        return best, bool(rate > rate_model)

    def _oracle(self, context: list[int]) -> tuple[int, bool]:
        future = self.reference[len(context) - self.prompt_len :]
        accepted = [accepted_greedy(t, future) for t in self._cands]
        best = int(np.argmax(accepted))  # ties: the earlier cache
        # the model draft is computed for the comparison only when no cache draft is already perfect
        if (accepted[best] == self._depth[best] and accepted[best] > 0) or self.model is None:
            return best, accepted[best] > 0
        self._peek = self.model.draft(context)
        return best, accepted[best] > accepted_greedy(self._peek, future)

    def observe_verify(self, tokens: list[int], logits: torch.Tensor, path: list[int], next_token: int) -> None:
        for d in self._observers:
            d.observe_verify(tokens, logits, path, next_token)

    def observe(self, accepted: list[int]) -> None:
        step = self.log[-1]
        step["accepted"] = len(accepted)
        self.recent.update(self._used, len(accepted), step["drafted"])
        if self._used == "model":
            self.model.observe(accepted)
        elif self._peek is not None:  # an oracle peek that lost: drop it, keep the fed tail
            self.model.observe([])
        self._peek = None
        for c in self.caches:
            c.observe(accepted)
