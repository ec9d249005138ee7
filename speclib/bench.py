"""Timing and the analytic model of speculative decoding (REFERENCE.md section A).

    python -m speclib.bench [--prompts 12] [--max-new-tokens 96]   (also `make bench`)
    python -m speclib.bench --target-backend llamacpp-q4_0 --draft-backend llamacpp-q4_0

compares greedy AR, speclib SD at K = 1..6 and transformers assisted generation (torch backends only) on
the shipped pair, each model on the runtime given (`speclib.backends`).
Times are medians over repeats with warm-up; nothing here is asserted as a test.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from .drafters import ModelDrafter
from .generate import generate
from .lm import LM
from .sampling import Sampling


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "mps":
        torch.mps.synchronize()


def _timed_extend(lm: LM, tokens: list[int]) -> float:
    _sync(lm.device)
    t0 = time.perf_counter()
    lm.extend(tokens, list(range(-1, len(tokens) - 1)))
    _sync(lm.device)
    dt = time.perf_counter() - t0
    lm.commit([])
    return dt


def latencies(cases: list[tuple[LM, int]], prefix_len: int = 128, repeats: int = 30, warmup: int = 5) -> list[float]:
    """Median seconds of one extend() scoring n new chain tokens over a cached prefix, for each
    (lm, n) case. The cases are timed round-robin, so a burst of machine noise hits them all alike
    instead of biasing whichever was being timed at that moment."""
    gen = torch.Generator().manual_seed(0)
    for lm in {id(lm): lm for lm, _ in cases}.values():
        lm.reset(torch.randint(0, lm.vocab_size, (prefix_len,), generator=gen).tolist())
    tokens = [torch.randint(0, lm.vocab_size, (n,), generator=gen).tolist() for lm, n in cases]
    times = [[] for _ in cases]
    for _ in range(warmup + repeats):
        for (lm, _), toks, ts in zip(cases, tokens, times):
            ts.append(_timed_extend(lm, toks))
    return [statistics.median(ts[warmup:]) for ts in times]


def forward_latency(lm: LM, n: int, prefix_len: int = 128, repeats: int = 30, warmup: int = 5) -> float:
    """Median seconds of one extend() scoring n new chain tokens over a cached prefix."""
    return latencies([(lm, n)], prefix_len, repeats, warmup)[0]


def cost_profile(target: LM, draft: LM, ks=range(1, 9), prefix_len: int = 128, repeats: int = 30) -> dict:
    """c = T_draft(1)/T_target(1) and v(K) = T_target(K+1)/T_target(1), measured side by side."""
    ks = list(ks)
    t1, d1, *tk = latencies([(target, 1), (draft, 1)] + [(target, k + 1) for k in ks], prefix_len, repeats)
    return {"target_1": t1, "draft_1": d1, "c": d1 / t1, "v": {k: t / t1 for k, t in zip(ks, tk)}}


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per target call] for i.i.d. acceptance alpha and draft length k."""
    return k + 1.0 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, k: int, c: float, v: float) -> float:
    """E / (k c + v(k)); Leviathan et al. take v = 1, we measure it."""
    return expected_tokens(alpha, k) / (k * c + v)


def token_acceptance(steps: list[dict]) -> float:
    """Per-token acceptance a = accepted / reached draft positions (a position is reached when every
    draft token before it was accepted): the maximum-likelihood a of the i.i.d. model that
    `expected_tokens` assumes. The acceptance RATE accepted / drafted is smaller and falls with K,
    because it counts the positions after the first rejection as failures."""
    accepted = sum(s["accepted"] for s in steps)
    reached = sum(min(s["accepted"] + 1, s["drafted"]) for s in steps)
    return accepted / reached if reached else float("nan")


def position_counts(steps: list[dict], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per draft position i = 1..k: how often it was verified (all before it accepted) and accepted."""
    reached, accepted = np.zeros(k, int), np.zeros(k, int)
    for s in steps:
        if s["drafted"] == k:
            reached[: min(s["accepted"] + 1, k)] += 1
            accepted[: s["accepted"]] += 1
    return reached, accepted


def hf_assisted(target: LM, draft: LM, prompt_ids, max_new_tokens: int, k: int):
    """transformers assisted generation, greedy, constant k draft tokens. Returns (tokens, seconds)."""
    cfg = draft.model.generation_config
    cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule = k, "constant"
    cfg.assistant_confidence_threshold = 0.0          # always draft k: the same work as speclib's chain
    ids = torch.tensor([list(prompt_ids)], device=target.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = target.model.generate(ids, assistant_model=draft.model, do_sample=False,
                                    max_new_tokens=max_new_tokens, pad_token_id=target.eos_token_id)
    seconds = time.perf_counter() - t0
    return out[0, len(prompt_ids):].tolist(), seconds


def main(argv=None):
    from . import data, stats
    from .loading import load
    ap = argparse.ArgumentParser(prog="python -m speclib.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="code-target")
    ap.add_argument("--draft", default="code-draft")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--k-max", type=int, default=6)
    ap.add_argument("--target-backend", default="torch")
    ap.add_argument("--draft-backend", default="torch")
    a = ap.parse_args(argv)
    target, draft = load(a.target, backend=a.target_backend), load(a.draft, backend=a.draft_backend)
    with_hf = a.target_backend == a.draft_backend == "torch"      # assisted generation needs the torch models
    prompts = [target.encode(r["prompt"]) for r in data.load_workload("code_stdlib", a.prompts)]
    greedy = Sampling(0.0)
    prof = cost_profile(target, draft, range(1, a.k_max + 1))
    print(f"T_target(1) = {prof['target_1'] * 1e3:.2f} ms, T_draft(1) = {prof['draft_1'] * 1e3:.2f} ms, c = {prof['c']:.3f}")
    generate(target, prompts[0], 8, drafter=ModelDrafter(draft, 2), sampling=greedy)      # warm-up
    rows, same = {"AR": []}, []
    for ids in prompts:
        ar = generate(target, ids, a.max_new_tokens, sampling=greedy)
        rows["AR"].append(ar.stats["seconds"])
        for k in range(1, a.k_max + 1):
            sd = generate(target, ids, a.max_new_tokens, drafter=ModelDrafter(draft, k), sampling=greedy)
            same.append(sd.tokens == ar.tokens)     # fp32: always; quantized backends: see notebook 05
            rows.setdefault(f"SD K={k}", []).append((sd.stats["seconds"], token_acceptance(sd.stats["steps"])))
            if with_hf:
                hf, secs = hf_assisted(target, draft, ids, len(ar.tokens), k)
                rows.setdefault(f"HF K={k}", []).append((secs, float(hf == ar.tokens)))
    ar_t = np.array(rows["AR"])
    print(f"{'method':10s} {'speedup':>8s} {'95% CI':>16s} {'a/identical':>16s} {'v(K)':>6s} {'predicted':>9s}")
    for name, vals in rows.items():
        if name == "AR":
            continue
        t = np.array([v[0] for v in vals]); extra = np.mean([v[1] for v in vals])
        est, lo, hi = stats.bootstrap_ratio_ci(ar_t, t)
        k = int(name.split("=")[1])
        pred = predicted_speedup(extra, k, prof["c"], prof["v"][k]) if name.startswith("SD") else float("nan")
        print(f"{name:10s} {est:8.2f} {f'[{lo:.2f}, {hi:.2f}]':>16s} {extra:16.3f} {prof['v'][k]:6.2f} {pred:9.2f}")
    print(f"greedy SD output identical to AR on {sum(same)} / {len(same)} runs")


if __name__ == "__main__":
    main()
