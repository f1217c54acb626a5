"""Stragglers named in real runs: ``aiotimer run --nproc 4 --event-log FILE``.

Every rank runs 150 steps of ``with expires(after=10, scope="step")`` of ~40 ms of
sleep with lognormal jitter (sigma 0.1); in one run rank 2's steps are 1.6x longer,
in the other the four ranks are equal. Both runs go at once (their workers sleep: the
two cores are not the limit). Each must end within 60 s (about 10 s on an idle box);
the assertions are on the events, not on any timing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiotimer.control.client import ControlClient

pytestmark = [pytest.mark.process, pytest.mark.timeout(90)]

STEPS = """
import os, random, time
from aiotimer import expires

rank = int(os.environ["RANK"])
slow = float(os.environ["TEST_SLOW"]) if rank == int(os.environ.get("TEST_SLOW_RANK", 2)) else 1.0
if os.environ["AIOTIMER_RESTART_COUNT"] != "0":
    slow = 1.0  # a restarted rank is as fast as the others
rng = random.Random(rank)
for _ in range(int(os.environ.get("TEST_STEPS", 150))):
    with expires(after=10, scope="step"):
        time.sleep(0.04 * slow * rng.lognormvariate(0, 0.1))
"""


def start_run(
    tmp_path: Path, name: str, slow: float, *options: str, steps: int = 150
) -> tuple[subprocess.Popen[bytes], Path]:
    script = tmp_path / "steps.py"
    script.write_text(STEPS)
    log = tmp_path / f"{name}.jsonl"
    env = {
        **os.environ,
        "TEST_SLOW": str(slow),
        "TEST_STEPS": str(steps),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    run = [sys.executable, "-m", "aiotimer", "run", "--nproc", "4", "--event-log", str(log)]
    proc = subprocess.Popen(
        [*run, *options, "--", sys.executable, str(script)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, log


def events(log: Path, *kinds: str) -> list[dict[str, object]]:
    out = []
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event["event"] in kinds:
            out.append(event)
    return out


def test_the_slow_rank_is_named_during_the_run_and_equal_ranks_never(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    control = tmp_path / "a" / "control.sock"
    slowed, slowed_log = start_run(tmp_path / "a", "slowed", 1.6, "--control", str(control))
    equal, equal_log = start_run(tmp_path / "b", "equal", 1.0)
    try:
        # While it runs, the status table marks rank 2 and /metrics has every ratio.
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "rank 2 marked in the status within 30 s"
            time.sleep(0.2)
            if not control.exists():
                continue
            status = subprocess.run(
                [sys.executable, "-m", "aiotimer", "status", "--control", str(control)],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            ).stdout
            marked = [line for line in status.splitlines() if "STRAGGLER" in line]
            if marked:
                break
        assert len(marked) == 1 and marked[0].split()[0] == "2", status
        assert "in step" in marked[0]
        metrics = ControlClient(control).metrics()
        ratios = {
            int(m[1]): float(m[2])
            for m in re.finditer(r'aiotimer_rank_slowness_ratio\{rank="(\d)"\} (\S+)', metrics)
        }
        assert set(ratios) == {0, 1, 2, 3} and ratios[2] >= 1.3, metrics
        assert max(ratios[r] for r in (0, 1, 3)) < 1.3
        assert slowed.wait(timeout=60) == 0
        assert equal.wait(timeout=60) == 0
    finally:
        for proc in (slowed, equal):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    named = events(slowed_log, "straggler", "supervisor_stopped")
    stragglers = [e for e in named if e["event"] == "straggler"]
    assert stragglers, "no straggler named"
    assert {e["rank"] for e in stragglers} == {2}
    first = stragglers[0]
    assert first["scope"] == "step" and first["window"] == 20
    assert 1.3 <= float(first["ratio"]) <= 2.5  # type: ignore[arg-type]
    # During the run: before the supervisor stopped.
    assert named.index(first) < len(named) - 1 and named[-1]["event"] == "supervisor_stopped"
    assert events(equal_log, "straggler") == []


GLOO = """
import os, time
import torch
import torch.distributed as dist
from aiotimer import expires

rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
t = torch.ones(1)
for _ in range(80):
    time.sleep(0.02 + (0.03 if rank == 1 else 0.0))  # its own work, outside the collective
    with expires(after=10, scope="allreduce"):
        dist.all_reduce(t)
dist.destroy_process_group()
"""


@pytest.mark.torch
@pytest.mark.timeout(150)
def test_a_rank_slow_outside_its_collective_is_named(tmp_path: Path) -> None:
    """4 gloo ranks (torch, CPU); rank 1 works 30 ms more per step before each
    all_reduce, which every rank waits out inside its block: rank 1 is named, by its
    time outside the scope. Torch's start-up takes most of the ~15 s here."""
    pytest.importorskip("torch.distributed")
    script = tmp_path / "gloo.py"
    script.write_text(GLOO)
    log = tmp_path / "events.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("MASTER_PORT", None)
    run = [sys.executable, "-m", "aiotimer", "run", "--nproc", "4", "--event-log", str(log)]
    result = subprocess.run(
        [*run, "--", sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=140,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    named = events(log, "straggler")
    assert named, "no straggler named"
    assert {e["rank"] for e in named} == {1}
    assert named[0]["scope"] == "allreduce" and named[0]["basis"] == "own"


def test_restart_rank_restarts_the_straggler_charged_to_the_budget(tmp_path: Path) -> None:
    """``--on-straggler restart-rank``: rank 2, slow in its first process only, is
    restarted once (a restart of the budget, cause ``straggler``); the run succeeds."""
    proc, log = start_run(
        tmp_path,
        "restarted",
        1.6,
        "--on-straggler",
        "restart-rank",
        "--max-restarts",
        "1",
        steps=60,
    )
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    told = events(log, "straggler", "restart_scheduled", "worker_started")
    kinds = [(e["event"], e.get("rank", e.get("ranks"))) for e in told]
    assert kinds.count(("straggler", 2)) == 1
    restarts = [e for e in told if e["event"] == "restart_scheduled"]
    assert len(restarts) == 1 and restarts[0]["ranks"] == [2]
    assert restarts[0]["cause"] == "straggler" and restarts[0]["budget"] == 1
    assert kinds.index(("straggler", 2)) < told.index(restarts[0])
    assert [e["attempt"] for e in told if e["event"] == "worker_started" and e["rank"] == 2] == [
        1,
        2,
    ]
