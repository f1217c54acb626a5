"""SocketSource against real Unix sockets and real client processes: the kernel names
the peer, so a client can only register timers for itself."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import stat
import subprocess
import sys
import textwrap

import anyio
import pytest

from aiotimer._edges.procfs import read_start_time
from aiotimer.cli import build_parser, main
from aiotimer.cli._serve import socket_path
from aiotimer.errors import SourceError
from aiotimer.events import (
    Event,
    RequestRejected,
    TimerAcquired,
    TimerReleased,
    WorkerReaped,
)
from aiotimer.server import TimerServer
from aiotimer.sources._budget import LINES_PER_STEP
from aiotimer.sources.socket import SocketSource, _Connection, peer_credentials
from aiotimer.testing import RecordingSink, running_source, settle, wait_until
from aiotimer.wire import MARKER_SUFFIX, Request, encode

pytestmark = [pytest.mark.process, pytest.mark.timeout(30), pytest.mark.asyncio]


@pytest.fixture
def sock_path(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "timer.sock"


def connect(path: pathlib.Path) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.connect(os.fspath(path))
    return conn


def line(pid: int, scope: str = "s", **kw: object) -> bytes:
    return encode(Request(pid, scope, 1e10, 9, **kw))  # type: ignore[arg-type]


async def test_binds_0600_and_removes_the_socket(sock_path: pathlib.Path) -> None:
    source = SocketSource(sock_path)
    assert source.name == f"socket:{sock_path}"
    async with running_source(source, RecordingSink()):
        st = os.lstat(sock_path)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600
    assert not sock_path.exists()


async def test_accepts_its_own_pid_stamped_with_its_start_time(sock_path: pathlib.Path) -> None:
    sink = RecordingSink()
    async with running_source(SocketSource(sock_path), sink):
        with connect(sock_path) as conn:
            conn.sendall(line(os.getpid(), "a") + line(os.getpid(), "b")[:10])
            conn.sendall(line(os.getpid(), "b")[10:])
            await wait_until(lambda: len(sink.requests) == 2)
    assert [r.scope_id for r in sink.requests] == ["a", "b"]
    assert {r.start_time for r in sink.requests} == {read_start_time(os.getpid())}
    assert sink.rejections == []


async def test_a_message_of_short_garbage_lines_is_decoded_a_step_at_a_time(
    sock_path: pathlib.Path,
) -> None:
    sink = RecordingSink()
    async with running_source(SocketSource(sock_path), sink):
        with connect(sock_path) as conn:
            conn.sendall(b"x\n" * 8192 + line(os.getpid(), "after"))  # one message
            await wait_until(lambda: len(sink.requests) == 1)
    sizes = [len(batch.rejections) for batch, _ in sink.batches]
    assert sum(sizes) == 8192 and max(sizes) <= 2 * LINES_PER_STEP
    assert [r.scope_id for r in sink.requests] == ["after"]


async def test_a_client_cannot_name_another_pid(sock_path: pathlib.Path) -> None:
    """A separate client process names its parent (this test) and itself: only its own
    request is accepted."""
    sink = RecordingSink()
    client = textwrap.dedent(
        f"""
        import os, socket
        from aiotimer.wire import MARKER_SUFFIX, Request, encode
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect({os.fspath(sock_path)!r})
        conn.sendall(encode(Request(os.getppid(), "forged", 1e10, 9)))
        conn.sendall(encode(Request(os.getpid(), "own", 1e10, 9)))
        print(os.getpid(), flush=True)
        conn.close()
        """
    )
    async with running_source(SocketSource(sock_path), sink):
        proc = await anyio.run_process([sys.executable, "-c", client])
        client_pid = int(proc.stdout)
        await wait_until(lambda: len(sink.requests) + len(sink.rejections) == 2)
    assert [(r.pid, r.scope_id) for r in sink.requests] == [(client_pid, "own")]
    assert len(sink.rejections) == 1
    assert (
        f"pid {os.getpid()} is not the connected process (pid {client_pid})" in (sink.rejections[0])
    )


async def test_a_start_time_other_than_the_peers_is_rejected(sock_path: pathlib.Path) -> None:
    sink = RecordingSink()
    mine = read_start_time(os.getpid())
    assert mine is not None
    async with running_source(SocketSource(sock_path), sink):
        with connect(sock_path) as conn:
            conn.sendall(line(os.getpid(), "old", start_time=mine - 1))
            conn.sendall(line(os.getpid(), "same", start_time=mine))
            await wait_until(lambda: len(sink.requests) + len(sink.rejections) == 2)
    assert [r.scope_id for r in sink.requests] == ["same"]
    assert "is not the connected process's" in sink.rejections[0]


async def test_connections_do_not_mix_partial_lines(sock_path: pathlib.Path) -> None:
    sink = RecordingSink()
    one, two = line(os.getpid(), "one"), line(os.getpid(), "two")
    async with running_source(SocketSource(sock_path), sink):
        with connect(sock_path) as a, connect(sock_path) as b:
            a.sendall(one[:20])
            b.sendall(two[:30])
            await settle()
            b.sendall(two[30:])
            a.sendall(one[20:])
            await wait_until(lambda: len(sink.requests) == 2)
        # A peer that leaves mid-line costs only that line.
        with connect(sock_path) as c:
            c.sendall(one[:15])
        await wait_until(lambda: len(sink.rejections) == 1)
    assert sorted(r.scope_id for r in sink.requests) == ["one", "two"]
    assert sink.rejections == ["incomplete line at end of stream"]


async def test_claims_only_a_stale_socket_of_its_own(sock_path: pathlib.Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stale.bind(os.fspath(sock_path))
    stale.close()  # the path stays, nobody listens: replaced
    async with running_source(SocketSource(sock_path), RecordingSink()):
        with pytest.raises(SourceError, match="served by another process"):
            await SocketSource(sock_path).serve(RecordingSink())
    regular = sock_path.with_name("file")
    regular.write_text("keep me")
    with pytest.raises(SourceError, match="not a socket"):
        await SocketSource(regular).serve(RecordingSink())
    assert regular.read_text() == "keep me"


async def test_peer_credentials_of_a_socketpair() -> None:
    a, b = socket.socketpair()
    with a, b:
        peer = peer_credentials(a)
    assert (peer.pid, peer.uid, peer.start_time) == (
        os.getpid(),
        os.getuid(),
        read_start_time(os.getpid()),
    )


@pytest.mark.parametrize("size", [1, 7])
async def test_a_peer_that_exits_before_it_is_read_is_still_its_own(
    sock_path: pathlib.Path, size: int
) -> None:
    """Lines written by a client that exited before the server read them are still
    stamped with that client's start time (so a recycled pid is never pinned)."""
    sink = RecordingSink()
    client = textwrap.dedent(
        f"""
        import os, socket
        from aiotimer.wire import MARKER_SUFFIX, Request, encode
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect({os.fspath(sock_path)!r})
        for i in range({size}):
            conn.sendall(encode(Request(os.getpid(), f"s{{i}}", 1e10, 9)))
        print(os.getpid(), flush=True)
        """
    )
    async with running_source(SocketSource(sock_path), sink):
        proc = await anyio.run_process([sys.executable, "-c", client])
        # Either the peer was identified at accept (every line accepted, stamped) or it
        # had exited by then and the connection is refused whole: never accepted
        # without its start time.
        await wait_until(lambda: len(sink.requests) == size or bool(sink.rejections))
    pid = int(proc.stdout)
    if sink.rejections:
        assert sink.requests == []
        assert sink.rejections == [sink.rejections[0]]
        assert "no identifiable peer" in sink.rejections[0]
    else:
        assert all(r.pid == pid and r.start_time is not None for r in sink.requests)


