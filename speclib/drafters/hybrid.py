"""Choosing the draft source at every step: Hybrid Verified Decoding and the rules it is compared with.

    HybridDrafter(cache, model, policy="hvd", predictor=PayoffPredictor(...), costs=Costs(...))

Each step the cache drafter (SuffixDrafter or PromptLookupDrafter) proposes a candidate for free;
the policy decides whether to verify it or to run the model drafter instead:

    "model"    always the model drafter             "cache"    always the cache draft (maybe empty)
    "arctic"   cache iff its score >= model k       "sam"      cache iff its match length >= 4
               (ArcticInference's hybrid rule)                 (SAM-Decoding's rule)
    "hvd"      the source with the larger expected tokens per second: the predictor's accepted-length
               estimate for the cache draft, the model drafter's running per-token acceptance (starting
               from `model_prior`, measured offline) for the model, each over its measured cost of
               drafting plus verifying
    "oracle"   hindsight (greedy only): whichever draft the target's own greedy continuation accepts
               further, given that continuation as `reference` (an upper bound, not a decoder)

`log` records, for every step, the cache candidate's features, the chosen source, and after
verification the accepted length: the training data of the predictor.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..lm import LM
from ..sampling import Sampling
from ..tree import Tree

POLICIES = ("model", "cache", "arctic", "sam", "hvd", "oracle")
FEATURES = ("score", "match_len", "draft_len", "p_first", "p_last", "p_mean", "position", "global_tree",
            "cache_recent", "model_recent")


@dataclass
class Costs:
    """Seconds, measured at start: verify_s[n] one target pass scoring n tokens (n = 1..max),
    model_token_s one model-drafter token, cache_s one cache draft."""
    verify_s: dict[int, float]
    model_token_s: float
    cache_s: float = 0.0

    def verify(self, n: int) -> float:
        return self.verify_s[min(max(n, 1), max(self.verify_s))]


class PayoffPredictor:
    """Accepted length of a cache draft from its features: a tiny MLP (features -> 32 -> 32 -> 1,
    ReLU), fitted with torch on logged steps (Huber loss, full batch, seeded), evaluated in numpy so
    a prediction costs microseconds inside the decoding loop. Clipped to [0, draft length]."""

    def __init__(self, hidden: int = 32, steps: int = 600, lr: float = 1e-2, seed: int = 0):
        self.hidden, self.steps, self.lr, self.seed = hidden, steps, lr, seed
        self.weights: list[np.ndarray] | None = None

    def fit(self, X: np.ndarray, y: np.ndarray) -> "PayoffPredictor":
        X, y = np.asarray(X, float), np.asarray(y, float)
        if len(X) < 2 or X.shape[1] != len(FEATURES):
            raise ValueError(f"need >= 2 rows of {len(FEATURES)} features, got shape {X.shape}")
        self.mu, self.sd = X.mean(0), X.std(0) + 1e-6
        g = torch.Generator().manual_seed(self.seed)
        sizes = [X.shape[1], self.hidden, self.hidden, 1]
        params = []
        for i, o in zip(sizes, sizes[1:]):
            params += [(torch.randn(i, o, generator=g) * (2 / i) ** 0.5).requires_grad_(),
                       torch.zeros(o, requires_grad=True)]
        xt = torch.tensor((X - self.mu) / self.sd, dtype=torch.float32)
        yt = torch.tensor(y, dtype=torch.float32)
        opt = torch.optim.Adam(params, lr=self.lr)
        for _ in range(self.steps):
            h = xt
            for j in range(0, len(params), 2):
                h = h @ params[j] + params[j + 1]
                if j + 2 < len(params):
                    h = torch.relu(h)
            loss = torch.nn.functional.huber_loss(h[:, 0], yt)
            opt.zero_grad(); loss.backward(); opt.step()
        self.weights = [p.detach().numpy().astype(np.float64) for p in params]
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        if self.weights is None:
            raise RuntimeError("PayoffPredictor.predict before fit")
        X = np.asarray(X, float)
        h = (X - self.mu) / self.sd
        w = self.weights
        for j in range(0, len(w), 2):
            h = h @ w[j] + w[j + 1]
            if j + 2 < len(w):
                h = np.maximum(h, 0)
        return np.clip(h[:, 0], 0, X[:, FEATURES.index("draft_len")])


@dataclass
class _Recent:
    """Exponential moving averages of per-token acceptance per source."""
    decay: float = 0.9
    rate: dict = field(default_factory=lambda: {"cache": 0.5, "model": 0.5})

    def update(self, source: str, accepted: int, drafted: int) -> None:
        if drafted:
            reached = min(accepted + 1, drafted)
            self.rate[source] = self.decay * self.rate[source] + (1 - self.decay) * accepted / reached


class HybridDrafter:
    def __init__(self, cache, model, policy: str = "hvd", predictor: PayoffPredictor | None = None,
                 costs: Costs | None = None, reference: list[int] | None = None, model_prior: float = 0.5):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if policy == "hvd" and (predictor is None or costs is None):
            raise ValueError("policy 'hvd' needs a fitted predictor and measured costs")
        if policy == "oracle" and reference is None:
            raise ValueError("policy 'oracle' needs the target's greedy continuation as `reference`")
        self.cache, self.model, self.policy = cache, model, policy
        self.predictor, self.costs, self.reference = predictor, costs, reference
        if not 0 <= model_prior < 1:
            raise ValueError(f"model_prior (per-token acceptance of the model drafter) must lie in [0, 1), got {model_prior!r}")
        self.model_prior = model_prior          # where the model's running acceptance starts each request

    @property
    def max_nodes(self) -> int:
        return max(self.cache.max_nodes, self.model.max_nodes)

    def check_compatible(self, target: LM) -> None:
        self.model.check_compatible(target)

    def reset(self, prompt: list[int], sampling: Sampling, gen: torch.Generator) -> None:
        if self.policy == "oracle" and not sampling.greedy:
            raise ValueError("the hindsight oracle is defined for greedy decoding only")
        self.cache.reset(prompt, sampling, gen)
        self.model.reset(prompt, sampling, gen)
        self.prompt_len, self.recent, self.log = len(prompt), _Recent(), []
        self.recent.rate["model"] = self.model_prior
        self._peek = None

    def features(self, context: list[int]) -> np.ndarray:
        last = getattr(self.cache, "last", None) or {"score": float(len(self._cand)),
                                                     "match_len": getattr(self.cache, "match_len", 0),
                                                     "probs": [1.0] * len(self._cand), "tree": "local"}
        probs = last.get("probs") or [0.0]
        return np.array([last["score"], last["match_len"], len(self._cand), probs[0], probs[-1], float(np.mean(probs)),
                         len(context) - self.prompt_len, float(last.get("tree") == "global"),
                         self.recent.rate["cache"], self.recent.rate["model"]], dtype=float)

    def draft(self, context: list[int]) -> Tree:
        t0 = time.perf_counter()
        self._cand = self.cache.draft(context)
        cache_s = time.perf_counter() - t0
        x = self.features(context)
        use_cache = self._choose(x, context)
        if use_cache:
            tree = self._cand
        else:                                   # the oracle may already have drafted from the model
            tree = self._peek if self._peek is not None else self.model.draft(context)
        self.log.append(dict(zip(FEATURES, x.tolist()), source="cache" if use_cache else "model",
                             drafted=len(tree), cache_s=cache_s))
        self._used = "cache" if use_cache else "model"
        return tree

    def _choose(self, x: np.ndarray, context: list[int]) -> bool:
        n = len(self._cand)
        if self.policy == "cache":
            return True
        if n == 0 or self.policy == "model":
            return False
        if self.policy == "arctic":
            return x[FEATURES.index("score")] >= self.model.max_nodes
        if self.policy == "sam":
            return x[FEATURES.index("match_len")] >= 4
        if self.policy == "oracle":
            return self._oracle(context)
        c, k = self.costs, self.model.max_nodes
        e_cache = float(self.predictor.predict(x[None])[0])
        a = min(self.recent.rate["model"], 0.999)
        e_model = (a - a ** (k + 1)) / (1 - a)                     # expected accepted, i.i.d. a
        rate_cache = (e_cache + 1) / (c.cache_s + c.verify(n + 1))
        rate_model = (e_model + 1) / (c.cache_s + k * c.model_token_s + c.verify(k + 1))
        return rate_cache > rate_model

    def _oracle(self, context: list[int]) -> bool:
        future = self.reference[len(context) - self.prompt_len:]

        def accepted(tokens):
            n = 0
            while n < len(tokens) and n < len(future) and tokens[n] == future[n]:
                n += 1
            return n
        # the model draft is computed for the comparison only when the cache draft is not already perfect
        n_cache = accepted(self._cand.tokens)
        if n_cache == len(self._cand):
            return True
        self._peek = self.model.draft(context)
        return n_cache > accepted(self._peek.tokens)

    def observe(self, accepted: list[int]) -> None:
        step = self.log[-1]
        step["accepted"] = len(accepted)
        self.recent.update(self._used, len(accepted), step["drafted"])
        if self._used == "model":
            self.model.observe(accepted)
        elif self._peek is not None:            # an oracle peek that lost: drop it, keep the fed tail
            self.model.observe([])
        self._peek = None
        self.cache.observe(accepted)
