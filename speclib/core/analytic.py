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


def overlap_step_time(alpha: float, k: int, c: float, v: float, ahead: int | None = None) -> float:
    """Mean time per verify pass of overlapped drafting (`OverlapDrafter(k=k, wait_for=k, ahead)`), in
    target passes; docs/overlap.md derives it. The draft runs on while the target verifies; a step whose
    k drafts are all accepted and whose next token is the draft's next (probability alpha^(k+1)) leaves
    R = min(ahead, k + floor(v / c)) - k - 1 tokens ready, and the next step waits only (k - R) c. Exact
    for the i.i.d. model when ahead <= 2k (a step never finds k tokens ready); the sequential step
    costs k c + v."""
    ahead = 2 * k if ahead is None else ahead
    if ahead > 2 * k:
        raise ValueError(f"the closed form needs ahead <= 2k ({2 * k}), got {ahead}: use simulate_overlap")
    ready = k + (int(v / c) if c > 0 else ahead)
    r = max(0, min(ahead, ready) - k - 1)
    return v + k * c - alpha ** (k + 1) * r * c


def simulate_overlap(
    alpha: float, k: int, c: float, v, wait_for: int, ahead: int | None = None, steps: int = 20000, seed: int = 0
) -> dict:
    """The overlapped loop's timeline under the i.i.d. model, step by step: the draft produces one token
    every c target passes along its hypothesis (up to `ahead` past the context); the decoder waits for
    `wait_for` ready tokens, verifies n = min(k, ready) of them in v[n] (v: a sequence, v[0] = 1 for a
    plain step), accepts each with probability alpha, and the hypothesis survives when all n are
    accepted, the next token matches the draft's (alpha again) and the draft had drafted it; otherwise
    the draft restarts from the new context. Returns tokens per target pass of time ("speedup", over AR
    at one pass per token), mean tokens and drafts per step, and the target's idle fraction."""
    import random

    ahead = 2 * k if ahead is None else ahead
    rng = random.Random(seed)
    t = waited = 0.0
    tokens = drafted = 0
    base_ready, base_t = 0, 0.0  # ready(t) = min(ahead, base_ready + floor((t - base_t) / c))

    def ready(at: float) -> int:
        made = int((at - base_t) / c + 1e-9) if c > 0 else ahead
        return min(ahead, base_ready + made)

    for _ in range(steps):
        if ready(t) < wait_for:  # wait for the wait_for-th token
            t_ready = base_t + (wait_for - base_ready) * c
            waited += t_ready - t
            t = t_ready
        n = min(k, ready(t))
        t += v[n]
        j = 0
        while j < n and rng.random() < alpha:
            j += 1
        tokens, drafted = tokens + j + 1, drafted + n
        r = ready(t)
        if j == n and r >= n + 1 and rng.random() < alpha:  # the hypothesis holds
            base_ready, base_t = (r - n - 1, t) if r == ahead else (base_ready - n - 1, base_t)
        else:
            base_ready, base_t = 0, t
    return dict(speedup=tokens / t, tokens_per_step=tokens / steps, drafts_per_step=drafted / steps, idle=waited / t)
