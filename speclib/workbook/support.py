"""The support matrix: which transformers causal-LM families speclib decodes, checked end to end on tiny
random models saved and loaded the way a user would (`speclib.load(folder)`).

For each family `check(family, tmpdir)` builds a tiny fp32 target (2-4 layers, hidden 64, vocab 384,
seeded) and a draft of the same architecture whose weights are the target's plus noise, so greedy
acceptance is partial and both the full-accept and the rejection paths run; saves both with a word-level
tokenizer built offline; loads them with `speclib.load`; and checks:

    chains      greedy AR == transformers generate(do_sample=False); greedy chain SD (ModelDrafter, k=3)
                == AR; a chain's extend / partial commit / next extend logits == fresh full forwards
    trees       a random tree's extend / commit logits == fresh forwards, or "unsupported: why"
    sampling    a seeded temperature-1 SD run completes and is identical on a rerun
    vocab_check a draft with another vocabulary is refused by the drafter's compatibility check

    python -m speclib support      # every family -> data/results/support_matrix.parquet, printed table
"""

from __future__ import annotations

import argparse
import copy
import random
import tempfile
import time
from pathlib import Path

import torch

from speclib.core.protocols import BatchedLM, TreeProbe

V, D = 384, 64  # vocabulary and hidden size of every tiny model
NO_SPECIAL = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)  # no EOS: every run is full length
NOISE = 0.15  # draft = target weights + NOISE * (each tensor's std) * N(0, 1)
COLUMNS = [
    "family",
    "architecture",
    "lm_class",
    "strategy",
    "chains",
    "trees",
    "sampling",
    "vocab_check",
    "batched",
    "sd_acceptance",
    "seconds",
    "note",
]


def _attn(**kw) -> dict:
    """Common attention-model sizes: 2 layers, 4 query / 2 KV heads of dim 16."""
    return (
        dict(
            vocab_size=V,
            hidden_size=D,
            intermediate_size=2 * D,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            **NO_SPECIAL,
        )
        | kw
    )


def _mamba(**kw) -> dict:
    """Mamba2-style mixer sizes shared by the hybrids: 8 heads of 16 (= 2 * hidden), state 16, one group."""
    return dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1, mamba_chunk_size=16) | kw


