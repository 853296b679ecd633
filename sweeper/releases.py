"""Temporary re-exports (issue 21): the releases now live in :mod:`sweeper.privacy.releases`."""

from __future__ import annotations

from sweeper.privacy.releases import (  # noqa: F401
    evaluation_statement,
    grid_releases,
    lifetime_release,
    sweep_release,
)
