"""The embedding example end to end: an asyncio agent runs a Supervisor, the hung
worker is reaped by the embedded timer server and restarted, and the run succeeds.

``examples/agent/agent.py`` takes about 4 s here (a 1 s timer, a 0.2 s back-off and
interpreter start-ups); the bound is 60 s for a busy machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.process, pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "examples" / "agent" / "agent.py"


def test_agent_restarts_the_hung_worker_and_succeeds() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, str(AGENT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr[-4000:]
    assert "worker 1 (pid " in out
    assert "reaped (SIGKILL): block 'step-1' outlived its timer" in out
    assert "rank 1: done (restart count 1)" in out
    assert "rank 0: done (restart count 0)" in out
    assert out.rstrip().endswith("outcome: succeeded")
    assert "status: " in out  # the agent's own task kept running meanwhile
    assert "control socket: " in out and "http.sock" in out
