"""The Supervisor's embedding API: snapshots, operator actions, the coordinator hook,
the one event stream, and the workers' environment."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import anyio
import pytest

from aiotimer import (
    Backoff,
    RestartPolicy,
    RunOutcome,
    Supervisor,
    launch_info,
)
from aiotimer.client import Launcher
from aiotimer.events import (
    Event,
    RestartScheduled,
    SupervisorGaveUp,
    WorkerEnded,
    WorkerStarted,
)
from aiotimer.supervisor import Decision, WorkerFailure, WorkerState
from aiotimer.supervisor._pool import WORKER_ENV, worker_env
from aiotimer.supervisor._restart import Restart

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
CRASHER = [sys.executable, "-c", "raise SystemExit(4)"]


def test_worker_env_sets_every_documented_name() -> None:
    env = worker_env(
        {"PATH": "/bin", "MASTER_PORT": "1234"},
        fifo="/run/x/timer.fifo",
        rank=2,
        nproc=4,
        restarts=1,
        max_restarts=3,
        run_id="r",
        master_port=999,
    )
    assert set(env) == {"PATH", *WORKER_ENV}
    assert env["MASTER_PORT"] == "1234"  # the user's own wins
    me = launch_info(env)
    assert (me.launcher, me.rank, me.world_size, me.restart_count, me.run_id) == (
        Launcher.AIOTIMER, 2, 4, 1, "r",
    )  # fmt: skip


def test_constructed_outside_a_loop() -> None:
    sup = Supervisor(SLEEPER, nproc=2)
    assert sup.get_state().workers[1].state is WorkerState.INIT
    assert "created" in repr(sup)
    with pytest.raises(ValueError):
        Supervisor([])


@pytest.mark.process
@pytest.mark.timeout(30)
@pytest.mark.asyncio
async def test_snapshot_and_operator_actions(tmp_path: Path) -> None:
    events: list[Event] = []
    log = tmp_path / "events.jsonl"
    sup = Supervisor(
        SLEEPER, nproc=2, stop_timeout=2, on_event=events.append, event_log=log,
        run_id="job/with a slash and a long name " * 3,
    )  # fmt: skip
    with anyio.fail_after(20):
        async with sup:
            fifo = sup.fifo
            assert fifo is not None
            assert stat.S_IMODE(os.stat(fifo.parent).st_mode) == 0o700
            state = sup.get_state()
            assert [w.rank for w in state.workers] == [0, 1]
            assert all(w.pid is not None and w.state.alive for w in state.workers)
            assert state.server is not None
            first = state.workers[1].pid

            await sup.restart_workers([1])
            state = sup.get_state()
            assert state.workers[1].pid not in (None, first)
            assert (state.workers[1].restarts, state.workers[1].attempts) == (1, 2)
            assert state.restarts_in_window == 0  # an operator's restart is not budgeted

            await sup.stop_worker(0)
            await sup.stop_worker(1)
            assert await sup.wait() is RunOutcome.STOPPED
    assert not fifo.parent.exists()  # the private runtime directory is removed
    assert {w.state for w in sup.get_state().workers} == {WorkerState.STOPPED}
    ended = [e for e in events if isinstance(e, WorkerEnded)]
    assert [e.reason for e in ended] == ["stopped"] * 3
    # one stream: the server's and the supervisor's events, in the same log
    kinds = [json.loads(line)["event"] for line in log.read_text().splitlines()]
    assert kinds[0] == "server_started"
    assert "worker_started" in kinds
    assert kinds[-2:] == ["server_stopped", "supervisor_stopped"]
    assert kinds == [e.kind for e in events]


class DeferringCoordinator:
    """A job-wide coordinator in miniature: defers, then restarts with a job count."""

    def __init__(self) -> None:
        self.failures: list[WorkerFailure] = []
        self.asked = anyio.Event()

    async def decide(
        self, supervisor: Supervisor, failure: WorkerFailure, proposal: Decision
    ) -> Decision | None:
        assert isinstance(proposal, Restart)
        self.failures.append(failure)
        self.asked.set()
        return None


@pytest.mark.process
@pytest.mark.timeout(30)
@pytest.mark.asyncio
async def test_a_coordinator_defers_and_restarts_with_its_own_count() -> None:
    events: list[Event] = []
    coordinator = DeferringCoordinator()
    sup = Supervisor(
        CRASHER, policy=RestartPolicy(min_uptime=0.0), coordinator=coordinator,
        on_event=events.append, stop_timeout=1,
    )  # fmt: skip
    with anyio.fail_after(20):
        async with sup:
            await coordinator.asked.wait()
            (failure,) = coordinator.failures
            assert (failure.rank, failure.reason.exit_code) == (0, 4)
            assert sup.get_state().workers[0].state is WorkerState.BACKOFF
            assert not [e for e in events if isinstance(e, RestartScheduled)]
            await sup.restart_workers(count=7)
            sup.give_up("the job is over")
            await sup.wait()
    started = [e.restarts for e in events if isinstance(e, WorkerStarted)]
    assert started == [0, 7]


@pytest.mark.process
@pytest.mark.timeout(30)
@pytest.mark.asyncio
async def test_gives_up_when_its_timer_server_stops() -> None:
    events: list[Event] = []
    sup = Supervisor(SLEEPER, nproc=2, stop_timeout=1, on_event=events.append)
    with anyio.fail_after(20):
        async with sup:
            assert sup.server is not None
            await sup.server.aclose()  # the workers are unwatched from now on
            assert await sup.wait() is RunOutcome.GAVE_UP
    (gave_up,) = [e for e in events if isinstance(e, SupervisorGaveUp)]
    assert "timer server can no longer watch" in gave_up.reason
    assert {w.state for w in sup.get_state().workers} == {WorkerState.STOPPED}


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_a_launch_that_fails_is_a_start_failure(tmp_path: Path) -> None:
    events: list[Event] = []
    policy = RestartPolicy(max_restarts=1, backoff=Backoff(initial=0.01, cap=0.01))
    sup = Supervisor(SLEEPER, cwd=tmp_path / "gone", policy=policy, on_event=events.append)
    with anyio.fail_after(20):
        assert await sup.run() is RunOutcome.GAVE_UP
    ended = [e for e in events if isinstance(e, WorkerEnded)]
    assert [(e.exit_code, e.start_failure) for e in ended] == [(127, True)] * 2
    assert not [e for e in events if isinstance(e, WorkerStarted)]
