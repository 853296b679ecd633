"""DP fine-tuning with LoRA on a small BERT-like classifier: step time and peak memory.

Issue 52's targets: the DP step that trains LoRA adapters (r = 8 on query and value, plus the
classifier head, as peft's ``SEQ_CLS`` task does) costs at most 1.3x the non-private LoRA step,
and at most 0.5x the DP step that trains every parameter. The frozen backbone has no
per-example work at all on dpsweep's generic path: book-keeping records only the trained layers,
and the one backward computes only the activation gradients that reach them.

The model is a ``BertForSequenceClassification`` built from a config (no download): hidden 256,
4 layers, 4 heads, intermediate 1024, vocabulary 8000, 64 tokens per example, 2 classes, dropout
0 (the generic DP path refuses dropout); about 5.3 million parameters. Data are synthetic token
ids from a public seed (timing only). Methods, each on the same model and batch size:

* ``dp_lora``: dpsweep's full DP step (fixed flat clipping, Poisson sampling at rate b / N,
  secret randomness, floating-point-safe noise on the trained coordinates, SGD) for a pack of
  one LoRA model, on the path :func:`workers.generic.build_pack_model` picks (``generic``);
* ``nonprivate_lora``: a plain PyTorch step on the same LoRA model: forward on b examples, mean
  cross-entropy, backward, SGD on the trainable parameters;
* ``dp_full``: dpsweep's DP step training every parameter;
* ``nonprivate_full``: the plain PyTorch step training every parameter (context).

Time: median ms per step over ``--repeats`` rounds, the methods interleaved round-robin after
warm-up (a slow spell of the machine hits every method alike); on CUDA each step is timed up to
``torch.cuda.synchronize``. Peak memory, per method, over two steps after two warm-up steps:

* CPU: each method in a fresh process of its own, with glibc's malloc told to map every block of
  64 KiB or more on its own (``MALLOC_MMAP_THRESHOLD_``), so that a freed block leaves the
  resident set at once and cannot be reused unseen. ``step_peak_mb`` is the peak resident
  memory during the steps above what was resident just before them (Linux's ``VmHWM`` after
  resetting it through ``/proc/self/clear_refs``, minus ``VmRSS`` before): the step's working
  memory (activations, per-example quantities, gradients), without the model, the optimizer
  state and the data, resident before; ``resident_mb`` is ``VmRSS`` before the steps (the
  process with torch, the model, its state and the data). ``null`` off Linux;
* CUDA: ``step_peak_mb`` the same from ``torch.cuda.max_memory_allocated`` (after a reset)
  minus the memory allocated before, and ``peak_allocated_mb`` the absolute peak (model,
  optimizer state and data included).

Usage: ``python bench/finetune.py [--json PATH] [--repeats N] [--batch B] [--threads T]
[--device cpu|cuda] [--quick]``. ``--quick`` is a smoke run on a tiny config (seconds).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workers.engine import DPEngine
from workers.generic import build_pack_model
from workers.optim import PackedOptimizer
from workers.randomness import NoiseSource, TrialRandomness
from workers.strategies import get_strategy

LR = 0.05
METHODS = ("dp_lora", "nonprivate_lora", "dp_full", "nonprivate_full")
TARGETS = {"dp_lora_vs_nonprivate_lora": 1.3, "dp_lora_vs_dp_full": 0.5}


@dataclass(frozen=True)
class Config:
    """The model, the data and the batch."""

    hidden: int = 256
    layers: int = 4
    heads: int = 4
    intermediate: int = 1024
    vocab: int = 8000
    seq_len: int = 64
    classes: int = 2
    batch: int = 32
    rank: int = 8
    n_train: int = 4096


QUICK = Config(hidden=32, layers=2, heads=2, intermediate=64, vocab=200, seq_len=16, batch=8)


class Logits(nn.Module):
    """The Hugging Face classifier as the generic path takes models: ids in, logits out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        out: Any = self.model(input_ids=x)
        return out.logits


