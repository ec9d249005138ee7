"""Notebook 05's section 7: a real model on every backend, against this machine's roofline. One step measures
the machine (copy bandwidth, product throughput), the model's T(n) on each backend side by side, and whether
greedy prompt lookup keeps each backend's plain-decoding answers; the table, figure and prose follow from it.
Where speculation can pay on a backend is read from its T(n) alone: the smallest per-token acceptance at which
the best draft length breaks even, for a free draft (c = 0, prompt lookup) and a draft costing a tenth of a
target pass."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from speclib.core import device
from speclib.lms.loading import load
from speclib.research import roofline

BREAK_EVEN_CS = (0.0, 0.1)  # draft cost ratios c = T_draft(1) / T_target(1) of the break-even columns


def measure(model: str, names, widths, rounds: int, repeats: int, threads: int, megabytes: int, requests, meta):
    """Step "real_backends": {"real_bounds": the per-format one-token bound, "real_passes": T(n) per backend
    (median of `rounds` round-robin rounds of `repeats` passes), "real_exact": prompt lookup against plain
    decoding per backend}."""
    with device.threads(threads):
        lms = {b: load(model, backend=b) for b in names}
        bw = roofline.bandwidth(threads, megabytes)
        tp = roofline.throughput(threads)
        bounds = roofline.bounds(roofline.model_footprint(lms[names[0]].model.config), bw, tp)
        passes = roofline.backend_passes(lms, widths, rounds, repeats)
        exact = roofline.exactness(lms, requests)
    tables = dict(real_bounds=bounds, real_passes=passes, real_exact=exact)
    return {k: v.assign(**meta) for k, v in tables.items()}


def break_even_alpha(ratio: pd.Series, ks, c: float) -> float:
    """The smallest per-token acceptance α (to 0.001) at which some draft length K in `ks` breaks even under
    the analytic model, E(α, K) = (1 - α^(K+1)) / (1 - α) >= K c + v(K), v(K) = T(K+1) / T(1) from `ratio`
    (indexed by n); NaN when none does below α = 0.999."""
    alphas = np.linspace(0.0, 0.999, 1000)
    best = np.max(
        [(1 - alphas ** (k + 1)) / (1 - alphas) / (k * c + ratio[k + 1]) for k in ks if k + 1 in ratio.index], 0
    )
    wins = np.nonzero(best >= 1)[0]
    return float(alphas[wins[0]]) if len(wins) else float("nan")


def table(res: dict, ks) -> pd.DataFrame:
    """Per backend: T(1), its format's bound and their ratio, v(2) and v(K_max), the break-even acceptances
    (`BREAK_EVEN_CS`), and the exactness run (answers changed, both loops' tokens/s)."""
    p, ex = res["real_passes"], res["real_exact"].set_index("backend")
    bound = res["real_bounds"].set_index("format").bound_s
    rows = []
    for b, g in p.groupby("backend", sort=False):
        t = g.set_index("n")["median"]
        ratio = t / t[1]
        rows.append(
            dict(
                backend=b,
                format=g.format.iloc[0],
                t1_ms=t[1] * 1e3,
                bound_ms=bound[g.format.iloc[0]] * 1e3,
                x_bound=t[1] / bound[g.format.iloc[0]],
                v2=ratio.get(2, np.nan),
                v_max=ratio[max(ratio.index)],
                **{f"alpha_c{c:g}": break_even_alpha(ratio, ks, c) for c in BREAK_EVEN_CS},
                changed=int(ex.changed[b]),
                requests=int(ex.requests[b]),
                ar_tokens_per_s=ex.ar_tokens_per_s[b],
                lookup_tokens_per_s=ex.lookup_tokens_per_s[b],
            )
        )
    return pd.DataFrame(rows)


def figure(res: dict, tab: pd.DataFrame, model: str):
    """Left: T(n) per backend, with each weight format's one-token bound dashed. Right: the break-even
    acceptance of a free draft per backend (lower is easier), a cross where prompt lookup changed answers."""
    p, bounds = res["real_passes"], res["real_bounds"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw=dict(width_ratios=[1.4, 1]))
    colors = dict(zip(tab.backend, plt.cm.tab10(np.linspace(0, 1, 10))))
    for b, g in p.groupby("backend", sort=False):
        ax.plot(g.n, g["median"] * 1e3, marker="o", ms=3, color=colors[b], label=b)
    for fmt, r in bounds[bounds.format.isin(tab.format)].set_index("format").iterrows():
        ax.axhline(r.bound_s * 1e3, ls="--", lw=0.8, color="0.5")
        ax.text(p.n.min(), r.bound_s * 1e3, f"{fmt} bound", va="bottom", fontsize=7, color="0.4")
    ax.set(xlabel="tokens scored in one pass (n)", ylabel="T(n), ms", yscale="log", title=f"{model}: one pass")
    ax.legend(fontsize=7, ncol=2)
    order = tab.sort_values([f"alpha_c{c:g}" for c in BREAK_EVEN_CS], ascending=False)
    y, h = np.arange(len(order)), 0.8 / len(BREAK_EVEN_CS)
    for j, c in enumerate(BREAK_EVEN_CS):
        a = order[f"alpha_c{c:g}"]
        bx.barh(y + j * h, a.fillna(1.0), h, color=[colors[b] for b in order.backend], alpha=1 - 0.45 * j,
                hatch="//" if j else None, label=f"draft cost c = {c:g}")  # fmt: skip
    for i, r in enumerate(order.itertuples()):
        if r.changed:
            bx.text(1.01, i + h / 2, f"changed {r.changed}/{r.requests}", va="center", fontsize=7)
    bx.set_yticks(y + h * (len(BREAK_EVEN_CS) - 1) / 2, order.backend)
    bx.set(xlabel="break-even per-token acceptance (lower: easier)", xlim=(0, 1.25), title="where speculation can pay")
    bx.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    fig.tight_layout()
    return fig


def prose(tab: pd.DataFrame) -> str:
    """The fastest one-token pass, the backends nearest their bound, where a free draft breaks even most easily,
    and which backends keep plain decoding's answers: every clause read from `tab`."""
    fastest = tab.loc[tab.t1_ms.idxmin()]
    near = tab.sort_values("x_bound").iloc[0]
    col = f"alpha_c{BREAK_EVEN_CS[0]:g}"
    easiest = tab[tab[col] == tab[col].min()]
    hard = tab.loc[tab[col].idxmax()]
    exact = tab[tab.changed == 0]
    exact_fastest = exact.loc[exact.t1_ms.idxmin()] if len(exact) else None
    text = (
        f"The fastest one-token pass here is **{fastest.backend}** ({fastest.t1_ms:.1f} ms, {fastest.x_bound:.1f}x its "
        f"{fastest.format} bound); the nearest to its bound is **{near.backend}** ({near.x_bound:.1f}x). "
    )
    names = ", ".join(f"**{b}**" for b in easiest.backend)
    if tab[col].min() == 0:
        text += (
            f"On {names} a free draft pays at any acceptance: some pass over several tokens costs no more than a "
            "one-token pass there. "
        )
    else:
        text += f"A free draft breaks even at the lowest acceptance on {names} (α = {tab[col].min():.2f}). "
    text += (
        f"It needs the highest on **{hard.backend}** (α = {hard[col]:.2f}; its T(2)/T(1) is {hard.v2:.2f}): "
        "a fast one-token pass whose wider passes cost in proportion to their tokens leaves speculation little. "
    )
    if exact_fastest is not None:
        text += (
            f"Greedy prompt lookup kept plain decoding's answers on {len(exact)} of {len(tab)} backends "
            f"({', '.join(exact.backend)}); the fastest of them is **{exact_fastest.backend}** "
            f"({exact_fastest.t1_ms:.1f} ms)."
        )
    else:
        text += "Greedy prompt lookup changed some answer on every backend."
    return text
