"""Temporary re-exports (issue 21): the API-token repository moved to
:mod:`sweeper.store.tokens`."""

from __future__ import annotations

from sweeper.store.tokens import (  # noqa: F401
    EXAMPLE_ADMIN_TOKEN,
    EXAMPLE_DB_PASSWORD,
    EXAMPLE_RAY_TOKEN,
    MIN_BOOTSTRAP_LENGTH,
    PREFIX,
    Principal,
    TokenInfo,
    TokenNotFound,
    check_bootstrap_secret,
    check_name,
    create_token,
    ensure_token,
    list_tokens,
    revoke_token,
    verify_token,
)
