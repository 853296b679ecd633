"""The accountant contract, run over every registered accountant (built-in or plug-in).

Each accountant's epsilon is finite and positive, grows with the steps and with noisy
evaluation releases, falls as the noise grows, and matches the independent verifier
(:mod:`workers.accounting.audit`) within its error: a ``tight`` accountant lies within the PRV
accountant's bounds (plus the PLD's stated over-statement), a looser one within the independent
RDP's agreement bounds. A plug-in is tested by registering it: the parameters are the
registry's names.
"""

from __future__ import annotations

import itertools
import math

import pytest

from dpsweep.errors import ConfigError
from workers.accounting import accountant_names, compute_epsilon, get_accountant
from workers.accounting.audit import (
    RDP_AGREEMENT,
    RDP_ORDERS,
    EpsilonBounds,
    pld_overstatement,
    prv_epsilon,
    prv_error,
    rdp_to_epsilon,
    subsampled_gaussian_rdp,
)

NAMES = accountant_names()
SIGMA, Q, T, DELTA = 1.0, 0.01, 500, 1e-5


def _eps(name: str, *, sigma: float = SIGMA, steps: int = T, **kw: object) -> float:
    return compute_epsilon(
        noise_multiplier=sigma,
        sample_rate=Q,
        steps=steps,
        target_delta=DELTA,
        accountant=name,
        **kw,  # type: ignore[arg-type]
    )


def second_accountant(tight: bool, epsilon: float) -> EpsilonBounds:
    """The independent verifier's bounds at (SIGMA, Q, T, DELTA), with their stated error.

    Tight accountants answer to the PRV accountant (its bounds, plus the slack a pessimistic
    PLD may over-state by); looser ones to the independent RDP curve (its agreement band).
    """
    if tight:
        prv = prv_epsilon(
            noise_multiplier=SIGMA,
            sample_rate=Q,
            steps=T,
            target_delta=DELTA,
            eps_error=prv_error(epsilon),
        )
        slack = pld_overstatement(epsilon=prv.upper, steps=T)
        return EpsilonBounds(prv.lower, prv.estimate, prv.upper + slack, prv.accountant)
    curve = subsampled_gaussian_rdp(noise_multiplier=SIGMA, sample_rate=Q, steps=T)
    rdp = rdp_to_epsilon(RDP_ORDERS, curve, target_delta=DELTA)
    return EpsilonBounds(rdp * (1 - RDP_AGREEMENT), rdp, rdp * (1 + RDP_AGREEMENT), "RDP")


def check_accountant_contract(name: str) -> None:
    """What every accountant promises, checked through :func:`compute_epsilon`."""
    d = get_accountant(name)
    assert d.name == name and d.description and d.library
    base = _eps(name)
    assert math.isfinite(base) and base > 0
    assert _eps(name, steps=0) == 0.0
    by_steps = [_eps(name, steps=t) for t in (T // 2, T, 2 * T)]
    assert by_steps[0] < by_steps[1] < by_steps[2], f"{name}: epsilon must grow with the steps"
    by_noise = [_eps(name, sigma=s) for s in (0.8, SIGMA, 1.5, 3.0)]
    assert all(a > b for a, b in itertools.pairwise(by_noise)), (
        f"{name}: epsilon must fall as the noise grows: {by_noise}"
    )
    assert _eps(name, eval_noise_multiplier=20.0, eval_releases=10) > base
    second = second_accountant(d.tight, base)
    assert second.lower <= base <= second.upper, (
        f"{name} ({'tight' if d.tight else 'upper bound'}) gives {base:.4f}; the second "
        f"accountant ({second.accountant}) says {second.lower:.4f} to {second.upper:.4f}"
    )
    # The descriptor's own epsilon is what compute_epsilon reports.
    direct = d.epsilon(noise_multiplier=SIGMA, sample_rate=Q, steps=T, target_delta=DELTA)
    assert direct == pytest.approx(base, rel=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_accountant_contract(name: str) -> None:
    check_accountant_contract(name)


def test_the_registry_has_a_tight_and_a_bounding_accountant() -> None:
    kinds = {get_accountant(n).tight for n in NAMES}
    assert kinds == {True, False}


def test_an_unknown_accountant_is_refused_by_field() -> None:
    with pytest.raises(ConfigError, match="unknown accountant 'gdp'") as exc:
        get_accountant("gdp")
    assert exc.value.field == "privacy.accountant"
