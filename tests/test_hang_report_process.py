"""Hang reports on real processes: a 4-rank gloo job under ``aiotimer run``.

One job, three generations (torch starts twice; the middle one imports no torch):

1. rank 2 hangs in ``load_batch`` while ranks 0, 1 and 3 wait for it in ``all_reduce``:
   the report names rank 2 and its function first and holds all four ranks' stacks
   (the first rank reaped gives its own through ``--dump``); the group restarts;
2. rank 1 stops itself (SIGSTOP) while the others wait: its dump never comes, it is
   reported as giving no answer, and the restart follows within the bound;
3. every rank finishes its ``all_reduce``; rank 0 first asks ``aiotimer status`` for the
   last report, over the control socket its supervisor serves.

About 15 s here; the bound is 170 s for a busy machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch.distributed")

pytestmark = [pytest.mark.torch, pytest.mark.process, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parent.parent
#: The report's bound (``--hang-report-timeout``).
BOUND = 2.0

WORKER = """
import os, signal, subprocess, sys, time
from aiotimer import expires

rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def load_batch():
    time.sleep(3600)


def wait_for_peers():
    time.sleep(3600)


if attempt == 1:
    with expires(after=1, scope="wait"):
        if rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        wait_for_peers()

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
with expires(after=2, scope="step"):
    if rank == 2 and attempt == 0:
        load_batch()
    dist.all_reduce(t)
if rank == 0:
    status = [sys.executable, "-m", "aiotimer", "status", "--fifo", os.environ["AIOTIMER_FIFO"]]
    for extra in ([], ["--hang-report"]):
        got = subprocess.run(status + extra, capture_output=True, text=True, timeout=30)
        said = f"<<status {extra} rc={got.returncode}\\n{got.stdout}{got.stderr}>>\\n"
        os.write(1, said.encode())
os.write(1, f"rank {rank} attempt {attempt} done: {t.item():g}\\n".encode())
dist.destroy_process_group()
"""


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_gloo_hang_names_the_odd_rank_and_the_group_restarts(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(WORKER)
    log = tmp_path / "events.jsonl"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("MASTER_PORT", None)
    env.pop("AIOTIMER_DUMP_HOOK", None)  # the workers' dump hooks answer (py-spy otherwise)
    result = subprocess.run(
        [sys.executable, "-m", "aiotimer", "run", "--nproc", "4", "--restart-scope", "group",
         "--max-restarts", "3", "--backoff", "0.1", "--stop-timeout", "1", "--dump",
         "--dump-timeout", "0.5", "--hang-report-timeout", str(BOUND), "--event-log", str(log),
         "--", sys.executable, str(script)],
        env=env, capture_output=True, text=True, timeout=170, check=False, cwd=tmp_path,
    )  # fmt: skip
    out, err = result.stdout, result.stderr
    assert result.returncode == 0, out + err[-4000:]
    done = sorted(line for line in out.splitlines() if " done: " in line)
    assert done == [f"rank {r} attempt 2 done: 4" for r in range(4)], out + err[-4000:]
    events = _events(log)
    reports = [e for e in events if e["event"] == "hang_report"]
    assert len(reports) == 2, [e["summary"] for e in reports]

    # 1. rank 2 is named first, with its function; every rank's stacks are there.
    first = reports[0]
    assert first["odd"] == [2] and first["missing"] == [], first["summary"]
    assert first["summary"].startswith("rank 2 of 4 differs: in `load_batch` (train.py:"), first
    assert "3 ranks in `all_reduce` (train.py:" in first["summary"]
    assert first["files"] == [f"{log}.hang.txt", f"{log}.hang.json"]
    assert first["report"].index("rank 2 (pid") < first["report"].index("rank 0 (pid")
    dumps = first["report"].split("  -- rank ")[1:]
    assert sorted(d[0] for d in dumps) == ["0", "1", "2", "3"]
    assert all("most recent call first" in d for d in dumps), first["report"]

    # 2. the stopped rank gave no answer; the restart came within the bound.
    second = reports[1]
    assert second["odd"] == [1] and second["missing"] == [1], second["summary"]
    assert second["summary"].startswith("rank 1 of 4 differs: no answer"), second["summary"]
    assert second["seconds"] <= BOUND + 0.5, second
    restarts = [e for e in events if e["event"] == "restart_scheduled"]
    assert len(restarts) == 2
    assert 0 <= restarts[1]["time"] - second["time"] <= 1.0, (restarts[1], second)

    # The file beside the event log is the last report, whole: all four ranks' stacks.
    saved = json.loads(Path(f"{log}.hang.json").read_text())
    assert saved["summary"] == second["summary"]
    ranks = {r["rank"]: r for g in saved["groups"] for r in g["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(ranks[r]["main"][-1]["function"] == "<module>" for r in (0, 2, 3))

    # 3. status showed the last report's summary line, and the whole report on request.
    assert f"last hang report: {second['summary']}" in out, out
    assert "<<status ['--hang-report'] rc=0\nhang report: rank 1 of 4 differs" in out, out
