"""Models registry.

Every model is a plain ``torch.nn.Sequential`` built for a given input shape. The training engine
compiles it into a *packed* model with a leading trial dimension (see :mod:`workers.packed`), and
the same ``nn.Module`` is what tests and benchmarks hand to Opacus, so both see one architecture.

Models must not mix examples (no batch norm): per-sample gradients rely on it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from workers.errors import ConfigError, DatasetError

Task = Literal["classification", "reconstruction"]


@dataclass(frozen=True)
class ModelSpec:
    """A registry name plus builder options (e.g. ``{"hidden": [128]}`` for ``mlp``)."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)


Builder = Callable[..., nn.Sequential]


@dataclass(frozen=True)
class ModelEntry:
    name: str
    task: Task
    builder: Builder
    needs_image: bool
    option_names: frozenset[str]
    description: str


MODELS: dict[str, ModelEntry] = {}


def register_model(
    name: str,
    *,
    task: Task,
    needs_image: bool = False,
    options: tuple[str, ...] = (),
    description: str = "",
) -> Callable[[Builder], Builder]:
    """Register a model builder ``fn(input_shape, num_classes, **options) -> nn.Sequential``."""

    def deco(fn: Builder) -> Builder:
        if name in MODELS:
            raise ValueError(f"model {name!r} is registered twice")
        MODELS[name] = ModelEntry(name, task, fn, needs_image, frozenset(options), description)
        return fn

    return deco


def model_names() -> list[str]:
    return sorted(MODELS)


def model_task(name: str) -> Task:
    return _entry(name).task


def _entry(name: str) -> ModelEntry:
    if name not in MODELS:
        raise ConfigError(
            f"unknown model {name!r}; choose one of: {', '.join(model_names())}", field="model.name"
        )
    return MODELS[name]


def build_model(
    spec: ModelSpec, *, input_shape: tuple[int, ...], num_classes: int, seed: int
) -> nn.Sequential:
    """Build a freshly initialised model; the initial weights depend only on ``seed``.

    Raises:
        ConfigError: unknown model or option.
        DatasetError: the data's shape does not fit the model (e.g. a CNN on tabular data).
    """
    entry = _entry(spec.name)
    unknown = set(spec.options) - entry.option_names
    if unknown:
        raise ConfigError(
            f"unknown option(s) {sorted(unknown)} for model {spec.name!r}; "
            f"allowed: {sorted(entry.option_names) or 'none'}",
            field="model.options",
        )
    if entry.needs_image and len(input_shape) != 3:
        raise DatasetError(
            f"model {spec.name!r} needs image input [C, H, W]; this dataset's examples have "
            f"shape {list(input_shape)}. Use 'mlp', 'logreg' or 'bow_fc' for tabular data."
        )
    # Initialise from the trial's own seed without disturbing anyone else's global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return entry.builder(tuple(input_shape), num_classes, **spec.options)


def _flat_dim(input_shape: tuple[int, ...]) -> int:
    n = 1
    for s in input_shape:
        n *= s
    return n


_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "leaky_relu": nn.LeakyReLU,
    "elu": nn.ELU,
    "gelu": nn.GELU,
}


def _activation(name: str) -> nn.Module:
    if name not in _ACTIVATIONS:
        raise ConfigError(
            f"unknown activation {name!r}; choose one of: {', '.join(sorted(_ACTIVATIONS))}",
            field="model.options.activation",
        )
    return _ACTIVATIONS[name]()


@register_model("logreg", task="classification", description="multinomial logistic regression")
def _logreg(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), nn.Linear(_flat_dim(input_shape), num_classes))


@register_model(
    "mlp",
    task="classification",
    options=("hidden", "activation"),
    description="fully connected network (default one hidden layer of 128, ReLU)",
)
def _mlp(
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: list[int] | int = 128,
    activation: str = "relu",
) -> nn.Sequential:
    sizes = [hidden] if isinstance(hidden, int) else list(hidden)
    if any(int(h) < 1 for h in sizes):
        raise ConfigError(
            "mlp hidden sizes must be positive integers", field="model.options.hidden"
        )
    layers: list[nn.Module] = [nn.Flatten()]
    d = _flat_dim(input_shape)
    for h in sizes:
        layers += [nn.Linear(d, int(h)), _activation(activation)]
        d = int(h)
    layers.append(nn.Linear(d, num_classes))
    return nn.Sequential(*layers)


@register_model(
    "cnn",
    task="classification",
    needs_image=True,
    description="the CNN of OSO-DPSGD (004, Table 5); 551,322 parameters on 28x28 MNIST",
)
def _cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    # 004 Table 5. Padding 3 on the first convolution is what reproduces the paper's parameter
    # count (551,322) on 28x28 inputs; on smaller images (digits 8x8) the same stack still fits.
    # Table 5 lists a ReLU after the output layer too; we leave logits unconstrained, since a
    # ReLU there zeroes the gradient of every negative logit and distorts calibration.
    c, h, w = input_shape
    features = nn.Sequential(
        nn.Conv2d(c, 16, kernel_size=8, stride=1, padding=3),
        nn.ReLU(),
        nn.MaxPool2d(kernel_size=2, stride=1),
        nn.Conv2d(16, 32, kernel_size=4, stride=1),
        nn.ReLU(),
        nn.Flatten(),
    )
    with torch.no_grad():
        try:
            flat = features(torch.zeros(1, c, h, w)).shape[1]
        except RuntimeError as exc:
            raise DatasetError(f"images of size {h}x{w} are too small for 'cnn' ({exc})") from exc
    return nn.Sequential(*features, nn.Linear(flat, 32), nn.ReLU(), nn.Linear(32, num_classes))


@register_model(
    "autoencoder",
    task="reconstruction",
    needs_image=True,
    description="convolutional autoencoder of 004 (Table 6), MSE objective; 48,705 parameters",
)
def _autoencoder(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    # 004 Table 6: four 3x3 convolutions (8-16-32-64) and four transposed ones back to the input
    # channels, LeakyReLU, sigmoid output. Padding 1 keeps the spatial size so the stack fits
    # any image size (the paper's 28x28 also works unpadded; the parameter count is the same).
    c = input_shape[0]
    chans = [c, 8, 16, 32, 64]
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(chans):
        layers += [nn.Conv2d(a, b, 3, stride=1, padding=1), nn.LeakyReLU()]
    rev = chans[::-1]
    for i, (a, b) in enumerate(itertools.pairwise(rev)):
        layers.append(nn.ConvTranspose2d(a, b, 3, stride=1, padding=1))
        layers.append(nn.Sigmoid() if i == len(rev) - 2 else nn.LeakyReLU())
    return nn.Sequential(*layers)


@register_model(
    "bow_fc",
    task="classification",
    description="bag-of-words fully connected network of 004 (Table 7): 128-128, LeakyReLU",
)
def _bow_fc(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    # Table 7 also ends in LeakyReLU; the output layer is left linear as for 'cnn'.
    d = _flat_dim(input_shape)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(d, 128),
        nn.LeakyReLU(),
        nn.Linear(128, 128),
        nn.LeakyReLU(),
        nn.Linear(128, num_classes),
    )


from workers import lipschitz as _lipschitz  # noqa: E402, F401  (registers lip_mlp)
