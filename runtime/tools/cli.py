"""`python -m runtime <command>` (console script `etvk-info`).

Commands: ``info`` (the default: the device and which variants run on it)
and ``demo`` (every variant against its reference). A user mistake or a
missing Vulkan device prints one line to stderr and exits 1, never a
traceback. This module parses arguments and calls the tool modules.
"""

from __future__ import annotations

import argparse
import sys

from runtime.errors import EtvkError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m runtime", description=__doc__.split("\n")[0])
    parser.add_argument("command", nargs="?", default="info", choices=["info", "demo"],
                        help="info: the device and its variants (default); demo: every variant "
                             "against its reference")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console entry point (`etvk-info`, `python -m runtime ...`); returns the exit status."""
    command = _parser().parse_args(argv).command
    try:
        if command == "demo":
            from runtime.tools.demo import run_demo

            return run_demo()
        from runtime.tools.info import info

        return info()
    except EtvkError as exc:
        print(exc, file=sys.stderr)
        return 1
