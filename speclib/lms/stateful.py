"""Recurrent and hybrid transformers causal LMs (Mamba2, Falcon-H1, Bamba, Jamba, Zamba2, LFM2, Qwen3-Next,
MiniMax, Kimi-Linear, ...) behind the LM protocol, by "snapshot-replay". Chains only.

Their transformers cache holds, per linear-attention / SSM / conv layer, ONE recurrent state and one conv
window, written in place as tokens go through; attention layers (if any) hold K/V as usual. Speculation
needs to undo the rejected tail, which a recurrent state cannot do (transformers' `crop` refuses them).
So:

    extend from an empty pending set   snapshot every layer's state (conv/recurrent tensors cloned: they are
                                       written in place; attention K/V kept by reference: `torch.cat` makes
                                       new tensors, the old ones are never touched), then run the chain
    extend continuing the chain        run the new tokens from the live state
    commit(path)                       whole chain kept: nothing to do; else restore the snapshot and re-run
                                       only the accepted tokens (one forward, logits of the last one only)

Models whose mixer restarts from a zero state on any multi-token input (the Mamba-1 scan of Jamba, Mamba,
FalconMamba, Zamba; found by a probe on the first reset, and listed in SERIAL_TYPES; `serial_reason`) get their extends and replays one token per pass: exact, slower.

A tree cannot be verified: siblings would each need their own recurrent state, and a stock cache holds
one per layer (`speclib.lms.hybrid.HybridLM` does trees for Qwen3.5 with its own GDN forward).
Caches that are not a plain `DynamicCache` (MiniMax's `MiniMaxCache` keeps its states in a list of its
own) are snapshotted whole with `copy.deepcopy`: exact, but it copies the attention K/V too.
"""

from __future__ import annotations

import copy
import inspect
from pathlib import Path

import torch

from speclib.core.tree import check_parents
from speclib.lms.lm import BaseLM

STRATEGY = "snapshot-replay"
# Layer types whose cache holds a recurrent / conv state (transformers' DYNAMIC_LAYER_TYPE_MAPPING names).
STATEFUL_LAYER_TYPES = {"linear_attention", "conv", "hybrid", "hybrid_sliding"}
# Mamba-1 mixers whose multi-token scan starts from a zero state even when the cache holds one
# (transformers 5.24 `mamba_selective_scan`: "initial hidden state is not supported"). The probe below
# finds them too in fp32; this list also covers bf16, where the error can hide under the tolerance.
SERIAL_TYPES = {"jamba", "mamba", "falcon_mamba", "zamba"}
# Stateful families whose state lives outside transformers' Cache: no generic way to snapshot it.
UNSUPPORTED = {
    "rwkv": "RWKV passes its recurrent state as a plain `state` list, outside transformers' Cache",
    "recurrent_gemma": "RecurrentGemma keeps its recurrent and conv states inside its modules, not in a Cache",
    "xlstm": "xLSTM keeps its state in an xLSTMCache that has no snapshot/restore interface",
}


def is_stateful(config) -> bool:
    """Whether a model's transformers cache holds recurrent / conv states: read from the cache layers
    transformers builds for its config (the ground truth for what the model writes)."""
    from transformers import DynamicCache
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    text = config.get_text_config(decoder=True)
    try:
        layers = DynamicCache(config=text).layers
    except (AttributeError, KeyError, TypeError, ValueError):  # a config transformers cannot map to layers
        layers = []
    if any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in layers):
        return True
    return bool(STATEFUL_LAYER_TYPES & set(getattr(text, "layer_types", None) or []))


def chains_only_error(lm, parents, pending) -> ValueError:
    return ValueError(
        f"{type(lm).__name__} ({type(lm.model).__name__}, strategy {lm.strategy!r}) verifies chains only "
        f"(parents continuing -1, 0, 1, ...), got parents {parents} after pending {pending}: its transformers "
        f"cache holds ONE recurrent state per layer, not one per tree node, so sibling branches cannot be "
        f"scored in one pass. Use a chain drafter (e.g. speclib.ModelDrafter); for Qwen3.5 trees use HybridLM."
    )


def _layer_state(layer) -> dict:
    """A restorable copy of one cache layer's attributes. Dict-valued attributes (conv_states,
    recurrent_states, flags) are copied, their tensors cloned (written in place by `copy_` and the conv
    update kernels); other attributes (K/V tensors, lengths) are kept by reference (replaced, not mutated)."""
    state = {}
    for key, value in vars(layer).items():
        if isinstance(value, dict):
            value = {i: t.clone() if torch.is_tensor(t) else t for i, t in value.items()}
        state[key] = value
    return state


def _layerwise(cache) -> bool:
    """Whether `_layer_state` snapshots this cache exactly: a plain DynamicCache whose layers are dynamic
    (K/V grown by concatenation), linear-attention or dummy layers. Anything else is deep-copied."""
    from transformers import DynamicCache
    from transformers.cache_utils import DummyLayer, DynamicLayer, LinearAttentionCacheLayerMixin, StaticLayer

    return type(cache) is DynamicCache and all(
        isinstance(layer, (DynamicLayer, LinearAttentionCacheLayerMixin, DummyLayer))
        and not isinstance(layer, StaticLayer)
        for layer in cache.layers
    )