# family -> the kwargs of its tiny config (AutoConfig.for_model(family, **kwargs)), or why it is skipped
FAMILIES: dict[str, dict | str] = {
    # attention only: HFLM (LlamaLM for Llama)
    "llama": _attn(),
    "mistral": _attn(),  # default sliding_window 4096: sliding layers
    "qwen2": _attn(),
    "qwen3": _attn(head_dim=16),
    "gemma2": _attn(head_dim=16),
    "gemma3_text": _attn(head_dim=16),
    "phi3": _attn(),
    "gpt2": dict(vocab_size=V, n_embd=D, n_layer=2, n_head=4, n_positions=256, **NO_SPECIAL),
    "gpt_neox": dict(
        vocab_size=V,
        hidden_size=D,
        intermediate_size=2 * D,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        **NO_SPECIAL,
    ),
    "olmo2": _attn(),
    "smollm3": _attn(),
    # recurrent / hybrid: StatefulLM (HybridLM for Qwen3.5)
    "mamba2": dict(
        vocab_size=V,
        hidden_size=D,
        num_hidden_layers=2,
        num_heads=8,
        head_dim=16,
        state_size=16,
        n_groups=1,
        chunk_size=16,
        **NO_SPECIAL,
    ),
    "falcon_h1": _attn(**_mamba(mamba_d_ssm=2 * D)),
    "bamba": _attn(attn_layer_indices=[1], **_mamba()),
    "jamba": _attn(
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=2,
        num_experts_per_tok=1,
        mamba_d_state=8,
        mamba_dt_rank=8,
        use_mamba_kernels=False,
    ),
    "zamba2": _attn(
        layers_block_type=["linear_attention", "hybrid"],
        n_mamba_heads=4,
        mamba_d_state=16,
        chunk_size=16,
        use_mamba_kernels=False,
        adapter_rank=8,
        num_key_value_heads=4,
    ),
    "granitemoehybrid": _attn(
        layer_types=["linear_attention", "full_attention"],
        num_local_experts=2,
        num_experts_per_tok=1,
        shared_intermediate_size=D,
        position_embedding_type="rope",
        **_mamba(),
    ),
    "nemotron_h": _attn(
        num_hidden_layers=3,
        layers_block_type=["linear_attention", "full_attention", "mlp"],
        head_dim=16,
        ssm_state_size=16,
        mamba_num_heads=8,
        mamba_head_dim=16,
        n_groups=1,
        chunk_size=16,
        use_mamba_kernels=False,
    ),
    "lfm2": _attn(full_attn_idxs=[1], block_auto_adjust_ff_dim=False),
    "qwen3_next": _attn(
        layer_types=["linear_attention", "full_attention"],
        head_dim=16,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=D,
        shared_expert_intermediate_size=D,
    ),
    "minimax": _attn(head_dim=16, num_local_experts=2, num_experts_per_tok=1, block_size=16),
    "kimi_linear": _attn(
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        moe_intermediate_size=D,
        num_local_experts=2,
        num_experts_per_tok=1,
        linear_head_dim=16,
        linear_num_heads=4,
        layer_types=["linear_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse"],
    ),
    "qwen3_5_text": _attn(
        num_hidden_layers=4,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
    ),
    "mamba": dict(vocab_size=V, hidden_size=D, state_size=16, num_hidden_layers=2, **NO_SPECIAL),
    "falcon_mamba": dict(vocab_size=V, hidden_size=D, state_size=16, num_hidden_layers=2, **NO_SPECIAL),
    "zamba": _attn(
        num_hidden_layers=3,
        layers_block_type=["linear_attention", "hybrid", "hybrid"],
        n_mamba_heads=2,
        use_mamba_kernels=False,
        num_key_value_heads=4,
        mamba_dt_rank=8,
    ),
    "lfm2_moe": _attn(
        layer_types=["conv", "full_attention"],
        num_dense_layers=1,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=D,
    ),
    "olmo_hybrid": _attn(
        layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
    ),
    "qwen3_5_moe_text": _attn(
        layer_types=["linear_attention", "full_attention"],
        head_dim=16,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=D,
        shared_expert_intermediate_size=D,
    ),
    "lfm3": _attn(layer_types=["conv", "full_attention"]),
    "zaya": _attn(),
    "lara_mini": _attn(
        head_dim=16,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=D,
        shared_expert_intermediate_size=D,
    ),  # its 2 default layers: linear + sliding
    "qwen3_5": "multimodal layout: see `check_qwen3_5_multimodal` (a vision wrapper around qwen3_5_text)",
    # stateful families whose state is outside transformers' Cache (speclib.lms.stateful.UNSUPPORTED)
    "rwkv": "unsupported: state passed as a plain list, outside transformers' Cache",
    "recurrent_gemma": "unsupported: states kept inside the modules, not in a Cache",
    "xlstm": "unsupported: xLSTMCache has no snapshot/restore interface",
}
# MoE hybrids whose default sizes need more than the common kwargs to shrink
_INKLING = dict(
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    swa_num_attention_heads=4,
    swa_num_key_value_heads=2,
    swa_head_dim=16,
    sliding_window_size=16,
    layer_types=["hybrid_sliding", "hybrid"],
    mlp_layer_types=["dense", "sparse"],
    intermediate_size=2 * D,
    moe_intermediate_size=D,
    n_routed_experts=2,
    num_experts_per_tok=1,
    n_shared_experts=1,
    vocab_size=V,
    hidden_size=D,
    num_hidden_layers=2,
    max_position_embeddings=256,
    **NO_SPECIAL,
)
FAMILIES |= {
    "inkling_text": _INKLING,
    "inkling2_text": _INKLING | dict(d_rel=4, rel_extent=16, n_layers_per_attn_res_block=2, unpadded_vocab_size=V),
    "inkling2_loop_text": _INKLING | dict(d_rel=4, rel_extent=16, n_layers_per_attn_res_block=2, unpadded_vocab_size=V),
    "qwen4_exp_text": _attn(
        head_dim=16,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        moe_intermediate_size=D,
        shared_expert_intermediate_size=D,
        num_experts_per_tok=1,
        num_experts=2,
        layer_types=["linear_attention", "indexed_attention"],
        hc_lowrank=8,
        ple_embed_dim=D,
        ngram_vocab_size_base=1024,
        heads_per_ngram=2,
        indexer_budget=32,
        indexer_compress_ratio=4,
        indexer_n_heads=2,
        indexer_kv_heads=1,
        indexer_head_dim=16,
    ),
    "bailing_hybrid": _attn(
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        v_head_dim=16,
        qk_nope_head_dim=8,
        qk_head_dim=16,
        head_dim=16,
        num_expert_group=1,
        topk_group=1,
        num_experts_per_token=1,
        num_experts=2,
        num_shared_experts=1,
        moe_intermediate_size=D,
        layer_group_size=2,
        layer_types=["linear_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse"],
        linear_head_dim=16,
        linear_num_heads=4,
        num_nextn_predict_layers=0,
    ),
}


