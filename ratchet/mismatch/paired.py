"""Paired comparisons of accuracies on the same problems, and Holm's correction over many.

Two runs scored on the same test problems differ per problem by -1, 0 or +1; the mean of those
differences is the accuracy difference, and its standard error (sd / sqrt(n)) is far smaller
than two independent binomial errors would say, since the problems' own difficulty cancels.
"""

from __future__ import annotations

import math

import numpy as np

Z95 = 1.959963984540054  # the two-sided 95% normal quantile


def paired_difference(a, b) -> dict:
    """b - a on the same problems (arrays of per-problem correctness, 0/1 or bool, in one
    order): the mean difference, its paired standard error, z, the 95% interval and the
    two-sided normal p-value. A difference with no spread (every problem moved the same way)
    has an infinite z when it is not 0; fewer than 2 problems give no standard error (NaN)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired_difference: needs two 1-d arrays of one length, got {a.shape} and {b.shape}")
    d = b - a
    n = len(d)
    diff = float(d.mean()) if n else math.nan
    stderr = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    if not np.isfinite(stderr):
        z = math.nan
    elif stderr > 0:
        z = diff / stderr
    else:
        z = 0.0 if diff == 0 else math.copysign(math.inf, diff)
    p = math.erfc(abs(z) / math.sqrt(2))  # NaN stays NaN, an infinite z gives 0
    return {"diff": diff, "stderr": stderr, "n": n, "z": z, "ci_low": diff - Z95 * stderr,
            "ci_high": diff + Z95 * stderr, "p": p,
            "better": int((d > 0).sum()), "worse": int((d < 0).sum())}


def holm(pvalues, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Holm's step-down correction over a family of tests: (adjusted p-values, rejected).
    The k-th smallest of m p-values is rejected at level alpha / (m - k + 1), stopping at the
    first that is not; the adjusted p is max over j <= k of min(1, (m - j + 1) p_(j)), so a test
    is rejected exactly when its adjusted p <= alpha. It holds the chance of any false
    rejection in the family under alpha, whatever the tests' dependence. NaN p-values are never
    rejected and do not count in m."""
    p = np.asarray(pvalues, dtype=float)
    adjusted = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = len(ok)
    running = 0.0
    for rank, i in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    rejected = np.isfinite(adjusted) & (adjusted <= alpha)
    return adjusted, rejected
