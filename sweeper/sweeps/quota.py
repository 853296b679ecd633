"""The bytes each tenant keeps in the artifact store, against its quota.

Two checks hold the quota (``DPSWEEP_ARTIFACT_QUOTA_MB``, per tenant; none by default):

* **at creation** (:func:`check_quota`, called by :func:`sweeper.sweeps.create.create_sweep`
  before anything is stored or reserved): the most the sweep could keep (:func:`kept_models`
  models of :func:`estimate_model_bytes` each) must fit beside what the tenant already keeps,
  else the sweep is refused with :class:`~dpsweep.errors.QuotaExceeded` (HTTP 422);
* **at write time** (:func:`sweeper.artifacts.keeper.flush_staged`): a model that would take the
  tenant over is not kept. This one is exact, and also covers sweeps created at the same time
  (the creation check counts only models already written).

Everything here is public: a model's size follows from its architecture and the dataset's input
shape and classes (which its card shows anyway), and the count from the spec. Torch is imported
only to build the model for the estimate.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from dpsweep.errors import QuotaExceeded
from sweeper.datasets.resolution import resolve
from sweeper.settings import SweeperSettings
from sweeper.store.artifact_files import quota_bytes, usage_bytes
from workers.datasets.input_transform import transform_tensors
from workers.datasets.loading import load_dataset
from workers.models import model_spec as resolve_model_spec
from workers.strategies import get_descriptor

#: Room for the model card beside each model (a card is a few KB of JSON).
CARD_ALLOWANCE_BYTES = 12 * 1024

MB = 2**20


def kept_models(spec: Any, keep: str | None = None) -> int:
    """The most models a :class:`dpsweep.spec.SweepSpec` keeps under ``keep`` (default: its
    ``artifacts.keep``).

    ``best_per_grid``: one per grid (arm x ε level); ``all``: every planned trial of each grid
    (a papernot-steinke grid still keeps its selected trial only); ``none``: 0. Arms of a
    non-private strategy keep nothing (their models are not a DP release).
    """
    keep = keep or spec.artifacts.keep
    if keep == "none":
        return 0
    selected_only = spec.privacy.accounting == "papernot-steinke"
    total = 0
    for arm in spec.arms:
        if not get_descriptor(arm.strategy).private:
            continue
        if keep == "best_per_grid" or selected_only:
            per_grid = 1
        else:
            # As sweeper.sweeps.create plans them: each configuration once per seed.
            configs = len(arm.points()) if spec.search.method == "grid" else int(spec.search.n or 0)
            per_grid = configs * spec.seeds
        total += per_grid * len(spec.privacy.budgets)
    return total


def estimate_model_bytes(
    spec: Any,
    *,
    data: Any = None,
    dataset: Any = None,
    checkpoints_dir: str | None = None,
    allow_paths: bool = False,
) -> int:
    """The bytes one kept model of ``spec`` takes: its safetensors file and its card.

    The spec's model is built once with the registry on the dataset's input shape and classes
    (as the workers build it, a token model's vocabulary size included), and its state dict
    measured: float32 tensors, the safetensors header, and :data:`CARD_ALLOWANCE_BYTES`.

    Args:
        spec: The :class:`dpsweep.spec.SweepSpec`.
        data: The loaded :class:`workers.datasets.Dataset` (anything with ``input_shape``,
            ``num_classes`` and ``vocab_size``), when the caller has it.
        dataset: Else the worker :class:`~workers.datasets.DatasetSpec` to load (a resolved
            upload or name, :func:`sweeper.datasets.resolution.resolve`); default: the spec's
            dataset resolved without a catalog, as :func:`sweeper.sweeps.planning.plan_sweep`.
        checkpoints_dir: The registered checkpoints ``model.checkpoint`` names (default:
            ``DPSWEEP_CHECKPOINTS_DIR``); the model is built from its checkpoint, LoRA's
            adapters included, as a trial builds it.
        allow_paths: ``model.checkpoint`` may be a path (the local command line only).

    Raises:
        ConfigError: the model cannot be built for the data (as a trial would fail).
    """
    from sweeper.sweeps.checkpoints import configured_checkpoints_dir  # deferred: not at import
    from workers.checkpoints import parameter_bytes  # deferred: torch, for the estimate only
    from workers.models.registry import build_model  # deferred: torch
    from workers.training.prepare import with_data_vocab  # deferred: torch

    if data is None:
        data = load_dataset(dataset or resolve(None, spec.dataset, spec.eval))
    model = resolve_model_spec(
        spec.model,
        checkpoints_dir=configured_checkpoints_dir(checkpoints_dir),
        allow_paths=allow_paths,
    )
    model_spec = with_data_vocab(model, data.vocab_size)
    module = build_model(
        model_spec,
        input_shape=tuple(data.input_shape),
        num_classes=int(data.num_classes),
        seed=0,
    )
    # The file also carries the input transform when it may leave (float64 tensors).
    transform = transform_tensors(getattr(data, "input_transform", None))
    # In the file's order: the widest dtype first, then by name (safetensors' layout).
    state: dict[str, Any] = dict(sorted(transform.items())) | dict(
        sorted(module.state_dict().items())
    )
    extra = sum(int(t.nbytes) for t in transform.values())
    return parameter_bytes(module) + extra + _header_bytes(state) + CARD_ALLOWANCE_BYTES


def _header_bytes(state: dict[str, Any]) -> int:
    """The safetensors header of ``state``: an 8-byte length, then JSON naming each tensor's
    dtype, shape and offsets (and the metadata), padded to 8 bytes."""
    header: dict[str, Any] = {
        "__metadata__": {"format": "pt", "producer": "dpsweep"},
    }
    offset = 0
    for name, t in state.items():
        end = offset + int(t.nbytes)  # a torch tensor's or a numpy array's
        dtype = "F64" if str(t.dtype).endswith("float64") else "F32"
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header, separators=(",", ":"))
    return 8 + len(text.encode()) + 8


def configured_quota_bytes(quota_mb: float | None = None) -> int | None:
    """The quota in bytes: ``quota_mb`` if given, else the settings'
    (``DPSWEEP_ARTIFACT_QUOTA_MB``); None: no limit."""
    if quota_mb is None:
        quota_mb = SweeperSettings().artifact_quota_mb
    return quota_bytes(quota_mb)


def estimate_if_limited(spec: Any, *, dataset: Any = None, **where: Any) -> int | None:
    """:func:`estimate_model_bytes` when a quota is configured and the spec keeps models, else
    None (no torch import, no load: the default deployment has no quota). ``where``: the
    checkpoint's ``checkpoints_dir`` and ``allow_paths``, as :func:`estimate_model_bytes`."""
    if spec.artifacts.keep == "none" or configured_quota_bytes() is None:
        return None
    return estimate_model_bytes(spec, dataset=dataset, **where)


def check_quota(
    session_or_engine: Session | Engine,
    owner: str | None,
    spec: Any,
    quota_bytes: int | None,
    *,
    model_bytes: int | None = None,
    dataset: Any = None,
    checkpoints_dir: str | None = None,
    allow_paths: bool = False,
) -> None:
    """Refuse a sweep whose kept models could take ``owner`` over ``quota_bytes``.

    Args:
        session_or_engine: Where the tenant's kept models are counted.
        owner: The tenant (None: the local one).
        spec: The :class:`dpsweep.spec.SweepSpec`.
        quota_bytes: The quota (None: no limit; nothing is checked).
        model_bytes: One model's :func:`estimate_model_bytes`, when already known (the API
            computes it with the plan, off its request threads); else it is computed here.
        dataset: The resolved dataset for the estimate (see :func:`estimate_model_bytes`).
        checkpoints_dir: As :func:`estimate_model_bytes`.
        allow_paths: As :func:`estimate_model_bytes`.

    Raises:
        QuotaExceeded: what the tenant keeps plus this sweep's most would exceed the quota
            (field ``artifacts.keep``; the message says how to fix it).
    """
    if quota_bytes is None:
        return
    count = kept_models(spec)
    if count == 0:
        return
    if model_bytes is None:
        if dataset is None:
            # Uploads and registered names are looked up in the catalog, as for the plan.
            bind = (
                session_or_engine.get_bind()
                if isinstance(session_or_engine, Session)
                else session_or_engine
            )
            engine = bind if isinstance(bind, Engine) else bind.engine
            dataset = resolve(engine, spec.dataset, spec.eval)
        model_bytes = estimate_model_bytes(
            spec, dataset=dataset, checkpoints_dir=checkpoints_dir, allow_paths=allow_paths
        )
    if isinstance(session_or_engine, Session):
        used = usage_bytes(session_or_engine, owner)
    else:
        with Session(session_or_engine) as session:
            used = usage_bytes(session, owner)
    needed = count * model_bytes
    if used + needed <= quota_bytes:
        return
    fixes = []
    if spec.artifacts.keep == "all":
        best = kept_models(spec, "best_per_grid")
        fixes.append(
            f"keep fewer models (artifacts: {{keep: best_per_grid}} keeps {best}, "
            f"about {_mb(best * model_bytes)})"
        )
    fixes += [
        "keep none (artifacts: {keep: none})",
        "delete sweeps whose models you no longer need (`dpsweep delete SWEEP_ID`, or "
        "DELETE /api/v1/sweeps/{id})",
        "or have the operator raise DPSWEEP_ARTIFACT_QUOTA_MB",
    ]
    raise QuotaExceeded(
        f"the models this sweep keeps (artifacts.keep: {spec.artifacts.keep}) would exceed "
        f"the quota of kept models: up to {count} model(s) of about {_mb(model_bytes)} each "
        f"({_mb(needed)}), beside the {_mb(used)} already kept, against a quota of "
        f"{_mb(quota_bytes)}. Nothing was reserved. To fix: " + "; ".join(fixes),
        field="artifacts.keep",
    )


def _mb(n: int) -> str:
    """Bytes for a message: MB, KB under a megabyte, bytes under a kilobyte."""
    if n >= MB:
        return f"{n / MB:.2f} MB"
    return f"{n / 1024:.1f} KB" if n >= 1024 else f"{n} bytes"


__all__ = [
    "CARD_ALLOWANCE_BYTES",
    "check_quota",
    "configured_quota_bytes",
    "estimate_if_limited",
    "estimate_model_bytes",
    "kept_models",
]
