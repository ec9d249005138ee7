"""Section 7 of notebook 05: the break-even acceptance exactly, and the table read from the step's tables."""

import numpy as np
import pandas as pd

from speclib.research.studies import real_backends


def test_break_even_alpha_solves_the_analytic_model():
    flat = pd.Series([1.0, 1.0, 1.0, 1.0], index=[1, 2, 3, 4])
    assert real_backends.break_even_alpha(flat, [1, 2, 3], 0.0) == 0.0  # a free draft on a flat pass: any α
    # v(1) = 1.5 with c = 0: 1 + α >= 1.5 first at α = 0.5 (K = 1); the other K need more
    steep = pd.Series([1.0, 1.5, 2.5, 3.6], index=[1, 2, 3, 4])
    assert abs(real_backends.break_even_alpha(steep, [1, 2, 3], 0.0) - 0.5) <= 0.002
    # with c = 0.1 at K = 1: 1 + α >= 1.6
    assert abs(real_backends.break_even_alpha(steep, [1], 0.1) - 0.6) <= 0.002
    serial = pd.Series([1.0, 2.0, 3.0], index=[1, 2, 3])
    assert np.isnan(real_backends.break_even_alpha(serial, [1, 2], 0.1))  # n tokens cost n passes: never


def test_table_reads_bounds_passes_and_exactness():
    passes = pd.DataFrame(
        dict(backend=["a"] * 3 + ["b"] * 3, n=[1, 2, 3] * 2, format=["float32"] * 3 + ["int8"] * 3,
             median=[0.040, 0.044, 0.048, 0.010, 0.020, 0.030])
    )  # fmt: skip
    bounds = pd.DataFrame(dict(format=["float32", "int8"], bound_s=[0.020, 0.005]))
    exact = pd.DataFrame(dict(backend=["a", "b"], requests=6, changed=[0, 3], ar_tokens_per_s=[20.0, 90.0],
                              lookup_tokens_per_s=[25.0, 60.0]))  # fmt: skip
    tab = real_backends.table(dict(real_bounds=bounds, real_passes=passes, real_exact=exact), [1, 2])
    a, b = tab.set_index("backend").loc["a"], tab.set_index("backend").loc["b"]
    assert a.x_bound == 2.0 and b.x_bound == 2.0 and np.isclose(a.v2, 1.1) and b.v2 == 2.0
    assert abs(a.alpha_c0 - 0.1) <= 0.002 and np.isnan(b.alpha_c0)  # b: T(n) = n T(1)
    text = real_backends.prose(tab)
    assert "**b** (10.0 ms" in text and "on 1 of 2 backends (a)" in text and "lowest acceptance on **a**" in text
