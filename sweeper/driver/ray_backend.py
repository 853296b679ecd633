"""The Ray backend: starting or joining Ray, the pack task, submitting, waiting, killing.

Why Ray core tasks and not Ray Tune: Tune keeps its own experiment state (trial table,
checkpoints, resume files under ``storage_path``) and its own idea of which trials ran. Our
database already holds that state, and the ledger must be charged *before* a trial touches
data, at a moment the driver controls. With core tasks the driver decides everything (what
runs, when it is charged, what a crash means) and Ray only executes: one task per *pack* (a
batch of compatible trials trained as one computation, :mod:`workers.packing`), one CPU each
(and a GPU fraction on clusters with GPUs). Tasks are Ray *generators*: they stream evaluation
metrics back as they happen, and the driver alone writes them to the database.

Ray is imported only inside these functions: ``sweeper`` imports no Ray at module level.
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dpsweep.errors import PrivacyError
from sweeper.driver import failures
from sweeper.settings import SweeperSettings

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# The Ray task (runs in a worker process; never touches the database)


def _pack_task(spec: Any) -> Iterator[dict[str, Any]]:
    """Train one pack and stream its events: ``started``, ``eval`` (per evaluation),
    then ``result`` or ``error``.

    An ``error`` event carries the failure's ``category`` (:mod:`sweeper.driver.failures`),
    ``privacy`` (whether a privacy refusal), and ``detail``: the exception's full text, for the
    driver's log only (it may hold values computed from the records).
    """
    # deferred: torch; only the Ray worker that trains the pack loads it
    from workers.training.loop import train_pack

    events: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def progress(p: Any) -> None:
        if p.evals is not None:
            evals = [{k: v for k, v in m.items() if k != "reliability"} for m in p.evals]
            events.put({"type": "eval", "step": p.step, "total": p.total_steps, "evals": evals})

    def work() -> None:
        t0 = time.perf_counter()
        try:
            results = train_pack(spec, progress=progress)
            seconds = time.perf_counter() - t0
            events.put(
                {
                    "type": "result",
                    "seconds": seconds,
                    "results": [r.to_dict() for r in results],
                    # Each trial's best checkpoint (safetensors bytes) when the pack keeps them.
                    "weights": [r.weights for r in results],
                }
            )
        except BaseException as exc:  # reported to the driver, which marks the trials failed
            # Privacy: the exception's text may hold values computed from the records (an
            # out-of-memory message's sizes scale with the realised Poisson batch). Only its
            # category reaches the driver's database; the full text goes to this worker's log,
            # and, as ``detail``, to the driver's log alone (sweeper.driver.failures).
            failure = failures.log_failure(
                log,
                exc,
                "a pack of %d %s trial(s) failed",
                len(getattr(spec, "trials", ())),
                getattr(spec, "strategy", "?"),
            )
            events.put(
                {
                    "type": "error",
                    "category": failure.category,
                    "detail": failures.detail(exc),
                    "privacy": isinstance(exc, PrivacyError),
                }
            )
        finally:
            events.put(None)

    yield {"type": "started", "worker": f"{socket.gethostname()}:{os.getpid()}@{_node_id()}"}
    thread = threading.Thread(target=work, name="dpsweep-pack", daemon=True)
    thread.start()
    while (event := events.get()) is not None:
        yield event
    thread.join()


def _pack_caps_task(specs: list[Any], input_shape: tuple[int, ...], num_classes: int) -> list[int]:
    """How many trials of each spec fit one pack (:func:`workers.packing.max_pack_size`, with
    this worker's memory settings); 1 where the estimate fails, as in the driver."""
    # deferred: torch; the estimate builds the model, in the worker that will train it
    from workers.packing import max_pack_size
    from workers.settings import WorkerSettings  # deferred: read in the worker, as above

    settings = WorkerSettings()
    caps = []
    for spec in specs:
        try:
            caps.append(
                max_pack_size(
                    spec, input_shape=input_shape, num_classes=num_classes, settings=settings
                )
            )
        except Exception:  # a model that cannot be built trains alone, and fails alone
            caps.append(1)
    return caps


def _node_id() -> str:
    """The Ray node this worker runs on (its id's first 12 hex digits), to tell the nodes of
    a cluster apart when several share a host name."""
    try:
        import ray  # deferred: sweeper imports no Ray at module level (module doc)

        return str(ray.get_runtime_context().get_node_id())[:12]
    except Exception:  # not under Ray (a direct call)
        return "local"


def gpu_request(trials: int, *, gpus_per_trial: float | None, gpu_fraction: float) -> float:
    """The GPU share of a pack of ``trials`` on a cluster with GPUs: its trials' shares summed
    (at most one whole GPU: a pack runs on one device), else the pack's ``gpu_fraction``.

    Example: ``gpu_request(3, gpus_per_trial=0.25, gpu_fraction=1.0) == 0.75``.
    """
    if gpus_per_trial is None:
        return gpu_fraction
    return min(1.0, round(gpus_per_trial * max(1, trials), 6))


_REMOTE: Any = None


def _remote() -> Any:
    global _REMOTE
    if _REMOTE is None:
        import ray  # deferred: sweeper imports no Ray at module level (module doc)

        _REMOTE = ray.remote(_pack_task)
    return _REMOTE


# ---------------------------------------------------------------------------------------------
# The driver's side


# The one address a locally started Ray may listen on. Ray's processes decide by comparing
# their node IP with exactly this string: the GCS, the raylet's node and object managers, every
# core worker (this driver's included), the runtime-env agent and, where installed, the dashboard
# agent and its metrics exporter bind 127.0.0.1 when the node IP is "127.0.0.1", and all
# interfaces (or the host's address) otherwise.
LOOPBACK = "127.0.0.1"


@contextmanager
def _loopback_node_ip() -> Iterator[None]:
    """While a local Ray starts, let Ray resolve "this node's IP" to 127.0.0.1.

    ``ray.init`` passes any ``_node_ip_address`` that names localhost through
    ``resolve_ip_for_localhost``, which swaps it for the host's routable address unless
    ``ray_constants.ENABLE_RAY_CLUSTER`` is false. That flag comes from
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``, read once when ``ray`` is first imported: setting the
    variable here would be too late whenever anything imported Ray earlier (a test process, a
    plugin), and setting it for the whole process would also make a driver that joins a remote
    cluster advertise 127.0.0.1. So the flag itself is cleared for the start of a local Ray only,
    and restored at once: once the node is up, Ray reads its IP from the node, not the flag.
    """
    from ray._private import ray_constants  # deferred: no Ray at module level, as above

    missing = object()
    before = getattr(ray_constants, "ENABLE_RAY_CLUSTER", missing)
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if before is missing:
            del ray_constants.ENABLE_RAY_CLUSTER
        else:
            ray_constants.ENABLE_RAY_CLUSTER = before


#: The helper processes a local Ray's head starts that dpsweep never uses, by the method of
#: ``ray._private.node.Node`` that starts each: the log monitor (it streams the workers' logs to
#: the driver, which ``log_to_driver=False`` turns off), the autoscaler's monitor (a local Ray
#: has a fixed size; :func:`stop_monitor` says why it is otherwise stopped first) and the API
#: server behind the dashboard and the job and state APIs (``include_dashboard=False``; dpsweep
#: submits tasks only).
_UNUSED_HEAD_PROCESSES = ("start_log_monitor", "start_monitor", "start_api_server")


@contextmanager
def _lean_local_node() -> Iterator[None]:
    """While a local Ray starts, skip the head processes it would start for nothing
    (:data:`_UNUSED_HEAD_PROCESSES`).

    Each is a Python process that imports much of Ray: about a second of CPU each, which on a
    small machine the driver's planning and the first pack's worker wait for (measured on 2
    cores: Ray up in 2-3 s instead of 4-4.5 s). A Ray release without one of these methods
    starts as it always did. Workers, their logs (files in the session directory), the GCS,
    the raylet and its agents are untouched.
    """
    from ray._private import node as ray_node  # deferred: no Ray at module level, as above

    saved = {name: getattr(ray_node.Node, name, None) for name in _UNUSED_HEAD_PROCESSES}
    if any(method is None for method in saved.values()):
        yield
        return

    def skip(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    for name in saved:
        setattr(ray_node.Node, name, skip)
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(ray_node.Node, name, method)


def _start_ray(settings: SweeperSettings, *, workers: int | None) -> None:
    """Join ``ray_address``, else start a local Ray (capped object store, no dashboard, quiet,
    listening on 127.0.0.1 only).

    Raises:
        RuntimeError: a local Ray started with a node IP other than 127.0.0.1 (then some of its
            servers would listen beyond loopback); it is shut down first.
    """
    import ray  # deferred: sweeper imports no Ray at module level (module doc)

    # Ray's token authentication stays on (a local cluster is still reachable by other local
    # users); its notice about it is not news to a dpsweep user.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR
    )
    # Read when ray.init runs (not at import), so setting it here takes effect.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": "WARNING",
        "log_to_driver": False,
        "configure_logging": True,
    }
    if settings.ray_address:
        ray.init(address=settings.ray_address, **kwargs)
        return
    with _loopback_node_ip(), _lean_local_node():
        ray.init(
            num_cpus=workers or settings.workers or os.cpu_count() or 1,
            object_store_memory=settings.ray_object_store_mb * 2**20,
            _node_ip_address=LOOPBACK,
            **kwargs,
        )
    # A Ray release that chose its node IP another way would silently listen on the
    # network; refuse to run on it rather than break the "127.0.0.1 only" promise.
    if (ip := ray.util.get_node_ip_address()) != LOOPBACK:
        ray.shutdown()
        raise RuntimeError(
            f"the local Ray started with node IP {ip}, not {LOOPBACK}: its servers would "
            "listen beyond loopback (set DPSWEEP_RAY_ADDRESS to use a Ray cluster instead)"
        )


