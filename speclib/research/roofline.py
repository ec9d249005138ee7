"""The machine's roofline, measured: how fast it moves memory and how fast it multiplies matrices, and from
the two the fastest one-token forward a model's weights allow.

- `bandwidth`: a STREAM-like copy (a[:] = b) and scale (a[:] = 3 b) over arrays far larger than the caches,
  in GB/s counting the bytes read and written, the median over repeats with its spread.
- `throughput`: matrix products at decode shapes or square ones (float32, bfloat16, int8 through
  `torch._int_mm`), in GFLOP/s (2 m n k per product).
- `token_bound`: the roofline of one decode step: reading every weight once at `bandwidth` or doing
  every multiply-add at `throughput`, whichever takes longer (the KV cache and activations are left out:
  at a short context they are small beside the weights).
- `linear_widths`: one float32 product's seconds per number of rows, on torch's two CPU paths: where a
  path runs 4 rows faster than 1 or 3, T(n) is not monotone.
- `model_footprint`: a Llama's parameters and FLOPs per token from its config, and its weight bytes in each
  format speclib runs (float32, bfloat16, int8 with a float scale per row, GGUF q4_0's 4.5 bits).
- `backend_passes`: T(n) of a model on each of speclib's backends, side by side, against its format's bound;
  `exactness`: on chat requests, whether greedy prompt lookup keeps each backend's plain-decoding answers,
  and both loops' tokens/s.

Timing is `speclib.core.device.clock` on `threads` torch threads; run it with nothing else on the cores.

    python -m speclib roofline --threads 1 2
    python -m speclib roofline --threads 1 --widths 576 49152     # SmolLM2's LM head, widths 1-8
    python -m speclib roofline --threads 2 --backends torch torch-int8 torch-w8a8 openvino-int8 llamacpp-q4_0
"""

from __future__ import annotations

import argparse
import statistics

import pandas as pd
import torch

from speclib.core import device

BITS = {"float32": 32, "bfloat16": 16, "int8": 8, "q4_0": 4.5}  # q4_0: 32 4-bit weights and one fp16 scale
FORMAT = {
    "torch-bf16": "bfloat16",
    "llamacpp-f16": "bfloat16",
    "llamacpp-q4_0": "q4_0",
}  # else by name (f16 reads as 16-bit)
CHAT_REQUESTS = [
    "Write a Python function that reverses a string, then explain it.",
    "Translate into English: Der Hund spielt im Garten mit dem Ball.",
    "List three facts about the Moon.",
    "Summarize: The meeting moved the launch to May because the tests failed twice.",
    "Explain what a hash map is to a ten-year-old.",
    "Give me a recipe for pancakes.",
]


def weight_format(backend: str) -> str:
    if backend in FORMAT:
        return FORMAT[backend]
    return "int8" if backend.endswith(("int8", "w8a8", "q8_0")) else "float32"


def _timed(run, repeats: int) -> list[float]:
    run()  # warm: page faults, oneDNN's first-call set-up
    out = []
    for _ in range(repeats):
        t0 = device.clock()
        run()
        out.append(device.clock() - t0)
    return out


def _summary(rates: list[float]) -> dict:
    return dict(median=statistics.median(rates), lo=min(rates), hi=max(rates), repeats=len(rates))


def bandwidth(threads: int = 1, megabytes: int = 512, repeats: int = 7) -> pd.DataFrame:
    """Copy and scale over two float32 arrays of `megabytes` each: GB/s per kernel (bytes read + written)."""
    n = megabytes * 2**20 // 4
    a, b = torch.empty(n), torch.rand(n)
    moved = 2 * n * 4 / 1e9
    rows = []
    with device.threads(threads):
        for kernel, run in (("copy", lambda: a.copy_(b)), ("scale", lambda: torch.mul(b, 3.0, out=a))):
            rates = [moved / s for s in _timed(run, repeats)]
            rows.append(dict(kernel=kernel, threads=threads, megabytes=megabytes, **_summary(rates)))
    return pd.DataFrame(rows)


def _operands(dtype: str, m: int, k: int, n: int):
    if dtype == "int8":
        x, w = torch.randint(-127, 128, (m, k), dtype=torch.int8), torch.randint(-127, 128, (k, n), dtype=torch.int8)
        return lambda: torch._int_mm(x, w)
    t = getattr(torch, dtype)
    x, w = torch.randn(m, k).to(t), torch.randn(k, n).to(t)
    return lambda: x @ w


