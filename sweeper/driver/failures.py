"""A failed run as the sweep's owner sees it: a category and a fixed, public reason.

Privacy: a sweep's owner may be an analyst who must receive only differentially private
outputs of the data owner's records (docs/privacy.md). An exception's text is computed from
whatever the code that raised it saw: an out-of-memory message names the bytes it tried to
allocate (which scale with the realised Poisson batch, a function of the private records), a
loading error names the owner's file and its bad rows, a ``ConfigError`` from the schedule
names the number of training records, a plan mismatch names the sample rate the data on disk
implies. None of it is noised, so none of it may leave. What leaves instead is a *category*
(which kind of failure: one of a few fixed names) and a reason chosen by the category alone:
fixed text, with no number, path, shape, size or name from the exception.

Every exception's full text, with its traceback, goes to the Python log of the process that
has it, at ERROR level, for the operator (:func:`log_failure`): the worker's log where the
worker raised it (and, shipped in the pack's ``error`` event, the driver's log: the server log),
the driver's log where the driver raised it. Never to the database, the sweep's events or the
API.

The categories follow :mod:`dpsweep.errors` (see :data:`REASONS`). Every category's reason is
fixed, even for dpsweep's own ``ConfigError`` and ``PlanMismatch``: their messages name values
computed from the records in some cases (the training-record count, the run's sample rate), so
they fail closed too.
"""

from __future__ import annotations

import asyncio
import logging
import re
import traceback
from dataclasses import dataclass

from dpsweep.errors import (
    ConfigError,
    DatasetError,
    DatasetNotFound,
    PrivacyError,
    TrainingError,
)
from workers.plan_check import PlanMismatch

OUT_OF_MEMORY = "out-of-memory"
PLAN_MISMATCH = "plan-mismatch"
PRIVACY_REFUSED = "privacy-refused"
DATA_ERROR = "data-error"
INVALID_CONFIGURATION = "invalid-configuration"
TRAINING_ERROR = "training-error"
CANCELLED = "cancelled"
WORKER_LOST = "worker-lost"
INTERNAL_ERROR = "internal-error"

#: Each category's public reason. Fixed texts: nothing in them comes from an exception, so they
#: say nothing about the records (beyond the category itself: that a run failed, and how).
REASONS: dict[str, str] = {
    OUT_OF_MEMORY: "the trial ran out of memory; lower training.batch_size or the model's size",
    PLAN_MISMATCH: (
        "this run is not the one its privacy budget was reserved for (the data, or the sample "
        "rate, steps, noise, strategy or evaluation it would use, differ from the plan); "
        "nothing was trained. If the data changed on purpose, submit the sweep again so that "
        "it is planned (and charged) for the new data"
    ),
    PRIVACY_REFUSED: (
        "a privacy guarantee could not be established, so the run was refused (fail closed)"
    ),
    DATA_ERROR: "the dataset could not be loaded, or it does not fit the model",
    INVALID_CONFIGURATION: (
        "a setting of the sweep was refused when its trials ran; check its dataset, training, "
        "model and strategy settings against the registry and the datasets you may use"
    ),
    TRAINING_ERROR: (
        "training failed (for example the loss became non-finite); try a lower learning rate "
        "or clipping norm"
    ),
    CANCELLED: "the run was cancelled",
    WORKER_LOST: "the process or machine running it was lost",
    INTERNAL_ERROR: "an unexpected error in dpsweep, the model or the strategy",
}

#: Where the details are: said once, after the reason.
DETAILS = "the operator's server log has the details"

