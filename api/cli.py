"""The ``dpsweep`` command: the sweeper's commands plus ``serve`` and ``scheduler``.

The entry point lives here, in the top layer, so that ``sweeper`` never imports ``api``.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from api.serve import add_parsers
    from sweeper.cli import build_parser

    parser = build_parser(add_parsers)
    args = parser.parse_args(argv)
    return int(args.func(args.subparser, args) or 0)
