"""A planned restart keeps watching: SIGTERM to ``aiotimer serve`` with live timers keeps
its journal, so the next server on the FIFO reaps a worker that hung meanwhile.

Real processes: the server is ``python -m aiotimer serve``; the hung worker is a
``sleep`` whose one timer was sent as a torch line; the healthy workers are Python
processes timing short blocks through aiotimer's client (their client re-sends its open
blocks to the new server, so the journal must not speak for them).

Tolerances: the hung worker is reaped within 1.5 s of its original deadline, or of the
next server's start if a loaded host started it after that deadline (the claim: the
restored timer acts at once then); everything else waits up to 15 s.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _procs import BOUND, Sentinel, env, events, serving, status_until

pytestmark = [pytest.mark.process, pytest.mark.timeout(90)]

HEALTHY = r"""
import sys, time
from aiotimer import FifoClient, configure, expires
configure(FifoClient(sys.argv[1], connect_timeout=30.0), dump_hook=False)
print("ready", flush=True)
while True:
    with expires(after=5.0, scope="step"):
        time.sleep(0.02)
"""


def wait_for_workers(fifo: Path, pids: set[int]) -> None:
    status_until(
        fifo,
        lambda doc: pids <= {w["pid"] for w in doc["workers"]},
        f"workers {pids} never all registered",
    )


def test_sigterm_keeps_the_journal_and_the_next_server_reaps_the_hung_worker(
    tmp_path: Path,
) -> None:
    fifo, log = tmp_path / "t.fifo", tmp_path / "events.jsonl"
    journal = Path(f"{fifo}.journal")
    healthy: list[subprocess.Popen[bytes]] = []
    with Sentinel() as hung:
        try:
            with serving(fifo, stderr=subprocess.PIPE) as first:
                healthy = [
                    subprocess.Popen(
                        [sys.executable, "-c", HEALTHY, str(fifo)],
                        env=env(),
                        stdout=subprocess.PIPE,
                    )
                    for _ in range(2)
                ]
                for worker in healthy:
                    assert worker.stdout is not None and worker.stdout.readline() == b"ready\n"
                hung.arm(fifo, after=5.0)  # it never sends anything again
                pids = {hung.pid, *(w.pid for w in healthy)}
                wait_for_workers(fifo, pids)  # SIGTERM once the server holds all three
                first.send_signal(signal.SIGTERM)
                _, stderr = first.communicate(timeout=BOUND)
                assert first.returncode == 0
            kept = json.loads(journal.read_bytes()) if journal.exists() else {"entries": []}
            with serving(fifo, "--event-log", str(log)) as second:
                # Due from its deadline, or from this start if that came later.
                assert hung.deadline is not None and hung.wall_deadline is not None
                late_start = max(0.0, time.monotonic() - hung.deadline)
                assert hung.lateness(timeout=5.0) - late_start < 1.5
                for worker in healthy:
                    assert worker.poll() is None, "a healthy worker was signalled"
                second.send_signal(signal.SIGTERM)
                assert second.wait(BOUND) == 0
            said = stderr.decode()
            assert f"the journal {journal} keeps the earliest of 3 worker(s)" in said, said
            assert {e["pid"] for e in kept["entries"]} == {hung.pid, *(w.pid for w in healthy)}
            records = events(log)
            assert hung.reap_latency(records) - late_start < 1.5
            reaped = {r["pid"] for r in records if r["event"] == "worker_reaped"}
            assert reaped == {hung.pid}
            assert all(worker.poll() is None for worker in healthy)
        finally:
            for worker in healthy:
                worker.kill()
                worker.communicate(timeout=BOUND)