# Messages that say "out of memory" without a dedicated exception class (older torch, the CPU
# allocator, cuBLAS/cuDNN workspaces, MPS). Only *matched*, to choose the category: never shown.
_OOM_TEXT = re.compile(
    r"out of memory|can't allocate memory|cannot allocate memory|_STATUS_ALLOC_FAILED",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class PublicFailure:
    """A failure as the sweep's owner may see it.

    Attributes:
        category: One of :data:`REASONS`' keys, e.g. ``out-of-memory``.
        reason: The category's fixed reason.
    """

    category: str
    reason: str

    @property
    def text(self) -> str:
        """What a trial's or sweep's ``error`` says: the category, its reason, where the
        details are. Example: ``out-of-memory: the trial ran out of memory; lower
        training.batch_size or the model's size (the operator's server log has the
        details)``."""
        return f"{self.category}: {self.reason} ({DETAILS})"


def for_category(category: object) -> PublicFailure:
    """The public failure of ``category`` (an unknown one, or none, is ``internal-error``).

    The driver rebuilds the text from the category a worker reported, so that whatever a worker
    sends, only one of the fixed texts can be stored.
    """
    name = category if isinstance(category, str) and category in REASONS else INTERNAL_ERROR
    return PublicFailure(name, REASONS[name])


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling (at most 16)."""
    out: list[BaseException] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen and len(out) < 16:
        seen.add(id(cur))
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _type_names(exc: BaseException) -> set[str]:
    """The names of ``exc``'s classes (torch's and Ray's are known by name: ``sweeper`` imports
    neither at import time)."""
    return {cls.__name__ for cls in type(exc).__mro__}


def _from_ray(exc: BaseException) -> bool:
    """Whether ``exc`` is one of Ray's own errors (a lost worker, node or object), not a task's
    exception that Ray re-raised (``RayTaskError`` subclasses the task's exception's class)."""
    mro = type(exc).__mro__
    if any(cls.__name__ == "RayTaskError" for cls in mro):
        return False
    return any(cls.__module__.split(".", 1)[0] == "ray" for cls in mro)


def _out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` reports an allocation that failed (its message is only matched)."""
    if isinstance(exc, MemoryError) or "OutOfMemoryError" in _type_names(exc):
        return True
    return isinstance(exc, RuntimeError) and bool(_OOM_TEXT.search(str(exc)))


def classify(exc: BaseException) -> str:
    """The category of ``exc`` (a key of :data:`REASONS`).

    Refusals dpsweep raises on purpose come first (a plan mismatch, a privacy refusal); then an
    allocation failure anywhere in the exception's chain (a loader or a wrapper may have raised
    it on top); then the rest of dpsweep's hierarchy; then Ray's own errors (the worker was
    lost); anything else is ``internal-error``.
    """
    names = _type_names(exc)
    if isinstance(exc, KeyboardInterrupt | asyncio.CancelledError) or (
        "TaskCancelledError" in names and _from_ray(exc)
    ):
        return CANCELLED
    if isinstance(exc, PlanMismatch):
        return PLAN_MISMATCH
    if isinstance(exc, PrivacyError):
        return PRIVACY_REFUSED
    if any(_out_of_memory(e) for e in _chain(exc)):
        return OUT_OF_MEMORY
    if isinstance(exc, DatasetError | DatasetNotFound):
        return DATA_ERROR
    if isinstance(exc, ConfigError):
        return INVALID_CONFIGURATION
    if isinstance(exc, TrainingError):
        return TRAINING_ERROR
    if _from_ray(exc):
        return WORKER_LOST
    return INTERNAL_ERROR


def public_failure(exc: BaseException) -> PublicFailure:
    """``exc`` as its sweep's owner may see it: its category and that category's fixed reason
    (never the exception's text)."""
    return for_category(classify(exc))


def detail(exc: BaseException) -> str:
    """``exc``'s full text with its traceback (and its chain): for the operator's log only."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()


def log_failure(
    logger: logging.Logger, exc: BaseException, what: str, *args: object
) -> PublicFailure:
    """Log ``exc`` in full (text and traceback) at ERROR for the operator, and return what its
    sweep's owner may see instead.

    Args:
        logger: The logger of the process that has the exception (worker or driver).
        exc: The exception.
        what: A %-format message saying what failed (ids, not data), e.g.
            ``"sweep %s: trial(s) %s failed"``; the category is appended.
        *args: Its arguments.

    Returns:
        The public failure.
    """
    failure = public_failure(exc)
    logger.error(
        what + " (%s)", *args, failure.category, exc_info=(type(exc), exc, exc.__traceback__)
    )
    return failure


__all__ = [
    "CANCELLED",
    "DATA_ERROR",
    "DETAILS",
    "INTERNAL_ERROR",
    "INVALID_CONFIGURATION",
    "OUT_OF_MEMORY",
    "PLAN_MISMATCH",
    "PRIVACY_REFUSED",
    "REASONS",
    "TRAINING_ERROR",
    "WORKER_LOST",
    "PublicFailure",
    "classify",
    "detail",
    "for_category",
    "log_failure",
    "public_failure",
]
