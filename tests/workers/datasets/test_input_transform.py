"""The input transform a kept model carries, on neighbouring datasets.

Privacy: the transform's constants are written into a released model file, so they must not
depend on any private record. Each method runs on two NPZ files that differ in one private
record (features and label changed), and the exported tensors' bytes must be equal:
declared bounds, a pixel format, and robust statistics of a public evaluation dataset. A
carve-out's statistics do depend on the private records (one relabelled record reshuffles
the stratified carve-out), so they are never exported, on either neighbour.

Use: the bare network on the scaled records and :class:`RawInputModel` on the raw records
give the very same outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.numpy import save

from workers.checkpoints import RawInputModel, build_trained, model_info, weights_bytes
from workers.datasets.input_transform import PREFIX, describe, transform_tensors
from workers.datasets.loading import load_dataset
from workers.datasets.raw_records import raw_evaluation_inputs
from workers.datasets.records import DatasetSpec
from workers.models.descriptors import ModelSpec
from workers.models.registry import build_model


def _records(kind: str, seed: int = 0, n: int = 120) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    if kind == "image":
        x = rng.integers(0, 256, size=(n, 1, 4, 4)).astype(np.uint8)
    else:
        x = rng.normal(size=(n, 5)) * [1.0, 10.0, 100.0, 0.1, 3.0] + y[:, None]
    return x, y


def _neighbours(tmp_path: Path, kind: str, train_row: int) -> tuple[str, str]:
    """Two NPZ files that differ in one record (``train_row``: features and label)."""
    x, y = _records(kind)
    a, b = tmp_path / f"{kind}-a.npz", tmp_path / f"{kind}-b.npz"
    np.savez(a, x=x, y=y)
    x2, y2 = x.copy(), y.copy()
    x2[train_row] = x2[train_row] * 7 + (200 if kind == "image" else 1e6)
    y2[train_row] = (y2[train_row] + 1) % 3
    np.savez(b, x=x2, y=y2)
    return str(a), str(b)


def _exported(spec: DatasetSpec) -> bytes:
    tensors = transform_tensors(load_dataset(spec).input_transform)
    return save(tensors) if tensors else b""


def _public_eval(tmp_path: Path) -> DatasetSpec:
    x, y = _records("tabular", seed=9, n=40)
    path = tmp_path / "public.npz"
    np.savez(path, x=x, y=y)
    return DatasetSpec("npz", path=str(path))


@pytest.mark.parametrize("method", ["declared", "pixel", "public-robust"])
def test_an_exported_transform_is_the_same_on_neighbouring_datasets(
    tmp_path: Path, method: str
) -> None:
    kind = "image" if method == "pixel" else "tabular"
    specs = []
    for path in _neighbours(tmp_path, kind, train_row=0):
        spec = DatasetSpec("npz", path=path)
        if method == "declared":
            spec = DatasetSpec("npz", path=path, input_bounds=(-50.0, 50.0))
        elif method == "public-robust":
            spec = DatasetSpec(
                "npz", path=path, evaluation="public", eval_dataset=_public_eval(tmp_path)
            )
        specs.append(spec)
    first, second = (load_dataset(s) for s in specs)
    assert first.input_scaling["method"] == method
    assert first.content_sha256 != second.content_sha256  # the records differ
    exported = [_exported(s) for s in specs]
    assert exported[0] and exported[0] == exported[1]
    assert describe(first.input_transform, first.kind)["in_model_file"] is True


def test_a_carve_outs_statistics_are_never_exported(tmp_path: Path) -> None:
    """The stratified carve-out is reshuffled by one relabelled record, so its medians and
    IQRs differ between neighbours: they stay out of the file on both."""
    stats, exported = [], []
    for path in _neighbours(tmp_path, "tabular", train_row=0):
        data = load_dataset(DatasetSpec("npz", path=path))
        t = data.input_transform
        assert t is not None and t.method == "public-robust" and not t.exportable
        stats.append(np.concatenate([t.centre, t.scale]).tobytes())
        exported.append(transform_tensors(t))
        card = describe(t, data.kind)
        assert card["in_model_file"] is False and "input_bounds" in card["reason"]
        assert not any(isinstance(v, list) for v in card.values())  # no value on the card
    assert stats[0] != stats[1]  # why: they depend on the private records
    assert exported == [{}, {}]


def _model(data: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    torch.manual_seed(0)
    module = build_model(
        ModelSpec("mlp", {}), input_shape=data.input_shape, num_classes=data.num_classes, seed=1
    )
    info = model_info(
        module,
        name="mlp",
        options={},
        input_shape=data.input_shape,
        num_classes=data.num_classes,
        engine_path="packed",
    )
    return module, info


@pytest.mark.parametrize("bounds", [None, (-3.0, 3.0)])
def test_the_kept_file_on_raw_records_computes_what_the_network_did_on_scaled_ones(
    bounds: tuple[float, float] | None,
) -> None:
    spec = DatasetSpec("mnist1d") if bounds is None else DatasetSpec("wine", input_bounds=bounds)
    data = load_dataset(spec)
    module, info = _model(data)
    data_bytes = weights_bytes(module, data.input_transform)
    loaded = build_trained(info, data_bytes)
    assert isinstance(loaded, RawInputModel)
    raw = raw_evaluation_inputs(spec)
    assert raw.shape == data.x_test.shape and not np.array_equal(raw, data.x_test)
    with torch.no_grad():
        want = module.eval()(torch.from_numpy(data.x_test))
        got = loaded(torch.from_numpy(raw))
    assert torch.equal(got, want)
    # The bare network, for the trainer's own checks on scaled records.
    bare = build_trained(info, data_bytes, raw_inputs=False)
    assert not isinstance(bare, RawInputModel)


def test_a_carve_out_model_file_holds_no_statistic() -> None:
    data = load_dataset(DatasetSpec("wine"))
    module, info = _model(data)
    from safetensors.torch import load

    names = set(load(weights_bytes(module, data.input_transform)))
    assert not any(n.startswith(PREFIX) for n in names)
    assert not isinstance(
        build_trained(info, weights_bytes(module, data.input_transform)), RawInputModel
    )
