"""One epsilon per release: what each figure covers, stated with every result.

Three releases are reported, each with the epsilon that covers it and a sentence saying so:

* **grid**: releasing every trial of one grid (an arm at one epsilon level), or, for a
  papernot-steinke random search, its selected trial; this is the grid's planned total.
* **sweep**: releasing everything the sweep releases from its dataset, all grids composed
  tightly (not summed) at the sum of their deltas (:func:`workers.accounting.audit.sweep_epsilon`).
* **dataset lifetime**: everything released from these records so far, by every sweep and
  ``dpsweep train`` run; the ledger adds the charges up (basic composition, an upper bound).

A single run's epsilon (what one trial alone would cost) appears only as ``single_run_epsilon``.
The **evaluation** statement says what the epsilon does not cover: the evaluation records, and
how their metrics are released.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from sqlalchemy import Engine, select, update

from dpsweep.errors import DpsweepError
from dpsweep.plan import EXAMPLE_UNIT, GridPlan, SweepPlan
from dpsweep.plan_fields import unit_suffix
from sweeper.store import Sweep
from sweeper.store.engine import read_only, writable

log = logging.getLogger(__name__)

GRID_COVERS = "releasing every trial of this grid (an arm at one epsilon level)"
SEARCH_COVERS = "releasing the selected trial of this random search (papernot-steinke)"
SWEEP_COVERS = (
    "everything this sweep releases from the dataset's training records: all its grids, "
    "composed tightly"
)
LIFETIME_COVERS = (
    "everything released from these training records so far, by every sweep and training run "
    "charged to them (the ledger's sum: an upper bound)"
)


def unit_covers(covers: str, privacy_unit: str | None) -> str:
    """``covers`` with what one unit of the epsilon protects, where it is not a row: every
    epsilon of a plan with a privacy unit is per unit, all of that unit's rows together."""
    if privacy_unit is None or privacy_unit == EXAMPLE_UNIT:
        return covers
    return f"{covers};{unit_suffix(privacy_unit)}: all of a {privacy_unit}'s rows together"


def grid_releases(plan: Sequence[GridPlan]) -> list[dict[str, Any]]:
    """Each grid's epsilon: what releasing its trials cost, as planned and verified (per the
    plan's privacy unit)."""
    out = []
    for g in plan:
        selected = g.release == "selected-only"
        out.append(
            {
                "grid": g.grid,
                "arm": g.arm,
                "epsilon_budget": g.epsilon_budget,
                "epsilon": g.epsilon_total,
                "delta": g.delta,
                "accountant": g.accountant,
                "epsilon_verified": g.epsilon_verified,
                "verified_by": g.verified_by,
                "privacy_unit": g.privacy_unit,
                "covers": unit_covers(SEARCH_COVERS if selected else GRID_COVERS, g.privacy_unit),
            }
        )
    return out


# The plan fields the sweep's composition reads (:func:`_sweep_release`): its whole input.
_COMPOSED = (
    "arm",
    "accounting",
    "trials",
    "steps_per_trial",
    "sample_rate",
    "noise_multiplier",
    "delta",
    "epsilon_total",
    "distribution_shape",
    "mean_trials",
    "eval_noise_multiplier",
    "eval_releases",
)
# Bump when the computation of :func:`_sweep_release` or of
# :func:`workers.accounting.audit.sweep.sweep_epsilon` changes what it returns: every stored
# release's key then stops matching, and readers compute again.
COMPOSITION_VERSION = 1


def _composition_input(plan: Sequence[GridPlan]) -> str:
    """The canonical JSON of what the sweep's composition reads from ``plan`` (in the stored
    form, so a stored release's key is computed from what the database holds)."""
    stored = [g.to_stored() for g in plan]
    return json.dumps([{k: d.get(k) for k in _COMPOSED} for d in stored], sort_keys=True)


def sweep_release(plan: Sequence[GridPlan]) -> dict[str, Any] | None:
    """The sweep's epsilon over all its grids, computed (None for a sweep without a plan).

    Seconds on a first call per process (tight composition, and importing dp_accounting);
    a stored sweep's is read with :func:`sweep_release_of` instead."""
    if not plan:
        return None
    return _with_unit(dict(_sweep_release(_composition_input(plan))), plan)


def _with_unit(release: dict[str, Any], plan: Sequence[GridPlan]) -> dict[str, Any]:
    """A sweep's release saying what one unit of its epsilon protects (not part of the
    composition, nor of a stored release's key: the plan's unit is read at each call)."""
    unit = plan[0].privacy_unit if plan else EXAMPLE_UNIT
    if unit == EXAMPLE_UNIT:
        return release
    return release | {"privacy_unit": unit, "covers": unit_covers(SWEEP_COVERS, unit)}


def release_key(plan: Sequence[GridPlan] | None) -> str | None:
    """The sha256 of exactly what :func:`sweep_release` computes ``plan``'s release from: the
    plan's composition input, :data:`COMPOSITION_VERSION` and dp_accounting's version (None
    without a plan). A stored release is ``plan``'s if and only if its key is this one."""
    if not plan:
        return None
    return _key_of(_composition_input(plan))


