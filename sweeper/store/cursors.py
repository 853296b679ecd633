"""Opaque keyset cursors for the API's pages.

A cursor is the base64 JSON of the last row's sort key, so a page never skips or repeats rows
when new rows arrive.

In the store layer (it knows only sort keys) because every layer above pages its rows with it:
the datasets layer's analyst views as well as the sweeps and the audits.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from dpsweep.errors import ConfigError


def encode_cursor(key: list[Any]) -> str:
    """The cursor of a page that ends at a row with this sort key."""
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None, *, length: int) -> list[Any] | None:
    """The key a cursor holds (None for the first page).

    Raises:
        ConfigError: a cursor this API did not hand out.
    """
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        key = None
    if not isinstance(key, list) or len(key) != length:
        raise ConfigError(
            "invalid cursor: pass the next_cursor of a previous page unchanged, or omit it",
            field="cursor",
        )
    return key


@dataclass(frozen=True)
class Page:
    """One page of items, and the cursor of the next (None on the last page)."""

    items: list[dict[str, Any]]
    next_cursor: str | None
