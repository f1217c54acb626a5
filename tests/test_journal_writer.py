from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from aiotimer.server._journal_writer import JournalWriter

pytestmark = pytest.mark.timeout(30)


class _Disk:
    """A write function that can be held (to pile offers up) and made to fail."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.failures = 0
        self.gate = threading.Event()
        self.gate.set()
        self.attempted = threading.Semaphore(0)

    def write(self, data: bytes) -> None:
        self.gate.wait()
        self.attempted.release()
        if self.failures:
            self.failures -= 1
            raise OSError(28, "No space left on device")
        self.written.append(data)


def test_the_latest_offer_is_written_and_a_superseded_one_skipped() -> None:
    disk = _Disk()
    writer = JournalWriter(Path("j"), disk.write, retry=60.0)
    disk.gate.clear()
    writer.offer(b"1")
    assert disk.attempted.acquire(timeout=0) is False  # held at the gate
    writer.offer(b"2")
    writer.offer(b"3")
    disk.gate.set()
    writer.close()
    # "1" was taken before the gate closed or not; "2" never is: "3" superseded it.
    assert disk.written in ([b"1", b"3"], [b"3"])


def test_a_failed_write_is_reported_once_retried_and_its_recovery_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    disk = _Disk()
    disk.failures = 3
    writer = JournalWriter(Path("j"), disk.write, retry=0.01)
    with caplog.at_level(logging.WARNING, logger="aiotimer"):
        writer.offer(b"a")
        for _ in range(4):  # three failures, then the write that works
            assert disk.attempted.acquire(timeout=10)
        writer.close()
    assert disk.written == [b"a"]
    assert not writer.failing
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot write journal j" in m for m in messages) == 1
    assert messages[-1] == "journal j is written again"


def test_close_writes_what_is_pending_then_stops() -> None:
    disk = _Disk()
    writer = JournalWriter(Path("j"), disk.write, retry=60.0)
    writer.offer(b"last")
    writer.close()
    assert disk.written == [b"last"]
    writer.offer(b"after close")  # nobody writes it: the thread has ended
    assert disk.written == [b"last"]
