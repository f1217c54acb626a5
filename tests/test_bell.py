"""The FIFO's bell: made and named by the source, rung by the client after an acquire
due soon, and ending the reader's pause between the reads of a trickle."""

from __future__ import annotations

import json
import os
import pathlib
import stat
import time

import anyio
import pytest

from aiotimer.client import FifoClient
from aiotimer.sources._bell import BELL_SUFFIX
from aiotimer.sources._trickle import LEAD_SHARE
from aiotimer.sources.fifo import FifoSource
from aiotimer.testing import RecordingSink, running_source, wait_until
from aiotimer.wire import MARKER_SUFFIX, Request

pytestmark = [pytest.mark.process, pytest.mark.timeout(30)]

#: The reads of a trickle come this far apart in these tests: far longer than a prompt
#: read takes even on a loaded machine.
INTERVAL = 5.0
#: Generous bound for "read promptly" on a busy 2-core machine (~1 ms unloaded).
PROMPT = 2.0


def line(scope: str, after: float) -> bytes:
    body = {
        "version": 1,
        "pid": 3,
        "scope_id": scope,
        "expiration_time": time.time() + after,
        "signal": 9,
        "mono": time.monotonic() + after,
    }
    return (json.dumps(body) + "\n").encode()


def marker(path: pathlib.Path) -> dict[str, object]:
    body = json.loads(path.with_name(path.name + MARKER_SUFFIX).read_text())
    assert isinstance(body, dict)
    return body


@pytest.mark.asyncio
async def test_the_source_names_its_bell_in_the_marker_and_removes_it(
    tmp_path: pathlib.Path,
) -> None:
    fifo = tmp_path / "timer.fifo"
    bell = tmp_path / ("timer.fifo" + BELL_SUFFIX)
    async with running_source(FifoSource(fifo, mode=0o620, read_interval=0.25), RecordingSink()):
        st = os.lstat(bell)
        assert stat.S_ISFIFO(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o620
        body = marker(fifo)
        assert body["bell"] == str(bell)
        assert body["bell_lead"] == pytest.approx(0.25 / LEAD_SHARE)
    assert not bell.exists()


@pytest.mark.asyncio
async def test_a_source_reading_every_line_has_no_bell(tmp_path: pathlib.Path) -> None:
    fifo = tmp_path / "timer.fifo"
    async with running_source(FifoSource(fifo, read_interval=0), RecordingSink()):
        assert "bell" not in marker(fifo)
        assert not (tmp_path / ("timer.fifo" + BELL_SUFFIX)).exists()


@pytest.mark.asyncio
async def test_a_ring_ends_the_pause_of_a_trickle(tmp_path: pathlib.Path) -> None:
    fifo = tmp_path / "timer.fifo"
    sink = RecordingSink()
    async with running_source(FifoSource(fifo, read_interval=INTERVAL), sink):
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        bell = os.open(str(fifo) + BELL_SUFFIX, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, line("first", 60))  # read at once; the reader then paces
            await wait_until(lambda: len(sink.requests) == 1)
            os.write(fd, line("second", 60))
            with anyio.move_on_after(0.5):
                await wait_until(lambda: len(sink.requests) == 2)
            assert len(sink.requests) == 1, "the reader woke at a line of a trickle"
            rung = time.monotonic()
            os.write(fd, line("third", 60))
            os.write(bell, b"!")
            await wait_until(lambda: len(sink.requests) == 3)
            assert time.monotonic() - rung < PROMPT
        finally:
            os.close(fd)
            os.close(bell)
    assert [r.scope_id for r in sink.requests] == ["first", "second", "third"]


@pytest.mark.asyncio
async def test_the_client_rings_after_an_acquire_due_sooner_than_the_bell_lead(
    tmp_path: pathlib.Path,
) -> None:
    fifo = tmp_path / "timer.fifo"
    sink = RecordingSink()
    lead = INTERVAL / LEAD_SHARE  # the server's bell_lead

    def acquire(client: FifoClient, scope: str, after: float) -> None:
        mono = time.monotonic() + after
        client.send(Request(os.getpid(), scope, time.time() + after, 9, mono=mono))

    async with running_source(FifoSource(fifo, read_interval=INTERVAL), sink):
        with FifoClient(fifo) as client:
            acquire(client, "first", 60)
            await wait_until(lambda: len(sink.requests) == 1)
            assert client.persistent
            acquire(client, "long", lead * 2)  # no ring: read at the next read
            with anyio.move_on_after(0.5):
                await wait_until(lambda: len(sink.requests) == 2)
            assert len(sink.requests) == 1, "a long block's acquire woke the reader"
            sent = time.monotonic()
            acquire(client, "short", lead / 2)  # rings: read at once
            await wait_until(lambda: len(sink.requests) == 3)
            assert time.monotonic() - sent < PROMPT
    assert [r.scope_id for r in sink.requests] == ["first", "long", "short"]
