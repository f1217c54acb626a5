"""A supervisor's control socket: its workers in the state, restart and stop by rank.

Real worker processes (sleepers), a real socket served by a control plane composed over
the supervisor; the blocking client runs in a thread.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio
import pytest

from aiotimer import Supervisor
from aiotimer.control import ControlClient, ControlPlane
from aiotimer.control._format import format_status
from aiotimer.errors import ControlError, ServerStateError
from aiotimer.events import Event, RestartScheduled, WorkerEnded
from aiotimer.supervisor import WorkerState
from aiotimer.testing import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.process, pytest.mark.timeout(60)]

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]

_T = TypeVar("_T")


async def call(fn: Callable[[], _T]) -> _T:
    return await anyio.to_thread.run_sync(fn)


async def test_state_restart_and_stop_by_rank(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "sup.sock"
    events: list[Event] = []
    caplog.set_level(logging.INFO, logger="aiotimer")
    async with (
        Supervisor(SLEEPER, nproc=2, stop_timeout=2, on_event=events.append) as sup,
        ControlPlane(sup, path=path),
    ):
        await wait_until(lambda: all(w.pid for w in sup.get_state().workers), timeout=20)
        client = ControlClient(path, timeout=20)
        snap = await call(client.state)
        assert snap.supervisor is not None and snap.supervisor.nproc == 2
        assert snap.supervisor.run_id == sup.run_id
        ranks = {w.rank: w for w in snap.workers}
        assert set(ranks) == {0, 1}
        assert ranks[1].pid == sup.get_state().workers[1].pid and ranks[1].restarts == 0
        assert "RANK" in format_status(snap)

        old = ranks[1].pid
        answer = await call(lambda: client.restart(1))
        assert answer["rank"] == 1 and answer["restarts"] == 1
        await wait_until(lambda: sup.get_state().workers[1].pid not in (None, old), timeout=20)

        # An operator's restart is neither charged to the budget nor a warning.
        [restart] = [e for e in events if isinstance(e, RestartScheduled)]
        assert (restart.cause, restart.budget) == ("operator", -1)
        [logged] = [r for r in caplog.records if r.getMessage().startswith("restarting")]
        assert logged.levelno == logging.INFO
        assert logged.getMessage() == (
            "restarting worker(s) 1 now as the operator asked (not charged to the restart budget)"
        )

        answer = await call(lambda: client.stop(0))
        assert answer["state"] == "stopped"
        assert sup.get_state().workers[0].state is WorkerState.STOPPED
        # Stopped for good: not waiting for a restart.
        ended = [e for e in events if isinstance(e, WorkerEnded) and e.rank == 0]
        assert [e.state for e in ended] == ["stopped"]

        text = await call(client.metrics)
        assert "aiotimer_restarts_total 1.0" in text.splitlines()
        assert 'aiotimer_workers{state="stopped"} 1.0' in text.splitlines()

        with pytest.raises(ControlError, match="404"):
            await call(lambda: client.restart(7))
        assert snap.server.control == str(path) and snap.server.state == "running"


async def test_a_plane_over_a_supervisor_that_has_not_started_is_refused() -> None:
    plane = ControlPlane(Supervisor(SLEEPER))
    with pytest.raises(ServerStateError, match="start the supervisor"):
        await plane.start()
