"""Temporary re-exports (issue 21): the test server moved to :mod:`api.testing.server`."""

from __future__ import annotations

from api.testing.server import SMALL_SPEC, Server, start_server  # noqa: F401
