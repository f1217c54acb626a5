"""The FIFO's bell: made and named by the source, rung by the client after an acquire
due soon, and ending the reader's pause between the reads of a trickle."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import stat
import time
from typing import Any

import anyio
import pytest

from aiotimer._edges.marker import AIOTIMER, Marker, publish_marker
from aiotimer._edges.ring import PLAIN_RING, ring_byte, ring_lead
from aiotimer.client import FifoClient
from aiotimer.errors import ClientBackpressureError
from aiotimer.sources._bell import BELL_SUFFIX
from aiotimer.sources._trickle import BELL_INTERVAL, LEAD_SHARE, LEAD_WINDOW
from aiotimer.sources.fifo import FifoSource
from aiotimer.testing import RecordingSink, running_source, wait_until
from aiotimer.wire import MARKER_SUFFIX, Request

pytestmark = [pytest.mark.process, pytest.mark.timeout(30)]

#: The reads of a trickle come this far apart in these tests: far longer than a prompt
#: read takes even on a loaded machine.
INTERVAL = 5.0
#: Generous bound for "read promptly" on a busy 2-core machine (~1 ms unloaded).
PROMPT = 2.0


def line(scope: str, after: float, *, mono: bool = True) -> bytes:
    body: dict[str, object] = {
        "version": 1,
        "pid": 3,
        "scope_id": scope,
        "expiration_time": time.time() + after,
        "signal": 9,
    }
    if mono:  # aiotimer's client's key (torch's client sends none)
        body["mono"] = time.monotonic() + after
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
        assert body["bell_lead"] == pytest.approx(BELL_INTERVAL / LEAD_SHARE)
        assert body["bell_window"] == LEAD_WINDOW
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


@pytest.mark.parametrize("ringing", [True, False])
@pytest.mark.asyncio
async def test_the_bell_interval_holds_only_while_every_client_rings(
    tmp_path: pathlib.Path, ringing: bool
) -> None:
    # Leads of a minute: a trickle from clients that ring (aiotimer's) is read every
    # bell_interval (here INTERVAL); once one that does not ring (torch's) is read, every
    # read_interval (0.25 s).
    fifo = tmp_path / "timer.fifo"
    sink = RecordingSink()
    source = FifoSource(fifo, read_interval=0.25, bell_interval=INTERVAL)
    async with running_source(source, sink):
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, line("first", 60, mono=ringing))  # read at once; then paced
            await wait_until(lambda: len(sink.requests) == 1)
            sent = time.monotonic()
            os.write(fd, line("second", 60))
            if ringing:
                with anyio.move_on_after(1.0):
                    await wait_until(lambda: len(sink.requests) == 2)
                assert len(sink.requests) == 1, "read before the bell interval"
            else:
                await wait_until(lambda: len(sink.requests) == 2)
                assert time.monotonic() - sent < PROMPT
        finally:
            os.close(fd)


@pytest.mark.asyncio
async def test_a_ring_s_lead_paces_the_reads_that_follow(tmp_path: pathlib.Path) -> None:
    fifo = tmp_path / "timer.fifo"
    sink = RecordingSink()
    source = FifoSource(fifo, read_interval=0.25, bell_interval=30.0)
    async with running_source(source, sink):
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        bell = os.open(str(fifo) + BELL_SUFFIX, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, line("first", 60))  # read at once; the reader then paces (30 s)
            await wait_until(lambda: len(sink.requests) == 1)
            # A ring that says 1 s (its line says more: the ring alone teaches the lead).
            os.write(fd, line("rung", 60))
            os.write(bell, ring_byte(1.0))
            await wait_until(lambda: len(sink.requests) == 2)
            sent = time.monotonic()
            os.write(fd, line("after", 60))  # no ring: read within 0.8 s, not 30 s
            await wait_until(lambda: len(sink.requests) == 3)
            assert time.monotonic() - sent < 0.8 + PROMPT
        finally:
            os.close(fd)
            os.close(bell)


@pytest.mark.asyncio
async def test_a_ring_the_pause_already_serves_waits_for_its_end(tmp_path: pathlib.Path) -> None:
    # A steady job rings for leads the reader already paces by: such a ring costs no
    # read of its own (the pause ends within LEAD_SHARE of its lead); a plain ring, even
    # among others in one read of the bell, still ends the pause.
    fifo = tmp_path / "timer.fifo"
    sink = RecordingSink()
    source = FifoSource(fifo, read_interval=0.25, bell_interval=30.0)
    async with running_source(source, sink):
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        bell = os.open(str(fifo) + BELL_SUFFIX, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, line("first", 60))  # read at once; the reader then paces (30 s)
            await wait_until(lambda: len(sink.requests) == 1)
            await anyio.sleep(0.2)  # input this slow paces no read sooner (see paced())
            os.write(fd, line("rung", 60))
            os.write(bell, ring_byte(20.0))  # ends the pause: the next ones last ~15 s
            await wait_until(lambda: len(sink.requests) == 2)
            os.write(fd, line("served", 60))
            os.write(bell, ring_byte(60.0))  # 0.8 of its lead is past the pause's end
            with anyio.move_on_after(2.0):
                await wait_until(lambda: len(sink.requests) == 3)
            assert len(sink.requests) == 2, "a ring the pause serves made a read"
            rung = time.monotonic()
            os.write(bell, ring_byte(60.0) + PLAIN_RING)  # one read of the bell, two rings
            await wait_until(lambda: len(sink.requests) == 3)
            assert time.monotonic() - rung < PROMPT
        finally:
            os.close(fd)
            os.close(bell)
    assert [r.scope_id for r in sink.requests] == ["first", "rung", "served"]


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


def hand_made_fifo(tmp_path: pathlib.Path, **marker: Any) -> tuple[pathlib.Path, int, int]:
    """A FIFO and its bell read by the test itself, behind an aiotimer marker with
    ``marker``'s bell settings: (the FIFO, its reader, the bell's reader). Every ring a
    client writes stays in the bell to be counted."""
    fifo, bell = tmp_path / "timer.fifo", tmp_path / ("timer.fifo" + BELL_SUFFIX)
    os.mkfifo(fifo, 0o600)
    os.mkfifo(bell, 0o600)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    rings = os.open(bell, os.O_RDONLY | os.O_NONBLOCK)
    st = os.stat(fifo)
    published = Marker(
        server=AIOTIMER, pid=os.getpid(), fifo_dev=st.st_dev, fifo_ino=st.st_ino,
        bell=str(bell), **marker,
    )  # fmt: skip
    assert publish_marker(fifo, published) is None
    return fifo, reader, rings


def test_the_client_rings_once_per_window_for_leads_as_long_as_one_rung_for(
    tmp_path: pathlib.Path,
) -> None:
    window = 3600.0  # no ring of this test outlives it
    fifo, reader, rings = hand_made_fifo(tmp_path, bell_lead=10.0, bell_window=window)

    def rung() -> list[float | None]:
        try:
            return [ring_lead(code) for code in os.read(rings, 4096)]
        except BlockingIOError:
            return []

    def acquire(client: FifoClient, scope: str, after: float) -> None:
        mono = time.monotonic() + after
        client.send(Request(os.getpid(), scope, time.time() + after, 9, mono=mono))

    try:
        with FifoClient(fifo) as client:
            acquire(client, "long", 60.0)  # above bell_lead: no ring
            assert rung() == []
            acquire(client, "a", 5.0)
            (said,) = rung()
            assert said is not None and 4.0 < said <= 5.0  # the ring says its lead
            acquire(client, "b", 6.0)  # as long or longer, within the window: no ring
            acquire(client, "c", 5.0)
            assert rung() == []
            acquire(client, "d", 1.0)  # shorter than any rung for: rings
            (said,) = rung()
            assert said is not None and 0.8 < said <= 1.0
            acquire(client, "e", 2.0)
            assert rung() == []
            # Already due (a late write, an expired acquire): a plain ring, which the
            # server paces by nothing, and which leaves the window as it was.
            acquire(client, "late", -1.0)
            assert rung() == [None]
            acquire(client, "f", 2.0)
            assert rung() == []
    finally:
        os.close(reader)
        os.close(rings)


def test_without_a_window_in_the_marker_the_client_rings_every_time(
    tmp_path: pathlib.Path,
) -> None:
    fifo, reader, rings = hand_made_fifo(tmp_path, bell_lead=10.0)
    try:
        with FifoClient(fifo) as client:
            for scope in ("a", "b", "c"):
                mono = time.monotonic() + 5.0
                client.send(Request(os.getpid(), scope, time.time() + 5.0, 9, mono=mono))
        assert len(os.read(rings, 4096)) == 3
    finally:
        os.close(reader)
        os.close(rings)


def test_a_client_that_finds_the_pipe_full_rings_plainly(tmp_path: pathlib.Path) -> None:
    # A paced reader may pause 2 s: a writer that finds the pipe full rings, so the
    # server reads at once instead of letting the writer wait out its write timeout.
    fifo, reader, rings = hand_made_fifo(tmp_path, bell_lead=1.0, bell_window=3600.0)
    try:
        with FifoClient(fifo, write_timeout=0.5) as client:
            line = Request(os.getpid(), "long", time.time() + 60, 9, mono=time.monotonic() + 60)
            client.send(line)  # connected; a 60 s lead rings nothing
            with pytest.raises(BlockingIOError):
                os.read(rings, 4096)
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            try:
                with contextlib.suppress(BlockingIOError):
                    while True:
                        os.write(writer, b"x" * 4096)  # fill the pipe
            finally:
                os.close(writer)
            with pytest.raises(ClientBackpressureError):
                client.send(line)  # nobody reads: it stays full for 0.5 s
            assert os.read(rings, 4096) == PLAIN_RING
    finally:
        os.close(reader)
        os.close(rings)
