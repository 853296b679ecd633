"""Generic-path packs: K trials as one vmap over the trial dimension, or one after another?

For each built-in model that trains on the generic path (``wrn16_4``, ``res_cnn``,
``text_classifier``), it times a full fixed-clipping DP step of a K-trial pack (default K = 4)
both ways, round-robin on one thread, and prints which is faster: that is what the model's
descriptor declares as ``generic_packs`` (``batched`` or ``sequential``), and the last column
says whether the declaration agrees with this run. The two modes give the same results.

Usage: ``python bench/generic_packs.py [--json] [--trials K] [--repeats N] [--models a,b]``.
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

from workers.engine import DPEngine
from workers.generic import GenericModel
from workers.models import ModelSpec, build_model
from workers.models.descriptors import DESCRIPTORS
from workers.optim import PackedOptimizer
from workers.randomness import NoiseSource, TrialRandomness
from workers.strategies import get_strategy

N_TRAIN = 10_000
# (input shape, classes, batch size, model options) per model: sizes one CPU thread handles.
SETUPS: dict[str, tuple[tuple[int, ...], int, int, dict[str, Any]]] = {
    "wrn16_4": ((3, 32, 32), 10, 16, {}),
    "res_cnn": ((1, 28, 28), 10, 32, {}),
    "text_classifier": ((64,), 2, 32, {"vocab_size": 1000}),
}


def _step_fn(name: str, k: int, batched: bool) -> Callable[[], None]:
    shape, classes, batch, options = SETUPS[name]
    modules = [
        build_model(ModelSpec(name, options), input_shape=shape, num_classes=classes, seed=s)
        for s in range(k)
    ]
    model = GenericModel(modules, batched_trials=batched)
    strategy = get_strategy("fixed")(
        [{"clip": 1.0}] * k, n_layers=model.n_param_layers, device="cpu"
    )
    rands = [TrialRandomness.secret() for _ in range(k)]
    if name == "text_classifier":
        x = torch.randint(2, 1000, (N_TRAIN, *shape))
    else:
        x = torch.randn(N_TRAIN, *shape)
    y = torch.randint(0, classes, (N_TRAIN,))
    engine = DPEngine(
        model=model,  # type: ignore[arg-type]  (the same interface as PackedModel)
        strategy=strategy,
        optimizer=PackedOptimizer("sgd", torch.full((k,), 0.05)),
        x=x,
        y=y,
        task="classification",
        sample_rate=batch / N_TRAIN,
        noise_multiplier=torch.ones(k),
        sample_streams=[r.sample for r in rands],
        noise=NoiseSource([r.noise for r in rands], model.device),
    )
    return engine.step


def measure(name: str, k: int, repeats: int) -> dict[str, Any]:
    steps = {"batched": _step_fn(name, k, True), "sequential": _step_fn(name, k, False)}
    times: dict[str, list[float]] = {m: [] for m in steps}
    for _ in range(2):
        for fn in steps.values():
            fn()
    for _ in range(repeats):
        for m, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            times[m].append(time.perf_counter() - t0)
    ms = {m: 1000 * statistics.median(t) for m, t in times.items()}
    faster = min(ms, key=lambda m: ms[m])
    return {
        "trials": k,
        "batched_ms": round(ms["batched"], 2),
        "sequential_ms": round(ms["sequential"], 2),
        "batched_vs_sequential": round(ms["batched"] / ms["sequential"], 3),
        "faster": faster,
        "declared": DESCRIPTORS[name].generic_packs,
        "agrees": DESCRIPTORS[name].generic_packs == faster,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--models", default=",".join(SETUPS))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="There is a performance drop")
    rows = {m: measure(m, args.trials, args.repeats) for m in args.models.split(",")}
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'model':<16} {'batched ms':>11} {'sequential ms':>14} {'ratio':>7}  faster   declared")
    for m, r in rows.items():
        print(
            f"{m:<16} {r['batched_ms']:>11.1f} {r['sequential_ms']:>14.1f} "
            f"{r['batched_vs_sequential']:>7.3f}  {r['faster']:<8} {r['declared']}"
            + ("" if r["agrees"] else "  (disagrees with this run)")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