@contextmanager
def ray_session(settings: SweeperSettings, *, workers: int | None = None) -> Iterator[None]:
    """Use the Ray already initialised (:class:`EarlyRay`'s, a test's, the server's), else
    join ``ray_address``, else start a local Ray (:func:`_start_ray`). Only a Ray started
    here is shut down here.

    Raises:
        RuntimeError: as :func:`_start_ray`.
    """
    import ray  # deferred: sweeper imports no Ray at module level (module doc)

    if ray.is_initialized():
        yield
        return
    _start_ray(settings, workers=workers)
    try:
        yield
    finally:
        _shutdown_ray()


def _shutdown_ray() -> None:
    """``ray.shutdown()``, with Ray's unreachable objects freed and the local autoscaler's
    monitor stopped first (:func:`stop_monitor`).

    Why collect first: a Ray object (an object ref, a task's event generator) freed while
    ``ray.shutdown`` runs calls into the core worker as it stops, and Ray then ends the whole
    process with exit status 1, after the sweep has finished and printed. Such objects sit in
    reference cycles (an exception from a lost node holds its traceback's frames, and they
    hold the refs), which the garbage collector frees whenever it next runs: in ``dpsweep
    run``'s main thread, say, while :class:`EarlyRay` shuts Ray down in its own. Collecting
    them here, while Ray is up, leaves none for later.
    """
    import ray  # deferred: sweeper imports no Ray at module level (module doc)

    gc.collect()
    stop_monitor()
    ray.shutdown()


