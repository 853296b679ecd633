"""The quantile strategy's count noise sigma_b when a spec leaves it out (torch-free).

Quantile clipping (Andrew et al. 2021) releases a noised count of unclipped examples each step
with noise std sigma_b. It shares the step's privacy budget with the gradient: the count's noise
multiplier is 2 sigma_b (sensitivity 1/2), so the gradient's becomes
``sigma_g = (sigma^-2 - (2 sigma_b)^-2)^(-1/2)``, which exists only when sigma < 2 sigma_b.

Andrew et al. recommend sigma_b = b/20 (the fraction b~ then has noise std 1/20). At small
epsilon sigma is large and b/20 may be below sigma/2: the count would need the whole budget.
The rule used when ``count_noise`` is left out:

    sigma_b = max(b / 20, the smallest sigma_b with sigma_g <= 1.1 sigma)

that is, b/20 wherever it costs the gradient at most 10 % more noise, and otherwise the most
accurate count that keeps the gradient's noise within 10 % of the planned sigma. The smallest
such value is ``sigma / (2 sqrt(1 - 1.1^-2))``, about 1.2 sigma. The plan shows the value
chosen, and the run uses exactly that value (plan equals run).
"""

from __future__ import annotations

import math

#: Andrew et al.'s recommendation, as a fraction of the expected batch size b.
COUNT_NOISE_FRACTION = 1.0 / 20.0
#: How much more noise the gradient may get (as a factor on sigma) to pay for the count.
MAX_GRADIENT_NOISE_FACTOR = 1.1


def auto_count_noise(*, noise_multiplier: float, expected_batch_size: float) -> float:
    """sigma_b for a quantile trial whose spec leaves ``count_noise`` out (see module doc)."""
    floor = noise_multiplier / (2.0 * math.sqrt(1.0 - MAX_GRADIENT_NOISE_FACTOR**-2))
    return max(expected_batch_size * COUNT_NOISE_FRACTION, floor)
