"""`BaseLM`, what every implementation of the LM protocol (stated in `speclib.core.protocols.LM`) shares,
and its adapter for Hugging Face attention models, `HFLM`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from speclib.core.device import REPO
from speclib.core.generate import prompt_list
from speclib.core.tree import ancestor_mask, check_parents

CHECKPOINTS = REPO / "data" / "checkpoints"


def checkpoints() -> list[str]:
    """Names of the models shipped under data/checkpoints/ (feature-level draft heads excluded: see
    `speclib.lms.head.heads()`)."""
    if not CHECKPOINTS.exists():
        return []
    return sorted(
        p.name for p in CHECKPOINTS.iterdir() if (p / "config.json").exists() and not (p / "head.safetensors").exists()
    )


class BaseLM:
    """Base class: argument checks and pending-node bookkeeping shared by every implementation; a subclass
    writes its forwards (reset, extend) and `_commit`, what keeping a path means for its caches."""

    model = None
    tokenizer = None
    device: torch.device
    max_length: int

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids))

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id if self.tokenizer is not None else None

    # --- argument checks shared by every implementation ----------------------------------------
    def _check_ids(self, ids: list[int], name: str) -> None:
        """Token ids must index the vocabulary (checked before any work or state change)."""
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            bad = next(t for t in ids if not 0 <= t < self.vocab_size)
            raise ValueError(f"{name}: token ids must lie in [0, {self.vocab_size}) (the vocabulary), got {bad}")

    def _check_reset(self) -> None:
        if not self.n_committed:  # every prompt has >= 1 token, so 0 = never reset
            raise RuntimeError(f"{type(self).__name__} has no prompt: call reset(prompt_ids) first")

    def _prompt_ids(self, prompt_ids) -> torch.Tensor:
        ids = prompt_list(prompt_ids)
        if not ids:
            raise ValueError("prompt_ids is empty: give at least one prompt token")
        if len(ids) > self.max_length:
            raise ValueError(f"prompt has {len(ids)} tokens, beyond the context of {self.max_length}")
        self._check_ids(ids, "prompt_ids")
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    def _extend_args(self, tokens, parents) -> tuple[list[int], list[int]]:
        tokens, parents = prompt_list(tokens, "tokens"), list(parents)
        if len(tokens) != len(parents) or not tokens:
            raise ValueError(f"extend needs as many parents as tokens (>= 1), got {len(tokens)} and {len(parents)}")
        self._check_ids(tokens, "tokens")
        return tokens, parents

    # --- pending-node bookkeeping -------------------------------------------------------------
    def _start(self, n_prompt: int) -> None:
        self.n_committed = n_prompt
        self.pending_parents: list[int] = []
        self.pending_depths: list[int] = []

    def _add_pending(self, parents: list[int]) -> list[int]:
        """Validate and record new nodes; return their depths."""
        check_parents(parents, offset=len(self.pending_parents))
        all_depths = list(self.pending_depths)
        for p in parents:
            all_depths.append(0 if p < 0 else all_depths[p] + 1)
        depths = all_depths[len(self.pending_depths) :]
        if self.n_committed + max(depths, default=0) + 1 > self.max_length:  # checked before recording
            raise ValueError(
                f"sequence would reach {self.n_committed + max(depths) + 1} tokens, beyond the "
                f"model's context of {self.max_length}"
            )
        self.pending_parents += parents
        self.pending_depths += depths
        return depths

    def _is_chain_continuation(self, parents: list[int]) -> bool:
        base = len(self.pending_parents)
        return all(p == base + i - 1 for i, p in enumerate(parents)) and self.pending_parents == list(
            range(-1, base - 1)
        )

    def _new_nodes(self, tokens, parents) -> tuple[torch.Tensor, torch.Tensor, int, bool]:
        """Check and record an extend's nodes. Returns ids [n], positions [n] (committed length + depth),
        the number of pending nodes before them, and whether they continue a pending chain."""
        self._check_reset()
        tokens, parents = self._extend_args(tokens, parents)
        chain = self._is_chain_continuation(parents)
        old = len(self.pending_parents)
        depths = self._add_pending(parents)
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        pos = torch.tensor(depths, dtype=torch.long, device=self.device) + self.n_committed
        return ids, pos, old, chain

    def _tree_allowed(self, old: int) -> torch.Tensor:
        """[new, committed + pending] bool: each node added after the first `old` pending ones sees the
        committed prefix and its ancestors-or-self."""
        n, P = self.n_committed, len(self.pending_parents)
        anc = ancestor_mask(self.pending_parents)
        return torch.cat([torch.ones(P - old, n, dtype=torch.bool), anc[old:]], 1).to(self.device)

    def _check_path(self, path: list[int]) -> None:
        self._check_reset()
        prev = -1
        for node in path:
            if not 0 <= node < len(self.pending_parents) or self.pending_parents[node] != prev:
                raise ValueError(
                    f"commit path {path} is not a root-to-node path of pending nodes (parents {self.pending_parents})"
                )
            prev = node

    @torch.inference_mode()
    def commit(self, path) -> None:
        """The protocol's commit: checks the path, lets the subclass's `_commit` keep it in its caches (the
        committed length still the old one), then records the new committed length."""
        path = list(path)
        self._check_path(path)
        n = self.n_committed
        self._commit(path)
        self._start(n + len(path))

    def _commit(self, path: list[int]) -> None:
        """Keep the pending nodes `path` (a checked root-to-node path) after the committed prefix in this
        class's caches, drop the others."""
        raise NotImplementedError


