"""The control plane as its own failure domain, in process.

What an outsider can do to the control plane (fail its ``accept()``, hold connections
open, send nothing, hit a handler that raises) and what a crash of the plane does: each
stays in the plane, and a timer server on a fake clock keeps reaping meanwhile. Also the
layering: the server and the supervisor import nothing from the control plane.
"""

from __future__ import annotations

import ast
import errno
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel
import pytest
from _pids import fake_pid

import aiotimer
import aiotimer.control.metrics as control_metrics
import aiotimer.control.server as control_server
from aiotimer._edges.lifecycle import LifecycleState
from aiotimer._edges.limits import DescriptorReserve
from aiotimer.control import ControlClient, ControlPlane, Route
from aiotimer.control._http import HttpRequest, HttpResponse
from aiotimer.errors import ControlError
from aiotimer.server import TimerServer
from aiotimer.testing import FakeClock, MemorySource, RecordingReaper, settle, wait_until

pytestmark = [pytest.mark.timeout(30)]

PACKAGE = Path(aiotimer.__file__).parent
KILL = 9
_T = TypeVar("_T")


async def call(fn: Callable[[], _T]) -> _T:
    """Run the blocking client call ``fn`` in a thread, as another process would."""
    return await anyio.to_thread.run_sync(fn)


class Rig:
    """A timer server on a fake clock with a recording reaper, and its control plane."""

    def __init__(
        self, server: TimerServer, plane: ControlPlane, clock: FakeClock, reaper: RecordingReaper
    ) -> None:
        self.server, self.plane, self.clock, self.reaper = server, plane, clock, reaper
        self.reaped = 0

    async def still_reaps(self) -> None:
        """A timer set now expires and its worker is signalled, on the fake clock."""
        pid = fake_pid(5000 + self.reaped)  # see tests/_pids.py
        self.server.acquire(f"sentinel-{pid}", 5.0, pid=pid)
        await settle()
        self.clock.advance(5.0)
        await settle()
        self.reaped += 1
        assert (pid, KILL) in self.reaper.signals()
        assert self.server.state is LifecycleState.RUNNING


@asynccontextmanager
async def rig(path: Path | bool, **plane: Any) -> AsyncIterator[Rig]:
    clock, reaper = FakeClock(), RecordingReaper()
    server = TimerServer(sources=[MemorySource()], clock=clock, reaper=reaper)
    r = Rig(server, ControlPlane(server, path=path, **plane), clock, reaper)
    async with server, r.plane:
        yield r


def sock_path(tmp_path: Path) -> Path:
    return tmp_path / "ctl" / "http.sock"


# -- layering -------------------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, wherever the import statement is (functions and
    ``TYPE_CHECKING`` blocks included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("package", ["server", "supervisor"])
def test_the_server_and_supervisor_import_nothing_from_control(package: str) -> None:
    offending = {
        f"{py.relative_to(PACKAGE)}: {name}"
        for py in (PACKAGE / package).rglob("*.py")
        for name in _imports(py)
        if name == "aiotimer.control" or name.startswith("aiotimer.control.")
    }
    assert not offending
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, aiotimer.server, aiotimer.supervisor\n"
            "print(sorted(m for m in sys.modules if m.startswith('aiotimer.control')))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert loaded.stdout.strip() == "[]"


def test_the_supervisor_records_are_a_leaf() -> None:
    above = (
        "aiotimer.supervisor._supervisor",
        "aiotimer.supervisor._ranks",
        "aiotimer.supervisor._pool",
        "aiotimer.server._server",
        "aiotimer.control",
        "aiotimer.cluster",
    )
    names = _imports(PACKAGE / "supervisor" / "_records.py")
    assert not {n for n in names if n.startswith(above)}


