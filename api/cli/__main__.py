"""``python -m api.cli``: the ``dpsweep`` command without its console script."""

from __future__ import annotations

from api.cli import entry

if __name__ == "__main__":  # not when a tool imports every module of the package
    entry()
