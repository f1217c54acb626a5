"""The ``aiotimer`` command line.

Subcommands are registered in one place, :data:`COMMANDS`: each is a
:class:`Command` with a function that adds its arguments and one that runs it. To add
one, write both functions and append a :class:`Command`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiotimer.errors import AiotimerError
from aiotimer.server import TimerServer, loop_factory

__all__ = ["COMMANDS", "Command", "main"]


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand: its name, one-line help, argument setup and entry point."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# -- serve ------------------------------------------------------------------------------


def _configure_serve(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fifo", required=True, help="path of the FIFO to serve")
    parser.add_argument(
        "--mode",
        default="0600",
        type=lambda text: int(text, 8),
        help="permission bits of the FIFO, in octal (default: 0600)",
    )
    parser.add_argument("--event-log", help="append every event as a JSON line to this file")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="lowest level of events printed to stderr (default: INFO)",
    )
    parser.add_argument(
        "--loop",
        default="auto",
        choices=["auto", "asyncio", "uvloop"],
        help="event loop (default: auto, i.e. uvloop when installed)",
    )


async def _serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with TimerServer(fifo=args.fifo, fifo_mode=args.mode, event_log=args.event_log):
            await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def run_serve(args: argparse.Namespace) -> int:
    """``aiotimer serve``: run a timer server on a FIFO until SIGINT/SIGTERM (exit 0)."""
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)-8s %(message)s",
    )
    try:
        with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
            runner.run(_serve(args))
    except AiotimerError as exc:
        print(f"aiotimer serve: {exc}", file=sys.stderr)
        return 1
    return 0


#: Every subcommand, in the order ``--help`` lists them.
COMMANDS: list[Command] = [
    Command("serve", "run a timer server on a FIFO", _configure_serve, run_serve),
]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="aiotimer", description="asyncio-native expiration-timer service (watchdog)"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        command.configure(sub)
        sub.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aiotimer`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    status: int = args.run(args)
    return status
