"""The worker slots of one supervised run: launch, watch, and act on the planner.

The shell around the pure :class:`~aiotimer.supervisor._restart.RestartPlanner` (h11's
habit, as :class:`~aiotimer.reapers._escalator.Escalator` with its loop): :class:`Ranks`
launches each rank's attempts through the :class:`~aiotimer.supervisor._pool.WorkerPool`,
watches each one in a task, tells the planner what happened (started, running, exited,
expired) and carries out what it decides: a restart (through the run's
:class:`~aiotimer.supervisor.RestartCoordinator`), a give-up, or the end of the run.
The :class:`~aiotimer.supervisor.Supervisor` owns it and its lifecycle.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeAlias

import anyio.abc

from aiotimer._edges.clock import Clock
from aiotimer.events import (
    Event,
    RankStatus,
    RestartScheduled,
    SupervisorGaveUp,
    TimerExpired,
    WorkerEnded,
    WorkerReaped,
    WorkerRunning,
    WorkerStarted,
)
from aiotimer.hang import HangReporter
from aiotimer.reapers import NoDump, Reaper, ReapPolicy
from aiotimer.supervisor._exits import ExitReason, classify_exit
from aiotimer.supervisor._pool import (
    Attempt,
    ObservedReaper,
    WorkerPool,
    free_port,
    worker_env,
)
from aiotimer.supervisor._records import (
    RestartCoordinator,
    RunOutcome,
    SupervisorActions,
    WorkerFailure,
    rank_status,
    run_outcome,
)
from aiotimer.supervisor._restart import (
    GiveUp,
    Restart,
    RestartPlanner,
    RestartPolicy,
    RestartScope,
    WorkerState,
)

__all__ = ["PIDS_KEPT", "Ranks"]

StrPath: TypeAlias = "str | os.PathLike[str]"

logger = logging.getLogger("aiotimer")

#: How many launched processes :attr:`Ranks.launched` remembers the rank of.
PIDS_KEPT = 1000


class Ranks:
    """The ``nproc`` worker slots of one run (see the module docs).

    ``emit`` reports the supervisor's events; ``request_stop`` ends the run and
    ``stopping`` says whether it is ending; ``owner`` is what a coordinator is given;
    ``hang`` (its timeout, or ``None``; the dump directory; the event log) makes the
    :attr:`hang` reporter, which takes a hang report when a reap begins under the group
    scope (or a job restart comes); ``scopes`` reads the open timers by pid for it.
    """

    def __init__(
        self,
        *,
        planner: RestartPlanner,
        pool: WorkerPool,
        policy: RestartPolicy,
        nproc: int,
        run_id: str,
        env: Mapping[str, str],
        clock: Clock,
        coordinator: RestartCoordinator,
        owner: SupervisorActions,
        emit: Callable[[Event], None],
        request_stop: Callable[[], None],
        stopping: Callable[[], bool],
        hang: tuple[float | None, StrPath | None, StrPath | None] = (None, None, None),
        scopes: Callable[[], Mapping[int, tuple[str, ...]]] = dict,
    ) -> None:
        self._planner = planner
        self._pool = pool
        self._policy = policy
        self._nproc = nproc
        self.run_id = run_id
        self._env = env
        self._clock = clock
        self._coordinator = coordinator
        self._owner = owner
        self._emit = emit
        self._request_stop = request_stop
        self._stopping = stopping
        timeout, dump_dir, event_log = hang
        self.hang = None
        if timeout is not None:
            self.hang = HangReporter(
                timeout, dump_dir=dump_dir, event_log=event_log, clock=clock, emit=emit
            )
        self._scopes = scopes
        self.outcome: RunOutcome | None = None
        #: The rank of every process launched lately (the last :data:`PIDS_KEPT`), so
        #: what happened to a process that has ended still names its rank.
        self.launched: dict[int, int] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._fifo: Path | None = None
        self._master_port = 0

    def reap_policy(self, policy: ReapPolicy | None) -> ReapPolicy | None:
        """The run's server's reap policy: ``policy``, and under the group scope with
        hang reports, a stack dump before every reap (for the report)."""
        if self.hang is None or self._policy.scope is not RestartScope.GROUP:
            return policy
        return self.hang.reap_policy(policy)

    def begin(self, tg: anyio.abc.TaskGroup, fifo: Path) -> None:
        """Launch every rank; their watchers run in ``tg``; they talk to ``fifo``."""
        self._tg, self._fifo, self._master_port = tg, fifo, free_port()
        if self.hang is not None:
            self.hang.place(fifo.parent)
        for rank in range(self._nproc):
            self.launch(rank)

    async def stop_for_good(self, rank: int) -> None:
        """Stop worker ``rank`` for good (an operator's stop)."""
        await self._pool.stop([rank], final=True)
        self._planner.set_state([rank], WorkerState.STOPPED)
        self.check_finished()

    async def restart_now(self, ranks: tuple[int, ...], count: int | None) -> None:
        """Restart ``ranks`` now, outside the budget: an operator's restart, or a
        job-wide one that sets their restart ``count``."""
        for rank in ranks:
            att = self._pool.attempts.get(rank)
            if att is not None:
                att.stop_requested = True
        decision = self._planner.restart(
            ranks,
            self._clock.monotonic(),
            budget=False,
            count=count,
            cause="operator" if count is None else "job",
        )
        await self.carry_out(decision)

    def statuses(self, now: float) -> list[RankStatus]:
        """Every rank as it is at ``now`` (monotonic)."""
        workers = []
        for s in self._planner.slots:
            att = self._pool.attempts.get(s.rank)
            running = None if att is None else (att.pid, now - att.started_at)
            workers.append(rank_status(s, running))
        return workers

    def restart_straggler(self, rank: int) -> None:
        """Restart straggler ``rank``, charged to the budget (``--on-straggler
        restart-rank``); only reported once the budget is spent or the run is ending."""
        now = self._clock.monotonic()
        att = self._pool.attempts.get(rank)
        if self._tg is None or att is None or self._stopping():
            return
        if self._planner.gave_up is not None or not self._planner.slot(rank).state.alive:
            return
        if self._planner.restarts_in_window(now) >= self._policy.max_restarts:
            logger.warning(
                "rank %d is a straggler, but the restart budget is spent: only reported", rank
            )
            return
        att.stop_requested = True
        decision = self._planner.restart((rank,), now, cause="straggler")
        self._tg.start_soon(self.carry_out, decision)

    def expired(self, event: TimerExpired | WorkerReaped) -> None:
        """A worker's timer expired (or it was reaped): the planner hears of it."""
        att = self._pool.note(event)
        if self.hang is not None and att is not None and isinstance(event, TimerExpired):
            self.hang.expired(att.pid, event.scope_id)
        if att is not None and self._planner.slot(att.rank).state.alive:
            self._planner.expired(att.rank)

    def launch(self, rank: int) -> None:
        """Start slot ``rank``'s next attempt and the task that watches it."""
        assert self._tg is not None
        record = self._planner.slot(rank)
        now = self._clock.monotonic()
        env = worker_env(
            self._env,
            fifo=str(self._fifo),
            rank=rank,
            nproc=self._nproc,
            restarts=record.restarts,
            max_restarts=self._policy.max_restarts,
            run_id=self.run_id,
            master_port=self._master_port,
        )
        try:
            att = self._pool.launch(rank, len(record.attempts) + 1, env, now)
        except OSError as exc:
            logger.error("worker %d could not be launched: %s", rank, exc)
            self._planner.started(rank, now)
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            self._ended(rank, None, classify_exit(code))
            return
        self._planner.started(rank, now)
        self.launched[att.pid] = rank
        if len(self.launched) > PIDS_KEPT:
            del self.launched[next(iter(self.launched))]
        self._emit(
            WorkerStarted(
                time=self._clock.time(),
                rank=rank,
                pid=att.pid,
                attempt=att.number,
                restarts=record.restarts,
            )
        )
        self._tg.start_soon(self._watch, att, name=f"aiotimer-worker-{rank}")

    async def _watch(self, att: Attempt) -> None:
        async def uptime_evidence() -> None:
            at = self._planner.healthy_at(att.rank)
            if at is not None:
                await self._clock.sleep_until(at)
                self.running(att, f"up for {self._policy.min_uptime:g}s")

        reason = await self._pool.wait(att, while_running=uptime_evidence)
        self._ended(att.rank, att, reason)

    def timer_registered(self, pid: int) -> None:
        """``pid`` sent its first timer request (the server pinned it): if it is a
        worker's, that worker is running."""
        att = self._pool.owner(pid)
        if att is not None:
            self.running(att, "sent a timer request")

    def running(self, att: Attempt, evidence: str) -> None:
        """Attempt ``att`` shows it runs (``evidence`` says how)."""
        if self._pool.attempts.get(att.rank) is att and self._planner.running(att.rank):
            self._emit(
                WorkerRunning(
                    time=self._clock.time(), rank=att.rank, pid=att.pid, evidence=evidence
                )
            )

    def _ended(self, rank: int, att: Attempt | None, reason: ExitReason) -> None:
        now = self._clock.monotonic()
        stopped = att is not None and att.stop_requested
        decision = self._planner.exited(rank, reason, now, stopped=stopped)
        if stopped and att is not None and (att.final or self._stopping()):
            # Stopped for good (the run ends, or an operator stopped it): it is not
            # waiting for a restart (backoff) but stopped, as the summary will say.
            self._planner.set_state([rank], WorkerState.STOPPED)
        record = self._planner.slot(rank)
        last = record.attempts[-1]
        self._emit(
            WorkerEnded(
                time=self._clock.time(),
                rank=rank,
                pid=att.pid if att is not None else 0,
                reason=reason.kind.value,
                exit_code=reason.exit_code,
                signal=reason.signal,
                scopes=reason.scopes,
                omitted=reason.omitted,
                task=reason.task,
                uptime=round(last.uptime, 3),
                start_failure=last.start_failure,
                state=record.state.value,
            )
        )
        if att is not None:
            att.done.set()
        if isinstance(decision, Restart | GiveUp):
            failure = WorkerFailure(rank, att.pid if att else 0, reason, last.start_failure)
            if isinstance(decision, Restart):
                # stop the others now, so their exits are not taken for failures
                for r in decision.ranks:
                    other = self._pool.attempts.get(r)
                    if other is not None:
                        other.stop_requested = True
                assert self._tg is not None
                self._tg.start_soon(self._coordinate, failure, decision)
            else:
                self.gave_up(decision)  # final: not the coordinator's to overturn
        self.check_finished()

    async def _coordinate(self, failure: WorkerFailure, proposal: Restart) -> None:
        decision = await self._coordinator.decide(self._owner, failure, proposal)
        if isinstance(decision, Restart):
            await self.carry_out(decision)
        elif isinstance(decision, GiveUp):
            self._owner.give_up(decision.reason)

    def observe(self, reaper: Reaper) -> ObservedReaper:
        """``reaper`` for the run's server, telling these ranks what it does."""
        return ObservedReaper(reaper, self.timer_registered, self.before_reap, self._dumped)

    def _dumped(self, pid: int, result: str | NoDump | None) -> None:
        if self.hang is not None:
            self.hang.reap_dumped(pid, result)

    def before_reap(self, pid: int, dumping: bool) -> None:
        """A reap of ``pid`` begins (``dumping``: with a dump step): under the group
        scope, the hang report of every rank is begun first."""
        att = self._pool.owner(pid)
        if self.hang is None or att is None or att.stop_requested or self._stopping():
            return
        if self._policy.scope is RestartScope.GROUP:
            cause = f"the timer of rank {att.rank} expired"
            assert self._tg is not None
            self.hang.begin(
                self._tg,
                self._pool.attempts,
                self._scopes,
                cause=cause,
                reaped=att,
                dumping=dumping,
            )

    async def carry_out(self, decision: Restart) -> None:
        """Stop the ranks of ``decision``, wait its delay, launch them again; first wait
        for the hang report in progress (a job restart begins one if none is)."""
        if self.hang is not None:
            if decision.cause == "job" and not self._stopping():
                assert self._tg is not None
                self.hang.begin(
                    self._tg, self._pool.attempts, self._scopes, cause="a job-wide restart"
                )
            await self.hang.settle()
        self._emit(
            RestartScheduled(
                time=self._clock.time(),
                ranks=decision.ranks,
                delay=decision.delay,
                restarts=decision.restarts,
                attempt=decision.attempt,
                budget=decision.budget,
                cause=decision.cause,
            )
        )
        await self._pool.stop(decision.ranks)
        if self.hang is not None:
            self.hang.rearm()  # the ranks it covered are gone
        if decision.delay > 0:
            await self._clock.sleep_until(self._clock.monotonic() + decision.delay)
        if self._stopping() or self._planner.gave_up is not None:
            return
        for rank in decision.ranks:
            if self._planner.slot(rank).state is WorkerState.BACKOFF:
                self.launch(rank)

    def gave_up(self, decision: GiveUp) -> None:
        """Report the give-up and end the run."""
        self._emit(SupervisorGaveUp(time=self._clock.time(), reason=decision.reason))
        self._request_stop()

    def check_finished(self) -> None:
        """End the run once every slot is done and no attempt is left."""
        if self._planner.done() and not self._pool.attempts:
            self.conclude()
            self._request_stop()

    def conclude(self) -> None:
        """Settle :attr:`outcome` from the slots (once)."""
        if self.outcome is None:
            self.outcome = run_outcome(
                self._planner.slots, gave_up=self._planner.gave_up is not None
            )
