"""User-level DP (issue 54): a step with privacy units against an example-level step.

Both are dpsweep's full DP step (Poisson sampling from a secret stream, per-example norms,
fixed flat clipping, floating-point-safe noise, SGD) for a pack of one, on ``mlp``
(784-128-10, the packed path) with synthetic 28x28 inputs from a public seed (timing only),
or with ``--model cnn1d`` on 40-value signals (the generic path):

* ``units``: ``--units`` expected units per step (q = b / N_units), each unit using R =
  ``--rows-per-unit`` of its rows (every unit has R to 4R rows, so each sampled unit fills its
  R row slots and the step uses b R rows), bounded by ``mean`` (each row clipped, their mean)
  and, separately, by ``capped`` (the mean row gradient, clipped once);
* ``rows``: the example-level step at the same expected number of rows, b R.

Median seconds per step over ``--repeats`` rounds, the methods interleaved (a slow spell of a
shared machine hits all). Target: ``mean`` and ``capped`` each <= 1.2 x the example-level
step (``ok`` and ``capped_ok``). ``capped`` never builds a unit's mean gradient: each unit's
norm comes from its rows' infos (a ghost norm over the unit's rows where that costs less,
:mod:`workers.group_norms`), and the rows are then weighed as in ``mean``. ``mixed``
(informational): units of 1 to 2R rows, whose unused row slots are padding computed like
rows, against the example-level step at the same expected number of *used* rows.

Usage: ``python bench/unit_step.py [--model M] [--units B] [--rows-per-unit R] [--repeats N]
[--threads T] [--quick]``; prints one JSON line.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from workers.engine import DPEngine
from workers.generic.dispatch import build_pack_model
from workers.models import ModelSpec
from workers.models.registry import build_model
from workers.optim import PackedOptimizer
from workers.randomness import NoiseSource, TrialRandomness
from workers.strategies import get_strategy

TARGET = 1.2
#: Each model's synthetic input shape.
SHAPES = {"mlp": (1, 28, 28), "cnn1d": (40,)}


def engine_step(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch: float,
    units: np.ndarray | None = None,
    bounding: str = "mean",
    rows_per_unit: int = 8,
    model: str = "mlp",
) -> Callable[[], None]:
    """dpsweep's DP step for a pack of one (q = batch / population, rows or units)."""
    shape = tuple(int(d) for d in x.shape[1:])
    module = build_model(ModelSpec(model), input_shape=shape, num_classes=10, seed=0)
    built, _ = build_pack_model([module])
    pack: object = built
    strategy = get_strategy("fixed")(
        [{"clip": 1.0, "clip_style": "flat"}],
        n_layers=built.n_param_layers,
        device=torch.device("cpu"),
    )
    rand = TrialRandomness.secret()
    population = int(units.max()) + 1 if units is not None else int(x.shape[0])
    engine = DPEngine(
        model=pack,  # type: ignore[arg-type]
        strategy=strategy,
        optimizer=PackedOptimizer("sgd", torch.tensor([0.1])),
        x=x,
        y=y,
        task="classification",
        sample_rate=batch / population,
        noise_multiplier=torch.tensor([1.0]),
        sample_streams=[rand.sample],
        noise=NoiseSource([rand.noise], "cpu"),
        units=units,
        unit_bounding=bounding,
        rows_per_unit=rows_per_unit,
    )
    return engine.step


def unit_ids(n_rows: int, low: int, high: int, seed: int = 0) -> np.ndarray:
    """Dense unit ids for units of ``low .. high`` rows (the rows interleaved)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(low, high + 1, size=n_rows // low + 1)
    ids = np.repeat(np.arange(len(sizes)), sizes)[:n_rows]
    return rng.permutation(ids)


def medians(steps: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median seconds per step of each method, timed round-robin after two warm-up steps."""
    for fn in steps.values():
        fn()
        fn()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def run(a: argparse.Namespace) -> dict[str, object]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.n, *SHAPES[a.model], generator=g)
    y = torch.randint(0, 10, (a.n,), generator=g)
    r, b = a.rows_per_unit, a.units
    full = unit_ids(a.n, r, 4 * r)
    mixed = unit_ids(a.n, 1, 2 * r, seed=1)
    used = float(np.minimum(np.bincount(mixed), r).mean())  # expected used rows per unit
    m = a.model
    steps = {
        "rows": engine_step(x, y, batch=b * r, model=m),
        "mean": engine_step(x, y, batch=b, units=full, rows_per_unit=r, model=m),
        "capped": engine_step(
            x, y, batch=b, units=full, bounding="capped", rows_per_unit=r, model=m
        ),
        "rows_mixed": engine_step(x, y, batch=b * used, model=m),
        "mean_mixed": engine_step(x, y, batch=b, units=mixed, rows_per_unit=r, model=m),
    }
    ms = medians(steps, a.repeats)
    ratio = ms["mean"] / ms["rows"]
    return {
        "bench": "unit_step",
        "model": a.model,
        "units_per_step": b,
        "rows_per_unit": r,
        "ms": {k: round(1000 * v, 3) for k, v in ms.items()},
        "mean_vs_rows": round(ratio, 3),
        "capped_vs_rows": round(ms["capped"] / ms["rows"], 3),
        "mixed_mean_vs_rows": round(ms["mean_mixed"] / ms["rows_mixed"], 3),
        "target": TARGET,
        "ok": ratio <= TARGET,
        "capped_ok": ms["capped"] / ms["rows"] <= TARGET,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=20_000, help="synthetic training rows")
    p.add_argument(
        "--model", choices=sorted(SHAPES), default="mlp",
        help="mlp (28x28 inputs, the packed path) or cnn1d (40 values, the generic path)",
    )  # fmt: skip
    p.add_argument("--units", type=int, default=32, help="expected units per step (b)")
    p.add_argument("--rows-per-unit", type=int, default=8)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--quick", action="store_true", help="a smoke run (seconds)")
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore", message="There is a performance drop")
    torch.set_num_threads(a.threads)
    if a.quick:
        a.n, a.units, a.repeats = 2000, 8, 3
    print(json.dumps(run(a)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
