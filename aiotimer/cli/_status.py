"""``aiotimer status``: what a running server is doing, from its control socket; with
``--etcd``, what a whole job is doing, from the nodes' records in etcd; with
``--event-log FILE``, what happened in a run or server, ended or not, from its event log.

Exit status, as ``systemctl status`` and the LSB define them: 0 the server runs and
answered; 3 nothing serves there (no FIFO or socket, or a stale one); 4 a usage error;
1 anything else (the server runs without a control socket, answered with an error, gave
no whole answer within ``--timeout``, or closed the connection at once). ``--timeout``
bounds the whole exchange, so a busy or stalled server never hangs it.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import stat
import sys
import time
from typing import TYPE_CHECKING, NoReturn

import msgspec

from aiotimer import cluster, control
from aiotimer.cli._args import file_path, positive_seconds
from aiotimer.cluster import add_job_status_arguments
from aiotimer.control import format_status
from aiotimer.control.client import ControlClient
from aiotimer.control.snapshot import DEFAULT_LIMIT, MAX_LIMIT, status_snapshot
from aiotimer.errors import ControlError, ServerUnavailableError

if TYPE_CHECKING:
    from aiotimer.control import ControlPlane, HistoryReader
    from aiotimer.server import TimerServer

__all__ = [
    "EXIT_NOT_RUNNING",
    "EXIT_USAGE",
    "configure_parser",
    "log_control_plane",
    "log_summary",
    "read_event_log",
    "run_status",
]

logger = logging.getLogger("aiotimer")

#: Nothing serves at the given path (LSB "program is not running").
EXIT_NOT_RUNNING = 3
#: Bad arguments (LSB "program or service status is unknown" is 4; the usage code here).
EXIT_USAGE = 4


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add ``aiotimer status``'s arguments; argument errors exit with :data:`EXIT_USAGE`."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--fifo", type=file_path, help="the server's FIFO (its marker names the control socket)"
    )
    where.add_argument("--control", type=file_path, help="the server's control socket")
    where.add_argument(
        "--event-log",
        type=file_path,
        metavar="FILE",
        help="what happened in a run or server that has ended (or still runs), read from "
        "its event log: each rank's attempts and how each ended, restarts and their "
        "causes, hang reports, reaps and refusals, and the outcome",
    )
    add_job_status_arguments(parser, where)
    parser.add_argument("--json", action="store_true", help="print the state as JSON")
    parser.add_argument(
        "--hang-report",
        action="store_true",
        help="print the last hang report of an `aiotimer run` whole (with --json: as JSON)",
    )
    parser.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=positive_seconds,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until interrupted",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"list at most this many workers and timers (default {DEFAULT_LIMIT})",
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=5.0,
        help="seconds the whole exchange with the server may take (default 5)",
    )

    def usage_error(message: str) -> NoReturn:
        parser.exit(EXIT_USAGE, f"{parser.prog}: error: {message} (see {parser.prog} --help)\n")

    parser.error = usage_error  # type: ignore[method-assign]


def run_status(args: argparse.Namespace) -> int:
    """Print the state once (or every ``--watch`` seconds); return the exit status."""
    if args.etcd is not None:
        return cluster.run_job_status(args)  # etcd's client loads only when asked for
    if args.event_log is not None:
        return _event_log_status(args)
    if not 0 <= args.limit <= MAX_LIMIT:
        print(f"aiotimer status: --limit must be 0..{MAX_LIMIT}", file=sys.stderr)
        return EXIT_USAGE
    try:
        client = (
            ControlClient.for_fifo(args.fifo, timeout=args.timeout)
            if args.fifo is not None
            else ControlClient(args.control, timeout=args.timeout)
        )
        if args.hang_report:
            report = client.hang_report()
            text = json.dumps(report, indent=1) + "\n" if args.json else str(report["text"])
            sys.stdout.write(text)
            return 0
        while True:
            snap = client.state(limit=args.limit)
            text = (
                msgspec.json.format(msgspec.json.encode(snap)).decode() + "\n"
                if args.json
                else format_status(snap)
            )
            if args.watch is not None and sys.stdout.isatty():
                text = "\x1b[H\x1b[2J" + text  # clear the screen between refreshes
            sys.stdout.write(text)
            sys.stdout.flush()
            if args.watch is None:
                return 0
            time.sleep(args.watch)
    except ServerUnavailableError as exc:
        print(f"aiotimer status: {exc}", file=sys.stderr)
        return EXIT_NOT_RUNNING
    except ControlError as exc:
        print(f"aiotimer status: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


def read_event_log(path: str) -> HistoryReader:
    """Fold the event log at ``path`` (:class:`~aiotimer.control._history.HistoryReader`),
    reading it a line at a time, however long it is.

    Raises:
        OSError: it cannot be opened or read, or it is no regular file (a FIFO or a
            device is refused at once, never waited on).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    reader = control.HistoryReader()  # the event log's reader loads only when asked for
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        for line in f:
            try:
                data = _decode(line)
            except msgspec.DecodeError:
                data = None  # a line cut short (a killed writer): counted as unreadable
            reader.feed(data)
    return reader


_decode = msgspec.json.Decoder().decode


def _event_log_status(args: argparse.Namespace) -> int:
    """``aiotimer status --event-log FILE``: what happened, from the event log."""
    try:
        while True:
            try:
                reader = read_event_log(args.event_log)
            except OSError as exc:
                why = exc.strerror or str(exc)
                print(
                    f"aiotimer status: cannot read the event log {args.event_log!r}: {why}",
                    file=sys.stderr,
                )
                return 1
            if args.hang_report:
                reports = reader.run.hang_reports
                if not reports:
                    print(
                        "aiotimer status: the event log's last run has no hang report",
                        file=sys.stderr,
                    )
                    return 1
                last = reports[-1]
                text = json.dumps(last.to_dict(), indent=1) + "\n" if args.json else last.report
            elif args.json:
                text = json.dumps(control.history_dict(reader), indent=1) + "\n"
            else:
                text = control.format_history(reader, args.event_log)
            if args.watch is not None and sys.stdout.isatty():
                text = "\x1b[H\x1b[2J" + text
            sys.stdout.write(text)
            sys.stdout.flush()
            if args.watch is None:
                return 0
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def log_summary(server: TimerServer) -> None:
    """Log ``server``'s state in the human view (``aiotimer serve`` does on SIGUSR1)."""
    try:
        text = format_status(status_snapshot(server.snapshot()))
    except Exception:
        logger.exception("could not summarise the server's state")
        return
    logger.warning("state summary (SIGUSR1):\n%s", text.rstrip("\n"))


def log_control_plane(plane: ControlPlane) -> None:
    """Log where a started control plane serves (``aiotimer serve`` and ``aiotimer run``
    do once it runs): the socket ``aiotimer status --control`` reads, and the TCP port of
    ``GET /metrics``, which ``--metrics-port 0`` leaves to the system to choose."""
    where = [] if plane.path is None else [f"control socket {plane.path}"]
    if plane.metrics_port is not None:
        where.append(f"GET /metrics on 127.0.0.1:{plane.metrics_port}")
    if where:
        logger.info("serving %s", "; ".join(where))
