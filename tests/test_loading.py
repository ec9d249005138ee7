"""speclib.lms.loading.with_context: the same weights behind a longer context, identical outputs inside the old one."""

import pytest
import torch
from transformers import Qwen3_5ForCausalLM

from speclib import Sampling, generate
from speclib.lms.hybrid import HybridLM, tiny_config
from speclib.lms.loading import with_context


def tiny(max_positions=64):
    torch.manual_seed(0)
    cfg = tiny_config()
    cfg.max_position_embeddings = max_positions
    return HybridLM(Qwen3_5ForCausalLM(cfg).eval(), None, "cpu")


def test_with_context_raises_the_limit_and_keeps_outputs():
    lm = tiny(64)
    prompt = [int(t) for t in torch.randint(0, lm.vocab_size, (12,), generator=torch.Generator().manual_seed(1))]
    before = generate(lm, prompt, 20, sampling=Sampling(0.0)).tokens
    long = with_context(lm, 200)
    assert long.max_length == 200 and long is not lm
    assert generate(long, prompt, 20, sampling=Sampling(0.0)).tokens == before
    generate(long, prompt, 150, sampling=Sampling(0.0))  # past the old limit: runs
    assert with_context(long, 100) is long  # already long enough


def test_with_context_refuses_what_it_cannot_raise():
    lm = tiny(64)
    with pytest.raises(ValueError, match="n must be"):
        with_context(lm, 0)
    lm.model.config.rope_parameters = dict(lm.model.config.rope_parameters, rope_type="yarn")
    with pytest.raises(ValueError, match="yarn"):
        with_context(lm, 128)