@functools.lru_cache(maxsize=256)
def _key_of(composition_input: str) -> str:
    text = json.dumps(
        {
            "version": COMPOSITION_VERSION,
            "dp_accounting": _accountant_version(),
            "grids": json.loads(composition_input),
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()


@functools.cache
def _accountant_version() -> str:
    # From the installed distribution's metadata: no import of dp_accounting (a second).
    try:
        return version("dp-accounting")
    except PackageNotFoundError:  # pragma: no cover - a dependency of the project
        return "unknown"


def stored_release(sweep: Any) -> dict[str, Any] | None:
    """``sweep``'s stored release when it was computed from its current plan, else None.

    ``sweep``: a :class:`sweeper.store.Sweep` (its ``plan``, ``release`` and
    ``release_key``)."""
    stored, key = sweep.release, sweep.release_key
    current = release_key(SweepPlan.from_stored(sweep.plan).grids)
    if stored is None or key is None or key != current:
        return None
    return dict(stored)


def sweep_release_of(sweep: Any) -> dict[str, Any] | None:
    """A stored sweep's release: the stored one when its key matches the sweep's current
    plan (:func:`stored_release`), otherwise computed from the plan (:func:`sweep_release`).

    What summaries and model cards show for a sweep; it never writes (the API's read path
    calls it). The driver stores the release when a sweep starts (:func:`store_release`)."""
    found = stored_release(sweep)
    plan = SweepPlan.from_stored(sweep.plan).grids
    return _with_unit(found, plan) if found is not None else sweep_release(plan)


def store_release(engine: Engine, sweep_id: str) -> dict[str, Any] | None:
    """Compute a sweep's release from its current plan and store it with the plan's key.

    The computation (seconds) runs outside any transaction; the write is one short UPDATE of
    two columns (``updated_at`` kept: the sweep itself did not change). A plan changed in
    between cannot leave a wrong release: the key stored is the one of the plan the value
    was computed from, and readers compare it with the plan they read. Nothing stored is
    derived from records: the plan holds public, planned quantities only.

    Returns:
        The release (None: no such sweep, or no plan).
    """
    with read_only(engine).connect() as conn:
        row = conn.execute(
            select(Sweep.plan, Sweep.release, Sweep.release_key).where(Sweep.id == sweep_id)
        ).first()
    if row is None or not row.plan:
        return None
    plan = SweepPlan.from_stored(row.plan).grids
    key = release_key(plan)
    if row.release is not None and key == row.release_key:
        return dict(row.release)  # stored already (a resumed sweep)
    release = sweep_release(plan)
    if not _json_safe(release):
        return release
    with writable(engine).begin() as conn:
        conn.execute(
            update(Sweep)
            .where(Sweep.id == sweep_id)
            .values(release=release, release_key=key, updated_at=Sweep.updated_at)
        )
    return release


_STORE_ATTEMPTS = 3
_RETRY_SECONDS = 0.5


def store_release_in_background(engine: Engine, sweep_id: str) -> threading.Thread:
    """:func:`store_release` in a daemon thread (a driver starting a sweep does not wait for
    the composition); a failure is logged, and readers then compute the release themselves."""

    def work() -> None:
        for attempt in range(_STORE_ATTEMPTS):
            try:
                store_release(engine, sweep_id)
                return
            except Exception:
                if attempt == _STORE_ATTEMPTS - 1:  # readers fall back to computing it
                    log.exception("storing the release of sweep %s failed", sweep_id)
                    return
                # Seen in a driver: the accountant's scipy looked torch up while the main thread
                # was still importing it ("partially initialized module"); a moment later the
                # import is complete and the same call succeeds.
                log.warning("storing the release of sweep %s failed; retrying", sweep_id)
                time.sleep(_RETRY_SECONDS * 2**attempt)

    thread = threading.Thread(target=work, name=f"dpsweep-release-{sweep_id}", daemon=True)
    thread.start()
    return thread


def _json_safe(value: Any) -> bool:
    # PostgreSQL's JSON refuses NaN and Infinity; such a release is computed on each read.
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=256)
def _sweep_release(grids_json: str) -> tuple[tuple[str, Any], ...]:
    # Summaries are read often (dashboard polling); the composition depends only on the plan.
    # deferred: the composition pulls numpy and scipy; a stored release is read without them
    from workers.accounting.audit.sweep import sweep_epsilon

    grids = json.loads(grids_json)
    summed = sum(float(g["epsilon_total"]) for g in grids)
    delta = sum(float(g["delta"]) for g in grids)
    try:
        result = sweep_epsilon(grids)
    except DpsweepError as exc:
        # A plan stored before the tight composition existed (say, without its random
        # search's shape): the sum of the grids' epsilons is still a valid guarantee.
        out: dict[str, Any] = {
            "epsilon": summed,
            "delta": delta,
            "method": f"sum of grid epsilons (no tight composition: {exc})",
            "epsilon_summed": summed,
            "verifier": None,
        }
    else:
        b = result.verifier_bounds
        out = {
            "epsilon": result.epsilon,
            "delta": result.delta,
            "method": result.method,
            "epsilon_summed": result.summed,
            "verifier": result.verifier,
            "epsilon_verified": b.estimate,
            "epsilon_verified_lower": b.lower,
            "epsilon_verified_upper": b.upper,
        }
    out["covers"] = SWEEP_COVERS
    return tuple(out.items())


def lifetime_release(summary: Any) -> dict[str, Any]:
    """The dataset's lifetime spend, from the ledger's summary of its identity."""
    return {
        "epsilon_spent": float(summary.epsilon_spent),
        "delta_spent": float(summary.delta_spent),
        "epsilon_reserved": float(summary.epsilon_reserved),
        "epsilon_cap": None if summary.epsilon_cap is None else float(summary.epsilon_cap),
        "covers": LIFETIME_COVERS,
    }


ANALYST_COVERS = (
    "what this analyst's sweeps have spent on these records (charged) and still hold "
    "(reserved), under the data owner's grant (its allowance as the cap); the records' "
    "lifetime total over every analyst is the data owner's to see"
)


def analyst_lifetime_release(*, spent: Any, reserved: Any, allowance: Any | None) -> dict[str, Any]:
    """An analyst's share of a dataset's lifetime spend (shown on their sweeps instead of the
    records' total, which would tell them what other analysts spent)."""
    return {
        "epsilon_spent": float(spent),
        "delta_spent": None,
        "epsilon_reserved": float(reserved),
        "epsilon_cap": None if allowance is None else float(allowance),
        "covers": ANALYST_COVERS,
        "scope": "analyst",
    }


def evaluation_statement(plan: Sequence[GridPlan]) -> dict[str, Any]:
    """What epsilon covers and how the evaluation records are released, for the spec's mode.

    * ``carve-out`` (the default): a share of the private dataset held out and declared
      unprotected: metrics computed on it (and the choice of the best checkpoint) are
      released without DP; epsilon covers the training records only.
    * ``public``: a separately registered dataset its owner declared public; every private
      record is trained on and covered by epsilon.
    * ``dp``: a carve-out whose accuracy (and the checkpoint choice) come from noisy counts
      charged in the plan; epsilon covers every record, training and evaluation.

    Plans stored before the mode existed are carve-outs.
    """
    g = plan[0] if plan else None
    mode = (g.eval_mode if g is not None else None) or "carve-out"
    n_train, n_eval = (g.n_train, g.n_eval) if g is not None else (None, None)
    # With a privacy unit the sizes count units (people), never rows.
    unit = g.privacy_unit if g is not None else EXAMPLE_UNIT
    what = "records" if unit == EXAMPLE_UNIT else f"units ({unit})"
    train = f"the {n_train} training {what}" if n_train else f"the training {what}"
    held = f"the {n_eval} evaluation {what}" if n_eval else f"the evaluation {what}"
    out: dict[str, Any] = {"mode": mode, "n_train": n_train, "n_eval": n_eval}
    if unit != EXAMPLE_UNIT:
        out["privacy_unit"] = unit
    if mode == "public":
        name = g.eval_dataset if g is not None else None
        # A public evaluation dataset is another dataset's rows: it has no privacy unit.
        held = f"the {n_eval} evaluation records" if n_eval else "the evaluation records"
        out.update(
            protected=True,
            dataset=name,
            statement=(
                f"ε covers {train} (the whole private dataset: nothing is held out); "
                f"{held} come from {name!r}, a separate dataset its owner declared public, "
                "so the metrics computed on them reveal nothing about the private records "
                "beyond what the trained models do"
            ),
        )
    elif mode == "dp":
        releases = g.eval_releases if g is not None else None
        sigmas = sorted({float(x.eval_noise_multiplier) for x in plan if x.eval_noise_multiplier})
        noise = ""
        if releases and sigmas:
            lo, hi = sigmas[0], sigmas[-1]
            sig = f"sigma_e {lo:.4g}" if lo == hi else f"sigma_e {lo:.4g} to {hi:.4g} by grid"
            std = ""
            if n_eval:
                a, b = lo / n_eval, hi / n_eval
                std = f": each accuracy ± {a:.3g}" + ("" if lo == hi else f" to ± {b:.3g}")
                std += " (one std)"
            noise = f" ({releases} noisy counts per trial, {sig}{std})"
        n_all = (n_train or 0) + (n_eval or 0)
        covers = f"all {n_all} {what}" if n_train and n_eval else f"all the {what}"
        out.update(
            protected=True,
            statement=(
                f"ε covers {covers}: {train} and {held} (a carve-out of the same dataset, "
                "never trained on, chosen by each record's own content); the accuracy and "
                f"the choice of the best checkpoint come from noisy counts{noise}, charged "
                "in each grid's ε, so the best of several trials is biased upwards; no loss, "
                "calibration or clipping diagnostics are released"
            ),
        )
    else:
        out.update(
            protected=False,
            statement=(
                f"ε covers {train}; {held} (a carve-out of the same dataset, never trained on) "
                "are released through metrics and the choice of the best checkpoint without DP"
            ),
        )
    return out
