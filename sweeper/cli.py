"""Temporary re-exports (issue 21): the ``dpsweep`` command line moved to :mod:`api.cli`.

Only for the callers not yet rewritten (``from sweeper.cli import main`` and
``python -m sweeper.cli``); delete once they use :mod:`api.cli`.
"""

from __future__ import annotations

import sys

from api.cli import main

if __name__ == "__main__":
    sys.exit(main())
