"""An epsilon *estimate* under a model of the scores, shown beside the bound, never as it.

The one-run bound (:mod:`workers.canary_audit.bounds`) holds for any mechanism, and pays for
it: with m canaries it cannot see events rarer than about 1/m, while a Gaussian mechanism's
epsilon at a small delta lives in such events. Under a model the scores say more.
White-box DP-SGD's canary-aligned signals are asymptotically Gaussian (Agrawal et al. 2026,
"Let's ask Gauss"): the scores of included and excluded canaries are then two normal laws a
separation ``mu`` apart in units of their spread, and the run is at best mu-Gaussian-DP (Dong,
Roth & Su 2019). :func:`gaussian_estimate` reports the epsilon at delta of the lower
``confidence`` limit of ``mu``: *if the model holds*, it is a lower bound at that confidence.

Nothing checks the model but the scores themselves, so the estimate is given only when a
normality test passes on each group: Shapiro-Wilk (on at most :data:`MAX_TESTED` scores of
the group, drawn at random) at level :data:`NORMALITY_LEVEL`. The excluded canaries' scores
are the null law, which the canaries' inclusion does not move; the included ones must be
normal too for the model to mean anything. A randomized response (two values), a Laplace
mechanism (heavy tails) or a skewed loss fails the test at m in the hundreds; the estimate is
then withheld (None), whatever the setting. A passed test is no proof of the model: the
estimate stays an estimate, and the audit's verdict rests on the bound alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

#: The normality test's level: a group whose p-value is below it refuses the model.
NORMALITY_LEVEL = 0.001

#: Shapiro-Wilk's p-value is accurate up to 5000 observations: larger groups are subsampled.
MAX_TESTED = 5000

#: Fewer scores than this in a group: no test has power, and no estimate is given.
MIN_TESTED = 20

#: The model behind the estimate, in the words the CLI, the API and the dashboard show.
ASSUMPTION = (
    "Gaussian scores: included and excluded canaries' scores are two normal laws of equal "
    "spread (the run is then Gaussian-DP); checked by a Shapiro-Wilk test on each group"
)


@dataclass(frozen=True)
class GaussianEstimate:
    """The estimate (None where the normality test refused the model) and its check."""

    epsilon_estimate: float | None
    confidence: float
    mu_estimate: float
    mu_lower_bound: float
    normality_p_in: float
    normality_p_out: float

    @property
    def model_holds(self) -> bool:
        """Whether both groups passed the normality test."""
        return min(self.normality_p_in, self.normality_p_out) >= NORMALITY_LEVEL


def gdp_epsilon(mu: float, *, delta: float) -> float:
    """The epsilon at ``delta`` of mu-Gaussian DP (Dong, Roth & Su 2019), 0 for ``mu <= 0``.

    ``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``, decreasing in eps.
    """
    if not mu > 0:
        return 0.0

    def excess(eps: float) -> float:
        a = stats.norm.cdf(-eps / mu + mu / 2)
        b = math.exp(eps + stats.norm.logcdf(-eps / mu - mu / 2))
        return float(a - b - delta)

    if excess(0.0) <= 0:
        return 0.0
    hi = 1.0
    while excess(hi) > 0:
        hi *= 2.0
        if hi > 1e4:
            return math.inf
    lo = 0.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if excess(mid) > 0:
            lo = mid
        else:
            hi = mid
    return lo


def normality_p_value(x: np.ndarray, *, rng: np.random.Generator | None = None) -> float:
    """Shapiro-Wilk's p-value for ``x`` (0 for too few or constant scores: no model)."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.shape[0] < MIN_TESTED or not float(np.ptp(x)) > 0:
        return 0.0
    if x.shape[0] > MAX_TESTED:
        rng = rng if rng is not None else np.random.default_rng()
        x = rng.choice(x, size=MAX_TESTED, replace=False)
    return float(stats.shapiro(x).pvalue)


def gaussian_estimate(
    scores: np.ndarray, included: np.ndarray, *, delta: float, confidence: float = 0.95
) -> GaussianEstimate:
    """The Gaussian model's epsilon at ``delta`` (see the module docstring), or None.

    ``mu`` is the standardised difference of the two groups' means (pooled spread); its lower
    ``confidence`` limit (the normal approximation of its standard error) gives the epsilon.
    """
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    s_in, s_out = scores[included], scores[~included]
    p_in, p_out = normality_p_value(s_in), normality_p_value(s_out)
    n_in, n_out = len(s_in), len(s_out)
    if n_in < 2 or n_out < 2:
        return GaussianEstimate(None, confidence, 0.0, 0.0, p_in, p_out)
    pooled = math.sqrt((s_in.var(ddof=1) + s_out.var(ddof=1)) / 2.0)
    if not pooled > 0:
        return GaussianEstimate(None, confidence, 0.0, 0.0, p_in, p_out)
    d = float((s_in.mean() - s_out.mean()) / pooled)
    se = math.sqrt((n_in + n_out) / (n_in * n_out) + d * d / (2.0 * (n_in + n_out)))
    mu_lb = d - float(stats.norm.ppf(confidence)) * se
    found = GaussianEstimate(None, confidence, d, mu_lb, p_in, p_out)
    if not found.model_holds:
        return found
    return GaussianEstimate(gdp_epsilon(mu_lb, delta=delta), confidence, d, mu_lb, p_in, p_out)
