"""The clipping-strategy interface.

A strategy turns per-sample gradient norms into per-sample weights ``w_i`` and a sensitivity
``S``; the engine releases ``(sum_i w_i g_i + N(0, (sigma_g S)^2 I)) / b``. Strategies with
extra private queries (a noisy quantile count, OSO-DPSGD's direction sum) ask for *extra
releases*, which the engine computes from the same norms and noises in the same way. State
updates (``C_t``, learning-rate scales) may only read noised releases: :meth:`observe` receives
nothing else, so a strategy cannot leak an unnoised batch statistic by accident.

Everything is vectorised over the K trials of a pack: hyperparameters and state are ``[K]``
tensors, norms are ``[K, B, L]`` (L parametrised layers), weights are ``[K, B, R]`` with R = 1
(flat) or R = L (layerwise).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from dpsweep.errors import ConfigError
from dpsweep.registry import Registry
from workers.randomness import NoiseSource
from workers.strategies import load_builtin_strategies
from workers.strategies.descriptors import (
    DESCRIPTORS,
    HParam,
    NoiseSplit,
    StrategyDescriptor,
    register_descriptor,
)

if TYPE_CHECKING:
    from workers.packed import PackedModel


@dataclass
class StepContext:
    """What a strategy sees during one step. Everything here is private (unnoised)."""

    sq_norms: Tensor | None  # [K, B, L] per-sample per-layer squared gradient norms
    mask: Tensor  # [K, B] 1.0 for sampled examples, 0.0 for padding
    expected_batch_size: float  # b = q N, public
    noise: NoiseSource


@dataclass
class ExtraRelease:
    """A second private sum the engine must release: ``sum_i w_i g_i`` plus its own noise."""

    name: str
    weights: Tensor  # [K, B, R]
    sensitivity: Tensor  # [K]
    noise_multiplier: Tensor  # [K]
    # Optional promise: wherever these weights are non-zero, the gradient's weights equal
    # ``grad_coef * weights``. The two releases then cover disjoint rows, and the engine may
    # compute both from one matmul's worth of rows (OSO-DPSGD: sum w g = sum_{n<=C} g + C sum q).
    grad_coef: Tensor | None = None


@dataclass
class ScalarRelease:
    """A private count-like query: ``(sum_i v_i + multiplier * sensitivity * xi) / b``.

    ``|v_i| <= sensitivity`` must hold for every example (the engine checks it); ``xi`` is one
    standard normal per trial, so the noise standard deviation is ``multiplier * sensitivity``.
    """

    name: str
    values: Tensor  # [K, B] per-example contributions (0 for padding)
    sensitivity: Tensor  # [K]
    noise_multiplier: Tensor  # [K]


@dataclass
class ClipResult:
    weights: Tensor  # [K, B, R]
    sensitivity: Tensor  # [K]
    extra: tuple[ExtraRelease, ...] = ()
    scalars: tuple[ScalarRelease, ...] = ()


class ClippingStrategy(ABC):
    """Base class. Subclasses set ``descriptor`` (or ``name`` and ``hyperparameters``) and
    implement ``clip``.

    A class with a :class:`StrategyDescriptor` takes its ``name``, ``private``,
    ``hyperparameters`` and ``description`` from it; the descriptor validates the trials'
    parameters and splits the noise, so the torch-free side (submission, planner) and the
    worker run the same checks and formulas.
    """

    descriptor: ClassVar[StrategyDescriptor | None] = None
    name: ClassVar[str]
    private: ClassVar[bool] = True
    needs_norms: ClassVar[bool] = True
    hyperparameters: ClassVar[Mapping[str, HParam]] = {}
    description: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__
        d = own.get("descriptor")
        if d is None:
            # A subclass that redefines what the strategy is no longer matches its parent's
            # descriptor; one that only changes behaviour keeps it.
            if any(k in own for k in ("name", "private", "hyperparameters", "description")):
                cls.descriptor = None
            return
        for attr, value in (
            ("name", d.name),
            ("private", d.private),
            ("description", d.description),
        ):
            if attr in own and own[attr] != value:
                raise TypeError(f"{cls.__name__}.{attr} disagrees with its descriptor")
            setattr(cls, attr, value)
        if "hyperparameters" in own and set(own["hyperparameters"]) != set(d.hyperparameters):
            raise TypeError(f"{cls.__name__}.hyperparameters disagree with its descriptor")
        cls.hyperparameters = d.hyperparameters

    @classmethod
    def describe(cls) -> StrategyDescriptor:
        """The class's descriptor (one is derived from its attributes if it declares none)."""
        if cls.descriptor is not None:
            return cls.descriptor
        return StrategyDescriptor(
            name=cls.name,
            description=cls.description,
            hyperparameters=cls.hyperparameters,
            private=cls.private,
        )

    def __init__(
        self,
        params: Sequence[Mapping[str, Any]],
        *,
        n_layers: int,
        device: torch.device,
    ) -> None:
        self.k = len(params)
        self.n_layers = n_layers
        self.device = device
        # b = qN, set by bind() in strategies whose noise split depends on it.
        self.expected_batch_size = math.nan
        self.params = [self.validate(p) for p in params]
        for name, hp in self.hyperparameters.items():
            if hp.shared and len({repr(p[name]) for p in self.params}) > 1:
                raise ConfigError(
                    f"strategy {self.name!r}: {name} must be the same for every trial of a pack",
                    field=f"params.{name}",
                )

    @classmethod
    def validate(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """Fill defaults and check types and ranges; raises :class:`ConfigError` naming the field.

        The descriptor's :meth:`~StrategyDescriptor.validate`: sweep submission runs the same.
        """
        return cls.describe().validate(params)

    def noise_splits(self, *, noise_multiplier: Tensor) -> list[NoiseSplit]:
        """Each trial's split of its planned multiplier, by the descriptor (torch-free) rule."""
        d = self.describe()
        return [
            d.noise_split(
                p,
                noise_multiplier=float(noise_multiplier[i]),
                expected_batch_size=self.expected_batch_size,
            )
            for i, p in enumerate(self.params)
        ]

    def tensor(self, name: str) -> Tensor:
        """A numeric hyperparameter as a ``[K]`` tensor on the pack's device."""
        return torch.tensor([float(p[name]) for p in self.params], device=self.device)

    def shared(self, name: str) -> Any:
        return self.params[0][name]

    # -- the step protocol --------------------------------------------------------------------

    def bind(self, model: PackedModel, *, expected_batch_size: float, task: str) -> None:  # noqa: B027
        """Called once by the engine before the first step.

        Strategies that need the model's structure (layer slices of the flat parameters), the
        expected batch size b = qN (public) or the task override this; the default keeps them.
        """

    def gradient_noise_multiplier(self, noise_multiplier: Tensor) -> Tensor:
        """Multiplier on the gradient's noise, given the trial's planned multiplier sigma.

        Strategies with extra queries return a larger value here so that all their releases
        together cost exactly one Gaussian step with multiplier sigma (the planner's unit).
        The default applies the descriptor's split (the identity for strategies without one).
        """
        if self.describe().split is None:
            return noise_multiplier
        return torch.tensor(
            [s.gradient for s in self.noise_splits(noise_multiplier=noise_multiplier)],
            device=noise_multiplier.device,
            dtype=noise_multiplier.dtype,
        )

    @abstractmethod
    def clip(self, ctx: StepContext) -> ClipResult:
        """Per-sample weights and sensitivity for this step (plus any extra releases).

        Must not change the strategy's state: the engine also calls it on the public
        evaluation split to measure clipping diagnostics.
        """

    def ascent_scale(self, ctx: StepContext) -> Tensor | None:
        """Per-example ascent step ``[K, B]`` for a second, perturbed gradient pass, or None.

        When a tensor ``s`` is returned, the engine recomputes each example's gradient at
        ``theta + s_i * g_i`` (BAM, 003) and hands those gradients' norms to :meth:`clip`.
        """
        return None

    def observe(self, releases: Mapping[str, Tensor], noise: NoiseSource) -> None:  # noqa: B027
        """Update state from this step's *noised* releases, after the optimizer step.

        Vector releases are ``[K, P]`` (divided by b), scalar releases ``[K]``. The buffers are
        reused by the next step: copy what you keep.
        """

    def lr_scale(self) -> Tensor | None:
        """A ``[K]`` multiplier on each trial's learning rate, or None."""
        return None

    def after_step(self, flat_params: Tensor) -> None:  # noqa: B027
        """Post-process parameters after the optimizer step (e.g. a projection)."""

    def state(self) -> dict[str, Tensor]:
        """Public (post-noise) state to record as trajectories, each ``[K]``."""
        return {}


#: The strategy classes by name; the built-in classes and the installed plug-ins are loaded
#: when the names are listed or a name is not found.
STRATEGIES: Registry[str, type[ClippingStrategy]] = Registry(
    "strategy", field="strategy", load=load_builtin_strategies
)


def register_strategy(cls: type[ClippingStrategy]) -> type[ClippingStrategy]:
    """Register a strategy class under its ``name`` (a stable contract stored in the database).

    The class must agree with the descriptor registered under that name (same hyperparameter
    names, same private flag); a class without a descriptor gets one derived from its
    attributes, registered with it.
    """
    if cls.name in STRATEGIES:  # refused before its descriptor is registered, not after
        raise ValueError(f"strategy {cls.name!r} is registered twice")
    d = cls.describe()
    known = DESCRIPTORS.get(cls.name)
    if known is None:
        register_descriptor(d)
    elif known is not d and (
        set(known.hyperparameters) != set(d.hyperparameters) or known.private != d.private
    ):
        raise ValueError(
            f"strategy class {cls.__name__} disagrees with the descriptor of {cls.name!r}"
        )
    else:
        d = known
    cls.descriptor = d
    return STRATEGIES.register(cls.name, cls)


def strategy_names() -> list[str]:
    """The strategy classes' names, the built-ins' and plug-ins' included. Imports torch."""
    return STRATEGIES.names()


def get_strategy(name: str) -> type[ClippingStrategy]:
    """The strategy class registered as ``name`` (the built-ins and plug-ins loaded on a miss).

    Raises:
        ConfigError: unknown name (field ``strategy``; the message lists the names).
    """
    return STRATEGIES.lookup(name)


def group_norms(sq_norms: Tensor, style: str) -> Tensor:
    """Norms per clipping group: ``[K, B, 1]`` for flat, ``[K, B, L]`` for layerwise."""
    if style == "flat":
        return sq_norms.sum(dim=-1, keepdim=True).sqrt()
    return sq_norms.sqrt()
