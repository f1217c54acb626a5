"""``aiotimer run [options] -- CMD [ARGS...]``: supervise ``--nproc`` workers.

Exit status: 0 every worker succeeded; 1 a worker failed for good (a no-restart exit
code); 2 usage error; 3 the supervisor gave up (the restart budget was exhausted, ...);
4 stopped before the end; 5 the run cannot start (the command cannot be run, ...);
128+N interrupted by signal N (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import signal
import sys

from aiotimer._edges.logs import queued_logging
from aiotimer.cli._args import (
    add_kill_policy_arguments,
    add_log_level_argument,
    add_metrics_port_argument,
    add_reap_arguments,
    control_path,
    event_log_path,
    kill_policy_from_args,
    one_line_errors,
    policy_from_args,
    positive,
    positive_seconds,
    print_stats,
    seconds,
    whole_number,
)
from aiotimer.cli._output import bounded
from aiotimer.cli._status import log_control_plane
from aiotimer.cluster import ClusterSession, add_node_arguments, cluster_session, node_config
from aiotimer.control import ControlPlane
from aiotimer.errors import AiotimerError, ClusterError
from aiotimer.hang import DEFAULT_HANG_REPORT_TIMEOUT
from aiotimer.reapers import SignalReaper
from aiotimer.server import loop_factory
from aiotimer.supervisor import (
    DEFAULT_NO_RESTART_EXIT_CODES,
    ON_STRAGGLER,
    Backoff,
    RestartPolicy,
    RestartScope,
    Supervisor,
    format_summary,
    runs_dir,
    runtime_parent,
    start_guard,
)

__all__ = ["configure_run", "run_run"]

#: Exit status when the run cannot start (the command cannot be run, no FIFO, ...).
EXIT_CANNOT_START = 5
#: The most the summary table may wait for stderr (a pipe nobody reads).
SUMMARY_TIMEOUT = 1.0
#: The most a log line may wait for stderr.
LOG_WRITE_TIMEOUT = 0.5

logger = logging.getLogger("aiotimer")


def _window(text: str) -> float:
    """``inf`` (or ``none``: no window, the budget counts every restart) or seconds > 0;
    ``0`` is refused: it would count no restart at all, and never give up."""
    if text in ("inf", "none"):
        return math.inf
    try:
        return positive_seconds(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"need a number of seconds > 0, or 'inf' for no window (the budget then counts "
            f"every restart), got {text!r}"
        ) from None


_count = whole_number(0)


def _exit_code(text: str) -> int:
    """An exit code a worker can exit with and that means failure: 1..255."""
    code = whole_number(1)(text)
    if code > 255:
        raise argparse.ArgumentTypeError(f"need an exit code 1..255, got {text!r}")
    return code


def _backoff(text: str) -> Backoff:
    """``INITIAL[:CAP[:FACTOR]]``, e.g. ``1:30:2``."""
    parts = text.split(":")
    if not 1 <= len(parts) <= 3:
        raise argparse.ArgumentTypeError(f"need INITIAL[:CAP[:FACTOR]], got {text!r}")
    initial = seconds(parts[0])
    cap = seconds(parts[1]) if len(parts) > 1 else max(30.0, initial)
    try:
        factor = float(parts[2]) if len(parts) > 2 else 2.0
        return Backoff(initial=initial, cap=cap, factor=factor)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, got {text!r}") from None


def configure_run(parser: argparse.ArgumentParser) -> None:
    """Add ``aiotimer run``'s arguments to ``parser`` (usage errors: one line, exit 2)."""
    one_line_errors(parser)
    parser.epilog = (
        "exit status: 0 every worker succeeded; 1 a worker failed for good (no-restart "
        "exit code); 2 usage error; 3 gave up (restart budget exhausted, ...); 4 stopped "
        "before the end; 5 cannot start; 128+N interrupted by signal N"
    )
    parser.add_argument("--nproc", type=positive, default=1, help="worker processes (default 1)")
    parser.add_argument(
        "--restart-scope",
        choices=[*(s.value for s in RestartScope), "job"],
        default="worker",
        help="on a failure restart the worker alone (one_for_one), every worker of this "
        "node (one_for_all: torchrun's behaviour, for ranks coupled by collectives), or "
        "every worker of every node of the job (needs --etcd; the budget is then "
        "job-wide) (default: worker)",
    )
    parser.add_argument(
        "--max-restarts",
        type=_count,
        default=3,
        metavar="K",
        help="give up when a failure would need more than K restarts within "
        "--restart-window (default 3; 0: never restart)",
    )
    parser.add_argument(
        "--restart-window",
        type=_window,
        default=600.0,
        metavar="SECONDS",
        help="the restart budget's sliding window, > 0; 'inf': no window, the budget "
        "counts every restart and never refills (default 600)",
    )
    parser.add_argument(
        "--backoff",
        type=_backoff,
        default=Backoff(),
        metavar="INITIAL[:CAP[:FACTOR]]",
        help="delay before a restart: INITIAL * FACTOR**n for the n-th restart in the "
        "window, at most CAP, +-10%% jitter (default 1:30:2)",
    )
    parser.add_argument(
        "--min-uptime",
        type=seconds,
        default=1.0,
        metavar="SECONDS",
        help="a worker that dies sooner, without having sent a timer request, is "
        "reported as a start failure (default 1)",
    )
    parser.add_argument(
        "--no-restart-exit-code",
        type=_exit_code,
        action="append",
        metavar="CODE",
        help="an exit code that means 'do not restart' (repeatable; default 93)",
    )
    parser.add_argument(
        "--stop-timeout",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="seconds between SIGTERM and SIGKILL when stopping workers (default 10)",
    )
    parser.add_argument("--run-id", help="exported as AIOTIMER_RUN_ID (default: random)")
    parser.add_argument(
        "--event-log",
        type=event_log_path,
        help="append every event (the server's and the supervisor's) as a JSON line to this file",
    )
    add_log_level_argument(parser)
    parser.add_argument(
        "--control",
        type=control_path,
        metavar="PATH",
        help="serve the control socket here (default: beside the private FIFO); "
        "`aiotimer status --control PATH` shows the workers, and restarts or stops one",
    )
    add_metrics_port_argument(parser)
    parser.add_argument(
        "--hang-report-timeout",
        type=positive_seconds,
        default=DEFAULT_HANG_REPORT_TIMEOUT,
        metavar="SECONDS",
        help="under --restart-scope group/job, when a timer expires, take every rank's "
        "stacks before anything is killed and report which rank differs; the reap and "
        f"the restart wait at most this long for it (default {DEFAULT_HANG_REPORT_TIMEOUT:g})",
    )
    parser.add_argument(
        "--no-hang-report", action="store_true", help="take no hang report (see above)"
    )
    parser.add_argument(
        "--on-straggler",
        choices=ON_STRAGGLER,
        default="report",
        help="a rank slower than its peers (docs/stragglers.md) is reported (a "
        "`straggler` event, the status table, /metrics), or also restarted, charged to "
        "the restart budget (default: report)",
    )
    add_reap_arguments(parser)
    add_kill_policy_arguments(parser, descendants_only=True)
    add_node_arguments(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")


def _policy(args: argparse.Namespace) -> RestartPolicy:
    codes = args.no_restart_exit_code
    return RestartPolicy(
        # Job scope: this node's workers restart together, when the job says so.
        scope=RestartScope("group" if args.restart_scope == "job" else args.restart_scope),
        max_restarts=args.max_restarts,
        window=args.restart_window,
        backoff=args.backoff,
        min_uptime=args.min_uptime,
        no_restart_exit_codes=DEFAULT_NO_RESTART_EXIT_CODES if codes is None else frozenset(codes),
    )


async def _run(args: argparse.Namespace, command: list[str]) -> int:
    policy = _policy(args)
    job_policy = policy if args.restart_scope == "job" else None
    async with cluster_session(node_config(args), job_policy) as cluster:
        return await _supervise(args, command, policy, cluster)


async def _supervise(
    args: argparse.Namespace, command: list[str], policy: RestartPolicy, cluster: ClusterSession
) -> int:
    supervisor = Supervisor(
        command,
        nproc=args.nproc,
        policy=policy,
        stop_timeout=args.stop_timeout,
        run_id=args.run_id or (args.job if cluster.config is not None else None),
        reap_policy=policy_from_args(args),
        reaper=SignalReaper(
            dump_dir=args.dump_dir,
            kill_policy=kill_policy_from_args(args),
            keep_dumps=args.keep_dumps,
        ),
        event_log=args.event_log,
        subreaper=True,
        run_file=True,
        hang_report=None if args.no_hang_report else args.hang_report_timeout,
        dump_dir=args.dump_dir,
        keep_dumps=args.keep_dumps,
        coordinator=cluster.coordinator,
        restart_count=cluster.restart_count,
        on_event=cluster.on_event,
        on_straggler=args.on_straggler,
    )
    loop = asyncio.get_running_loop()
    # SIGINT/SIGTERM stop the run, which then exits 128+N (a second one: SIGKILL at once).
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, supervisor.interrupt, signum)
    plane = ControlPlane(supervisor, path=args.control or True, metrics_port=args.metrics_port)
    try:
        async with (
            cluster.publishing(supervisor),
            supervisor,
            plane,
            cluster.coordinating(supervisor),
        ):
            log_control_plane(plane)
            await supervisor.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    out = bounded(sys.stderr, SUMMARY_TIMEOUT)
    out.write(format_summary(supervisor.summary))
    if getattr(out, "dropped", 0):
        logger.warning("the summary table was cut short: stderr is not read")
    server = supervisor.server
    print_stats(args, () if server is None else server.scope_stats())
    code = supervisor.exit_code
    assert code is not None
    return code


