"""One Opacus DP-SGD step, as the step-overhead benchmarks compare against it.

``make_private`` with the given ``grad_sample_mode`` (``hooks`` or ``ghost``; ghost takes the
criterion), fed fixed-size batches without Poisson sampling, which only favours Opacus.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def opacus_step(
    module: nn.Module, x: torch.Tensor, y: torch.Tensor, b: int, mode: str, *, lr: float
) -> Callable[[], None]:
    """A step function of Opacus's DP-SGD on ``module``; raises if Opacus refuses the mode."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    opt = torch.optim.SGD(module.parameters(), lr=lr)
    dl = DataLoader(TensorDataset(x[:b], y[:b]), batch_size=b)
    kwargs: dict[str, Any] = {"criterion": nn.CrossEntropyLoss()} if mode == "ghost" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = PrivacyEngine().make_private(
            module=module,
            optimizer=opt,
            data_loader=dl,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            grad_sample_mode=mode,
            poisson_sampling=False,
            **kwargs,
        )
    if mode == "ghost":
        pm, popt, crit, _ = out
    else:
        pm, popt, _ = out
        crit = nn.CrossEntropyLoss()

    def step() -> None:
        idx = torch.randint(x.shape[0], (b,), device=x.device)
        popt.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            crit(pm(x[idx]), y[idx]).backward()
            popt.step()

    return step
