"""What a clipping strategy *is*, without torch: its hyperparameters, their ranges, its noise split.

A :class:`StrategyDescriptor` is the torch-free half of a strategy. The API, the planner and
sweep submission read only descriptors, so they can refuse a bad hyperparameter value (and
compute a plan's gradient noise) without importing torch and before any budget is reserved. The
torch half (:class:`workers.strategies.base.ClippingStrategy`) is looked up by the same stable
name and takes its ``name``, ``private`` flag and ``hyperparameters`` from its descriptor; it
validates trial parameters with the same :meth:`StrategyDescriptor.validate` and splits its noise
with the same :meth:`StrategyDescriptor.noise_split`, so submission, plan and run agree.

Registration is a function call (:func:`register_descriptor`), so that plugins may add
strategies later; the built-in descriptors are registered when this module is imported, and
plug-ins (entry points of the group ``dpsweep.strategies``, :mod:`workers.plugins`) the first
time the names are listed or a name is not found.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dpsweep.errors import ConfigError
from dpsweep.registry import Registry
from dpsweep.spec import DEFAULT_GRIDS, propose_grid
from workers.count_noise import auto_count_noise
from workers.options import HParam, check_settings
from workers.plugins import load_plugins


@dataclass(frozen=True)
class NoiseSplit:
    """How a strategy spends one Gaussian step of multiplier sigma.

    ``gradient`` is the gradient's multiplier sigma_g; ``second`` the multiplier of the
    strategy's second release (``None`` when it has none), with
    ``sigma^-2 = sigma_g^-2 + second^-2``.
    """

    gradient: float
    second: float | None = None


#: ``(sigma, validated params, expected batch size b) -> NoiseSplit``.
NoiseSplitFn = Callable[[float, Mapping[str, Any], float], NoiseSplit]


class NoiseSplitInfeasible(ConfigError):
    """The second release would need the whole step's budget (the planner: an infeasible plan)."""


def split_noise(noise_multiplier: float, second: float) -> float:
    """``sigma_g = (sigma^-2 - second^-2)^(-1/2)``: what the second release leaves the gradient."""
    if noise_multiplier == 0.0:
        return 0.0
    return float((noise_multiplier**-2 - second**-2) ** -0.5)