def tiny_tokenizer(vocab: int = V):
    """A word-level tokenizer over "w0" .. "w{vocab-1}", built offline (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0")


def tiny_config(family: str, **overrides):
    from transformers import AutoConfig

    spec = FAMILIES[family]
    if isinstance(spec, str):
        raise ValueError(f"{family}: {spec}")
    # Weights 5x the usual init scale: a random tiny model then depends on its context (and recurrent state)
    # enough that a wrong state shows in the logits, not only below the tolerance.
    return AutoConfig.for_model(family, **({"initializer_range": 0.1} | spec | overrides))


def tiny_model(family: str, seed: int = 0, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(family, **overrides), dtype=torch.float32).eval()


def perturbed(model, seed: int = 1, scale: float = NOISE):
    """A copy of `model` with noise added to every weight: a draft that agrees with it part of the time."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            if p.numel() > 1 and p.is_floating_point():
                p.add_(torch.randn(p.shape, generator=gen) * (scale * p.float().std().item()))
    return draft


def save_pair(target, folder: Path) -> tuple[Path, Path]:
    """Save target and its perturbed draft, each with the tiny tokenizer, as HF folders."""
    tok = tiny_tokenizer(target.config.get_text_config(decoder=True).vocab_size)
    dirs = folder / "target", folder / "draft"
    for model, d in zip((target, perturbed(target)), dirs):
        model.save_pretrained(d)
        tok.save_pretrained(d)
    return dirs


# --- the checks: each returns "ok" or what went wrong ----------------------------------------------
@torch.inference_mode()
def fresh_logits(lm, ids: list[int]) -> torch.Tensor:
    """The slow obvious twin: a full forward over the whole sequence, no cache."""
    out = lm.model(input_ids=torch.tensor([ids], device=lm.device), use_cache=False)
    return out.logits[0, -1].float()


def _close(a, b) -> bool:
    return torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def check_chains(target, draft, prompt: list[int], n: int, row: dict) -> str:
    from speclib.core.generate import generate
    from speclib.core.sampling import Sampling
    from speclib.drafters import ModelDrafter

    greedy = Sampling(0.0)
    ar = generate(target, prompt, n, sampling=greedy, eos_token_id=None).tokens
    with torch.inference_mode():
        hf = target.model.generate(
            torch.tensor([prompt], device=target.device),
            max_new_tokens=n,
            do_sample=False,
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        )
    hf = hf[0, len(prompt) :].tolist()
    if ar != hf:
        return f"error: greedy AR {ar} != transformers generate {hf}"
    sd = generate(target, prompt, n, drafter=ModelDrafter(draft, k=3), sampling=greedy, eos_token_id=None)
    row["sd_acceptance"] = round(sd.stats.acceptance_rate, 3)
    if sd.tokens != ar:
        return f"error: greedy chain SD {sd.tokens} != AR {ar}"
    chain = ar[:4]  # extend a chain, keep 2, go on: logits vs fresh forwards
    target.reset(prompt)
    logits = target.extend(chain, [-1, 0, 1, 2])
    if not all(_close(logits[i], fresh_logits(target, prompt + chain[: i + 1])) for i in range(4)):
        return "error: chain extend logits differ from a fresh forward"
    target.commit([0, 1])
    nxt = target.extend([ar[5]], [-1])[0]
    if not _close(nxt, fresh_logits(target, prompt + chain[:2] + [ar[5]])):
        return "error: logits after a partial commit differ from a fresh forward"
    target.extend([ar[6]], [0])
    target.commit([0, 1])  # the whole pending chain kept
    ctx = prompt + chain[:2] + ar[5:7]
    if not _close(target.extend([ar[7]], [-1])[0], fresh_logits(target, ctx + [ar[7]])):
        return "error: logits after a full-accept commit differ from a fresh forward"
    return "ok"


