"""Admission: the one check of who submits what, before anything is planned or reserved.

A dry run (``POST /api/v1/sweeps:plan``, ``dpsweep plan``) and a submission (``POST
/api/v1/sweeps``, ``dpsweep run``, :func:`sweeper.sweeps.create.create_sweep`) both pass
through :func:`admit`, so they refuse the same specs with the same answer:

* the dataset is one the submitter may use (their own, a grant's, a built-in; paths are for
  admins and local use);
* an **analyst** (a tenant with a grant on someone else's dataset) is held to the grant: the
  evaluation modes the owner allows, no reproducible mode (its noise comes from seeds every
  trial shows, so its releases are not private against the analyst who reads them), and the
  owner's view of the data (:mod:`sweeper.datasets.fixed_view`);
* the spec that goes on is the **effective** one, with the owner's view filled in: it is what
  is planned, stored and run.

Errors met while an analyst's plan loads the owner's records are answered without their text
(:func:`public_data_error`): a loader's message may name the server's files, a record's row
or a value, which are the owner's, not the analyst's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import Engine

from dpsweep.errors import ConfigError, DatasetError, PermissionDenied
from dpsweep.spec import SweepSpec
from sweeper.datasets.access import Viewer, check_access
from sweeper.datasets.fixed_view import apply_view, require_declared, stored_row
from sweeper.datasets.grants import AnalystTerms, analyst_terms, check_eval_mode
from sweeper.datasets.names import in_catalog

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Admission:
    """An admitted spec: the effective spec, and the grant's terms for an analyst's sweep."""

    spec: SweepSpec
    terms: AnalystTerms | None

    @property
    def analyst(self) -> bool:
        return self.terms is not None


def admit(engine: Engine, spec: SweepSpec, viewer: Viewer) -> Admission:
    """Check who submits the spec against its dataset, before any planning or reservation.

    Args:
        engine: The store's engine.
        spec: The typed spec as submitted.
        viewer: Who submits (``Viewer(None)``: local use, the owner of everything).

    Returns:
        The admission: the effective spec (the owner's view of a stored dataset filled in) and,
        for an analyst, their grant's terms.

    Raises:
        ConfigError: a dataset the viewer may not use, an evaluation mode its owner does not
            allow analysts, or a setting of the owner's view changed by an analyst (each
            naming its field).
        PermissionDenied: an analyst asks for reproducible mode.
        IllegalState: an analyst's dataset whose owner has not declared its size, classes
            and feature shape.
    """
    check_access(engine, spec.dataset, viewer)
    name = spec.dataset.name
    terms = None if viewer.admin else analyst_terms(engine, name, viewer.owner)
    if terms is not None:
        check_eval_mode(terms, spec.eval.mode)
        if spec.privacy.reproducible:
            raise PermissionDenied(
                f"privacy.reproducible is for the owner of dataset {name!r} only: it draws "
                "batches and noise from the public seeds shown with every trial, so its results "
                "are not private against whoever reads them. Leave privacy.reproducible out"
            )
    row = stored_row(engine, name) if in_catalog(name) else None
    if row is not None and terms is not None:
        # A grant made before declarations were required admits nothing until the owner
        # declares what sizes the analyst's plan (409, before anything is planned or reserved).
        require_declared(row)
    if row is not None:
        spec = apply_view(spec, row, analyst=terms is not None)
    return Admission(spec, terms)


def public_data_error(exc: BaseException, admission: Admission) -> BaseException:
    """What an analyst is told of an error met while their plan read the owner's records.

    An analyst's inputs never reach the loader (the owner's view applies), so a loading
    error is about the owner's file and settings: its text (paths, file names, rows, values,
    sizes) is the owner's. The analyst gets a fixed message naming the dataset; the operator's
    log keeps the text. Other errors (about the analyst's own spec) and everyone else's pass
    unchanged.
    """
    if not admission.analyst:
        return exc
    loading = isinstance(exc, DatasetError) or (
        isinstance(exc, ConfigError) and (exc.field or "").startswith("dataset")
    )
    if not loading:
        return exc
    name = admission.spec.dataset.name
    log.error("an analyst's plan of dataset %r failed to load it: %s", name, exc)
    return ConfigError(
        f"dataset {name!r} cannot be read with the settings its owner registered; ask its "
        "owner to check it (the reason is in the server's log)",
        field="dataset.name",
    )
