"""Public pre-training at ε 0: a model trained without noise on public records, once, and kept.

A spec's ``model.pretrain_on`` names a dataset declared public (a shared set such as
``mnist1d-public``); the model (all its parameters: what the private grid then trains is the
spec's ``trainable``) is first trained on those records *without privacy* with the recipe in
``model.pretrain`` (:class:`dpsweep.spec_model.PretrainConfig`), and every private trial starts
from the result instead of from its own seed's random weights.

**Privacy.** The pre-training reads the public records only: its inputs are the public dataset,
the model section, the recipe and its public seed, and nothing derived from the private records
(not even their number; only their input shape and class count, public facts of the spec, are
checked to equal the public set's). Its weights are therefore a public input of every DP release
that starts from them, exactly as a random initialisation is: they cost no ε. Randomness comes
from the recipe's public seed (no secret is needed: the records are public), so the weights are
deterministic and can be made again on another machine.

**Once.** The weights are kept in a local cache directory (``DPSWEEP_PRETRAIN_CACHE``, default
``<data cache>/pretrained``) under the sha256 of everything they depend on
(:func:`pretrain_key`): later trials, packs and sweeps read the file; a file lock makes two
workers that need it at once train it once. The file's own digest
(:func:`pretrained_digest`) names the weights in the plan and the model card.

Torch is imported inside the functions that train or load: this module's :class:`PretrainRef`
and :func:`pretrain_ref` are part of the pack spec the sweeper's driver builds without torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpsweep.errors import ConfigError

if TYPE_CHECKING:
    import torch  # deferred: torch-side
    from torch import nn  # deferred: torch-side

    # deferred: off the torch-free import path
    from workers.datasets.records import Dataset, DatasetSpec
    from workers.models.descriptors import ModelSpec  # deferred: off the torch-free import path

#: The field every refusal names.
FIELD = "model.pretrain_on"
#: Bumped when what a key's file holds changes (another loop, another format).
FORMAT = 1
#: The environment variable of the cache directory (WorkerSettings.pretrain_cache).
CACHE_ENV = "DPSWEEP_PRETRAIN_CACHE"
# The pre-training's stream of its public seed (SeedSequence entropy), apart from any trial's.
_STREAM = 52


@dataclass(frozen=True)
class PretrainRef:
    """What a pack's trials start from: the public records, the model, and the recipe.

    Args:
        dataset: the public dataset's worker spec (read with the private data's declared
            bounds and clipping, so that the inputs are scaled as the private trials' are).
        recipe: the non-private recipe (:class:`dpsweep.spec_model.PretrainConfig`'s fields:
            epochs, lr, batch_size, optimizer, momentum, seed).
    """

    dataset: DatasetSpec
    recipe: Mapping[str, Any]


@dataclass(frozen=True)
class Pretrained:
    """Pre-trained weights read from (or just written to) the cache.

    Attributes:
        state: the model's state dict (every parameter and buffer, CPU tensors).
        digest: ``sha256:<hex>`` of the cached safetensors file: the weights' name in the
            plan and the card.
        key: the cache key (:func:`pretrain_key`).
        path: the cached file.
    """

    state: dict[str, torch.Tensor]
    digest: str
    key: str
    path: Path


def cache_dir() -> Path:
    """``$DPSWEEP_PRETRAIN_CACHE``, else ``pretrained`` under the data cache directory."""
    # deferred: off the torch-free import path
    from workers.datasets.data_cache import data_cache_dir
    from workers.settings import WorkerSettings  # deferred: off the torch-free import path

    configured = WorkerSettings().pretrain_cache
    return Path(configured) if configured else data_cache_dir() / "pretrained"


def public_spec(name: str, training: DatasetSpec, *, field: str = FIELD) -> DatasetSpec:
    """The worker spec of the public dataset ``name`` to pre-train on, read with the training
    spec's declared bounds, clipping and split settings.

    A public dataset the sweeper resolved from its catalog travels in ``training``'s
    ``tune_datasets``; otherwise ``name`` must be a shared set whose descriptor declares it
    public (``mnist1d-public``, ``mnist1d-test``).

    Raises:
        ConfigError: (field ``model.pretrain_on``) a name that is not declared public.
    """
    # deferred: off the torch-free import path
    from workers.datasets.descriptors import DATASET_DESCRIPTORS

    # The training dataset's own name is refused at submission (sweeper.sweeps.checks); here
    # ``training`` may be a public tuning set (public pre-tuning trains from the same start).
    resolved = dict(training.tune_datasets or ())
    if name in resolved:
        return resolved[name]
    d = DATASET_DESCRIPTORS.get(name)
    if d is None or not (d.shared and d.public):
        raise ConfigError(
            f"{field} {name!r} is not a dataset declared public; pre-training reads public "
            "records only (a shared set declared public, e.g. mnist1d-public)",
            field=field,
        )
    from workers.datasets.records import DatasetSpec  # deferred: off the torch-free import path

    return DatasetSpec(
        name,
        input_bounds=training.input_bounds,
        feature_clip=training.feature_clip,
        test_fraction=training.test_fraction,
        split_seed=training.split_seed,
    )


def pretrain_ref(model: Any, training: DatasetSpec) -> PretrainRef | None:
    """The pack's :class:`PretrainRef` from the spec's model section (None without
    ``pretrain_on``).

    Raises:
        ConfigError: the dataset is not declared public (:func:`public_spec`).
    """
    name = getattr(model, "pretrain_on", None)
    if not name:
        return None
    recipe = getattr(model, "pretrain", None)
    if recipe is None:
        from dpsweep.spec_model import PretrainConfig  # deferred: off the torch-free import path

        recipe = PretrainConfig()
    return PretrainRef(dataset=public_spec(str(name), training), recipe=recipe.model_dump())


def full_model(model: ModelSpec) -> ModelSpec:
    """The model pre-trained: the same architecture and start, every parameter trained and no
    adapter (what the private grid trains is decided after, by its own ``trainable``)."""
    names = {f.name for f in dataclasses.fields(model)}
    changes: dict[str, Any] = {}
    if "trainable" in names:
        changes["trainable"] = "all"
    if "lora" in names:
        changes["lora"] = None
    return dataclasses.replace(model, **changes)


def pretrain_key(model: ModelSpec, ref: PretrainRef, public: Dataset) -> str:
    """The sha256 (hex) of everything the pre-trained weights depend on: the model (name,
    options, checkpoint digest), the public records' identity and scaling, their shape and
    classes, the recipe, and the versions of torch and of this loop (FORMAT). No private input."""
    import torch  # deferred: torch-side

    checkpoint = getattr(model, "checkpoint", None)
    inputs = {
        "format": FORMAT,
        "torch": torch.__version__,
        "model": {
            "name": model.name,
            "options": model.options,
            "checkpoint": getattr(checkpoint, "digest", None),
        },
        "public": {
            "name": ref.dataset.name,
            "content_sha256": public.content_sha256,
            "input_scaling": public.input_scaling,
            "input_shape": list(public.input_shape),
            "classes": list(public.classes),
        },
        "recipe": dict(ref.recipe),
    }
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def load_public(ref: PretrainRef) -> Dataset:
    """The public records (both parts of their split: every record is public)."""
    from workers.datasets.loading import load_dataset  # deferred: off the torch-free import path

    return load_dataset(ref.dataset)


def check_fits(public: Dataset, private: Any, *, field: str = FIELD) -> None:
    """The public records fit the model the private data shapes: the same input shape, class
    list and vocabulary (a model pre-trained on them must be the trials' model).

    Raises:
        ConfigError: (field ``model.pretrain_on``) what differs, and how to fix it.
    """
    same = (
        tuple(public.input_shape) == tuple(private.input_shape)
        and int(public.num_classes) == int(private.num_classes)
        and list(public.classes) == list(private.classes)
        and public.vocab_size == getattr(private, "vocab_size", None)
    )
    if not same:
        raise ConfigError(
            f"{field} {public.name!r}: its records do not fit the model the training data "
            f"shapes (input shape {tuple(public.input_shape)} and classes "
            f"{list(public.classes)}, against {tuple(private.input_shape)} and "
            f"{list(private.classes)}); pre-train on public records of the same shape and classes",
            field=field,
        )


def pretrained(model: ModelSpec, ref: PretrainRef, *, public: Dataset | None = None) -> Pretrained:
    """The pre-trained weights of ``model`` on ``ref``: read from the cache, else trained once
    (under a file lock, so that workers needing them at once train them once) and cached.

    Raises:
        ConfigError: the model is not a classifier, or the recipe cannot train it.
    """
    from workers.models.registry import model_task  # deferred: off the torch-free import path

    if model_task(model.name) != "classification":
        raise ConfigError(
            f"{FIELD}: pre-training trains classifiers; model {model.name!r} is not one",
            field=FIELD,
        )
    model = full_model(model)
    public = public if public is not None else load_public(ref)
    key = pretrain_key(model, ref, public)
    path = cache_dir() / f"{key}.safetensors"
    read = _read(path, key)
    if read is not None:
        return read
    with _locked(path.with_suffix(".lock")):
        read = _read(path, key)  # another worker may have made it while we waited
        if read is not None:
            return read
        state = train_public(model, public, ref.recipe)
        _write(path, state, key)
    made = _read(path, key)
    if made is None:  # an unwritable cache: use the weights made here, named by their bytes
        from safetensors.torch import save  # deferred: torch-side

        blob = save(state, metadata={"key": key})
        return Pretrained(state, f"sha256:{hashlib.sha256(blob).hexdigest()}", key, path)
    return made


def pretrained_digest(
    model: Any, training: DatasetSpec, *, allow_checkpoint_paths: bool = False
) -> str | None:
    """``sha256:<hex>`` of the weights a spec's trials start from (made if not cached), for the
    plan and the model card beside the public dataset's name; None without ``pretrain_on``.
    Costs no ε: public records only.

    Args:
        model: the spec's model section (:class:`dpsweep.spec_model.ModelConfig`) or the
            worker's :class:`~workers.models.descriptors.ModelSpec` (a checkpoint resolved).
        training: the training dataset's resolved worker spec (its declared scaling settings
            and the public sets the sweeper resolved from its catalog).
        allow_checkpoint_paths: ``model.checkpoint`` may be a path (the local command line).

    Raises:
        ConfigError: the dataset is not declared public, or the model cannot be pre-trained.
    """
    ref = pretrain_ref(model, training)
    if ref is None:
        return None
    return pretrained(_worker_model(model, allow_paths=allow_checkpoint_paths), ref).digest


def _worker_model(model: Any, *, allow_paths: bool) -> ModelSpec:
    """The worker's model spec of a spec's model section, a checkpoint resolved as the pack's
    model is (:func:`workers.models.pretrained_descriptors.model_spec`)."""
    from workers.models.descriptors import ModelSpec  # deferred: off the torch-free import path

    if isinstance(model, ModelSpec):
        return model
    if getattr(model, "checkpoint", None) is None:
        return ModelSpec(model.name, dict(model.options))
    # deferred: off the torch-free import path
    from workers.models.pretrained_descriptors import model_spec
    from workers.settings import WorkerSettings  # deferred: off the torch-free import path

    settings = WorkerSettings()
    return model_spec(model, checkpoints_dir=settings.checkpoints_dir, allow_paths=allow_paths)


def _read(path: Path, key: str) -> Pretrained | None:
    from safetensors import SafetensorError  # deferred: torch-side
    from safetensors.torch import load  # deferred: torch-side

    try:
        blob = path.read_bytes()
        state = load(blob)
    except (OSError, SafetensorError):
        return None
    return Pretrained(state, f"sha256:{hashlib.sha256(blob).hexdigest()}", key, path)


def _write(path: Path, state: dict[str, torch.Tensor], key: str) -> None:
    """Atomically (a temporary file, then a rename); an unwritable cache only costs a retrain."""
    from safetensors.torch import save  # deferred: torch-side

    blob = save(state, metadata={"key": key})
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
            tmp = f.name
            f.write(blob)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


@contextlib.contextmanager
def _locked(lock: Path) -> Iterator[None]:
    """An exclusive lock on ``lock`` (fcntl; none where the directory cannot be written)."""
    import fcntl  # deferred: POSIX, the cache lock only

    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock, "a+b")  # noqa: SIM115 - held for the with-block below
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _seed(seed: int, what: str) -> int:
    import numpy as np  # deferred: numpy, pre-training only

    tag = {"init": 0, "order": 1}[what]
    ss = np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, _STREAM, tag])
    return int(ss.generate_state(1, dtype=np.uint64)[0] & 0x7FFFFFFFFFFFFFFF)


def train_public(
    model: ModelSpec, public: Dataset, recipe: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """Train ``model`` without noise on every public record (both parts of their split): a
    plain minibatch loop, deterministic given the recipe's public seed (one CPU thread, so that
    the sums are taken in one order)."""
    import numpy as np  # deferred: numpy, pre-training only
    import torch  # deferred: torch-side
    import torch.nn.functional as F  # deferred: torch-side

    from workers.models.registry import build_model  # deferred: off the torch-free import path

    x = torch.from_numpy(np.concatenate([public.x_train, public.x_test])).float()
    y = torch.from_numpy(np.concatenate([public.y_train, public.y_test])).long()
    seed = int(recipe.get("seed", 0))
    net = build_model(
        model,
        input_shape=tuple(public.input_shape),
        num_classes=int(public.num_classes),
        seed=_seed(seed, "init"),
    )
    optimizer = _optimizer(net, recipe)
    batch = max(1, min(int(recipe["batch_size"]), len(y)))
    steps = max(1, math.ceil(float(recipe["epochs"]) * len(y) / batch))
    order = torch.Generator().manual_seed(_seed(seed, "order"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        net.train()
        for idx in _batches(len(y), batch, steps, order):
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(x[idx]), y[idx])
            if not torch.isfinite(loss):
                raise ConfigError(
                    f"pre-training diverged (loss {loss.item()}); lower model.pretrain.lr",
                    field="model.pretrain.lr",
                )
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return {k: v.detach().cpu().contiguous().clone() for k, v in net.state_dict().items()}


def _optimizer(net: nn.Module, recipe: Mapping[str, Any]) -> torch.optim.Optimizer:
    import torch  # deferred: torch-side

    params = [p for p in net.parameters()]
    for p in params:
        p.requires_grad_(True)  # every parameter is pre-trained (public data, no privacy)
    lr = float(recipe["lr"])
    if recipe.get("optimizer", "sgd") == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=float(recipe.get("momentum", 0.0)))


def _batches(n: int, batch: int, steps: int, order: torch.Generator) -> Iterator[torch.Tensor]:
    """``steps`` minibatches of ``batch`` indices: epochs of a seeded permutation, the last
    partial batch of each epoch dropped (every batch the same size)."""
    import torch  # deferred: torch-side

    done = 0
    while True:
        perm = torch.randperm(n, generator=order)
        for start in range(0, n - batch + 1, batch):
            yield perm[start : start + batch]
            done += 1
            if done == steps:
                return


def _plain_name(name: str) -> str:
    """A parameter's name without what adapters add (peft's prefix and ``base_layer``)."""
    for prefix in ("base_model.model.",):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name.replace(".base_layer.", ".")


def load_pretrained(
    modules: Sequence[nn.Module], ref: PretrainRef | None, model: ModelSpec, data: Any
) -> None:
    """Start every trial's module from the pre-trained weights (the hook of the pack's model
    builder): each tensor of the same name and shape is copied; one that differs (a head
    resized for other classes) keeps the trial's own initialisation from its public seed.
    Nothing happens without ``ref``.

    Args:
        modules: the trials' freshly built modules (what is trainable already set).
        ref: the pack's :class:`PretrainRef`, or None.
        model: the pack's model spec.
        data: the loaded private dataset: only its input shape and classes are read.

    Raises:
        ConfigError: the public records do not fit the model (:func:`check_fits`), or no
            tensor of the pre-trained model matches the trials' model.
    """
    if ref is None:
        return
    import torch  # deferred: torch-side

    public = load_public(ref)
    check_fits(public, data)
    state = pretrained(model, ref, public=public).state
    for module in modules:
        copied = 0
        with torch.no_grad():
            for name, tensor in module.state_dict(keep_vars=True).items():
                source = state.get(_plain_name(name))
                if source is not None and tuple(source.shape) == tuple(tensor.shape):
                    tensor.copy_(source.to(tensor.device, tensor.dtype))
                    copied += 1
        if copied == 0:
            raise ConfigError(
                f"{FIELD}: no weight of the pre-trained model fits the trials' model",
                field=FIELD,
            )


__all__ = [
    "CACHE_ENV",
    "FIELD",
    "PretrainRef",
    "Pretrained",
    "cache_dir",
    "check_fits",
    "full_model",
    "load_pretrained",
    "pretrain_key",
    "pretrain_ref",
    "pretrained",
    "pretrained_digest",
    "public_spec",
    "train_public",
]