def build(cfg: Config, *, lora: bool) -> nn.Module:
    """The classifier (seed 0), with LoRA adapters (r = ``cfg.rank`` on query and value, the
    head trained) or every parameter trainable."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=cfg.vocab,
        hidden_size=cfg.hidden,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        intermediate_size=cfg.intermediate,
        max_position_embeddings=cfg.seq_len,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    config.num_labels = cfg.classes
    bert = BertForSequenceClassification(config)
    if not lora:
        return Logits(bert).train()
    from peft import LoraConfig, get_peft_model

    peft_cfg = LoraConfig(
        r=cfg.rank,
        lora_alpha=2 * cfg.rank,
        target_modules=["query", "value"],
        lora_dropout=0.0,
        task_type="SEQ_CLS",
    )
    return Logits(get_peft_model(bert, peft_cfg)).train()


def make_data(cfg: Config, device: torch.device) -> tuple[Tensor, Tensor]:
    """Synthetic token ids and labels from a fixed public seed (timing only)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(1, cfg.vocab, (cfg.n_train, cfg.seq_len), generator=gen)
    y = torch.randint(cfg.classes, (cfg.n_train,), generator=gen)
    return x.to(device), y.to(device)


def nonprivate_step(
    cfg: Config, x: Tensor, y: Tensor, *, lora: bool, device: torch.device
) -> Callable[[], None]:
    """A plain PyTorch step: b random examples, mean cross-entropy, backward, SGD."""
    m = build(cfg, lora=lora).to(device)
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=LR)

    def step() -> None:
        idx = torch.randint(x.shape[0], (cfg.batch,), device=device)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(m(x[idx]), y[idx]).backward()
        opt.step()

    return step


def dp_step(
    cfg: Config, x: Tensor, y: Tensor, *, lora: bool, device: torch.device
) -> tuple[Callable[[], None], dict[str, Any]]:
    """dpsweep's fixed-clipping DP step for a pack of one, and the pack's facts."""
    built, path = build_pack_model([build(cfg, lora=lora)], device=device)
    model: Any = built  # GenericModel implements what the engine uses of a PackedModel
    strategy = get_strategy("fixed")([{"clip": 1.0}], n_layers=model.n_param_layers, device=device)
    rand = TrialRandomness.secret()
    engine = DPEngine(
        model=model,
        strategy=strategy,
        optimizer=PackedOptimizer("sgd", torch.tensor([LR], device=device)),
        x=x,
        y=y,
        task="classification",
        sample_rate=cfg.batch / x.shape[0],
        noise_multiplier=torch.tensor([1.0], device=device),
        sample_streams=[rand.sample],
        noise=NoiseSource([rand.noise], device),
    )
    facts = {
        "engine_path": path,
        "trained_parameters": int(model.trained_numel),
        "total_parameters": int(model.total_numel),
        "clipping_layers": int(model.n_param_layers),
        "rules": sorted({str(r) for r in getattr(model, "rules", [])}),
    }
    return engine.step, facts


def _synced(fn: Callable[[], None], device: torch.device) -> Callable[[], None]:
    if device.type != "cuda":
        return fn

    def step() -> None:
        fn()
        torch.cuda.synchronize(device)

    return step


def interleaved_medians(
    steps: dict[str, Callable[[], None]], repeats: int, warmup: int
) -> dict[str, float]:
    """Median ms per step of each method, timed round-robin after ``warmup`` steps each."""
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


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def peak_memory(fn: Callable[[], None], device: torch.device, *, steps: int = 2) -> dict[str, Any]:
    """The memory ``steps`` calls of ``fn`` need at their peak (module docstring)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        for _ in range(steps):
            fn()
        peak = torch.cuda.max_memory_allocated(device)
        return {
            "step_peak_mb": round((peak - before) / 2**20, 1),
            "peak_allocated_mb": round(peak / 2**20, 1),
        }
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        before = _status_kb("VmRSS")
    except OSError:
        return {"step_peak_mb": None, "resident_mb": None}
    for _ in range(steps):
        fn()
    return {
        "step_peak_mb": round(max(0, _status_kb("VmHWM") - before) / 1024, 1),
        "resident_mb": round(before / 1024, 1),
    }


def method_step(name: str, cfg: Config, x: Tensor, y: Tensor, dev: torch.device) -> Any:
    """Method ``name``'s step (and, for a DP one, the pack's facts)."""
    lora = name.endswith("lora")
    if name.startswith("dp"):
        return dp_step(cfg, x, y, lora=lora, device=dev)
    return nonprivate_step(cfg, x, y, lora=lora, device=dev), None


def memory_of(name: str, cfg: Config, device: str, warmup: int) -> dict[str, Any]:
    """Method ``name``'s peak memory (module docstring): on CPU in a fresh process."""
    dev = torch.device(device)
    if dev.type == "cpu":
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}
        args = ["--memory-of", name, "--config", json.dumps(asdict(cfg)), "--warmup", str(warmup)]
        args += ["--threads", str(torch.get_num_threads())]
        p = subprocess.run(
            [sys.executable, __file__, *args], capture_output=True, text=True, env=env, check=True
        )
        out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
        return out
    x, y = make_data(cfg, dev)
    fn = _synced(method_step(name, cfg, x, y, dev)[0], dev)
    for _ in range(warmup):
        fn()
    return peak_memory(fn, dev)


