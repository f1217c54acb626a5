"""The subcommands of the ``aiotimer`` command line.

Subcommands are registered in one place, :data:`COMMANDS`: each is a
:class:`Command` with a function that adds its arguments and one that runs it. To add
one, write both functions and append a :class:`Command`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiotimer._version import __version__
from aiotimer.cli import _demo as demo
from aiotimer.cli import _run as _cli_run
from aiotimer.cli import _serve as _cli_serve
from aiotimer.cli._status import configure_parser as status_args
from aiotimer.cli._status import run_status

__all__ = ["COMMANDS", "Command", "build_parser", "run_command"]


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand: its name, one-line help, argument setup and entry point."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


#: Every subcommand, in the order ``--help`` lists them.
COMMANDS: list[Command] = [
    Command(
        "serve", "run a timer server on a FIFO", _cli_serve.configure_serve, _cli_serve.run_serve
    ),
    Command("status", "show what a running server does", status_args, run_status),
    Command(
        "run",
        "supervise workers: restart them when they hang or fail",
        _cli_run.configure_run,
        _cli_run.run_run,
    ),
    Command(
        "demo",
        "watch a server reap a stuck worker among healthy ones (about 5 seconds)",
        demo.configure_parser,
        demo.run_demo,
    ),
]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="aiotimer", description="asyncio-native expiration-timer service (watchdog)"
    )
    parser.add_argument("--version", action="version", version=f"aiotimer {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        command.configure(sub)
        sub.set_defaults(run=command.run)
    return parser


def run_command(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the subcommand; its exit status."""
    args = build_parser().parse_args(argv)
    status: int = args.run(args)
    return status
