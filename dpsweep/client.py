"""The Python client of the dpsweep REST API.

It needs only the light base install (httpx, pydantic, PyYAML, rich): no torch, no Ray, no
database. Specs are validated locally with the server's own models (:mod:`dpsweep.spec`)
before anything is sent.

Example (against ``dpsweep serve`` and a token from ``dpsweep token create``)::

    from dpsweep import Client

    with Client("http://127.0.0.1:8000", token="dps_...") as client:
        sweep = client.submit("examples/demo.yaml")
        sweep.wait()                      # a progress bar until the sweep ends
        front = sweep.pareto()            # epsilon vs the objective, per arm
        df = sweep.to_dataframe()         # one row per trial (needs pandas)
        model = sweep.best_trial().load_model()  # the trained model (needs dpsweep[server])
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dpsweep.errors import ConfigError
from dpsweep.sweep import Sweep
from dpsweep.transport import Event, HttpTransport
from dpsweep.trial import Trial

__all__ = ["Client", "Event", "Sweep", "Trial", "spec_body"]

_JSON = {"Content-Type": "application/json"}


class Client(HttpTransport):
    """A connection to a dpsweep server.

    Args:
        base_url: The server, e.g. ``http://127.0.0.1:8000``; default ``DPSWEEP_URL``, else
            ``http://127.0.0.1:8000``.
        token: A bearer token; default ``DPSWEEP_TOKEN`` (none: for ``serve --no-auth``).
        timeout: Seconds per request (connect, read, write).
        retries: How many times a request is retried on connection errors and on 429 / 503
            (honouring ``Retry-After``), with exponential backoff.
        backoff: The first backoff in seconds (doubled each retry, with jitter).
        max_retry_wait: A ``Retry-After`` longer than this is not waited for.
        transport: An httpx transport (for tests or proxies).

    Use it as a context manager, or call :meth:`close`.
    """

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"

    # -- who ------------------------------------------------------------------------------------

    def me(self) -> dict[str, Any]:
        """Who the token is: ``{"name", "admin", "auth"}`` (raises AuthError if refused)."""
        return dict(self._json("GET", "/me"))

    # -- sweeps ---------------------------------------------------------------------------------

    def plan(self, spec: Any) -> dict[str, Any]:
        """Dry run: the server's plan of ``spec`` (noise per grid, epsilon reserved). Nothing
        is stored.

        Args:
            spec: A dict, YAML or JSON text, a path to a spec file, or a ``SweepSpec``.

        Raises:
            ValidationError: the spec is invalid (checked locally first) or its plan is
                infeasible.
        """
        body = spec_body(spec)
        return dict(self._json("POST", "/sweeps:plan", content=body, headers=_JSON, safe=True))

    def submit(self, spec: Any, *, idempotency_key: str | None = None) -> Sweep:
        """Validate ``spec`` locally, submit it, and return its :class:`Sweep`.

        The server plans it, reserves its whole privacy cost on the dataset and queues it.
        Every submit carries an ``Idempotency-Key`` (a random one unless given), so a retry
        after a lost response returns the same sweep instead of reserving twice; pass your
        own key to make resubmitting from another process idempotent too.

        Raises:
            ValidationError: invalid spec or infeasible plan.
            Conflict: the dataset's remaining budget cannot cover the sweep.

        Example::

            sweep = client.submit({"name": "s", "dataset": {"name": "digits"}, ...})
        """
        body = spec_body(spec)
        key = idempotency_key or uuid.uuid4().hex
        data = self._json(
            "POST",
            "/sweeps",
            content=body,
            headers={**_JSON, "Idempotency-Key": key},
            safe=True,
        )
        return Sweep(self, data)

    def sweep(self, sweep_id: str) -> Sweep:
        """One sweep by id (raises NotFound)."""
        return Sweep(self, self._json("GET", f"/sweeps/{sweep_id}"))

    def sweeps(self, state: str | None = None, *, page_size: int = 100) -> Iterator[Sweep]:
        """Your sweeps, newest first, fetched page by page as you iterate.

        Each :class:`Sweep` holds the list's fields; :meth:`Sweep.refresh` reads the rest.
        """
        for item in self._pages("/sweeps", {"state": state}, page_size=page_size):
            yield Sweep(self, item)

    def trial(self, trial_id: str) -> Trial:
        """A trial's details (params, planned noise, privacy charges, metrics, bins, its
        kept ``model``), as a :class:`Trial`: a dict that also fetches its model
        (:meth:`Trial.model_card`, :meth:`Trial.download_model`, :meth:`Trial.load_model`)."""
        return Trial(self, self._json("GET", f"/trials/{trial_id}"))

    # -- audits ---------------------------------------------------------------------------------

    def audit(
        self,
        *,
        confirm: bool = False,
        wait: bool = True,
        timeout: float | None = None,
        poll_seconds: float = 1.0,
        **fields: Any,
    ) -> dict[str, Any]:
        """Start a canary audit (``POST /audits``) and, with ``wait``, poll it until it ends.

        ``fields`` are :class:`dpsweep.audit.AuditRequest`'s, checked locally first: a run
        (``dataset``, ``model``, ``strategy``, ``params``, ``epsilon`` or
        ``noise_multiplier``, ``batch_size`` or ``sample_rate``, ``steps``, ``lrs``) or a
        finished ``trial``; ``setting`` (``white-box`` or ``black-box``), ``canaries``,
        ``confidence``. Public data spends nothing; your private dataset is charged the
        claimed epsilon, and only with ``confirm=True`` (see the cost first with
        :meth:`audit_cost`).

        Returns:
            The audit: ``id``, ``state`` (``running``, ``succeeded``, ``failed``),
            ``result`` (``epsilon_lower_bound`` beside ``epsilon_claimed``, the ``verdict``,
            its one-line ``summary`` and its ``false_alarm_rate``, ...), ``charge``, ``error``.

        Raises:
            ValidationError: a bad field (locally or from the server), naming it; a charge
                not confirmed is one naming ``confirm``, its ``problem["cost"]`` the cost
                (nothing was reserved).
            PermissionDenied: an analyst's audit of a dataset granted to them.
            TimeoutError: ``timeout`` seconds passed while it was still running.

        Example::

            a = client.audit(dataset="digits", epsilon=8, batch_size=1437, steps=10,
                             canaries=500)
            a["result"]["epsilon_lower_bound"] <= a["result"]["epsilon_claimed"]
        """
        body = self._audit_body({**fields, "confirm": confirm} if confirm else fields)
        audit = dict(self._json("POST", "/audits", json=body))
        deadline = None if timeout is None else time.monotonic() + timeout
        while wait and audit["state"] == "running":
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"audit {audit['id']} still running after {timeout} s")
            time.sleep(poll_seconds)
            audit = self.get_audit(audit["id"])
        return audit

    def audit_cost(self, **fields: Any) -> dict[str, Any]:
        """What :meth:`audit` with these ``fields`` would charge (``POST /audits/quote``);
        nothing is started, reserved or stored.

        Returns:
            ``charged`` (False: public data), ``dataset``, ``ledger``, ``epsilon`` and
            ``delta`` (what is charged), ``epsilon_left_before`` and ``epsilon_left_after``
            (None: no cap), ``fits``, and ``text``: the same in one line.

        Raises:
            ValidationError, PermissionDenied, NotFound: the audit would be refused.
        """
        return dict(self._json("POST", "/audits/quote", json=self._audit_body(fields)))

    @staticmethod
    def _audit_body(fields: dict[str, Any]) -> dict[str, Any]:
        """``fields`` as an audit request's JSON, checked locally first (naming the field)."""
        # deferred, as spec_body's: pydantic (about 80 ms) loads on the first validation, not
        # with the client (which needs only httpx)
        from pydantic import ValidationError

        from dpsweep.audit import AuditRequest  # deferred: pydantic, as above

        try:
            request = AuditRequest(**fields).check()
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or None
            raise ConfigError(f"{field}: {first['msg']}", field=field) from None
        return request.model_dump(mode="json", exclude_unset=True)

    def get_audit(self, audit_id: str) -> dict[str, Any]:
        """One of your audits by id (raises NotFound)."""
        return dict(self._json("GET", f"/audits/{audit_id}"))

    def audits(
        self, *, trial: str | None = None, sweep: str | None = None, page_size: int = 100
    ) -> Iterator[dict[str, Any]]:
        """Your audits, newest first (of one trial or sweep), fetched page by page."""
        yield from self._pages("/audits", {"trial": trial, "sweep": sweep}, page_size=page_size)

    # -- datasets -------------------------------------------------------------------------------

    def datasets(self) -> list[dict[str, Any]]:
        """Built-in datasets and your uploads, each with its budget, then the datasets granted
        to you (``role: analyst``: their public description and your ``allowance``)."""
        return list(self._json("GET", "/datasets")["items"])

    def upload_dataset(
        self,
        path: str | Path,
        *,
        label: str | None = None,
        name: str | None = None,
        format: str | None = None,
        epsilon_cap: float | None = None,
        delta_cap: float | None = None,
        declare_counted: bool = False,
        privacy_unit: str | None = None,
    ) -> dict[str, Any]:
        """Upload a CSV (with a ``label`` column) or an NPZ (arrays ``x``, ``y``).

        ``declare_counted=True`` declares the counted number of records, class list and
        feature shape public (and, with a privacy unit, the number of units): analysts of the
        dataset see and plan with those, and no analyst can be granted before they are
        declared (here, or by :meth:`set_dataset_policy`).

        ``privacy_unit``: the column (CSV) or array (NPZ) saying whose each row is, e.g.
        ``patient_id``: every epsilon spent on the dataset is then per unit (all of a
        person's rows together), and its ledger counts units. It is never a feature.

        Returns:
            The stored dataset; name it in a spec by its ``id`` (``dataset: {name: ds_...}``).
        """
        p = Path(path)
        fields = {
            "label_column": label,
            "name": name,
            "format": format,
            "epsilon_cap": None if epsilon_cap is None else repr(float(epsilon_cap)),
            "delta_cap": None if delta_cap is None else repr(float(delta_cap)),
            "declare_counted": "true" if declare_counted else None,
            "privacy_unit": privacy_unit,
        }
        with p.open("rb") as fh:
            # Not retried on a dropped connection: the upload may have been stored.
            return dict(
                self._json(
                    "POST",
                    "/datasets",
                    files={"file": (p.name, fh)},
                    data={k: v for k, v in fields.items() if v is not None},
                    safe=False,
                )
            )

    def budget(self, dataset: str) -> dict[str, Any]:
        """A dataset's lifetime budget: caps, committed, reserved, remaining, and the sweeps
        on it (its owner: every sweep on their data). For an analyst of the dataset: their
        allowance (``epsilon_allowance``, ``epsilon_used``, ``epsilon_left``, ``active``) and
        their own sweeps."""
        return dict(self._json("GET", f"/datasets/{dataset}/budget"))

    # -- data owners and analysts ---------------------------------------------------------------

    def grant(
        self,
        dataset: str,
        analyst: str,
        epsilon_allowance: float,
        *,
        note: str | None = None,
        confirm: bool = False,
    ) -> dict[str, Any]:
        """Grant ``analyst`` (another tenant) access to your dataset with an ε allowance: they
        may submit sweeps on it and receive their DP outputs, holding at most
        ``epsilon_allowance`` on its records. A grant they hold is replaced (what they spent
        stays counted).

        ``analyst`` is the name of their API token. A name no token has is refused (a typo
        would grant no one) unless ``confirm=True``: the name their token will have.

        Raises:
            PermissionDenied: you are an analyst of the dataset, not its owner.
            NotFound: no such dataset of yours.
            ConfigError: no token has that name, and ``confirm`` is not set.
        """
        body: dict[str, Any] = {"analyst": analyst, "epsilon_allowance": float(epsilon_allowance)}
        if note is not None:
            body["note"] = note
        if confirm:
            body["confirm"] = True
        # Repeating it grants the same again: harmless.
        path = f"/datasets/{dataset}/grants"
        return dict(self._json("POST", path, json=body, safe=True))

    def revoke(self, dataset: str, analyst: str) -> dict[str, Any]:
        """Revoke ``analyst``'s grant: nothing new starts; their running trials finish and
        stay charged. Returns the revoked grant (raises NotFound if none is active)."""
        return dict(self._json("DELETE", f"/datasets/{dataset}/grants/{analyst}"))

    def grants(self, dataset: str) -> list[dict[str, Any]]:
        """A dataset's grants, newest first, each with the analyst's ``epsilon_used`` (its
        owner: every grant; an analyst: their own)."""
        return list(self._json("GET", f"/datasets/{dataset}/grants")["items"])

    def audit_log(
        self, dataset: str, *, analyst: str | None = None, page_size: int = 500
    ) -> Iterator[dict[str, Any]]:
        """The audit log of releases from a dataset, oldest first, fetched page by page: who
        received what (``principal``, ``sweep_id``, ``trial_id``, ``kind``), at what ε, when.
        Its owner reads every entry (``analyst=`` filters); an analyst their own."""
        yield from self._pages(
            f"/datasets/{dataset}/audit", {"analyst": analyst}, page_size=page_size
        )

    def dataset_policy(self, dataset: str) -> dict[str, Any]:
        """What analysts may use and see of a dataset: ``analyst_eval_modes`` and
        ``public_info`` (``label_names``, ``description``)."""
        return dict(self._json("GET", f"/datasets/{dataset}/policy"))

    def set_dataset_policy(
        self,
        dataset: str,
        *,
        analyst_eval_modes: list[str] | None = None,
        label_names: list[str] | None = None,
        description: str | None = None,
        view: dict[str, Any] | None = None,
        declare_counted: bool = False,
    ) -> dict[str, Any]:
        """Change what analysts may use and see of your dataset; what is not given stays.

        Args:
            analyst_eval_modes: The evaluation modes analysts may use (``public``, ``dp``,
                ``carve-out``: a carve-out releases raw metrics on private records).
            label_names: The classes' names, declared public.
            description: A public description.
            view: How every later sweep reads the records: any of ``test_fraction``,
                ``split_seed``, ``input_bounds`` (``[lo, hi]``, or None to withdraw them) and
                ``feature_clip``. Analysts' specs cannot change them. ``n_examples``,
                ``classes`` and ``input_shape`` given declare those facts public: an analyst
                sees and plans with declared facts only, and is granted once all three are.
            declare_counted: Declare the counted number of records, class list and feature
                shape public, as they are.

        Raises:
            PermissionDenied: you are an analyst of the dataset, not its owner.
        """
        body: dict[str, Any] = {}
        if analyst_eval_modes is not None:
            body["analyst_eval_modes"] = list(analyst_eval_modes)
        info: dict[str, Any] = {}
        if label_names is not None:
            info["label_names"] = list(label_names)
        if description is not None:
            info["description"] = description
        if info:
            body["public_info"] = info
        if view:
            body["view"] = dict(view)
        if declare_counted:
            body["declare_counted"] = True
        return dict(self._json("PUT", f"/datasets/{dataset}/policy", json=body, safe=True))


def spec_body(spec: Any) -> bytes:
    """Validate a spec locally with the server's models; its JSON body.

    Raises:
        ValidationError: (``ConfigError``) naming the failing field, before anything is sent.
    """
    from dpsweep.spec import SweepSpec, load_spec  # pydantic: imported when first needed

    try:
        if isinstance(spec, SweepSpec):
            model = SweepSpec.model_validate(spec.model_dump(mode="json", exclude_unset=True))
        elif isinstance(spec, str | Path | dict):
            model = load_spec(spec)
        else:
            raise ConfigError(
                f"a spec is a dict, YAML/JSON text, a file path or a SweepSpec, not "
                f"{type(spec).__name__}"
            )
    except ConfigError as exc:
        problem: dict[str, Any] = {"title": "Invalid spec (checked locally)", "detail": str(exc)}
        if exc.field:
            problem["errors"] = [{"field": exc.field, "message": str(exc)}]
        raise ConfigError(str(exc), field=exc.field, problem=problem) from None
    # Only what the spec sets: a dataset's owner fixes the settings a spec leaves out (its
    # split, bounds...), and an analyst's spec that repeated every default would contradict
    # an owner who chose others.
    return json.dumps(model.model_dump(mode="json", exclude_unset=True)).encode()
