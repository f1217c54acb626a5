"""Command-line values shared by the subcommands: argument types that reject bad values
with a message saying what to change, and the reaping, kill-policy and logging options."""

from __future__ import annotations

import argparse
import functools
import math
import os
import signal
import socket
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from aiotimer import reapers
from aiotimer._edges.files import check_private_dir
from aiotimer.control import MAX_SOCKET_PATH, fits_socket
from aiotimer.core import ScopeStats, format_summaries

if TYPE_CHECKING:
    from aiotimer.reapers import KillPolicy, ReapPolicy

__all__ = [
    "add_kill_policy_arguments",
    "add_log_level_argument",
    "add_metrics_port_argument",
    "add_reap_arguments",
    "argument_error",
    "control_path",
    "event_log_path",
    "existing_dir",
    "fifo_path",
    "file_path",
    "kill_policy_from_args",
    "octal_mode",
    "one_line_errors",
    "policy_from_args",
    "port",
    "positive",
    "positive_seconds",
    "print_stats",
    "seconds",
    "uid",
    "whole_number",
]


def add_log_level_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--log-level``: the lowest level of events printed to stderr."""
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="lowest level of events printed to stderr (default: INFO)",
    )


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
        type=seconds,
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
        type=existing_dir,
        metavar="DIR",
        help="directory of the workers' dump files (implies --dump; default: "
        "$AIOTIMER_DUMP_DIR or the system temp dir)",
    )
    reaping.add_argument(
        "--keep-dumps",
        action="store_true",
        help="keep the dump files that reaped (or otherwise exited) workers leave, the "
        f"newest {reapers.MAX_KEPT_DUMPS} (default: each is removed once its worker is gone; "
        "run: its workers' dump directory is removed with it)",
    )
    reaping.add_argument(
        "--dump-timeout",
        type=seconds,
        default=2.0,
        metavar="SECONDS",
        help="how long to wait for a stack dump (default: 2)",
    )
    reaping.add_argument(
        "--unkillable-after",
        type=seconds,
        default=5.0,
        metavar="SECONDS",
        help="report a worker still alive this long after its last signal (default: 5)",
    )
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
    return reaping


def add_kill_policy_arguments(parser: argparse.ArgumentParser, *, descendants_only: bool) -> None:
    """Add the kill-policy options (read by :func:`kill_policy_from_args`).

    Args:
        parser: the subcommand's parser.
        descendants_only: the default of ``--descendants-only``: ``aiotimer run`` starts
            every process it watches, so only its descendants may be signalled;
            ``aiotimer serve`` watches processes it did not start.
    """
    policy = parser.add_argument_group(
        "kill policy",
        "Who may be signalled. By default: processes of the server's own uid (any uid "
        "when it runs as root), never the server's ancestors, no SIGSTOP/SIGCONT and "
        "other job-control signals"
        + (", and only descendants of this process" if descendants_only else "")
        + ". Every refusal is a signal_refused event.",
    )
    policy.add_argument(
        "--kill-uid",
        type=uid,
        action="append",
        metavar="UID",
        help="signal only processes of this uid (repeat for several); replaces the default",
    )
    policy.add_argument(
        "--descendants-only",
        action=argparse.BooleanOptionalAction,
        default=descendants_only,
        help="signal only descendants of this process, so a line naming any other process "
        f"is refused (default: {'on' if descendants_only else 'off'})",
    )


def kill_policy_from_args(args: argparse.Namespace) -> KillPolicy:
    """The kill policy the options of :func:`add_kill_policy_arguments` ask for."""
    uids = None if args.kill_uid is None else frozenset(args.kill_uid)
    return reapers.KillPolicy(uids=uids, descendants_only=args.descendants_only)


def print_stats(args: argparse.Namespace, summaries: Iterable[ScopeStats]) -> None:
    """Print the per-scope duration statistics on stdout if ``--shadow`` or ``--stats``
    asked for them (see :func:`add_reap_arguments`)."""
    if args.shadow or args.stats:
        print(format_summaries(summaries), end="", flush=True)


def add_metrics_port_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--metrics-port``: ``GET /metrics`` over TCP on ``127.0.0.1``."""
    parser.add_argument(
        "--metrics-port",
        type=port,
        metavar="PORT",
        help="also serve GET /metrics over TCP on 127.0.0.1:PORT (0: any free port), for "
        "scrapers that cannot read a Unix socket",
    )


