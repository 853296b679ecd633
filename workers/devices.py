"""Device choice and CPU threading.

On CPU each trial (pack) gets one thread by default: trials run side by side, one per core, and
several threads per trial would only fight over the cores (see docs/environment.md).
"""

from __future__ import annotations

import os

import torch

from dpsweep.errors import ConfigError

DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when available, else CPU; ``cuda`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu" or name.startswith("cuda"):
        if name.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(
                "device 'cuda' requested but no CUDA GPU is available; use 'auto' or 'cpu'",
                field="device",
            )
        return torch.device(name)
    raise ConfigError(
        f"unknown device {name!r}; choose one of: {', '.join(DEVICES)}", field="device"
    )


def set_threads(threads: int, device: torch.device) -> None:
    """Limit intra-op threads on CPU (process-wide, as torch's setting is)."""
    if threads < 1:
        raise ConfigError("threads must be >= 1", field="threads")
    if device.type == "cpu" and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
