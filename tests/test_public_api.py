"""Pin the public surface: a change to what aiotimer exports must be deliberate."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from importlib.metadata import version

import pytest

import aiotimer

PUBLIC_MODULES = [
    "aiotimer",
    "aiotimer.client",
    "aiotimer.server",
    "aiotimer.events",
    "aiotimer.errors",
    "aiotimer.reapers",
    "aiotimer.sources",
    "aiotimer.watchdog",
    "aiotimer.diagnostics",
    "aiotimer.testing",
    "aiotimer.cluster",
    "aiotimer.supervisor",
    "aiotimer.compat.torch",
    "aiotimer.compat.torch.api",
    "aiotimer.compat.torch.debug_info_logging",
    "aiotimer.compat.torch.file_based_local_timer",
    "aiotimer.compat.torch.local_timer",
    "aiotimer.control",
    "aiotimer.control.client",
    "aiotimer.control.metrics",
    "aiotimer.control.server",
    "aiotimer.control.snapshot",
]

EXPECTED_TOP_LEVEL = {
    "LaunchInfo",
    "Launcher",
    "launch_info",
    "loop_watchdog",
    "Backoff",
    "ExitKind",
    "ExitReason",
    "RestartPolicy",
    "RestartScope",
    "WorkerState",
    "LaunchError",
    "RunOutcome",
    "Supervisor",
    "SupervisorState",
    "PIPE_BUF",
    "AiotimerError",
    "ClusterError",
    "LeaseLostError",
    "MissingExtraError",
    "NodeNameTakenError",
    "StoreUnavailableError",
    "ClientBackpressureError",
    "Clock",
    "ServerCounters",
    "Decoded",
    "DurationStats",
    "Escalation",
    "Event",
    "Expires",
    "FifoClient",
    "FifoSource",
    "InProcessClient",
    "KillPolicy",
    "LifecycleState",
    "LineDecoder",
    "LoopWatchdog",
    "MonotonicClock",
    "NotConfiguredError",
    "ProcessGoneError",
    "QueueClient",
    "QueueSource",
    "ReapError",
    "ReapPolicy",
    "ReapRetry",
    "Reaper",
    "RefusedTargetError",
    "Rejection",
    "Request",
    "RequestSink",
    "RequestTooLargeError",
    "ServerState",
    "ServerStateError",
    "ServerUnavailableError",
    "SignalReaper",
    "ScopeStats",
    "SocketSource",
    "Source",
    "SourceError",
    "Timer",
    "TimerClient",
    "TimerKey",
    "TimerServer",
    "TimerServerThread",
    "TimerTable",
    "Watchdog",
    "__version__",
    "configure",
    "current_client",
    "encode",
    "events",
    "expires",
    "expires_at",
    "timer_server_configured",
    "use_client",
    "watchdog",
}


def test_top_level_surface_is_pinned() -> None:
    assert set(aiotimer.__all__) == EXPECTED_TOP_LEVEL
    assert len(aiotimer.__all__) == len(set(aiotimer.__all__)), "duplicate names in __all__"


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
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


#: What a worker that only times blocks must not load.
HEAVY = ["anyio", "aiofiles", "ssl", "subprocess", "asyncio"] + [
    f"aiotimer.{m}"
    for m in ("server", "sources", "events", "_eventlog", "_server_engine", "_decoder")
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
