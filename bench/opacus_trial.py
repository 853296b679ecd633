"""One DP-SGD trial written as a plain Opacus user would write it, for the end-to-end benches.

``bench/first_result.py`` runs this file as a script (``python bench/opacus_trial.py JSON``), so
its Python start-up and imports are billed to it as they are to ``dpsweep run``;
``bench/vs_opacus.py`` calls :func:`run_trial` in a process pool. It deliberately imports nothing
from dpsweep: the same data (scikit-learn's digits, pixels scaled to [0, 1], a seeded 80/20
train/evaluation split), the same models (``mlp``: one hidden layer of 128, ReLU; ``cnn``: the
stack of ``workers/models/cnn.py``), Poisson sampling at the planned sample rate, the planned
number of steps and noise multiplier, SGD, a flat clip, and an accuracy evaluation on the held-out
split every ``eval_every`` steps and at the end.

The trial is a JSON object: ``model``, ``lr``, ``clip``, ``sigma``, ``steps``, ``sample_rate``,
``batch_size``, ``eval_every``, ``seed``, ``test_fraction``; optionally ``momentum`` (SGD's),
``ema`` (the decay of a moving average of the weights kept beside them, with dpsweep's warmup
min(decay, (1 + t) / (10 + t)); both weights are evaluated at every evaluation) and
``data_path`` (an ``.npz`` of ``x``, ``y``, ``x_test``, ``y_test``: MNIST-1D as the mnist1d
package generates it, trained on ``x`` and evaluated on the public ``x_test``; ``mlp`` is then
40-128-10). The script prints ``{"accuracy": ...}``.
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any


def _model(name: str, features: int = 64) -> Any:
    """``mlp`` or ``cnn`` for 8x8 single-channel digits (``mlp`` on ``features`` inputs), as
    dpsweep builds them."""
    from torch import nn

    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(features, 128), nn.ReLU(), nn.Linear(128, 10))
    if name == "cnn":
        # workers/models/cnn.py on 1x8x8 inputs: 8x8 -> conv8 p3 -> 7x7 -> pool2 s1 -> 6x6 ->
        # conv4 -> 3x3, 32 channels.
        return nn.Sequential(
            nn.Conv2d(1, 16, kernel_size=8, stride=1, padding=3),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=1),
            nn.Conv2d(16, 32, kernel_size=4, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(32 * 3 * 3, 32),
            nn.ReLU(),
            nn.Linear(32, 10),
        )
    raise ValueError(f"unknown model {name!r}")


def run_trial(trial: dict[str, Any]) -> dict[str, float]:
    """Train and evaluate one trial with Opacus; its best evaluation accuracy."""
    import numpy as np
    import torch
    from opacus import PrivacyEngine
    from sklearn.datasets import load_digits
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    # One thread per trial, as each dpsweep worker trains with one (a pool of N processes on N
    # cores would otherwise oversubscribe them).
    torch.set_num_threads(1)
    torch.manual_seed(int(trial["seed"]))
    if trial.get("data_path"):
        with np.load(str(trial["data_path"])) as f:
            x_tr = torch.tensor(f["x"], dtype=torch.float32)
            y_tr = torch.tensor(f["y"], dtype=torch.long)
            x_eval = torch.tensor(f["x_test"], dtype=torch.float32)
            y_eval = torch.tensor(f["y_test"], dtype=torch.long)
    else:
        d = load_digits()
        x = torch.tensor(d.images / 16.0, dtype=torch.float32).unsqueeze(1)
        y = torch.tensor(d.target, dtype=torch.long)
        perm = np.random.default_rng(int(trial["seed"])).permutation(len(y))
        n_eval = round(len(y) * float(trial["test_fraction"]))
        ev, tr = perm[:n_eval], perm[n_eval:]
        x_eval, y_eval, x_tr, y_tr = x[ev], y[ev], x[tr], y[tr]
    train = TensorDataset(x_tr, y_tr)

    model = _model(str(trial["model"]), features=int(x_tr[0].numel()))
    opt = torch.optim.SGD(
        model.parameters(), lr=float(trial["lr"]), momentum=float(trial.get("momentum", 0.0))
    )
    loader = DataLoader(train, batch_size=int(trial["batch_size"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, loader = PrivacyEngine().make_private(
            module=model,
            optimizer=opt,
            data_loader=loader,
            noise_multiplier=float(trial["sigma"]),
            max_grad_norm=float(trial["clip"]),
            poisson_sampling=True,
        )
    # Opacus's Poisson loader draws batches at rate batch_size / n; the plan's rate wins.
    loader.batch_sampler.sample_rate = float(trial["sample_rate"])  # type: ignore[union-attr]
    crit = nn.CrossEntropyLoss()

    decay = trial.get("ema")
    params = [p for p in model.parameters()]
    # The moving average of the weights (as torch.optim.swa_utils would keep it by hand).
    avg = [p.detach().clone() for p in params] if decay else []

    def evaluate() -> float:
        model.eval()
        with torch.no_grad():
            acc = (model(x_eval).argmax(1) == y_eval).float().mean().item()
            if avg:
                raw = [p.detach().clone() for p in params]
                for p, a in zip(params, avg, strict=True):
                    p.copy_(a)
                acc = max(acc, (model(x_eval).argmax(1) == y_eval).float().mean().item())
                for p, r in zip(params, raw, strict=True):
                    p.copy_(r)
        model.train()
        return float(acc)

    best, step, steps, every = 0.0, 0, int(trial["steps"]), int(trial["eval_every"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while step < steps:
            for xb, yb in loader:
                opt.zero_grad(set_to_none=True)
                if len(yb):
                    crit(model(xb), yb).backward()
                opt.step()
                if avg:
                    d = min(float(decay), (1 + step) / (10 + step))
                    with torch.no_grad():
                        torch._foreach_lerp_(avg, [p.detach() for p in params], 1.0 - d)
                step += 1
                if step % every == 0 or step == steps:
                    best = max(best, evaluate())
                if step == steps:
                    break
    return {"accuracy": best}


if __name__ == "__main__":
    print(json.dumps(run_trial(json.loads(sys.argv[1]))))