def test_no_import_cycles() -> None:
    import grimp  # noqa: PLC0415 (the test extra has it)

    graph = grimp.build_graph("aiotimer", cache_dir=None)
    in_cycles = {
        tuple(sorted((module, imported)))
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if graph.chain_exists(importer=imported, imported=module)
    }
    assert not in_cycles
    for below in ("aiotimer.server", "aiotimer.supervisor"):
        assert not graph.chain_exists(importer=below, imported="aiotimer.control", as_packages=True)


# -- accept() failing -----------------------------------------------------------------------


class FailingListener(anyio.abc.SocketListener):
    """A real listener whose first ``failures`` accepts fail as the kernel's would."""

    def __init__(self, inner: anyio.abc.SocketListener, failures: int, shape: str) -> None:
        self.inner, self.failures, self.shape = inner, failures, shape
        self.calls = 0

    async def accept(self) -> anyio.abc.SocketStream:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            await anyio.lowlevel.checkpoint()
            emfile = OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            if self.shape == "oserror":  # asyncio's TCP listener
                raise emfile
            raise anyio.BrokenResourceError from emfile  # anyio's Unix listener
        return await self.inner.accept()

    async def aclose(self) -> None:
        await self.inner.aclose()

    @property
    def _raw_socket(self) -> socket.socket:
        return self.inner.extra(anyio.abc.SocketAttribute.raw_socket)


@pytest.mark.asyncio
@pytest.mark.parametrize("shape", ["oserror", "broken"])
async def test_the_plane_survives_accept_failing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    shape: str,
) -> None:
    listeners: list[FailingListener] = []
    real = control_server.create_unix_listener

    async def failing(path: Any, **kwargs: Any) -> anyio.abc.SocketListener:
        listeners.append(FailingListener(await real(path, **kwargs), 5, shape))
        return listeners[-1]

    monkeypatch.setattr(control_server, "create_unix_listener", failing)
    path = sock_path(tmp_path)
    with caplog.at_level(logging.WARNING, logger="aiotimer.control"):
        async with rig(path) as r:
            [listener] = listeners
            while listener.failures:  # the server reaps while accept() fails
                assert r.plane.state is LifecycleState.RUNNING
                await r.still_reaps()
                await anyio.sleep(0.01)
            await wait_until(lambda: listener.calls > 5)  # accepting for real again
            snap = await call(ControlClient(path, timeout=5).state)
            assert snap.server.state == "running"
            await r.still_reaps()
            assert r.plane.state is LifecycleState.RUNNING
    first = f"control socket {path}: accept() failed: EMFILE (Too many open files)"
    assert _tally(caplog, first, "accept failure") == (1, 5)  # one line, all counted


def _tally(caplog: pytest.LogCaptureFixture, line: str, kind: str) -> tuple[int, int]:
    """How many of the lines logged start with ``line``, and how many events those
    lines and the summaries of ``kind`` account for."""
    lines = [rec.getMessage() for rec in caplog.records]
    logged = [m for m in lines if m.startswith(line)]
    counted = [int(m.split(" more ")[0].rsplit(" ", 1)[1]) for m in lines if f" more {kind} " in m]
    return len(logged), len(logged) + sum(counted)


# -- caps and idle connections -----------------------------------------------------------------


async def _connect(r: Rig, kind: str) -> anyio.abc.SocketStream:
    if kind == "unix":
        assert r.plane.path is not None
        return await anyio.connect_unix(r.plane.path)
    assert r.plane.metrics_port is not None
    return await anyio.connect_tcp("127.0.0.1", r.plane.metrics_port)


async def _closed_by_peer(stream: anyio.abc.SocketStream, within: float) -> bool:
    """Whether the server closes ``stream`` within ``within`` seconds."""
    with anyio.move_on_after(within):
        try:
            data = await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return True
        raise AssertionError(f"unexpected data {data!r}")
    return False


