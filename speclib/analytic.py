"""The analytic model of speculative decoding (floor 1; docs/analytic_model.md): tokens per target call
and predicted speedup, shared by the benchmarks and the drafters that plan with it."""


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per target call] for i.i.d. acceptance alpha and draft length k."""
    return k + 1.0 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, k: int, c: float, v: float = 1.0) -> float:
    """E / (k c + v(k)); Leviathan et al. take v = 1, we measure it."""
    return expected_tokens(alpha, k) / (k * c + v)
