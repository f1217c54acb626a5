"""The server embedded in each way an asyncio program starts: ``asyncio.run``,
``uvloop.run`` and ``anyio.run``, each reaping a real child through a real FIFO, with a
control plane composed around it (what an embedding agent does for a control socket)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
import pytest

from aiotimer import TimerServer
from aiotimer.control import ControlClient, ControlPlane, StatusSnapshot
from aiotimer.events import Event, WorkerReaped

pytestmark = [pytest.mark.process, pytest.mark.timeout(60)]

#: Generous bound for "shortly after the deadline" on a busy 2-core machine.
REAP_BOUND = 10.0

CHILD = """
import json, os, sys, time
line = json.dumps({"version": 1, "pid": os.getpid(), "scope_id": "embedded#1",
                   "expiration_time": time.time() + 0.2, "signal": 9}) + "\\n"
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK)
os.write(fd, line.encode())
os.close(fd)
print("sent", flush=True)
time.sleep(60)
"""


async def reap_one_child(fifo: Path) -> tuple[int, list[Event], StatusSnapshot]:
    events: list[Event] = []
    async with TimerServer(fifo=fifo, on_event=events.append) as server, ControlPlane(server):
        status = await anyio.to_thread.run_sync(ControlClient.for_fifo(fifo).state)
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(fifo)], stdout=subprocess.PIPE, text=True
        )
        try:
            start = time.monotonic()
            while child.poll() is None and time.monotonic() - start < REAP_BOUND:
                await anyio.sleep(0.01)
        finally:
            if child.poll() is None:
                child.kill()
            returncode = child.wait()
            assert child.stdout is not None
            child.stdout.close()
    return returncode, events, status


def run_with_asyncio(coro: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(coro())


def run_with_uvloop(coro: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    uvloop = pytest.importorskip("uvloop")
    return uvloop.run(coro())


def run_with_anyio(coro: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return anyio.run(coro)


@pytest.mark.parametrize(
    "runner",
    [run_with_asyncio, run_with_uvloop, run_with_anyio],
    ids=["asyncio.run", "uvloop.run", "anyio.run"],
)
def test_embedded_server_reaps_a_stuck_child(
    runner: Callable[[Callable[[], Coroutine[Any, Any, Any]]], Any], tmp_path: Path
) -> None:
    fifo = tmp_path / "timer.fifo"
    returncode, events, status = runner(lambda: reap_one_child(fifo))
    assert returncode == -signal.SIGKILL
    assert status.server.state == "running" and status.server.fifo == str(fifo)
    reaped = [e for e in events if isinstance(e, WorkerReaped)]
    assert len(reaped) == 1
    assert not fifo.exists(), "the server removes the FIFO it created"
    assert not (tmp_path / "timer.fifo.control").exists(), "the plane removes its socket"
    assert json.dumps(reaped[0].to_dict())  # events serialise for the event log
