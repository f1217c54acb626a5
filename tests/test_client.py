"""Transport clients, configuration and discovery.

FIFO tests use real FIFOs that the test itself reads (marked ``process``); they assert
upper time bounds generous enough for a busy 2-core machine (documented where used).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import importlib
import json
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import msgspec
import pytest

from aiotimer._edges.procfs import own_start_time
from aiotimer.client import (
    DEFAULT_KILL_AFTER,
    FifoClient,
    InProcessClient,
    QueueClient,
    QueueRequest,
    TimerClient,
    _fifo_link,
    _fifo_peer,
    configure,
    current_client,
    expires,
    timer_server_configured,
    use_client,
)
from aiotimer.client._transport import delivered_late
from aiotimer.errors import ClientBackpressureError, NotConfiguredError, ServerUnavailableError
from aiotimer.testing import settle
from aiotimer.wire import (
    ENV_FIFO,
    MARKER_SUFFIX,
    TORCH_ENV_FIFO,
    LineDecoder,
    Request,
    encode,
)

#: Slack added to every "within N seconds" bound: a loaded shared machine can stall a
#: process for a while; the bounds still catch a client that waits forever.
SLACK = 3.0


def acquire(scope: str = "s", after: float = 10.0, *, mono: bool = True) -> Request:
    return Request(
        pid=os.getpid(),
        scope_id=scope,
        expiration_time=1_763_712_000.25 + after,
        signal=9,
        mono=1000.0 + after if mono else None,
    )


def release(scope: str = "s") -> Request:
    return Request(pid=os.getpid(), scope_id=scope, expiration_time=-1, signal=0)


def write_marker(fifo: Path, pid: int | None = None) -> None:
    marker = {"server": "aiotimer", "pid": pid or os.getpid(), "protocol": 1}
    Path(str(fifo) + MARKER_SUFFIX).write_text(json.dumps(marker))


class Reader:
    """The server's side of a FIFO, played by the test: a non-blocking read end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def read(self) -> bytes:
        chunks = []
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def requests(self) -> list[Request]:
        decoded = LineDecoder().feed(self.read())
        assert decoded.rejections == []
        return decoded.requests

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "timer.fifo"
    os.mkfifo(path, 0o600)
    return path


@pytest.fixture
def reader(fifo: Path) -> Iterator[Reader]:
    r = Reader(fifo)
    yield r
    r.close()


@pytest.fixture
def aiotimer_fifo(fifo: Path) -> Path:
    write_marker(fifo)
    return fifo


@pytest.fixture
def client_factory() -> Iterator[list[FifoClient]]:
    made: list[FifoClient] = []
    yield made
    for c in made:
        c.close()


def fifo_client(made: list[FifoClient], path: Path, **kwargs: float) -> FifoClient:
    c = FifoClient(path, **kwargs)  # type: ignore[arg-type]
    made.append(c)
    return c


def fill(path: Path) -> int:
    """Fill the pipe behind ``path`` (a reader must be open); return the bytes written."""
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    total = 0
    try:
        for size in (1 << 16, 4096, 1):
            with contextlib.suppress(BlockingIOError):
                while True:
                    total += os.write(fd, b"\n" * size)
    finally:
        os.close(fd)
    return total


# -- FIFO: what goes on the wire ----------------------------------------------------------


@pytest.mark.process
def test_torch_server_gets_torch_bytes_and_a_closed_descriptor(
    fifo: Path, reader: Reader, client_factory: list[FifoClient]
) -> None:
    client = fifo_client(client_factory, fifo)
    client.send(acquire("train.py#42"))
    assert not client.persistent  # no marker: open, write, close per request
    client.send(release("train.py#42"))
    data = reader.read()
    pid = os.getpid()
    expected = (
        f'{{"version": 1, "pid": {pid}, "scope_id": "train.py#42", '
        f'"expiration_time": 1763712010.25, "signal": 9}}\n'
        f'{{"version": 1, "pid": {pid}, "scope_id": "train.py#42", '
        f'"expiration_time": -1, "signal": 0}}\n'
    ).encode()
    assert data == expected
    try:
        # torch is optional and slow to import: only this test needs it.
        from torch.distributed.elastic.timer.file_based_local_timer import (  # noqa: PLC0415
            FileTimerRequest,
        )
    except ImportError:
        pass
    else:
        torch_lines = [
            FileTimerRequest(pid, "train.py#42", 1763712010.25, 9).to_json(),
            FileTimerRequest(pid, "train.py#42", -1, 0).to_json(),
        ]
        assert data == "".join(f"{line}\n" for line in torch_lines).encode()
    # Every writer has closed: reading now sees end-of-file, not "would block".
    assert os.read(reader.fd, 10) == b""


