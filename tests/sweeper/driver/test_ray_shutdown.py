"""A local Ray starts without the head processes dpsweep never uses, stops an autoscaler monitor
first, and its shutdown leaves no process behind.

dpsweep starts its local Ray without the log monitor, the autoscaler's monitor and the API server
(:func:`sweeper.driver.ray_backend._lean_local_node`); tasks still run. Where a monitor runs (a
Ray started another way), ``ray.shutdown`` stops it after the GCS, and then waits a second for it
(its SIGTERM handler tries to reach the GCS); dpsweep kills it first (:func:`stop_monitor`). The
cluster must not notice (tasks still run), and the shutdown must still end every process Ray
started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]

# In a fresh interpreter: the driver exactly as dpsweep starts it (ray_session), or (LEAN False)
# a plain local Ray, with every head process, shut down as dpsweep shuts its own down.
_DRIVER = textwrap.dedent(
    """
    import contextlib
    import json

    import ray
    from ray._private import worker as ray_worker

    from sweeper.driver.ray_backend import _shutdown_ray, ray_session, stop_monitor
    from sweeper.settings import SweeperSettings


    @contextlib.contextmanager
    def plain():
        ray.init(num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1")
        try:
            yield
        finally:
            _shutdown_ray()


    with ray_session(SweeperSettings(), workers=1) if LEAN else plain():
        node = ray_worker._global_node
        pids = {kind: [i.process.pid for i in infos] for kind, infos in node.all_processes.items()}
        monitor = node.all_processes["monitor"][0].process if not LEAN else None
        gcs = node.all_processes["gcs_server"][0].process
        stopped = stop_monitor()
        after = {
            "monitor_exit": monitor.poll() if monitor is not None else None,
            "gcs_alive": gcs.poll() is None,
            "task": ray.get(ray.remote(lambda: 41).remote()) + 1,
            "again": stop_monitor(),
        }
    print(json.dumps({"pids": pids, "stopped": stopped, **after}))
    """
)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _run_driver(*, lean: bool) -> dict[str, Any]:
    """Run :data:`_DRIVER` in a fresh interpreter; what it printed."""
    return _run_fresh(f"LEAN = {lean}\n{_DRIVER}")


def _run_fresh(code: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter on a Ray of its own; the JSON it printed last."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DPSWEEP_RAY_ADDRESS")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def _all_gone(got: dict[str, Any]) -> None:
    """Every process Ray started is gone once the driver has shut it down and exited."""
    pids = [pid for kind in got["pids"].values() for pid in kind]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], got["pids"]


def test_dpsweeps_local_ray_starts_lean_runs_tasks_and_leaves_nothing() -> None:
    got = _run_driver(lean=True)
    assert {"gcs_server", "raylet"} <= set(got["pids"])
    # Neither monitor nor the API server was started: nothing to stop first.
    assert not {"monitor", "log_monitor", "dashboard"} & set(got["pids"]), got["pids"]
    assert got["stopped"] is False and got["again"] is False
    assert got["gcs_alive"] is True and got["task"] == 42
    _all_gone(got)


def test_monitor_stops_first_and_shutdown_leaves_nothing() -> None:
    got = _run_driver(lean=False)
    # The monitor was killed, while the GCS was still up, and the cluster kept working.
    assert got["stopped"] is True
    assert got["monitor_exit"] is not None
    assert got["gcs_alive"] is True
    assert got["task"] == 42
    assert got["again"] is False  # nothing left to stop: the list holds the dead monitor only
    assert {"monitor", "gcs_server", "raylet"} <= set(got["pids"])
    _all_gone(got)


# In a fresh interpreter, with the automatic collector off so that only an explicit collection
# frees cycles: an object ref held in a reference cycle (as a lost node's exception holds its
# traceback's frames, and they the refs) is dropped inside the session. When was it freed?
_CYCLE = textwrap.dedent(
    """
    import gc
    import json
    import weakref

    import ray

    from sweeper.driver.ray_backend import EarlyRay
    from sweeper.settings import SweeperSettings

    gc.disable()
    freed = []
    early = EarlyRay(SweeperSettings(), workers=1)
    early.ready()

    class Holder:
        pass

    holder = Holder()
    holder.ref = ray.put(41)
    holder.itself = holder  # the cycle
    weakref.finalize(holder, lambda: freed.append(ray.is_initialized()))
    del holder
    early.close(wait=False)
    early.close()
    print(json.dumps({"freed": freed, "up_after": ray.is_initialized()}))
    """
)


def test_ray_objects_in_cycles_are_freed_before_ray_shuts_down() -> None:
    # Freed during the shutdown (in another thread, or by a later collection), the ref would
    # call into a stopping core worker, and Ray would end the process with status 1: the
    # two-node cluster test's `dpsweep run` did, after its sweep had finished.
    got = _run_fresh(_CYCLE)
    assert got == {"freed": [True], "up_after": False}, got
