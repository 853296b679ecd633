"""The up-front check of a model for the generic path: layers that break per-example DP.

Per-example gradients (and so clipping, and so DP-SGD's sensitivity) need every example's output
to depend on that example alone. Opacus's :class:`~opacus.validators.ModuleValidator` knows the
layers that break this (BatchNorm mixes the examples of a batch; InstanceNorm with running
statistics keeps unnoised statistics of the private data) and how to fix them; this module runs
its per-layer validators on every submodule, names the offending layer by its path, and says
the fix.

Opacus also refuses ``nn.MultiheadAttention``, ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN``, but only
because its *hooks* cannot differentiate them example by example; the generic path uses
``torch.func`` (exact for any composition of per-example operations), so those are accepted.

Dropout is refused on the generic path: the loss pass and the per-example gradient pass would
draw different masks, so the gradients would not be those of the loss (and vmap forbids random
operations by default). The messages name layer types and paths only, nothing from the data.
"""

from __future__ import annotations

from torch import nn

from dpsweep.errors import ConfigError

# Opacus refuses these only for its hook-based per-sample gradients; torch.func handles them.
_HOOK_ONLY: tuple[type[nn.Module], ...] = (nn.MultiheadAttention, nn.LSTM, nn.GRU, nn.RNN)

_BATCH_NORMS: tuple[type[nn.Module], ...] = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
)


def validate_module(module: nn.Module) -> None:
    """Refuse a model the generic DP path cannot train with per-example guarantees.

    Raises:
        ConfigError: naming the first offending layer (type and path) and its fix.
    """
    # deferred: opacus is heavy, and only a generic-path model is validated
    from opacus.validators import ModuleValidator

    for path, sub in module.named_modules():
        where = f"{type(sub).__name__} at {path or '<root>'!r}"
        if isinstance(sub, _BATCH_NORMS):
            raise ConfigError(
                f"{where} mixes the examples of a batch (each is normalised with its batch's "
                "statistics), so per-example gradients, and with them DP-SGD's guarantee, do "
                "not hold; use GroupNorm (opacus ModuleValidator.fix does this) or LayerNorm",
                field="model",
            )
        if _dropout_p(sub) > 0:
            raise ConfigError(
                f"{where} uses dropout, which the generic DP path does not support (the loss "
                "and per-example gradient passes would draw different masks); set its "
                "dropout probability to 0",
                field="model",
            )
        validator = ModuleValidator.VALIDATORS.get(type(sub))
        if validator is None or isinstance(sub, _HOOK_ONLY):
            continue
        errors = validator(sub)
        if errors:
            fix = (
                "set track_running_stats=False"
                if isinstance(sub, nn.modules.instancenorm._InstanceNorm)
                else "opacus ModuleValidator.fix replaces it"
            )
            raise ConfigError(
                f"{where} is not supported in DP training: {errors[0]}; {fix}", field="model"
            )


def _dropout_p(m: nn.Module) -> float:
    # Every dropout layer (Dropout, Dropout1d-3d, AlphaDropout, ...) derives from _DropoutNd.
    if isinstance(m, nn.modules.dropout._DropoutNd):
        return float(m.p)
    if isinstance(m, nn.MultiheadAttention):
        return float(m.dropout)
    if isinstance(m, (nn.LSTM, nn.GRU, nn.RNN)):
        return float(m.dropout)
    return 0.0