def _get(r: Rig, kind: str, target: str) -> bytes:
    """A blocking GET of ``target`` on either listener (its body; ControlError if not 2xx)."""
    if kind == "unix":
        assert r.plane.path is not None
        return ControlClient(r.plane.path, timeout=5).get(target)
    with socket.create_connection(("127.0.0.1", r.plane.metrics_port or 0), timeout=5) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n")[0]:
        raise ControlError(head.decode())
    return body


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["unix", "tcp"])
async def test_at_the_cap_a_new_connection_replaces_the_longest_waiting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    plane = {"max_connections": 2, "request_timeout": 60.0}
    where = sock_path(tmp_path) if kind == "unix" else False
    port = None if kind == "unix" else 0
    with caplog.at_level(logging.WARNING, logger="aiotimer.control"):
        async with rig(where, metrics_port=port, **plane) as r:
            name = (
                f"control socket {r.plane.path}"
                if kind == "unix"
                else f"metrics port 127.0.0.1:{r.plane.metrics_port}"
            )
            oldest = await _connect(r, kind)
            await settle()
            younger = await _connect(r, kind)
            await settle()
            # Idle for 60 s would be allowed: only the cap closes them, oldest first.
            assert await call(lambda: _serves(r, kind))
            assert await _closed_by_peer(oldest, 5.0)
            assert not await _closed_by_peer(younger, 0.05)
            youngest = await _connect(r, kind)
            await settle()
            assert await call(lambda: _serves(r, kind))
            assert await _closed_by_peer(younger, 5.0)
            assert not await _closed_by_peer(youngest, 0.05)
            await r.still_reaps()
            for stream in (oldest, younger, youngest):
                await stream.aclose()
    logged, accounted = _tally(caplog, f"{name}: 2 connections are open", "replaced connection")
    assert accounted == 2 and logged == 1


@pytest.mark.asyncio
async def test_at_the_cap_with_every_connection_busy_a_new_one_is_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    release, holding = anyio.Event(), []

    async def hold(request: HttpRequest) -> HttpResponse:
        holding.append(1)
        await release.wait()
        return HttpResponse(200, b"held")

    path = sock_path(tmp_path)
    client = ControlClient(path, timeout=10)
    async with rig(path, max_connections=2, routes=[Route("GET", "/hold", hold)]) as r:
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(call, lambda: client.get("/hold"))
            try:
                await wait_until(lambda: len(holding) == 2)
                with pytest.raises(ControlError, match="closed the connection"):
                    await call(client.state)  # closed at once: both are busy answering
                await r.still_reaps()
            finally:
                release.set()
        assert (await call(client.state)).server.state == "running"
    assert any("are open and busy" in rec.getMessage() for rec in caplog.records)


@pytest.mark.asyncio
async def test_a_connection_that_would_eat_the_descriptor_reserve_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = sock_path(tmp_path)
    client = ControlClient(path, timeout=10)
    async with rig(path, fd_reserve=32) as r:
        monkeypatch.setattr(DescriptorReserve, "leaves_room", lambda self, fd: False)
        with pytest.raises(ControlError, match="short of file descriptors"):
            await call(client.state)
        await r.still_reaps()
        monkeypatch.undo()
        assert (await call(client.state)).server.state == "running"
    assert any(
        "fewer than 32 file descriptors are free, kept for pinning workers" in rec.getMessage()
        for rec in caplog.records
    )


def _serves(r: Rig, kind: str) -> bool:
    try:
        return b"aiotimer_live_timers" in _get(r, kind, "/metrics")
    except (ControlError, OSError):
        return False


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["unix", "tcp"])
async def test_an_idle_connection_is_closed_after_the_timeout(tmp_path: Path, kind: str) -> None:
    where = sock_path(tmp_path) if kind == "unix" else False
    port = None if kind == "unix" else 0
    async with rig(where, metrics_port=port, request_timeout=0.3) as r:
        silent, partial = await _connect(r, kind), await _connect(r, kind)
        await partial.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
        start = anyio.current_time()
        assert await _closed_by_peer(silent, 10.0)
        assert await _closed_by_peer(partial, 10.0)
        assert anyio.current_time() - start >= 0.25
        await r.still_reaps()
        assert b"aiotimer_live_timers" in await call(lambda: _get(r, kind, "/metrics"))
        await silent.aclose()
        await partial.aclose()