class StatefulLM(BaseLM):
    """A transformers causal LM with recurrent / conv cache layers, as an LM verifying chains by
    snapshot-replay (module docstring). `strategy` is "snapshot-replay"; `snapshot_kind` is "layers" (the
    DynamicCache's layers, states cloned) or "deepcopy" (a cache class of the model's own)."""

    strategy = STRATEGY

    def __init__(self, model, tokenizer=None, device=None, path=None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.path = Path(path) if path is not None else None
        self.config = model.config.get_text_config(decoder=True)
        # Pure SSMs have no position embeddings, hence no context limit of their own.
        self.max_length = getattr(self.config, "max_position_embeddings", None) or 2**20
        params = inspect.signature(model.forward).parameters
        self._keep_arg = "logits_to_keep" in params
        # Some models count positions from 0 on every call unless told (Bamba): always pass them when taken.
        self._pos_arg = "position_ids" in params
        self._start(0)
        self.cache = None
        self.snapshot_kind: str | None = None
        self._snap = None
        self.pending_tokens: list[int] = []
        self.serial: bool | None = None  # feed extends one token per pass (probed on first reset)
        self.serial_reason: str | None = None

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def trees_unsupported(self) -> str:
        """Why trees are refused (`speclib.core.protocols.TreeProbe`): always, see `chains_only_error`."""
        return "chains only: a stock cache holds one recurrent state per layer, not one per tree node"

    def _forward(self, ids: torch.Tensor, start: int, all_logits: bool = True) -> torch.Tensor:
        """Run ids [n] at positions start.. from the live cache (the model builds its own cache on the
        first call); chains only, so `start` is always the cache's length."""
        n = ids.numel()
        if self.serial and self.cache is not None and n > 1:
            rows = [self._forward(ids[i : i + 1], start + i, all_logits or i == n - 1) for i in range(n)]
            return torch.cat(rows) if all_logits else rows[-1]
        kw = {} if all_logits or not self._keep_arg else {"logits_to_keep": 1}
        if self._pos_arg:
            kw["position_ids"] = torch.arange(start, start + n, device=self.device)[None]
        out = self.model(input_ids=ids[None], cache=self.cache, use_cache=True, **kw)
        if self.cache is None:
            self.cache = getattr(out, "cache", None)
            if self.cache is None:
                raise RuntimeError(f"{type(self.model).__name__} returned no cache with use_cache=True")
        return out.logits[0]

    @torch.inference_mode()
    def reset(self, prompt_ids) -> torch.Tensor:
        ids = self._prompt_ids(prompt_ids)
        if self.serial is None:
            self.serial_reason = _multi_token_probe(self.model, self.config.vocab_size, self.device, self._pos_arg)
            if self.serial_reason is None and self.config.model_type in SERIAL_TYPES:
                self.serial_reason = f"{self.config.model_type}'s multi-token scan restarts from a zero state"
            self.serial = self.serial_reason is not None
        self.cache, self._snap, self.pending_tokens = None, None, []
        self._start(ids.numel())
        logits = self._forward(ids, 0)[-1].float()
        self.snapshot_kind = "layers" if _layerwise(self.cache) else "deepcopy"
        return logits

    @torch.inference_mode()
    def extend(self, tokens, parents) -> torch.Tensor:
        self._check_reset()
        tokens, parents = self._extend_args(tokens, parents)
        check_parents(parents, offset=len(self.pending_parents))  # topological errors first, as elsewhere
        if not self._is_chain_continuation(parents):
            raise chains_only_error(self, parents, self.pending_parents)
        old = len(self.pending_parents)
        self._add_pending(parents)  # checks the context before any state changes
        if not old:
            self._snap = self._snapshot()
        self.pending_tokens += tokens
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        return self._forward(ids, self.n_committed + old).float()

    def _commit(self, path: list[int]) -> None:
        n, m = self.n_committed, len(path)  # on a chain, a valid path is a prefix 0..m-1
        if m < len(self.pending_parents):
            self._restore()
            if m:  # re-run the accepted tokens from the committed state
                ids = torch.tensor(self.pending_tokens[:m], dtype=torch.long, device=self.device)
                self._forward(ids, n, all_logits=False)
        self._snap, self.pending_tokens = None, []

    # --- snapshot / restore ---------------------------------------------------------------------
    def _snapshot(self):
        if self.snapshot_kind == "layers":
            return [_layer_state(layer) for layer in self.cache.layers]
        return copy.deepcopy(self.cache)

    def _restore(self) -> None:
        if self.snapshot_kind == "layers":
            for layer, state in zip(self.cache.layers, self._snap):
                layer.__dict__.update(state)
        else:
            self.cache = self._snap


@torch.inference_mode()
def _multi_token_probe(model, vocab: int, device, pass_positions: bool) -> str | None:
    """None when a multi-token forward continuing a cached state equals a fresh forward over the whole
    sequence; else why not. Some mixers restart their scan from a zero state whenever more than one token
    comes in (Jamba's Mamba-1 scan: "initial hidden state is not supported"), which is right for a prefill
    and wrong for a continuation; those models then get one token per pass."""
    ids = torch.tensor([[t % vocab for t in (5, 7, 11, 13, 17, 19)]], device=device)
    pos = {"position_ids": torch.arange(3, 6, device=device)[None]} if pass_positions else {}
    cache = model(input_ids=ids[:, :3], use_cache=True).cache
    got = model(input_ids=ids[:, 3:], cache=cache, use_cache=True, **pos).logits[0].float()
    ref = model(input_ids=ids, use_cache=False).logits[0, 3:].float()
    # fp32: a correct continuation is within ~1e-6 of the fresh forward, a restarted scan ~1e-3 or more
    tol = 2e-5 if next(model.parameters()).dtype == torch.float32 else 3e-2
    if torch.allclose(got, ref, atol=tol * (1 + ref.abs().max().item()), rtol=tol):
        return None
    return (
        "a multi-token forward continuing its cache differs from a fresh forward (its scan restarts from a "
        "zero state), so extends and replays run one token per pass"
    )
