"""Reading a sweep spec from a request body: size limits, JSON or YAML (no aliases), then the
typed :class:`dpsweep.spec.SweepSpec`. Every refusal names its field (``body``, ``arms``)."""

from __future__ import annotations

import json
from typing import Any

import yaml
from fastapi import Request

from api.errors import ApiError
from dpsweep.errors import ConfigError
from dpsweep.spec import SweepSpec, load_spec

JSON_TYPES = ("application/json",)
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")


class NoAliasLoader(yaml.SafeLoader):
    """YAML without anchors and aliases: a small document must not expand into a huge one."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise ConfigError("YAML aliases (*name) are not accepted in a spec", field="body")
        return super().compose_node(parent, index)


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused with 413 as soon as it is over ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(
            413,
            f"the spec is {int(declared)} bytes; the limit is {limit} (DPSWEEP_MAX_SPEC_BYTES)",
            kind="too-large",
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(
                413,
                f"the spec is over the limit of {limit} bytes (DPSWEEP_MAX_SPEC_BYTES)",
                kind="too-large",
            )
    return bytes(body)


def parse_spec(content_type: str, body: bytes) -> SweepSpec:
    """The typed spec of a JSON or YAML body (415 for another media type, 422 naming ``body``
    for one that does not parse or is not a mapping)."""
    ctype = content_type.split(";")[0].strip().lower()
    try:
        if ctype in JSON_TYPES or ctype.endswith("+json"):
            data = json.loads(body)
        elif ctype in YAML_TYPES:
            data = yaml.load(body.decode("utf-8"), Loader=NoAliasLoader)
        else:
            raise ApiError(
                415,
                f"a spec is sent as application/json or application/yaml, not {ctype or 'nothing'}",
                kind="unsupported-media-type",
            )
    except (ValueError, yaml.YAMLError, RecursionError) as exc:
        raise ConfigError(f"the body is not valid JSON or YAML: {exc}", field="body") from None
    if not isinstance(data, dict):
        raise ConfigError(
            "a spec must be a mapping with keys name, dataset, model, privacy, arms",
            field="body",
        )
    return load_spec(data)


def check_limits(spec: SweepSpec, max_trials: int) -> None:
    """Refuse a sweep of more trials than this server allows (422 naming ``arms``)."""
    n = spec.planned_trials()
    if n > max_trials:
        raise ConfigError(
            f"the sweep plans {n} trials; this server allows at most {max_trials} per sweep "
            "(DPSWEEP_MAX_TRIALS_PER_SWEEP): use fewer grid points, levels or seeds",
            field="arms",
        )
