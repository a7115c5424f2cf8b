"""The ``autotune`` command: init, search, estimate, export, compare, report, show, validate, studies.

Contract: bad input (a model.yaml field, a flag, a study name) prints ``error: …`` naming the
field or file and exits 2 with nothing written; Ctrl-C during a search exits 130 after the
running trials were recorded as interrupted (``--resume`` reruns them).
"""

from __future__ import annotations

import sys

from autotune.cli import commands
from autotune.cli.args import build_parser
from autotune.spec.errors import SpecError

__all__ = ["build_parser", "main"]


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return getattr(commands, f"cmd_{args.run}")(args)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