def one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Make ``parser``'s usage errors one line and exit status 2 (:func:`argument_error`)."""
    parser.error = functools.partial(argument_error, parser)  # type: ignore[method-assign]


def uid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"need a numeric uid >= 0, got {text!r}")
    return value


def argument_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """One line instead of the usage block: the message says what to change."""
    parser.exit(2, f"{parser.prog}: error: {message} (see {parser.prog} --help)\n")


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value >= 0 and value != math.inf):
        raise argparse.ArgumentTypeError(f"need a finite number of seconds >= 0, got {text!r}")
    return value


def _listening(path: str) -> bool:
    """Whether something accepts connections on the Unix socket ``path`` (a stale socket
    left by a killed server does not, and is replaced when the control plane binds)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def positive_seconds(text: str) -> float:
    """The argument type of a finite number of seconds > 0."""
    try:
        value = seconds(text)
    except argparse.ArgumentTypeError:
        value = 0.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"need a finite number of seconds > 0, got {text!r}")
    return value


def whole_number(minimum: int) -> Callable[[str], int]:
    """The argument type of a whole number ``>= minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"need a whole number >= {minimum}, got {text!r}")
        return value

    return parse


#: The argument type of a whole number >= 1.
positive = whole_number(1)


def port(text: str) -> int:
    """The argument type of a TCP port number, ``0..65535`` (``0``: any free port)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"need a port number 0..65535, got {text!r}")
    return value


def octal_mode(text: str) -> int:
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


def _file_path(text: str, what: str | None) -> Path:
    path = Path(text)
    if not text or path.name in ("", ".", ".."):
        purpose = "" if what is None else f" for {what}"
        named = f"{text!r} is a directory; " if text and path.is_dir() else ""
        raise argparse.ArgumentTypeError(f"{named}need a file path{purpose}, got {text!r}")
    return path


def fifo_path(text: str) -> str:
    _parent_dir(_file_path(text, "the FIFO"), "the FIFO")
    return text


def control_path(text: str) -> str:
    """The argument type of a control socket's path: nothing but a socket there, in a
    directory that is private (or will be made so, 0700) and whose own directory exists;
    checked before anything starts (the control plane checks again when it binds)."""
    path = _file_path(text, "the control socket")
    if not fits_socket(path):
        raise argparse.ArgumentTypeError(
            f"{text!r} is longer than {MAX_SOCKET_PATH} bytes, the limit of a Unix socket"
        )
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot use {text!r}: {exc.strerror}") from None
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise argparse.ArgumentTypeError(
                f"{text!r} exists and is not a socket; remove it or choose another path"
            )
        if _listening(text):
            raise argparse.ArgumentTypeError(
                f"another server listens on the control socket {text!r}; stop it or "
                "choose another path"
            )
    if path.parent.exists():
        try:
            check_private_dir(path.parent, what="control directory")
        except OSError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    else:
        _parent_dir(path.parent, "the control socket's directory")
    return text


def file_path(text: str) -> str:
    """The argument type of a path to a file: not empty, not a directory's name."""
    _file_path(text, None)
    return text


def event_log_path(text: str) -> str:
    path = _file_path(text, "the event log")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file path")
    _parent_dir(path, "the event log")
    return text


def existing_dir(text: str) -> str:
    path = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("need a directory, got ''")
    if not path.is_dir():
        problem = "is not a directory" if path.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"{text!r} {problem}; create it or choose another")
    return text


def policy_from_args(args: argparse.Namespace) -> ReapPolicy:
    """The reap policy the options of :func:`add_reap_arguments` ask for."""
    dump = bool(args.dump or args.dump_dir)
    ladder = None
    if args.grace is not None or args.group or dump:
        ladder = reapers.Escalation(
            dump=dump,
            dump_timeout=args.dump_timeout,
            soft_signal=signal.SIGTERM if args.grace is not None else None,
            grace=args.grace if args.grace is not None else 0.0,
            kill_signal=signal.SIGKILL,
            group=args.group,
        )
    return reapers.ReapPolicy(ladder, shadow=args.shadow, unkillable_after=args.unkillable_after)