class FeatureStore:
    """Mixin: the `speclib.core.protocols.FeatureLM` capability (hidden features for feature-level drafters).

    Off by default, so plain decoding pays nothing. After `record_features(layers)`, every forward
    also writes each new node's features (the hidden states `layers`, concatenated) into a buffer
    [max_length, F] at the node's cache slot, and `commit` gathers the kept path's rows like the KV
    cache. Subclasses call `_features_on()` (whether to compute them), `_write_features(rows, start)`
    and `_commit_features(path)`; they give `_text_config()` and `frozen_parts()`."""

    feature_layers: tuple[int, ...] | None = None
    _feat_buf: torch.Tensor | None = None
    _feats_valid = False  # recording was on at the last reset

    def _text_config(self):
        return self.model.config.get_text_config(decoder=True)

    @property
    def hidden_size(self) -> int:
        return self._text_config().hidden_size

    @property
    def num_layers(self) -> int:
        return self._text_config().num_hidden_layers

    def record_features(self, layers) -> None:
        """Record hidden states `layers` (ints in [0, num_layers], as transformers' hidden_states: 0 the
        embeddings, l the output of decoder layer l, num_layers the final normed state) from the next
        reset on; None switches recording off."""
        if layers is None:
            self.feature_layers, self._feat_buf, self._feats_valid = None, None, False
            return
        layers = tuple(layers)
        if not layers or not all(isinstance(l, int) and 0 <= l <= self.num_layers for l in layers):
            raise ValueError(
                f"feature layers must be a non-empty sequence of ints in [0, {self.num_layers}] "
                f"(0 = embeddings, {self.num_layers} = final normed state), got {layers!r}"
            )
        if layers != self.feature_layers:
            self.feature_layers, self._feats_valid = layers, False
            self._feat_buf = torch.zeros(self.max_length, len(layers) * self.hidden_size, device=self.device)

    def committed_features(self, start: int = 0) -> torch.Tensor:
        """[n - start, F] fp32 features of committed positions start..n-1 (n = committed length)."""
        if not self._feats_valid:
            raise RuntimeError(f"{type(self).__name__} has no features: call record_features(layers) before reset")
        if not 0 <= start <= self.n_committed:
            raise ValueError(f"start must lie in [0, {self.n_committed}] (the committed length), got {start}")
        return self._feat_buf[start : self.n_committed]

    def weights_fingerprint(self) -> str:
        """A short hash of the weights (the first 1024 values of every parameter, rounded to bf16 so an
        fp32 and a bf16 load of one checkpoint agree): names the model a draft head was trained on."""
        import hashlib

        h = hashlib.sha256()
        for name, p in sorted(self.model.named_parameters()):
            h.update(name.encode())
            h.update(p.detach().flatten()[:1024].to(torch.bfloat16).view(torch.int16).cpu().numpy().tobytes())
        return h.hexdigest()[:16]

    # --- for subclasses ---------------------------------------------------------------------------
    def _features_on(self) -> bool:
        return self.feature_layers is not None

    def _write_features(self, hidden: list[torch.Tensor], start: int) -> None:
        """hidden: the model's hidden states ([n, d] each, index as `record_features`) of nodes that
        occupy cache slots start..start+n-1."""
        rows = torch.cat([hidden[l] for l in self.feature_layers], -1)
        self._feat_buf[start : start + rows.shape[0]] = rows.float()

    def _commit_features(self, path: list[int]) -> None:
        """Before `_start`: move the kept pending rows next to the committed prefix (as the KV cache)."""
        if self._feat_buf is None or path == list(range(len(path))):
            return
        n = self.n_committed
        src = torch.tensor(path, device=self.device) + n
        self._feat_buf[n : n + len(path)] = self._feat_buf[src]


