"""How much of a claimed epsilon a canary audit finds, and what it costs (issue 38).

Every row trains digits once with m canaries through the sweeps' own code
(:func:`workers.canary_audit.run.run_audit`) and reports the claimed epsilon (delta = 1e-5),
the 95 % lower bound (the one-run bound: it holds for any mechanism), the Gaussian estimate
beside it (shown only where its normality check passes; not a bound), and the wall time:

* ``targets``: white-box, every iterate, fixed clipping, the ``mlp``, full batches for 10
  steps (where white-box audits are nearly tight), at claimed epsilons of 8 and 2 (the issue's
  targets: at least 4 and at least 1);
* ``strategies``: every strategy at a claimed epsilon of 8 (the same regime; ``lipschitz`` on
  ``lip_mlp``), plus a pack of 2 trials and the generic engine path (``res_cnn``);
* ``black-box``: input canaries scored by their loss under the final model (expect little: it
  is the weakest adversary);
* ``faults``: the four injected faults of the test suite, each where the default m resolves it
  (``detected``: ``bound`` where the bound exceeds the claim, ``estimate`` where only the
  Gaussian estimate does, else none);
* ``--tightness`` instead: bound / claim for ``fixed`` on the ``mlp`` at claimed epsilons of 8
  and 2, at q = 1 (10 steps) and at ``dpsweep audit``'s default q (batch 64, 100 steps), for
  m = 1000 (5 audits each) and m = 10000 (3 each): medians, ranges and wall times, and beside
  each the bound's ceiling (:mod:`workers.canary_audit.ceiling`: the same bound on ideal scores
  of the claimed mechanism, same m);
* ``--ceiling`` instead: only the ceilings of those rows, at m = 1000, 10,000 and 100,000,
  15 simulated audits each (a minute: no training).

* ``--per-strategy`` instead: bound / claim for every strategy and engine path (one audit per
  cell of epsilon 8 and 2, q = 1 and the default q, m = 1000 and 10,000);
* ``--noise-scale`` instead: noise at 1, 0.9 and 0.8 of its planned scale (q = 1, claim 8),
  5 audits each at m = 1000 and 5000, and how often each is caught (by the bound, the
  estimate, and the curve test, with its p-values and noise scale bounds).

Usage: ``python bench/audit.py [--canaries M] [--quick] [--json]
[--tightness | --ceiling | --per-strategy | --noise-scale]``
(``--quick``: fewer rows, smaller m, for the smoke test).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DELTA = 1e-5


#: Every strategy at its usual options, a pack of two, and the generic engine path.
STRATEGIES: list[dict[str, Any]] = [
    {"strategy": "fixed", "params": {"clip": 1.0, "clip_style": "layerwise"}},
    {"strategy": "automatic", "params": {"clip": 1.0}},
    {"strategy": "global", "params": {"clip": 1.0, "global_threshold": 4.0}},
    {"strategy": "quantile"},
    {"strategy": "online"},
    {"strategy": "bam", "params": {"clip": 1.0}},
    {"strategy": "lipschitz", "model": "lip_mlp"},
    {"strategy": "fixed", "params": {"clip": 1.0}, "trials": 2},
    {
        "strategy": "fixed",
        "params": {"clip": 1.0},
        "model": "res_cnn",
        "model_options": {"width": 8, "blocks": 1},
        "trials": 2,
    },
]


def _audit(data: Any, **kw: Any) -> dict[str, Any]:
    from workers.accounting.compute import calibrate_noise_multiplier
    from workers.canary_audit.run import run_audit
    from workers.datasets.records import DatasetSpec
    from workers.models.descriptors import ModelSpec
    from workers.training.specs import PackSpec, TrialSpec

    n = int(data.x_train.shape[0])
    batch = min(int(kw.get("batch_size", n)), n)
    steps = int(kw.get("steps", 10))
    trials = int(kw.get("trials", 1))
    accountant = str(kw.get("accountant", "rdp"))
    sigma = calibrate_noise_multiplier(
        target_epsilon=float(kw["epsilon"]),
        target_delta=DELTA,
        sample_rate=batch / n,
        steps=steps * trials,
        accountant=accountant,
    )
    spec = PackSpec(
        dataset=DatasetSpec(name="digits"),
        model=ModelSpec(kw.get("model", "mlp"), dict(kw.get("model_options", {}))),
        strategy=kw.get("strategy", "fixed"),
        trials=[
            TrialSpec(
                lr=0.3 + 0.1 * i,
                seed=i,
                noise_multiplier=sigma,
                target_delta=DELTA,
                params=dict(kw.get("params", {})),
            )
            for i in range(trials)
        ],
        batch_size=batch,
        steps=steps,
        accountant=accountant,
    )
    r = run_audit(
        spec,
        setting=kw.get("setting", "white-box"),
        canaries=int(kw["canaries"]),
        direction=kw.get("direction", "auto"),
        dataset=data,
        public_data=True,
    )
    return {
        "case": kw["case"],
        "strategy": r.strategy,
        "engine_path": r.engine_path,
        "trials": r.trials,
        "setting": r.setting,
        "canaries": r.canaries,
        "epsilon_claimed": round(r.epsilon_claimed, 3),
        "epsilon_lower_bound": round(r.epsilon_lower_bound, 3),
        "epsilon_estimate": None if r.epsilon_estimate is None else round(r.epsilon_estimate, 3),
        "exceeds_claim": r.exceeds_claim,
        "estimate_exceeds_claim": r.estimate_exceeds_claim,
        "claim_refuted": r.claim_refuted,
        "claim_p_value": round(r.claim_p_value, 4),
        "noise_scale_upper_bound": (
            None if r.noise_scale_upper_bound is None else round(r.noise_scale_upper_bound, 3)
        ),
        "seconds": round(r.seconds, 2),
        "direction": r.direction,
        "noise_multiplier": sigma,
        "sample_rate": batch / n,
        "steps": steps,
    }


@contextlib.contextmanager
def _fault(name: str) -> Iterator[None]:
    """The test suite's faults (tests/workers/canary_audit/faults.py), patched in and undone."""
    import pytest

    from tests.workers.canary_audit.faults import inject

    mp = pytest.MonkeyPatch()
    try:
        inject(name, mp)
        yield
    finally:
        mp.undo()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--canaries", type=int, default=1000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--tightness", action="store_true")
    parser.add_argument("--ceiling", action="store_true")
    parser.add_argument("--per-strategy", action="store_true")
    parser.add_argument("--noise-scale", action="store_true")
    args = parser.parse_args()
    if args.ceiling:
        ceilings(as_json=args.json)
        return

    from workers.datasets.loading import load_dataset
    from workers.datasets.records import DatasetSpec

    data = load_dataset(DatasetSpec(name="digits"))
    if args.tightness:
        tightness(data, as_json=args.json)
        return
    if args.per_strategy:
        per_strategy(data, as_json=args.json)
        return
    if args.noise_scale:
        noise_scale(data, as_json=args.json)
        return
    m = 200 if args.quick else args.canaries
    rows: list[dict[str, Any]] = []
    targets = [("target eps=8", 8.0), ("target eps=2", 2.0)]
    for case, eps in targets[:1] if args.quick else targets:
        rows.append(_audit(data, case=case, epsilon=eps, canaries=m))
    for kw in STRATEGIES[:1] if args.quick else STRATEGIES:
        rows.append(_audit(data, case=_case(kw), epsilon=8.0, canaries=m, **kw))
    rows.append(
        _audit(
            data,
            case="black-box",
            epsilon=8.0,
            canaries=m,
            setting="black-box",
            batch_size=256,
            steps=100,
        )
    )
    faults: dict[str, dict[str, Any]] = {
        "halved_noise": {"epsilon": 4.0},
        "shared_noise": {"epsilon": 1.0, "trials": 2, "batch_size": 700, "steps": 20},
        "unclipped_example": {"epsilon": 1.0, "batch_size": 128, "steps": 300},
        "doubled_rate": {"epsilon": 4.0, "batch_size": 256, "steps": 100},
    }
    for name, kw in list(faults.items())[:1] if args.quick else faults.items():
        with _fault(name):
            row = _audit(data, case=f"fault: {name}", canaries=args.canaries, **kw)
        row["detected"] = (
            "bound"
            if row["exceeds_claim"]
            else ("estimate" if row["estimate_exceeds_claim"] else None)
        )
        # The curve test is sound for any mechanism, as the bound is: named beside it.
        row["curve"] = "refuted" if row["claim_refuted"] else "not refuted"
        rows.append(row)

    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'case':<26} {'path':<8} {'m':>5} {'claimed':>8} {'bound':>7} {'estimate':>8} {'s':>6}")
    for r in rows:
        est = "-" if r["epsilon_estimate"] is None else f"{r['epsilon_estimate']:.2f}"
        flag = "" if "detected" not in r else f"  detected: {r['detected'] or 'MISSED'}"
        if "curve" in r:
            flag += f"; curve {r['curve']} (p {r['claim_p_value']:.2g})"
        print(
            f"{r['case']:<26} {r['engine_path']:<8} {r['canaries']:>5} "
            f"{r['epsilon_claimed']:>8.2f} {r['epsilon_lower_bound']:>7.2f} {est:>8} "
            f"{r['seconds']:>6.1f}{flag}"
        )


