"""Temporary re-exports (issue 21): the throwaway PostgreSQL is :mod:`api.testing.postgres`."""

from __future__ import annotations

from api.testing.postgres import free_port, pg_bin, throwaway_postgres  # noqa: F401
