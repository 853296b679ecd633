"""How DP evaluation changes the best accuracy on the demo (examples/demo.yaml).

Each of the demo's nine grids (fixed, quantile and online clipping at epsilon 1, 3 and 8; six
trials each) is planned and trained as a sweep would (the planner's sigma, the worker's plan
check), once with the default evaluation carve-out (exact metrics, unprotected) and once per
``--shares`` value with DP evaluation (``eval: {mode: dp, epsilon_share: s}``: noisy accuracy
charged inside each grid's epsilon). Per grid it reports:

* ``released``: the best accuracy a user sees: the best trial's released accuracy (exact for
  the carve-out; for DP evaluation the noisy fresh measurement of its chosen checkpoint, the
  best of six noisy values);
* ``true``: the accuracy of the model that release picked, measured here *without noise* on
  the same evaluation records, for this comparison only (dpsweep never releases it in DP
  evaluation);
* ``sigma``: the training noise multiplier, and ``acc_std``: the noise on each released
  accuracy (sigma_e / M).

Usage: ``python bench/eval_modes.py [--json] [--shares 0.1,0.3,0.5] [--repeats 1] [--quick]``.
About 1 minute per mode and repeat on 2 cores (``--quick``: one grid, one epoch, seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from dpsweep.spec import load_spec
from sweeper.datasets.resolution import resolve
from sweeper.sweeps.planning import plan_sweep
from workers.datasets.loading import load_dataset
from workers.models import ModelSpec, build_model
from workers.packed import PackedModel
from workers.plan_check import PlannedRun
from workers.training.loop import train_pack
from workers.training.specs import PackSpec, TrialSpec

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"


def _exact_accuracy(data: Any, model_spec: ModelSpec, flat: torch.Tensor) -> float:
    module = build_model(
        model_spec, input_shape=data.input_shape, num_classes=data.num_classes, seed=0
    )
    packed = PackedModel([module], device=torch.device("cpu"))
    with torch.no_grad():
        packed.flat[0].copy_(flat)
        x = torch.from_numpy(data.x_test)
        out, _ = packed.forward(x.unsqueeze(0))
        y = torch.from_numpy(data.y_test)
        return float((out[0].argmax(dim=-1) == y).double().mean())


def run_mode(raw: dict[str, Any], evaluation: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Plan and train every grid of the demo in one evaluation mode."""
    spec = load_spec({**raw, **({"eval": evaluation} if evaluation else {})})
    dataset = resolve(None, spec.dataset, spec.eval)
    plan = plan_sweep(spec, dataset=dataset)
    data = load_dataset(dataset)
    model = ModelSpec(spec.model.name, spec.model.options)
    arms = {a.label: a for a in spec.arms}
    tr = spec.training
    rows = []
    for g in plan.grids:
        arm = arms[g.arm]
        trials = []
        for point in arm.points():
            params = {**arm.params, **point}
            lr = float(params.pop("lr"))
            for seed in range(spec.seeds):
                trials.append(
                    TrialSpec(
                        lr=lr,
                        seed=seed,
                        noise_multiplier=g.noise_multiplier,
                        target_delta=spec.privacy.delta,
                        params=params,
                    )
                )
        pack = PackSpec(
            dataset=dataset,
            model=model,
            strategy=arm.strategy,
            trials=trials,
            batch_size=tr.batch_size,
            epochs=tr.epochs or 1.0,
            steps=tr.steps,
            optimizer=tr.optimizer,
            momentum=tr.momentum,
            weight_decay=tr.weight_decay,
            eval_every=tr.eval_every,
            accountant="pld",
            planned=PlannedRun.of_grid(dataclasses.replace(g, dataset_sha256=plan.dataset_sha256)),
            eval_noise_multiplier=g.eval_noise_multiplier,
        )
        results = train_pack(pack, dataset=data)
        best = max(results, key=lambda r: r.metrics.get("accuracy", -1.0))
        assert best.checkpoint is not None
        rows.append(
            {
                "arm": g.arm,
                "epsilon": g.epsilon_budget,
                "sigma": g.noise_multiplier,
                "acc_std": (
                    g.eval_noise_multiplier / len(data.y_test) if g.eval_noise_multiplier else 0.0
                ),
                "released": best.metrics["accuracy"],
                "true": _exact_accuracy(data, model, best.checkpoint),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--shares", default="0.1,0.3,0.5", help="DP evaluation epsilon shares")
    ap.add_argument("--repeats", type=int, default=1, help="runs per mode (noise differs)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="one arm (fixed), one level (3), one epoch: a smoke run",
    )
    args = ap.parse_args()
    torch.set_num_threads(2)
    import yaml

    raw = yaml.safe_load(DEMO.read_text())
    # The modes are compared on the same training: without the demo's moving average, which
    # eval mode dp refuses (its extra measurements would be uncharged noisy releases).
    for key in ("ema", "average"):
        raw.get("training", {}).pop(key, None)
    if args.quick:
        raw["arms"] = raw["arms"][:1]
        raw["privacy"]["budgets"] = [3]
        raw["training"]["epochs"] = 1
    modes: list[tuple[str, dict[str, Any] | None]] = [("carve-out", None)]
    modes += [
        (f"dp@{s}", {"mode": "dp", "epsilon_share": float(s)}) for s in args.shares.split(",")
    ]
    out: dict[str, Any] = {}
    for name, evaluation in modes:
        t0 = time.perf_counter()
        runs = [run_mode(raw, evaluation) for _ in range(args.repeats)]
        grids = []
        for i, row in enumerate(runs[0]):
            grids.append(
                {
                    **{k: row[k] for k in ("arm", "epsilon", "sigma", "acc_std")},
                    "released": statistics.fmean(r[i]["released"] for r in runs),
                    "true": statistics.fmean(r[i]["true"] for r in runs),
                }
            )
        out[name] = {"grids": grids, "seconds": time.perf_counter() - t0}
        if not args.json:
            print(f"== {name} ({out[name]['seconds']:.0f} s)", flush=True)
            for g in grids:
                print(
                    f"  {g['arm']:>8} eps {g['epsilon']:>3g}: sigma {g['sigma']:6.3f}  "
                    f"released {g['released']:.3f}  true {g['true']:.3f}  "
                    f"(± {g['acc_std']:.3f} per release)",
                    flush=True,
                )
    base = {(g["arm"], g["epsilon"]): g["true"] for g in out["carve-out"]["grids"]}
    summary = {
        name: {
            "mean_true": statistics.fmean(g["true"] for g in m["grids"]),
            "mean_true_ratio_to_carve_out": statistics.fmean(
                g["true"] / base[(g["arm"], g["epsilon"])] for g in m["grids"]
            ),
            "mean_released": statistics.fmean(g["released"] for g in m["grids"]),
        }
        for name, m in out.items()
    }
    if args.json:
        print(json.dumps({"modes": out, "summary": summary}, indent=2))
    else:
        for name, s in summary.items():
            print(
                f"{name}: mean true accuracy {s['mean_true']:.3f} "
                f"({s['mean_true_ratio_to_carve_out']:.3f} x carve-out), "
                f"mean released {s['mean_released']:.3f}"
            )


if __name__ == "__main__":
    main()
