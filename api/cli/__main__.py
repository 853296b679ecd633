"""``python -m api.cli``: the ``dpsweep`` command without its console script."""

from __future__ import annotations

import sys

from api.cli import main

if __name__ == "__main__":  # not when a tool imports every module of the package
    sys.exit(main())
