"""Shared test configuration.

Every ``@pytest.mark.asyncio`` test runs once on the stdlib asyncio loop and once on
uvloop (where installed), through pytest-asyncio's loop-factory hook; the test ids end
in ``[asyncio]`` / ``[uvloop]``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Callable, Iterator, Mapping

import pytest
from _etcd import EtcdNotFoundError, EtcdServer

# The test process (and the workers it starts) must not take SIGUSR1 for a stack-dump
# hook just because a test finds a server through the environment; the tests of that
# hook remove this variable in their workers.
os.environ.setdefault("AIOTIMER_DUMP_HOOK", "0")

LOOP_FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
}
if importlib.util.find_spec("uvloop") is not None:
    import uvloop

    LOOP_FACTORIES["uvloop"] = uvloop.new_event_loop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Parametrise async tests over the available event loops."""
    return LOOP_FACTORIES


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that runs a real etcd is an ``etcd`` and a ``process`` test."""
    for item in items:
        if "etcd" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.etcd)
            item.add_marker(pytest.mark.process)


@pytest.fixture
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
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