class HFLM(FeatureStore, BaseLM):
    """A transformers causal LM with a KV cache (attention layers).

    Pending nodes are appended to the cache; a 4D mask lets each node see the committed prefix and
    its pending ancestors, position id = committed length + depth. A chain needs no mask at all (the
    model's own causal mask is the ancestor mask), which is the common, fast case.
    """

    def __init__(self, model, tokenizer, device, path=None):
        self.path = Path(path) if path is not None else None  # where it was loaded from
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = device
        self.max_length = getattr(model.config, "max_position_embeddings", 2048)
        self.dtype = next(model.parameters()).dtype
        self._start(0)
        self.cache = None
        self._tree_reason: str | None = None  # why trees are refused; set by the first tree extend
        self._tree_probed = False

    @torch.inference_mode()
    def reset(self, prompt_ids) -> torch.Tensor:
        from transformers import DynamicCache

        ids = self._prompt_ids(prompt_ids)
        self.cache = DynamicCache(config=self.model.config)
        if any(self.cache.is_sliding):  # keep every position, so commit's absolute indices stay valid
            self.cache.activate_past_recording()
        self._start(ids.numel())
        rec = self._feats_valid = self._features_on()
        out = self.model(input_ids=ids[None], cache=self.cache, use_cache=True, output_hidden_states=rec)
        if rec:
            self._write_features([h[0] for h in out.hidden_states], 0)
        return out.logits[0, -1].float()

    @torch.inference_mode()
    def extend(self, tokens, parents) -> torch.Tensor:
        if not self._is_chain_continuation(list(parents)):  # a tree: the full checks first, then the tree one
            self._check_reset()
            tokens, parents = self._extend_args(tokens, parents)
            check_parents(parents, offset=len(self.pending_parents))
            if self.trees_unsupported() is not None:
                raise ValueError(
                    f"{type(self.model).__name__} verifies chains only here, got parents {parents} "
                    f"after pending {self.pending_parents}: {self._tree_reason}"
                )
        ids, pos, old, chain = self._new_nodes(tokens, parents)
        mask = None
        if not chain:  # [1, 1, new, committed + pending] additive: prefix + ancestors-or-self
            allowed = self._tree_allowed(old)
            mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
            mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
            mask = mask[None, None]
        rec = self._features_on()
        out = self.model(
            input_ids=ids[None],
            position_ids=pos[None],
            attention_mask=mask,
            cache=self.cache,
            use_cache=True,
            output_hidden_states=rec,
        )
        if rec:
            self._write_features([h[0] for h in out.hidden_states], self.n_committed + old)
        return out.logits[0].float()

    def _commit(self, path: list[int]) -> None:
        n, keep = self.n_committed, len(path)
        chain = path == list(range(keep))
        idx = None if chain else torch.cat([torch.arange(n), n + torch.tensor(path)]).to(self.device)
        for layer in self.cache.layers:
            if layer.keys is None:  # a layer that stores nothing (KV shared with another)
                continue
            if chain:  # a chain prefix: plain crop
                layer.keys, layer.values = layer.keys[:, :, : n + keep], layer.values[:, :, : n + keep]
            else:  # gather the kept positions
                layer.keys, layer.values = layer.keys[:, :, idx], layer.values[:, :, idx]
            if hasattr(layer, "cumulative_length"):  # sliding layers count positions themselves
                layer.cumulative_length = n + keep
        self._commit_features(path)

    def frozen_parts(self):
        """(token embedding, final norm, LM head): the target modules a feature-level head reuses."""
        base = self.model.base_model
        norm = next(
            (getattr(base, n) for n in FINAL_NORMS if isinstance(getattr(base, n, None), torch.nn.Module)), None
        )
        if norm is None:
            raise TypeError(
                f"{type(self.model).__name__} names its final norm none of {FINAL_NORMS}: a feature head "
                f"cannot find the module it must reuse"
            )
        return self.model.get_input_embeddings(), norm, self.model.get_output_embeddings()

    def trees_unsupported(self) -> str | None:
        """None when this model honours speclib's 4D tree mask, else why not. Checked once per LM: sliding-
        window layers are refused (their cache keeps a window and masks it itself, so a custom mask over the
        whole sequence does not fit once past the window), then a probe compares two sibling nodes against
        fresh forwards (an architecture that ignores or rebuilds a custom mask fails it)."""
        if not self._tree_probed:
            self._tree_reason, self._tree_probed = _tree_probe(self.model, self.dtype, self.device), True
        return self._tree_reason


