"""A burst far larger than the pipe, from many writers, with default settings: the
server takes every request and no client raises (back-pressure only slows them)."""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from aiotimer.events import Event, RequestRejected
from aiotimer.server import TimerServer

pytestmark = [pytest.mark.process, pytest.mark.timeout(60)]

WRITERS = 8
LINE_BYTES = 120  # about one torch-format line of these blocks
# A writer: one block to connect, "ready", wait for "go", then blocks flat out, "done",
# and it stays alive until told to quit (the server drops requests of exited pids).
WRITER = r"""
import sys
from aiotimer import FifoClient, expires
client = FifoClient(sys.argv[1])
blocks = int(sys.argv[2])
with expires(after=3600, scope="connect", client=client):
    pass
print("ready", flush=True)
sys.stdin.readline()
for i in range(blocks):
    with expires(after=3600, scope=f"train.py#{i % 50}", client=client):
        pass
print("done", flush=True)
sys.stdin.readline()
"""


async def _read_line(out: BufferedByteReceiveStream) -> bytes:
    """The next line from a writer (without its newline); b"" if the writer ended."""
    try:
        return await out.receive_until(b"\n", 1024)
    except (anyio.IncompleteRead, anyio.EndOfStream):
        return b""


async def _stderr(proc: Process) -> str:
    """What a writer that did not say its line wrote to stderr (it is ended first)."""
    assert proc.stderr is not None
    proc.kill()
    chunks = []
    with anyio.fail_after(10):
        async for chunk in proc.stderr:
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.asyncio
async def test_a_burst_ten_pipes_deep_from_eight_writers_loses_nothing(tmp_path: Path) -> None:
    fifo = tmp_path / "timer.fifo"
    rejected: list[Event] = []

    def on_event(event: Event) -> None:
        if isinstance(event, RequestRejected):
            rejected.append(event)

    server = TimerServer(fifo=fifo, on_event=on_event)
    async with server:
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            pipe_size = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
        finally:
            os.close(fd)
        blocks = 10 * pipe_size // (2 * LINE_BYTES * WRITERS) + 1
        procs = [
            await anyio.open_process([sys.executable, "-c", WRITER, str(fifo), str(blocks)])
            for _ in range(WRITERS)
        ]
        # Reads of a pipe return what is there, not lines: split them ourselves.
        outs = [BufferedByteReceiveStream(proc.stdout) for proc in procs if proc.stdout]
        try:
            for proc, out in zip(procs, outs, strict=True):
                said = await _read_line(out)
                assert said == b"ready", await _stderr(proc)
            for proc in procs:
                assert proc.stdin is not None
                await proc.stdin.send(b"go\n")
            for proc, out in zip(procs, outs, strict=True):
                with anyio.fail_after(40):
                    said = await _read_line(out)
                assert said == b"done", await _stderr(proc)
            expected = WRITERS * 2 * (blocks + 1)
            with anyio.fail_after(20):
                while server.get_state().counters.requests < expected:
                    await anyio.sleep(0.01)
            counters = server.get_state().counters
            for proc in procs:
                assert proc.stdin is not None
                await proc.stdin.send(b"quit\n")
                assert await proc.wait() == 0
        finally:
            for proc in procs:
                await proc.aclose()
    assert counters.requests == expected
    assert counters.released == expected // 2
    assert counters.rejected == 0 and not rejected
