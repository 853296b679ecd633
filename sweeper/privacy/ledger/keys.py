"""Ledger keys: dataset names and content identities, sweep and trial ids, notes."""

from __future__ import annotations

from dpsweep.errors import ConfigError

__all__ = [
    "IDENTITY_PREFIX",
    "KEY_MAX_LENGTH",
    "checked_key",
    "checked_note",
    "dataset_label",
    "identity_key",
]

#: Longest dataset key, sweep id or trial id accepted (the columns are ``VARCHAR(200)``).
KEY_MAX_LENGTH = 200

#: Prefix of ledger keys that are a dataset's content identity (``sha256:<64 hex digits>``,
#: see :func:`workers.datasets.content_sha256`) rather than a name.
IDENTITY_PREFIX = "sha256:"


def checked_key(value: object, field: str) -> str:
    """``value`` if it is a usable key (a non-blank string of at most
    :data:`KEY_MAX_LENGTH` characters), else ConfigError naming ``field``."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{field} must be a non-empty string, got {value!r}", field=field)
    if len(value) > KEY_MAX_LENGTH:
        raise ConfigError(
            f"{field} is {len(value)} characters long; at most {KEY_MAX_LENGTH} are allowed",
            field=field,
        )
    return value


def identity_key(content_sha256: str) -> str:
    """The ledger key of a dataset's records: ``sha256:<hex>``.

    Raises:
        ConfigError: If ``content_sha256`` is not 64 lowercase hex digits.
    """
    if (
        not isinstance(content_sha256, str)
        or len(content_sha256) != 64
        or any(c not in "0123456789abcdef" for c in content_sha256)
    ):
        raise ConfigError("a content identity is 64 lowercase hex digits", field="content_sha256")
    return IDENTITY_PREFIX + content_sha256


def dataset_label(key: str) -> str:
    """How messages name a ledger key. Never a content identity: messages reach analysts
    (a refused sweep, a trial's error), and the hash of every record lets anyone who knows all
    records but one test guesses of the last. The caller knows which name was meant."""
    if key.startswith(IDENTITY_PREFIX):
        return "the dataset"
    return f"dataset {key!r}"


def checked_note(value: object) -> str:
    """``value`` if it is a string (an entry's free-text note), else ConfigError."""
    if not isinstance(value, str):
        raise ConfigError(f"note must be a string, got {type(value).__name__}", field="note")
    return value
