"""Step overhead on the generic path: WRN-16-4 and the text classifier, one thread.

Part of ``bench/step_overhead.py`` (``--models wrn16_4,text_classifier``). For each model it
times (median ms per step, round-robin after warm-up):

* ``nonprivate``: a plain PyTorch step (forward, mean cross-entropy, backward, SGD step);
* ``fixed``: dpsweep's full fixed-clipping (flat) DP step for a pack of one, on the path
  :func:`workers.generic.build_pack_model` picks for the model (the one ``train_pack`` uses:
  ``generic`` for both models), with secret sampling and floating-point-safe noise;
* ``fixed_materialised``: the same step on :class:`workers.generic.GenericModel`, the path that
  materialises every per-example gradient by ``torch.func`` (the default before issue 41, whose
  book-keeping path ``fixed`` now takes);
* ``opacus_hooks`` / ``opacus_ghost``: Opacus ``make_private`` with that ``grad_sample_mode``,
  fed fixed-size batches (which only favours Opacus). A mode Opacus refuses for the model is
  reported as unsupported (``null`` in the JSON, the reason under ``unsupported``), not a crash.

Each row holds every method's ``<method>_ms`` and the ratios ``fixed_vs_nonprivate``,
``fixed_vs_opacus_ghost`` and ``fixed_vs_opacus_hooks`` (issue 22's target: the generic path
no slower than Opacus ghost on the same model, i.e. ``fixed_vs_opacus_ghost <= 1``).

Data are synthetic: WRN-16-4 gets 3x32x32 uniform images with 10 classes; the text classifier
(vocabulary 1000, d_model 128, 4 heads, 2 layers, feed-forward x4) gets 64 token ids per
example, each sequence padded (id 0) after a random length between 16 and 64, with 2 classes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.opacus_step import opacus_step as shared_opacus_step
from workers.engine import DPEngine
from workers.generic import GenericModel, build_pack_model
from workers.models import ModelSpec, build_model
from workers.optim import PackedOptimizer
from workers.packed import PackedModel
from workers.randomness import NoiseSource, TrialRandomness
from workers.strategies import get_strategy

LR = 0.05
#: The training set each method samples from (small: WRN images are 12 KB each).
N_TRAIN = 4096
#: ``fixed_materialised``: the same step on the materialised torch.func path (before issue 41).
METHODS = ("nonprivate", "fixed", "fixed_materialised", "opacus_hooks", "opacus_ghost")


@dataclass(frozen=True)
class GenericBench:
    """One model of this benchmark: its spec, example shape, classes and default batch."""

    spec: ModelSpec
    input_shape: tuple[int, ...]
    classes: int
    batch: int  # the default batch size (one CPU thread)
    tokens: bool = False
    vocab: int = 0


TEXT_VOCAB = 1000
TEXT_LEN = 64
MODELS: dict[str, GenericBench] = {
    "wrn16_4": GenericBench(ModelSpec("wrn16_4"), (3, 32, 32), 10, batch=16),
    "text_classifier": GenericBench(
        ModelSpec(
            "text_classifier",
            {"vocab_size": TEXT_VOCAB, "d_model": 128, "heads": 4, "layers": 2, "max_len": 64},
        ),
        (TEXT_LEN,),
        2,
        batch=32,
        tokens=True,
        vocab=TEXT_VOCAB,
    ),
}


def make_data(bench: GenericBench, n: int = N_TRAIN) -> tuple[Tensor, Tensor]:
    """Synthetic training data for ``bench`` from a fixed public seed (timing only)."""
    gen = torch.Generator().manual_seed(0)
    y = torch.randint(bench.classes, (n,), generator=gen)
    if not bench.tokens:
        return torch.rand(n, *bench.input_shape, generator=gen), y
    t = bench.input_shape[0]
    # Ids 2.. are words (0 pads, 1 is unknown); each sequence is padded after its length.
    ids = torch.randint(2, bench.vocab, (n, t), generator=gen)
    lengths = torch.randint(t // 4, t + 1, (n, 1), generator=gen)
    ids[torch.arange(t).unsqueeze(0) >= lengths] = 0
    return ids, y


def build(bench: GenericBench) -> nn.Module:
    return build_model(bench.spec, input_shape=bench.input_shape, num_classes=bench.classes, seed=0)


def nonprivate_step(bench: GenericBench, x: Tensor, y: Tensor, b: int) -> Callable[[], None]:
    m = build(bench).train()
    opt = torch.optim.SGD(m.parameters(), lr=LR)

    def step() -> None:
        idx = torch.randint(x.shape[0], (b,))
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(m(x[idx]), y[idx]).backward()
        opt.step()

    return step


def dpsweep_step(
    bench: GenericBench, x: Tensor, y: Tensor, b: int, *, materialised: bool = False
) -> tuple[Callable[[], None], str]:
    """dpsweep's fixed-clipping DP step on the path ``train_pack`` picks, and that path; with
    ``materialised``, on the torch.func path that materialises every per-example gradient."""
    built: PackedModel | GenericModel
    if materialised:
        built, path = GenericModel([build(bench)]), "generic-materialised"
    else:
        built, path = build_pack_model([build(bench)])
    # GenericModel implements structurally what the engine uses of a PackedModel.
    model: PackedModel = built  # type: ignore[assignment]
    strategy = get_strategy("fixed")([{"clip": 1.0}], n_layers=model.n_param_layers, device="cpu")
    rand = TrialRandomness.secret()
    engine = DPEngine(
        model=model,
        strategy=strategy,
        optimizer=PackedOptimizer("sgd", torch.tensor([LR])),
        x=x,
        y=y,
        task="classification",
        sample_rate=b / x.shape[0],
        noise_multiplier=torch.tensor([1.0]),
        sample_streams=[rand.sample],
        noise=NoiseSource([rand.noise], model.device),
    )
    return engine.step, path


def opacus_step(bench: GenericBench, x: Tensor, y: Tensor, b: int, mode: str) -> Callable[[], None]:
    """An Opacus DP step (``make_private`` with ``grad_sample_mode=mode``); raises if refused."""
    return shared_opacus_step(build(bench).train(), x, y, b, mode, lr=LR)


def _try(
    build_step: Callable[[], Callable[[], None]], label: str
) -> tuple[Callable[[], None] | None, str]:
    """The step after one trial call, or None and the reason if building or running it fails
    (the method is then reported unsupported; the reason also goes to stderr)."""
    try:
        fn = build_step()
        fn()
    except Exception as e:
        reason = f"{type(e).__name__}: {e}"
        print(f"[step_overhead] {label}: unsupported ({reason})", file=sys.stderr)
        return None, reason
    return fn, ""


def run_generic(
    name: str,
    batches: list[int],
    repeats: int,
    timer: Callable[[dict[str, Callable[[], Any]], int, int], dict[str, float]],
) -> dict[str, dict[str, Any]]:
    """Rows ``{batch: row}`` for model ``name``; ``timer(steps, repeats, warmup)`` gives the
    median ms per step of each method, timed round-robin."""
    bench = MODELS[name]
    x, y = make_data(bench)
    rows: dict[str, dict[str, Any]] = {}
    path_of: dict[int, str] = {}  # the engine path dpsweep took, per batch size

    def dp(b: int) -> Callable[[], None]:
        step, path_of[b] = dpsweep_step(bench, x, y, b)
        return step

    def dp_materialised(b: int) -> Callable[[], None]:
        return dpsweep_step(bench, x, y, b, materialised=True)[0]

    for b in batches:
        t0 = time.perf_counter()

        builders: dict[str, Callable[[], Callable[[], None]]] = {
            "nonprivate": partial(nonprivate_step, bench, x, y, b),
            "fixed": partial(dp, b),
            "fixed_materialised": partial(dp_materialised, b),
            "opacus_hooks": partial(opacus_step, bench, x, y, b, "hooks"),
            "opacus_ghost": partial(opacus_step, bench, x, y, b, "ghost"),
        }
        steps: dict[str, Callable[[], Any]] = {}
        unsupported: dict[str, str] = {}
        for method, make in builders.items():
            fn, reason = _try(make, f"{name} batch {b} {method}")
            if fn is None:
                unsupported[method] = reason
            else:
                steps[method] = fn
        # The trial call above was the first warm-up.
        ms = timer(steps, repeats, 1)
        row: dict[str, Any] = {"engine_path": path_of.get(b), "batch": b}
        for method in METHODS:
            row[f"{method}_ms"] = round(ms[method], 3) if method in ms else None
        for other in ("nonprivate", "fixed_materialised", "opacus_ghost", "opacus_hooks"):
            ok = "fixed" in ms and other in ms
            row[f"fixed_vs_{other}"] = round(ms["fixed"] / ms[other], 3) if ok else None
        row["unsupported"] = unsupported
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        rows[str(b)] = row
    return rows


def print_rows(name: str, rows: dict[str, dict[str, Any]]) -> None:
    """The table for one model: ms per method, and dpsweep's fixed step against each."""

    def fmt(v: float | None, spec: str) -> str:
        return "unsupported" if v is None else format(v, spec)

    for b, r in rows.items():
        print(f"\n{name} batch {b} (dpsweep on the {r['engine_path']} path):")
        print(f"  {'method':<14}{'ms/step':>12}{'fixed / it':>12}")
        for method in METHODS:
            ratio = 1.0 if method == "fixed" else r[f"fixed_vs_{method}"]
            print(f"  {method:<14}{fmt(r[f'{method}_ms'], '.1f'):>12}{fmt(ratio, '.2f'):>12}")
