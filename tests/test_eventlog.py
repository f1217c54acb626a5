"""The event log: bounded noise, unbounded audit, and write errors that never stop it."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import anyio
import pytest

from aiotimer import events as ev
from aiotimer._edges.eventlog import EventLog
from aiotimer.errors import EventLogError
from aiotimer.testing import wait_until

REAPED = ev.WorkerReaped(time=1.0, pid=7, signal=9, group=False, scopes=("a",), step=1, steps=1)


@pytest.mark.asyncio
async def test_a_file_that_cannot_be_opened_is_a_typed_error(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "missing" / "log.jsonl")
    with pytest.raises(EventLogError, match=r"ENOENT.*writable file path"):
        await log.run(task_status=anyio.TASK_STATUS_IGNORED)


@pytest.mark.asyncio
@pytest.mark.parametrize("plant", ["fifo", "symlink", "device", "foreign"])
async def test_anything_but_a_regular_file_of_this_user_is_refused(
    tmp_path: Path, plant: str
) -> None:
    path, outside = tmp_path / "log.jsonl", tmp_path / "outside"
    outside.write_bytes(b"keep")
    if plant == "fifo":
        os.mkfifo(path)
    elif plant == "symlink":
        path.symlink_to(outside)
    elif plant == "device":
        path = Path("/dev/null")
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to give a file to another user")
        path.touch()
        os.chown(path, 65534, 65534)
    log = EventLog(path)
    with anyio.fail_after(5), pytest.raises(EventLogError, match=f"refusing the event log {path}"):
        await log.run(task_status=anyio.TASK_STATUS_IGNORED)
    assert outside.read_bytes() == b"keep"


@pytest.mark.asyncio
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
async def test_a_write_error_is_reported_and_counted_never_raised(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every write fails with ENOSPC: the log's own opener refuses a device, so hand it one.
    monkeypatch.setattr(
        "aiotimer._edges.eventlog.open_owned_append",
        lambda *args, **kwargs: os.open("/dev/full", os.O_WRONLY | os.O_CLOEXEC),
    )
    log = EventLog("/dev/full", retry_interval=0.05)
    with caplog.at_level(logging.ERROR, logger="aiotimer"):
        async with anyio.create_task_group() as tg:
            await tg.start(log.run)
            for _ in range(3):
                log.put(REAPED)
            await wait_until(lambda: log.lost >= 3)
            log.put(REAPED)  # while failing: counted at once, nothing queued
            for _ in range(10):
                await anyio.sleep(0.02)  # across retries: still failing, still counted
                log.put(REAPED)
            log.close()
    assert log.lost == 14
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, "the failure is reported once, not once per retry"
    assert "ENOSPC" in errors[0].getMessage() and "reaping goes on" in errors[0].getMessage()


@pytest.mark.process
@pytest.mark.asyncio
async def test_a_full_disk_loses_events_then_the_log_reports_the_loss(tiny_tmpfs: Path) -> None:
    filler = tiny_tmpfs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # fill the file system to the last byte
        with pytest.raises(OSError, match="No space"):
            while os.write(fd, b"x" * 512):
                pass
    finally:
        os.close(fd)
    path = tiny_tmpfs / "log.jsonl"
    log = EventLog(path, retry_interval=0.05)
    async with anyio.create_task_group() as tg:
        await tg.start(log.run)
        for _ in range(5):
            log.put(REAPED)
        await wait_until(lambda: log.lost >= 5)
        filler.unlink()  # room again: the next write reports the loss first
        await anyio.sleep(0.06)
        log.put(REAPED)
        await wait_until(lambda: path.exists() and b"worker_reaped" in path.read_bytes())
        log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records[0]["event"] == "events_lost"
    assert records[0]["count"] == log.lost >= 5
    assert "ENOSPC" in records[0]["error"]
    assert [r["event"] for r in records[1:]] == ["worker_reaped"]