def stop_monitor() -> bool:
    """Stop the autoscaler monitor of the local Ray this process started; whether one was
    running.

    A local Ray of fixed size has no use for its monitor, and ``ray.shutdown`` stops it last:
    after the GCS, which the monitor's SIGTERM handler then tries to reach, so Ray waits out its
    one-second grace period before killing it. That second was most of a ``dpsweep run``'s
    shutdown. Killing the monitor first loses nothing (it holds no state of ours). A joined
    cluster's monitor is never touched, and any surprise in Ray's internals leaves the monitor
    to the plain shutdown.
    """
    try:
        from ray._private import ray_constants  # deferred: no Ray at module level, as above
        from ray._private import worker as ray_worker  # deferred: as above

        node = ray_worker._global_node
        if node is None or not node.is_head():
            return False
        live = [
            info.process
            for info in node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, [])
            if info.process.poll() is None
        ]
        for process in live:
            process.kill()
            process.wait(timeout=1.0)
        return bool(live)
    except Exception:  # the plain shutdown still stops everything
        log.debug("could not stop Ray's monitor first", exc_info=True)
        return False


class _NoSigtermNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


class EarlyRay:
    """Ray started in a background thread while the caller does something else first.

    ``dpsweep run`` plans and reserves its sweep (imports, the accountant, the database) while
    Ray starts (seconds), instead of one after the other. Ray is used through
    :func:`ray_session`, which finds it initialised; :meth:`close` shuts it down. A Ray already
    initialised in the process is used as it is and not shut down here. (Warming a
    worker's torch import too was measured and gained nothing: a pack then lands on a fresh
    worker while the warm one is still importing. Measured again once ``dpsweep run`` started
    Ray before opening the database, on 2 cores: a one-trial sweep took 1-2 s longer.)

    The thread that started Ray lives until :meth:`close` and shuts Ray down itself: Ray ties
    its local processes (GCS, raylet) to the thread that spawned them (Linux's parent-death
    signal is per thread), so a starter thread that ended would take the cluster with it.

    Args:
        settings: As :func:`ray_session`'s.
        workers: Local Ray's CPUs (default: the settings', else the machine's).
    """

    def __init__(self, settings: SweeperSettings, *, workers: int | None) -> None:
        self._settings = settings
        self._workers = workers
        self._error: BaseException | None = None
        #: Whether the Ray is a local one started here (so this process's sweep has it to
        #: itself), rather than a cluster joined or a Ray the process already had. Read after
        #: :meth:`ready`.
        self.local = False
        self._up = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._hold, name="dpsweep-ray", daemon=True)
        self._thread.start()

    def _hold(self) -> None:
        import ray  # deferred: sweeper imports no Ray at module level (module doc)

        # Ray sets its SIGTERM handler from the main thread only, and says so. Not news here: a
        # terminated `dpsweep run` takes its local Ray down with it (the parent-death signal).
        logging.getLogger("ray._private.worker").addFilter(_NoSigtermNotice())
        try:
            if ray.is_initialized():
                # Someone else's Ray (a test's, the report's one process): used as it is, and
                # never shut down here, as in ray_session.
                return
            _start_ray(self._settings, workers=self._workers)
            self.local = not self._settings.ray_address
        except BaseException as exc:  # re-raised in the caller's thread by ready()
            self._error = exc
            return
        finally:
            self._up.set()
        self._closing.wait()
        _shutdown_ray()

    def ready(self) -> None:
        """Wait until Ray is up; re-raise what stopped it from starting."""
        self._up.wait()
        if self._error is not None:
            raise self._error

    def close(self, *, wait: bool = True) -> None:
        """Shut Ray down (once its start has finished, whether it succeeded or not).

        Args:
            wait: Return once Ray is down; False: return at once, the shutdown going on in the
                background (call again with ``wait=True`` before the process ends).
        """
        self._closing.set()
        if wait:
            self._thread.join()


