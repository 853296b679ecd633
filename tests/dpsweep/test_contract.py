"""The contract at the bottom: one error hierarchy and the sweep spec, in the light ``dpsweep``
package that the SDK, the CLI, the API and the server share."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dpsweep
import dpsweep.errors as errors
import dpsweep.spec

ROOT = Path(__file__).resolve().parents[2]

# Every name a module imports from the hierarchy today.
NAMES = [
    "AuthError",
    "ConfigError",
    "Conflict",
    "ConnectionFailed",
    "DatasetError",
    "DpsweepError",
    "NotFound",
    "PermissionDenied",
    "PrivacyError",
    "RateLimited",
    "ServerError",
    "TrainingError",
    "ValidationError",
]
# The client's transport errors: they describe a failed request to a server, never something
# a server raises, so they have no HTTP status of their own.
TRANSPORT = {errors.ServerError, errors.ConnectionFailed}


def test_the_sdk_and_its_spec_load_without_the_server() -> None:
    """``import dpsweep``, the client and a spec check pull in none of the server's packages
    (nor torch, Ray, a database, FastAPI or numpy)."""
    heavy = {
        "torch",
        "sqlalchemy",
        "fastapi",
        "ray",
        "sweeper",
        "workers",
        "api",
        "opacus",
        "numpy",
    }
    code = (
        "import sys, dpsweep; dpsweep.Client; from dpsweep.spec import load_spec; "
        "load_spec('examples/demo.yaml'); "
        "from dpsweep.client import spec_body; spec_body('examples/demo.yaml'); "
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {sorted(heavy)!r}); "
        "assert not bad, bad"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]


def test_the_server_names_are_the_same_class_objects() -> None:
    import workers

    for name in NAMES:
        assert getattr(dpsweep, name) is getattr(errors, name), name
    for name in ("ConfigError", "DatasetError", "DpsweepError", "PrivacyError", "TrainingError"):
        assert getattr(workers, name) is getattr(errors, name)

    # ValidationError is ConfigError: a spec refused locally is what a 422 raises.
    assert errors.ValidationError is errors.ConfigError
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.DatasetError, errors.ConfigError)
    assert issubclass(errors.PermissionDenied, errors.AuthError)
    with pytest.raises(errors.ConfigError):
        dpsweep.spec.load_spec({"name": "x"})


# Exceptions of the test harness, never raised to a user of the service.
HARNESS_ERRORS = {"api.testing.postgres.PostgresMissing"}


def test_every_server_exception_belongs_to_the_one_tree() -> None:
    """No module of the server defines an error outside dpsweep.errors' tree (one hierarchy,
    mapped to HTTP in one place), and the old re-export modules are gone."""
    import importlib
    import inspect
    import pkgutil

    outside = []
    for package in ("sweeper", "workers", "api"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if (
                    inspect.isclass(obj)
                    and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__
                    and not issubclass(obj, errors.DpsweepError)
                    and f"{module.__name__}.{name}" not in HARNESS_ERRORS
                ):
                    outside.append(f"{module.__name__}.{name}")
    assert outside == []
    for gone in ("sweeper.spec", "workers.errors"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(gone)


def test_a_spec_refused_locally_names_its_field() -> None:
    from dpsweep.client import spec_body

    with pytest.raises(dpsweep.ValidationError) as e:
        spec_body({"name": "x"})
    assert isinstance(e.value, errors.ConfigError) and e.value.status is None
    assert e.value.field == "dataset" and e.value.errors[0]["field"] == "dataset"


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, errors.ConfigError),
        (401, errors.AuthError),
        (403, errors.PermissionDenied),
        (404, errors.NotFound),
        (409, errors.Conflict),
        (413, errors.ConfigError),
        (415, errors.ConfigError),
        (422, errors.ConfigError),
        (429, errors.RateLimited),
        (500, errors.ServerError),
        (503, errors.ServerError),
        (418, errors.DpsweepError),
    ],
)
def test_error_for_maps_a_status_back_to_its_class(
    status: int, cls: type[errors.DpsweepError]
) -> None:
    problem = {"type": f"https://dpsweep.dev/problems/{status}", "detail": "why", "status": status}
    exc = errors.error_for(status, problem)
    assert type(exc) is cls
    assert (exc.status, exc.detail, str(exc), exc.kind) == (status, "why", "why", str(status))
    assert exc.problem == problem


def test_error_for_422_gives_a_config_error_with_its_field() -> None:
    problem = {
        "type": "https://dpsweep.dev/problems/invalid-input",
        "title": "Invalid input",
        "status": 422,
        "detail": "arms: at least one arm",
        "field": "arms",
    }
    exc = errors.error_for(422, problem)
    assert isinstance(exc, errors.ConfigError) and isinstance(exc, dpsweep.ValidationError)
    assert exc.field == "arms" and exc.kind == "invalid-input" and exc.status == 422
    assert exc.errors == [{"field": "arms", "message": "arms: at least one arm"}]
    # The server's own shape: ``errors`` lists every failing field.
    problem = {
        "detail": "privacy.delta: too big",
        "errors": [{"field": "privacy.delta", "message": "m"}],
    }
    exc = errors.error_for(422, problem)
    assert exc.field == "privacy.delta" and exc.errors == [
        {"field": "privacy.delta", "message": "m"}
    ]
    exc = errors.error_for(429, {"detail": "slow down"}, retry_after=3.0)
    assert isinstance(exc, errors.RateLimited) and exc.retry_after == 3.0


def test_errors_survive_pickling() -> None:
    """Ray ships a trial's exception between processes."""
    import pickle

    exc = pickle.loads(pickle.dumps(errors.ConfigError("bad lr", field="arms.a.grid.lr")))
    assert type(exc) is errors.ConfigError and exc.field == "arms.a.grid.lr"
    assert str(exc) == exc.detail == "bad lr"
    exc2 = pickle.loads(pickle.dumps(errors.error_for(409, {"detail": "spent"})))
    assert type(exc2) is errors.Conflict and exc2.status == 409 and exc2.detail == "spent"


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_server_error_class_has_an_http_status() -> None:
    """Every subclass of DpsweepError defined anywhere in the server maps to a status through
    api/errors.py's one table, by a row of its own (not the root's catch-all, never 500)."""
    import api
    import sweeper
    import workers

    for pkg in (sweeper, workers, api):
        for mod in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            importlib.import_module(mod.name)
    from api.errors import STATUSES, ApiError, status_for

    classes = set(_subclasses(errors.DpsweepError)) - TRANSPORT - {ApiError}
    defined_in = {c.__module__.split(".")[0] for c in classes}
    assert {"dpsweep", "sweeper", "workers"} <= defined_in
    for cls in classes:
        status, kind = status_for(cls)
        row = next(c for c, _, _ in STATUSES if issubclass(cls, c))
        assert row is not errors.DpsweepError, f"{cls.__module__}.{cls.__name__} has no row"
        # A kept file that no longer matches its recorded hash is the server's fault.
        expected_range = (500, 600) if issubclass(cls, errors.ArtifactCorrupt) else (400, 500)
        assert expected_range[0] <= status < expected_range[1] and kind, cls
    # The statuses and problem types the API has always answered with.
    from dpsweep.errors import IllegalState, SweepNotFound
    from sweeper.privacy.grids import InfeasiblePlan
    from sweeper.privacy.ledger.errors import BudgetExhausted, ReservationExceeded
    from workers.plan_check import PlanMismatch

    expected = {
        errors.NotFound: (404, "not-found"),
        SweepNotFound: (404, "not-found"),
        errors.PermissionDenied: (403, "forbidden"),
        IllegalState: (409, "illegal-state"),
        BudgetExhausted: (409, "budget-exhausted"),
        InfeasiblePlan: (422, "infeasible-plan"),
        errors.ConfigError: (422, "invalid-input"),
        errors.DatasetError: (422, "invalid-input"),
        errors.PrivacyError: (409, "privacy"),
        ReservationExceeded: (409, "privacy"),
        PlanMismatch: (409, "privacy"),
        errors.TrainingError: (400, "bad-request"),
        errors.DpsweepError: (400, "bad-request"),
    }
    for cls, want in expected.items():
        assert status_for(cls) == want, cls
    assert issubclass(IllegalState, errors.Conflict)
