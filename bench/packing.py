"""Packed trials vs one trial at a time, on the 25-trial digits grid, with one torch thread.

The grid is 004's: lr in logspace(-2.5, 1.5, 5) x C in logspace(-2, 2, 5), one seed each,
fixed clipping at the noise multiplier for epsilon = 3, batch 64, for ``mlp`` and the 004
``cnn``. It reports, per model:

* wall time of the whole grid as one pack (``packed_s``) and one trial at a time
  (``one_at_a_time_s``: each trial its own ``train_pack`` call, data loading included, as a
  worker running one trial per task would), their ratio ``speedup``, and trial-steps per
  second for both;
* ``per_trial_step_ms``: the pack's median step time divided by K, and its ratio to one plain
  non-private PyTorch step of the same model at the same batch size
  (``per_trial_step_vs_nonprivate``).

Training follows the worker setting ``DPSWEEP_NOISE_AHEAD``, off by default (opt-in): every
DP noise draw is made on the training thread. With ``DPSWEEP_NOISE_AHEAD=1`` each step's draws
are made on a second thread during the step before (:mod:`workers.noise_ahead`), so training
may keep two cores busy where the non-private step keeps one; ``--sequential-too`` then also
runs the grid (packed and one at a time) with every draw on the training thread and adds the
same figures with the suffix ``_sequential`` (without the setting both runs are sequential).

With ``--device cuda`` the trials train on the GPU through the engine's CUDA path (the
secret keystreams and the float64 sampler still run on the host; releases are copied to the
device), and the non-private step is timed after ``torch.cuda.synchronize``.

Usage: ``python bench/packing.py [--json] [--quick] [--models mlp,cnn] [--sequential-too]
[--device cpu|cuda]``.
``--quick`` trains one epoch and times 5 of the 25 trials one at a time (scaled to 25), in
under a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
import torch.nn.functional as F

from workers.accounting import calibrate_noise_multiplier
from workers.datasets.loading import load_dataset
from workers.datasets.records import DatasetSpec
from workers.models import ModelSpec, build_model
from workers.schedule import plan_steps
from workers.training.loop import train_pack
from workers.training.specs import PackSpec, TrialSpec

BATCH = 64


def grid(sigma: float) -> list[TrialSpec]:
    lrs = np.logspace(-2.5, 1.5, 5)
    clips = np.logspace(-2, 2, 5)
    return [
        TrialSpec(lr=float(lr), seed=i, noise_multiplier=sigma, params={"clip": float(c)})
        for i, (lr, c) in enumerate((lr, c) for lr in lrs for c in clips)
    ]


def nonprivate_step_ms(model_name: str, repeats: int = 200, device: str = "cpu") -> float:
    data = load_dataset(DatasetSpec("digits"))
    dev = torch.device(device)
    x, y = torch.from_numpy(data.x_train).to(dev), torch.from_numpy(data.y_train).to(dev)
    m = build_model(ModelSpec(model_name), input_shape=data.input_shape, num_classes=10, seed=0)
    m = m.to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)

    def step() -> None:
        idx = torch.randint(x.shape[0], (BATCH,), device=dev)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(m(x[idx]), y[idx]).backward()
        opt.step()
        if dev.type == "cuda":
            # Kernels run asynchronously: the step is over when the device is done.
            torch.cuda.synchronize(dev)

    for _ in range(10):
        step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


@contextlib.contextmanager
def noise_ahead(on: bool | None) -> Iterator[None]:
    """``DPSWEEP_NOISE_AHEAD`` set to ``on`` for the block (``None``: left as it is)."""
    old = os.environ.get("DPSWEEP_NOISE_AHEAD")
    if on is not None:
        os.environ["DPSWEEP_NOISE_AHEAD"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DPSWEEP_NOISE_AHEAD", None)
        else:
            os.environ["DPSWEEP_NOISE_AHEAD"] = old


def run(
    model_name: str, *, quick: bool, sequential_too: bool = False, device: str = "cpu"
) -> dict[str, Any]:
    torch.set_num_threads(1)
    epochs = 1.0 if quick else 5.0
    data = load_dataset(DatasetSpec("digits"))
    q, steps = plan_steps(n_train=data.n_train, batch_size=BATCH, epochs=epochs, steps=None)
    sigma = calibrate_noise_multiplier(
        target_epsilon=3.0, target_delta=1e-5, sample_rate=q, steps=steps
    )
    trials = grid(sigma)

    def spec(ts: list[TrialSpec]) -> PackSpec:
        return PackSpec(
            dataset=DatasetSpec("digits"),
            model=ModelSpec(model_name),
            strategy="fixed",
            trials=ts,
            batch_size=BATCH,
            epochs=epochs,
            eval_every=50,
            threads=1,
            device=device,
        )

    train_pack(spec(trials[:1]))  # warm-up (imports, kernels, the epsilon cache)
    sample = trials[::5] if quick else trials

    def grid_times() -> tuple[float, float, float]:
        t0 = time.perf_counter()
        results = train_pack(spec(trials))
        packed_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for t in sample:
            train_pack(spec([t]))
        alone_s = (time.perf_counter() - t0) * len(trials) / len(sample)
        return packed_s, alone_s, results[0].step_time_ms_median / len(trials)

    variants = {"": None, "_sequential": False} if sequential_too else {"": None}
    times = {}
    for suffix, on in variants.items():
        with noise_ahead(on):
            times[suffix] = grid_times()
    base = nonprivate_step_ms(model_name, device=device)
    trial_steps = len(trials) * steps
    out: dict[str, Any] = {"trials": len(trials), "steps": steps, "device": device}
    for suffix, (packed_s, alone_s, per_trial_step) in times.items():
        out.update(
            {
                f"packed_s{suffix}": round(packed_s, 3),
                f"one_at_a_time_s{suffix}": round(alone_s, 3),
                f"speedup{suffix}": round(alone_s / packed_s, 2),
                f"packed_trial_steps_per_s{suffix}": round(trial_steps / packed_s, 1),
                f"one_at_a_time_trial_steps_per_s{suffix}": round(trial_steps / alone_s, 1),
                f"per_trial_step_ms{suffix}": round(per_trial_step, 4),
                f"per_trial_step_vs_nonprivate{suffix}": round(per_trial_step / base, 3),
            }
        )
    out["nonprivate_step_ms"] = round(base, 4)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quick", action="store_true", help="1 epoch; 5 trials timed one at a time")
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument(
        "--sequential-too",
        action="store_true",
        help="also run the grid with every noise draw on the training thread",
    )
    p.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where the trials train (cuda: the engine's CUDA path, timed after a synchronize)",
    )
    a = p.parse_args(argv)
    out = {
        m: run(m, quick=a.quick, sequential_too=a.sequential_too, device=a.device)
        for m in a.models.split(",")
    }
    if a.json:
        print(json.dumps(out))
        return 0
    print(
        f"25-trial digits grid on {a.device}, one torch thread (DP noise drawn ahead only with "
        "DPSWEEP_NOISE_AHEAD=1, never in _sequential)" + (" (quick: 1 epoch)" if a.quick else "")
    )
    for m, r in out.items():
        for sfx in ("", "_sequential"):
            if f"packed_s{sfx}" not in r:
                continue
            print(
                f"{m + sfx:<15} packed {r['packed_s' + sfx]:7.2f} s "
                f"({r['packed_trial_steps_per_s' + sfx]:8.0f} trial-steps/s)  one at a time "
                f"{r['one_at_a_time_s' + sfx]:7.2f} s "
                f"({r['one_at_a_time_trial_steps_per_s' + sfx]:7.0f}/s)  "
                f"speedup {r['speedup' + sfx]:5.2f}x  per trial-step "
                f"{r['per_trial_step_ms' + sfx]:.4f} ms = "
                f"{r['per_trial_step_vs_nonprivate' + sfx]:.2f}x a non-private step "
                f"({r['nonprivate_step_ms']:.3f} ms)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
