"""FifoSource against real FIFOs (and real writer processes where it matters)."""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio
import pytest

from aiotimer.errors import SourceError
from aiotimer.sources._budget import LINES_PER_STEP
from aiotimer.sources._trickle import EMPTY_READS, LEAD_SHARE
from aiotimer.sources.fifo import CHUNK_SIZE, MAX_READS_PER_WAKE, PIPE_SIZE, FifoSource
from aiotimer.testing import RecordingSink, running_source, wait_until
from aiotimer.wire import MARKER_SUFFIX

pytestmark = [pytest.mark.process, pytest.mark.timeout(30)]

#: Generous bound for "promptly" on a busy 2-core machine; the real figure is ~1 ms.
PROMPT = 3.0


def torch_line(pid: int, scope: str, expiration: float = 1e10, sig: int = 9) -> bytes:
    """A request line exactly as torch's FileTimerClient writes it."""
    body = {
        "version": 1,
        "pid": pid,
        "scope_id": scope,
        "expiration_time": expiration,
        "signal": sig,
    }
    return (json.dumps(body) + "\n").encode()


@contextmanager
def writer(path: pathlib.Path) -> Iterator[int]:
    """A non-blocking write descriptor on the FIFO, closed on exit."""
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        yield fd
    finally:
        os.close(fd)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def fifo_path(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "timer.fifo"


def marker_of(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(path.name + MARKER_SUFFIX)


@pytest.mark.asyncio
async def test_creates_fifo_0600_and_marker_then_removes_both(fifo_path: pathlib.Path) -> None:
    fds_before = open_fds()
    source = FifoSource(fifo_path, marker={"dump_dir": "/tmp/dumps"})
    assert source.name == f"fifo:{fifo_path}"
    assert source.path == fifo_path
    sink = RecordingSink()
    async with running_source(source, sink):
        st = os.lstat(fifo_path)
        assert stat.S_ISFIFO(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600
        marker = marker_of(fifo_path)
        assert stat.S_IMODE(os.lstat(marker).st_mode) == 0o644
        body = json.loads(marker.read_text())
        assert body["server"] == "aiotimer"
        assert body["pid"] == os.getpid()
        assert body["protocol"] == 1
        assert isinstance(body["version"], str)
        assert body["dump_dir"] == "/tmp/dumps"
        if hasattr(fcntl, "F_GETPIPE_SZ"):
            with writer(fifo_path) as fd:
                capacity = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
            max_size = int(pathlib.Path("/proc/sys/fs/pipe-max-size").read_text())
            assert capacity == PIPE_SIZE or (capacity >= 65536 and max_size < PIPE_SIZE)
    assert not fifo_path.exists()
    assert not marker_of(fifo_path).exists()
    assert open_fds() == fds_before
    assert sink.batches == []


@pytest.mark.asyncio
async def test_mode_is_exact_whatever_the_umask(fifo_path: pathlib.Path) -> None:
    old = os.umask(0o077)
    try:
        async with running_source(FifoSource(fifo_path, mode=0o620), RecordingSink()):
            assert stat.S_IMODE(os.lstat(fifo_path).st_mode) == 0o620
    finally:
        os.umask(old)


def _make_file(p: pathlib.Path) -> None:
    p.write_text("precious")


def _make_dir(p: pathlib.Path) -> None:
    p.mkdir()
    (p / "inside").write_text("precious")


def _make_symlink(p: pathlib.Path) -> None:
    target = p.with_name("target.fifo")
    os.mkfifo(target)
    p.symlink_to(target)


@pytest.mark.asyncio
@pytest.mark.parametrize("make", [_make_file, _make_dir, _make_symlink])
async def test_refuses_a_path_that_is_not_a_fifo_and_leaves_it_intact(
    fifo_path: pathlib.Path, make: Callable[[pathlib.Path], None]
) -> None:
    make(fifo_path)
    before = os.lstat(fifo_path)
    fds_before = open_fds()
    with pytest.raises(SourceError, match="refusing"):
        await FifoSource(fifo_path).serve(RecordingSink())
    after = os.lstat(fifo_path)
    assert (after.st_ino, after.st_mode, after.st_mtime_ns) == (
        before.st_ino,
        before.st_mode,
        before.st_mtime_ns,
    )
    if fifo_path.is_file() and not fifo_path.is_symlink():
        assert fifo_path.read_text() == "precious"
    assert not marker_of(fifo_path).exists()
    assert open_fds() == fds_before


@pytest.mark.asyncio
async def test_replaces_a_stale_fifo_with_a_dead_servers_marker(fifo_path: pathlib.Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    os.mkfifo(fifo_path, 0o666)
    os.chmod(fifo_path, 0o666)
    marker_of(fifo_path).write_text(json.dumps({"server": "aiotimer", "pid": dead.pid}))
    sink = RecordingSink()
    async with running_source(FifoSource(fifo_path), sink):
        # Replaced by a fresh FIFO (the filesystem may reuse the inode number).
        assert stat.S_IMODE(os.lstat(fifo_path).st_mode) == 0o600
        assert json.loads(marker_of(fifo_path).read_text())["pid"] == os.getpid()
        with writer(fifo_path) as fd:
            os.write(fd, torch_line(7, "a"))
        await wait_until(lambda: len(sink.requests) == 1)
    assert not fifo_path.exists()


@pytest.mark.asyncio
async def test_refuses_a_fifo_served_by_a_live_server(fifo_path: pathlib.Path) -> None:
    sink = RecordingSink()
    async with running_source(FifoSource(fifo_path), sink):
        inode = os.lstat(fifo_path).st_ino
        with pytest.raises(SourceError, match=f"aiotimer server pid {os.getpid()}"):
            await FifoSource(fifo_path).serve(RecordingSink())
        # The first server is untouched and still serving.
        assert os.lstat(fifo_path).st_ino == inode
        assert json.loads(marker_of(fifo_path).read_text())["pid"] == os.getpid()
        with writer(fifo_path) as fd:
            os.write(fd, torch_line(7, "still-served"))
        await wait_until(lambda: len(sink.requests) == 1)


@pytest.mark.asyncio
async def test_refuses_a_fifo_read_by_a_foreign_server(fifo_path: pathlib.Path) -> None:
    # A torch-style server: a plain reader and no marker.
    os.mkfifo(fifo_path, 0o600)
    reader = os.open(fifo_path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(SourceError, match="another process"):
            await FifoSource(fifo_path).serve(RecordingSink())
        assert stat.S_ISFIFO(os.lstat(fifo_path).st_mode)
    finally:
        os.close(reader)


@pytest.mark.asyncio
async def test_leaves_a_path_that_no_longer_holds_its_fifo(fifo_path: pathlib.Path) -> None:
    async with running_source(FifoSource(fifo_path), RecordingSink()):
        os.unlink(fifo_path)
        fifo_path.write_text("someone else's")
    assert fifo_path.read_text() == "someone else's"


@pytest.mark.asyncio
async def test_decodes_torch_lines_from_a_child_process(fifo_path: pathlib.Path) -> None:
    # The child opens, writes and closes per request, exactly like torch's client.
    child_code = """
import json, os, sys
for i in range(20):
    body = {"version": 1, "pid": os.getpid(), "scope_id": f"train.py#{i}",
            "expiration_time": 1e10 + i, "signal": 9}
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "wt") as f:
        f.write(json.dumps(body) + "\\n")
"""
    sink = RecordingSink()
    async with running_source(FifoSource(fifo_path), sink):
        proc = await anyio.run_process([sys.executable, "-c", child_code, str(fifo_path)])
        assert proc.returncode == 0
        await wait_until(lambda: len(sink.requests) == 20)
    scopes = [r.scope_id for r in sink.requests]
    assert scopes == [f"train.py#{i}" for i in range(20)]
    assert all(r.signal == 9 and r.version == 1 for r in sink.requests)
    assert {source for _, source in sink.batches} == {f"fifo:{fifo_path}"}
    assert sink.rejections == []


@pytest.mark.torch
def test_decodes_torchs_own_file_timer_client(fifo_path: pathlib.Path) -> None:
    # torch's client runs in a worker thread of this process: a child interpreter would
    # spend seconds importing torch for two lines. One event loop is enough here.
    timer = pytest.importorskip("torch.distributed.elastic.timer")

    def torch_client() -> None:
        client = timer.FileTimerClient(str(fifo_path), signal=15)
        client.acquire("torch-scope", 1e10)
        client.release("torch-scope")

    sink = RecordingSink()

    async def main() -> None:
        async with running_source(FifoSource(fifo_path), sink):
            await anyio.to_thread.run_sync(torch_client)
            await wait_until(lambda: len(sink.requests) == 2, timeout=10)

    anyio.run(main)
    acquire, release = sink.requests
    assert (acquire.scope_id, acquire.signal, acquire.is_release) == ("torch-scope", 15, False)
    assert (release.scope_id, release.is_release) == ("torch-scope", True)
    assert acquire.pid == release.pid == os.getpid()


@pytest.mark.asyncio
async def test_lines_split_across_many_writes(fifo_path: pathlib.Path) -> None:
    data = b"".join(torch_line(100 + i, f"s{i}", 1e10 + i) for i in range(300))
    sink = RecordingSink()
    async with running_source(FifoSource(fifo_path), sink):
        with writer(fifo_path) as fd:
            for start in range(0, len(data), 37):
                os.write(fd, data[start : start + 37])
                if start % 3700 == 0:
                    await anyio.sleep(0)  # let the reader see partial lines
        await wait_until(lambda: len(sink.requests) == 300)
    assert [r.pid for r in sink.requests] == [100 + i for i in range(300)]
    assert sink.rejections == []


@pytest.mark.asyncio
async def test_a_writer_stalled_mid_line_does_not_delay_others(fifo_path: pathlib.Path) -> None:
    sink = RecordingSink()
    async with running_source(FifoSource(fifo_path), sink):
        with writer(fifo_path) as stalled, writer(fifo_path) as other:
            os.write(stalled, torch_line(1, "stalled")[:30])  # and holds the pipe open
            await anyio.sleep(0.05)
            for i in range(5):
                os.write(other, torch_line(2, f"other{i}"))
                sent = time.monotonic()
                await wait_until(lambda i=i: len(sink.requests) == i + 1)
                assert time.monotonic() - sent < PROMPT
    assert [r.scope_id for r in sink.requests] == [f"other{i}" for i in range(5)]
    assert sink.rejections == ["partial line (writer stopped mid-line)"]


@pytest.mark.parametrize("interval", [0.0, 0.01])
@pytest.mark.asyncio
async def test_eof_never_spins_while_idle(
    fifo_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, interval: float
) -> None:
    reads = 0
    real_read = os.read

    def counting_read(fd: int, n: int) -> bytes:
        nonlocal reads
        reads += 1
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", counting_read)
    sink = RecordingSink()
    async with running_source(FifoSource(fifo_path, read_interval=interval), sink):
        with writer(fifo_path) as fd:  # a client comes, writes and goes: EOF for a reader
            os.write(fd, torch_line(3, "once"))
        await wait_until(lambda: len(sink.requests) == 1)
        reads_after_line = reads
        cpu = time.process_time()
        await anyio.sleep(0.5)
        # Reading a trickle, the reader looks EMPTY_READS times more, an interval apart,
        # finding the pipe empty; then it waits for input.
        looks = EMPTY_READS if interval else 0
        assert reads - reads_after_line <= looks, "the reader woke up with nothing to read"
        assert len(sink.batches) == 1
        # Spinning would burn ~0.5 s of CPU here; allow a lot of slack for noise.
        assert time.process_time() - cpu < 0.25


@pytest.mark.asyncio
async def test_bad_lines_are_rejected_and_good_ones_kept(fifo_path: pathlib.Path) -> None:
    sink = RecordingSink()
    payload = (
        torch_line(5, "a")
        + b"garbage\n"
        + torch_line(0, "bad-pid")
        + b'{"pid": 5, "scope_id": "b", "expiration_time": NaN, "signal": 9}\n'
        + torch_line(5, "c")
    )
    async with running_source(FifoSource(fifo_path), sink):
        with writer(fifo_path) as fd:
            os.write(fd, payload)
        await wait_until(lambda: len(sink.requests) + len(sink.rejections) == 5)
    assert [r.scope_id for r in sink.requests] == ["a", "c"]
    assert len(sink.rejections) == 3


@pytest.mark.asyncio
async def test_a_busy_fifo_yields_to_the_loop_between_bounded_batches(
    fifo_path: pathlib.Path,
) -> None:
    chunk_size = 512
    lines = [torch_line(9, f"{i:06d}") for i in range(600)]
    data = b"".join(lines)
    assert len(data) < 65536  # fits in the pipe: all of it is there at the first wake-up
    sink = RecordingSink()
    async with running_source(FifoSource(fifo_path, chunk_size=chunk_size), sink):
        with writer(fifo_path) as fd:
            assert os.write(fd, data) == len(data)
        await wait_until(lambda: len(sink.requests) == 600)
    # One wake-up reads at most MAX_READS_PER_WAKE chunks, so no batch holds more lines.
    most_per_wake = MAX_READS_PER_WAKE * chunk_size // len(lines[0]) + 1
    assert max(len(batch.requests) for batch, _ in sink.batches) <= most_per_wake
    assert [r.scope_id for r in sink.requests] == [f"{i:06d}" for i in range(600)]


@pytest.mark.asyncio
async def test_restart_after_stop(fifo_path: pathlib.Path) -> None:
    fds_before = open_fds()
    source = FifoSource(fifo_path)
    sink = RecordingSink()
    for round_ in range(3):
        async with running_source(source, sink):
            with writer(fifo_path) as fd:
                os.write(fd, torch_line(11, f"round{round_}"))
            await wait_until(lambda round_=round_: len(sink.requests) == round_ + 1)
        assert not fifo_path.exists()
        assert not marker_of(fifo_path).exists()
    assert open_fds() == fds_before


@pytest.mark.asyncio
async def test_cancellation_before_any_client_is_clean(fifo_path: pathlib.Path) -> None:
    fds_before = open_fds()
    with anyio.move_on_after(0.1) as scope:
        await FifoSource(fifo_path).serve(RecordingSink())
    assert scope.cancelled_caught
    assert not fifo_path.exists()
    assert not marker_of(fifo_path).exists()
    assert open_fds() == fds_before


def test_rejects_bad_arguments(fifo_path: pathlib.Path) -> None:
    with pytest.raises(ValueError):
        FifoSource(fifo_path, chunk_size=0)
    with pytest.raises(ValueError):
        FifoSource(fifo_path, max_line=1)
    assert repr(FifoSource(fifo_path)) == f"<FifoSource {str(fifo_path)!r} mode=0o600>"


@pytest.mark.asyncio
async def test_the_read_loop_waits_on_the_loop_directly_and_is_cancelled_cleanly(
    fifo_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The lean wake-up (benchmarks.bench_fifo_wake): the loop's add_reader, never
    # anyio.wait_readable on the FIFO; every wake still delivers, and leaving cancels the
    # wait without leaving a reader registered on the closed descriptor.
    waited_on_fifo: list[int] = []
    wait_readable = anyio.wait_readable

    async def spy(obj: int) -> None:
        if isinstance(obj, int) and stat.S_ISFIFO(os.fstat(obj).st_mode):
            waited_on_fifo.append(obj)
        await wait_readable(obj)

    monkeypatch.setattr(anyio, "wait_readable", spy)
    sink = RecordingSink()
    async with running_source(FifoSource(fifo_path), sink):
        with writer(fifo_path) as fd:
            for i in range(5):  # one wake-up each
                os.write(fd, torch_line(7, f"s{i}"))
                await wait_until(lambda i=i: len(sink.requests) == i + 1)
    assert [r.scope_id for r in sink.requests] == [f"s{i}" for i in range(5)]
    assert waited_on_fifo == []
    await anyio.sleep(0.01)  # a reader left registered on a closed fd would fail the loop


@pytest.mark.asyncio
async def test_a_read_of_short_garbage_lines_is_decoded_a_step_at_a_time(
    fifo_path: pathlib.Path,
) -> None:
    sink = RecordingSink()
    async with running_source(FifoSource(fifo_path), sink):
        with writer(fifo_path) as fd:
            os.write(fd, b"x\n" * 16384)  # one 32 KiB read: 16,384 bad lines
            await wait_until(lambda: len(sink.rejections) == 16384)
    # The first step decodes at most a step's lines; then the reader knows a flood of
    # garbage: the lines that cannot be requests are counted, not decoded, and reported
    # together (the first of them with its exact reason).
    sizes = [len(batch.rejections) for batch, _ in sink.batches]
    assert sizes[0] <= 2 * LINES_PER_STEP and len(sizes) >= 2
    assert sink.rejections[0].startswith("malformed JSON")
    assert sink.rejections[-1].startswith("not a request (no scope_id key)")


@pytest.mark.asyncio
async def test_a_trickle_is_read_once_per_interval_capped_by_its_leads(
    fifo_path: pathlib.Path,
) -> None:
    # After a read that found a trickle, the next line waits for the next read, an
    # interval later, rather than waking the reader; an acquire due soon shortens it.
    interval = 1.0
    sink = RecordingSink()
    async with running_source(FifoSource(fifo_path, read_interval=interval), sink):
        with writer(fifo_path) as fd:
            os.write(fd, torch_line(3, "first"))  # due in ages: the full interval
            await wait_until(lambda: len(sink.requests) == 1)
            sent = time.monotonic()
            os.write(fd, torch_line(3, "second", expiration=time.time() + 1.5))
            with anyio.move_on_after(interval / 2):
                await wait_until(lambda: len(sink.requests) == 2)
            assert len(sink.requests) == 1, "the reader woke at a line of a trickle"
            await wait_until(lambda: len(sink.requests) == 2)
            assert time.monotonic() - sent >= interval * 0.99
            # "second" was read ~0.5 s before its deadline: later reads come at most
            # LEAD_SHARE of that apart, well before the full interval.
            sent = time.monotonic()
            os.write(fd, torch_line(3, "third"))
            await wait_until(lambda: len(sink.requests) == 3)
            assert time.monotonic() - sent < LEAD_SHARE * 0.5 + interval / 4
    assert [r.scope_id for r in sink.requests] == ["first", "second", "third"]


@pytest.mark.asyncio
async def test_a_paced_read_of_a_busy_job_is_one_batch(fifo_path: pathlib.Path) -> None:
    # 64 workers timing 10 blocks a second write ~45 KiB between two paced reads; in
    # one batch, a block whose acquire and release both came in it never reaches the
    # table (aiotimer.core._fold), which halves the server's work on such a job. (The
    # pipe is 1 MiB: root, or pipe-max-size's default.)
    interval = 5.0
    sink = RecordingSink()
    async with running_source(FifoSource(fifo_path, read_interval=interval), sink):
        with writer(fifo_path) as fd:
            os.write(fd, torch_line(3, "first"))  # read at once; the reader then paces
            await wait_until(lambda: len(sink.requests) == 1)
            lines = [torch_line(1000 + i % 64, f"b{i}") for i in range(600)]
            # More than a chunk, less than a sixteenth of the pipe (a paced read's most).
            assert CHUNK_SIZE < sum(map(len, lines)) <= PIPE_SIZE // 16
            for line in lines:
                os.write(fd, line)
            with anyio.move_on_after(interval / 4):
                await wait_until(lambda: len(sink.requests) > 1)
            assert len(sink.requests) == 1, "the reader woke at a line of a trickle"
            await wait_until(lambda: len(sink.requests) == 1 + len(lines), timeout=2 * interval)
    assert len(sink.batches) == 2
