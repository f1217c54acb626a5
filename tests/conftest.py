"""Shared test configuration.

Every ``@pytest.mark.asyncio`` test runs once on the stdlib asyncio loop and once on
uvloop (where installed), through pytest-asyncio's loop-factory hook; the test ids end
in ``[asyncio]`` / ``[uvloop]``.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from _etcd import EtcdNotFoundError, EtcdServer

from aiotimer.cluster import Store, connect
from aiotimer.testing import FakeClock, MemoryStore

# The test process (and the workers it starts) must not take SIGUSR1 for a stack-dump
# hook just because a test finds a server through the environment; the tests of that
# hook remove this variable in their workers.
os.environ.setdefault("AIOTIMER_DUMP_HOOK", "0")

LOOP_FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
}
if importlib.util.find_spec("uvloop") is not None:
    import uvloop

    def _uvloop_that_times_out() -> asyncio.AbstractEventLoop:
        """A uvloop loop on which pytest-timeout can fail a test that hangs.

        uvloop runs Python signal handlers in a callback of its own and only logs what
        they raise unless it is SystemExit or KeyboardInterrupt, so pytest-timeout's
        failure (a BaseException raised by its SIGALRM handler) would be logged and the
        hung test would hang the whole run. Such an exception stops the loop instead:
        the test then fails ("Event loop stopped before Future completed").
        """
        loop = uvloop.new_event_loop()

        def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            exc = context.get("exception")
            if isinstance(exc, BaseException) and not isinstance(exc, Exception):
                loop.stop()
            loop.default_exception_handler(context)

        loop.set_exception_handler(handle)
        return loop

    LOOP_FACTORIES["uvloop"] = _uvloop_that_times_out


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Parametrise async tests over the available event loops."""
    return LOOP_FACTORIES


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that runs a real etcd is an ``etcd`` and a ``process`` test."""
    for item in items:
        if {"etcd", "own_etcd"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.etcd)
            item.add_marker(pytest.mark.process)


@pytest.fixture(autouse=True)
def _no_frozen_heap_left() -> Iterator[None]:
    """Undo ``gc.freeze()`` after a test that ran ``aiotimer serve`` in this process.

    Serve freezes its start-up heap for the rest of its process's life; run in-process
    by a test, it would leave the collector changed for every later test (and fail a
    test that expects nothing frozen, depending on the order the files run in).
    """
    yield
    if gc.get_freeze_count():
        gc.unfreeze()


@contextmanager
def _running_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """A real etcd on free loopback ports, removed (data dir included) afterwards.

    Fails, never skips, when no etcd binary is installed (see ``tests/_etcd.py``).
    """
    try:
        server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    except EtcdNotFoundError as exc:
        pytest.fail(str(exc))
    server.start()
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture(scope="session")
def _session_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with _running_etcd(tmp_path_factory) as server:
        yield server


@pytest.fixture
def etcd(_session_etcd: EtcdServer) -> EtcdServer:
    """A real etcd holding no key: one per session, emptied before each test.

    Tests that stop or restart etcd take :func:`own_etcd` instead (this one is started
    again if a test left it stopped).
    """
    if not _session_etcd.running:
        _session_etcd.start()
    _session_etcd.clear()
    return _session_etcd


@pytest.fixture
def own_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """A real etcd of the test's own, to stop and start as an operator would."""
    with _running_etcd(tmp_path_factory) as server:
        yield server


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (needs root and mount(2); skipped otherwise)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest_asyncio.fixture(
    params=["memory", pytest.param("etcd", marks=[pytest.mark.etcd, pytest.mark.process])]
)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """A cluster store: the in-memory one, and a real etcd's (emptied before the test)."""
    if request.param == "memory":
        yield MemoryStore(FakeClock())
        return
    server: EtcdServer = request.getfixturevalue("etcd")
    etcd_store = connect(server.endpoint, timeout=5)
    try:
        yield etcd_store
    finally:
        await etcd_store.aclose()
