"""Temporary re-exports (issue 21): the sweep commands moved to :mod:`api.cli.run` and
:mod:`api.cli.sweeps`; delete once their callers import from there."""

from __future__ import annotations

from api.cli.run import _progress_view  # noqa: F401
from api.cli.sweeps import cancel_message  # noqa: F401
