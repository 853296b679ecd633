"""What DP-SGD trains of a built model: ``trainable`` applied as ``requires_grad``, and LoRA.

A frozen parameter (``requires_grad`` false) is neither clipped nor noised by the engine
(:mod:`workers.generic`): it is a public input of every release, as long as it has seen no
private record (the checkpoint's registration declares it). So the ε of a run does not depend
on what is frozen; the noise per trained coordinate does not change either, but fewer
coordinates carry it.

* ``all``: every parameter (LoRA settings are refused without ``lora``);
* ``head``: the output layer only (:func:`head_module`);
* ``lora``: LoRA adapters (``peft``, ``lora_dropout`` 0) on the model's linear layers, plus the
  head (its size changed with the dataset's classes, so it cannot stay frozen);
* a tuple of fnmatch patterns of parameter names (``"bert.encoder.layer.1.*"``); patterns that
  match nothing are refused (a typo would otherwise train nothing, or everything).
"""

from __future__ import annotations

import fnmatch

from torch import nn

from dpsweep.errors import ConfigError
from workers.models.descriptors import LoraSpec, ModelSpec

_FIELD = "model.trainable"


def head_module(module: nn.Module) -> tuple[str, nn.Module]:
    """The model's output layer and its qualified name.

    A wrapper of :mod:`workers.models.pretrained` names its head (``dpsweep_head``: the
    transformers model's classifier); a timm model says (``get_classifier``); any other model's
    head is its last ``nn.Linear`` in module order (the built-ins', torchvision's).

    Raises:
        ConfigError: no head could be found (field ``model.trainable``).
    """
    named = dict(module.named_modules())
    name = getattr(module, "dpsweep_head", None)
    if isinstance(name, str) and name in named:
        return name, named[name]
    get_classifier = getattr(module, "get_classifier", None)
    if callable(get_classifier):
        head = get_classifier()
        for n, m in named.items():
            if m is head and isinstance(head, nn.Module):
                return n, m
    linears = [(n, m) for n, m in named.items() if isinstance(m, nn.Linear)]
    if not linears:
        raise ConfigError(
            "trainable: head needs a model whose output layer is an nn.Linear; name the "
            "parameters to train as a list of patterns instead",
            field=_FIELD,
        )
    return linears[-1]


def _head_names(module: nn.Module) -> set[str]:
    name, head = head_module(module)
    prefix = f"{name}." if name else ""
    return {prefix + n for n, _ in head.named_parameters()}


def _under(module: nn.Module, prefix: str) -> set[str]:
    """Every parameter under the submodule ``prefix`` (its LoRA wrapper's included)."""
    return {n for n, _ in module.named_parameters() if n.startswith(f"{prefix}.")}


def apply_trainable(module: nn.Module, spec: ModelSpec) -> nn.Module:
    """Freeze what ``spec.trainable`` does not train (adding LoRA adapters first).

    Returns:
        The module (the same object; LoRA layers are injected in place).

    Raises:
        ConfigError: a pattern list that matches no parameter, a model without a head for
            ``head``, LoRA without peft or without layers to adapt.
    """
    trainable = spec.trainable
    if trainable == "all":
        return module
    if trainable == "lora":
        # The head by name, before peft may wrap it (a head it adapts keeps its name as prefix).
        head_name, _ = head_module(module)
        _inject_lora(module, spec.lora or LoraSpec())
        keep = {n for n, _ in module.named_parameters() if ".lora_" in n}
        keep |= _under(module, head_name)
    elif trainable == "head":
        keep = _head_names(module)
    else:
        patterns = [trainable] if isinstance(trainable, str) else list(trainable)
        names = [n for n, _ in module.named_parameters()]
        keep = {n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)}
        unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in names)]
        if unmatched:
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            raise ConfigError(
                f"trainable pattern(s) {unmatched} match no parameter of model {spec.name!r}; "
                f"its parameters are named like: {shown}",
                field=_FIELD,
            )
    for n, p in module.named_parameters():
        p.requires_grad_(n in keep)
    return module


def _inject_lora(module: nn.Module, lora: LoraSpec) -> None:
    """LoRA adapters (peft) injected into the module in place, dropout 0 (the generic DP path
    refuses random layers: the loss pass and the per-example pass would draw other masks)."""
    try:
        # optional extra (finetune): only a LoRA model needs peft
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError:
        raise ConfigError(
            "trainable: lora needs the peft package: pip install 'dpsweep[finetune]'",
            field=_FIELD,
        ) from None
    base = getattr(module, "lora_base", None)
    target = base if isinstance(base, nn.Module) else module
    targets = list(lora.target_modules) if lora.target_modules else None
    if targets is None and getattr(target, "config", None) is None:
        linears = sorted(
            {n.rsplit(".", 1)[-1] for n, m in target.named_modules() if isinstance(m, nn.Linear)}
        )
        raise ConfigError(
            "this model has no transformers config from which peft picks the layers to adapt: "
            f"give lora.target_modules (its linear layers are named {linears})",
            field="model.lora.target_modules",
        )
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # peft takes a float too
        target_modules=targets,
        lora_dropout=0.0,
        bias="none",
    )
    try:
        inject_adapter_in_model(config, target)
    except ValueError as exc:
        raise ConfigError(
            f"LoRA could not be added: {exc}", field="model.lora.target_modules"
        ) from None


def trained_counts(module: nn.Module) -> tuple[int, int]:
    """``(trained, total)`` parameter counts of a built model (for the plan and the card)."""
    total = sum(p.numel() for p in module.parameters())
    trained = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return trained, total


__all__ = ["apply_trainable", "head_module", "trained_counts"]
