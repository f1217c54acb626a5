"""Stack dumps of reaped ranks and workers, through ``aiotimer run`` and ``aiotimer serve``.

* Under ``--restart-scope group`` (no ``--dump``), the hang report holds the stacks of
  the rank whose timer expired first, taken before its kill.
* The workers' dump files lie in one directory per server, removed with it unless
  ``--keep-dumps``, and never more than a bounded number of them.

Ranks and workers are small Python scripts on short timers; each run takes a few
seconds here, bounded at 60 s for a busy machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.process, pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parent.parent

GROUP_RANK = """
import os, time
from pathlib import Path
from aiotimer import expires

rank = int(os.environ["RANK"])
if int(os.environ["TORCHELASTIC_RESTART_COUNT"]) > 0:
    raise SystemExit(0)


def load_batch():
    time.sleep(3600)


def wait_for_peers():
    time.sleep(3600)


with expires(after=1.0 if rank == 1 else 30, scope="step"):
    if rank == 1:
        load_batch()
    wait_for_peers()
"""


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("AIOTIMER_DUMP_HOOK", None)  # the workers install the dump hook
    env.pop("AIOTIMER_DUMP_DIR", None)
    env.update(extra)
    return env


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_group_report_holds_the_reaped_ranks_stacks(tmp_path: Path) -> None:
    script, log = tmp_path / "train.py", tmp_path / "events.jsonl"
    script.write_text(GROUP_RANK)
    result = subprocess.run(
        [sys.executable, "-m", "aiotimer", "run", "--nproc", "2", "--restart-scope", "group",
         "--max-restarts", "1", "--backoff", "0.1", "--stop-timeout", "1",
         "--hang-report-timeout", "5", "--event-log", str(log), "--", sys.executable,
         str(script)],
        env=_env(), capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    reports = [e for e in _events(log) if e["event"] == "hang_report"]
    assert len(reports) == 1, result.stderr[-4000:]
    report = reports[0]
    assert report["missing"] == [], report["summary"]
    assert report["odd"] == [1] or report["summary"].startswith("no single odd one out"), report
    assert "rank 1 in `load_batch` (train.py:" in report["summary"], report["summary"]
    assert "rank 0 in `wait_for_peers` (train.py:" in report["summary"], report["summary"]
    dumps = report["report"].split("  -- rank ")[1:]
    assert sorted(d[0] for d in dumps) == ["0", "1"], report["report"]
