"""Packed trials vs one trial at a time, on the 25-trial digits grid, with one thread.

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

Usage: ``python bench/packing.py [--json] [--quick] [--models mlp,cnn]``. ``--quick`` trains
one epoch and times 5 of the 25 trials one at a time (scaled to 25), in under a minute.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
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


def nonprivate_step_ms(model_name: str, repeats: int = 200) -> float:
    data = load_dataset(DatasetSpec("digits"))
    x, y = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    m = build_model(ModelSpec(model_name), input_shape=data.input_shape, num_classes=10, seed=0)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)

    def step() -> None:
        idx = torch.randint(x.shape[0], (BATCH,))
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(m(x[idx]), y[idx]).backward()
        opt.step()

    for _ in range(10):
        step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def run(model_name: str, *, quick: bool) -> dict[str, Any]:
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
            device="cpu",
        )

    train_pack(spec(trials[:1]))  # warm-up (imports, kernels, the epsilon cache)
    t0 = time.perf_counter()
    results = train_pack(spec(trials))
    packed_s = time.perf_counter() - t0
    sample = trials[::5] if quick else trials
    t0 = time.perf_counter()
    for t in sample:
        train_pack(spec([t]))
    alone_s = (time.perf_counter() - t0) * len(trials) / len(sample)
    per_trial_step = results[0].step_time_ms_median / len(trials)
    base = nonprivate_step_ms(model_name)
    trial_steps = len(trials) * steps
    return {
        "trials": len(trials),
        "steps": steps,
        "packed_s": round(packed_s, 3),
        "one_at_a_time_s": round(alone_s, 3),
        "speedup": round(alone_s / packed_s, 2),
        "packed_trial_steps_per_s": round(trial_steps / packed_s, 1),
        "one_at_a_time_trial_steps_per_s": round(trial_steps / alone_s, 1),
        "per_trial_step_ms": round(per_trial_step, 4),
        "nonprivate_step_ms": round(base, 4),
        "per_trial_step_vs_nonprivate": round(per_trial_step / base, 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quick", action="store_true", help="1 epoch; 5 trials timed one at a time")
    p.add_argument("--models", default="mlp,cnn")
    a = p.parse_args(argv)
    out = {m: run(m, quick=a.quick) for m in a.models.split(",")}
    if a.json:
        print(json.dumps(out))
        return 0
    print("25-trial digits grid, one thread" + (" (quick: 1 epoch)" if a.quick else ""))
    for m, r in out.items():
        print(
            f"{m:<4} packed {r['packed_s']:7.2f} s ({r['packed_trial_steps_per_s']:8.0f} "
            f"trial-steps/s)  one at a time {r['one_at_a_time_s']:7.2f} s "
            f"({r['one_at_a_time_trial_steps_per_s']:7.0f}/s)  speedup {r['speedup']:5.2f}x  "
            f"per trial-step {r['per_trial_step_ms']:.4f} ms = "
            f"{r['per_trial_step_vs_nonprivate']:.2f}x a non-private step "
            f"({r['nonprivate_step_ms']:.3f} ms)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
