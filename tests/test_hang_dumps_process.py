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
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _waits import wait_until

from aiotimer.reapers._left_dumps import MAX_KEPT_DUMPS

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


FORKS = """
import os, sys, time
from aiotimer import expires

pids = []
for i in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        try:
            with expires(after=0.3, scope=f"hang{i}"):  # its first block installs the hook
                time.sleep(60)
        finally:
            os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
print(" ".join(map(str, pids)), flush=True)
"""


def _dump_files(folder: Path) -> set[int]:
    if not folder.is_dir():
        return set()
    return {int(p.name[len("aiotimer-dump-") : -4]) for p in folder.glob("aiotimer-dump-*.txt")}


@pytest.mark.parametrize("keep", [False, True], ids=["removed", "keep-dumps"])
def test_serve_leaves_no_dump_files_of_reaped_workers_or_a_bounded_few(
    tmp_path: Path, keep: bool
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    fifo, log, forks = tmp_path / "timer.fifo", tmp_path / "events.jsonl", tmp_path / "forks.py"
    forks.write_text(FORKS)
    env = _env(TMPDIR=str(tmp), AIOTIMER_FIFO=str(fifo))
    dumps = tmp / f"aiotimer-dumps-{os.geteuid()}"  # the default dump directory
    count = MAX_KEPT_DUMPS + 6 if keep else 6
    server = subprocess.Popen(
        [sys.executable, "-m", "aiotimer", "serve", "--fifo", str(fifo), "--event-log",
         str(log), "--no-control", *(["--keep-dumps"] if keep else [])],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: Path(f"{fifo}.aiotimer").exists(), timeout=30)
        got = subprocess.run(
            [sys.executable, str(forks), str(count)],
            env=env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        pids = {int(p) for p in got.stdout.split()}
        assert len(pids) == count

        def exited() -> int:
            kinds = [json.loads(line)["event"] for line in log.read_text().splitlines()]
            return kinds.count("worker_exited")

        wait_until(lambda: exited() >= count, timeout=30)
        left = _dump_files(dumps) & pids
        if keep:
            assert len(left) == MAX_KEPT_DUMPS, sorted(left)
        else:
            assert left == set(), sorted(left)
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
    assert server.returncode == 0, err[-3000:]
    assert len(_dump_files(dumps) & pids) == (MAX_KEPT_DUMPS if keep else 0)


RUN_WORKER = """
import os, sys, time
from aiotimer import expires

if int(os.environ["TORCHELASTIC_RESTART_COUNT"]) == 0:
    with expires(after=0.5, scope="hang"):  # its first block installs the hook
        time.sleep(60)
print(f"dumps in {os.environ['AIOTIMER_DUMP_DIR']}", flush=True)
"""


@pytest.mark.parametrize("keep", [False, True], ids=["removed", "keep-dumps"])
def test_run_keeps_dump_files_in_a_directory_of_its_own(tmp_path: Path, keep: bool) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script, log = tmp_path / "worker.py", tmp_path / "events.jsonl"
    script.write_text(RUN_WORKER)
    env = _env(TMPDIR=str(tmp))
    env.pop("XDG_RUNTIME_DIR", None)
    result = subprocess.run(
        [sys.executable, "-m", "aiotimer", "run", "--max-restarts", "1", "--backoff", "0.1",
         "--event-log", str(log), *(["--keep-dumps"] if keep else []), "--", sys.executable,
         str(script)],
        env=env, capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    said = [line for line in result.stdout.splitlines() if line.startswith("dumps in ")]
    assert len(said) == 1, result.stdout
    folder = Path(said[0].removeprefix("dumps in "))
    assert folder.parent == tmp and folder.name.startswith("aiotimer-dumps-"), folder
    reaped = [e["pid"] for e in _events(log) if e["event"] == "worker_reaped"]
    assert len(reaped) == 1
    left = sorted(p.name for p in tmp.rglob("aiotimer-dump-*"))
    if keep:
        assert left == [f"aiotimer-dump-{reaped[0]}.txt"], left
        assert folder.is_dir() and f"dump files are kept in {folder}" in result.stderr
    else:
        assert left == [], left
        assert not folder.exists()
