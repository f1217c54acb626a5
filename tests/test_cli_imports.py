"""``aiotimer status`` starts cheaply: parsing and running it imports neither the server
engine, nor the supervisor, nor the control plane's HTTP server and metrics."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Modules only a server, a supervisor or a control plane needs.
HEAVY = (
    "aiotimer.server._engine",
    "aiotimer.server._server",
    "aiotimer.supervisor._supervisor",
    "aiotimer.control._plane",
    "prometheus_client",
)

_PROBE = """
import json, sys
from aiotimer.cli import build_parser
args = build_parser().parse_args(sys.argv[1:])
import aiotimer.cli._status
print(json.dumps(sorted(m for m in json.loads({heavy!r}) if m in sys.modules)))
"""


def _loaded(*argv: str) -> list[str]:
    code = _PROBE.format(heavy=json.dumps(HEAVY))
    out = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    loaded: list[str] = json.loads(out)
    return loaded


@pytest.mark.process
@pytest.mark.parametrize(
    "argv",
    [
        ["status", "--fifo", "/tmp/aiotimer-no-such-fifo"],
        ["status", "--control", "/tmp/aiotimer-no-such.sock", "--json"],
        ["status", "--event-log", "/tmp/aiotimer-no-such.log"],
    ],
    ids=["fifo", "control", "event-log"],
)
def test_status_imports_no_server_supervisor_or_metrics(argv: list[str]) -> None:
    assert _loaded(*argv) == []


@pytest.mark.process
def test_the_probe_sees_a_heavy_module_when_a_command_needs_it() -> None:
    # The same probe on `serve`, which runs a server: the check above can fail.
    loaded = _loaded("serve", "--fifo", "/tmp/aiotimer-no-such-fifo")
    assert "aiotimer.server._server" in loaded
