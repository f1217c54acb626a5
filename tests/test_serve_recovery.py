"""``aiotimer serve`` keeps its promises across a crash and under a mass expiry.

Real processes (see ``_procs``): the server is ``python -m aiotimer serve``, workers
are ``sleep`` processes. Latencies are read from the event log (deadline to signal).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from _procs import BOUND, Sentinel, events, line, send, serving

pytestmark = [pytest.mark.process]


def _drained(fifo: Path) -> None:
    import array  # noqa: PLC0415
    import fcntl  # noqa: PLC0415
    import termios  # noqa: PLC0415

    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        unread, deadline = array.array("i", [1]), time.monotonic() + BOUND
        while unread[0]:
            assert time.monotonic() < deadline, "the server did not read its FIFO"
            fcntl.ioctl(fd, termios.FIONREAD, unread)
            time.sleep(0.01)
    finally:
        os.close(fd)


@pytest.mark.timeout(90)
def test_100k_timers_of_one_worker_expiring_together_delay_no_other_reap(
    tmp_path: Path,
) -> None:
    fifo, log = tmp_path / "t.fifo", tmp_path / "events.jsonl"
    with serving(fifo, "--event-log", str(log)) as server, Sentinel() as crowd:
        with Sentinel() as other:
            due = 4.0  # time to send and ingest 100k lines first
            body = line(crowd.pid, "crowd", due)
            lines = [body.replace(b'"crowd"', b'"crowd-%d"' % i) for i in range(100_000)]
            send(fifo, b"".join(lines))
            other.arm(fifo, after=due - 0.3 + 0.05)  # it falls 50 ms after the crowd
            _drained(fifo)
            crowd.wait_dead()
            other.wait_dead()
        server.send_signal(signal.SIGTERM)
        assert server.wait(BOUND) == 0
    records = events(log)
    assert other.reap_latency(records) < 0.1
    [reaped] = [r for r in records if r["event"] == "worker_reaped" and r["pid"] == crowd.pid]
    assert len(reaped["scopes"]) + reaped["omitted"] == 100_000, "one reap covers them all"
    expired = [r for r in records if r["event"] == "timer_expired" and r["pid"] == crowd.pid]
    assert len(expired) == 1, "one expiry event, not one per timer"


@pytest.mark.timeout(60)
def test_a_restarted_server_reaps_a_hung_worker_at_its_original_deadline(
    tmp_path: Path,
) -> None:
    fifo, log = tmp_path / "t.fifo", tmp_path / "events.jsonl"
    with Sentinel() as hung:
        with serving(fifo) as first:
            hung.arm(fifo, after=3.0)  # it never sends anything again
            journal = Path(f"{fifo}.journal")
            deadline = time.monotonic() + BOUND
            while not (journal.exists() and b"sentinel" in journal.read_bytes()):
                assert time.monotonic() < deadline, "the timer was never journaled"
                time.sleep(0.01)
            first.kill()  # a crash: no clean-up at all
            first.wait(BOUND)
        with serving(fifo, "--event-log", str(log)) as second:
            late = hung.lateness()
            assert late < 1.0
            second.send_signal(signal.SIGTERM)
            assert second.wait(BOUND) == 0
        assert hung.reap_latency(events(log)) < 1.0
    assert not Path(f"{fifo}.journal").exists(), "a clean stop removes the journal"


@pytest.mark.timeout(60)
def test_a_journal_entry_of_a_recycled_pid_is_dropped(tmp_path: Path) -> None:
    fifo = tmp_path / "t.fifo"
    worker = subprocess.Popen(["sleep", "300"])
    try:
        with serving(fifo) as first:
            send(fifo, line(worker.pid, "s", 2.0))
            past_due = time.monotonic() + 2.0 + 0.5  # the timer's deadline passed by then
            journal = Path(f"{fifo}.journal")
            deadline = time.monotonic() + BOUND
            while not (journal.exists() and b'"s"' in journal.read_bytes()):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            first.kill()
            first.wait(BOUND)
        # Forge the start time: as if the pid now named another process.
        journal.write_bytes(journal.read_bytes().replace(b'"start_time":', b'"start_time":1'))
        with serving(fifo):
            time.sleep(max(0.0, past_due - time.monotonic()))
            assert worker.poll() is None, "a process that is not the journaled one was killed"
    finally:
        worker.kill()
        worker.wait()
