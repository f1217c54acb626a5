"""``aiotimer serve``: run a timer server on a FIFO (and optionally a Unix socket) until
SIGINT/SIGTERM, with a control plane composed around it (the control socket, and
``/metrics`` over TCP with ``--metrics-port``)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import stat
import sys

from aiotimer._edges.logs import queued_logging
from aiotimer._edges.marker import read_live_marker
from aiotimer.cli._args import (
    add_kill_policy_arguments,
    add_log_level_argument,
    add_metrics_port_argument,
    add_reap_arguments,
    control_path,
    event_log_path,
    fifo_path,
    kill_policy_from_args,
    octal_mode,
    one_line_errors,
    policy_from_args,
    positive,
    print_stats,
    seconds,
)
from aiotimer.cli._status import log_control_plane, log_summary
from aiotimer.cluster import (
    NodePublisher,
    add_node_arguments,
    node_config,
    publishing,
    server_status,
)
from aiotimer.control import ControlPlane
from aiotimer.diagnostics import private_dump_dir
from aiotimer.errors import AiotimerError, ClusterError
from aiotimer.events import Event, ServerStopped, SourceFailed
from aiotimer.reapers import SignalReaper, py_spy_executable
from aiotimer.server import MAX_TIMERS, MAX_TIMERS_PER_WORKER, TimerServer, loop_factory
from aiotimer.sources import check_fifo_mode
from aiotimer.wire import ENV_DUMP_DIR

__all__ = ["configure_serve", "run_serve", "socket_path"]


def fifo_mode(text: str) -> int:
    """The argument type of ``--mode``: octal bits a FIFO may have (no read for others)."""
    try:
        return check_fifo_mode(octal_mode(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def configure_serve(parser: argparse.ArgumentParser) -> None:
    """Add ``aiotimer serve``'s arguments to ``parser`` (usage errors: one line, exit 2)."""
    one_line_errors(parser)
    parser.add_argument("--fifo", required=True, type=fifo_path, help="path of the FIFO to serve")
    parser.add_argument(
        "--mode",
        default="0600",
        type=fifo_mode,
        help="permission bits of the FIFO, in octal (default: 0600); never read for group "
        "or others (a reader would take the server's requests): 0644 is refused",
    )
    parser.add_argument(
        "--socket-mode",
        type=octal_mode,
        metavar="MODE",
        help="permission bits of the --socket, in octal (default: --mode's). The socket "
        "names each client, so opening it to others (0666) lets them register only "
        "themselves; the FIFO, where a line may name any pid, can stay 0600",
    )
    parser.add_argument(
        "--socket",
        nargs="?",
        const="",
        type=_socket_arg,
        metavar="PATH",
        help=(
            "also serve on a Unix socket (default path: the FIFO's plus '.sock'), where "
            "the kernel names each client so none can name another process; the marker "
            "tells clients, which then prefer it"
        ),
    )
    parser.add_argument(
        "--event-log",
        type=event_log_path,
        help="append every event as a JSON line to this file",
    )
    parser.add_argument(
        "--max-timers",
        type=positive,
        default=MAX_TIMERS,
        metavar="N",
        help=f"at most N live timers in all (default: {MAX_TIMERS:,}); when full, a new "
        "timer takes the place of one of the largest holder's, the table shared per user "
        "first, then per worker (see docs/operations.md)",
    )
    parser.add_argument(
        "--max-timers-per-worker",
        type=positive,
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
    add_log_level_argument(parser)
    parser.add_argument(
        "--loop",
        default="auto",
        choices=["auto", "asyncio", "uvloop"],
        help="event loop (default: auto, i.e. uvloop when installed)",
    )
    control = parser.add_mutually_exclusive_group()
    control.add_argument(
        "--control",
        type=control_path,
        metavar="PATH",
        help="path of the control socket (default: FIFO.control/http.sock); `aiotimer "
        "status` and `curl --unix-socket` read the server's state there",
    )
    control.add_argument("--no-control", action="store_true", help="serve no control socket")
    add_metrics_port_argument(parser)
    parser.add_argument(
        "--stats-interval",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="with --event-log, save the duration statistics beside it this often "
        "(default: 10), so a crash does not lose them",
    )
    add_reap_arguments(parser)
    add_kill_policy_arguments(parser, descendants_only=False)
    add_node_arguments(parser)


def _socket_arg(text: str) -> str:
    """``--socket``'s path; ``""`` (the option alone) means the FIFO's plus ``.sock``."""
    return text if text == "" else fifo_path(text)


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

    served_by = _live_server(args.fifo)
    if served_by is not None:
        # Said before anything starts: the control socket beside the FIFO is that
        # server's too, and would otherwise be what the refusal names.
        return (
            f"a live aiotimer server (pid {served_by}) already serves the FIFO "
            f"{args.fifo}; stop it or choose another path"
        )
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    server = TimerServer(
        fifo=args.fifo,
        fifo_mode=args.mode,
        socket=socket_path(args),
        socket_mode=args.socket_mode,
        event_log=args.event_log,
        policy=policy_from_args(args),
        reaper=SignalReaper(
            dump_dir=args.dump_dir,
            kill_policy=kill_policy_from_args(args),
            keep_dumps=args.keep_dumps,
        ),
        on_event=watch,
        stats_interval=max(args.stats_interval, 0.01),
        journal=not args.no_journal,
        max_timers=args.max_timers,
        max_timers_per_worker=args.max_timers_per_worker,
    )
    # The control plane starts first, so the FIFO's marker names its socket from the
    # first write; it serves the server's state through start and stop.
    plane = ControlPlane(
        server,
        path=False if args.no_control else (args.control or True),
        metrics_port=args.metrics_port,
    )
    loop.add_signal_handler(signal.SIGUSR1, log_summary, server)
    try:
        async with (
            publishing(node_config(args), lambda: server_status(server)) as node,
            plane,
            server,
        ):
            publishers.extend([node] if node is not None else [])
            log_control_plane(plane)
            _freeze_startup_heap()
            await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            loop.remove_signal_handler(signum)
    print_stats(args, server.scope_stats())
    return failure[0] if failure else None


def _live_server(fifo: str) -> int | None:
    """The pid of a live aiotimer server of this user serving ``fifo`` (the FIFO is there
    and its marker, of this user, names a live process), else ``None``. Another user's
    marker is never believed: anyone can plant one in a shared directory such as /tmp."""
    try:
        if not stat.S_ISFIFO(os.stat(fifo).st_mode):
            return None
    except OSError:
        return None
    found = read_live_marker(fifo, owner=os.geteuid())
    pid = None if found is None else found.marker.pid
    return None if pid in (None, os.getpid()) else pid


def _freeze_startup_heap() -> None:
    """Put what start-up allocated (modules, classes, the server's own structures) out
    of the cyclic garbage collector's reach, so that its full passes, which stop the
    event loop, scan only what the server allocates while serving: tens of thousands
    of objects fewer, milliseconds instead of tens of milliseconds per pass."""
    gc.collect()
    gc.freeze()


def run_serve(args: argparse.Namespace) -> int:
    """``aiotimer serve``: run a timer server on a FIFO until SIGINT/SIGTERM (exit 0).

    Exits 1 with a one-line message when the server cannot start or stops serving.
    Logging goes through a bounded queue to stderr, so a stderr nobody reads never
    blocks the server.
    """
    if args.socket_mode is not None and args.socket is None:
        print(
            "aiotimer serve: error: --socket-mode needs --socket (see aiotimer serve --help)",
            file=sys.stderr,
        )
        return 2
    try:  # a combination argparse cannot check: said before anything starts
        node_config(args)
    except ClusterError as exc:
        print(f"aiotimer serve: error: {exc} (see aiotimer serve --help)", file=sys.stderr)
        return 2
    try:
        factory = loop_factory(args.loop)
    except ImportError as exc:
        return _fail(f"--loop {args.loop}: {exc}; install it or use --loop asyncio")
    if args.dump or args.dump_dir:
        try:  # the workers' dump files go in a private directory, made now if missing
            private_dump_dir(args.dump_dir)
        except OSError as exc:
            if args.dump_dir is not None or os.environ.get(ENV_DUMP_DIR):
                return _fail(f"--dump: {exc}")  # a directory the operator chose
            print(f"aiotimer serve: warning: {_no_default_dump_dir(exc)}", file=sys.stderr)
    with queued_logging(args.log_level, sys.stderr):
        try:
            with asyncio.Runner(loop_factory=factory) as runner:
                failure = runner.run(_serve(args))
        except (AiotimerError, OSError) as exc:
            failure = str(exc)
    return 0 if failure is None else _fail(failure)


def _no_default_dump_dir(exc: OSError) -> str:
    """Why ``--dump`` goes on without the default dump directory (another user's, say:
    the workers' hooks cannot write there and the server reads nothing from it), and
    what dumps it still takes, in one line."""
    if py_spy_executable() is not None:
        then = "stack dumps come from py-spy (installed) instead of the workers' hooks"
    else:
        then = "no stack dumps: the workers' hooks cannot use it and py-spy is not installed"
    return (
        f"--dump: {exc}; {then}. Set {ENV_DUMP_DIR} (or --dump-dir) to a private directory "
        "for the server and its workers"
    )


def _fail(message: str) -> int:
    print(f"aiotimer serve: error: {message}", file=sys.stderr, flush=True)
    return 1