@pytest.mark.process
def test_aiotimer_server_gets_one_persistent_descriptor_and_the_mono_deadline(
    aiotimer_fifo: Path, reader: Reader, client_factory: list[FifoClient]
) -> None:
    client = fifo_client(client_factory, aiotimer_fifo)
    client.send(acquire("a"))
    assert client.persistent
    client.send(release("a"))
    got = reader.requests()
    assert [(r.scope_id, r.is_release) for r in got] == [("a", False), ("a", True)]
    assert got[0].mono == 1010.0 and got[1].mono is None
    with pytest.raises(BlockingIOError):  # the client's descriptor is still open
        os.read(reader.fd, 10)


@pytest.mark.process
def test_a_departed_server_leaves_the_client_talking_torch(
    aiotimer_fifo: Path, reader: Reader, client_factory: list[FifoClient]
) -> None:
    client = fifo_client(client_factory, aiotimer_fifo)
    client.marker_check_interval = 0.0
    client.send(acquire("a"))
    assert client.persistent
    Path(str(aiotimer_fifo) + MARKER_SUFFIX).unlink()
    client.send(acquire("b"))
    assert not client.persistent
    got = reader.requests()
    assert [(r.scope_id, r.mono is None) for r in got] == [("a", False), ("b", True)]


@pytest.mark.process
def test_a_stale_marker_is_ignored(
    fifo: Path, reader: Reader, client_factory: list[FifoClient]
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_marker(fifo, pid=dead.pid)
    client = fifo_client(client_factory, fifo)
    client.send(acquire())
    assert not client.persistent
    assert reader.requests()[0].mono is None


@pytest.mark.process
def test_a_path_that_is_not_a_fifo_fails_at_once(
    tmp_path: Path, client_factory: list[FifoClient]
) -> None:
    path = tmp_path / "regular"
    path.write_bytes(b"")
    client = fifo_client(client_factory, path, connect_timeout=30)
    started = time.monotonic()
    with pytest.raises(ServerUnavailableError, match="not a FIFO"):
        client.send(acquire())
    assert time.monotonic() - started < SLACK
    assert path.read_bytes() == b""


@pytest.mark.process
def test_threads_share_one_client_and_every_line_arrives_whole(
    aiotimer_fifo: Path, reader: Reader, client_factory: list[FifoClient]
) -> None:
    client = fifo_client(client_factory, aiotimer_fifo)
    got: list[Request] = []
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            got.extend(reader.requests())
            time.sleep(0.001)

    def work(n: int) -> None:
        for i in range(200):
            client.send(acquire(f"t{n}-{i}"))

    drainer = threading.Thread(target=drain)
    drainer.start()
    workers = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    drainer.join()
    got.extend(reader.requests())
    assert sorted(r.scope_id for r in got) == sorted(
        f"t{n}-{i}" for n in range(4) for i in range(200)
    )


# -- FIFO: no server ----------------------------------------------------------------------


@pytest.mark.process
@pytest.mark.parametrize("exists", [True, False], ids=["no-reader", "no-fifo"])
def test_no_server_raises_within_the_connect_timeout(
    fifo: Path, exists: bool, client_factory: list[FifoClient]
) -> None:
    path = fifo if exists else fifo.with_name("missing.fifo")
    client = fifo_client(client_factory, path, connect_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(ServerUnavailableError, match="aiotimer serve") as info:
        client.send(acquire())
    elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 0.3 + SLACK
    assert ("has no reader" if exists else "does not exist") in str(info.value)


@pytest.mark.process
@pytest.mark.asyncio
async def test_no_server_raises_within_the_connect_timeout_async(
    fifo: Path, client_factory: list[FifoClient]
) -> None:
    client = fifo_client(client_factory, fifo, connect_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(ServerUnavailableError):
        async with expires(after=1, client=client):
            pass
    assert 0.3 <= time.monotonic() - started < 0.3 + SLACK


@pytest.mark.process
def test_a_server_that_starts_late_is_waited_for(
    fifo: Path, client_factory: list[FifoClient]
) -> None:
    client = fifo_client(client_factory, fifo, connect_timeout=30)
    readers: list[Reader] = []
    timer = threading.Timer(0.2, lambda: readers.append(Reader(fifo)))
    timer.start()
    try:
        client.send(acquire())
    finally:
        timer.join()
    assert [r.scope_id for r in readers[0].requests()] == ["s"]
    readers[0].close()


# -- FIFO: full pipe ----------------------------------------------------------------------


@pytest.mark.process
def test_full_pipe_sync_raises_backpressure_after_the_write_timeout(
    aiotimer_fifo: Path, reader: Reader, client_factory: list[FifoClient]
) -> None:
    client = fifo_client(client_factory, aiotimer_fifo, write_timeout=0.3)
    client.send(acquire("first"))
    fill(aiotimer_fifo)
    started = time.monotonic()
    with pytest.raises(ClientBackpressureError, match="stayed full"):
        client.send(acquire("second"))
    assert 0.3 <= time.monotonic() - started < 0.3 + SLACK


@pytest.mark.process
def test_full_pipe_sync_proceeds_when_the_reader_catches_up(
    aiotimer_fifo: Path, reader: Reader, client_factory: list[FifoClient]
) -> None:
    client = fifo_client(client_factory, aiotimer_fifo, write_timeout=30)
    client.send(acquire("first"))  # connected
    assert [r.scope_id for r in reader.requests()] == ["first"]
    filled = fill(aiotimer_fifo)

    def catch_up() -> None:  # read exactly the filler: never the client's line
        left = filled
        while left:
            left -= len(os.read(reader.fd, left))

    timer = threading.Timer(0.2, catch_up)
    timer.start()
    try:
        client.send(acquire("second"))
    finally:
        timer.join()
    assert [r.scope_id for r in reader.requests()] == ["second"]


@pytest.mark.process
@pytest.mark.asyncio
async def test_full_pipe_async_awaits_writability(
    aiotimer_fifo: Path, reader: Reader, client_factory: list[FifoClient]
) -> None:
    client = fifo_client(client_factory, aiotimer_fifo, write_timeout=30)
    client.send(acquire("first"))
    fill(aiotimer_fifo)
    ticks = 0

    async def ticker() -> None:  # proves the loop is not blocked while the client waits
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        sends = [asyncio.ensure_future(client.send_async(acquire(f"w{i}"))) for i in range(3)]
        await anyio.sleep(0.2)
        assert not any(s.done() for s in sends)
        reader.read()  # make room
        with anyio.fail_after(SLACK + 5):
            await asyncio.gather(*sends)
        tg.cancel_scope.cancel()
    assert ticks >= 5
    assert sorted(r.scope_id for r in reader.requests()) == ["w0", "w1", "w2"]


@pytest.mark.process
@pytest.mark.asyncio
async def test_full_pipe_async_gives_up_after_the_write_timeout(
    aiotimer_fifo: Path, reader: Reader, client_factory: list[FifoClient]
) -> None:
    client = fifo_client(client_factory, aiotimer_fifo, write_timeout=0.3)
    client.send(acquire("first"))
    fill(aiotimer_fifo)
    started = time.monotonic()
    with pytest.raises(ClientBackpressureError):
        await client.send_async(acquire("second"))
    assert 0.3 <= time.monotonic() - started < 0.3 + SLACK


# -- FIFO: server restart -----------------------------------------------------------------


@pytest.mark.process
@pytest.mark.parametrize("recreate", [False, True], ids=["same-fifo", "new-fifo"])
def test_reconnects_after_a_restart_and_resends_open_scopes(
    aiotimer_fifo: Path, recreate: bool, client_factory: list[FifoClient]
) -> None:
    client = fifo_client(client_factory, aiotimer_fifo, connect_timeout=30)
    client.marker_check_interval = 0.0  # check the marker on every request
    first = Reader(aiotimer_fifo)
    client.send(acquire("open"))
    client.send(acquire("done"))
    client.send(release("done"))
    assert len(first.requests()) == 3
    first.close()  # the server goes away ...
    if recreate:
        aiotimer_fifo.unlink()
        os.mkfifo(aiotimer_fifo, 0o600)
    else:
        # The client's descriptor keeps the old pipe alive, so it sees no EPIPE: only
        # the new server's marker tells it that the reader changed.
        Path(str(aiotimer_fifo) + MARKER_SUFFIX).unlink()
        write_marker(aiotimer_fifo, pid=os.getppid())
    second = Reader(aiotimer_fifo)  # ... and a new one starts, empty
    try:
        client.send(acquire("new"))
        got = [(r.scope_id, r.is_release) for r in second.requests()]
    finally:
        second.close()
    # The still-open block is re-registered before the new request; "done" is not.
    assert got[0] == ("open", False)
    assert got[-1] == ("new", False)
    assert ("done", False) not in got


@pytest.mark.process
def test_forked_child_uses_its_own_descriptor(
    aiotimer_fifo: Path, reader: Reader, client_factory: list[FifoClient]
) -> None:
    client = fifo_client(client_factory, aiotimer_fifo)
    client.send(acquire("parent"))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = not client.persistent
        with contextlib.suppress(BaseException), expires(10, scope="child", client=client):
            ok = ok and client.persistent
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    got = reader.requests()
    assert [(r.scope_id, r.pid) for r in got] == [
        ("parent", os.getpid()),
        ("child", pid),
        ("child", pid),
    ]
    client.send(release("parent"))  # the parent's descriptor still works
    assert reader.requests()[0].scope_id == "parent"


# -- FIFO: the hot path of expires() blocks ----------------------------------------------


def lines_of(data: bytes) -> list[bytes]:
    return [line + b"\n" for line in data.split(b"\n")[:-1]]


def assert_each_line_is_encode_of_itself(data: bytes) -> list[Request]:
    """Every line is byte for byte what encode() writes for the request it decodes to."""
    got = []
    for line in lines_of(data):
        (req,) = LineDecoder().feed(line).requests
        assert encode(req) == line
        got.append(req)
    return got


@pytest.mark.process
@pytest.mark.asyncio
async def test_expires_blocks_write_exactly_the_bytes_of_encode(
    aiotimer_fifo: Path, reader: Reader, client_factory: list[FifoClient]
) -> None:
    client = fifo_client(client_factory, aiotimer_fifo)
    with expires(5, scope="sync", client=client):
        pass
    assert client.persistent  # the rest goes through the descriptor's fast path
    with expires(5, scope='tricky "é\\ scope', client=client, signal=15):
        pass
    async with expires(5, client=client) as block:
        pass
    got = assert_each_line_is_encode_of_itself(reader.read())
    pid = os.getpid()
    assert [(r.pid, r.scope_id, r.is_release, r.signal) for r in got] == [
        (pid, "sync", False, 9),
        (pid, "sync", True, 0),
        (pid, 'tricky "é\\ scope', False, 15),
        (pid, 'tricky "é\\ scope', True, 0),
        (pid, block.scope, False, 9),
        (pid, block.scope, True, 0),
    ]
    assert block.deadline is not None
    assert got[4].mono == block.deadline + DEFAULT_KILL_AFTER  # the server's tier
    assert abs(got[4].expiration_time - (time.time() + 5 + DEFAULT_KILL_AFTER)) < SLACK


class _CountingFifoClient(FifoClient):
    """A subclass that counts both paths: the fast path must still be taken, through
    the protocol's ``send_nowait`` (so a subclass can also wrap it)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.slow: list[Request] = []
        self.fast: list[str] = []

    def send_nowait(  # noqa: PLR0917
        self,
        scope_id: str,
        expiration_time: float,
        signal: int | None = None,
        mono: float | None = None,
        dump: bool = False,
        kill_after: float = 0.0,
        cancelled: bool = False,
    ) -> bool:
        self.fast.append(scope_id)
        return super().send_nowait(
            scope_id, expiration_time, signal, mono, dump, kill_after, cancelled
        )

    def send(self, request: Request) -> None:
        self.slow.append(request)
        super().send(request)

    async def send_async(self, request: Request) -> None:
        self.slow.append(request)
        await super().send_async(request)


@pytest.mark.process
@pytest.mark.asyncio
async def test_a_subclass_keeps_the_fast_path(aiotimer_fifo: Path, reader: Reader) -> None:
    client = _CountingFifoClient(aiotimer_fifo)
    client.marker_check_interval = 3600.0  # no periodic check during the test
    try:
        with expires(5, scope="first", client=client):  # connects: the slow path
            pass
        assert [r.scope_id for r in client.slow] == ["first"]
        client.slow.clear()
        client.fast.clear()
        for _ in range(3):
            with expires(5, client=client):
                pass
            async with expires(5, client=client):
                pass
        assert client.slow == []
        assert [r.scope_id for r in reader.requests()][2:] == client.fast  # all 12 lines
    finally:
        client.close()


@pytest.mark.process
def test_generic_requests_keep_their_exact_bytes(
    aiotimer_fifo: Path, reader: Reader, client_factory: list[FifoClient]
) -> None:
    """Requests the fast path does not write as given (extension keys, another pid, no
    mono, a release with a signal) take the slow path, which writes encode(request)."""
    client = fifo_client(client_factory, aiotimer_fifo)
    pid = os.getpid()
    requests = [
        acquire("plain"),
        Request(pid, "ext", 1_763_712_010.5, 15, mono=1010.5, grace=2.5, group=True, dump=True),
        Request(pid + 1, "other", 1_763_712_010.5, 9, mono=1010.5),
        acquire("nomono", mono=False),
        Request(pid, "nomono", -7.5, 9),
        release("plain"),
        release("never-acquired"),
    ]
    for request in requests:
        client.send(request)
    # The client's own acquires carry its start time (see docs/protocol.md).
    start_time = own_start_time()
    stamped = [
        msgspec.structs.replace(r, start_time=start_time)
        if r.pid == pid and not r.is_release
        else r
        for r in requests
    ]
    assert reader.read() == b"".join(encode(r) for r in stamped)


@pytest.mark.process
def test_blocks_sharing_a_scope_release_it_twice(
    aiotimer_fifo: Path, reader: Reader, client_factory: list[FifoClient]
) -> None:
    client = fifo_client(client_factory, aiotimer_fifo)
    with expires(5, scope="shared", client=client), expires(6, scope="shared", client=client):
        pass
    got = assert_each_line_is_encode_of_itself(reader.read())
    assert [(r.scope_id, r.is_release) for r in got] == [
        ("shared", False),
        ("shared", False),
        ("shared", True),
        ("shared", True),  # untracked by then: encoded afresh, same bytes
    ]


@pytest.mark.process
def test_a_block_left_in_a_forked_child_releases_with_the_childs_pid(
    aiotimer_fifo: Path, reader: Reader, client_factory: list[FifoClient]
) -> None:
    client = fifo_client(client_factory, aiotimer_fifo)
    block = expires(10, scope="straddles", client=client)
    block.__enter__()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        with contextlib.suppress(BaseException):
            block.__exit__(None, None, None)
            code = 0
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    block.__exit__(None, None, None)
    got = assert_each_line_is_encode_of_itself(reader.read())
    assert [(r.pid, r.is_release) for r in got] == [
        (os.getpid(), False),
        (pid, True),  # the child's release cannot end the parent's timer
        (os.getpid(), True),
    ]


@pytest.mark.process
def test_releases_skip_the_marker_check(
    aiotimer_fifo: Path,
    reader: Reader,
    client_factory: list[FifoClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only acquires pay for the marker check: a release that reaches a new server is
    ignored there, and the next acquire runs the check and the replay anyway."""
    client = fifo_client(client_factory, aiotimer_fifo)
    client.marker_check_interval = 0.0
    reads: list[str] = []
    real_read_marker = _fifo_link.read_live_marker

    def counting(path: str, *, owner: int | None = None) -> object:
        reads.append(path)
        return real_read_marker(path, owner=owner)

    monkeypatch.setattr(_fifo_peer, "read_live_marker", counting)  # on opening
    monkeypatch.setattr(_fifo_link, "read_live_marker", counting)  # on rechecking
    with expires(5, scope="a", client=client):
        acquire_reads = len(reads)
        assert acquire_reads >= 1
    assert len(reads) == acquire_reads
    assert [r.is_release for r in reader.requests()] == [False, True]


@pytest.mark.process
def test_an_open_block_is_replayed_byte_for_byte_after_a_restart(
    aiotimer_fifo: Path, client_factory: list[FifoClient]
) -> None:
    client = fifo_client(client_factory, aiotimer_fifo)
    client.marker_check_interval = 0.0
    first = Reader(aiotimer_fifo)
    try:
        with expires(30, client=client) as block:
            original = first.read()
            Path(str(aiotimer_fifo) + MARKER_SUFFIX).unlink()
            write_marker(aiotimer_fifo, pid=os.getppid())  # a new server, same FIFO
            with expires(5, scope="next", client=client):
                pass
        replayed = lines_of(first.read())
    finally:
        first.close()
    assert replayed[0] == original  # the open block, re-registered as it was sent
    decoded = [LineDecoder().feed(line).requests[0] for line in replayed]
    assert decoded[0].scope_id == block.scope
    assert {r.scope_id for r in decoded[1:-1]} == {"next"}
    assert (decoded[-1].scope_id, decoded[-1].is_release) == (block.scope, True)


# -- queue and in-process clients ---------------------------------------------------------


def test_queue_client_sends_torch_shaped_requests() -> None:
    q: queue.Queue[QueueRequest] = queue.Queue()
    client = QueueClient(q, signal=15)
    with expires(after=5, scope="q", client=client):
        pass
    acq, rel = q.get_nowait(), q.get_nowait()
    assert (acq.worker_id, acq.scope_id, acq.signal) == (os.getpid(), "q", 15)
    assert acq.expiration_time > time.time() and acq.mono is not None
    assert (rel.scope_id, rel.expiration_time) == ("q", -1)
    assert pickle.loads(pickle.dumps(acq)) == acq


def test_queue_client_full_queue_raises_backpressure() -> None:
    q: queue.Queue[QueueRequest] = queue.Queue(maxsize=1)
    client = QueueClient(q, write_timeout=0.2)
    client.send(acquire("a"))
    started = time.monotonic()
    with pytest.raises(ClientBackpressureError):
        client.send(acquire("b"))
    assert 0.2 <= time.monotonic() - started < 0.2 + SLACK


@pytest.mark.asyncio
async def test_queue_client_async_waits_for_room() -> None:
    q: queue.Queue[QueueRequest] = queue.Queue(maxsize=1)
    client = QueueClient(q, write_timeout=30)
    await client.send_async(acquire("a"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.send_async, acquire("b"))
        await settle()  # the sender waits (by awaiting) for room
        assert q.qsize() == 1
        assert q.get_nowait().scope_id == "a"
    assert q.get_nowait().scope_id == "b"


def test_delivered_late_moves_only_an_acquires_deadlines() -> None:
    a, r = acquire("s"), release("s")
    assert delivered_late(a, 0.0) is a and delivered_late(r, 2.5) is r
    moved = delivered_late(a, 2.5)
    assert moved.mono is not None and a.mono is not None
    assert (moved.expiration_time, moved.mono) == (a.expiration_time + 2.5, a.mono + 2.5)
    assert delivered_late(acquire("s", mono=False), 1.0).mono is None


def test_queue_client_times_a_late_acquire_from_its_delivery() -> None:
    q: queue.Queue[QueueRequest] = queue.Queue(maxsize=1)
    q.put(QueueRequest(1, "blocker", -1))
    client = QueueClient(q, write_timeout=30)
    room = threading.Timer(0.3, q.get)
    room.start()
    try:
        started = time.monotonic()
        client.send(acquire("late"))
        waited = time.monotonic() - started
    finally:
        room.join()
    item = q.get_nowait()
    sent = acquire("late")
    assert item.mono is not None and sent.mono is not None
    assert waited >= 0.3
    assert 0.3 <= item.mono - sent.mono <= waited
    assert item.expiration_time - sent.expiration_time == pytest.approx(item.mono - sent.mono)


def test_in_process_client_submits_requests() -> None:
    class Server:
        def __init__(self) -> None:
            self.got: list[Request] = []

        def submit(self, request: Request) -> None:
            self.got.append(request)

    server = Server()
    client = InProcessClient(server)
    assert isinstance(client, TimerClient)
    with expires(after=1, scope="x", client=client):
        pass
    assert [r.is_release for r in server.got] == [False, True]
    assert server.got[0].mono is not None and server.got[0].signal == 9


# -- configuration and discovery ----------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.delenv(ENV_FIFO, raising=False)
    monkeypatch.delenv(TORCH_ENV_FIFO, raising=False)
    configure(None)
    yield monkeypatch
    configure(None)


def test_nothing_configured_says_how_to_fix_it(clean_env: pytest.MonkeyPatch) -> None:
    assert not timer_server_configured()
    with pytest.raises(NotConfiguredError) as info:
        current_client()
    message = str(info.value)
    assert "configure(" in message and ENV_FIFO in message and "aiotimer serve" in message
    with pytest.raises(NotConfiguredError), expires(after=1):
        pass


def test_discovery_prefers_aiotimer_variable_over_torch(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv(TORCH_ENV_FIFO, str(tmp_path / "torch.fifo"))
    found = current_client()
    assert isinstance(found, FifoClient) and found.path == str(tmp_path / "torch.fifo")
    assert current_client() is found  # one cached client per path
    clean_env.setenv(ENV_FIFO, str(tmp_path / "aiotimer.fifo"))
    found = current_client()
    assert isinstance(found, FifoClient) and found.path == str(tmp_path / "aiotimer.fifo")


def count_environ_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """From now on, every variable read through ``os.environ`` is appended to the list."""
    environ_class = type(os.environ)
    real_getitem = environ_class.__getitem__
    reads: list[str] = []

    def counting(self: os._Environ[str], key: str) -> str:
        reads.append(key)
        return real_getitem(self, key)

    monkeypatch.setattr(environ_class, "__getitem__", counting)
    return reads


def test_discovery_reads_the_environment_only_when_it_changes(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A block through discovery reads no variable while nothing changed; setting,
    changing or removing a variable is seen by the very next block."""
    reads = count_environ_reads(clean_env)
    clean_env.setenv(ENV_FIFO, str(tmp_path / "a.fifo"))
    first = current_client()
    assert isinstance(first, FifoClient) and first.path == str(tmp_path / "a.fifo")
    reads.clear()
    for _ in range(100):
        assert current_client() is first
    assert reads == []
    clean_env.setenv(ENV_FIFO, str(tmp_path / "b.fifo"))
    second = current_client()
    assert isinstance(second, FifoClient) and second.path == str(tmp_path / "b.fifo")
    clean_env.setenv(ENV_FIFO, str(tmp_path / "a.fifo"))
    assert current_client() is first  # one client per path, kept
    clean_env.delenv(ENV_FIFO)
    with pytest.raises(NotConfiguredError):
        current_client()
    clean_env.setenv(TORCH_ENV_FIFO, str(tmp_path / "t.fifo"))
    third = current_client()
    assert isinstance(third, FifoClient) and third.path == str(tmp_path / "t.fifo")


@pytest.mark.process
def test_a_forked_child_reads_the_environment_again(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv(ENV_FIFO, str(tmp_path / "a.fifo"))
    current_client()
    reads = count_environ_reads(clean_env)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = False
        with contextlib.suppress(BaseException):
            found = current_client()
            ok = reads == [ENV_FIFO] and isinstance(found, FifoClient)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert reads == []


def test_under_timer_server_needs_an_existing_fifo(
    clean_env: pytest.MonkeyPatch, fifo: Path, tmp_path: Path
) -> None:
    clean_env.setenv(ENV_FIFO, str(tmp_path / "missing"))
    assert not timer_server_configured()
    clean_env.setenv(ENV_FIFO, str(fifo))
    assert timer_server_configured()
    clean_env.delenv(ENV_FIFO)
    configure(QueueClient(queue.Queue()), dump_hook=False)
    assert timer_server_configured()


def test_configure_is_process_wide_and_use_client_is_per_thread(
    clean_env: pytest.MonkeyPatch,
) -> None:
    shared, mine, theirs = (QueueClient(queue.Queue()) for _ in range(3))
    configure(shared, dump_hook=False)
    seen: dict[str, TimerClient] = {}
    barrier = threading.Barrier(2)

    def other_thread() -> None:
        seen["before"] = current_client()
        with use_client(theirs):
            barrier.wait()
            seen["inside"] = current_client()
            barrier.wait()

    t = threading.Thread(target=other_thread)
    t.start()
    with use_client(mine):
        barrier.wait()
        seen["main"] = current_client()
        barrier.wait()
    t.join()
    assert seen == {"before": shared, "inside": theirs, "main": mine}
    assert current_client() is shared


@pytest.mark.asyncio
async def test_use_client_is_per_task(clean_env: pytest.MonkeyPatch) -> None:
    clients = [QueueClient(queue.Queue()) for _ in range(3)]
    configure(clients[0], dump_hook=False)
    seen: list[TimerClient] = []

    async def task(client: TimerClient) -> None:
        with use_client(client):
            await anyio.sleep(0.01)
            seen.append(current_client())
            assert current_client() is client

    async with anyio.create_task_group() as tg:
        tg.start_soon(task, clients[1])
        tg.start_soon(task, clients[2])
    assert sorted(map(id, seen)) == sorted(map(id, clients[1:]))
    assert current_client() is clients[0]


def test_connect_timeout_must_be_sane(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        FifoClient(tmp_path / "f", connect_timeout=-1)
    with pytest.raises(ValueError):
        FifoClient(tmp_path / "f", write_timeout=float("inf"))


@pytest.mark.process
@pytest.mark.timeout(60)
def test_bench_client_quick_runs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client benchmark still runs and prints its verdicts (no speed is asserted)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent))
    bench = importlib.import_module("benchmarks.bench_client")
    assert bench.main(["--quick", "--no-torch", "--blocks", "100", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "aiotimer: async with expires(), default scope" in out
    assert "target" in out and "no reference measured" in out
    assert "x two bare os.write (" in out  # the sync block against its floor
    assert "x asyncio.timeout() + two bare os.write" in out  # the async one against its
    assert "sync block, where the " in out and "encoding both lines" in out


def test_errno_of_no_reader_is_enxio(fifo: Path) -> None:
    # The premise of the no-server logic: opening a FIFO for writing without a reader.
    with pytest.raises(OSError) as info:
        os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    assert info.value.errno == errno.ENXIO


HOOK_PROBE = """
import os, queue, signal, sys
from aiotimer import QueueClient, configure
from aiotimer.diagnostics import dump_path_for
configure(QueueClient(queue.Queue()), dump_hook=sys.argv[1] == "on")
handler = signal.getsignal(signal.SIGUSR1)
print("hooked" if handler not in (signal.SIG_DFL, None) else "default")
print(dump_path_for(os.getpid()).exists())
"""


@pytest.mark.process
@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("flag", "expected"), [("on", ["hooked", "True"]), ("off", ["default", "False"])]
)
def test_configure_installs_the_stack_dump_hook_unless_told_not_to(
    flag: str, expected: list[str], tmp_path: Path
) -> None:
    env = {**os.environ, "AIOTIMER_DUMP_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", HOOK_PROBE, flag],
        env=env,
        capture_output=True,
        text=True,
        timeout=25,
        check=True,
    )
    assert out.stdout.split() == expected