def run_run(args: argparse.Namespace) -> int:
    """``aiotimer run``: supervise the command; the exit status says how the run ended."""
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print(
            "aiotimer run: error: no command given: aiotimer run [options] -- CMD [ARGS...]",
            file=sys.stderr,
        )
        return 2
    try:  # a combination argparse cannot check: said before anything starts
        if node_config(args) is None and args.restart_scope == "job":
            raise ClusterError("--restart-scope job needs --etcd HOST:PORT and --job ID")
    except ClusterError as exc:
        print(f"aiotimer run: error: {exc} (see aiotimer run --help)", file=sys.stderr)
        return 2
    try:  # before any thread: the guard is forked
        unguarded = start_guard(runs_dir(runtime_parent()))
    except OSError as exc:
        print(f"aiotimer run: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_CANNOT_START
    # A stderr nobody reads must not hold the log writer, nor logging's shutdown at exit.
    with queued_logging(args.log_level, bounded(sys.stderr, LOG_WRITE_TIMEOUT)):
        if unguarded is not None:
            logger.warning(
                "no guard for this run (%s): if it is killed, the next aiotimer run stops "
                "what its workers left",
                unguarded,
            )
        try:
            with asyncio.Runner(loop_factory=loop_factory("auto")) as runner:
                return runner.run(_run(args, command))
        except (AiotimerError, OSError) as exc:  # the command or the server cannot start
            print(f"aiotimer run: error: {exc}", file=sys.stderr, flush=True)
            return EXIT_CANNOT_START