@dataclass(frozen=True, eq=False)
class StrategyDescriptor:
    """The torch-free description of a clipping strategy.

    Args:
        name: the stable name stored in the database and used in specs.
        description: one line for listings.
        hyperparameters: the declared hyperparameters (``lr`` is not one: every trial has it).
        private: False for the non-private baseline (no clipping, no noise).
        packable: whether its trials may share a pack (one vectorised run) with others.
        gradient_passes: per-sample gradient passes per step (BAM needs a second, perturbed
            one; the packer's memory estimate scales with it).
        split: the noise split, for strategies with a second release; ``None``: the gradient
            gets the whole planned multiplier.
        second_release: the hyperparameter that sizes the second release (quantile's
            ``count_noise``, sigma_b; online's ``direction_noise_ratio``); ``None``: no second
            release. An *optional* one that a trial leaves out is chosen by
            :func:`workers.count_noise.auto_count_noise` (the split must follow that rule),
            and the plan shows the value chosen (:attr:`derives_second_release`).
        default_grid: the small grid an arm gets when it names this strategy and gives no
            grid and no ``lr`` (:meth:`propose_grid`), for a small model; ``lr`` is scaled down
            for a large one (:func:`dpsweep.spec.model_size_class`). The built-ins' are
            :data:`dpsweep.spec.DEFAULT_GRIDS` (the spec fills them in, torch-free).
    """

    name: str
    description: str = ""
    hyperparameters: Mapping[str, HParam] = field(default_factory=dict)
    private: bool = True
    packable: bool = True
    gradient_passes: int = 1
    split: NoiseSplitFn | None = None
    second_release: str | None = None
    default_grid: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hyperparameters", MappingProxyType(dict(self.hyperparameters)))
        if self.second_release is not None:
            if self.second_release not in self.hyperparameters:
                raise ValueError(
                    f"strategy {self.name!r}: second_release names {self.second_release!r}, "
                    f"which is not one of its hyperparameters ({', '.join(self.hyperparameters)})"
                )
            if self.split is None:
                raise ValueError(
                    f"strategy {self.name!r}: a second release needs a noise split (split=)"
                )

    @property
    def derives_second_release(self) -> bool:
        """Whether a trial may leave the second release's size out (an optional
        hyperparameter, ``None``): it is then chosen by
        :func:`workers.count_noise.auto_count_noise`, and the planner shows the value."""
        if self.second_release is None:
            return False
        return self.hyperparameters[self.second_release].optional

    def validate(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Fill defaults and check every value: type, finiteness, range and choices.

        Returns:
            Every declared hyperparameter, with defaults filled and numbers as float / int.

        Raises:
            ConfigError: naming the field as ``params.<name>``.
        """
        return check_settings(
            self.hyperparameters,
            params,
            owner=f"strategy {self.name!r}",
            field="params",
            what="hyperparameter",
        )

    def noise_split(
        self, params: Mapping[str, Any], *, noise_multiplier: float, expected_batch_size: float
    ) -> NoiseSplit:
        """The split of one trial's planned multiplier sigma (``params`` are validated first).

        Raises:
            ConfigError: a parameter is invalid.
            NoiseSplitInfeasible: the second release would leave nothing for the gradient.
        """
        if self.split is None:
            return NoiseSplit(gradient=float(noise_multiplier))
        return self.split(float(noise_multiplier), self.validate(params), expected_batch_size)

    def gradient_multiplier(
        self, params: Mapping[str, Any], *, noise_multiplier: float, expected_batch_size: float
    ) -> float:
        """sigma_g, the gradient's noise multiplier (see :meth:`noise_split`)."""
        return self.noise_split(
            params, noise_multiplier=noise_multiplier, expected_batch_size=expected_batch_size
        ).gradient

    def propose_grid(self, model: str, params: Mapping[str, Any]) -> dict[str, list[Any]]:
        """The default grid of an arm of this strategy that gives none, for ``model``.

        Args:
            model: the registered model name (its size class scales the learning rates).
            params: the arm's fixed params: an axis they set is not proposed.

        Returns:
            Axis name to values (``lr`` always, unless params set it); ``{}`` when the
            strategy proposes nothing.
        """
        return propose_grid(self.default_grid, model, params)

    def shared_hyperparameters(self) -> list[str]:
        """Names of the hyperparameters every trial of a pack must share."""
        return [name for name, hp in self.hyperparameters.items() if hp.shared]


#: The strategy descriptors by name; the installed plug-ins are loaded when the names are
#: listed or a name is not found.
DESCRIPTORS: Registry[str, StrategyDescriptor] = Registry(
    "strategy",
    field="strategy",
    load=functools.partial(load_plugins, "strategies"),
    verb="described",
    idempotent=True,
)


def register_descriptor(descriptor: StrategyDescriptor) -> StrategyDescriptor:
    """Register a descriptor under its name (a stable contract stored in the database)."""
    return DESCRIPTORS.register(descriptor.name, descriptor)


def descriptor_names() -> list[str]:
    """The described strategies' names, plug-ins' included."""
    return DESCRIPTORS.names()


def get_descriptor(name: str) -> StrategyDescriptor:
    """The descriptor of a strategy; raises :class:`ConfigError` (field ``strategy``) if unknown.

    Plug-ins (entry points of the group ``dpsweep.strategies``) are loaded on a miss.
    """
    return DESCRIPTORS.lookup(name)


# ---------------------------------------------------------------------------------------------
# The noise splits of the strategies with a second release (see workers.strategies.adaptive).


def _quantile_split(sigma: float, params: Mapping[str, Any], b: float) -> NoiseSplit:
    """Quantile clipping's count has multiplier 2 sigma_b (sensitivity 1/2, std sigma_b)."""
    sigma_b = params.get("count_noise")
    if sigma_b is None:  # the planner's and the worker's one rule (workers.count_noise)
        sigma_b = auto_count_noise(noise_multiplier=sigma, expected_batch_size=b)
    second = 2.0 * float(sigma_b)
    if sigma >= second:
        raise NoiseSplitInfeasible(
            f"quantile: the noise multiplier {sigma:.4g} is >= 2*sigma_b = {second:.4g}, so the "
            "quantile count would use the whole privacy budget and leave none for the gradient; "
            f"set count_noise (sigma_b) above {sigma / 2:.4g}, e.g. {max(sigma, second):.4g}, "
            "leave it out (it is then chosen for you), or use a larger batch",
            field="params.count_noise",
        )
    return NoiseSplit(gradient=split_noise(sigma, second), second=second)


def _online_split(sigma: float, params: Mapping[str, Any], b: float) -> NoiseSplit:
    """OSO-DPSGD's direction sum has multiplier ``nu_q = ratio * nu`` (unit sensitivity)."""
    second = float(params["direction_noise_ratio"]) * sigma
    return NoiseSplit(gradient=split_noise(sigma, second), second=second)


CLIP_STYLE = HParam(
    default="flat",
    kind="choice",
    choices=("flat", "layerwise"),
    shared=True,
    help="flat: one threshold for the whole gradient; layerwise: C/sqrt(L) per layer (000)",
)

FIXED = register_descriptor(
    StrategyDescriptor(
        name="fixed",
        description="fixed clipping threshold C (Abadi et al. 2016)",
        hyperparameters={
            "clip": HParam(default=1.0, help="clipping threshold C"),
            "clip_style": CLIP_STYLE,
        },
        default_grid=DEFAULT_GRIDS["fixed"],
    )
)

NONPRIVATE = register_descriptor(
    StrategyDescriptor(
        name="nonprivate",
        description="no clipping, no noise (non-private baseline; epsilon is infinite)",
        private=False,
        default_grid=DEFAULT_GRIDS["nonprivate"],
    )
)

AUTOMATIC = register_descriptor(
    StrategyDescriptor(
        name="automatic",
        description="automatic clipping: normalise every per-sample gradient (Bu et al. 2022)",
        hyperparameters={
            "clip": HParam(default=1.0, help="scale C"),
            # gamma > 0: a zero gradient would otherwise get weight C / 0.
            "stability": HParam(default=0.01, help="gamma in C / (n + gamma)"),
            "clip_style": CLIP_STYLE,
        },
        default_grid=DEFAULT_GRIDS["automatic"],
    )
)

GLOBAL = register_descriptor(
    StrategyDescriptor(
        name="global",
        description="global clipping: scale by C/Z, drop gradients above Z (000, Appendix D)",
        hyperparameters={
            "clip": HParam(default=1.0, help="scale C"),
            "global_threshold": HParam(default=1.0, help="threshold Z"),
        },
        default_grid=DEFAULT_GRIDS["global"],
    )
)

QUANTILE = register_descriptor(
    StrategyDescriptor(
        name="quantile",
        description="adaptive threshold tracking a target quantile of the norms (Andrew 2021)",
        hyperparameters={
            "target_quantile": HParam(
                default=0.5,
                low=0.0,
                high=1.0,
                low_inclusive=False,
                high_inclusive=False,
                help="gamma, the quantile C_t tracks",
            ),
            "clip_init": HParam(default=0.1, help="C_0"),
            "clip_lr": HParam(
                default=0.2, low=0.0, help="eta_C, the step of the geometric update (0: fixed C)"
            ),
            "count_noise": HParam(
                default=None,
                optional=True,
                help="sigma_b, std of the count's noise (default: b/20, raised where needed so "
                "the gradient gets at most 10 % more noise; workers.count_noise)",
            ),
        },
        split=_quantile_split,
        second_release="count_noise",
        default_grid=DEFAULT_GRIDS["quantile"],
    )
)

ONLINE = register_descriptor(
    StrategyDescriptor(
        name="online",
        description="OSO-DPSGD: online sign updates of C and the learning rate (004)",
        hyperparameters={
            "clip_init": HParam(default=0.1, help="C_0"),
            "clip_lr": HParam(default=2.5e-3, low=0.0, help="rho_c (0: fixed C)"),
            "lr_lr": HParam(default=2.5e-3, low=0.0, help="rho_r (0: fixed learning rate)"),
            "direction_noise_ratio": HParam(
                default=7.124,
                low=1.0,
                low_inclusive=False,
                help="nu_q / nu, > 1 so the gradient keeps some budget (7.124 costs the "
                "gradient 1% more noise)",
            ),
        },
        split=_online_split,
        second_release="direction_noise_ratio",
        default_grid=DEFAULT_GRIDS["online"],
    )
)

BAM = register_descriptor(
    StrategyDescriptor(
        name="bam",
        description="bias-aware minimisation: clip gradients taken after a per-sample ascent (003)",
        hyperparameters={
            "clip": HParam(default=1.0, help="clipping threshold C"),
            "bam_lambda": HParam(
                default=0.1, help="lambda, the length of the per-sample ascent step"
            ),
            "clip_style": CLIP_STYLE,
        },
        gradient_passes=2,
        default_grid=DEFAULT_GRIDS["bam"],
    )
)

LIPSCHITZ = register_descriptor(
    StrategyDescriptor(
        name="lipschitz",
        description="clipless DP-SGD on a Lipschitz network (002): no clipping, analytic bound",
        default_grid=DEFAULT_GRIDS["lipschitz"],
    )
)


__all__ = [
    "AUTOMATIC",
    "BAM",
    "CLIP_STYLE",
    "DESCRIPTORS",
    "FIXED",
    "GLOBAL",
    "LIPSCHITZ",
    "NONPRIVATE",
    "ONLINE",
    "QUANTILE",
    "HParam",
    "NoiseSplit",
    "NoiseSplitFn",
    "NoiseSplitInfeasible",
    "StrategyDescriptor",
    "descriptor_names",
    "get_descriptor",
    "register_descriptor",
    "split_noise",
]
