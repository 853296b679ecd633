"""Optional ONNX export of a trained model (the ``onnx`` extra: ``pip install dpsweep[onnx]``).

A kept model is a plain ``nn.Module`` (:func:`workers.checkpoints.build_trained`); this writes
it as one self-contained ``.onnx`` file (weights inside) whose batch dimension is dynamic, so
it runs in any ONNX runtime without torch or dpsweep. The weights are the trial's DP release,
so exporting them is post-processing: no privacy cost.

Two torch exporters exist, and either is used:

* ``dynamo`` (torch's default since 2.9): ``torch.export`` plus ONNX Script; needs the
  ``onnx`` and ``onnxscript`` packages.
* ``torchscript``, the legacy tracing exporter: needs only ``onnx`` (deprecated by torch but
  still shipped, and it exports every built-in architecture).

``exporter="auto"`` takes ``dynamo`` when ``onnxscript`` is installed and ``torchscript``
otherwise, so the extra needs only ``onnx``. Both give the same outputs (within float
rounding).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from dpsweep.errors import ConfigError
from workers.checkpoints import build_trained
from workers.factories import is_factory_name
from workers.models.descriptors import DESCRIPTORS, get_model_descriptor

Exporter = Literal["auto", "dynamo", "torchscript"]

#: The graph's input and output names (what a runtime is fed and returns).
INPUT_NAME = "input"
OUTPUT_NAME = "output"

_INSTALL = "install dpsweep[onnx] (pip install 'dpsweep[onnx]')"


def onnx_available() -> bool:
    """Whether ONNX export can run here (the ``onnx`` package is installed)."""
    return importlib.util.find_spec("onnx") is not None


def resolve_exporter(exporter: Exporter = "auto") -> Literal["dynamo", "torchscript"]:
    """The exporter ``exporter`` names, after checking its packages are installed.

    Raises:
        ConfigError: ``onnx`` (or, for ``dynamo``, ``onnxscript``) is not installed, or an
            unknown exporter name.
    """
    if exporter not in ("auto", "dynamo", "torchscript"):
        raise ConfigError(
            f"exporter must be auto, dynamo or torchscript; got {exporter!r}", field="exporter"
        )
    if not onnx_available():
        raise ConfigError(f"ONNX export needs the onnx package: {_INSTALL}", field="format")
    has_script = importlib.util.find_spec("onnxscript") is not None
    if exporter == "dynamo" and not has_script:
        raise ConfigError(
            "the dynamo ONNX exporter needs the onnxscript package (pip install onnxscript); "
            "exporter='torchscript' needs only onnx",
            field="exporter",
        )
    if exporter == "auto":
        return "dynamo" if has_script else "torchscript"
    return exporter


def export_onnx(
    module: nn.Module,
    *,
    input_shape: Sequence[int],
    path: str | Path,
    input_dtype: torch.dtype | str = torch.float32,
    exporter: Exporter = "auto",
    name: str | None = None,
) -> Path:
    """Write ``module`` (in eval mode) to ``path`` as an ONNX model with a dynamic batch axis.

    Args:
        module: the trained model (e.g. from :func:`workers.checkpoints.build_trained`).
        input_shape: one example's shape (the model card's ``input_shape``), without batch.
        path: the ``.onnx`` file to write (its folder is created).
        input_dtype: the input's dtype: ``float32``, or ``int64`` for token ids.
        exporter: ``auto``, ``dynamo`` or ``torchscript`` (module docstring).
        name: the architecture's name, for error messages (default: the module's class).

    Returns:
        The written file. Its graph takes ``input`` ``[batch, *input_shape]`` and returns
        ``output`` ``[batch, ...]``.

    Raises:
        ConfigError: the onnx packages are missing ("install dpsweep[onnx]"), a bad input
            shape or dtype, or the architecture cannot be exported (the message names it).
    """
    which = resolve_exporter(exporter)
    shape = _check_shape(input_shape)
    dtype = _check_dtype(input_dtype)
    label = name or type(module).__name__
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    param = next(iter(module.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    # Batch 2, not 1: an exporter may treat a size-1 dimension as a constant.
    example = torch.zeros((2, *shape), dtype=dtype, device=device)
    # Written under a temporary name and renamed once checked: a failed export leaves no
    # half-written file and keeps whatever was at ``path`` before.
    tmp = out.with_name(f".{out.name}.partial")
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            _export(module, example, tmp, which)
        import onnx  # optional extra [onnx]

        onnx.checker.check_model(str(tmp))
        tmp.replace(out)
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(
            f"model {label!r} cannot be exported to ONNX ({which} exporter): "
            f"{type(exc).__name__}: {_first_line(exc)}",
            field="model",
        ) from exc
    finally:
        module.train(was_training)
    return out


def export_trained(
    info: dict[str, Any], data: bytes, path: str | Path, *, exporter: Exporter = "auto"
) -> Path:
    """Rebuild a kept model from its card's ``model`` section and weights, and export it.

    Token models (input kind ``tokens``) take ``int64`` ids; every other model ``float32``.

    Raises:
        ConfigError: as :func:`export_onnx` and :func:`workers.checkpoints.build_trained`.
    """
    resolve_exporter(exporter)  # a missing package is reported before any model is built
    name = str(info["name"])
    if is_factory_name(name) and name not in DESCRIPTORS:
        # Never imported from here: a card is data, and its name must not run code. The local
        # command line registers its own factories (workers.factories.load_factory) first.
        raise ConfigError(
            f"model {name!r} is a local module:function factory that is not loaded in this "
            "process; `dpsweep model TRIAL --onnx` loads it (its module must be importable: "
            "installed, or on PYTHONPATH)",
            field="model",
        )
    kind = get_model_descriptor(name).input_kind
    return export_onnx(
        build_trained(info, data),
        input_shape=[int(d) for d in info["input_shape"]],
        path=path,
        input_dtype=torch.int64 if kind == "tokens" else torch.float32,
        exporter=exporter,
        name=name,
    )


def onnx_model_bytes(info: dict[str, Any], data: bytes, *, exporter: Exporter = "auto") -> bytes:
    """:func:`export_trained` into a temporary folder, returning the file's bytes: a caller
    that writes several files exports first and writes nothing when the export fails.

    Raises:
        ConfigError: as :func:`export_trained` (a missing package, an architecture that does
            not export: each says so in one line).
    """
    with tempfile.TemporaryDirectory(prefix="dpsweep-onnx-") as tmp:
        path = export_trained(info, data, Path(tmp) / "model.onnx", exporter=exporter)
        return path.read_bytes()


def _export(module: nn.Module, example: torch.Tensor, out: Path, which: str) -> None:
    names: dict[str, Any] = {"input_names": [INPUT_NAME], "output_names": [OUTPUT_NAME]}
    if which == "dynamo":
        torch.onnx.export(
            module,
            (example,),
            str(out),
            dynamo=True,
            dynamic_shapes=({0: torch.export.Dim("batch")},),
            # One self-contained file (the built-ins are far below protobuf's 2 GB limit).
            external_data=False,
            verbose=False,
            **names,
        )
        return
    with warnings.catch_warnings(), _quiet_stdout():
        # Chosen on purpose (it needs no onnxscript); torch's deprecation notice is noise here.
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        warnings.filterwarnings("ignore", message=".*feature will be removed.*")
        torch.onnx.export(
            module,
            (example,),
            str(out),
            dynamo=False,
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            **names,
        )


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Silence file descriptor 1 for the legacy exporter: on an operator it cannot export it
    dumps the whole TorchScript graph to the process's stdout from C++ (whatever Python's
    ``sys.stdout`` is), burying the one-line error the caller reports."""
    try:
        fd = sys.stdout.fileno() if sys.stdout is not None else 1
    except (AttributeError, OSError, ValueError):
        fd = 1  # a captured sys.stdout (a test's): the C++ output still goes to fd 1
    if sys.stdout is not None:
        sys.stdout.flush()
    try:
        saved = os.dup(fd)
    except OSError:  # no stdout at all: nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), fd)
            yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def _first_line(exc: Exception, limit: int = 300) -> str:
    """The exporter's message without its terminal colours, first line, at most ``limit``."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _check_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in input_shape)
    except (TypeError, ValueError):
        shape = ()
    if not shape or any(d < 1 for d in shape):
        raise ConfigError(
            f"input_shape must be one example's positive dimensions; got {input_shape!r}",
            field="input_shape",
        )
    return shape


def _check_dtype(input_dtype: torch.dtype | str) -> torch.dtype:
    allowed = {"float32": torch.float32, "int64": torch.int64}
    dtype = allowed.get(input_dtype) if isinstance(input_dtype, str) else input_dtype
    if dtype not in allowed.values():
        raise ConfigError(
            f"input_dtype must be float32 or int64 (token ids); got {input_dtype!r}",
            field="input_dtype",
        )
    assert dtype is not None
    return dtype


__all__ = [
    "INPUT_NAME",
    "OUTPUT_NAME",
    "Exporter",
    "export_onnx",
    "export_trained",
    "onnx_available",
    "onnx_model_bytes",
    "resolve_exporter",
]
