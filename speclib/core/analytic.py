"""The analytic model of speculative decoding (floor 1; docs/analytic_model.md): tokens per target call
and predicted speedup, shared by the benchmarks and the drafters that plan with it."""


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per target call] for i.i.d. acceptance alpha and draft length k."""
    return k + 1.0 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, k: int, c: float, v: float = 1.0) -> float:
    """E / (k c + v(k)); Leviathan et al. take v = 1, we measure it."""
    return expected_tokens(alpha, k) / (k * c + v)


def acceptance_needed(speedup: float, k: int, c: float, v: float = 1.0) -> float:
    """The i.i.d. per-token acceptance at which `predicted_speedup(alpha, k, c, v)` equals `speedup`;
    nan when even alpha = 1 falls short (the chain's ceiling (k + 1) / (k c + v) is below it)."""
    need = speedup * (k * c + v)  # tokens per call the speedup requires
    if need > k + 1:
        return float("nan")
    if need <= 1:
        return 0.0
    lo, hi = 0.0, 1.0  # expected_tokens rises with alpha: bisect
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < need else (lo, mid)
    return (lo + hi) / 2