def tree_reason(lm) -> str | None:
    """Why `lm` refuses trees (None: it verifies them)."""
    return lm.trees_unsupported() if isinstance(lm, TreeProbe) else None


def check_trees(target, prompt: list[int], seed: int = 0) -> str:
    rnd = random.Random(seed)
    tokens = [rnd.randrange(V) for _ in range(7)]
    parents = [rnd.randint(-1, i - 1) for i in range(7)]
    parents[1] = -1  # at least one branching: 0 and 1 are siblings
    target.reset(prompt)
    reason = tree_reason(target)
    try:
        logits = target.extend(tokens, parents)
    except ValueError as exc:
        if reason is not None and "chains only" in str(exc):
            return f"unsupported: {reason}"
        raise
    if reason is not None:
        return f"error: a tree was accepted although trees are unsupported ({reason})"

    def path(i):
        return path(parents[i]) + [i] if i >= 0 else []

    for i in range(7):
        if not _close(logits[i], fresh_logits(target, prompt + [tokens[j] for j in path(i)])):
            return f"error: tree node {i} logits differ from a fresh forward"
    keep = path(rnd.randrange(7))
    target.commit(keep)
    ctx = prompt + [tokens[j] for j in keep]
    if not _close(target.extend([3], [-1])[0], fresh_logits(target, ctx + [3])):
        return "error: logits after a tree commit differ from a fresh forward"
    return "ok"


def check_sampling(target, draft, prompt: list[int], n: int) -> str:
    from speclib.core.generate import generate
    from speclib.core.sampling import Sampling
    from speclib.drafters import ModelDrafter

    runs = [
        generate(
            target, prompt, n, drafter=ModelDrafter(draft, k=3), sampling=Sampling(1.0), seed=7, eos_token_id=None
        ).tokens
        for _ in range(2)
    ]
    if len(runs[0]) != n:
        return f"error: {len(runs[0])} tokens instead of {n}"
    return "ok" if runs[0] == runs[1] else "error: two runs with the same seed differ"


def check_vocab(target, prompt: list[int]) -> str:
    from transformers import AutoModelForCausalLM

    from speclib.core.generate import generate
    from speclib.drafters import ModelDrafter
    from speclib.lms.loading import wrap

    config = copy.deepcopy(target.model.config)
    config.get_text_config(decoder=True).vocab_size = target.vocab_size + 16
    other = wrap(AutoModelForCausalLM.from_config(config).eval(), None, target.device)
    try:
        generate(target, prompt, 2, drafter=ModelDrafter(other, k=2))
    except ValueError as exc:
        return "ok" if "vocabulary" in str(exc) else f"error: unexpected message: {exc}"
    return "error: a draft with another vocabulary was accepted"


def _run(fn, *args) -> str:
    try:
        return fn(*args)
    except Exception as exc:  # a matrix row records the failure instead of stopping
        return f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"