def throughput(threads: int = 1, dtypes=("float32", "bfloat16", "int8"), shapes=None, repeats: int = 7):
    """GFLOP/s of `x @ w` per dtype and shape (m, k, n): by default a decode-shaped product (m = 32 rows
    against a 576 x 1536 weight, an MLP of SmolLM2) and a square 1024 one. int8 runs `torch._int_mm`
    (int8 x int8 -> int32), the product an int8 weight-and-activation path needs; m must then exceed 16."""
    shapes = shapes or [(32, 576, 1536), (1024, 1024, 1024)]
    rows = []
    with device.threads(threads):
        for dtype in dtypes:
            for m, k, n in shapes:
                run = _operands(dtype, m, k, n)
                calls = max(1, int(2e8 // (2 * m * k * n)))  # about 0.2 GFLOP per timed repeat

                def many(run=run, calls=calls):
                    for _ in range(calls):
                        run()

                rates = [calls * 2 * m * k * n / 1e9 / s for s in _timed(many, repeats)]
                rows.append(dict(dtype=dtype, m=m, k=k, n=n, threads=threads, **_summary(rates)))
    return pd.DataFrame(rows)


def linear_widths(k: int, n: int, widths=(1, 2, 3, 4, 5, 8), threads: int = 1, repeats: int = 7) -> pd.DataFrame:
    """Seconds of one float32 product of `width` rows by a k x n weight, per width, on the two CPU paths torch
    offers: `F.linear` and oneDNN's reordered weight (`speclib.lms.llama.linear`, what LlamaLM runs). A verify
    pass of n tokens multiplies n rows by every weight, so where a path is cheaper at 4 rows than at 1 or 3, a
    wider pass costs less than a narrower one and the pass-cost curve T(n) is not monotone."""
    import torch.nn.functional as F

    w = torch.randn(n, k)
    packed = torch.ops.mkldnn._reorder_linear_weight(w) if torch.backends.mkldnn.is_available() else None
    paths = {"F.linear": lambda x: F.linear(x, w)}
    if packed is not None:
        paths["oneDNN packed"] = lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    rows = []
    with device.threads(threads):
        for path, f in paths.items():
            for m in widths:
                x = torch.randn(m, k)
                calls = min(200, int(5e7 // (2 * m * k * n)) + 1)  # enough to see a small product, not a second

                def many(f=f, x=x, calls=calls):
                    for _ in range(calls):
                        f(x)

                secs = [s / calls for s in _timed(many, repeats)]
                rows.append(dict(path=path, k=k, n=n, width=m, threads=threads, **_summary(secs)))
    return pd.DataFrame(rows)


def model_footprint(config) -> dict:
    """A Llama-style config's weights (parameters, embedding tied or not) and the FLOPs of one token's forward
    at a short context (2 per multiply-add of every matrix, the LM head included), and its weight bytes per
    format of `BITS` (the embedding table is a lookup, so only the LM head's copy is read per token)."""
    h, i, layers, v = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    heads, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or h // heads
    attn = h * heads * head_dim + 2 * h * kv * head_dim + heads * head_dim * h
    per_layer = attn + 3 * h * i
    matmul_params = layers * per_layer + h * v  # what one token multiplies by: every layer and the LM head
    out = dict(matmul_params=matmul_params, flops_per_token=2 * matmul_params)
    out |= {f"{fmt}_bytes": matmul_params * bits / 8 for fmt, bits in BITS.items()}
    return out


def token_bound(weight_bytes: float, flops: float, gb_per_s: float, gflop_per_s: float) -> dict:
    """The roofline of one decode step: seconds to read `weight_bytes` at `gb_per_s` and to compute `flops` at
    `gflop_per_s`; the step cannot beat the larger (`bound_s`), which names what bounds it."""
    memory_s, compute_s = weight_bytes / (gb_per_s * 1e9), flops / (gflop_per_s * 1e9)
    return dict(
        memory_s=memory_s,
        compute_s=compute_s,
        bound_s=max(memory_s, compute_s),
        bound_by="memory" if memory_s >= compute_s else "compute",
    )


def bounds(footprint: dict, bw: pd.DataFrame, tp: pd.DataFrame) -> pd.DataFrame:
    """Per thread count and weight format, `token_bound` from the measured copy bandwidth and the decode-shaped
    throughput of the format's arithmetic (float32 for float32, bfloat16 for bfloat16, int8 for int8 and
    q4_0, whose blocks are multiplied in 8 bits)."""
    arith = {"float32": "float32", "bfloat16": "bfloat16", "int8": "int8", "q4_0": "int8"}
    decode = tp[tp.m == tp.m.min()]
    rows = []
    for threads in sorted(set(bw.threads)):
        gb = bw[(bw.threads == threads) & (bw.kernel == "copy")]["median"].iloc[0]
        for fmt, kind in arith.items():
            g = decode[(decode.threads == threads) & (decode.dtype == kind)]["median"]
            if len(g):
                b = token_bound(footprint[f"{fmt}_bytes"], footprint["flops_per_token"], gb, float(g.iloc[0]))
                rows.append(dict(threads=threads, format=fmt, gb_per_s=gb, gflop_per_s=float(g.iloc[0]), **b))
    return pd.DataFrame(rows)


def backend_passes(lms: dict, widths=(1, 2, 4, 8, 16), rounds: int = 3, repeats: int = 10) -> pd.DataFrame:
    """T(n) in seconds of each backend's LM ({backend: lm}), all timed round-robin in each of `rounds` rounds
    (`bench.latencies`, a 128-token prefix): the median of the rounds' medians, and their min and max."""
    from speclib.research import bench

    cases = [(b, n) for b in lms for n in widths]
    per_round = [bench.latencies([(lms[b], n) for b, n in cases], repeats=repeats) for _ in range(rounds)]
    rows = []
    for i, (b, n) in enumerate(cases):
        secs = [r[i] for r in per_round]
        rows.append(dict(backend=b, n=n, format=weight_format(b), **_summary(secs)))
    return pd.DataFrame(rows)


def request_ids(lm, text: str) -> list[int]:
    """A request's prompt: through the model's chat template where it has one, else its plain encoding."""
    from speclib.lms import pretrained

    return pretrained.chat_ids(lm, text) if getattr(lm.tokenizer, "chat_template", None) else lm.encode(text)


def exactness(lms: dict, requests=CHAT_REQUESTS, max_new_tokens: int = 64, k: int = 4) -> pd.DataFrame:
    """Per backend: greedy plain decoding and greedy prompt lookup (k tokens) on each chat request, how many
    answers prompt lookup changed (it must change none: it is lossless only where a pass scores each token as a
    one-token pass would), and the tokens/s of both loops over all requests."""
    import time

    from speclib.core.generate import generate
    from speclib.core.sampling import Sampling
    from speclib.drafters.cache import PromptLookupDrafter

    greedy, rows = Sampling(0.0), []
    for b, lm in lms.items():
        changed, secs, tokens = 0, {"AR": 0.0, "lookup": 0.0}, {"AR": 0, "lookup": 0}
        for ask in requests:
            ids, out = request_ids(lm, ask), {}
            for name, drafter in (("AR", None), ("lookup", PromptLookupDrafter(3, k))):
                t0 = time.perf_counter()
                out[name] = generate(
                    lm, ids, max_new_tokens, drafter=drafter, sampling=greedy, eos_token_id=None
                ).tokens
                secs[name] += time.perf_counter() - t0
                tokens[name] += len(out[name])
            changed += out["lookup"] != out["AR"]
        rows.append(dict(backend=b, requests=len(requests), changed=changed,
                         ar_tokens_per_s=tokens["AR"] / secs["AR"], lookup_tokens_per_s=tokens["lookup"] / secs["lookup"]))  # fmt: skip
    return pd.DataFrame(rows)


def peer_rates(
    lm, requests=CHAT_REQUESTS, max_new_tokens: int = 64, threads: int | None = None, eos_token_id: int | None = None
) -> pd.DataFrame:
    """The CPU runtimes' own loops on the same weights and requests (greedy): llama.cpp's plain decoding and its
    prompt lookup (max n-gram 3, k = 4) on the q4_0 and q8_0 files speclib writes, and CTranslate2's generator
    in int8 and float32, each where installed; tokens/s over all requests, one run each. eos_token_id: as the
    peers take it (None: the model's; -1: decode to max_new_tokens)."""
    import importlib.util

    from speclib.lms import backends
    from speclib.research import peers

    loops = {}
    if importlib.util.find_spec("llama_cpp"):
        for q in ("q4_0", "q8_0"):
            f = backends.export_gguf(lm, q)
            loops[f"llama.cpp {q} AR"] = peers.LlamaCpp(f, threads=threads, eos_token_id=eos_token_id)
            loops[f"llama.cpp {q} prompt lookup"] = peers.LlamaCpp(
                f, threads=threads, lookup=(3, 4), eos_token_id=eos_token_id
            )
    if importlib.util.find_spec("ctranslate2"):
        for ct in ("int8", "float32"):
            loops[f"ctranslate2 {ct} AR"] = peers.CTranslate2(lm, ct, threads=threads, eos_token_id=eos_token_id)
    rows = []
    for name, peer in loops.items():
        runs = [peer.generate(request_ids(lm, ask), max_new_tokens) for ask in requests]
        n, secs = sum(len(g.tokens) for g in runs), sum(g.stats.seconds for g in runs)
        rows.append(dict(peer=name, requests=len(requests), tokens=n, tokens_per_s=n / secs))
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m speclib roofline", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--megabytes", type=int, default=512, help="each STREAM array's size")
    p.add_argument("--model", default="smollm2-135m-instruct", help="a model of speclib.lms.pretrained, or none")
    p.add_argument("--widths", type=int, nargs=2, metavar=("K", "N"), help="only time a K x N linear at widths 1-8")
    p.add_argument("--backends", nargs="+", help="also time the model on these backends (speclib.lms.backends)")
    a = p.parse_args(argv)
    if a.widths:
        t = pd.concat([linear_widths(*a.widths, threads=th) for th in a.threads], ignore_index=True)
        print(
            t.assign(ms=lambda d: d["median"] * 1e3)
            .pivot_table(index=["path", "threads"], columns="width", values="ms")
            .round(3)
        )
        return
    bw = pd.concat([bandwidth(t, a.megabytes) for t in a.threads], ignore_index=True)
    tp = pd.concat([throughput(t) for t in a.threads], ignore_index=True)
    print(bw.round(2).to_string(index=False), "\n")
    print(tp.round(1).to_string(index=False), "\n")
    if a.model != "none":
        from transformers import AutoConfig

        from speclib.lms import pretrained

        fp = model_footprint(AutoConfig.from_pretrained(pretrained.materialize(a.model)))
        print(f"{a.model}: {fp['matmul_params'] / 1e6:.1f}M parameters multiplied per token, "
              f"{fp['flops_per_token'] / 1e6:.0f} MFLOP per token")  # fmt: skip
        bd = bounds(fp, bw, tp)
        print(bd.assign(bound_ms=lambda d: d.bound_s * 1e3).round(3).to_string(index=False))
        if a.backends:
            from speclib.lms.loading import load

            with device.threads(max(a.threads)):
                lms = {b: load(a.model, backend=b) for b in a.backends}
                t = backend_passes(lms)
                ex = exactness(lms)
                peer = peer_rates(load(a.model), eos_token_id=-1)  # -1: no EOS stop, as `exactness` decodes
            bound = bd[bd.threads == max(a.threads)].set_index("format").bound_s
            t1 = t[t.n == 1].set_index("backend")
            print(
                f"\nT(n) ms at {max(a.threads)} threads (median of 3 rounds of 10 passes; T(1) against its format's bound):"
            )
            print(t.assign(ms=lambda d: d["median"] * 1e3).pivot_table(index="backend", columns="n", values="ms", sort=False)
                  .assign(x_bound=(t1["median"] / t1.format.map(bound)).round(1)).round(1).to_string())  # fmt: skip
            print(f"\n{ex.requests.iloc[0]} chat requests, 64 greedy tokens, prompt lookup k = 4:")
            print(ex.round(1).to_string(index=False))
            print("\nthe runtimes' own loops on the same requests:")
            print(peer.round(1).to_string(index=False))


if __name__ == "__main__":
    main()