def run(cfg: Config, *, repeats: int, warmup: int, device: str) -> dict[str, Any]:
    """Times, peak memory and the target ratios (module docstring)."""
    dev = torch.device(device)
    x, y = make_data(cfg, dev)
    t0 = time.perf_counter()
    built = {k: method_step(k, cfg, x, y, dev) for k in METHODS}
    steps = {k: _synced(fn, dev) for k, (fn, _) in built.items()}
    lora_facts, full_facts = built["dp_lora"][1], built["dp_full"][1]
    ms = interleaved_medians(steps, repeats, warmup)
    memory = {k: memory_of(k, cfg, device, warmup) for k in steps}
    ratios = {
        "dp_lora_vs_nonprivate_lora": ms["dp_lora"] / ms["nonprivate_lora"],
        "dp_lora_vs_dp_full": ms["dp_lora"] / ms["dp_full"],
        "dp_full_vs_nonprivate_full": ms["dp_full"] / ms["nonprivate_full"],
    }
    return {
        "config": asdict(cfg),
        "device": str(dev),
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "lora": lora_facts,
        "full": full_facts,
        "methods": {k: {"ms": round(ms[k], 2), **memory[k]} for k in METHODS},
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "targets_met": {k: ratios[k] <= bound for k, bound in TARGETS.items()},
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def print_table(res: dict[str, Any]) -> None:
    """The methods' times and memory, then the ratios against the issue's targets."""
    lo, full = res["lora"], res["full"]
    print(
        f"BERT-like classifier, {full['total_parameters']:,} parameters; LoRA trains "
        f"{lo['trained_parameters']:,} of {lo['total_parameters']:,} "
        f"({lo['clipping_layers']} clipping layers, rules {lo['rules']}); "
        f"batch {res['config']['batch']}, {res['device']}, {res['threads']} thread(s)"
    )
    mem_col = "resident MB" if res["device"] == "cpu" else "peak alloc MB"
    print(f"  {'method':<18}{'ms/step':>10}{'step peak MB':>14}{mem_col:>15}")
    for k in METHODS:
        r = res["methods"][k]
        step = r.get("step_peak_mb")
        whole = r.get("resident_mb", r.get("peak_allocated_mb"))
        cols = ["n/a" if v is None else f"{v:.1f}" for v in (step, whole)]
        print(f"  {k:<18}{r['ms']:>10.1f}{cols[0]:>14}{cols[1]:>15}")
    for k, v in res["ratios"].items():
        target = TARGETS.get(k)
        verdict = "" if target is None else f"  (target <= {target}: "
        verdict += "" if target is None else ("met)" if res["targets_met"][k] else "MISSED)")
        print(f"  {k:<30}{v:>8.3f}{verdict}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--quick", action="store_true", help="a smoke run on a tiny config")
    p.add_argument("--memory-of", default=None, help=argparse.SUPPRESS)  # a child's method
    p.add_argument("--config", default=None, help=argparse.SUPPRESS)  # the child's Config
    a = p.parse_args(argv)
    # transformers' deprecation notices and vmap's fallback notice are no figures.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message="There is a performance drop")
    torch.set_num_threads(a.threads)
    cfg = QUICK if a.quick else Config()
    if a.config is not None:
        cfg = Config(**json.loads(a.config))
    if a.batch is not None:
        cfg = replace(cfg, batch=a.batch)
    if a.memory_of is not None:  # a child measuring one method's memory (memory_of)
        dev = torch.device("cpu")
        x, y = make_data(cfg, dev)
        fn = method_step(a.memory_of, cfg, x, y, dev)[0]
        for _ in range(a.warmup):
            fn()
        print(json.dumps(peak_memory(fn, dev)))
        return 0
    res = run(cfg, repeats=a.repeats, warmup=a.warmup, device=a.device)
    print_table(res)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