# -- through a whole server ----------------------------------------------------------------

# A worker that registers over the socket: a forged timer for the pid in argv[2] (a
# bystander), then its own, then hangs past both deadlines.
SOCKET_WORKER = r"""
import os, socket, sys, time
from aiotimer.wire import MARKER_SUFFIX, Request, encode
conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
conn.connect(sys.argv[1])
deadline = time.time() + 0.2
conn.sendall(encode(Request(int(sys.argv[2]), "forged", deadline, 9)))
conn.sendall(encode(Request(os.getpid(), "own", deadline, 9, mono=time.monotonic() + 0.2)))
time.sleep(30)
"""


@pytest.mark.timeout(30)
async def test_a_socket_client_is_reaped_and_cannot_name_a_bystander(
    tmp_path: pathlib.Path,
) -> None:
    events: list[Event] = []
    fifo, sock = tmp_path / "t.fifo", tmp_path / "t.sock"
    bystander = subprocess.Popen(["sleep", "30"])
    worker = None
    try:
        async with TimerServer(fifo=fifo, socket=sock, on_event=events.append):
            marker = json.loads(fifo.with_name("t.fifo" + MARKER_SUFFIX).read_text())
            assert marker["socket"] == os.fspath(sock)
            worker = subprocess.Popen(
                [sys.executable, "-c", SOCKET_WORKER, os.fspath(sock), str(bystander.pid)]
            )
            with anyio.fail_after(20):
                while worker.poll() is None:
                    await anyio.sleep(0.02)
            await wait_until(lambda: any(isinstance(e, WorkerReaped) for e in events))
        assert worker.returncode == -signal.SIGKILL
        assert bystander.poll() is None
        reaped = [e.pid for e in events if isinstance(e, WorkerReaped)]
        assert reaped == [worker.pid]
        rejected = [e.reason for e in events if isinstance(e, RequestRejected)]
        assert any(f"pid {bystander.pid} is not the connected process" in r for r in rejected)
    finally:
        for proc in (bystander, worker):
            if proc is not None:
                proc.kill()
                proc.wait()


