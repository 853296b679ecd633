"""Evaluating a pack while it trains: the raw weights, their average, and DP evaluation's count.

With DP evaluation every measurement is a noisy release of the evaluation records, and the plan
charged a fixed number of them: :meth:`PackMeasure.measure` counts each trial's releases and
refuses one more than the plan charged (fail closed). Clipping diagnostics use a fixed batch of
the public evaluation split, never training data; with DP evaluation there are none.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dpsweep.errors import PrivacyError
from workers.seeding import stream_seed
from workers.training.evaluation import DIAGNOSTIC_BATCH, _evaluate, _noisy_accuracy
from workers.training.prepare import PreparedPack
from workers.training.records import PackRecords


class PackMeasure:
    """The pack's evaluations, written into ``records``."""

    def __init__(self, pack: PreparedPack, records: PackRecords) -> None:
        self.pack = pack
        self.records = records
        self.released = [0] * pack.k
        n_diag = 0 if pack.dp_eval else min(int(pack.x_test.shape[0]), DIAGNOSTIC_BATCH)
        self.n_diag = n_diag
        self.x_diag = pack.x_test[:n_diag]
        self.t_diag = pack.y_test[:n_diag] if pack.task == "classification" else self.x_diag
        self.diag_gens = [
            torch.Generator(device=pack.device).manual_seed(stream_seed(t.seed, "diag"))
            for t in pack.spec.trials
        ]
        self._eval_units: torch.Tensor | None = None

    @property
    def eval_units(self) -> torch.Tensor | None:
        """Each evaluation row's unit on the pack's device (None: each row its own unit)."""
        data = self.pack.data
        if not data.has_units or data.units_test is None:
            return None
        if self._eval_units is None:
            self._eval_units = torch.from_numpy(data.units_test).to(self.pack.device)
        return self._eval_units

    def measure(self) -> list[dict[str, Any]]:
        """The model's metrics now, one dict per trial (noisy and counted with DP evaluation)."""
        p = self.pack
        if p.count_noise is None:
            return _evaluate(p.model, p.x_test, p.y_test, p.task)
        if p.spec.eval_noise_multiplier is None:
            raise PrivacyError("DP evaluation without a planned evaluation noise multiplier")
        for i in range(p.k):
            self.released[i] += 1
        if max(self.released) > p.n_releases:  # never release more than the plan charged
            raise PrivacyError("DP evaluation would release more noisy counts than planned")
        return _noisy_accuracy(
            p.model,
            p.x_test,
            p.y_test,
            p.count_noise,
            noise_multiplier=p.spec.eval_noise_multiplier,
            n_records=p.data.planning_n_eval,
            # With a privacy unit the count is over units (each adds its rows' mean
            # correctness), so one unit moves it by at most 1, as the plan's noise assumes.
            units=self.eval_units,
        )

    def evaluate(self, step: int) -> list[dict[str, Any]]:
        """Measure, record the trajectories and the evaluation, then the average's (if any)."""
        p = self.pack
        finite = torch.isfinite(p.model.flat).all(dim=1).tolist()
        results = self.measure()
        scale = p.strategy.lr_scale()
        eff_lr = (p.lr if scale is None else p.lr * scale).mul(p.optimizer.last_factor).tolist()
        state = {name: v.tolist() for name, v in p.strategy.state().items()}
        if self.n_diag:
            # Trials are computed independently, so a diverged trial's NaNs stay in its own row.
            diag = p.engine.diagnostics(self.x_diag, self.t_diag, self.diag_gens)
            state.update({name: v.tolist() for name, v in diag.items()})
        self.records.record_trajectories(step, eff_lr, state)
        self.records.record_evaluation(step, results, finite, p.model.flat)
        if p.average is None:
            return results
        # The averaged weights at the same point, after the raw ones (a tie keeps the raw).
        averaged = self._evaluate_average(step)
        out = []
        for i in range(p.k):
            ema = averaged[i]
            extra = {} if ema is None else _prefixed(ema, "ema_")
            self.records.add_to_history(i, step, extra)
            out.append({**results[i], **extra})
        return out

    def _evaluate_average(self, step: int) -> list[dict[str, Any] | None]:
        """Measure the averaged weights exactly as the raw ones (same split, same metrics)."""
        p = self.pack
        average = p.average
        assert average is not None  # only called with an average
        raw = p.model.flat.clone()
        with torch.no_grad():
            p.model.flat.copy_(average.flat)
        try:
            finite = torch.isfinite(p.model.flat).all(dim=1).tolist()
            results = self.measure()
        finally:
            with torch.no_grad():
                p.model.flat.copy_(raw)
        out: list[dict[str, Any] | None] = []
        for i in range(p.k):
            m = results[i]
            if finite[i] and math.isfinite(m[self.records.objective]):
                self.records.consider(i, step, m, average.flat[i], "ema")
                out.append(m)
            else:
                out.append(None)
        return out

    def remeasure_selected(self) -> None:
        """DP evaluation: the selected checkpoints measured once more, with fresh noise.

        The noisy value that won the selection over-states the checkpoint's accuracy (the
        maximum of noisy values is biased upwards); the plan charged this release too.
        """
        r = self.records
        with torch.no_grad():
            self.pack.model.flat.copy_(r.best_flat)
        fresh = self.measure()
        for i in range(self.pack.k):
            if r.best_step[i] is not None:
                r.best_metrics[i] = {
                    **fresh[i],
                    "accuracy_at_selection": r.best_metrics[i].get("accuracy"),
                }


def _prefixed(metrics: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The numeric metrics of ``metrics`` under prefixed names (the averaged weights')."""
    return {
        f"{prefix}{name}": v
        for name, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
