"""The three protocols of speclib, whose docstrings are the specification: `LM`, `Drafter`, `Acceptor`.

Conventions everywhere: p = the target's distribution, q = the draft's, both AFTER temperature / top-k /
top-p processing (`speclib.core.sampling.probs`): the distribution a token was actually drawn from.

This module is the one full statement of the protocols; other docstrings point here. Optional
capabilities are protocols of their own (`BatchedLM`, `FeatureLM`, `TreeProbe`, `VerifyObserver`,
`PerRequestAcceptor`, `LogitsAcceptor`); the decoding loop (`speclib.generate`) and the research code check
them with `isinstance` against these classes, never with `hasattr` on concrete classes. The maths behind
the protocol: docs/trees.md.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from speclib.core.sampling import Sampling
from speclib.core.tree import Tree

__all__ = [
    "LM",
    "BatchedLM",
    "FeatureLM",
    "TreeProbe",
    "Drafter",
    "VerifyObserver",
    "ScoredDrafter",
    "Acceptor",
    "PerRequestAcceptor",
    "LogitsAcceptor",
]


@runtime_checkable
class LM(Protocol):
    """A model with a decoding state: a committed prefix plus pending nodes, a forest hanging off the
    committed tip.

    reset(prompt_ids)       prefill a 1-D sequence of token ids; returns the logits [V] at the last
                            prompt position; drops any previous state.
    extend(tokens, parents) add pending nodes; parents[i] = -1 (the committed tip) or the index of an
                            earlier pending node (of this or an earlier extend), in topological order.
                            Returns logits [n, V], row i scoring node i's children. Node i sees the
                            committed prefix and its pending ancestors; its position is the committed
                            length + its depth.
    commit(path)            keep one root-to-node path of pending node indices (each node's parent is
                            the previous one, the first's is -1), append it to the committed prefix and
                            drop every other pending node. commit([]) drops them all.

    An autoregressive step is extend([t], [-1]) then commit([0]); a draft chain is repeated
    extend([t_i], [i - 1]); a tree is one extend with many parents. Bad input (ids outside
    [0, vocab_size), parents that are not a forest in topological order, a context overflow) is a
    ValueError naming the parameter, raised before any state changes; extend or commit before reset
    is a RuntimeError.
    """

    tokenizer: object | None
    device: torch.device
    max_length: int

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids) -> str: ...

    def reset(self, prompt_ids) -> torch.Tensor: ...

    def extend(self, tokens, parents) -> torch.Tensor: ...

    def commit(self, path) -> None: ...


@runtime_checkable
class BatchedLM(LM, Protocol):
    """Capability: several requests' pending trees verified in ONE forward.

    extend_batch(lms, tokens, parents) -> one logits tensor per request; `lms` are views of the same
    weights, one per request (each holds its own committed prefix), tokens[r] / parents[r] are what
    `lms[r].extend` would take. Equal, per request, to calling extend on each alone."""

    @staticmethod
    def extend_batch(lms: list, tokens: list, parents: list) -> list[torch.Tensor]: ...


@runtime_checkable
class FeatureLM(LM, Protocol):
    """Capability: the target hands its hidden features to a feature-level drafter (EAGLE-style heads,
    `speclib.drafters.FeatureDrafter`; docs/feature_drafting.md).

    hidden_size, num_layers      the decoder's width d and depth L.
    record_features(layers)      from the next reset on, record for every node the hidden states
                                 `layers` (ints in [0, L], numbered as transformers' hidden_states: 0 the
                                 token embeddings, l < L the output of decoder layer l, L the final
                                 NORMED state, the one the LM head reads), concatenated: F = len(layers) * d.
                                 None switches recording off; off (the default) costs plain decoding nothing.
    feature_layers               the layers being recorded (None when off).
    committed_features(start)    [n - start, F] fp32: the features of committed positions start..n-1
                                 (n = committed length), equal to a fresh forward's hidden states over the
                                 committed sequence. Each extend computes its nodes' features; commit keeps
                                 the committed path's (gathered like the KV cache) and drops the others.
                                 A view into the LM's buffer, valid until the next reset / extend.
                                 RuntimeError when recording was off at the last reset.
    frozen_parts()               (token embedding, final norm, LM head) modules: what a head reuses, frozen.
    weights_fingerprint()        a short hash of the weights: a head records the target it was trained for.
    """

    feature_layers: tuple[int, ...] | None

    @property
    def hidden_size(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    def record_features(self, layers) -> None: ...

    def committed_features(self, start: int = 0) -> torch.Tensor: ...

    def frozen_parts(self) -> tuple: ...

    def weights_fingerprint(self) -> str: ...


@runtime_checkable
class TreeProbe(LM, Protocol):
    """Capability: an LM that says up front whether it verifies trees (some verify chains only).

    trees_unsupported() -> None when it verifies trees, else why not (a sentence). Extending such an LM
    with a tree is then a ValueError that says "chains only"."""

    def trees_unsupported(self) -> str | None: ...


@runtime_checkable
class Drafter(Protocol):
    """Proposes a draft Tree for the target to verify.

    reset(prompt, sampling, gen)  start a request: the prompt's token ids, the target's sampling
                                  settings (a model drafter draws from q processed the same way) and
                                  the run's one torch.Generator (all randomness comes from it).
    draft(context) -> Tree        context = prompt + every token output so far; the tree's nodes are
                                  continuations of the context's last token. Tree.q[i] is the
                                  distribution node i was drawn from, or q is None for a deterministic
                                  (cache) draft, a point mass on each token.
    observe(accepted)             the draft tokens the target accepted (a root-to-node path of the last
                                  tree), before the target's next token; the drafter commits its own
                                  state accordingly. The next context extends by accepted + 1 token.
    max_nodes                     the most nodes a tree can have (the loop reserves context for it).
    check_compatible(target)      ValueError when the drafter cannot draft for `target` (vocabulary or
                                  tokenizer mismatch), raised before any work.
    """

    @property
    def max_nodes(self) -> int: ...

    def check_compatible(self, target: LM) -> None: ...

    def reset(self, prompt: list[int], sampling: Sampling, gen: torch.Generator) -> None: ...

    def draft(self, context: list[int]) -> Tree: ...

    def observe(self, accepted: list[int]) -> None: ...


@runtime_checkable
class VerifyObserver(Drafter, Protocol):
    """Capability: a drafter that learns from every verify pass (Token Recycling keeps the target's
    top-k candidates of each verified node).

    observe_verify(tokens, logits, path, next_token)   called after acceptance, before observe():
        tokens      [root] + the tree's tokens, as verified;
        logits      [N + 1, V] the target's raw logits, row i scoring the token after tokens[i];
        path        the accepted tree nodes (indices into the tree, root to leaf);
        next_token  the token that follows them (correction or bonus).
    """

    def observe_verify(self, tokens: list[int], logits: torch.Tensor, path: list[int], next_token: int) -> None: ...


@runtime_checkable
class ScoredDrafter(Drafter, Protocol):
    """Capability: a cache drafter that describes its last draft, for HVD's payoff predictor
    (`speclib.drafters.hybrid.FEATURES`):

        last    {"score": the drafter's own confidence, "match_len": tokens of context matched,
                 "probs": per drafted token (optional), "tree": "local" | "global" (optional)}
    """

    last: dict


@runtime_checkable
class Acceptor(Protocol):
    """Decides which drafted nodes to keep and the next token.

    acceptor(tree, p, greedy, gen, logits=...) -> (path, next_token)
        tree    the draft; its parent -1 is the root: the last sampled token, which the loop verifies
                together with the tree (it is not yet in the target's cache).
        p       [N + 1, V] the target's processed distributions: row 0 after the root (scoring the
                tree's nodes with parent -1), row 1 + i after node i.
        greedy  temperature 0 (decide by the argmax of p); gen: the run's generator.
        logits  keyword, [N + 1, V] the target's raw logits, rows as p; the loop passes it only to a
                `LogitsAcceptor` (uses_logits = True), so an acceptor that reads it must declare that.
        path    accepted node indices, root to leaf (a root-to-node path of the tree, possibly empty);
        next_token  the correction (after a rejection) or bonus (after a fully accepted path) token.
    A lossless acceptor's output is distributed exactly as the target's (docs/lossless.md)."""

    def __call__(
        self, tree: Tree, p: torch.Tensor, greedy: bool, gen: torch.Generator, logits: torch.Tensor | None = None
    ) -> tuple[list[int], int]: ...


@runtime_checkable
class PerRequestAcceptor(Acceptor, Protocol):
    """Capability: an acceptor with per-request state; reset(prompt_ids) starts a request."""

    def reset(self, prompt_ids: list[int]) -> None: ...


@runtime_checkable
class LogitsAcceptor(Acceptor, Protocol):
    """Capability: an acceptor that also reads the target's raw logits (`Acceptor`'s keyword `logits`)
    and the tree's `draft_logits`, e.g. an arbitration policy with features beyond p and q. Declared by
    the class attribute uses_logits = True."""

    uses_logits: bool