async def test_serve_socket_option(tmp_path: pathlib.Path) -> None:
    fifo = os.fspath(tmp_path / "t.fifo")
    parse = build_parser().parse_args
    assert socket_path(parse(["serve", "--fifo", fifo])) is None
    assert socket_path(parse(["serve", "--fifo", fifo, "--socket"])) == fifo + ".sock"
    other = os.fspath(tmp_path / "other.sock")
    assert socket_path(parse(["serve", "--fifo", fifo, "--socket", other])) == other


async def test_the_socket_opens_to_others_without_opening_the_fifo(
    tmp_path: pathlib.Path,
) -> None:
    fifo, sock = tmp_path / "t.fifo", tmp_path / "t.sock"
    async with TimerServer(fifo=fifo, socket=sock, socket_mode=0o666, journal=False):
        assert stat.S_IMODE(os.lstat(fifo).st_mode) == 0o600
        assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o666
    args = build_parser().parse_args(
        ["serve", "--fifo", os.fspath(fifo), "--socket", "--socket-mode", "0666"]
    )
    assert (args.mode, args.socket_mode) == (0o600, 0o666)


async def test_a_socket_mode_without_a_socket_is_a_usage_error(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--fifo", os.fspath(tmp_path / "t.fifo"), "--socket-mode", "0666"]) == 2
    assert capsys.readouterr().err == (
        "aiotimer serve: error: --socket-mode needs --socket (see aiotimer serve --help)\n"
    )


# -- aiotimer's client prefers the socket --------------------------------------------------

CLIENT_WORKER = r"""
import sys, time
from aiotimer import FifoClient, expires
client = FifoClient(sys.argv[1])
with expires(after=0.2, scope="released", client=client):
    pass
print("released", flush=True)
with expires(after=0.2, scope="hung", client=client):
    time.sleep(30)
"""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("offer_socket", [True, False], ids=["socket", "fifo-fallback"])
async def test_the_client_prefers_the_offered_socket_and_falls_back_to_the_fifo(
    tmp_path: pathlib.Path, offer_socket: bool
) -> None:
    events: list[Event] = []
    fifo, sock = tmp_path / "t.fifo", tmp_path / "t.sock"
    server = TimerServer(fifo=fifo, socket=sock, on_event=events.append, request_events=True)
    async with server:
        if not offer_socket:  # the marker names a socket nobody serves any more
            sock.unlink()
        env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).parent.parent)}
        worker = await anyio.open_process(
            [sys.executable, "-c", CLIENT_WORKER, os.fspath(fifo)], env=env
        )
        async with worker:
            with anyio.fail_after(20):
                assert await worker.wait() == -signal.SIGKILL
        await wait_until(lambda: any(isinstance(e, WorkerReaped) for e in events))
    acquired = [e for e in events if isinstance(e, TimerAcquired)]
    assert [e.scope_id for e in acquired] == ["released", "hung"]
    expected = f"socket:{sock}" if offer_socket else f"fifo:{fifo}"
    assert {e.source for e in acquired} == {expected}
    released = [e for e in events if isinstance(e, TimerReleased)]
    assert [(e.scope_id, e.source) for e in released] == [("released", expected)]
    [reaped] = [e for e in events if isinstance(e, WorkerReaped)]
    assert reaped.pid == worker.pid


async def test_a_connection_is_drained_only_when_its_own_peer_is_due() -> None:
    """Every request a connection carries names its peer (others are rejected), so
    before an expiry it is read only when the peer is one of the due workers."""
    server_end, client_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with server_end, client_end:
        server_end.setblocking(False)
        me = os.getpid()
        connection = _Connection(server_end, peer_credentials(server_end), "s", 4096)
        client_end.send(encode(Request(me, "a", -1, 0)))
        connection.hold()
        assert connection.look({me + 1}) is False  # not due: left unread
        assert connection.look({me + 1, me}) is True
        batch = connection.step()
        assert batch is not None
        assert [(r.pid, r.scope_id) for r in batch.requests] == [(me, "a")]
        assert connection.step() is None  # nothing more queued
        client_end.send(encode(Request(me, "b", -1, 0)))
        assert connection.look(None) is False  # sent after the decision: the reader's
        connection.hold()
        assert connection.look(None) is True  # anyone: read it


async def test_a_connection_is_drained_up_to_what_was_queued_at_the_decision() -> None:
    """Messages the peer sends after the decision are not the drain's (its own flood
    cannot put off its reap); the connection's reader gets them."""
    server_end, client_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with server_end, client_end:
        server_end.setblocking(False)
        me = os.getpid()
        connection = _Connection(server_end, peer_credentials(server_end), "s", 4096)
        for i in range(20):
            client_end.send(encode(Request(me, f"b{i}", -1, 0)))
        connection.hold()
        assert connection.look({me})
        client_end.send(encode(Request(me, "after", -1, 0)))
        drained = []
        while (batch := connection.step()) is not None:
            drained += [r.scope_id for r in batch.requests]
        assert drained == [f"b{i}" for i in range(20)]
        batch = connection.receive()
        assert batch is not None and [r.scope_id for r in batch.requests] == ["after"]
