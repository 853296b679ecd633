"""Step-time overhead of DP-SGD against a plain non-private step, with one thread.

For ``mlp`` (784-128-10) and ``cnn`` (004 Table 5) on 28x28 inputs at batch sizes 64 and 256, it
times (median over repeated steps, after warm-up):

* ``nonprivate_ms``: a plain PyTorch step (forward, mean cross-entropy, backward, SGD step);
* ``fixed``: dpsweep's full fixed-clipping DP step (Poisson sampling, per-sample norms,
  clipping, noise, SGD) for a pack of one;
* ``opacus_hooks`` / ``opacus_ghost``: Opacus ``make_private`` with that grad_sample_mode
  (fed fixed-size batches, which only favours Opacus).

Ratios are against ``nonprivate_ms``. Usage: ``python bench/step_overhead.py [--json]
[--repeats N] [--models mlp,cnn] [--batches 64,256]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from torch import nn

from workers.engine import DPEngine
from workers.models import ModelSpec, build_model
from workers.optim import PackedOptimizer
from workers.packed import PackedModel
from workers.strategies import NoiseSource, get_strategy

N_TRAIN = 60_000
SHAPE = (1, 28, 28)
CLASSES = 10
LR = 0.05


def _interleaved_medians(
    steps: dict[str, Callable[[], Any]], repeats: int, warmup: int = 3
) -> dict[str, float]:
    """Median ms per step of each method, timed round-robin.

    Interleaving means a slow spell of the machine hits every method alike, so the ratios are
    far steadier than timing each method in its own block.
    """
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1000.0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _model(name: str) -> nn.Sequential:
    return build_model(ModelSpec(name), input_shape=SHAPE, num_classes=CLASSES, seed=0)


def nonprivate_step(name: str, x: torch.Tensor, y: torch.Tensor, b: int) -> Callable[[], None]:
    m = _model(name)
    opt = torch.optim.SGD(m.parameters(), lr=LR)

    def step() -> None:
        idx = torch.randint(x.shape[0], (b,))
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(m(x[idx]), y[idx]).backward()
        opt.step()

    return step


def dpsweep_step(name: str, x: torch.Tensor, y: torch.Tensor, b: int) -> Callable[[], None]:
    model = PackedModel([_model(name)])
    strategy = get_strategy("fixed")(
        [{"clip": 1.0}], n_layers=model.n_param_layers, device=model.device
    )
    engine = DPEngine(
        model=model,
        strategy=strategy,
        optimizer=PackedOptimizer("sgd", torch.tensor([LR])),
        x=x,
        y=y,
        task="classification",
        sample_rate=b / x.shape[0],
        noise_multiplier=torch.tensor([1.0]),
        sample_generators=[torch.Generator().manual_seed(1)],
        noise=NoiseSource([torch.Generator().manual_seed(2)], model.device),
    )
    return engine.step


def opacus_step(
    name: str, x: torch.Tensor, y: torch.Tensor, b: int, mode: str
) -> Callable[[], None]:
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    m = _model(name)
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    dl = DataLoader(TensorDataset(x[:b], y[:b]), batch_size=b)
    pe = PrivacyEngine()
    kwargs: dict[str, Any] = {}
    if mode == "ghost":
        kwargs["criterion"] = nn.CrossEntropyLoss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = pe.make_private(
            module=m,
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
        idx = torch.randint(x.shape[0], (b,))
        popt.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            crit(pm(x[idx]), y[idx]).backward()
            popt.step()

    return step


def run(
    models: list[str], batches: list[int], repeats: int
) -> dict[str, dict[str, dict[str, float]]]:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(N_TRAIN, *SHAPE, generator=gen)
    y = torch.randint(CLASSES, (N_TRAIN,), generator=gen)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in models:
        out[name] = {}
        for b in batches:
            ms = _interleaved_medians(
                {
                    "nonprivate": nonprivate_step(name, x, y, b),
                    "fixed": dpsweep_step(name, x, y, b),
                    "opacus_hooks": opacus_step(name, x, y, b, "hooks"),
                    "opacus_ghost": opacus_step(name, x, y, b, "ghost"),
                },
                repeats,
            )
            base = ms.pop("nonprivate")
            out[name][str(b)] = {
                "nonprivate_ms": round(base, 3),
                **{k: round(v / base, 3) for k, v in ms.items()},
            }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--batches", default="64,256")
    a = p.parse_args(argv)
    res = run(a.models.split(","), [int(b) for b in a.batches.split(",")], a.repeats)
    if a.json:
        print(json.dumps(res))
        return 0
    print(
        f"{'model':<6}{'batch':>6}{'nonpriv ms':>12}{'fixed':>8}{'hooks':>8}{'ghost':>8}"
        "   (x non-private)"
    )
    for name, rows in res.items():
        for b, r in rows.items():
            print(
                f"{name:<6}{b:>6}{r['nonprivate_ms']:>12.3f}{r['fixed']:>8.2f}"
                f"{r['opacus_hooks']:>8.2f}{r['opacus_ghost']:>8.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
