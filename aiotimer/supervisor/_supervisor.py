"""The supervisor: launch workers under a timer server, restart them under a policy.

A :class:`Supervisor` runs ``nproc`` copies of a command ("workers", ranks
``0 .. nproc-1``) next to an embedded :class:`~aiotimer.TimerServer` whose FIFO lives
in a private ``0700`` runtime directory. Each worker gets its own session and process
group and the environment a torch-style worker reads (see :data:`WORKER_ENV`). The
supervisor watches every worker through a pidfd, classifies each exit (reaped by the
timer, crashed, killed by a signal, succeeded, stopped) and lets the pure
:class:`~aiotimer.supervisor._restart.RestartPlanner` decide: restart the worker, restart the
group, finish, or give up. Restarts and give-ups go through a
:class:`RestartCoordinator` (the local default carries out the planner's proposal; a
job-wide coordinator may replace or defer it).

Embedding, like :class:`~aiotimer.TimerServer`::

    async with Supervisor(["python", "train.py"], nproc=4) as sup:
        outcome = await sup.wait()

or ``await sup.start()`` ... ``await sup.aclose()``. Stopping sends SIGTERM to every
worker's process tree, SIGKILL after ``stop_timeout``, and returns only when none of
their processes is left.

Lifecycle: ``created -> starting -> running -> stopping -> stopped`` (one run per
object).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import anyio
import anyio.abc

from aiotimer._edges.clock import Clock, MonotonicClock
from aiotimer._edges.eventlog import EventLog
from aiotimer.control._supervisor_app import supervisor_routes
from aiotimer.errors import LaunchError, ServerStateError
from aiotimer.events import (
    Event,
    RestartScheduled,
    ServerStopped,
    SourceFailed,
    SupervisorGaveUp,
    SupervisorStopped,
    TimerExpired,
    WorkerEnded,
    WorkerReaped,
    WorkerRunning,
    WorkerStarted,
    WorkerSummary,
)
from aiotimer.reapers._policy import ReapPolicy
from aiotimer.reapers._signal import Reaper, SignalReaper
from aiotimer.server._server import Lifecycle, TimerServer
from aiotimer.supervisor import _proctree
from aiotimer.supervisor._exits import ExitReason, classify_exit
from aiotimer.supervisor._pool import (
    WORKER_ENV,
    Attempt,
    ObservedReaper,
    WorkerPool,
    free_port,
    worker_env,
)
from aiotimer.supervisor._records import (
    Decision,
    LocalCoordinator,
    RestartCoordinator,
    RunOutcome,
    SupervisorState,
    WorkerFailure,
    WorkerSnapshot,
    format_summary,
    run_outcome,
    worker_snapshot,
    worker_summaries,
)
from aiotimer.supervisor._restart import GiveUp, Restart, RestartPlanner, RestartPolicy, WorkerState

__all__ = [
    "WORKER_ENV",
    "Decision",
    "GiveUp",
    "LocalCoordinator",
    "Restart",
    "RestartCoordinator",
    "RunOutcome",
    "Supervisor",
    "SupervisorState",
    "WorkerFailure",
    "WorkerSnapshot",
    "format_summary",
]

logger = logging.getLogger("aiotimer")


class Supervisor:
    """Runs ``nproc`` workers under an embedded timer server and restarts them.

    Args:
        command: the worker's argv (``command[0]`` is looked up on ``PATH``).
        nproc: how many workers (ranks ``0 .. nproc-1``).
        policy: the restart policy (scope, budget, back-off, min uptime, no-restart
            exit codes).
        stop_timeout: seconds between SIGTERM and SIGKILL when stopping a worker.
        run_id: exported as ``AIOTIMER_RUN_ID`` and ``TORCHELASTIC_RUN_ID`` (default: a
            random id).
        env: the workers' base environment (default: this process's).
        cwd: the workers' working directory.
        reap_policy: the embedded server's escalation policy.
        reaper: the embedded server's reaper (default :class:`~aiotimer.SignalReaper`).
        on_event: called with every event, the server's and the supervisor's, in order.
        event_log: append every event (server's and supervisor's) to this JSON-lines file.
        runtime_dir: where the private runtime directory is made (default:
            ``$XDG_RUNTIME_DIR``, else the system temp dir).
        coordinator: carries out restart decisions (default :class:`LocalCoordinator`).
        restart_count: the restart count every worker starts with (a job-wide restart
            generation that a node joining late catches up with).
        subreaper: make this process a child subreaper, so descendants that escape a
            worker's session are still found and stopped (process-wide: ``aiotimer run``
            turns it on; an embedding agent decides).
        control: the embedded server's control socket (see
            :class:`~aiotimer.TimerServer`): it also serves this supervisor's workers and
            the operator actions restart and stop (see :mod:`aiotimer.control`).
        clock: the time source (monotonic seconds).
        rng: uniform ``[0, 1)`` floats for the back-off jitter.

    Raises:
        ValueError: ``nproc < 1``, an empty command or a negative ``stop_timeout``.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        nproc: int = 1,
        policy: RestartPolicy | None = None,
        stop_timeout: float = 10.0,
        run_id: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        reap_policy: ReapPolicy | None = None,
        reaper: Reaper | None = None,
        on_event: Callable[[Event], None] | None = None,
        event_log: str | os.PathLike[str] | None = None,
        runtime_dir: str | os.PathLike[str] | None = None,
        coordinator: RestartCoordinator | None = None,
        restart_count: int = 0,
        subreaper: bool = False,
        control: str | os.PathLike[str] | bool = True,
        clock: Clock | None = None,
        rng: Callable[[], float] | None = None,
    ) -> None:
        if not command:
            raise ValueError("the worker command is empty")
        if not stop_timeout >= 0:
            raise ValueError(f"stop_timeout must be >= 0 seconds, got {stop_timeout!r}")
        self.command = tuple(command)
        self.policy = policy if policy is not None else RestartPolicy()
        self.run_id = run_id if run_id is not None else uuid.uuid4().hex[:12]
        self._nproc = nproc
        self._planner = RestartPlanner(
            self.policy, nproc, rng if rng is not None else random.Random().random
        )
        self._stop_timeout = stop_timeout
        self._env = dict(os.environ if env is None else env)
        self._reap_policy = reap_policy
        self._reaper: Reaper = reaper if reaper is not None else SignalReaper()
        self._on_event = on_event
        self._event_log_path = event_log
        self._runtime_parent = runtime_dir
        self._coordinator = coordinator if coordinator is not None else LocalCoordinator()
        if restart_count:
            self._planner.restart(tuple(range(nproc)), 0.0, budget=False, count=restart_count)
        self._subreaper = subreaper
        self._control = control
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._state = Lifecycle.CREATED
        self._server: TimerServer | None = None
        self._dir: Path | None = None
        self._fifo: Path | None = None
        self._master_port = 0
        self._pool = WorkerPool(
            self.command, cwd=cwd, stop_timeout=stop_timeout, subreaper=subreaper
        )
        self._tg: anyio.abc.TaskGroup | None = None
        self._event_log: EventLog | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._finished = asyncio.Event()
        self._outcome: RunOutcome | None = None
        self._summary: tuple[WorkerSummary, ...] = ()

    # -- lifecycle --------------------------------------------------------------------

    @property
    def state(self) -> Lifecycle:
        """The current lifecycle state."""
        return self._state

    @property
    def server(self) -> TimerServer | None:
        """The embedded timer server (``None`` before :meth:`start`)."""
        return self._server

    @property
    def fifo(self) -> Path | None:
        """The embedded server's FIFO (``None`` before :meth:`start`)."""
        return self._fifo

    @property
    def outcome(self) -> RunOutcome | None:
        """How the run ended, once it has."""
        return self._outcome

    @property
    def summary(self) -> tuple[WorkerSummary, ...]:
        """The final per-worker summary (empty until the supervisor has stopped)."""
        return self._summary

    async def start(self) -> None:
        """Start the timer server and every worker; return once they are launched.

        Raises:
            ServerStateError: already started.
            LaunchError: the command cannot be found.
            SourceError: the timer server could not open its FIFO.
        """
        if self._state is not Lifecycle.CREATED:
            raise ServerStateError(f"cannot start a {self._state.value} supervisor")
        exe = self.command[0]
        if shutil.which(exe, path=self._env.get("PATH")) is None:
            raise LaunchError(
                f"cannot run {exe!r}: no such executable (check the command and PATH)"
            )
        self._state = Lifecycle.STARTING
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._task = loop.create_task(self._main(ready), name="aiotimer-supervisor")
        try:
            await asyncio.shield(ready)
        except BaseException:
            self._stop.set()
            await asyncio.shield(self._task)
            raise

    async def wait(self) -> RunOutcome:
        """Wait until the run ends (every worker done, given up, or stopped)."""
        await self._finished.wait()
        assert self._outcome is not None
        return self._outcome

    async def aclose(self) -> None:
        """Stop every worker (SIGTERM, then SIGKILL after ``stop_timeout``), then the
        server; return when no worker process is left. Idempotent."""
        if self._task is None:
            return
        if self._state is Lifecycle.RUNNING:
            self._state = Lifecycle.STOPPING
        self._stop.set()
        await asyncio.shield(self._task)

    def kill(self) -> None:
        """Skip what is left of ``stop_timeout``: stopping sends SIGKILL at once, now
        and from now on (``aiotimer run`` calls it on a second SIGINT/SIGTERM)."""
        self._pool.hurry()

    async def run(self) -> RunOutcome:
        """Start, wait for the end of the run, stop: the whole run in one call."""
        async with self:
            return await self.wait()

    async def __aenter__(self) -> Supervisor:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _main(self, ready: asyncio.Future[None]) -> None:
        """The task that owns the supervisor's task groups."""
        try:
            async with anyio.create_task_group() as outer:
                if self._event_log_path is not None:
                    self._event_log = EventLog(self._event_log_path)
                    await outer.start(self._event_log.run)
                try:
                    async with anyio.create_task_group() as tg:
                        self._tg = tg
                        try:
                            await self._start_server()
                            if self._subreaper and not _proctree.become_subreaper():
                                logger.warning(
                                    "cannot become a child subreaper here: descendants that "
                                    "leave a worker's session will not be stopped"
                                )
                            self._master_port = free_port()
                            for rank in range(self._nproc):
                                self._launch(rank)
                            self._state = Lifecycle.RUNNING
                            ready.set_result(None)
                            await self._stop.wait()
                        finally:
                            with anyio.CancelScope(shield=True):
                                await self._shutdown()
                            tg.cancel_scope.cancel()  # e.g. a coordinator still deciding
                finally:
                    if self._event_log is not None:
                        self._event_log.close()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
                if isinstance(exc, Exception):
                    return
            elif isinstance(exc, Exception):
                logger.exception("the supervisor crashed")
                return
            raise
        finally:
            self._state = Lifecycle.STOPPED
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)

    async def _start_server(self) -> None:
        parent = self._runtime_parent or os.environ.get("XDG_RUNTIME_DIR") or None
        if parent is not None and not os.path.isdir(parent):
            parent = None
        tag = re.sub(r"[^A-Za-z0-9_.-]", "_", self.run_id)[:24]  # any run id, a safe name
        self._dir = Path(tempfile.mkdtemp(prefix=f"aiotimer-{tag}-", dir=parent))
        self._fifo = self._dir / "timer.fifo"
        self._server = TimerServer(
            fifo=self._fifo,
            reaper=ObservedReaper(self._reaper, self._timer_registered),
            policy=self._reap_policy,
            clock=self._clock,
            on_event=self._server_event,
            control=self._control,
            control_routes=supervisor_routes(self),
        )
        await self._server.start()

    async def _shutdown(self) -> None:
        """Stop every worker and everything they left, then the server."""
        self._stop.set()
        await self._pool.stop_all()
        self._planner.set_state(
            (s.rank for s in self._planner.slots if not s.state.terminal), WorkerState.STOPPED
        )
        self._conclude()
        if self._server is not None:
            await self._server.aclose()
        self._summary = worker_summaries(self._planner.slots)
        assert self._outcome is not None
        self._emit(
            SupervisorStopped(
                time=self._clock.time(),
                outcome=self._outcome.name.lower(),
                exit_code=int(self._outcome),
                workers=self._summary,
            )
        )
        self._finished.set()

    # -- launching and watching ---------------------------------------------------------

    def _launch(self, rank: int) -> None:
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
            max_restarts=self.policy.max_restarts,
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
                self._running(att, f"up for {self.policy.min_uptime:g}s")

        reason = await self._pool.wait(att, while_running=uptime_evidence)
        self._ended(att.rank, att, reason)

    def _running(self, att: Attempt, evidence: str) -> None:
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
                uptime=last.uptime,
                start_failure=last.start_failure,
                state=record.state.value,
                description=reason.describe(),
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
                self._gave_up(decision)  # final: not the coordinator's to overturn
        self._check_finished()

    async def _coordinate(self, failure: WorkerFailure, proposal: Restart) -> None:
        decision = await self._coordinator.decide(self, failure, proposal)
        if isinstance(decision, Restart):
            await self._carry_out(decision)
        elif isinstance(decision, GiveUp):
            self.give_up(decision.reason)

    async def _carry_out(self, decision: Restart) -> None:
        self._emit(
            RestartScheduled(
                time=self._clock.time(),
                ranks=decision.ranks,
                delay=decision.delay,
                restarts=decision.restarts,
                attempt=decision.attempt,
                budget=decision.budget,
            )
        )
        await self._pool.stop(decision.ranks)
        if decision.delay > 0:
            await self._clock.sleep_until(self._clock.monotonic() + decision.delay)
        if self._stop.is_set() or self._planner.gave_up is not None:
            return
        for rank in decision.ranks:
            if self._planner.slot(rank).state is WorkerState.BACKOFF:
                self._launch(rank)

    def _gave_up(self, decision: GiveUp) -> None:
        self._emit(SupervisorGaveUp(time=self._clock.time(), reason=decision.reason))
        self._stop.set()

    def _check_finished(self) -> None:
        if self._planner.done() and not self._pool.attempts:
            self._conclude()
            self._stop.set()

    def _conclude(self) -> None:
        if self._outcome is None:
            self._outcome = run_outcome(
                self._planner.slots, gave_up=self._planner.gave_up is not None
            )

    # -- what the server tells us ------------------------------------------------------

    def _timer_registered(self, pid: int) -> None:
        """``pid`` sent its first timer request (the server pinned it)."""
        att = self._pool.owner(pid)
        if att is not None:
            self._running(att, "sent a timer request")

    def _server_event(self, event: Event) -> None:
        if isinstance(event, TimerExpired | WorkerReaped):
            att = self._pool.note(event)
            if att is not None and self._planner.slot(att.rank).state.alive:
                self._planner.expired(att.rank)
        self._deliver(event)
        if isinstance(event, SourceFailed | ServerStopped) and not self._stop.is_set():
            # Without its FIFO the server can no longer time the workers: say so, stop.
            what = "its FIFO failed" if isinstance(event, SourceFailed) else "it stopped"
            self.give_up(f"the timer server can no longer watch the workers: {what}")

    # -- events -----------------------------------------------------------------------

    def _emit(self, event: Event) -> None:
        level = event.log_level() if isinstance(event, WorkerEnded) else event.level
        if logger.isEnabledFor(level):
            logger.log(level, event.describe(), extra={"aiotimer": event.to_dict()})
        self._deliver(event)

    def _deliver(self, event: Event) -> None:
        if self._event_log is not None:
            self._event_log.put(event)
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:
                logger.exception("the on_event callback raised on %s; ignored", event.kind)

    # -- operator actions (also for a control plane or a cluster coordinator) ----------

    async def stop_worker(self, rank: int) -> None:
        """Stop worker ``rank`` for good (SIGTERM, SIGKILL after ``stop_timeout``).

        Raises:
            ServerStateError: the supervisor is not running.
            IndexError: no such rank.
        """
        self._check_rank(rank)
        await self._pool.stop([rank])
        self._planner.set_state([rank], WorkerState.STOPPED)
        self._check_finished()

    async def restart_workers(
        self, ranks: Sequence[int] | None = None, *, count: int | None = None
    ) -> None:
        """Restart ``ranks`` (default: every worker) now, outside the restart budget.

        Running ones are stopped first. ``count`` sets their restart count (a job-wide
        generation) instead of adding one.

        Raises:
            ServerStateError: the supervisor is not running.
            IndexError: no such rank.
        """
        chosen = tuple(range(self._nproc)) if ranks is None else tuple(ranks)
        for rank in chosen:
            self._check_rank(rank)
        for rank in chosen:
            att = self._pool.attempts.get(rank)
            if att is not None:
                att.stop_requested = True
        decision = self._planner.restart(chosen, self._clock.monotonic(), budget=False, count=count)
        await self._carry_out(decision)

    def give_up(self, reason: str) -> None:
        """End the run: stop every worker (a coordinator's or operator's decision)."""
        if self._planner.gave_up is None:
            self._gave_up(self._planner.give_up(reason))

    def _check_rank(self, rank: int) -> None:
        if self._state is not Lifecycle.RUNNING or self._stop.is_set():
            raise ServerStateError(
                f"the supervisor is {self._state.value} and not taking actions "
                "(it is stopping or has given up)"
                if self._state is Lifecycle.RUNNING
                else f"the supervisor is {self._state.value}, not running"
            )
        if not 0 <= rank < self._nproc:
            raise IndexError(f"no worker {rank}: ranks are 0..{self._nproc - 1}")

    # -- introspection ------------------------------------------------------------------

    def get_state(self, *, server: bool = True) -> SupervisorState:
        """A snapshot of the supervisor and its workers (call it in the loop's thread).

        ``server=False`` leaves the server's state out (``None``): it copies every live
        timer, which a frequent caller (the control socket) does not need."""
        now = self._clock.monotonic()
        workers = []
        for s in self._planner.slots:
            att = self._pool.attempts.get(s.rank)
            running = None if att is None else (att.pid, now - att.started_at)
            workers.append(worker_snapshot(s, running))
        return SupervisorState(
            state=self._state,
            run_id=self.run_id,
            command=self.command,
            policy=self.policy,
            fifo=self._fifo,
            restarts_in_window=self._planner.restarts_in_window(now),
            workers=tuple(workers),
            outcome=self._outcome,
            gave_up=None if self._planner.gave_up is None else self._planner.gave_up.reason,
            server=None if self._server is None or not server else self._server.get_state(),
        )

    def __repr__(self) -> str:
        running = sum(1 for s in self._planner.slots if s.state.alive)
        return (
            f"<Supervisor {self._state.value}: {running}/{self._nproc} workers running, "
            f"run {self.run_id}>"
        )