# what transformers' base models call the norm before the LM head (Llama, Falcon-H1, GPT-2, OPT, ...)
FINAL_NORMS = ("norm", "final_layernorm", "ln_f", "final_layer_norm")


# What a forward raises when it cannot take speclib's [1, 1, new, total] additive mask at all: a model that
# unpacks the mask as [batch, seq] (Bloom's and Falcon's ALiBi: ValueError "too many values to unpack"), checks
# its shape (ValueError), has no keyword for it (TypeError) or refuses it outright (NotImplementedError).
# Anything else (RuntimeError, torch.OutOfMemoryError, MemoryError, a bug) is a real failure and propagates.
MASK_UNSUPPORTED = (ValueError, TypeError, NotImplementedError)


@torch.inference_mode()
def _tree_probe(model, dtype, device) -> str | None:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    if any(cache.is_sliding):
        return (
            "it has sliding-window attention layers, whose cache keeps only the window and builds its own "
            "window mask, so a custom tree mask over the whole sequence does not apply"
        )
    V = model.config.get_text_config(decoder=True).vocab_size
    a, b, c, d = (t % V for t in (5, 7, 11, 13))
    allowed = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 1]], dtype=torch.bool, device=device)  # c, d: siblings
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)

    def ids(*t):
        return torch.tensor([t], device=device)

    # the unmasked forwards are what every chain runs: a failure there is no reason to refuse trees
    ref = [model(input_ids=ids(a, b, t)).logits[0, -1].float() for t in (c, d)]
    model(input_ids=ids(a, b), cache=cache, use_cache=True)
    try:
        got = (
            model(
                input_ids=ids(c, d),
                position_ids=ids(2, 2),
                attention_mask=mask[None, None],
                cache=cache,
                use_cache=True,
            )
            .logits[0]
            .float()
        )
    except MASK_UNSUPPORTED as exc:
        return f"a custom 4D attention mask fails on it ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    if not all(torch.allclose(g, r, atol=tol * (1 + r.abs().max().item()), rtol=tol) for g, r in zip(got, ref)):
        return "it does not honour a custom 4D attention mask (sibling nodes' logits differ from fresh forwards)"
    return None
