"""Step-time overhead of DP-SGD against a plain non-private step, with one torch thread.

torch runs on one thread for every step. DP steps follow the worker setting
``DPSWEEP_NOISE_AHEAD``, off by default (opt-in): every noise draw is made on the training
thread. With ``DPSWEEP_NOISE_AHEAD=1`` a DP step makes its next step's noise draws on a second
thread while it runs (:mod:`workers.noise_ahead`), so DP steps may keep two cores busy where
the non-private step keeps one; ``--sequential-too`` then adds the same steps with every draw
on the training thread (keys ``<strategy>_sequential``), timed in the same rounds.

For ``mlp`` (784-128-10) and ``cnn`` (004 Table 5) on 28x28 inputs at batch sizes 64 and 256, it
times (median over repeated steps, after warm-up):

* ``nonprivate_ms``: a plain PyTorch step (forward, mean cross-entropy, backward, SGD step);
* ``fixed``: dpsweep's full fixed-clipping DP step (Poisson sampling, per-sample norms,
  clipping, noise, SGD) for a pack of one, with its secret randomness (AES-CTR keystreams from
  a fresh OS secret) and floating-point-safe noise (float64 polar sampler, snapped release);
* ``fixed_plain_noise``: the same step with the noise that is *not* safe, torch's float32
  ``randn`` from a seeded generator added in float32 (what dpsweep did before): the ratio
  ``fixed / fixed_plain_noise`` is the cost of the secure noise and sampling;
* ``opacus_hooks`` / ``opacus_ghost``: Opacus ``make_private`` with that grad_sample_mode
  (fed fixed-size batches, which only favours Opacus);
* one key per other strategy (``automatic``, ``global``, ``quantile``, ``online``, ``bam``):
  dpsweep's full DP step with that strategy;
* ``lipschitz`` (``mlp`` rows only): the clipless step on ``lip_mlp`` (784-128-128-10) against
  a non-private step of that same Lipschitz model, which also keeps its layers 1-Lipschitz by
  the usual power-iteration spectral normalisation (``lip_nonprivate_ms``); and
  ``lipschitz_vs_unprojected``, against the bare step with no projection at all.

Every ratio is against the row's non-private step; the table also shows each strategy against
``fixed``.

``wrn16_4`` (3x32x32 images, batch 16) and ``text_classifier`` (64 token ids, batch 32) run on
the generic path and have their own rows (:mod:`step_overhead_generic`): ms per step of the
non-private step, dpsweep's fixed (flat) DP step, Opacus hooks and Opacus ghost, and the ratios
``fixed_vs_nonprivate`` and ``fixed_vs_opacus_ghost`` (an Opacus mode that refuses the model
is reported as unsupported). They are in the default set of models.

Usage: ``python bench/step_overhead.py [--json] [--quick] [--repeats N]
[--models mlp,cnn,wrn16_4,text_classifier] [--batches 64,256] [--strategies all|none|a,b]
[--sequential-too] [--device cpu|cuda]``;
without ``--batches`` each model gets its default batch sizes (64 and 256 for mlp/cnn, 16 for
wrn16_4, 32 for text_classifier).

``--quick`` is the first look, in under a minute: mlp and cnn at batch 64, fixed, online and
BAM against the non-private step and Opacus, 10 rounds (flags given beside it win).
``--device cuda`` runs the packed-path rows on a GPU, each step timed up to
``torch.cuda.synchronize``; the secret keystreams and the float64 sampler stay on the host, as
they do in training. The generic-path rows are CPU-only and skipped there.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from torch import nn

from bench import step_overhead_generic as generic
from bench.opacus_step import opacus_step as shared_opacus_step
from workers.engine import DPEngine
from workers.models import ModelSpec, build_model
from workers.noise_ahead import NoiseAhead
from workers.optim import PackedOptimizer
from workers.packed import PackedModel
from workers.randomness import NoiseSource, TrialRandomness
from workers.settings import WorkerSettings
from workers.strategies import get_strategy

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


def lipschitz_nonprivate_step(
    x: torch.Tensor, y: torch.Tensor, b: int, model: nn.Sequential
) -> Callable[[], None]:
    """A non-private step of a Lipschitz model, which must also keep its layers 1-Lipschitz.

    Without privacy at stake an estimate suffices: one warm-started power iteration per layer
    (standard spectral normalisation), then ``W /= max(1, sigma_estimate)``.
    """
    model = model.to(x.device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    linears = [m for m in model if isinstance(m, nn.Linear)]
    us = [torch.randn(m.out_features, device=x.device) for m in linears]

    def step() -> None:
        idx = torch.randint(x.shape[0], (b,), device=x.device)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        with torch.no_grad():
            for m, u in zip(linears, us, strict=True):
                v = torch.nn.functional.normalize(m.weight.t() @ u, dim=0)
                u.copy_(torch.nn.functional.normalize(m.weight @ v, dim=0))
                m.weight.div_(torch.clamp(u @ m.weight @ v, min=1.0))

    return step


def nonprivate_step(
    name: str, x: torch.Tensor, y: torch.Tensor, b: int, model: nn.Sequential | None = None
) -> Callable[[], None]:
    m = (model if model is not None else _model(name)).to(x.device)
    opt = torch.optim.SGD(m.parameters(), lr=LR)

    def step() -> None:
        idx = torch.randint(x.shape[0], (b,), device=x.device)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(m(x[idx]), y[idx]).backward()
        opt.step()

    return step


# Representative hyperparameters per strategy (defaults of the papers where they exist).
STRATEGY_PARAMS: dict[str, dict[str, Any]] = {
    "fixed": {"clip": 1.0},
    "automatic": {"clip": 1.0},
    "global": {"clip": 1.0, "global_threshold": 1.0},
    "quantile": {"target_quantile": 0.5},
    "online": {},
    "bam": {"clip": 1.0, "bam_lambda": 0.1},
}


def dpsweep_step(
    name: str,
    x: torch.Tensor,
    y: torch.Tensor,
    b: int,
    strategy_name: str = "fixed",
    model: nn.Sequential | None = None,
    plain_noise: bool = False,
    noise_ahead: bool | None = None,
) -> Callable[[], None]:
    """``noise_ahead``: make the next step's draws on a second thread (:mod:`workers.noise_ahead`);
    ``None`` follows the worker setting (``DPSWEEP_NOISE_AHEAD``, off by default)."""
    if noise_ahead is None:
        noise_ahead = WorkerSettings().noise_ahead
    params = STRATEGY_PARAMS.get(strategy_name, {})
    packed = PackedModel([model if model is not None else _model(name)], device=x.device)
    strategy = get_strategy(strategy_name)(
        [params], n_layers=packed.n_param_layers, device=packed.device
    )
    rand = TrialRandomness.secret()
    engine = DPEngine(
        model=packed,
        strategy=strategy,
        optimizer=PackedOptimizer("sgd", torch.tensor([LR], device=x.device)),
        x=x,
        y=y,
        task="classification",
        sample_rate=b / x.shape[0],
        noise_multiplier=torch.tensor([1.0], device=x.device),
        sample_streams=[rand.sample],
        noise=(NoiseAhead if noise_ahead and not plain_noise else NoiseSource)(
            [rand.noise], packed.device
        ),
    )
    if plain_noise:
        gen = torch.Generator().manual_seed(2)

        def unsafe_noise(buf: torch.Tensor, sensitivity: torch.Tensor, mult: torch.Tensor) -> Any:
            # The baseline only: float32 randn, truncated near 5.8 sigma, seeded, not snapped.
            xi = torch.randn(1, buf.shape[1], generator=gen).to(buf.device)
            return buf.add_(xi, alpha=float(mult * sensitivity / engine.expected_batch_size))

        engine._add_noise = unsafe_noise  # type: ignore[method-assign]
    return engine.step


def opacus_step(
    name: str, x: torch.Tensor, y: torch.Tensor, b: int, mode: str
) -> Callable[[], None]:
    return shared_opacus_step(_model(name).to(x.device), x, y, b, mode, lr=LR)


def _synced(fn: Callable[[], Any], device: torch.device) -> Callable[[], None]:
    """``fn`` followed by a wait for the device: CUDA kernels run asynchronously, so a step is
    over when the GPU is done, not when Python returns."""

    def step() -> None:
        fn()
        torch.cuda.synchronize(device)

    return step


def run(
    models: list[str],
    batches: list[int] | None,
    repeats: int,
    strategies: list[str],
    sequential_too: bool = False,
    device: str = "cpu",
) -> dict[str, dict[str, dict[str, Any]]]:
    """Rows ``{model: {batch: row}}``; ``batches`` None gives each model its default sizes.

    ``sequential_too`` adds ``<strategy>_sequential`` keys: the same steps with every noise
    draw on the training thread (``DPSWEEP_NOISE_AHEAD=0``), timed in the same rounds.
    ``device`` ``cuda``: every step runs on the GPU and is timed up to a synchronize; the
    generic-path rows run on the CPU only and are skipped there.
    """
    from workers.models import MODELS

    torch.set_num_threads(1)
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(N_TRAIN, *SHAPE, generator=gen).to(dev)
    y = torch.randint(CLASSES, (N_TRAIN,), generator=gen).to(dev)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name in models:
        if name in generic.MODELS and dev.type != "cpu":
            print(f"{name}: the generic-path rows run on the CPU only; skipped", file=sys.stderr)
            continue
        if name in generic.MODELS:
            sizes = batches or [generic.MODELS[name].batch]
            out[name] = generic.run_generic(name, sizes, repeats, _interleaved_medians)
            continue
        out[name] = {}
        for b in batches or DEFAULT_BATCHES:
            steps = {
                "nonprivate": nonprivate_step(name, x, y, b),
                "fixed": dpsweep_step(name, x, y, b),
                "fixed_plain_noise": dpsweep_step(name, x, y, b, plain_noise=True),
                "opacus_hooks": opacus_step(name, x, y, b, "hooks"),
                "opacus_ghost": opacus_step(name, x, y, b, "ghost"),
            }
            for s in strategies:
                if s not in steps and s != "lipschitz":
                    steps[s] = dpsweep_step(name, x, y, b, s)
            if sequential_too:
                for s in ["fixed", *(s for s in strategies if s != "lipschitz")]:
                    steps[f"{s}_sequential"] = dpsweep_step(name, x, y, b, s, noise_ahead=False)
            lip = name == "mlp" and "lipschitz" in strategies and "lip_mlp" in MODELS
            if lip:
                lip_model = build_model(
                    ModelSpec("lip_mlp", {"hidden": [128, 128]}),
                    input_shape=SHAPE,
                    num_classes=CLASSES,
                    seed=0,
                )
                steps["lip_nonprivate"] = nonprivate_step(
                    name, x, y, b, model=copy.deepcopy(lip_model)
                )
                steps["lip_nonprivate_projected"] = lipschitz_nonprivate_step(
                    x, y, b, copy.deepcopy(lip_model)
                )
                steps["lipschitz"] = dpsweep_step(
                    name, x, y, b, "lipschitz", model=copy.deepcopy(lip_model)
                )
            if dev.type == "cuda":
                steps = {k: _synced(fn, dev) for k, fn in steps.items()}
            ms = _interleaved_medians(steps, repeats)
            base = ms.pop("nonprivate")
            row: dict[str, float] = {"nonprivate_ms": round(base, 3)}
            if lip:
                lip_plain = ms.pop("lip_nonprivate")
                lip_base = ms.pop("lip_nonprivate_projected")
                lip_dp = ms.pop("lipschitz")
                row["lip_nonprivate_ms"] = round(lip_base, 3)
                row["lip_nonprivate_unprojected_ms"] = round(lip_plain, 3)
                row["lipschitz"] = round(lip_dp / lip_base, 3)
                row["lipschitz_vs_unprojected"] = round(lip_dp / lip_plain, 3)
            row.update({k: round(v / base, 3) for k, v in ms.items()})
            out[name][str(b)] = row
    return out


ALL_STRATEGIES = ["automatic", "global", "quantile", "online", "bam", "lipschitz"]
DEFAULT_BATCHES = [64, 256]
# --quick: the packed models at one batch size, the strategies users compare most, and fewer
# rounds (medians of 10 interleaved rounds are already within a few per cent of 20).
QUICK: dict[str, Any] = {
    "models": "mlp,cnn",
    "batches": "64",
    "strategies": "online,bam",
    "repeats": 10,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--models", default="mlp,cnn,wrn16_4,text_classifier", help="comma list")
    p.add_argument(
        "--batches", default=None, help="comma list for every model (default: per model)"
    )
    p.add_argument("--strategies", default="all", help="'all', 'none' or a comma list")
    p.add_argument(
        "--sequential-too",
        action="store_true",
        help="also time each DP step with its noise drawn on the training thread",
    )
    p.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where the steps run (cuda: timed up to torch.cuda.synchronize)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"a first look in under a minute: {QUICK}, unless given",
    )
    a = p.parse_args(argv)
    if a.quick:
        given = set(argv if argv is not None else sys.argv[1:])
        for flag, value in QUICK.items():
            if f"--{flag}" not in given:
                setattr(a, flag, value)
    strategies = (
        ALL_STRATEGIES
        if a.strategies == "all"
        else []
        if a.strategies == "none"
        else a.strategies.split(",")
    )
    batches = [int(b) for b in a.batches.split(",")] if a.batches else None
    res = run(a.models.split(","), batches, a.repeats, strategies, a.sequential_too, a.device)
    if a.json:
        print(json.dumps(res))
        return 0
    print(
        "median step time, one torch thread (DP noise drawn ahead on a second thread only with "
        "DPSWEEP_NOISE_AHEAD=1, never in '_sequential'); 'x np' = vs the non-private step, "
        "'x fixed' = vs fixed"
    )
    print("(lipschitz: vs the non-private step of the same lip_mlp model)")
    for name, rows in res.items():
        if name in generic.MODELS:
            generic.print_rows(name, rows)
            continue
        for b, r in rows.items():
            print(f"\n{name} batch {b}: non-private step {r['nonprivate_ms']:.3f} ms")
            print(f"  {'method':<18}{'x np':>8}{'x fixed':>9}")
            for key, v in r.items():
                if key.endswith("_ms"):
                    continue
                vs_fixed = "" if key.startswith("lipschitz") else f"{v / r['fixed']:>9.2f}"
                print(f"  {key:<18}{v:>8.2f}{vs_fixed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
