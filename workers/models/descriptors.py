"""What a model *is*, without torch: its name, the input it takes, its options and their ranges.

A :class:`ModelDescriptor` is the torch-free half of a model. Submission, planning and the API
read only descriptors, so they can refuse an unknown model or a bad option value without
importing torch. The torch half (a builder registered with
:func:`workers.models.registry.register_model`) is looked up by the same stable name, and
:func:`workers.models.registry.build_model` checks options with the same
:meth:`ModelDescriptor.validate` before it builds.

Registration is a function call (:func:`register_model_descriptor`), so that plug-ins
(entry points of the group ``dpsweep.models``, :mod:`workers.plugins`) may add models; the
built-in descriptors are registered when this module is imported.

What a worker builds from a descriptor's model (:class:`ModelSpec`, :class:`LoraSpec`) lives in
:mod:`workers.models.specs` and is re-exported here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from dpsweep.errors import ConfigError, DatasetError
from dpsweep.registry import Registry
from workers.models.specs import TRAINABLE_CHOICES, LoraSpec, ModelSpec
from workers.options import HParam, check_settings, check_value
from workers.plugins import load_plugins

Task = Literal["classification", "reconstruction"]

#: What input shape a model builds on: ``"image"`` needs examples ``[C, H, W]``, ``"flat"``
#: needs one feature vector ``[d]``, ``"any"`` flattens whatever it gets, ``"tokens"`` needs one
#: sequence of token ids ``[T]`` (integers, 0 the padding id; a float tensor of whole numbers is
#: accepted and read as ids).
InputKind = Literal["flat", "image", "any", "tokens"]

INPUT_KINDS: tuple[str, ...] = ("flat", "image", "any", "tokens")

#: The activation names a model option may choose (the torch side maps each to a module).
ACTIVATION_NAMES: tuple[str, ...] = ("elu", "gelu", "leaky_relu", "relu", "sigmoid", "tanh")


@dataclass(frozen=True)
class ModelOption(HParam):
    """A declared model option: an :class:`HParam` (kind, range, choices, default, help).

    Args:
        sequence: the option is a list of such values (a single value is accepted as a list of
            one), e.g. the hidden widths of an MLP. An empty list is allowed.
        multiple_of: each (integer) value must be a multiple of this (GroupSort pairs units).

    Besides the kinds of an :class:`HParam`, ``kind="bool"``: ``true`` or ``false`` (a switch,
    e.g. ``weight_standardization``; no number stands for one).
    """

    sequence: bool = False
    multiple_of: int | None = None

    def __post_init__(self) -> None:
        if self.kind == "bool":
            object.__setattr__(self, "positive", False)
            return
        super().__post_init__()

    def range_text(self) -> str:
        return "true or false" if self.kind == "bool" else super().range_text()


#: How a model is trained: the fast packed path, the generic path, or decided when built.
ENGINE_PATHS: tuple[str, ...] = ("packed", "generic", "auto")


@dataclass(frozen=True, eq=False)
class ModelDescriptor:
    """The torch-free description of a model.

    Args:
        name: the stable name stored in the database and used in specs.
        input_kind: the input it builds on (:data:`InputKind`).
        task: ``classification`` (cross-entropy on logits) or ``reconstruction`` (MSE).
        description: one line for listings.
        options: the declared builder options, by name.
        engine_path: which engine path trains it, as far as is known without building it:
            ``packed`` (an ``nn.Sequential`` the fast path covers), ``generic`` (any other
            module, per-example gradients from torch.func) or ``auto`` (decided when the
            model is built: a plug-in's). The plan shows it; each trial records the path it
            actually took, and a contract test holds the built-ins to their word.
        generic_packs: on the generic path, how a pack of its trials runs: ``batched`` (one
            ``vmap`` over the trial dimension) or ``sequential`` (one trial after another in
            the worker); the faster of the two for the architecture, as measured by
            ``bench/generic_packs.py`` (the results are the same either way).
    """

    name: str
    input_kind: InputKind = "any"
    task: Task = "classification"
    description: str = ""
    options: Mapping[str, ModelOption] = field(default_factory=dict)
    engine_path: str = "auto"
    generic_packs: str = "batched"

    def __post_init__(self) -> None:
        if self.generic_packs not in ("batched", "sequential"):
            raise ValueError(
                f"model {self.name!r}: generic_packs must be batched or sequential; "
                f"got {self.generic_packs!r}"
            )
        if self.engine_path not in ENGINE_PATHS:
            raise ValueError(
                f"model {self.name!r}: engine_path must be one of {list(ENGINE_PATHS)}; "
                f"got {self.engine_path!r}"
            )
        if self.input_kind not in INPUT_KINDS:
            raise ValueError(
                f"model {self.name!r}: input_kind must be one of {list(INPUT_KINDS)}; "
                f"got {self.input_kind!r}"
            )
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    @property
    def needs_image(self) -> bool:
        return self.input_kind == "image"

    def validate(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Fill defaults and check every value: type, finiteness, range, choices.

        Returns:
            Every declared option, with defaults filled (sequences as lists, numbers as
            float / int; an optional option left out is ``None``).

        Raises:
            ConfigError: an unknown option or a bad value (field ``model.options.<name>``).
        """
        return check_settings(
            self.options,
            options,
            owner=f"model {self.name!r}",
            field="model.options",
            check=self._check_each,
        )

    def check_input(self, input_shape: tuple[int, ...] | list[int]) -> None:
        """Refuse data whose examples' shape is not the input this model builds on.

        Torch-free, so that planning refuses a CNN on tabular data before anything is
        reserved; :func:`workers.models.registry.build_model` runs the same check.

        Raises:
            DatasetError: the examples' shape does not fit :attr:`input_kind`.
        """
        shape = list(input_shape)
        if self.input_kind == "image" and len(shape) != 3:
            raise DatasetError(
                f"model {self.name!r} needs image input [C, H, W]; this dataset's examples have "
                f"shape {shape}. Use 'mlp', 'logreg' or 'bow_fc' for tabular data."
            )
        if self.input_kind == "flat" and len(shape) != 1:
            raise DatasetError(
                f"model {self.name!r} needs flat input [features]; this dataset's examples have "
                f"shape {shape}"
            )
        if self.input_kind == "tokens" and len(shape) != 1:
            raise DatasetError(
                f"model {self.name!r} needs token ids [sequence length]; this dataset's "
                f"examples have shape {shape}. Use a text dataset with a tokenizer."
            )

    def _check_each(self, name: str, opt: Any, v: Any) -> Any:
        if opt.sequence:
            values = list(v) if isinstance(v, list | tuple) else [v]
            return [self._check(name, opt, x) for x in values]
        return self._check(name, opt, v)

    def _check(self, name: str, opt: ModelOption, v: Any) -> Any:
        where = f"model.options.{name}"
        if opt.kind == "bool":
            if not isinstance(v, bool):
                raise ConfigError(
                    f"{name} for model {self.name!r} must be true or false; got {v!r}",
                    field=where,
                )
            return v
        number = check_value(opt, v, name=name, owner=f"model {self.name!r}", field=where)
        if opt.kind == "int" and opt.multiple_of is not None and number % opt.multiple_of:
            raise ConfigError(
                f"{name} for model {self.name!r} must be a multiple of {opt.multiple_of}; "
                f"got {v!r}",
                field=where,
            )
        return number


#: The model descriptors by name; the installed plug-ins are loaded when the names are listed
#: or a name is not found.
DESCRIPTORS: Registry[str, ModelDescriptor] = Registry(
    "model",
    field="model.name",
    load=functools.partial(load_plugins, "models"),
    verb="described",
    idempotent=True,
)


def register_model_descriptor(descriptor: ModelDescriptor) -> ModelDescriptor:
    """Register a descriptor under its name (a stable contract stored in the database)."""
    return DESCRIPTORS.register(descriptor.name, descriptor)


def model_descriptor_names() -> list[str]:
    """Every described model's name, the installed plug-ins' included."""
    return DESCRIPTORS.names()


def get_model_descriptor(name: str) -> ModelDescriptor:
    """The descriptor of a model; raises :class:`ConfigError` (field ``model.name``) if unknown."""
    return DESCRIPTORS.lookup(name)


# ---------------------------------------------------------------------------------------------
# The built-in models (their torch builders: workers/models/<name>.py).

LOGREG = register_model_descriptor(
    ModelDescriptor(
        name="logreg", description="multinomial logistic regression", engine_path="packed"
    )
)

MLP = register_model_descriptor(
    ModelDescriptor(
        name="mlp",
        engine_path="packed",
        description="fully connected network (default one hidden layer of 128, ReLU)",
        options={
            "hidden": ModelOption(
                default=128, kind="int", low=1, sequence=True, help="hidden layer widths"
            ),
            "activation": ModelOption(
                default="relu", kind="choice", choices=ACTIVATION_NAMES, help="activation"
            ),
        },
    )
)

#: The switch of the built-in convolutional models (cnn, res_cnn, wrn16_4): weight-standardised
#: convolutions (workers.models.blocks.WSConv2d).
WEIGHT_STANDARDIZATION = ModelOption(
    default=False,
    kind="bool",
    help=(
        "standardise each convolution's weight per output channel before use (Qiao et al. "
        "2019; with GroupNorm, as De et al. 2022)"
    ),
)

CNN = register_model_descriptor(
    ModelDescriptor(
        name="cnn",
        engine_path="packed",
        input_kind="image",
        description="the CNN of OSO-DPSGD (004, Table 5); 551,322 parameters on 28x28 MNIST",
        options={"weight_standardization": WEIGHT_STANDARDIZATION},
    )
)

AUTOENCODER = register_model_descriptor(
    ModelDescriptor(
        name="autoencoder",
        engine_path="packed",
        input_kind="image",
        task="reconstruction",
        description="convolutional autoencoder of 004 (Table 6), MSE objective; 48,705 parameters",
    )
)

BOW_FC = register_model_descriptor(
    ModelDescriptor(
        name="bow_fc",
        engine_path="packed",
        description="bag-of-words fully connected network of 004 (Table 7): 128-128, LeakyReLU",
    )
)

LIP_MLP = register_model_descriptor(
    ModelDescriptor(
        name="lip_mlp",
        engine_path="packed",
        description=(
            "1-Lipschitz MLP for clipless DP-SGD (002): input ball of radius X (default "
            "sqrt(features)), spectrally normalised linear layers (default 128-128), GroupSort"
        ),
        options={
            "hidden": ModelOption(
                default=(128, 128),
                kind="int",
                low=2,
                multiple_of=2,
                sequence=True,
                help="hidden layer widths, even (GroupSort pairs units)",
            ),
            "input_bound": ModelOption(
                default=None,
                optional=True,
                help="X, the radius of the input ball (default sqrt(features))",
            ),
            "temperature": ModelOption(default=1.0, help="tau, a fixed scale of the logits"),
        },
    )
)

WRN16_4 = register_model_descriptor(
    ModelDescriptor(
        name="wrn16_4",
        engine_path="generic",
        # bench/generic_packs.py: a 4-trial pack of one vmap took 1.41x as long as the trials
        # one after another (one CPU thread), so its packs run sequentially.
        generic_packs="sequential",
        input_kind="image",
        description=(
            "Wide-ResNet-16-4 with GroupNorm (De et al. 2022), the standard DP-SGD image "
            "benchmark for 32x32 inputs; 2.75M parameters for 3 channels, 10 classes"
        ),
        options={
            "depth": ModelOption(
                default=16, kind="int", low=10, high=40, help="depth, 6n + 4 (10, 16, 22, ...)"
            ),
            "width": ModelOption(default=4, kind="int", low=1, high=10, help="widening factor"),
            "norm_groups": ModelOption(
                default=16, kind="int", low=1, high=16, help="groups per GroupNorm (divides 16)"
            ),
            "weight_standardization": WEIGHT_STANDARDIZATION,
        },
    )
)

RES_CNN = register_model_descriptor(
    ModelDescriptor(
        name="res_cnn",
        engine_path="generic",
        input_kind="image",
        description=(
            "small residual CNN for 28x28 images: GroupNorm, residual blocks of two 3x3 "
            "convolutions, global average pooling"
        ),
        options={
            "width": ModelOption(
                default=32, kind="int", low=8, high=256, multiple_of=8, help="base channels"
            ),
            "blocks": ModelOption(default=3, kind="int", low=1, high=6, help="residual blocks"),
            "weight_standardization": WEIGHT_STANDARDIZATION,
        },
    )
)

TEXT_CLASSIFIER = register_model_descriptor(
    ModelDescriptor(
        name="text_classifier",
        engine_path="generic",
        input_kind="tokens",
        description=(
            "token embedding + pre-norm transformer encoder (default 2 layers, d=128, 4 heads), "
            "padding-masked mean pooling, linear head; token id 0 is padding"
        ),
        options={
            "vocab_size": ModelOption(
                default=32768,
                kind="int",
                low=2,
                high=1_000_000,
                help=(
                    "embedding rows, at least the dataset's vocabulary size (its tokenizer's "
                    "plus the reserved ids 0 = padding, 1 = unknown; a 30522-token BERT "
                    "tokenizer fits the default); larger ids read as unknown (1)"
                ),
            ),
            "d_model": ModelOption(
                default=128, kind="int", low=8, high=1024, multiple_of=8, help="model width"
            ),
            "heads": ModelOption(default=4, kind="int", low=1, high=16, help="attention heads"),
            "layers": ModelOption(default=2, kind="int", low=1, high=12, help="encoder layers"),
            "ff_mult": ModelOption(
                default=4, kind="int", low=1, high=8, help="feed-forward width / d_model"
            ),
            "max_len": ModelOption(
                default=512, kind="int", low=1, high=8192, help="longest sequence (positions)"
            ),
            "dropout": ModelOption(
                default=0.0, low=0.0, high=1.0, high_inclusive=False, help="dropout rate"
            ),
        },
    )
)

LIP_CNN = register_model_descriptor(
    ModelDescriptor(
        name="lip_cnn",
        engine_path="packed",
        input_kind="image",
        description=(
            "1-Lipschitz CNN for clipless DP-SGD (002): input ball of radius X, per stage a "
            "bias-free kxk convolution and a 2x2 stride-2 one with channel GroupSort, a "
            "linear head; kernels kept 1-Lipschitz through their certified im2col bound"
        ),
        options={
            "channels": ModelOption(
                default=(64,),
                kind="int",
                low=2,
                high=512,
                multiple_of=2,
                sequence=True,
                help="channels per stage, even (GroupSort pairs channels); default one stage",
            ),
            "kernel": ModelOption(
                default=3,
                kind="int",
                low=1,
                high=7,
                help="odd kernel size of each stage's first convolution (its bound A = kernel)",
            ),
            "input_bound": ModelOption(
                default=None,
                optional=True,
                help="X, the radius of the input ball (default sqrt(C H W))",
            ),
            "temperature": ModelOption(default=1.0, help="tau, a fixed scale of the logits"),
        },
    )
)

CNN1D = register_model_descriptor(
    ModelDescriptor(
        name="cnn1d",
        # Conv1d and GroupNorm have no packed layer (workers/packed): torch.func's per-example
        # gradients train it.
        engine_path="generic",
        input_kind="flat",
        description=(
            "1-D CNN for flat inputs read as one-channel signals (MNIST-1D): per stage a "
            "Conv1d, GroupNorm, ReLU and max-pool of 2, a linear head"
        ),
        options={
            "channels": ModelOption(
                default=(32, 32),
                kind="int",
                low=1,
                high=256,
                sequence=True,
                help="channels per stage (each stage halves the length)",
            ),
            "kernel": ModelOption(
                default=5, kind="int", low=1, high=15, help="odd kernel size of each Conv1d"
            ),
            "norm": ModelOption(
                default="group",
                kind="choice",
                choices=("group", "none"),
                help="GroupNorm after each convolution (never BatchNorm: it mixes records)",
            ),
        },
    )
)


__all__ = [
    "ACTIVATION_NAMES",
    "AUTOENCODER",
    "BOW_FC",
    "CNN",
    "CNN1D",
    "DESCRIPTORS",
    "INPUT_KINDS",
    "LIP_CNN",
    "LIP_MLP",
    "LOGREG",
    "MLP",
    "RES_CNN",
    "TEXT_CLASSIFIER",
    "TRAINABLE_CHOICES",
    "WRN16_4",
    "InputKind",
    "LoraSpec",
    "ModelDescriptor",
    "ModelOption",
    "ModelSpec",
    "Task",
    "get_model_descriptor",
    "model_descriptor_names",
    "register_model_descriptor",
]
