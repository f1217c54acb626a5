"""A FifoClient's own fast path for blocks (``_block_nowait``, aiotimer.client._fifo_blocks):
what a block writes through it, byte for byte, whatever its options; blocks of many
threads through one client; and when a block takes it (a subclass that wraps
``send_nowait`` sees every call instead)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiotimer.client import FifoClient, expires
from aiotimer.client._block_context import current_asyncio_task
from aiotimer.client._fifo_blocks import FifoBlocks
from aiotimer.wire import MARKER_SUFFIX, LineDecoder, Request, encode


class _Reader:
    """The server's side of the FIFO: a non-blocking read end."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._rest = b""

    def lines(self) -> list[bytes]:
        """The whole lines read so far."""
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._rest += chunk
        *whole, self._rest = self._rest.split(b"\n")
        return [line + b"\n" for line in whole]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, _Reader]]:
    """A FIFO with a reader and an aiotimer marker (stamps: off)."""
    fifo = tmp_path / "timer.fifo"
    os.mkfifo(fifo, 0o600)
    reader = _Reader(fifo)
    marker = {"server": "aiotimer", "pid": os.getpid(), "protocol": 1}
    Path(str(fifo) + MARKER_SUFFIX).write_text(json.dumps(marker))
    try:
        yield fifo, reader
    finally:
        os.close(reader.fd)


def _decoded(line: bytes) -> Request:
    """The request ``line`` is, checking it is byte for byte what encode() writes."""
    (request,) = LineDecoder().feed(line).requests
    assert encode(request) == line
    return request


class _Wrapping(FifoClient):
    """A subclass that wraps send_nowait: blocks must call it, not the client's own path."""

    calls = 0

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
        self.calls += 1
        return super().send_nowait(
            scope_id, expiration_time, signal, mono, dump, kill_after, cancelled
        )


def test_a_block_takes_the_clients_own_path_unless_a_subclass_wraps_send_nowait(
    served: tuple[Path, _Reader],
) -> None:
    fifo, reader = served
    plain, wrapping = FifoClient(fifo), _Wrapping(fifo)
    try:
        assert isinstance(plain._block_nowait, FifoBlocks)
        assert wrapping._block_nowait is None
        for client in (plain, wrapping):
            client.marker_check_interval = 3600.0
            with expires(5, scope="connect", client=client):  # the slow path connects
                pass
        wrapping.calls = 0
        for _ in range(3):
            with expires(5, client=wrapping):
                pass
        assert wrapping.calls == 6  # every acquire and release, through the wrapper
        with expires(5, client=plain) as block:
            assert plain._blocks.open_scopes.keys() == {block.scope}
        assert plain._blocks.open_scopes == {}
        assert len(reader.lines()) == 2 + 2 + 6 + 2
    finally:
        plain.close()
        wrapping.close()


_SCOPES = st.one_of(
    st.none(),  # the default scope
    st.text(min_size=1, max_size=40).filter(lambda s: "\x00" not in s),
)


def test_a_blocks_lines_are_the_bytes_of_encode_for_every_option(
    served: tuple[Path, _Reader],
) -> None:
    """Through the client's own path (or its fallback, for what it cannot write, such
    as a learned block), every line is what encode() writes for its request, with the
    fields the block was given: explicit or default scope, signal, tiers, ``after``."""
    fifo, reader = served
    client = FifoClient(fifo)
    client.marker_check_interval = 3600.0

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        scope=_SCOPES,
        after=st.one_of(
            st.floats(min_value=0, max_value=1e9), st.integers(min_value=0, max_value=10**6)
        ),
        signal=st.sampled_from([None, 9, 15]),
        kill_after=st.sampled_from([None, 0.0, 0.5, 5.0]),
        face=st.sampled_from(["sync", "async"]),
    )
    def check(
        scope: str | None, after: float, signal: int | None, kill_after: float | None, face: str
    ) -> None:
        try:
            block = expires(after, scope=scope, client=client, signal=signal, kill_after=kill_after)
        except ValueError:  # a scope the server would refuse: refused at once, not sent
            return
        before = time.time()
        if face == "sync":
            with block:
                pass
        else:

            async def run() -> None:
                async with block:
                    pass

            asyncio.run(run())
        acquire, release = (_decoded(line) for line in reader.lines())
        assert (acquire.scope_id, release.scope_id) == (block.scope, block.scope)
        assert acquire.signal == (client.signal if signal is None else signal)
        assert encode(Request(os.getpid(), block.scope, -1, 0)) == encode(release)
        tiers = face == "async" and kill_after != 0.0
        extra = (5.0 if kill_after is None else kill_after) if tiers else 0.0
        assert block.deadline is not None
        assert acquire.mono == block.deadline + extra
        assert acquire.kill_after == (extra or None)
        assert before + after + extra - 1 <= acquire.expiration_time
        assert acquire.expiration_time <= time.time() + after + extra + 1

    try:
        check()
    finally:
        client.close()


def test_blocks_of_many_threads_interleave_whole_and_each_in_order(
    served: tuple[Path, _Reader],
) -> None:
    """Threads share one client: every line arrives whole, each block's release after
    its acquire, each thread's blocks in its order, and none is left open."""
    fifo, reader = served
    client = FifoClient(fifo)
    client.marker_check_interval = 3600.0
    with expires(5, scope="connect", client=client):
        pass
    lines: list[bytes] = []
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            lines.extend(reader.lines())
            time.sleep(0.001)

    def work(n: int) -> None:
        for i in range(300):
            with expires(60, scope=f"t{n}-{i}", client=client), expires(60, client=client):
                pass  # the second block: a default scope, nested

    drainer = threading.Thread(target=drain)
    drainer.start()
    workers = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=60)
    finally:
        stop.set()
        drainer.join(timeout=60)
        client.close()
    lines.extend(reader.lines())
    requests = [_decoded(line) for line in lines[2:]]  # after the connecting block
    assert len(requests) == 4 * 300 * 4
    seen: dict[str, list[bool]] = {}
    for r in requests:
        seen.setdefault(r.scope_id, []).append(r.is_release)
    assert all(kinds == [False, True] for kinds in seen.values())  # acquire, then release
    for n in range(4):
        mine = [r.scope_id for r in requests if r.scope_id.startswith(f"t{n}-") and r.is_release]
        assert mine == [f"t{n}-{i}" for i in range(300)]
    assert client._blocks.open_scopes == {}


def test_the_current_task_is_found_in_a_loop_and_none_outside_one() -> None:
    """What an async block asks for its task (asyncio.current_task, looked up once):
    the running task inside a loop, in any loop and thread; None where no loop runs."""
    assert current_asyncio_task() is None  # asyncio is loaded; no loop runs here

    async def task_of() -> asyncio.Task[object] | None:
        return current_asyncio_task()

    async def main() -> None:
        me = asyncio.current_task()
        assert me is not None and current_asyncio_task() is me
        other = asyncio.create_task(task_of())
        assert await other is other

    asyncio.run(main())
    found: list[object] = []
    thread = threading.Thread(target=lambda: found.append(asyncio.run(task_of())))
    thread.start()
    thread.join(timeout=30)
    assert len(found) == 1 and isinstance(found[0], asyncio.Task)
    assert current_asyncio_task() is None
