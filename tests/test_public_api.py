"""Pin the public surface: a change to what aiotimer exports must be deliberate.

The top level (what a user writes) and every public module's ``__all__``. No release has
shipped another name, so there are no aliases: an unknown name is an ``AttributeError``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from importlib.metadata import version

import pytest

import aiotimer

EXPECTED_TOP_LEVEL = {
    # the worker side
    "expires",
    "expires_at",
    "Expires",
    "configure",
    "use_client",
    "current_client",
    "timer_server_configured",
    "watchdog",
    "loop_watchdog",
    "Watchdog",
    "LoopWatchdog",
    "TimerClient",
    "FifoClient",
    "QueueClient",
    "InProcessClient",
    "launch_info",
    "LaunchInfo",
    "learned",
    # the server
    "TimerServer",
    "TimerServerThread",
    "Reaper",
    "SignalReaper",
    "ReapPolicy",
    "Escalation",
    "KillPolicy",
    "ReapRetry",
    "Request",
    "Clock",
    "MonotonicClock",
    "events",
    "Event",
    # the supervisor
    "Supervisor",
    "RestartPolicy",
    "RestartScope",
    "Backoff",
    "RunOutcome",
    # the errors a user catches
    "AiotimerError",
    "ServerUnavailableError",
    "ClientBackpressureError",
    "NotConfiguredError",
    "ServerStateError",
    "SourceError",
    "ReapError",
    "__version__",
}

#: Every public module (no ``_`` in its path) and its ``__all__``.
PUBLIC_ALL: dict[str, set[str]] = {
    "aiotimer.cli": {
        "COMMANDS",
        "Command",
        "main",
    },
    "aiotimer.client": {
        "DEFAULT_CONNECT_TIMEOUT",
        "DEFAULT_KILL_AFTER",
        "DEFAULT_SIGNAL",
        "DEFAULT_WRITE_TIMEOUT",
        "ENV_RESTART_COUNT",
        "ENV_RUN_ID",
        "MAX_DEADLINE_AHEAD",
        "TORCH_ENV_MAX_RESTARTS",
        "TORCH_ENV_RESTART_COUNT",
        "TORCH_ENV_RUN_ID",
        "Expires",
        "FifoClient",
        "InProcessClient",
        "LaunchInfo",
        "Launcher",
        "Learned",
        "LoopWatchdog",
        "PutQueue",
        "QueueClient",
        "QueueRequest",
        "RequestSubmitter",
        "TimerClient",
        "Watchdog",
        "configure",
        "current_client",
        "ensure_dump_handler",
        "expires",
        "expires_at",
        "format_tasks",
        "install_dump_handler",
        "launch_info",
        "learned",
        "loop_watchdog",
        "private_dump_dir",
        "release_failed",
        "scope_site",
        "timer_server_configured",
        "uninstall_dump_handler",
        "use_client",
        "watchdog",
    },
    "aiotimer.cluster": {
        "ClusterSession",
        "Entry",
        "GenerationRecord",
        "JobRestarts",
        "JobView",
        "MemberRecord",
        "MemoryStore",
        "NodePublisher",
        "NodeRecord",
        "NodeRow",
        "NodeStatus",
        "ReapRecord",
        "Store",
        "add_job_status_arguments",
        "add_node_arguments",
        "build_view",
        "cluster_session",
        "connect",
        "format_view",
        "node_config",
        "publishing",
        "read_view",
        "run_job_status",
        "server_status",
    },
    "aiotimer.compat": set(),
    "aiotimer.compat.torch": {
        "FileTimerClient",
        "FileTimerRequest",
        "FileTimerServer",
        "LocalTimerClient",
        "LocalTimerServer",
        "MultiprocessingRequestQueue",
        "RequestQueue",
        "TimerClient",
        "TimerNotConfiguredError",
        "TimerRequest",
        "TimerRequestTooLargeError",
        "TimerServer",
        "TimerServerUnavailableError",
        "configure",
        "expires",
        "log_debug_info_for_expired_timers",
    },
    "aiotimer.compat.torch.api": {
        "RequestQueue",
        "TimerClient",
        "TimerRequest",
        "TimerServer",
        "configure",
        "expires",
    },
    "aiotimer.compat.torch.debug_info_logging": {
        "log_debug_info_for_expired_timers",
    },
    "aiotimer.compat.torch.file_based_local_timer": {
        "FileTimerClient",
        "FileTimerRequest",
        "FileTimerServer",
        "TimerClient",
        "TimerRequest",
        "log_debug_info_for_expired_timers",
    },
    "aiotimer.compat.torch.local_timer": {
        "LocalTimerClient",
        "LocalTimerServer",
        "MultiprocessingRequestQueue",
        "RequestQueue",
        "TimerClient",
        "TimerRequest",
        "TimerServer",
    },
    "aiotimer.control": {
        "API_VERSION",
        "MAX_SOCKET_PATH",
        "ControlClient",
        "ControlPlane",
        "ControlServer",
        "EventPage",
        "HistoryReader",
        "Route",
        "ServerInfo",
        "StatusSnapshot",
        "SupervisorInfo",
        "TimerInfo",
        "WorkerInfo",
        "control_path_for_fifo",
        "default_control_path",
        "fits_socket",
        "format_history",
        "format_status",
        "history_dict",
    },
    "aiotimer.control.client": {
        "ControlClient",
        "control_path_for_fifo",
    },
    "aiotimer.control.metrics": {
        "CONTENT_TYPE",
        "MAX_AGE",
        "MetricsSample",
        "RenderedMetrics",
        "ServerCollector",
        "render",
        "sample_of",
    },
    "aiotimer.control.server": {
        "MAX_CONNECTIONS",
        "REQUEST_TIMEOUT",
        "ControlServer",
        "Route",
        "serve_tcp",
    },
    "aiotimer.control.snapshot": {
        "API_VERSION",
        "DEFAULT_LIMIT",
        "MAX_LIMIT",
        "SCOPES_PER_WORKER",
        "WORKER_STATES",
        "EventPage",
        "IncidentInfo",
        "ServerInfo",
        "StatusSnapshot",
        "SupervisorInfo",
        "TimerInfo",
        "WorkerInfo",
        "counters_by_name",
        "event_page",
        "incident_info",
        "status_snapshot",
    },
    "aiotimer.hang": {
        "DEFAULT_HANG_REPORT_TIMEOUT",
        "MAX_RANK_TEXT",
        "MAX_REPORT_TEXT",
        "DumpFirstPolicy",
        "Frame",
        "HangReport",
        "HangReporter",
        "ParsedStacks",
        "RankGroup",
        "RankProcess",
        "RankStacks",
        "build_report",
        "open_scopes",
        "parse_stacks",
    },
    "aiotimer.core": {
        "MIN_EXCESS",
        "THRESHOLD",
        "BlockTimes",
        "DurationStats",
        "Fold",
        "LatencyHistogram",
        "LearnedScopeState",
        "LearnedSummary",
        "LearnedTimeouts",
        "Overdue",
        "ScopeStats",
        "StatsState",
        "StragglerChange",
        "StragglerDetector",
        "Timer",
        "TimerKey",
        "TimerTable",
        "Timing",
        "compare_ranks",
        "current_pid",
        "default_scope",
        "fold",
        "format_seconds",
        "format_summaries",
        "paired_blocks",
        "scope_at_site",
        "scope_site",
        "with_task",
    },
    "aiotimer.diagnostics": {
        "DEFAULT_DUMP_SIGNAL",
        "END_MARKER",
        "ENV_DUMP_DIR",
        "HookInfo",
        "collect_dump",
        "dump_dir_for",
        "dump_path_for",
        "ensure_dump_handler",
        "format_tasks",
        "hook_info",
        "install_dump_handler",
        "private_dump_dir",
        "py_spy_dump",
        "py_spy_executable",
        "read_dump",
        "uninstall_dump_handler",
    },
    "aiotimer.errors": {
        "AiotimerError",
        "ClientBackpressureError",
        "ClusterError",
        "ControlError",
        "EventLogError",
        "LaunchError",
        "LeaseLostError",
        "MissingExtraError",
        "NodeNameTakenError",
        "NotConfiguredError",
        "ProcessGoneError",
        "ReapError",
        "RefusedTargetError",
        "ServerStateError",
        "ServerUnavailableError",
        "SourceError",
        "StoreUnavailableError",
        "UnsafePathError",
    },
    "aiotimer.events": {
        "MAX_LINE_SCOPE",
        "MAX_LOGGED_TEXT",
        "MAX_REPORTED_SCOPES",
        "BlockCancelled",
        "ControlRefused",
        "Event",
        "EventsLost",
        "HangReported",
        "LearnedWouldReap",
        "LoopLagged",
        "RankStatus",
        "ReapAbandoned",
        "ReapFailed",
        "RequestRejected",
        "RestartScheduled",
        "ServerCounters",
        "ServerStarted",
        "ServerStopped",
        "SignalRefused",
        "SignalSent",
        "SourceFailed",
        "StacksDumped",
        "StragglerDetected",
        "StragglerRecovered",
        "SupervisorGaveUp",
        "SupervisorStopped",
        "TimerAcquired",
        "TimerEvicted",
        "TimerExpired",
        "TimerReleased",
        "WorkerEnded",
        "WorkerExited",
        "WorkerInfo",
        "WorkerReaped",
        "WorkerRunning",
        "WorkerStarted",
        "WorkerState",
        "WorkerSurvived",
        "WorkerUnknown",
        "by_rank",
        "clip",
        "clip_scope",
        "clip_text",
        "exit_phrase",
        "holding_task",
        "signal_name",
    },
    "aiotimer.reapers": {
        "DUMP_SLACK",
        "MAX_KEPT_DUMPS",
        "DumpStacks",
        "Escalation",
        "HookInfo",
        "KillPolicy",
        "NoDump",
        "PinnedProcess",
        "Reap",
        "ReapPolicy",
        "ReapRetry",
        "Reaper",
        "Reaps",
        "SignalReaper",
        "Step",
        "WatchState",
        "Watchlist",
        "collect_dump",
        "fifo_mode_warning",
        "format_plan",
        "hook_info",
        "prepare_dump",
        "py_spy_dump",
        "py_spy_dump_or_why",
        "py_spy_executable",
        "read_dump",
        "read_dump_or_why",
    },
    "aiotimer.server": {
        "API_VERSION",
        "DEFAULT_LIMIT",
        "INCIDENT_KINDS",
        "MAX_TIMERS",
        "MAX_TIMERS_PER_WORKER",
        "RECENT_INCIDENTS",
        "SCOPES_PER_WORKER",
        "WORKER_STATES",
        "EventHistory",
        "IncidentInfo",
        "LifecycleState",
        "LoopName",
        "ReapRetry",
        "ServerCounters",
        "ServerInfo",
        "ServerSnapshot",
        "ServerState",
        "StatusSnapshot",
        "SupervisorInfo",
        "TimerInfo",
        "TimerServer",
        "TimerServerThread",
        "counters_by_name",
        "incident_info",
        "loop_factory",
    },
    "aiotimer.sources": {
        "Drain",
        "FifoSource",
        "QueueSource",
        "RequestSink",
        "SocketSource",
        "Source",
        "check_fifo_mode",
        "serve_source",
    },
    "aiotimer.sources.fifo": {
        "BACKLOG_LIMIT",
        "CHUNK_SIZE",
        "MAX_READS_PER_WAKE",
        "PIPE_SIZE",
        "READ_INTERVAL",
        "FifoSource",
        "grow_pipe",
    },
    "aiotimer.sources.mpqueue": {
        "MAX_ITEM_BYTES",
        "QueueSource",
    },
    "aiotimer.sources.socket": {
        "SocketSource",
        "peer_credentials",
    },
    "aiotimer.supervisor": {
        "DEFAULT_NO_RESTART_EXIT_CODES",
        "ON_STRAGGLER",
        "WORKER_ENV",
        "Backoff",
        "Decision",
        "ExitKind",
        "ExitReason",
        "GiveUp",
        "LocalCoordinator",
        "RankStatus",
        "Restart",
        "RestartCoordinator",
        "RestartPolicy",
        "RestartScope",
        "RunOutcome",
        "Supervisor",
        "SupervisorActions",
        "SupervisorState",
        "WorkerFailure",
        "WorkerState",
        "attempt_story",
        "ending_word",
        "format_summary",
        "runs_dir",
        "runtime_parent",
        "start_guard",
    },
    "aiotimer.testing": {
        "FakeClock",
        "MemorySource",
        "MemoryStore",
        "ReaperCall",
        "RecordingClient",
        "RecordingReaper",
        "RecordingSink",
        "running_source",
        "settle",
        "wait_until",
    },
    "aiotimer.watchdog": {
        "LoopWatchdog",
        "Watchdog",
        "loop_watchdog",
        "watchdog",
    },
    "aiotimer.wire": {
        "DEFAULT_DUMP_SIGNAL",
        "END_MARKER",
        "ENV_DUMP_DIR",
        "ENV_FIFO",
        "FAULT_THREAD_HEADER",
        "HEADER_TAG",
        "JOB_CONTROL_SIGNALS",
        "MARKER_SUFFIX",
        "MAX_DUMP_BYTES",
        "MAX_LINE_BYTES",
        "MAX_SCOPE_ID_LENGTH",
        "MAX_SIGNAL",
        "MAX_START_TIME",
        "PIPE_BUF",
        "PROTOCOL_VERSION",
        "REAP_SIGNALS",
        "SPY_THREAD_HEADER",
        "TORCH_ENV_FIFO",
        "BlockEncoder",
        "Decoded",
        "Learned",
        "LineDecoder",
        "Rejection",
        "Request",
        "RequestTooLargeError",
        "block_encoder",
        "check_block",
        "dump_dir_for",
        "dump_path_for",
        "encode",
        "fits_block_encoder",
        "learned",
        "learned_problem",
        "mentions_end",
        "number_problem",
        "scanned",
        "scope_id_problem",
        "signal_problem",
        "split_junk",
        "take_due",
        "validate",
    },
}


def test_top_level_surface_is_pinned() -> None:
    assert set(aiotimer.__all__) == EXPECTED_TOP_LEVEL
    assert len(aiotimer.__all__) == len(set(aiotimer.__all__)), "duplicate names in __all__"
    assert len(aiotimer.__all__) <= 45


def test_every_public_module_is_pinned() -> None:
    """A new public module (no ``_`` in its dotted path) must declare and pin its __all__."""
    found = {"aiotimer"}
    for info in pkgutil.walk_packages(aiotimer.__path__, "aiotimer."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found.add(info.name)
    assert found == {"aiotimer", *PUBLIC_ALL}


@pytest.mark.parametrize("module_name", sorted(PUBLIC_ALL))
def test_public_module_all_is_pinned(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert set(module.__all__) == PUBLIC_ALL[module_name]
    assert len(module.__all__) == len(set(module.__all__)), "duplicate names in __all__"


@pytest.mark.parametrize("module_name", ["aiotimer", *sorted(PUBLIC_ALL)])
def test_every_exported_name_exists_and_is_documented(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert module.__doc__, f"{module_name} has no module docstring"
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{module_name} must declare __all__"
    for name in exported:
        assert hasattr(module, name), f"{module_name}.__all__ names missing {name!r}"
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"{module_name}.{name} has no docstring"
    assert set(dir(module)) >= set(exported)


@pytest.mark.parametrize(
    ("module_name", "name"), [("aiotimer", "Counters"), ("aiotimer.server", "Lifecycle")]
)
def test_an_unknown_name_is_an_attribute_error(module_name: str, name: str) -> None:
    module = importlib.import_module(module_name)
    with pytest.raises(AttributeError, match=f"module {module_name!r} has no attribute {name!r}"):
        getattr(module, name)


def test_public_classes_document_their_public_methods() -> None:
    undocumented = []
    for name in aiotimer.__all__:
        obj = getattr(aiotimer, name)
        if not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue
        for attr, member in vars(obj).items():
            if attr.startswith("_") or not inspect.isfunction(member):
                continue
            if not inspect.getdoc(member):
                undocumented.append(f"{name}.{attr}")
    assert not undocumented, f"public methods without docstrings: {undocumented}"


def test_version_matches_package_metadata() -> None:
    assert aiotimer.__version__ == version("aiotimer")


def test_lazy_names_agree_with_all_and_resolve() -> None:
    """Every public name is either bound eagerly or listed in the lazy table, and each
    resolves to the object its defining module exports."""
    lazy = aiotimer._LAZY
    eager = {"LoopWatchdog", "Watchdog", "loop_watchdog", "watchdog", "__version__"}
    assert set(lazy) | eager == set(aiotimer.__all__)
    assert not set(lazy) & eager
    for name, module_name in lazy.items():
        module = importlib.import_module(module_name)
        expected = module if name == "events" else getattr(module, name)
        assert getattr(aiotimer, name) is expected, name
    assert set(dir(aiotimer)) >= set(aiotimer.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        aiotimer.nope  # noqa: B018


def _fresh_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout


#: What a worker that only times blocks must not load: the server side, the event log,
#: the decoder, and the server's cores (table, statistics, fold).
HEAVY = ["anyio", "aiofiles", "ssl", "subprocess", "asyncio"] + [
    f"aiotimer.{m}"
    for m in (
        "server",
        "sources",
        "events",
        "reapers",
        "_edges.eventlog",
        "wire._decoder",
        "core._table",
        "core._stats",
        "core._sketch",
        "core._fold",
    )
]


def test_the_worker_import_is_light() -> None:
    out = _fresh_python(
        "import sys\nfrom aiotimer import expires\n"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    assert out.split() == []


def test_the_server_names_still_import_on_use() -> None:
    out = _fresh_python(
        "import sys, aiotimer\nassert 'aiotimer.server' not in sys.modules\n"
        "print(aiotimer.TimerServer.__module__, 'aiotimer.server' in sys.modules)"
    )
    module, loaded = out.split()
    assert module.startswith("aiotimer.server.") and loaded == "True"


def test_watchdog_is_the_function_even_after_its_submodule_is_imported() -> None:
    out = _fresh_python(
        "import aiotimer.watchdog\nfrom aiotimer.watchdog import Watchdog\nimport aiotimer\n"
        "print(callable(aiotimer.watchdog) and aiotimer.watchdog.__name__)"
    )
    assert out.strip() == "watchdog"
