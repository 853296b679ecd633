"""The plug-in accountant contract: an accountant from an installed distribution (entry point
group ``dpsweep.accountants``) plans a sweep end to end with its own ``calibrate``."""

from __future__ import annotations

import importlib
import math
import sys
import uuid
from pathlib import Path

import yaml

from dpsweep.spec import SweepSpec
from tests.workers.test_plugins import Install, _activate, install  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = '''
"""A test accountant: dp_accounting's RDP, calibrated by its own rule (5 % more noise than
the shared calibrator finds), recording every multiplier it returned."""

from workers.accounting.epsilon import dp_rdp_epsilon
from workers.accounting.registry import AccountantDescriptor, register_accountant

RETURNED = []
SHARED = AccountantDescriptor(
    name="shared", description="", library="", tight=False, epsilon=dp_rdp_epsilon
)


def calibrate(*, target_epsilon, target_delta, sample_rate, steps, max_noise_multiplier,
              eval_noise_multiplier=None, eval_releases=0):
    sigma = 1.05 * SHARED.calibrate(
        target_epsilon=target_epsilon,
        target_delta=target_delta,
        sample_rate=sample_rate,
        steps=steps,
        max_noise_multiplier=max_noise_multiplier,
        eval_noise_multiplier=eval_noise_multiplier,
        eval_releases=eval_releases,
    )
    RETURNED.append(sigma)
    return sigma


def register():
    register_accountant(
        AccountantDescriptor(
            name="{name}",
            description="dp_accounting RDP with its own calibration (a test plug-in)",
            library="test plug-in",
            tight=False,
            epsilon=dp_rdp_epsilon,
            calibrator=calibrate,
        )
    )
'''


def test_a_plugin_accountant_plans_a_sweep_with_its_own_calibrate(install: Install) -> None:  # noqa: F811
    from sweeper.privacy.charges import charge_schedule
    from sweeper.sweeps.planning import plan_sweep
    from workers.accounting.registry import (
        accountant_names,
        cached_epsilon,
        trial_accountant_for_plan,
    )

    module = f"dpsweep_test_accountant_{uuid.uuid4().hex[:8]}"
    name = module.replace("_", "-")
    install(
        module,
        f"""
        [dpsweep.accountants]
        mine = {module}:register
        """,
        {"__init__.py": PLUGIN.replace("{name}", name)},
    )
    _activate()
    raw = yaml.safe_load((ROOT / "examples" / "digits-clipping.yaml").read_text())
    raw["privacy"] = {**raw["privacy"], "budgets": [3], "accountant": name}
    raw["arms"] = raw["arms"][:1]
    spec = SweepSpec(**raw)
    assert spec.privacy.accountant == name

    plan = plan_sweep(spec)  # loads the plug-in on the name's first lookup

    assert name in accountant_names()
    plugin = importlib.import_module(module)
    (grid,) = plan.grids
    assert grid.accountant == name
    # The grid's sigma is what the plug-in's calibrate returned, not the shared calibrator's.
    assert plugin.RETURNED and grid.noise_multiplier == plugin.RETURNED[-1]
    total = grid.trials * grid.steps_per_trial
    assert grid.epsilon_total == cached_epsilon(
        name,
        noise_multiplier=grid.noise_multiplier,
        sample_rate=grid.sample_rate,
        steps=total,
        target_delta=grid.delta,
    )
    assert grid.epsilon_total <= grid.epsilon_budget
    assert math.isfinite(grid.epsilon_verified) and grid.epsilon_verified <= grid.epsilon_budget
    # Its charges come from its own epsilon, prefix by prefix, and fit the budget.
    schedule = charge_schedule(grid)
    assert schedule.runs == grid.trials
    assert float(schedule.epsilon[-1]) <= grid.epsilon_budget * (1 + 1e-9)
    # Its trials account their single-run epsilon with it.
    assert trial_accountant_for_plan(grid.accountant) == name
    assert module in sys.modules
