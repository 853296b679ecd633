"""A handle on one sweep: its fields, reads, cancel, following it to the end, data frames."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from dpsweep.columns import metric_column, param_column
from dpsweep.errors import ConnectionFailed, ServerError
from dpsweep.transport import Event, HttpTransport
from dpsweep.trial import Trial

TERMINAL = frozenset({"done", "failed", "cancelled"})


class Sweep:
    """A handle on one sweep. Its fields are as of the last read (:meth:`refresh`).

    Attributes:
        id, name, state, dataset: The sweep's.
        data: Everything the server last said about it (``GET /api/v1/sweeps/{id}``).
    """

    def __init__(self, client: HttpTransport, data: dict[str, Any]) -> None:
        self._client = client
        self.data = dict(data)

    # -- fields ---------------------------------------------------------------------------------

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def name(self) -> str:
        return str(self.data["name"])

    @property
    def state(self) -> str:
        return str(self.data["state"])

    @property
    def dataset(self) -> str:
        return str(self.data["dataset"])

    @property
    def finished(self) -> bool:
        """Whether the sweep has ended (done, failed or cancelled)."""
        return self.state in TERMINAL

    @property
    def counts(self) -> dict[str, int] | None:
        """Trials by state (None for papernot-steinke sweeps, whose count is private)."""
        if self.runs_private:
            return None
        c = self.data.get("trials")
        return dict(c) if isinstance(c, dict) else None

    @property
    def runs_private(self) -> bool:
        """Whether the sweep's number of runs is secret (papernot-steinke accounting): it
        then shows no trial counts or progress, and each grid releases only its selected
        trial, once its search has completed without a cancel."""
        plan = self.data.get("plan")
        if isinstance(plan, list):
            return any(g.get("release") == "selected-only" for g in plan)
        return "trials" in self.data and self.data["trials"] is None

    @property
    def url(self) -> str:
        """This sweep's page on the dashboard."""
        return f"{self._client.base_url}/sweeps/{self.id}"

    def __repr__(self) -> str:
        return f"<Sweep {self.id} {self.name!r} {self.state}>"

    # -- reads ----------------------------------------------------------------------------------

    def refresh(self) -> Sweep:
        """Re-read the sweep from the server."""
        self.data = dict(self._client._json("GET", f"/sweeps/{self.id}"))
        return self

    def results(self) -> list[dict[str, Any]]:
        """The best configuration per arm and epsilon level (mean ± std over seeds)."""
        return list(self._client._json("GET", f"/sweeps/{self.id}/results")["results"])

    def pareto(self, x: str = "epsilon", y: str | None = None) -> list[dict[str, Any]]:
        """A Pareto front's points, each with ``dominated``.

        ``x="epsilon"``: per arm and epsilon level, the best configuration's mean ``y`` (the
        objective by default). Otherwise one point per finished trial, e.g.
        ``pareto(x="accuracy", y="ece")`` for calibration.
        """
        params = {"x": x} | ({"y": y} if y else {})
        return list(self._client._json("GET", f"/sweeps/{self.id}/pareto", params=params)["points"])

    def trials(
        self,
        *,
        arm: str | None = None,
        level: float | None = None,
        state: str | None = None,
        sort: str = "number",
        page_size: int = 500,
    ) -> Iterator[Trial]:
        """The sweep's trials, fetched page by page as you iterate.

        Each is a :class:`~dpsweep.trial.Trial` holding the list's fields (its ``model`` says
        whether a trained model is kept); :meth:`Trial.refresh` reads the rest.

        Args:
            arm, level, state: Filters (an arm's name, an epsilon level, a trial state).
            sort: ``number`` (grid order) or ``objective`` (best first).
        """
        params = {"arm": arm, "level": level, "state": state, "sort": sort}
        for item in self._client._pages(f"/sweeps/{self.id}/trials", params, page_size=page_size):
            yield Trial(self._client, item)

    def best_trial(self) -> Trial | None:
        """The finished trial with the best objective, in full (None if none finished).

        Its model, when kept (``best.model``), loads with :meth:`Trial.load_model`.
        """
        for t in self.trials(state="done", sort="objective", page_size=1):
            return t.refresh()
        return None

    # -- changes --------------------------------------------------------------------------------

    def cancel(self) -> dict[str, Any]:
        """Cancel the sweep: pending trials are dropped and their reservation released;
        running ones stop and stay charged.

        The counts (``cancelled_pending``, ``stopped_running``) leave papernot-steinke grids
        out; for those, ``papernot_steinke`` says: grids whose search had started stay charged
        in full and release nothing unless their search had already completed.

        Raises:
            Conflict: the sweep has already finished.
        """
        out = dict(self._client._json("POST", f"/sweeps/{self.id}/cancel", safe=True))
        self.refresh()
        return out

    # -- following ------------------------------------------------------------------------------

    def stream(self, *, after: int | None = None) -> Iterator[Event]:
        """The sweep's events as they happen, from the start (or after event ``after``),
        until the sweep ends.

        Example::

            for event in sweep.stream():
                if event.kind == "trial" and event.state == "done":
                    print(event.trial, event.data["metrics"])
        """
        for ev in self._client._events(self.id, after=after):
            if ev is not None:
                yield ev

    def wait(
        self, *, progress: bool = True, timeout: float | None = None, poll_seconds: float = 2.0
    ) -> Sweep:
        """Block until the sweep ends; returns it refreshed.

        It follows the events stream (a progress bar on stderr when ``progress``), and falls
        back to polling every ``poll_seconds`` if the stream is unavailable.

        Raises:
            TimeoutError: it had not ended after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = _Bar(self) if progress else None
        try:
            self.refresh()
            if bar:
                bar.update()
            if self.finished:
                return self
            last = 0.0
            try:
                for ev in self._client._events(self.id, heartbeat=True):
                    _check(deadline, self)
                    if ev is None:
                        continue
                    if ev.kind == "sweep" and ev.state in TERMINAL:
                        break
                    if bar and ev.kind == "trial" and time.monotonic() - last > 0.5:
                        last = time.monotonic()
                        self.refresh()
                        bar.update()
            except (ConnectionFailed, ServerError):
                pass  # the stream is unavailable (a proxy, a restart): poll instead
            self.refresh()
            while not self.finished:
                _check(deadline, self)
                time.sleep(poll_seconds)
                self.refresh()
                if bar:
                    bar.update()
            if bar:
                bar.update()
            return self
        finally:
            if bar:
                bar.close()

    # -- data frames ----------------------------------------------------------------------------

    def to_dataframe(self, what: str = "trials") -> Any:
        """A pandas DataFrame: ``"trials"`` (one row per trial, params and metrics as
        columns), ``"results"`` (best per arm and level) or ``"pareto"`` (the epsilon front).

        Needs pandas (``pip install pandas``), imported only here.
        """
        pd = _pandas()
        if what == "trials":
            rows = [_flat_trial(t) for t in self.trials()]
        elif what == "results":
            rows = [
                {k: v for k, v in r.items() if k != "best_params"}
                | _prefixed(r.get("best_params") or {}, r)
                for r in self.results()
            ]
        elif what == "pareto":
            rows = [
                {k: v for k, v in p.items() if k != "params"} | _prefixed(p.get("params") or {}, p)
                for p in self.pareto()
            ]
        else:
            raise ValueError(f"what must be 'trials', 'results' or 'pareto', not {what!r}")
        return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# Helpers


def _check(deadline: float | None, sweep: Sweep) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise TimeoutError(f"sweep {sweep.id} is still {sweep.state}")


def _pandas() -> Any:
    try:
        import pandas  # optional: the light install leaves pandas out (and it pulls numpy)
    except ImportError:
        raise ImportError(
            "to_dataframe needs pandas, which the light install leaves out: pip install pandas"
        ) from None
    return pandas


def _prefixed(params: dict[str, Any], taken: dict[str, Any]) -> dict[str, Any]:
    return {param_column(k, taken): v for k, v in params.items()}


def _flat_trial(t: dict[str, Any]) -> dict[str, Any]:
    row = {k: v for k, v in t.items() if k not in ("params", "metrics")}
    row |= _prefixed(t.get("params") or {}, row)
    row |= {metric_column(k, row): v for k, v in (t.get("metrics") or {}).items()}
    return row


class _Bar:
    """A rich progress bar of a sweep's trials; for a papernot-steinke sweep (whose number
    of runs is private) only the elapsed time, no counts."""

    def __init__(self, sweep: Sweep) -> None:
        self.sweep = sweep
        self.private = sweep.runs_private
        columns: list[ProgressColumn | str] = [TextColumn("[bold]{task.description}")]
        if not self.private:
            columns += [BarColumn(), MofNCompleteColumn()]
        columns += [TextColumn("{task.fields[extra]}"), TimeElapsedColumn()]
        self.progress = Progress(*columns, console=Console(stderr=True), transient=False)
        self.progress.start()
        self.task = self.progress.add_task(sweep.id[:12], total=None, extra="")

    def update(self) -> None:
        if self.private:
            self.progress.update(
                self.task,
                description=f"{self.sweep.name} ({self.sweep.state})",
                extra="papernot-steinke: the number of runs is private; elapsed",
            )
            return
        c = self.sweep.counts or {}
        total = sum(c.values()) or None
        failed = c.get("failed", 0) + c.get("interrupted", 0)
        self.progress.update(
            self.task,
            description=f"{self.sweep.name} ({self.sweep.state})",
            completed=c.get("done", 0) + failed + c.get("cancelled", 0),
            total=total,
            extra=f"running {c.get('running', 0)} · failed {failed}",
        )

    def close(self) -> None:
        self.progress.stop()
