"""A model card as Markdown: the README.md beside a downloaded model.

:func:`render_card_markdown` reads only the card (:mod:`sweeper.artifacts.cards`), never the
store: the model, what its epsilon covers, sigma, q and T, the metrics, every warning and, for
cards of version 2 and later, how the evaluation split is rebuilt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dpsweep.plan_fields import per_unit, unit_suffix
from sweeper.artifacts.card_finetuning import finetuning_markdown
from sweeper.artifacts.card_texts import NOT_PRIVATE_WARNING, SINGLE_RUN_NOTE, SPLIT_CHECK


def _num(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or value is None:
        return "n/a" if value is None else str(value)
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def render_card_markdown(card: dict[str, Any]) -> str:
    """A short human-readable rendering of a card (the README.md beside a downloaded model):
    the model, what its epsilon covers, sigma, q and T, the metrics and every warning."""
    t, d, m, p = card["trial"], card["dataset"], card["model"], card["privacy"]
    ev, met = card["evaluation"], card["metrics"]
    lines = [
        f"# Model card: {m.get('name')} from trial {t['id']}",
        "",
        f"Trained by dpsweep {card.get('dpsweep_version')} in sweep {t['sweep_name']!r} "
        f"({t['sweep']}), arm `{t['arm']}` (strategy `{t['strategy']}`) at the ε level "
        f"{_num(t['epsilon_budget'])}, on dataset `{d['name']}`.",
        "",
    ]
    if card.get("warnings"):
        lines += ["## Warnings", "", *(f"- **{w}**" for w in card["warnings"]), ""]
    lines += ["## Privacy", ""]
    if not p["private"]:
        lines += [f"- {NOT_PRIVATE_WARNING}", ""]
    else:
        g, s = p["grid"], p.get("sweep")
        # With a privacy unit every epsilon is per unit (a person), all of its rows together.
        per = unit_suffix(p.get("privacy_unit"))
        lines += [
            f"- ε = {_num(p['epsilon'])}{per} at δ = {_num(p['delta'])} (this model's grid): "
            f"covers {p['covers']}.",
        ]
        if s:
            lines.append(
                f"- ε = {_num(s['epsilon'])}{per} at δ = {_num(s['delta'])} (the whole sweep): "
                f"covers {s['covers']}."
            )
        lines += [
            f"- σ = {_num(p['noise_multiplier'])}, q = {_num(p['sample_rate'])}, "
            f"T = {_num(p['steps'])} steps, δ per run = {_num(p['target_delta'])}.",
            f"- Accounting `{p['accounting']}`, accountant `{p['accountant']}`; verified by "
            f"{g.get('verified_by')} (ε ≈ {_num(g.get('epsilon_verified'))}).",
            f"- Single run's ε: {_num(p['single_run_epsilon']['epsilon'])} ({SINGLE_RUN_NOTE}).",
        ]
        if p.get("selected_trial"):
            lines.append(f"- {p['selection']}.")
    lines += [
        f"- Randomness: {p['randomness']}.",
        "",
        "## Evaluation",
        "",
        f"Mode `{ev.get('mode')}`: {ev.get('statement')}.",
        "",
        f"## Metrics (best checkpoint, step {_num(met.get('best_step'))})",
        "",
        f"Objective: {met['metric']} ({met['mode']}).",
        "",
        "| metric | value |",
        "| --- | --- |",
        *(f"| {k} | {_num(v)} |" for k, v in sorted((met.get("values") or {}).items())),
        "",
        "## Model",
        "",
        f"- Architecture `{m.get('name')}` with options `{json.dumps(m.get('options') or {})}`, "
        f"input shape {m.get('input_shape')}, {m.get('num_classes')} classes, "
        f"{m.get('parameters')} parameters.",
        f"- Weights: {m['weights']['format']}, {m['weights']['size_bytes']} bytes, sha256 "
        f"`{m['weights']['sha256']}`.",
        f"- Inputs: {inputs_text(card)}.",
        f"- Hyperparameters: `{json.dumps(t['hyperparameters'], sort_keys=True)}`; seed "
        f"{t['seed']} ({t['seed_seeds']}).",
        "",
        *finetuning_markdown(card.get("finetuning")),
        *_split_markdown(d),
    ]
    return "\n".join(lines)


def _split_markdown(d: dict[str, Any]) -> list[str]:
    """The dataset's evaluation split, as it can be rebuilt (cards of version 2 and later)."""
    sp = d.get("split")
    if not isinstance(sp, dict):
        return []
    bounds = sp.get("input_bounds")
    lines = [
        "## Dataset and evaluation split",
        "",
        f"- Dataset `{d.get('name')}` (loader `{sp.get('loader')}`"
        + (f", options `{json.dumps(sp['options'], sort_keys=True)}`" if sp.get("options") else "")
        + f"): {_num(d.get('n_train'))} training and {_num(d.get('n_eval'))} evaluation "
        + _counted(d.get("privacy_unit"))
        + ".",
        f"- Evaluation mode `{sp.get('eval_mode')}`"
        + (f" on `{sp['eval_dataset']}`" if sp.get("eval_dataset") else "")
        + f": {sp.get('method')}.",
        f"- Split seed {sp.get('split_seed')}, test fraction {_num(sp.get('test_fraction'))}.",
        f"- Input bounds {'none' if bounds is None else bounds}, feature clip "
        f"{_num(sp.get('feature_clip'))}.",
        "- Classes: "
        + (
            "the records' sorted distinct labels"
            if sp.get("classes") is None
            else ", ".join(f"`{c}`" for c in sp["classes"])
        )
        + ".",
        f"- {SPLIT_CHECK}.",
        "",
    ]
    return lines


def _counted(privacy_unit: Any) -> str:
    """What the card's sizes count: records, or units where a privacy unit is declared."""
    if not per_unit(privacy_unit):
        return "records"
    return f"units ({privacy_unit}; the sizes count units, not records)"


def inputs_text(card: Mapping[str, Any]) -> str:
    """What the model takes (the card's ``model.input_transform``): raw records, or inputs
    scaled as its trainer scaled them, and why."""
    t = (card.get("model") or {}).get("input_transform")
    if not isinstance(t, dict):
        return "scaled as the trainer scaled them (kept before model files carried the transform)"
    if t.get("in_model_file"):
        return f"raw records; the model file carries the input transform ({t.get('applies')})"
    if t.get("raw_inputs"):
        return f"as they are ({t.get('reason')})"
    return f"scaled as the trainer scaled them, not raw records: {t.get('reason')}"


__all__ = ["inputs_text", "render_card_markdown"]
