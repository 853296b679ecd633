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
    "scoped_identity_key",
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


#: Separates a content identity from the tenant that owns the records under it. Token names
#: (the tenants) are letters, digits, ``. _ @ -`` (:func:`sweeper.store.tokens.check_name`),
#: so the separator never occurs in either part.
TENANT_SEPARATOR = "/"


def scoped_identity_key(content_sha256: str, *, owner: str | None) -> str:
    """The ledger key of a dataset's records *as one tenant holds them*.

    Names without an owner (built-ins, names the operator registered, loader names and paths
    of local use) share the identity's ledger, ``sha256:<hex>``. A tenant's uploads get a
    ledger of the tenant's own, ``sha256:<hex>/<owner>``: the same records uploaded by
    another tenant must not open, read or cap the first tenant's ledger (whether two
    tenants' records are equal is itself a fact about private records: with every record
    but one known, it is a membership test). One owner's re-uploads of the same records keep
    sharing one ledger, so a re-upload never resets a budget.

    Raises:
        ConfigError: If ``content_sha256`` is not 64 lowercase hex digits, or ``owner`` is
            empty or contains the separator.
    """
    key = identity_key(content_sha256)
    if owner is None:
        return key
    if not owner or TENANT_SEPARATOR in owner:
        raise ConfigError(f"not a tenant name: {owner!r}", field="owner")
    return checked_key(f"{key}{TENANT_SEPARATOR}{owner}", "owner")


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
