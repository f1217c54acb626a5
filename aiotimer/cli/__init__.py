"""The ``aiotimer`` command line.

:func:`main` is the entry point of the ``aiotimer`` command and of ``python -m
aiotimer``. It imports the command line only once it is ready for Ctrl-C: an interrupt
at any moment, while the modules load included, ends the command quietly with exit
status 130, without a traceback. The subcommands themselves are registered in
:mod:`aiotimer.cli._commands` (:data:`COMMANDS`, :func:`build_parser`), which this
module re-exports on first use.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from typing import Any, Final

__all__ = ["COMMANDS", "Command", "main"]

#: The exit status of a command interrupted by Ctrl-C (SIGINT): 128 + 2.
EXIT_INTERRUPTED: Final[int] = 128 + signal.SIGINT


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aiotimer`` command; returns the exit status (130 when
    interrupted by Ctrl-C, at any moment)."""
    try:
        from aiotimer.cli._commands import run_command  # noqa: PLC0415 (then the command run)

        return run_command(argv)
    except KeyboardInterrupt:
        # A second Ctrl-C while the interpreter winds down must not print a traceback.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sys.stderr.flush()
        return EXIT_INTERRUPTED


_LAZY: Final = ("COMMANDS", "Command", "build_parser")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from aiotimer.cli import _commands  # noqa: PLC0415 (on first use only)

        return getattr(_commands, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