#: The tightness rows' sampling: where the bound is nearest the truth, and where users train.
SETTINGS = (("q = 1, T = 10", None, 10), ("q = 64/N, T = 100", 64, 100))


def _ceiling(
    *, canaries: int, noise_multiplier: float, sample_rate: float, steps: int, draws: int = 5
) -> Any:
    from dpsweep.accounting_inputs import AccountingInputs
    from workers.canary_audit.ceiling import one_run_ceiling

    claim = AccountingInputs(
        noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps, delta=DELTA
    )
    return one_run_ceiling(claim, canaries=canaries, draws=draws)


def tightness(data: Any, *, as_json: bool) -> None:
    """Bound / claim where users train and where the bound is nearest the truth (issue 49)."""
    import statistics

    n = int(data.x_train.shape[0])
    rows: list[dict[str, Any]] = []
    for m, reps in ((1000, 5), (10000, 3)):
        for eps in (8.0, 2.0):
            for label, batch, steps in SETTINGS:
                found = [
                    _audit(data, case=label, epsilon=eps, canaries=m, batch_size=batch or n,
                           steps=steps, accountant="opacus-rdp")
                    for _ in range(reps)
                ]  # fmt: skip
                bounds = [f["epsilon_lower_bound"] for f in found]
                shown = [f["epsilon_estimate"] for f in found if f["epsilon_estimate"] is not None]
                claim = found[0]["epsilon_claimed"]
                ceiling = _ceiling(
                    canaries=m,
                    noise_multiplier=found[0]["noise_multiplier"],
                    sample_rate=found[0]["sample_rate"],
                    steps=steps,
                )
                rows.append(
                    {
                        "setting": label,
                        "canaries": m,
                        "epsilon_claimed": claim,
                        "bound_median": statistics.median(bounds),
                        "bound_range": [min(bounds), max(bounds)],
                        "ratio": round(statistics.median(bounds) / claim, 3),
                        "ceiling_median": round(ceiling.median, 3),
                        "ceiling_ratio": round(ceiling.median / claim, 3),
                        "estimate_median": statistics.median(shown) if shown else None,
                        "estimates_shown": f"{len(shown)}/{reps}",
                        "seconds_median": statistics.median(f["seconds"] for f in found),
                    }
                )
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    print(
        "| setting | m | claimed ε | bound (median, range) | bound / claim | ceiling / claim "
        "| estimate | s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        lo, hi = r["bound_range"]
        est = "-" if r["estimate_median"] is None else f"{r['estimate_median']:.2f}"
        print(
            f"| {r['setting']} | {r['canaries']} | {r['epsilon_claimed']:.2f} | "
            f"{r['bound_median']:.2f} ({lo:.2f}-{hi:.2f}) | {r['ratio']:.2f} | "
            f"{r['ceiling_median']:.2f} ({r['ceiling_ratio']:.2f}) | "
            f"{est} ({r['estimates_shown']}) | {r['seconds_median']:.1f} |"
        )


def ceilings(*, as_json: bool) -> None:
    """The one-run bound's ceiling for the tightness rows, at m up to 100,000 (no training)."""
    from workers.accounting.compute import calibrate_noise_multiplier
    from workers.datasets.loading import load_dataset
    from workers.datasets.records import DatasetSpec

    n = int(load_dataset(DatasetSpec(name="digits")).x_train.shape[0])
    rows: list[dict[str, Any]] = []
    for eps in (8.0, 2.0):
        for label, batch, steps in SETTINGS:
            q = (batch or n) / n
            sigma = calibrate_noise_multiplier(
                target_epsilon=eps,
                target_delta=DELTA,
                sample_rate=q,
                steps=steps,
                accountant="opacus-rdp",
            )
            for m in (1000, 10000, 100000):
                c = _ceiling(
                    canaries=m, noise_multiplier=sigma, sample_rate=q, steps=steps, draws=15
                )
                rows.append(
                    {
                        "setting": label,
                        "epsilon_claimed": eps,
                        "noise_multiplier": round(sigma, 3),
                        "canaries": m,
                        "ceiling_median": round(c.median, 3),
                        "ceiling_range": [round(c.low, 3), round(c.high, 3)],
                        "ceiling_ratio": round(c.median / eps, 3),
                    }
                )
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    print("| setting | claimed ε | σ | m | ceiling (median, range) | ceiling / claim |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        lo, hi = r["ceiling_range"]
        print(
            f"| {r['setting']} | {r['epsilon_claimed']:.0f} | {r['noise_multiplier']:.2f} | "
            f"{r['canaries']} | {r['ceiling_median']:.2f} ({lo:.2f}-{hi:.2f}) | "
            f"{r['ceiling_ratio']:.2f} |"
        )


def _case(kw: dict[str, Any]) -> str:
    style = kw.get("params", {}).get("clip_style", "")
    return f"{kw['strategy']} {style} K={kw.get('trials', 1)}".replace("  ", " ")


def per_strategy(data: Any, *, as_json: bool) -> None:
    """Bound / claim per strategy and engine path, at epsilon 8 and 2, q = 1 and the default
    q, m = 1000 and 10,000: one audit per cell (issue 49)."""
    n = int(data.x_train.shape[0])
    rows: list[dict[str, Any]] = []
    for kw in STRATEGIES:
        for eps in (8.0, 2.0):
            for label, batch, steps in SETTINGS:
                for m in (1000, 10000):
                    r = _audit(data, case=_case(kw), epsilon=eps, canaries=m,
                               batch_size=batch or n, steps=steps, **kw)  # fmt: skip
                    r["setting"] = label
                    r["ratio"] = round(r["epsilon_lower_bound"] / r["epsilon_claimed"], 3)
                    rows.append(r)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    print("| case | path | setting | claimed ε | m | bound | bound / claim | estimate | s |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        est = "-" if r["epsilon_estimate"] is None else f"{r['epsilon_estimate']:.2f}"
        print(
            f"| {r['case']} | {r['engine_path']} | {r['setting']} | {r['epsilon_claimed']:.2f} | "
            f"{r['canaries']} | {r['epsilon_lower_bound']:.2f} | {r['ratio']:.2f} | {est} | "
            f"{r['seconds']:.1f} |"
        )


def noise_scale(data: Any, *, as_json: bool) -> None:
    """Noise at 1, 0.9 and 0.8 of its planned scale (q = 1, claim 8): 5 audits each at m =
    1000 and 5000; how often the bound or the estimate exceeds the claim (issue 49)."""
    import pytest

    from tests.workers.canary_audit.faults import scale_noise

    n = int(data.x_train.shape[0])
    rows: list[dict[str, Any]] = []
    for m in (1000, 5000):
        for scale in (1.0, 0.9, 0.8):
            mp = pytest.MonkeyPatch()
            scale_noise(scale, mp)
            try:
                found = [
                    _audit(data, case=f"noise x{scale}", epsilon=8.0, canaries=m,
                           batch_size=n, steps=10, accountant="opacus-rdp")
                    for _ in range(5)
                ]  # fmt: skip
            finally:
                mp.undo()
            rows.append(
                {
                    "scale": scale,
                    "canaries": m,
                    "epsilon_claimed": found[0]["epsilon_claimed"],
                    "bounds": [f["epsilon_lower_bound"] for f in found],
                    "estimates": [f["epsilon_estimate"] for f in found],
                    "caught_by_bound": sum(f["exceeds_claim"] for f in found),
                    "caught_by_estimate": sum(bool(f["estimate_exceeds_claim"]) for f in found),
                    "caught_by_curve": sum(bool(f["claim_refuted"]) for f in found),
                    "curve_p_values": [f["claim_p_value"] for f in found],
                    "noise_scale_bounds": [f["noise_scale_upper_bound"] for f in found],
                }
            )
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    print(
        "| noise | m | claimed ε | bounds | estimates | caught (bound / estimate / curve) "
        "| curve p | noise scale bound |"
    )
    print("|---:|---:|---:|---|---|---:|---|---|")
    for r in rows:
        ests = ", ".join("-" if e is None else f"{e:.2f}" for e in r["estimates"])
        ps = ", ".join(f"{p:.2g}" for p in r["curve_p_values"])
        scales = ", ".join("-" if s is None else f"{s:.2f}" for s in r["noise_scale_bounds"])
        print(
            f"| {r['scale']}x | {r['canaries']} | {r['epsilon_claimed']:.2f} | "
            f"{min(r['bounds']):.2f}-{max(r['bounds']):.2f} | {ests} | "
            f"{r['caught_by_bound']}/5 / {r['caught_by_estimate']}/5 / "
            f"{r['caught_by_curve']}/5 | {ps} | {scales} |"
        )


if __name__ == "__main__":
    main()
