"""ONNX export of the built-in architectures (the optional ``onnx`` extra).

Each registered architecture goes the way a kept model does: card ``model`` section and
safetensors weights, :func:`export_trained`, then the file runs in ONNX's own pure-Python
reference evaluator (no onnxruntime, no torch) at batch sizes other than the export's, and
matches the torch module within 1e-4. The legacy ``torchscript`` exporter needs only ``onnx``;
the ``dynamo`` one also ``onnxscript`` (and is slower, so its sweep is marked slow).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from dpsweep.errors import ConfigError
from tests.workers.test_checkpoints import CLASSES, case, inputs
from workers.checkpoints import build_trained, model_info, weights_bytes
from workers.models.descriptors import DESCRIPTORS
from workers.models.pretrained_descriptors import CHECKPOINT_MODELS
from workers.models.registry import build_model, model_names
from workers.onnx_export import (
    INPUT_NAME,
    OUTPUT_NAME,
    export_onnx,
    export_trained,
    resolve_exporter,
)

pytestmark = [
    # Tracing notes on shape arithmetic that is constant for a fixed example shape (the
    # outputs at other batch sizes are checked below), and torch's own deprecation notices.
    pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


def has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


EXPORTERS = [
    pytest.param("torchscript", id="torchscript"),
    pytest.param(
        "dynamo",
        id="dynamo",
        marks=[
            pytest.mark.slow,
            pytest.mark.skipif(not has("onnxscript"), reason="onnxscript is not installed"),
        ],
    ),
]


def run_onnx(path: Path, x: Tensor) -> np.ndarray:
    onnx = pytest.importorskip("onnx", reason="ONNX export needs the onnx extra")
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(path))
    assert [i.name for i in model.graph.input] == [INPUT_NAME]
    assert [o.name for o in model.graph.output] == [OUTPUT_NAME]
    (out,) = ReferenceEvaluator(model).run(None, {INPUT_NAME: x.numpy()})
    return np.asarray(out)


@pytest.mark.parametrize("exporter", EXPORTERS)
# A checkpoint model (hf, timm, torchvision) needs its checkpoint: test_pretrained.py.
@pytest.mark.parametrize("name", [n for n in model_names() if n not in CHECKPOINT_MODELS])
def test_exported_builtin_matches_torch(name: str, exporter: str, tmp_path: Path) -> None:
    pytest.importorskip("onnx", reason="ONNX export needs the onnx extra")
    spec, shape = case(name)
    module = build_model(spec, input_shape=shape, num_classes=CLASSES, seed=0)
    info = json.loads(
        json.dumps(
            model_info(
                module,
                name=name,
                options=spec.options,
                input_shape=shape,
                num_classes=CLASSES,
                engine_path="packed",
            )
        )
    )
    data = weights_bytes(module)
    path = export_trained(info, data, tmp_path / f"{name}.onnx", exporter=exporter)  # type: ignore[arg-type]
    # One self-contained file (no external weights beside it).
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{name}.onnx"]
    trained = build_trained(info, data)
    x = inputs(name, shape, n=5)
    if DESCRIPTORS[name].input_kind == "tokens":
        assert x.dtype == torch.int64
    # Batch sizes other than the export's example (2): the batch axis is dynamic.
    for batch in (x, x[:1]):
        with torch.no_grad():
            expected = trained(batch).numpy()
        got = run_onnx(path, batch)
        assert got.shape == expected.shape, name
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=name)


def test_export_onnx_leaves_the_module_as_it_was(tmp_path: Path) -> None:
    pytest.importorskip("onnx", reason="ONNX export needs the onnx extra")
    module = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).train()
    before = [p.detach().clone() for p in module.parameters()]
    path = export_onnx(
        module, input_shape=(4,), path=tmp_path / "sub" / "m.onnx", exporter="torchscript"
    )
    assert path.is_file() and module.training
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))
    x = torch.randn(3, 4)
    with torch.no_grad():
        np.testing.assert_allclose(run_onnx(path, x), module(x).numpy(), rtol=1e-4, atol=1e-4)


class Spectral(nn.Module):
    """Singular values of a 2x2 map per example: no ONNX operator computes an SVD."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        return torch.linalg.svd(self.lin(x).view(-1, 2, 2)).S


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_an_architecture_that_does_not_export_is_named(exporter: str, tmp_path: Path) -> None:
    pytest.importorskip("onnx", reason="ONNX export needs the onnx extra")
    path = tmp_path / "spectral.onnx"
    with pytest.raises(ConfigError, match="model 'spectral' cannot be exported to ONNX") as err:
        export_onnx(
            Spectral(),
            input_shape=(4,),
            path=path,
            exporter=exporter,  # type: ignore[arg-type]
            name="spectral",
        )
    assert "\x1b" not in str(err.value) and "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    pytest.importorskip("onnx", reason="ONNX export needs the onnx extra")
    module = nn.Linear(4, 2)
    with pytest.raises(ConfigError, match="input_shape"):
        export_onnx(module, input_shape=(), path=tmp_path / "a.onnx")
    with pytest.raises(ConfigError, match="input_shape"):
        export_onnx(module, input_shape=(0,), path=tmp_path / "a.onnx")
    with pytest.raises(ConfigError, match="input_dtype"):
        export_onnx(module, input_shape=(4,), path=tmp_path / "a.onnx", input_dtype="float16")
    with pytest.raises(ConfigError, match="exporter"):
        resolve_exporter("tflite")  # type: ignore[arg-type]
    expected = "dynamo" if has("onnxscript") else "torchscript"
    assert resolve_exporter("auto") == expected


def test_missing_packages_say_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A None entry in sys.modules is how Python itself marks a module as not importable.
    monkeypatch.setitem(sys.modules, "onnx", None)
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    module = nn.Linear(4, 2)
    for exporter in ("auto", "torchscript", "dynamo"):
        with pytest.raises(ConfigError, match=r"install dpsweep\[onnx\]"):
            export_onnx(module, input_shape=(4,), path=tmp_path / "m.onnx", exporter=exporter)  # type: ignore[arg-type]
    info = {"name": "logreg", "options": {}, "input_shape": [4], "num_classes": 2}
    with pytest.raises(ConfigError, match=r"install dpsweep\[onnx\]"):
        export_trained(info, b"", tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


def test_dynamo_without_onnxscript_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("onnx", reason="ONNX export needs the onnx extra")
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    assert resolve_exporter("auto") == "torchscript"
    with pytest.raises(ConfigError, match="onnxscript"):
        export_onnx(nn.Linear(4, 2), input_shape=(4,), path=tmp_path / "m.onnx", exporter="dynamo")
