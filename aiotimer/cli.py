"""The ``aiotimer`` command line.

Subcommands are registered in one place, :data:`COMMANDS`: each is a
:class:`Command` with a function that adds its arguments and one that runs it. To add
one, write both functions and append a :class:`Command`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from aiotimer import _cli_run, demo
from aiotimer._cli_status import configure_parser as status_args
from aiotimer._cli_status import log_summary, run_status
from aiotimer._kill_policy import KillPolicy
from aiotimer._logging import queued_logging
from aiotimer._policy import Escalation, ReapPolicy
from aiotimer._server_engine import MAX_TIMERS, MAX_TIMERS_PER_WORKER
from aiotimer._stats import format_summaries
from aiotimer.cluster._cli import add_node_arguments, node_config, publishing, server_status
from aiotimer.cluster._publisher import NodePublisher
from aiotimer.diagnostics import private_dump_dir
from aiotimer.errors import AiotimerError
from aiotimer.events import Event, ServerStopped, SourceFailed
from aiotimer.reapers import SignalReaper
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
    parser.error = functools.partial(_argument_error, parser)  # type: ignore[method-assign]
    parser.add_argument("--fifo", required=True, type=_fifo_path, help="path of the FIFO to serve")
    parser.add_argument(
        "--mode",
        default="0600",
        type=_mode,
        help="permission bits of the FIFO, in octal (default: 0600)",
    )
    parser.add_argument(
        "--socket",
        nargs="?",
        const="",
        type=_fifo_path,
        metavar="PATH",
        help=(
            "also serve on a Unix socket (default path: the FIFO's plus '.sock'), where "
            "the kernel names each client so none can name another process; the marker "
            "tells clients, which then prefer it"
        ),
    )
    parser.add_argument(
        "--event-log",
        type=_event_log_path,
        help="append every event as a JSON line to this file",
    )
    parser.add_argument(
        "--max-timers",
        type=_positive,
        default=MAX_TIMERS,
        metavar="N",
        help=f"reject new timers past N live timers in all (default: {MAX_TIMERS:,})",
    )
    parser.add_argument(
        "--max-timers-per-worker",
        type=_positive,
        default=MAX_TIMERS_PER_WORKER,
        metavar="N",
        help="reject a worker's new timers past N of its live timers (default: "
        f"{MAX_TIMERS_PER_WORKER:,})",
    )
    parser.add_argument(
        "--no-journal",
        action="store_true",
        help="keep no journal of live timers beside the FIFO (by default a server "
        "restarted after a crash learns from it the timers of hung workers)",
    )
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
    control = parser.add_mutually_exclusive_group()
    control.add_argument(
        "--control",
        metavar="PATH",
        help="path of the control socket (default: FIFO.control/http.sock); `aiotimer "
        "status` and `curl --unix-socket` read the server's state there",
    )
    control.add_argument("--no-control", action="store_true", help="serve no control socket")
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="also serve GET /metrics over TCP on 127.0.0.1:PORT, for scrapers that "
        "cannot read a Unix socket",
    )
    parser.add_argument(
        "--stats-interval",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="with --event-log, save the duration statistics beside it this often "
        "(default: 10), so a crash does not lose them",
    )
    reaping = add_reap_arguments(parser)
    reaping.add_argument(
        "--shadow",
        action="store_true",
        help="report only: signal nothing, report what would have been done, and print "
        "per-scope duration statistics with suggested timeouts on stop",
    )
    reaping.add_argument(
        "--stats",
        action="store_true",
        help="print per-scope duration statistics on stop (implied by --shadow)",
    )
    policy = parser.add_argument_group(
        "kill policy",
        "Who may be signalled. By default: processes of the server's own uid (any uid "
        "when it runs as root), never the server's ancestors, no SIGSTOP/SIGCONT and "
        "other job-control signals. Every refusal is a signal_refused event.",
    )
    policy.add_argument(
        "--kill-uid",
        type=_uid,
        action="append",
        metavar="UID",
        help="signal only processes of this uid (repeat for several); replaces the default",
    )
    policy.add_argument(
        "--descendants-only",
        action="store_true",
        help="signal only descendants of the server (what a supervisor wants)",
    )
    add_node_arguments(parser)


def add_reap_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Add the reaping options (read by :func:`policy_from_args`); return their group."""
    reaping = parser.add_argument_group(
        "reaping",
        "Without --grace/--group/--dump each timer is reaped with exactly the signal its "
        "request names (torch semantics). With any of them the server uses a ladder: "
        "[stack dump] -> [SIGTERM -> wait GRACE] -> SIGKILL, to the process group with "
        "--group; request keys may add to it.",
    )
    reaping.add_argument(
        "--grace",
        type=_seconds,
        metavar="SECONDS",
        help="send SIGTERM first and SIGKILL only if the worker still runs SECONDS later",
    )
    reaping.add_argument(
        "--group", action="store_true", help="signal the worker's whole process group"
    )
    reaping.add_argument(
        "--dump",
        action="store_true",
        help="ask the worker for a stack dump before signalling it (its dump hook, else "
        "py-spy when installed)",
    )
    reaping.add_argument(
        "--dump-dir",
        type=_existing_dir,
        metavar="DIR",
        help="directory of the workers' dump files (implies --dump; default: "
        "$AIOTIMER_DUMP_DIR or the system temp dir)",
    )
    reaping.add_argument(
        "--dump-timeout",
        type=_seconds,
        default=2.0,
        metavar="SECONDS",
        help="how long to wait for a stack dump (default: 2)",
    )
    reaping.add_argument(
        "--unkillable-after",
        type=_seconds,
        default=5.0,
        metavar="SECONDS",
        help="report a worker still alive this long after its last signal (default: 5)",
    )
    return reaping


