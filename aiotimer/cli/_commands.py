"""The subcommands of the ``aiotimer`` command line.

Subcommands are registered in one place, :data:`COMMANDS`: each is a
:class:`Command` with a function that adds its arguments and one that runs it. To add
one, write both functions and append a :class:`Command`.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiotimer._version import __version__

__all__ = ["COMMANDS", "Command", "build_parser", "run_command"]


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand: its name, one-line help, argument setup and entry point."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _configure(module: str, name: str) -> Callable[[argparse.ArgumentParser], None]:
    """``module.name``, a function that adds a subcommand's arguments, imported when
    first called."""

    def configure(parser: argparse.ArgumentParser) -> None:
        getattr(importlib.import_module(module), name)(parser)

    return configure


def _run(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """``module.name``, a subcommand's entry point, imported when first called."""

    def run(args: argparse.Namespace) -> int:
        status: int = getattr(importlib.import_module(module), name)(args)
        return status

    return run


#: Every subcommand, in the order ``--help`` lists them. Each is imported only when it is
#: parsed or run, so ``aiotimer status`` loads neither the server nor the supervisor.
COMMANDS: list[Command] = [
    Command(
        "serve",
        "run a timer server on a FIFO",
        _configure("aiotimer.cli._serve", "configure_serve"),
        _run("aiotimer.cli._serve", "run_serve"),
    ),
    Command(
        "status",
        "show what a running server does",
        _configure("aiotimer.cli._status", "configure_parser"),
        _run("aiotimer.cli._status", "run_status"),
    ),
    Command(
        "run",
        "supervise workers: restart them when they hang or fail",
        _configure("aiotimer.cli._run", "configure_run"),
        _run("aiotimer.cli._run", "run_run"),
    ),
    Command(
        "demo",
        "watch a server reap a stuck worker among healthy ones (about 5 seconds)",
        _configure("aiotimer.cli._demo", "configure_parser"),
        _run("aiotimer.cli._demo", "run_demo"),
    ),
]


class _Subcommand(argparse.ArgumentParser):
    """A subcommand's parser, whose arguments are added (:attr:`Command.configure`) when
    it first parses or formats its help, so building the whole parser imports no
    subcommand."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: Callable[[argparse.ArgumentParser], None] | None = None

    def defer(self, configure: Callable[[argparse.ArgumentParser], None]) -> None:
        """Call ``configure(self)`` before this parser is first used."""
        self._pending = configure

    def _configured(self) -> None:
        configure, self._pending = self._pending, None
        if configure is not None:
            configure(self)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._configured()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._configured()
        return super().format_usage()

    def format_help(self) -> str:
        self._configured()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="aiotimer", description="asyncio-native expiration-timer service (watchdog)"
    )
    parser.add_argument("--version", action="version", version=f"aiotimer {__version__}")
    subparsers = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Subcommand
    )
    for command in COMMANDS:
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        sub.defer(command.configure)
        sub.set_defaults(run=command.run)
    return parser


def run_command(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the subcommand; its exit status."""
    args = build_parser().parse_args(argv)
    status: int = args.run(args)
    return status
