"""The FIFO's path is watched: removed, it is made anew; replaced, clients refuse it."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import anyio
import pytest

from aiotimer._edges.marker import read_marker
from aiotimer.client._fifo import FifoClient
from aiotimer.errors import ServerUnavailableError
from aiotimer.sources.fifo import FifoSource
from aiotimer.testing import RecordingSink, running_source, wait_until
from aiotimer.wire import Request

pytestmark = [pytest.mark.process, pytest.mark.timeout(30)]


def _request(scope: str) -> Request:
    return Request(pid=os.getpid(), scope_id=scope, expiration_time=time.time() + 60, signal=9)


def _write(path: Path, scope: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, b'{"pid": %d, "scope_id": "%s", "expiration_time": 1e12, "signal": 9}\n'
                 % (os.getpid(), scope.encode()))  # fmt: skip
    finally:
        os.close(fd)


def _marked_inode(path: Path) -> tuple[int | None, int | None]:
    found = read_marker(path)
    assert found is not None
    return found.marker.fifo_dev, found.marker.fifo_ino


@pytest.mark.asyncio
async def test_a_removed_fifo_is_made_anew_and_the_old_one_still_read(tmp_path: Path) -> None:
    path, sink = tmp_path / "t.fifo", RecordingSink()
    async with running_source(FifoSource(path), sink):
        first = os.stat(path)
        assert _marked_inode(path) == (first.st_dev, first.st_ino)
        held = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # a client's persistent fd
        try:
            path.unlink()
            await wait_until(lambda: path.exists() and read_marker(path) is not None
                             and _marked_inode(path)[1] == os.stat(path).st_ino)  # fmt: skip
            assert os.stat(path).st_ino != first.st_ino
            _write(path, "new")
            os.write(held, b'{"pid": %d, "scope_id": "old", "expiration_time": 1e12, '
                     b'"signal": 9}\n' % os.getpid())  # fmt: skip
            await wait_until(lambda: {r.scope_id for r in sink.requests} == {"new", "old"})
        finally:
            os.close(held)
    assert not path.exists()


@pytest.mark.asyncio
async def test_a_path_replaced_by_a_symlink_is_refused_then_recovered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, sink = tmp_path / "t.fifo", RecordingSink()
    decoy = tmp_path / "decoy.fifo"
    os.mkfifo(decoy)
    decoy_reader = os.open(decoy, os.O_RDONLY | os.O_NONBLOCK)
    try:
        async with running_source(FifoSource(path), sink):
            client = FifoClient(path, connect_timeout=0.5)
            client.send(_request("before"))
            await wait_until(lambda: len(sink.requests) == 1)
            with caplog.at_level(logging.ERROR, logger="aiotimer"):
                path.unlink()
                os.symlink(decoy, path)  # someone else's FIFO, in its place
                await wait_until(lambda: "replaced by a symlink" in caplog.text)
            fresh = FifoClient(path, connect_timeout=0.5)
            with pytest.raises(ServerUnavailableError, match="path was replaced"):
                fresh.send(_request("refused"))
            assert os.read(decoy_reader, 100) == b"", "nothing reaches the decoy"
            path.unlink()  # the path is free again: the server makes its FIFO anew
            await wait_until(lambda: path.exists() and not path.is_symlink())
            await wait_until(lambda: _marked_inode(path)[1] == os.stat(path).st_ino)
            fresh.send(_request("after"))
            await wait_until(lambda: [r.scope_id for r in sink.requests] == ["before", "after"])
    finally:
        os.close(decoy_reader)


@pytest.mark.asyncio
async def test_a_removed_marker_is_published_again(tmp_path: Path) -> None:
    path = tmp_path / "t.fifo"
    async with running_source(FifoSource(path), RecordingSink()):
        marker = Path(f"{path}.aiotimer")
        marker.unlink()
        await wait_until(marker.exists)
        assert _marked_inode(path)[1] == os.stat(path).st_ino
    with anyio.fail_after(1):
        assert not marker.exists()
