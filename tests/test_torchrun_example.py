"""The torchrun example end to end: a hung rank is reaped and the restarted job finishes.

Runs ``examples/torchrun/launch.py`` (2 ranks, CPU, gloo on loopback, one restart
allowed). It takes about 15 s here (two rounds of torch start-up); the bound is 120 s
for a busy machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed.run")

pytestmark = [pytest.mark.torch, pytest.mark.process, pytest.mark.timeout(150)]

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / "examples" / "torchrun" / "launch.py"


def test_hung_rank_is_reaped_and_the_job_finishes_after_a_restart() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, str(LAUNCHER), "--job-timeout", "110"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout
    assert result.returncode == 0, output + result.stderr[-4000:]
    assert "OK: rank 1 (pid " in output
    [hung] = [line for line in output.splitlines() if "hanging in step 1" in line]
    pid = hung.split("(pid ")[1].split(")")[0]
    assert f"sent SIGKILL to worker {pid}" in output
    assert output.count("attempt 1 done") == 2
