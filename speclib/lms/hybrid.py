"""Qwen3.5 text (Gated DeltaNet + gated attention, ``layer_types`` 3:1) behind the LM protocol, with trees.

Our own forward over the weights of a transformers ``Qwen3_5ForCausalLM`` (its Linear / norm / MLP
submodules are called directly, so any Qwen3.5 checkpoint transformers loads runs here); the
token mixing is ours: attention with a tree mask over a KV cache, and the gated delta rule through
``speclib.kernels.tree_gdn``. Decoding state (batch 1):

    attention layer   K, V [1, Hkv, committed + pending, hd]   (pending positions appended, gathered on commit)
    GDN layer         S [1, H, K, V] fp32 committed state; tail [1, W-1, D] last W-1 committed conv inputs;
                      x [1, P, D] conv inputs of the P pending nodes; plus, per strategy,
      "closed_form"   per-node factors k [1, P, H, K], u [1, P, H, V], G [1, P, H] (G relative to S):
                      extend runs tree_gdn over the new nodes, commit folds the accepted path (docs/gdn_tree.md)
      "materialize"   one full state [H, K, V] per pending node, branch by branch (prior art, SGLang-style)
      "replay"        chains only: the pending nodes' (q, k, v, g, beta) and the state after the last one;
                      commit re-runs the accepted tokens from the committed snapshot S

All three give the same logits; they differ in transient memory and latency (notebook 03).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from speclib.core.tree import check_parents, path_to
from speclib.kernels.tree_gdn import Factors, fold, recurrent_gated_delta_rule, tree_conv1d, tree_gdn
from speclib.lms.lm import BaseLM, FeatureStore

STRATEGIES = ("closed_form", "materialize", "replay")
CHUNK = 64  # chain length per tree_gdn call in prefill / replay: bounds the [C, C] closed-form work


def tiny_config(**overrides):
    """A small ``Qwen3_5TextConfig`` for tests: vocab 64, hidden 32, 4 layers (3 GDN + 1 attention),
    grouped heads on both sides (2 query / 1 KV attention heads of dim 16; 2 key / 4 value GDN heads of
    dim 8), conv width 4, partial rotary 0.25. Keyword overrides go straight to the config."""
    from transformers import Qwen3_5TextConfig

    kw = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    if "num_hidden_layers" in overrides and "layer_types" not in overrides:
        kw["layer_types"] = None  # let the config derive the 3:1 pattern for the new depth
    kw.update(overrides)
    return Qwen3_5TextConfig(**kw)


_SAME = object()  # view(): "keep this LM's exit" (None means no exit)


def check_layers(layers, n_layers: int) -> list[int]:
    """A decoder-layer subset as a sorted list; ValueError for an empty subset, a non-int, an index
    outside [0, n_layers) or a repeated index. The model runs its layers in their own order."""
    layers = list(layers)
    if not layers:
        raise ValueError(f"layers must name at least one decoder layer in [0, {n_layers}), got an empty subset")
    bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= i < n_layers]
    if bad:
        raise ValueError(f"layers must be ints in [0, {n_layers}) (the decoder's layer indices), got {bad}")
    if len(set(layers)) != len(layers):
        raise ValueError(f"layers must not repeat an index, got {layers}")
    return sorted(int(i) for i in layers)


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # As transformers' / fla's l2norm (eps inside the root), in fp32.
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Partial RoPE on x [1, H, N, hd] with cos/sin [1, N, r]: the first r dims rotate (rotate_half), the rest pass."""
    cos, sin = cos[:, None], sin[:, None]
    r = cos.shape[-1]
    xr, xp = x[..., :r], x[..., r:]
    rot = torch.cat([-xr[..., r // 2 :], xr[..., : r // 2]], -1)
    return torch.cat([xr * cos + rot * sin, xp], -1)


def _chain(q, k, v, g, beta, S):
    """Gated delta rule along a chain from S, CHUNK tokens per tree_gdn call.
    q, k: [1, T, H, K]; v: [1, T, H, V]; g, beta: [1, T, H]; S: [1, H, K, V].
    Returns (o [1, T, H, V] fp32, final state [1, H, K, V])."""
    outs = []
    for s in range(0, q.shape[1], CHUNK):
        c = min(CHUNK, q.shape[1] - s)
        sl = slice(s, s + c)
        o, f = tree_gdn(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], torch.arange(c, device=q.device) - 1, S)
        S = fold(f, list(range(c)), S)
        outs.append(o)
    return torch.cat(outs, 1), S


def _cat(a, b, dim=1):
    return b if a is None else torch.cat([a, b], dim)


class _GDNState:
    """One Gated DeltaNet layer's decoding state (see the module docstring for shapes)."""

    def __init__(self, S: torch.Tensor, tail: torch.Tensor):
        self.S, self.tail = S, tail
        self.clear()

    def clear(self) -> None:
        self.x = None  # [1, P, D] pending conv inputs
        self.k = self.u = self.G = None  # closed_form factors
        self.states: list[torch.Tensor] = []  # materialize: [H, K, V] per pending node
        self.inputs = None  # replay: (q, k, v, g, beta) of the pending chain
        self.live = None  # replay: state after the last pending node


@dataclass
class _Request:
    """One LM's share of a (possibly batched) forward: its new tokens and where they attach."""

    lm: HybridLM
    ids: torch.Tensor  # [N] token ids
    pos: torch.Tensor  # [N] positions
    allowed: torch.Tensor  # [N, T] attention mask over that LM's whole KV after appending
    conv_parents: torch.Tensor  # parents of the sequence the conv runs over (prefill: the prompt chain)
    old: int  # pending nodes before this call
    prefill: bool


class HybridLM(FeatureStore, BaseLM):
    """A Qwen3.5 text model (``Qwen3_5ForCausalLM``) as an LM with tree speculation on its GDN layers.

    strategy: "closed_form" (trees; per-node factors, fold on commit), "materialize" (trees; a full
    state per pending node), "replay" (chains only; snapshot + re-run on commit).
    skip_attention: run only the linear-attention subgraph (every full-attention decoder layer, its
    MLP included, is skipped): the self-speculative draft of component-aware speculation.
    layers: run only these decoder layers (indices, any subset; the others are skipped with their MLP);
    skip_attention=True is shorthand for the GDN layers. exit: an optional module applied to the last
    hidden state [1, N, D] before the final norm and LM head (a trained early-exit adapter,
    speclib.drafters.layers.ExitAdapter). Layer subsets and exits make self-drafts (docs/self_speculation.md).
    Several HybridLMs over one model (see `view`) can verify their trees in one forward: `extend_batch`.
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        device=None,
        strategy: str = "closed_form",
        skip_attention: bool = False,
        path=None,
        layers=None,
        exit=None,
    ):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        self.model = model.eval()
        # A multimodal Qwen3_5ForConditionalGeneration keeps its text model under .language_model.
        self.text = getattr(model.model, "language_model", model.model)
        self.config = self.text.config
        if self.config.hidden_act not in ("silu", None):
            raise ValueError(f"hidden_act {self.config.hidden_act!r}: the GDN conv supports only 'silu'")
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.strategy = strategy
        self.max_length = self.config.max_position_embeddings
        self.is_gdn = [t == "linear_attention" for t in self.config.layer_types]
        self.skip_attention = skip_attention
        if layers is None:
            self.layers = [i for i, g in enumerate(self.is_gdn) if g or not skip_attention]
        elif skip_attention:
            raise ValueError("give either skip_attention=True or layers=, not both")
        else:
            self.layers = check_layers(layers, len(self.is_gdn))
        self.exit = exit
        self.path = path  # the checkpoint folder, when loaded from one
        self._start(0)
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None
        self.gdn: dict[int, _GDNState] | None = None

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def frozen_parts(self):  # FeatureLM: what a feature-level head reuses
        return self.text.embed_tokens, self.text.norm, self.model.lm_head

    @staticmethod
    def extend_batch(lms: list[HybridLM], tokens: list, parents: list) -> list[torch.Tensor]:
        """Batched-extend capability (speclib.core.protocols.BatchedLM): `extend_batch` below."""
        return extend_batch(lms, tokens, parents)

    def view(
        self, strategy: str | None = None, skip_attention: bool | None = None, layers=None, exit=_SAME
    ) -> HybridLM:
        """Another HybridLM over the same weights with its own decoding state (one per request in a batch,
        or a self-draft: skip_attention=True, or any `layers` subset). Unset arguments keep this LM's
        layers and exit; exit=None drops the exit."""
        if layers is None and skip_attention is None:  # keep this LM's subset
            skip_attention, layers = (self.skip_attention, None) if self.skip_attention else (False, self.layers)
        return HybridLM(
            self.model,
            self.tokenizer,
            self.device,
            strategy or self.strategy,
            bool(skip_attention),
            self.path,
            layers,
            self.exit if exit is _SAME else exit,
        )

    # --- the protocol ---------------------------------------------------------------------------
    @torch.inference_mode()
    def reset(self, prompt_ids) -> torch.Tensor:
        """Prefill a chain from the zero state. prompt_ids: [N] ints. Returns logits [V] (fp32) at the last one."""
        ids = self._prompt_ids(prompt_ids)
        N, dt, dev = ids.numel(), next(self.model.parameters()).dtype, self.device
        self._start(N)
        self.kv, self.gdn = {}, {}
        for i in self.layers:
            layer = self.text.layers[i]
            if self.is_gdn[i]:
                la = layer.linear_attn
                S = torch.zeros(1, la.num_v_heads, la.head_k_dim, la.head_v_dim, device=dev)
                self.gdn[i] = _GDNState(S, torch.zeros(1, la.conv_kernel_size - 1, la.conv_dim, dtype=dt, device=dev))
            else:
                at = layer.self_attn
                empty = torch.zeros(1, self.config.num_key_value_heads, 0, at.head_dim, dtype=dt, device=dev)
                self.kv[i] = (empty, empty)
        pos = torch.arange(N, device=dev)
        causal = torch.ones(N, N, dtype=torch.bool, device=dev).tril()
        self._feats_valid = self._features_on()
        return _forward([_Request(self, ids, pos, causal, pos - 1, 0, True)])[0][-1]

    def extend(self, tokens, parents) -> torch.Tensor:
        """Add pending nodes. tokens, parents: [n] ints (parent -1 = committed tip, else an earlier pending
        node, possibly from an earlier extend). Returns logits [n, V] (fp32), one row per new node."""
        return extend_batch([self], [tokens], [parents])[0]

    def _request(self, tokens, parents) -> _Request:
        """Check an extend's arguments, record the new pending nodes, and describe them for the forward."""
        tokens, parents = self._extend_args(tokens, parents)
        if self.gdn is None:
            raise RuntimeError("call reset(prompt_ids) before extend")
        old = len(self.pending_parents)
        check_parents(parents, offset=old)  # the topological-order message comes before the chain one
        if self.strategy == "replay" and not (
            parents == list(range(old - 1, old + len(parents) - 1)) and self.pending_parents == list(range(-1, old - 1))
        ):
            raise ValueError(
                f"strategy 'replay' supports chains only (parents continuing -1, 0, 1, ...), got "
                f"parents {parents} after pending {self.pending_parents}; use strategy='closed_form' "
                f"(or 'materialize') for trees"
            )
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        depths = self._add_pending(parents)
        pos = torch.tensor(depths, device=self.device) + self.n_committed
        all_parents = torch.tensor(self.pending_parents, device=self.device)
        return _Request(self, ids, pos, self._tree_allowed(old), all_parents, old, False)

    def _commit(self, path: list[int]) -> None:
        n, m, P = self.n_committed, len(path), len(self.pending_parents)
        idx = torch.tensor(path, dtype=torch.long, device=self.device)
        keep = torch.cat([torch.arange(n, device=self.device), n + idx])
        for i, (K, V) in self.kv.items():
            self.kv[i] = (K[:, :, keep], V[:, :, keep])
        for st in self.gdn.values():
            if m:
                W1 = st.tail.shape[1]
                seq = torch.cat([st.tail, st.x[:, idx]], 1)  # committed inputs, oldest first
                st.tail = seq[:, seq.shape[1] - W1 :]
                if self.strategy == "closed_form":
                    st.S = fold(Factors(st.k, st.u, st.G, torch.tensor([self.pending_parents])), path, st.S)
                elif self.strategy == "materialize":
                    st.S = st.states[path[-1]][None]
                elif m == P:  # replay, all accepted: nothing to redo
                    st.S = st.live
                else:  # replay: re-run the accepted prefix
                    st.S = _chain(*(t[:, :m] for t in st.inputs), st.S)[1]
            st.clear()
        self._commit_features(path)

    # --- internals -----------------------------------------------------------------------------
    def _closed_form(self, st, q, k, v, g, beta, old):
        """tree_gdn over the N new nodes; returns o [1, N, H, V] and appends their factors to st.

        New nodes hang off `attach` points: the committed tip (-1) or an earlier pending node. Each group
        runs from its attach state, rebuilt by folding that node's path (a transient state, one per group,
        never stored); the group's G is then offset by the attach node's G so all stored factors are
        relative to the committed S, and fold can commit any path mixing old and new nodes."""
        par, N = self.pending_parents, q.shape[1]
        if old == 0:  # a fresh forest on the committed state (every verify pass): one call
            o, f = tree_gdn(q, k, v, g, beta, torch.tensor(par, device=q.device), st.S)
            st.k, st.u, st.G = f.k, f.u, f.G
            return o
        attach: list[int] = []
        for p in par[old:]:
            attach.append(p if p < old else attach[p - old])
        o = torch.empty_like(v)
        kn, un, Gn = torch.empty_like(k), torch.empty_like(v), torch.empty_like(g)
        for a in dict.fromkeys(attach):
            members = [j for j in range(N) if attach[j] == a]
            local = {old + j: t for t, j in enumerate(members)}
            lpar = torch.tensor([local.get(par[old + j], -1) for j in members], device=q.device)
            if a < 0:
                S_a, G_a = st.S, torch.zeros_like(g[:, 0])
            else:
                S_a = fold(Factors(st.k, st.u, st.G, torch.tensor([par[:old]])), path_to(par, a), st.S)
                G_a = st.G[:, a]
            idx = torch.tensor(members, device=q.device)
            oo, f = tree_gdn(q[:, idx], k[:, idx], v[:, idx], g[:, idx], beta[:, idx], lpar, S_a)
            o[:, idx], kn[:, idx], un[:, idx], Gn[:, idx] = oo, f.k, f.u, f.G + G_a[:, None]
        st.k, st.u, st.G = _cat(st.k, kn), _cat(st.u, un), _cat(st.G, Gn)
        return o

    def _materialize(self, st, q, k, v, g, beta, old):
        """Branch-by-branch recurrence: each new node steps from its parent's full state and keeps its own."""
        o = torch.empty_like(v)
        for j in range(q.shape[1]):
            p = self.pending_parents[old + j]
            Sp = st.S[0] if p < 0 else st.states[p]
            oj, _, Sj = recurrent_gated_delta_rule(
                q[0, j : j + 1], k[0, j : j + 1], v[0, j : j + 1], g[0, j : j + 1], beta[0, j : j + 1], Sp
            )
            o[0, j] = oj[0]
            st.states.append(Sj)
        return o


@torch.inference_mode()
def extend_batch(lms: list[HybridLM], tokens: list, parents: list) -> list[torch.Tensor]:
    """`lm.extend(tokens[r], parents[r])` for every request r in ONE forward: the projections, MLPs and
    the LM head run once over all requests' new nodes (the weights are read once, which is what a
    verify pass costs on a memory-bound device); attention and the gated delta rule run per request
    over its own cache and state. The LMs must share one model (see `HybridLM.view`). Returns one
    [n_r, V] fp32 logits tensor per request."""
    if not lms or len({id(lm.model) for lm in lms}) != 1 or len({(tuple(lm.layers), id(lm.exit)) for lm in lms}) != 1:
        raise ValueError(
            "extend_batch needs one or more HybridLMs over the same model, layers and exit (make them with lm.view())"
        )
    if len(lms) != len(tokens) or len(lms) != len(parents):
        raise ValueError(f"got {len(lms)} LMs, {len(tokens)} token lists and {len(parents)} parent lists")
    if len({id(lm) for lm in lms}) != len(lms):
        raise ValueError("each request needs its own HybridLM (decoding state); make them with lm.view()")
    for lm in lms:
        if lm.gdn is None:
            raise RuntimeError("call reset(prompt_ids) before extend")
    reqs = []
    try:
        for lm, t, p in zip(lms, tokens, parents):
            reqs.append(lm._request(t, p))
    except Exception:  # a bad request: undo the earlier ones, nothing is recorded
        for r in reqs:
            del r.lm.pending_parents[r.old :], r.lm.pending_depths[r.old :]
        raise
    return _forward(reqs)


def _forward(reqs: list[_Request]) -> list[torch.Tensor]:
    """The decoder over the requests' new tokens, concatenated along the token axis. Returns per-request
    logits [N_r, V] fp32 and updates each request's LM state."""
    lm0 = reqs[0].lm
    sizes = [r.ids.numel() for r in reqs]
    h = lm0.text.embed_tokens(torch.cat([r.ids for r in reqs])[None])
    # Text-only: the three mrope grids share one position, so the rotary is plain (partial) RoPE.
    cos, sin = lm0.text.rotary_emb(h, torch.cat([r.pos for r in reqs])[None])
    rot = list(zip(cos.split(sizes, 1), sin.split(sizes, 1)))
    # transformers' hidden_states, for FeatureLM (a skipped layer repeats h)
    hidden = [h] if any(r.lm._features_on() for r in reqs) else None
    run = set(lm0.layers)
    for i in range(len(lm0.text.layers)):
        if i in run:
            layer = lm0.text.layers[i]
            x = layer.input_layernorm(h)
            x = (
                _gdn(layer.linear_attn, i, x, reqs, sizes)
                if lm0.is_gdn[i]
                else _attn(layer.self_attn, i, x, rot, reqs, sizes)
            )
            h = h + x
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        if hidden is not None:
            hidden.append(h)
    if lm0.exit is not None:  # early-exit adapter of a layer-subset self-draft
        h = lm0.exit(h)
    h = lm0.text.norm(h)
    if hidden is not None:
        hidden[-1] = h  # the last one is the normed state
        for r, hs in zip(reqs, zip(*(t[0].split(sizes) for t in hidden))):
            if r.lm._features_on():
                r.lm._write_features(list(hs), 0 if r.prefill else r.lm.n_committed + r.old)
    return list(lm0.model.lm_head(h)[0].float().split(sizes))


def _attn(at, i, x, rot, reqs, sizes):
    """Gated attention (Qwen3_5Attention) of x [1, N, D] (all requests); each request's queries attend
    over its own cache plus its new positions."""
    N, hd = x.shape[1], at.head_dim
    # q_proj packs [q_h, gate_h] per head.
    q, gate = at.q_proj(x).view(1, N, -1, 2 * hd).chunk(2, dim=-1)
    q = at.q_norm(q).transpose(1, 2)  # [1, Hq, N, hd]
    k = at.k_norm(at.k_proj(x).view(1, N, -1, hd)).transpose(1, 2)  # [1, Hkv, N, hd]
    v = at.v_proj(x).view(1, N, -1, hd).transpose(1, 2)
    outs = []
    for r, (cos, sin), qr, kr, vr in zip(reqs, rot, q.split(sizes, 2), k.split(sizes, 2), v.split(sizes, 2)):
        qr, kr = _rotary(qr, cos, sin), _rotary(kr, cos, sin)
        K, V = (torch.cat([c, new], 2) for c, new in zip(r.lm.kv[i], (kr, vr)))
        r.lm.kv[i] = (K, V)
        rep = qr.shape[1] // K.shape[1]  # grouped-query heads
        att = (qr @ K.repeat_interleave(rep, 1).transpose(-1, -2)) * at.scaling
        att = att.masked_fill(~r.allowed, float("-inf")).softmax(-1, dtype=torch.float32).to(qr.dtype)
        outs.append(att @ V.repeat_interleave(rep, 1))
    o = torch.cat(outs, 2).transpose(1, 2).reshape(1, N, -1)
    return at.o_proj(o * torch.sigmoid(gate.reshape(1, N, -1)))


def _gdn(la, i, x, reqs, sizes):
    """Gated DeltaNet (Qwen3.5 / Qwen3-Next) of x [1, N, D] (all requests); updates each request's
    layer-i state. Returns [1, N, D]."""
    N = x.shape[1]
    if hasattr(la, "in_proj_qkvz"):  # Qwen3-Next: fused projections grouped per key head
        q, k, v, z, b, a = la.fix_query_key_value_ordering(la.in_proj_qkvz(x), la.in_proj_ba(x))
        mixed = torch.cat([t.reshape(1, N, -1) for t in (q, k, v)], -1)
        b, a = b.reshape(1, N, -1), a.reshape(1, N, -1)
    else:
        mixed = la.in_proj_qkv(x)  # [1, N, Dc] conv inputs (q | k | v)
        z = la.in_proj_z(x)
        b, a = la.in_proj_b(x), la.in_proj_a(x)
    z = z.reshape(1, N, -1, la.head_v_dim)
    convs = []
    for r, m in zip(reqs, mixed.split(sizes, 1)):
        st = r.lm.gdn[i]
        # Path-dependent conv: each node over its ancestors (earlier extends included), then the tail.
        seq = m if r.prefill else _cat(st.x, m)
        convs.append(
            tree_conv1d(seq, r.conv_parents, st.tail, la.conv1d.weight.squeeze(1), la.conv1d.bias, la.activation)[
                :, -m.shape[1] :
            ]
        )
        if r.prefill:
            W1 = st.tail.shape[1]
            full = torch.cat([st.tail, m], 1)
            st.tail = full[:, full.shape[1] - W1 :]
        else:
            st.x = seq
    q, k, v = torch.cat(convs, 1).split([la.key_dim, la.key_dim, la.value_dim], -1)
    rep = la.num_v_heads // la.num_k_heads  # each q/k head serves `rep` value heads
    q = (_l2norm(q.reshape(1, N, -1, la.head_k_dim).float()) * la.head_k_dim**-0.5).repeat_interleave(rep, 2)
    k = _l2norm(k.reshape(1, N, -1, la.head_k_dim).float()).repeat_interleave(rep, 2)
    v = v.reshape(1, N, -1, la.head_v_dim).float()
    beta = b.sigmoid().float()
    g = -la.A_log.float().exp() * F.softplus(a.float() + la.dt_bias.float())
    outs = []
    for r, qr, kr, vr, gr, br in zip(reqs, *(t.split(sizes, 1) for t in (q, k, v, g, beta))):
        st, lm = r.lm.gdn[i], r.lm
        if r.prefill:
            o, st.S = _chain(qr, kr, vr, gr, br, st.S)
        elif lm.strategy == "closed_form":
            o = lm._closed_form(st, qr, kr, vr, gr, br, r.old)
        elif lm.strategy == "materialize":
            o = lm._materialize(st, qr, kr, vr, gr, br, r.old)
        else:
            o, st.live = _chain(qr, kr, vr, gr, br, st.S if r.old == 0 else st.live)
            new = (qr, kr, vr, gr, br)
            st.inputs = new if st.inputs is None else tuple(torch.cat(p, 1) for p in zip(st.inputs, new))
        outs.append(o)
    o = la.norm(torch.cat(outs, 1).to(x.dtype).reshape(-1, la.head_v_dim), z.reshape(-1, la.head_v_dim))
    return la.out_proj(o.reshape(1, N, -1))