def cluster_resources() -> dict[str, float]:
    """The Ray cluster's total resources (``CPU``, ``GPU``, ...)."""
    import ray  # deferred: sweeper imports no Ray at module level (module doc)

    return dict(ray.cluster_resources())


#: How long the driver waits for a worker to size its packs before sizing them itself.
PACK_CAPS_TIMEOUT_SECONDS = 120.0


def remote_pack_caps(
    specs: list[Any], *, input_shape: tuple[int, ...], num_classes: int
) -> list[int]:
    """:func:`_pack_caps_task` in a Ray worker, waited for (at most
    :data:`PACK_CAPS_TIMEOUT_SECONDS`).

    Sizing a pack builds its model, so it imports torch: seconds of a sweep's start that the
    driver would otherwise spend itself, before its first pack; a worker has to import torch
    anyway, and then starts the first pack warm. Only for a cluster that is idle when it is
    called (``dpsweep run``'s own local Ray): on a busy one the task would wait for a CPU.

    Raises:
        Exception: whatever stopped the task (the caller then sizes the packs itself).
    """
    import ray  # deferred: sweeper imports no Ray at module level (module doc)

    global _CAPS_REMOTE
    if _CAPS_REMOTE is None:
        _CAPS_REMOTE = ray.remote(_pack_caps_task)
    ref = _CAPS_REMOTE.options(num_cpus=1).remote(specs, input_shape, num_classes)
    try:
        caps: list[int] = ray.get(ref, timeout=PACK_CAPS_TIMEOUT_SECONDS)
    except BaseException:
        ray.cancel(ref, force=True)
        raise
    if len(caps) != len(specs):
        raise RuntimeError("the pack-size task answered for other specs")
    return [max(1, int(c)) for c in caps]


_CAPS_REMOTE: Any = None


def submit_pack(spec: Any, *, num_gpus: float) -> Any:
    """Start the pack task on one CPU (and ``num_gpus``); returns its event generator."""
    return (
        _remote()
        .options(
            num_cpus=1,
            num_gpus=num_gpus,
            # Never let Ray re-run a pack on its own after a worker or node died: a second
            # run under the one charge would release more than was paid for. A lost pack
            # goes through the crash policy instead (sweeper.driver.crash), which charges any
            # re-run.
            max_retries=0,
            retry_exceptions=False,
        )
        .remote(spec)
    )


def wait_any(gens: list[Any], *, timeout: float) -> list[Any]:
    """The generators among ``gens`` with an event ready, waiting at most ``timeout`` s."""
    import ray  # deferred: sweeper imports no Ray at module level (module doc)

    ready, _ = ray.wait(gens, num_returns=1, timeout=timeout)
    return list(ready)


def next_event(gen: Any) -> dict[str, Any]:
    """The next event of a pack task.

    Raises:
        StopIteration: the task ended.
        Exception: the worker process or its node died (the task reports its own errors as
            events, so anything raised here is the infrastructure's).
    """
    import ray  # deferred: sweeper imports no Ray at module level (module doc)

    ref = next(gen)
    event: dict[str, Any] = ray.get(ref)
    return event


def kill(gens: list[Any]) -> None:
    """Kill the pack tasks of ``gens`` at once (their trials stay charged)."""
    import ray  # deferred: sweeper imports no Ray at module level (module doc)

    for gen in gens:
        ray.cancel(gen, force=True)