def check(family: str, tmpdir, prompt_len: int = 12, new_tokens: int = 16) -> dict:
    """One row of the matrix (COLUMNS); every check's cell is "ok", "unsupported: ..." or "error: ...".
    Families that are skipped come back with the reason in `note`."""
    from speclib.lms.loading import load

    row = dict.fromkeys(COLUMNS)
    row["family"] = family
    t0 = time.perf_counter()
    spec = FAMILIES[family]
    if isinstance(spec, str):
        row["note"] = spec
        return row
    folder = Path(tmpdir) / family
    try:
        target_dir, draft_dir = save_pair(tiny_model(family), folder)
        target, draft = load(str(target_dir)), load(str(draft_dir))
    except Exception as exc:
        row["note"] = f"error building or loading: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        row["seconds"] = round(time.perf_counter() - t0, 2)
        return row
    prompt = random.Random(family).sample(range(V), prompt_len)
    row.update(
        architecture=type(target.model).__name__,
        lm_class=type(target).__name__,
        batched="yes" if isinstance(target, BatchedLM) else "no",
    )
    row["chains"] = _run(check_chains, target, draft, prompt, new_tokens, row)
    row["trees"] = _run(check_trees, target, prompt)
    row["sampling"] = _run(check_sampling, target, draft, prompt, new_tokens)
    row["vocab_check"] = _run(check_vocab, target, prompt)
    # after the checks: StatefulLM decides on one-token-per-pass ("serial") at its first reset
    row["strategy"] = getattr(target, "strategy", "kv-cache") + (
        " (serial)" if getattr(target, "serial", False) else ""
    )
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def check_qwen3_5_multimodal(tmpdir) -> str:
    """A released Qwen3.5 checkpoint's layout: config model_type "qwen3_5" with a text_config and a vision
    tower, weights under model.language_model. speclib.load must give a HybridLM whose logits are the
    wrapper's own on text."""
    from transformers import AutoConfig, Qwen3_5ForConditionalGeneration

    from speclib.lms.loading import load

    text = tiny_config("qwen3_5_text").to_dict()
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=D,
        num_position_embeddings=16,
        patch_size=4,
    )
    config = AutoConfig.for_model(
        "qwen3_5",
        text_config=text,
        vision_config=vision,
        image_token_id=V - 4,
        video_token_id=V - 3,
        vision_start_token_id=V - 2,
        vision_end_token_id=V - 1,
    )
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(config).eval()
    folder = Path(tmpdir) / "qwen3_5_mm"
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    lm = load(str(folder))
    if type(lm).__name__ != "HybridLM":
        return f"error: loaded as {type(lm).__name__}, not HybridLM"
    prompt = list(range(10, 22))
    with torch.inference_mode():
        ref = model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    return "ok" if _close(lm.reset(prompt), ref) else "error: logits differ from the multimodal model's"


def matrix(tmpdir=None, families=None) -> pd.DataFrame:  # noqa: F821
    import pandas as pd

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmpdir or tmp)
        rows = [check(f, root) for f in (families or FAMILIES)]
        if families is None or "qwen3_5" in families:
            row = next(r for r in rows if r["family"] == "qwen3_5")
            row.update(lm_class="HybridLM", note=row["note"] + "; load: " + _run(check_qwen3_5_multimodal, root))
    return pd.DataFrame(rows, columns=COLUMNS)


def main(argv=None) -> None:
    import pandas as pd
    from transformers.utils import logging as hf_logging

    from speclib.workbook import results

    ap = argparse.ArgumentParser(
        prog="python -m speclib support", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "families",
        nargs="*",
        metavar="FAMILY",
        help="check only these (default: every family, and rewrite data/results/support_matrix.parquet)",
    )
    families = ap.parse_args(argv).families
    if unknown := sorted(set(families) - set(FAMILIES)):
        ap.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    hf_logging.set_verbosity_error()
    df = matrix(families=families or None)
    if not families:
        print("wrote", results.save(df, "support_matrix"))
    with pd.option_context("display.max_colwidth", 60, "display.width", 250):
        short = df.drop(columns=["note"]).assign(trees=df["trees"].str.slice(0, 48))  # reasons in full in the file
        print(short.to_string(index=False))
        notes = df.dropna(subset=["note"])
        if len(notes):
            print("\n" + notes[["family", "note"]].to_string(index=False))


if __name__ == "__main__":
    main()
