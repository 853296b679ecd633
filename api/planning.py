"""Planning off the request threads: a small process pool, with a cache.

Planning a sweep is CPU-bound Python (dp_accounting builds privacy-loss distributions), from
tens of milliseconds to seconds. Run in the server's own threads it would hold the GIL and
stall every other request, so it runs in spawned processes (spawn, not fork: the server is
multi-threaded). The result is deterministic in the spec and the dataset, so a plan asked for
twice (``POST /sweeps:plan``, then ``POST /sweeps``; or thirty identical submissions at once)
is computed once: concurrent callers share one future.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from dpsweep.spec import SweepSpec
from sweeper.sweeps.create import PreparedSweep, prepare_sweep

CACHE_SIZE = 128


def _init_worker() -> None:
    # One plan per process; the pool gives the parallelism.
    os.environ["DPSWEEP_PLAN_PROCESSES"] = "1"


def _prepare(spec_json: dict[str, Any], dataset: Any, checkpoints_dir: str | None) -> PreparedSweep:
    # A server's plan: model.checkpoint is a registered name, never a path (allow_paths off).
    return prepare_sweep(
        SweepSpec.model_validate(spec_json), dataset=dataset, checkpoints_dir=checkpoints_dir
    )


def _file_stamps(dataset: Any) -> list[list[Any]]:
    """(path, size, mtime, inode) of each file a dataset reads; (path, -1, ...) if missing."""
    stamps: list[list[Any]] = []
    paths = [getattr(dataset, "path", None), getattr(dataset, "labels_path", None)]
    public_eval = getattr(dataset, "eval_dataset", None)
    if public_eval is not None:  # a public evaluation dataset's files count too
        paths += [public_eval.path, public_eval.labels_path]
    # So do the public datasets arms tune on (their best points centre the grids).
    for _, tuning in getattr(dataset, "tune_datasets", ()) or ():
        paths += [tuning.path, tuning.labels_path]
    for path in paths:
        if path:
            try:
                st = os.stat(path)
                stamps.append([str(path), st.st_size, st.st_mtime_ns, st.st_ino])
            except OSError:
                stamps.append([str(path), -1, -1, -1])
    return stamps


class Planner:
    """Plans (with charge schedules) computed in a process pool and cached."""

    def __init__(self, processes: int = 0) -> None:
        self._processes = processes or min(4, os.cpu_count() or 1)
        self._pool: ProcessPoolExecutor | None = None  # started on first use
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Future[PreparedSweep]] = OrderedDict()

    def _submit(
        self, spec_json: dict[str, Any], dataset: Any, checkpoints_dir: str | None
    ) -> Future[PreparedSweep]:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self._processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
            )
        return self._pool.submit(_prepare, spec_json, dataset, checkpoints_dir)

    def prepare(
        self, spec: SweepSpec, *, dataset: Any = None, checkpoints_dir: str | None = None
    ) -> PreparedSweep:
        """The spec's plan and schedules (blocking; call from a worker thread).

        ``checkpoints_dir``: the registered checkpoints ``model.checkpoint`` names (the
        server's ``DPSWEEP_CHECKPOINTS_DIR``); the spec's checkpoint digest, pinned before,
        is part of the cache's key, so changed weights get a new plan.

        Raises:
            ConfigError / InfeasiblePlan: as :func:`sweeper.sweeps.prepare_sweep`.
        """
        spec_json = spec.model_dump(mode="json")
        # The files' identity is part of the key: a data file edited since the last plan gets
        # a new plan (with its new content hash), never the cached one.
        files = _file_stamps(dataset or spec.dataset)
        key = hashlib.sha256(
            json.dumps([spec_json, repr(dataset), files, checkpoints_dir], sort_keys=True).encode()
        ).hexdigest()
        with self._lock:
            fut = self._cache.get(key)
            if fut is None:
                fut = self._submit(spec_json, dataset, checkpoints_dir)
                self._cache[key] = fut
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
        try:
            return fut.result()
        except BaseException:
            # Errors are not cached: the next try plans again (the dataset may be fixed).
            with self._lock:
                if self._cache.get(key) is fut:
                    del self._cache[key]
            raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
