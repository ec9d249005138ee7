"""Other implementations of the same methods, run on the same weights for side-by-side comparison.

    hf_generate(lm, ids, n)                  transformers' own greedy `generate` (its AR baseline)
    hf_prompt_lookup(lm, ids, n, k, ngram)   transformers' prompt lookup decoding (`prompt_lookup_num_tokens`)
    hf_assisted(lm, draft, ids, n, k)        transformers' assisted generation with a draft model (`assistant_model`)
    LlamaCpp(gguf).generate(ids, n)          llama.cpp (llama-cpp-python) greedy on a GGUF file
    LlamaCpp(gguf, lookup=(ngram, k))        ... with its prompt lookup drafter (`LlamaPromptLookupDecoding`)
    CTranslate2(lm, "int8").generate(ids, n)  CTranslate2's greedy generator on the same weights (no speculation)

Each returns a `Generation` with the new tokens, the wall time and, where the peer reports them, no
per-step statistics (the steps list is empty: these loops do not expose their acceptance). All stop at
`max_new_tokens` or at the model's EOS token, like `speclib.generate`. Greedy only.
"""

from __future__ import annotations

import atexit

import torch

from speclib.core.device import clock
from speclib.core.generate import Generation, Stats
from speclib.lms.backends import open_llama


def _generation(tokens: list[int], seconds: float) -> Generation:
    return Generation(tokens, "", Stats(new_tokens=len(tokens), seconds=seconds, tokens_per_s=len(tokens) / seconds))


def _hf(lm, prompt_ids, max_new_tokens: int, **kw) -> Generation:
    ids = torch.tensor([list(prompt_ids)], device=lm.device)
    t0 = clock(lm.device)
    with torch.inference_mode():
        out = lm.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=lm.eos_token_id,
            pad_token_id=lm.eos_token_id,
            **kw,
        )
    seconds = clock(lm.device) - t0
    return _generation(out[0, len(prompt_ids) :].tolist(), seconds)


def hf_generate(lm, prompt_ids, max_new_tokens: int) -> Generation:
    """transformers' greedy `generate` on `lm.model` (the stock forward and cache)."""
    return _hf(lm, prompt_ids, max_new_tokens)


def hf_prompt_lookup(lm, prompt_ids, max_new_tokens: int, k: int = 10, max_ngram: int = 2) -> Generation:
    """transformers' prompt lookup decoding: up to k tokens copied after the last matching n-gram
    (n = max_ngram down to 1), verified by the target in one pass."""
    return _hf(lm, prompt_ids, max_new_tokens, prompt_lookup_num_tokens=k, max_matching_ngram_size=max_ngram)


def hf_assisted(lm, draft, prompt_ids, max_new_tokens: int, k: int) -> Generation:
    """transformers' assisted generation: `draft.model` proposes k tokens greedily, `lm.model` verifies
    them in one pass. The schedule is constant and the draft never stops early on low confidence, so it
    does the same work as speclib's chain of k (`ModelDrafter(draft, k)`)."""
    cfg = draft.model.generation_config
    cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule = k, "constant"
    cfg.assistant_confidence_threshold = 0.0
    return _hf(lm, prompt_ids, max_new_tokens, assistant_model=draft.model)


class LlamaCpp:
    """llama.cpp on a GGUF file; `lookup=(max_ngram, k)` adds llama-cpp-python's prompt lookup drafter
    (it drafts up to k tokens after the last matching n-gram, n = max_ngram down to 1, and verifies them
    in one `eval`)."""

    def __init__(
        self,
        gguf,
        threads: int | None = None,
        n_ctx: int = 4096,
        lookup: tuple[int, int] | None = None,
        eos_token_id: int | None = None,
    ):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft = LlamaPromptLookupDecoding(max_ngram_size=lookup[0], num_pred_tokens=lookup[1]) if lookup else None
        n = threads or torch.get_num_threads()
        # with a drafter every position's logits are kept (llama-cpp-python sizes that buffer by logits_all)
        self.llm = open_llama(
            gguf,
            n_ctx=n_ctx,
            n_threads=n,
            n_threads_batch=n,
            draft_model=draft,
            logits_all=draft is not None,
            verbose=False,
        )
        atexit.register(self.llm.close)
        self.eos = self.llm.token_eos() if eos_token_id is None else eos_token_id
        self.lookup = lookup

    def generate(self, prompt_ids, max_new_tokens: int) -> Generation:
        # llama-cpp-python keeps the last call's KV cache and skips re-evaluating a shared prefix: a timed
        # run would then skip most of its prefill when it repeats a prompt (the benchmark's warm-up) or
        # extends one (a second turn), which speclib's loop never does, and the reused cache rounds
        # differently from a fresh prefill. Every run starts from an empty cache, as speclib's does.
        self.llm.reset()
        out = []
        t0 = clock(torch.device("cpu"))
        for tok in self.llm.generate(list(prompt_ids), temp=0.0, top_k=1, reset=True):
            if tok == self.eos:
                break
            out.append(int(tok))
            if len(out) >= max_new_tokens:
                break
        return _generation(out, clock(torch.device("cpu")) - t0)


class CTranslate2:
    """CTranslate2's greedy generator on a transformers Llama's weights, converted once into
    build/backends/<weights>/ct2-<compute_type> (`int8` quantizes the weights per row, `float32` keeps them).
    It has no speculative mode: the peer for plain decoding on a fast CPU runtime."""

    def __init__(self, lm, compute_type: str = "int8", threads: int | None = None, eos_token_id: int | None = None):
        import ctranslate2
        from ctranslate2.converters import TransformersConverter

        from speclib.lms.backends import CACHE, _weights_key

        out = CACHE / _weights_key(lm) / f"ct2-{compute_type}"
        if not (out / "model.bin").exists():
            tmp = out.with_name(out.name + ".tmp")
            TransformersConverter(str(lm.path)).convert(str(tmp), quantization=compute_type, force=True)
            tmp.replace(out)
        n = threads or torch.get_num_threads()
        self.generator = ctranslate2.Generator(str(out), device="cpu", compute_type=compute_type, intra_threads=n)
        self.tokenizer = lm.tokenizer
        self.eos = lm.tokenizer.eos_token_id if eos_token_id is None else eos_token_id  # -1: never stop early

    def generate(self, prompt_ids, max_new_tokens: int) -> Generation:
        toks = self.tokenizer.convert_ids_to_tokens(list(prompt_ids))
        t0 = clock(torch.device("cpu"))
        r = self.generator.generate_batch(
            [toks], max_length=max_new_tokens, sampling_topk=1, include_prompt_in_result=False, return_end_token=True,
            end_token=[] if self.eos is None or self.eos < 0 else [self.tokenizer.convert_ids_to_tokens(self.eos)],
        )  # fmt: skip
        out = list(r[0].sequences_ids[0])
        return _generation(out, clock(torch.device("cpu")) - t0)
