"""A release put on a ``multiprocessing.Queue`` before its deadline wins, even when the
server's loop stalled across the deadline (a GC pause, a loaded host): the queue's drain
takes in what the queue's pipe holds before the server acts.

A real server (the queue source and its bridge thread), a real queue, a real process to
reap. torch's own ``test_torch_mp_example`` killed a happy rank so under load: its
release (after ``time.sleep(0.5)`` in a 1 s block) reached the queue in the last tenth
of a second, while the bridge thread waited for the loop to take its previous batch.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import time

import anyio
import pytest

from aiotimer.events import Event, TimerExpired
from aiotimer.server import TimerServer
from aiotimer.wire import Request

pytestmark = [pytest.mark.process, pytest.mark.timeout(60)]

ROUNDS = 2
#: From the acquire to its deadline, in seconds.
LEAD = 0.5


async def stalled_release(queue: multiprocessing.queues.Queue[object]) -> tuple[bool, list[Event]]:
    """One round: a worker's timer, then the loop stalls while its release reaches the
    queue, until past the deadline; the worker's exit code (None: alive) and the events."""
    events: list[Event] = []
    worker = subprocess.Popen(["sleep", "60"])
    try:
        async with TimerServer(queue=queue, on_event=events.append) as server:
            deadline = time.monotonic() + LEAD
            queue.put(Request(worker.pid, "block", time.time() + LEAD, 9, mono=deadline))
            with anyio.fail_after(10):
                while not server.get_state().timers:
                    await anyio.sleep(0.005)
            # The loop stalls from here (a blocking call in its thread). The bridge takes
            # this first item and waits for the loop to apply it...
            queue.put(Request(worker.pid, "other", -1, 0))
            time.sleep(0.1)
            # ...so the release stays in the queue's pipe, put well before the deadline.
            queue.put(Request(worker.pid, "block", -1, 0))
            time.sleep(max(0.0, deadline - time.monotonic()) + 0.1)
            await anyio.sleep(0.3)  # the loop runs again, past the deadline
        return worker.poll() is None, events
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.asyncio
async def test_a_release_in_the_queue_before_a_stalled_deadline_wins() -> None:
    queue: multiprocessing.queues.Queue[object] = multiprocessing.get_context("spawn").Queue()
    try:
        for _ in range(ROUNDS):
            alive, events = await stalled_release(queue)
            expired = [e for e in events if isinstance(e, TimerExpired)]
            assert alive and not expired, f"a worker whose release was queued was reaped: {expired}"
    finally:
        queue.close()
        queue.join_thread()