def _uid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"need a numeric uid >= 0, got {text!r}")
    return value


def kill_policy_from_args(args: argparse.Namespace) -> KillPolicy:
    """The kill policy ``aiotimer serve`` options ask for."""
    uids = None if args.kill_uid is None else frozenset(args.kill_uid)
    return KillPolicy(uids=uids, descendants_only=args.descendants_only)


def _argument_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """One line instead of the usage block: the message says what to change."""
    parser.exit(2, f"{parser.prog}: error: {message} (see {parser.prog} --help)\n")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value >= 0 and value != math.inf):
        raise argparse.ArgumentTypeError(f"need a finite number of seconds >= 0, got {text!r}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"need a whole number >= 1, got {text!r}")
    return value


def _mode(text: str) -> int:
    try:
        value = int(text, 8)
    except ValueError:
        value = -1
    if not 0 <= value <= 0o777:
        raise argparse.ArgumentTypeError(
            f"need octal permission bits between 0000 and 0777 (e.g. 0600), got {text!r}"
        )
    return value


def _parent_dir(path: Path, what: str) -> None:
    parent = path.parent
    if not parent.is_dir():
        problem = "is not a directory" if parent.exists() else "does not exist"
        raise argparse.ArgumentTypeError(
            f"the directory of {what} {str(path)!r} {problem}; create it or choose another path"
        )


def _fifo_path(text: str) -> str:
    _parent_dir(Path(text), "the FIFO")
    return text


def _event_log_path(text: str) -> str:
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file path")
    _parent_dir(path, "the event log")
    return text


def _existing_dir(text: str) -> str:
    path = Path(text)
    if not path.is_dir():
        problem = "is not a directory" if path.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"{text!r} {problem}; create it or choose another")
    return text