# -- handlers and crashes -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_handler_that_raises_is_a_500_and_nothing_more(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def boom(request: HttpRequest) -> HttpResponse:
        raise RuntimeError("the handler broke")

    path = sock_path(tmp_path)
    async with rig(path, routes=[Route("GET", "/boom", boom)]) as r:
        client = ControlClient(path, timeout=5)
        with pytest.raises(ControlError, match=r"HTTP 500: internal error: RuntimeError"):
            await call(lambda: client.get("/boom"))
        assert (await call(client.state)).server.state == "running"
        await r.still_reaps()
        assert r.plane.state is LifecycleState.RUNNING
    assert any("GET /boom raised" in rec.getMessage() for rec in caplog.records)


@pytest.mark.asyncio
async def test_a_crashed_plane_is_logged_and_the_server_reaps_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    crash = anyio.Event()

    async def fragile(*args: Any, **kwargs: Any) -> None:
        await crash.wait()
        raise RuntimeError("the listener broke")

    monkeypatch.setattr(control_server, "serve_listener", fragile)
    path = sock_path(tmp_path)
    async with rig(path) as r:
        assert path.exists()
        crash.set()
        await wait_until(lambda: r.plane.state is LifecycleState.STOPPED)
        assert not path.exists() and r.plane.path is None
        await r.still_reaps()
    assert any(rec.getMessage() == "the control plane crashed" for rec in caplog.records)


# -- what a peer sends and how long a client waits ------------------------------------------


@pytest.mark.asyncio
async def test_a_head_over_the_limit_is_refused_even_when_it_comes_in_one_read(
    tmp_path: Path,
) -> None:
    path = sock_path(tmp_path)
    async with rig(path):
        head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: %s\r\n" % (b"a" * 30_000)
        stream = await anyio.connect_unix(path)
        async with stream:
            await stream.send(head + b"\r\n")  # one write: h11 alone would parse it whole
            answer = b""
            with anyio.fail_after(5):
                while b"\r\n\r\n" not in answer:
                    answer += await stream.receive()
        assert answer.startswith(b"HTTP/1.1 431 ")


def test_a_client_gives_up_on_a_server_that_never_answers_within_its_timeout(
    tmp_path: Path,
) -> None:
    path = tmp_path / "silent.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.bind(os.fspath(path))
        silent.listen(1)
        client = ControlClient(path, timeout=0.5)
        start = time.monotonic()
        with pytest.raises(ControlError, match=r"no answer .* within 0.5 s"):
            client.state()
        assert time.monotonic() - start < 5.0


@pytest.mark.asyncio
async def test_pipelined_scrapes_are_one_rendering_a_second_and_one_request_a_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    renders: list[int] = []
    real = control_metrics.render

    def counted(sample: Any) -> bytes:
        renders.append(1)
        return real(sample)

    monkeypatch.setattr(control_metrics, "render", counted)
    steps = 0

    async def count_steps() -> None:
        nonlocal steps
        while True:
            await anyio.lowlevel.checkpoint()
            steps += 1

    path = sock_path(tmp_path)
    async with rig(path), anyio.create_task_group() as tg:
        tg.start_soon(count_steps)
        stream = await anyio.connect_unix(path)
        async with stream:
            await stream.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 100)
            before, answers, data = steps, 0, b""
            with anyio.fail_after(10):
                while answers < 100:
                    data += await stream.receive()
                    answers = data.count(b"HTTP/1.1 200 ")
        assert len(renders) == 1  # within a second: the same rendering
        assert steps - before >= 100  # the loop ran other tasks between the requests
        tg.cancel_scope.cancel()
