"""The model half of the one check before any reservation or charge: will a trial train it?

A trial builds its model from the spec and the loaded data, picks the engine path
(:func:`workers.generic.dispatch.build_pack_model`) and, on the generic path, refuses layers
that break per-example DP (:func:`workers.generic.validation.validate_module`: BatchNorm,
Dropout, ...). Refused there, after the sweep was reserved or the run charged, a refusal still
cost privacy budget. :func:`check_model` asks the same questions first, on the data's input
shape and class count, for planning (:func:`sweeper.sweeps.planning.plan_sweep`: ``dpsweep
plan``, ``dpsweep run`` and the API's plan and submit) and for ``dpsweep train``.

Cheap where it can be: a model whose descriptor declares the packed path (every built-in
``nn.Sequential``; the contract tests hold them to it) is checked from its descriptor alone,
without importing torch. Any other model is built on the meta device (shapes only: no memory,
no initialisation work), or on the CPU when its builder cannot build on meta.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dpsweep.errors import ConfigError, DatasetError
from workers.models.descriptors import ModelSpec, get_model_descriptor


def check_model(
    model: ModelSpec,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    vocab_size: int | None = None,
    strategies: Iterable[str] = (),
) -> str:
    """Refuse a model that no trial could train, before anything is reserved or charged.

    Args:
        model: The model's registry name (or a registered ``module:function`` factory) and
            options.
        input_shape: One example's shape, as the loaded data gives it.
        num_classes: The data's number of classes.
        vocab_size: The data's tokenizer's vocabulary size (token models), if any.
        strategies: The strategies that will train it (``lipschitz`` needs the packed path).

    Returns:
        The engine path a trial will take: ``packed`` or ``generic``.

    Raises:
        ConfigError: an unknown model or a bad option (its field), data of the wrong shape, a
            model its builder cannot build, or a layer the generic path refuses (the message
            names the layer and the fix; field ``model.name``, or ``model.options.dropout``
            when the model has that option).
    """
    descriptor = get_model_descriptor(model.name)
    descriptor.validate(model.options)
    try:
        descriptor.check_input(tuple(input_shape))
    except DatasetError as exc:
        # About the spec's choice of model (a 422 naming the field), not about the file.
        raise ConfigError(str(exc), field="model.name") from None
    if descriptor.engine_path == "packed" and model.plain:
        return "packed"  # declared (and held to it by the contract tests): no torch needed
    # A checkpoint is resolved, digested and loaded here as a trial loads it, and what is
    # trained is applied: a bad checkpoint or pattern is refused before anything is reserved.
    module = _build_for_check(model, input_shape, num_classes, vocab_size)
    _check_vocab(module, vocab_size)
    from workers.generic.dispatch import packable  # deferred: imports torch

    if packable(module):
        return "packed"
    from workers.generic.validation import validate_module  # deferred: imports torch

    try:
        validate_module(module)
    except ConfigError as exc:
        dropout = "dropout" in str(exc) and "dropout" in descriptor.options
        raise ConfigError(
            f"model {model.name!r}: {exc}",
            field="model.options.dropout" if dropout else "model.name",
        ) from None
    if "lipschitz" in set(strategies):
        # As the worker refuses it (workers.training.loop), but before anything is charged.
        raise ConfigError(
            "the lipschitz strategy needs a Lipschitz model the packed path covers (lip_mlp or "
            f"lip_cnn); model {model.name!r} runs on the generic path",
            field="model.name",
        )
    return "generic"


def _check_vocab(module: Any, vocab_size: int | None) -> None:
    """A transformers text model's embedding rows cover the data's token ids: the data was
    tokenized with the checkpoint's own tokenizer (``dataset.options.tokenizer`` naming the
    checkpoint directory), not another one whose ids would index other tokens, or none."""
    from workers.models.pretrained import HFTextClassifier  # deferred: imports torch

    if vocab_size is None or not isinstance(module, HFTextClassifier):
        return
    embeddings: Any = module.model.get_input_embeddings()  # type: ignore[operator]
    rows = int(embeddings.num_embeddings)
    if int(vocab_size) - 2 > rows:  # the data's ids are the tokenizer's + 2 (0 pads, 1 unknown)
        raise ConfigError(
            f"the data's tokenizer has {int(vocab_size) - 2} tokens, the checkpoint embeds "
            f"{rows}: tokenize the text with the checkpoint's own tokenizer "
            "(dataset.options.tokenizer: the checkpoint directory)",
            field="dataset.options.tokenizer",
        )


def model_size(
    model: ModelSpec,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    vocab_size: int | None = None,
) -> tuple[int, int]:
    """``(trained, total)`` parameters of the model a trial builds (the plan and the card:
    frozen parameters are neither clipped nor noised). Builds it as :func:`check_model` does.

    Raises:
        ConfigError: as :func:`check_model`.
    """
    from workers.models.trainable import trained_counts  # deferred: imports torch

    return trained_counts(_build_for_check(model, input_shape, num_classes, vocab_size))


def _build_for_check(
    model: ModelSpec, input_shape: tuple[int, ...], num_classes: int, vocab_size: int | None
) -> Any:
    """The model as a trial builds it (same builder, same options), on the meta device.

    A plug-in's builder may need real tensors (it reads a weight, calls numpy on one): then it
    is built on the CPU, as the quota's estimate builds it (:mod:`sweeper.sweeps.quota`).
    """
    # deferred: torch is heavy, and a packed-path model is checked without it (module doc)
    import torch

    from workers.models.registry import build_model  # deferred: imports torch
    from workers.training.prepare import with_data_vocab  # deferred: imports torch

    spec = with_data_vocab(model, vocab_size)

    def build() -> Any:
        return build_model(
            spec, input_shape=tuple(input_shape), num_classes=int(num_classes), seed=0
        )

    try:
        with torch.device("meta"):
            return build()
    except ConfigError:
        raise  # the builder's own refusal (an option, the data's shape): the same on the CPU
    except Exception:  # any other failure on meta (a builder that needs real tensors): the CPU
        pass
    try:
        return build()
    except ConfigError:
        raise
    except Exception as exc:  # a trial would fail the same way, after its charge
        raise ConfigError(
            f"model {model.name!r} could not be built for this dataset (examples of shape "
            f"{list(input_shape)}, {num_classes} classes): {type(exc).__name__}: {exc}",
            field="model.name",
        ) from None