def policy_from_args(args: argparse.Namespace) -> ReapPolicy:
    """The reap policy the options of :func:`add_reap_arguments` ask for."""
    dump = bool(args.dump or args.dump_dir)
    ladder = None
    if args.grace is not None or args.group or dump:
        ladder = Escalation(
            dump=dump,
            dump_timeout=args.dump_timeout,
            soft_signal=signal.SIGTERM if args.grace is not None else None,
            grace=args.grace if args.grace is not None else 0.0,
            kill_signal=signal.SIGKILL,
            group=args.group,
        )
    shadow = getattr(args, "shadow", False)
    return ReapPolicy(ladder, shadow=shadow, unkillable_after=args.unkillable_after)


def socket_path(args: argparse.Namespace) -> str | None:
    """The Unix socket ``aiotimer serve`` options ask for, if any."""
    if args.socket is None:
        return None
    return str(args.socket) or f"{args.fifo}.sock"


async def _serve(args: argparse.Namespace) -> str | None:
    """Serve until SIGINT/SIGTERM (``None``) or until the server fails (why it did)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    failure: list[str] = []
    publishers: list[NodePublisher] = []  # with --etcd: this node's, once it runs

    def watch(event: Event) -> None:
        for publisher in publishers:
            publisher.on_event(event)
        # A server that stops serving must end the process, so a supervisor sees it.
        if isinstance(event, SourceFailed):
            failure.append(f"source {event.source} failed: {event.error}")
        elif isinstance(event, ServerStopped) and not stop.is_set():
            failure.append("the timer server stopped unexpectedly (its log says why)")
        else:
            return
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    server = TimerServer(
        fifo=args.fifo,
        fifo_mode=args.mode,
        socket=socket_path(args),
        event_log=args.event_log,
        policy=policy_from_args(args),
        reaper=SignalReaper(dump_dir=args.dump_dir, kill_policy=kill_policy_from_args(args)),
        on_event=watch,
        control=False if args.no_control else (args.control or True),
        metrics_port=args.metrics_port,
        stats_interval=max(args.stats_interval, 0.01),
        journal=not args.no_journal,
        max_timers=args.max_timers,
        max_timers_per_worker=args.max_timers_per_worker,
    )
    loop.add_signal_handler(signal.SIGUSR1, log_summary, server)
    try:
        async with publishing(node_config(args), lambda: server_status(server)) as node, server:
            publishers.extend([node] if node is not None else [])
            await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            loop.remove_signal_handler(signum)
    if args.shadow or args.stats:
        print(format_summaries(server.scope_stats()), end="", flush=True)
    return failure[0] if failure else None


def run_serve(args: argparse.Namespace) -> int:
    """``aiotimer serve``: run a timer server on a FIFO until SIGINT/SIGTERM (exit 0).

    Exits 1 with a one-line message when the server cannot start or stops serving.
    Logging goes through a bounded queue to stderr, so a stderr nobody reads never
    blocks the server.
    """
    try:
        factory = loop_factory(args.loop)
    except ImportError as exc:
        return _fail(f"--loop {args.loop}: {exc}; install it or use --loop asyncio")
    if args.dump or args.dump_dir:
        try:  # the workers' dump files go in a private directory, made now if missing
            private_dump_dir(args.dump_dir)
        except OSError as exc:
            return _fail(f"--dump: {exc}")
    with queued_logging(args.log_level, sys.stderr):
        try:
            with asyncio.Runner(loop_factory=factory) as runner:
                failure = runner.run(_serve(args))
        except (AiotimerError, OSError) as exc:
            failure = str(exc)
    return 0 if failure is None else _fail(failure)


def _fail(message: str) -> int:
    print(f"aiotimer serve: error: {message}", file=sys.stderr, flush=True)
    return 1


#: Every subcommand, in the order ``--help`` lists them.
COMMANDS: list[Command] = [
    Command("serve", "run a timer server on a FIFO", _configure_serve, run_serve),
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
    parser.add_argument("--version", action="version", version=f"aiotimer {_version()}")
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


def _version() -> str:
    from aiotimer import __version__  # noqa: PLC0415 (lazy: the package is being imported)

    return __version__
