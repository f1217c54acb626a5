"""The supervisor: launch workers under a timer server, restart them under a policy.

A :class:`Supervisor` runs ``nproc`` copies of a command ("workers", ranks
``0 .. nproc-1``), each in its own session with a torch-style environment
(:data:`WORKER_ENV`), next to an embedded :class:`~aiotimer.TimerServer` whose FIFO lives
in a private ``0700`` runtime directory. It watches every worker through a pidfd,
classifies each exit and lets the pure :class:`~aiotimer.supervisor._restart.RestartPlanner`
decide (restart the worker or the group, finish, give up), through a
:class:`RestartCoordinator` (a job-wide one may replace or defer the proposal).

Embedding: ``async with Supervisor(["python", "train.py"], nproc=4) as sup: await
sup.wait()``, or ``await sup.start()`` ... ``await sup.aclose()``. Stopping sends SIGTERM
to every worker's process tree, SIGKILL after ``stop_timeout``, and returns only when
none of their processes is left. A killed supervisor leaves nothing running either: each
worker gets a parent-death signal, and with ``run_file`` its leftovers are recorded for
the run's guard and the next run (:mod:`aiotimer.supervisor._runfile`).

Lifecycle: ``created -> starting -> running -> stopping -> stopped`` (one run per object).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import signal
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import anyio

from aiotimer._edges.clock import Clock, MonotonicClock
from aiotimer._edges.lifecycle import LifecycleState, OwnedTask, TaskOwner
from aiotimer.errors import LaunchError, ServerStateError
from aiotimer.events import (
    Event,
    RankStatus,
    ServerStopped,
    SourceFailed,
    SupervisorStopped,
    TimerExpired,
    WorkerReaped,
)
from aiotimer.hang import HangReport, open_scopes
from aiotimer.reapers import Reaper, ReapPolicy, SignalReaper
from aiotimer.server import TimerServer
from aiotimer.supervisor import _proctree
from aiotimer.supervisor._delivery import Delivery
from aiotimer.supervisor._pool import WORKER_ENV, WorkerPool
from aiotimer.supervisor._ranks import Ranks
from aiotimer.supervisor._records import (
    Decision,
    LocalCoordinator,
    RestartCoordinator,
    RunOutcome,
    SupervisorState,
    WorkerFailure,
    format_summary,
    rank_status,
)
from aiotimer.supervisor._restart import GiveUp, Restart, RestartPlanner, RestartPolicy, WorkerState
from aiotimer.supervisor._rundumps import RunDumps
from aiotimer.supervisor._runfile import (
    RunFile,
    make_runtime_dir,
    runs_dir,
    runtime_parent,
    sweep,
)
from aiotimer.supervisor._stragglers import ON_STRAGGLER, Stragglers

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
    "format_summary",
]

logger = logging.getLogger("aiotimer")


class Supervisor(TaskOwner):
    """Runs ``nproc`` workers under an embedded timer server and restarts them.

    Args:
        command: the worker's argv (``command[0]`` is looked up on ``PATH``).
        nproc: how many workers (ranks ``0 .. nproc-1``).
        policy: the restart policy (scope, budget, back-off, min uptime, exit codes).
        stop_timeout: seconds between SIGTERM and SIGKILL when stopping a worker.
        run_id: exported as ``AIOTIMER_RUN_ID`` and ``TORCHELASTIC_RUN_ID`` (or random).
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
            worker's session are still stopped (process-wide: ``aiotimer run`` does).
        parent_death_signal: the signal every worker gets from the kernel when the
            thread that runs the supervisor's loop ends (``None``: none); SIGKILL ends
            even a hung worker, whom nobody watches once its supervisor is gone.
        run_file: record the running workers in a run file beside the runtime
            directory, and first stop what dead runs recorded there left behind
            (:mod:`aiotimer.supervisor._runfile`; ``aiotimer run`` turns it on).
        hang_report: under the group scope, take every rank's stacks (hooks in
            ``dump_dir``) within this many seconds before a reap (``None``: none).
        dump_dir: the workers' dump directory, exported to them as
            ``AIOTIMER_DUMP_DIR`` (default: the environment's ``AIOTIMER_DUMP_DIR``,
            else a private directory made for the run beside its runtime directory,
            ``aiotimer-dumps-<run id>-*``, and removed with it). A
            :class:`~aiotimer.SignalReaper` without a directory of its own is given it.
        keep_dumps: keep the directory made for the run when the run stops, if any
            dump file is left in it (the default reaper then keeps its exited workers'
            files too: ``SignalReaper(keep_dumps=True)``).
        on_straggler: what to do with a rank slower than its peers
            (:mod:`aiotimer.supervisor._stragglers`): ``"report"`` (a ``straggler``
            event, the status table, ``/metrics``) or ``"restart-rank"`` (also restart
            it, charged to the restart budget; once the budget is spent, only report).
        clock: the time source (monotonic seconds).
        rng: uniform ``[0, 1)`` floats for the back-off jitter.

    Raises:
        ValueError: ``nproc < 1``, an empty command, a negative ``stop_timeout`` or an
            unknown ``on_straggler``.
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
        parent_death_signal: int | None = signal.SIGKILL,
        run_file: bool = False,
        hang_report: float | None = None,
        dump_dir: str | os.PathLike[str] | None = None,
        keep_dumps: bool = False,
        on_straggler: str = "report",
        clock: Clock | None = None,
        rng: Callable[[], float] | None = None,
    ) -> None:
        if not command:
            raise ValueError("the worker command is empty")
        if not stop_timeout >= 0:
            raise ValueError(f"stop_timeout must be >= 0 seconds, got {stop_timeout!r}")
        if on_straggler not in ON_STRAGGLER:
            raise ValueError(f"on_straggler must be one of {ON_STRAGGLER}, got {on_straggler!r}")
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
        self._reaper: Reaper = reaper if reaper is not None else SignalReaper(keep_dumps=keep_dumps)
        self._dumps = RunDumps(dump_dir, keep=keep_dumps)
        self._events = Delivery(event_log, on_event)
        self._runtime_parent = runtime_dir
        if restart_count:
            self._planner.restart(tuple(range(nproc)), 0.0, budget=False, count=restart_count)
        self._subreaper = subreaper
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._life = OwnedTask("supervisor", restartable=False)
        self._server: TimerServer | None = None
        self._dir: Path | None = None
        self._fifo: Path | None = None
        self._pool = WorkerPool(
            self.command,
            cwd=cwd,
            stop_timeout=stop_timeout,
            subreaper=subreaper,
            parent_death_signal=parent_death_signal,
        )
        self._run_file = run_file
        self._finished = asyncio.Event()
        self._ranks = Ranks(
            planner=self._planner,
            pool=self._pool,
            policy=self.policy,
            nproc=nproc,
            run_id=self.run_id,
            env=self._env,
            clock=self._clock,
            coordinator=coordinator if coordinator is not None else LocalCoordinator(),
            owner=self,
            emit=self._events.emit,
            request_stop=self._life.request_stop,
            stopping=lambda: self._life.stop_requested,
            hang=(hang_report, dump_dir, event_log),
            scopes=lambda: open_scopes(self._server, nproc),
        )
        self._stragglers = Stragglers(
            ranks_by_pid=self._ranks.launched,
            emit=self._events.emit,
            wall=self._clock.time,
            restart=self._ranks.restart_straggler if on_straggler == "restart-rank" else None,
        )
        self._summary: tuple[RankStatus, ...] = ()
        self._interrupted: int | None = None  # the signal that stopped the run

    # -- lifecycle --------------------------------------------------------------------

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
        return self._ranks.outcome

    @property
    def exit_code(self) -> int | None:
        """The run's exit status, once it has ended: ``128 + N`` when signal ``N``
        stopped it (:meth:`interrupt`), else the :class:`RunOutcome`'s value."""
        outcome = self._ranks.outcome
        if outcome is None or not self._finished.is_set():
            return None
        return int(outcome) if self._interrupted is None else 128 + self._interrupted

    @property
    def summary(self) -> tuple[RankStatus, ...]:
        """Every rank's final status, the summary table's rows (empty until the supervisor
        has stopped)."""
        return self._summary

    async def start(self) -> None:
        """Start the timer server and every worker; return once they are launched.

        Raises:
            ServerStateError: already started.
            LaunchError: the command cannot be found.
            SourceError: the timer server could not open its FIFO.
        """
        if self._life.state is not LifecycleState.CREATED:
            raise ServerStateError(f"cannot start a {self._life.state.value} supervisor")
        exe = self.command[0]
        if shutil.which(exe, path=self._env.get("PATH")) is None:
            raise LaunchError(
                f"cannot run {exe!r}: no such executable (check the command and PATH)"
            )
        await self._life.start(self._main, name="aiotimer-supervisor")

    async def wait(self) -> RunOutcome:
        """Wait until the run ends (every worker done, given up, or stopped)."""
        await self._finished.wait()
        assert self._ranks.outcome is not None
        return self._ranks.outcome

    async def aclose(self) -> None:
        """Stop every worker (SIGTERM, then SIGKILL after ``stop_timeout``), then the
        server; return when no worker process is left, with the private runtime
        directory removed. Idempotent."""
        await super().aclose()
        self._remove_dir()

    def _remove_dir(self) -> None:
        # Kept until aclose(), not removed when the run ends by itself: what the owner
        # composed over the supervisor (a control socket in it) lives until then.
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._dumps.remove()

    def _place_dumps(self, parent: str | None, tag: str) -> None:
        """One dump directory for the run: given, else the environment's, else made
        now; the workers (``AIOTIMER_DUMP_DIR``), the reaper and the reports use it."""
        where = self._dumps.place(self._env, parent, tag)
        if isinstance(self._reaper, SignalReaper) and self._reaper.dump_dir is None:
            self._reaper.dump_dir = where
        if self._ranks.hang is not None:
            self._ranks.hang.dump_dir = where

    def interrupt(self, signum: int) -> None:
        """Stop the run because this process got signal ``signum`` (SIGINT, SIGTERM), as
        :meth:`aclose` does without waiting; the run then reports the exit status of a
        process that signal ended, ``128 + signum`` (:attr:`exit_code`, the
        ``supervisor_stopped`` event), which ``aiotimer run`` exits with. A second call
        skips what is left of ``stop_timeout`` (:meth:`kill`)."""
        if self._finished.is_set():
            return  # the run is over: its exit status stands
        if self._interrupted is not None:
            self.kill()
            return
        self._interrupted = signum
        self._life.request_stop()

    def kill(self) -> None:
        """Skip what is left of ``stop_timeout``: stopping sends SIGKILL at once, now
        and from now on (``aiotimer run`` calls it on a second SIGINT/SIGTERM)."""
        self._pool.hurry()

    async def run(self) -> RunOutcome:
        """Start, wait for the end of the run, stop: the whole run in one call."""
        async with self:
            return await self.wait()

    async def _main(self, ready: Callable[[], None]) -> None:
        """The supervisor's body (see :mod:`aiotimer._edges.lifecycle`)."""
        served = False
        try:
            async with anyio.create_task_group() as outer:
                await self._events.open(outer)
                try:
                    async with anyio.create_task_group() as tg:
                        try:
                            await self._start_server()
                            if self._subreaper and not _proctree.become_subreaper():
                                logger.warning(
                                    "cannot become a child subreaper here: descendants that "
                                    "leave a worker's session will not be stopped"
                                )
                            assert self._fifo is not None
                            self._ranks.begin(tg, self._fifo)
                            ready()
                            served = True
                            await self._life.wait_stop_requested()
                        finally:
                            with anyio.CancelScope(shield=True):
                                await self._shutdown()
                            tg.cancel_scope.cancel()  # e.g. a coordinator still deciding
                finally:
                    self._events.close()
        finally:
            if not served:  # start() fails: nobody will call aclose()
                self._remove_dir()

    async def _start_server(self) -> None:
        parent = runtime_parent(self._runtime_parent)
        self._dir, tag = make_runtime_dir(parent, self.run_id)
        self._fifo = self._dir / "timer.fifo"
        self._place_dumps(parent, tag)
        if self._run_file:
            runs = runs_dir(parent)
            for line in sweep(runs):
                logger.warning("%s", line)
            self._pool.run_file = RunFile(runs, str(self._fifo))
            self._pool.run_file.record(())
        self._server = TimerServer(
            fifo=self._fifo,
            reaper=self._ranks.observe(self._reaper),
            policy=self._ranks.reap_policy(self._reap_policy),
            clock=self._clock,
            on_event=self._server_event,
            on_requests=self._stragglers.observe,
        )
        await self._server.start()

    async def _shutdown(self) -> None:
        """Stop every worker and everything they left, then the server."""
        self._life.request_stop()
        await self._pool.stop_all()
        self._planner.set_state(
            (s.rank for s in self._planner.slots if not s.state.terminal), WorkerState.STOPPED
        )
        self._ranks.conclude()
        if self._server is not None:
            await self._server.aclose()
        self._summary = tuple(rank_status(s, None) for s in self._planner.slots)
        outcome = self._ranks.outcome
        assert outcome is not None
        self._finished.set()
        exit_code = self.exit_code
        assert exit_code is not None
        self._events.emit(
            SupervisorStopped(
                time=self._clock.time(),
                outcome=outcome.name.lower(),
                exit_code=exit_code,
                workers=self._summary,
                signal=self._interrupted,
            )
        )

    # -- what the server tells us ------------------------------------------------------

    def _server_event(self, event: Event) -> None:
        if isinstance(event, TimerExpired | WorkerReaped):
            self._ranks.expired(event)
        self._events.deliver(event)
        if isinstance(event, SourceFailed | ServerStopped) and not self._life.stop_requested:
            # Without its FIFO the server can no longer time the workers: say so, stop.
            what = "its FIFO failed" if isinstance(event, SourceFailed) else "it stopped"
            self.give_up(f"the timer server can no longer watch the workers: {what}")

    # -- operator actions (also for a control plane or a cluster coordinator) ----------

    async def stop_worker(self, rank: int) -> None:
        """Stop worker ``rank`` for good (SIGTERM, SIGKILL after ``stop_timeout``).

        Raises:
            ServerStateError: the supervisor is not running.
            IndexError: no such rank.
        """
        self._check_rank(rank)
        await self._ranks.stop_for_good(rank)

    async def restart_workers(
        self, ranks: Sequence[int] | None = None, *, count: int | None = None
    ) -> None:
        """Restart ``ranks`` (default: every worker) now, outside the restart budget.

        Running ones are stopped first. ``count`` sets their restart count (a job-wide
        generation) instead of adding one: the restart is then reported as a job-wide
        one, else as an operator's (logged at INFO).

        Raises:
            ServerStateError: the supervisor is not running.
            IndexError: no such rank.
        """
        chosen = tuple(range(self._nproc)) if ranks is None else tuple(ranks)
        for rank in chosen:
            self._check_rank(rank)
        await self._ranks.restart_now(chosen, count)

    def give_up(self, reason: str) -> None:
        """End the run: stop every worker (a coordinator's or operator's decision)."""
        if self._planner.gave_up is None:
            self._ranks.gave_up(self._planner.give_up(reason))

    def _check_rank(self, rank: int) -> None:
        state = self._life.state
        if state is not LifecycleState.RUNNING:
            what = "has given up" if self._planner.gave_up is not None else "is " + state.value
            raise ServerStateError(f"the supervisor {what} and is not taking actions")
        if not 0 <= rank < self._nproc:
            raise IndexError(f"no worker {rank}: ranks are 0..{self._nproc - 1}")

    # -- introspection ------------------------------------------------------------------

    def get_state(self, *, server: bool = True) -> SupervisorState:
        """A snapshot of the supervisor and its workers (call it in the loop's thread).

        ``server=False`` leaves the server's state out (``None``): it copies every live
        timer, which a frequent caller (the control socket) does not need."""
        now = self._clock.monotonic()
        return SupervisorState(
            state=self._life.state,
            run_id=self.run_id,
            command=self.command,
            policy=self.policy,
            fifo=self._fifo,
            restarts_in_window=self._planner.restarts_in_window(now),
            workers=self._stragglers.annotate(self._ranks.statuses(now)),
            outcome=self._ranks.outcome,
            gave_up=None if self._planner.gave_up is None else self._planner.gave_up.reason,
            server=None if self._server is None or not server else self._server.get_state(),
            ranks_by_pid=dict(self._ranks.launched),
            hang_report=None if self.hang_report is None else self.hang_report.summary(),
        )

    @property
    def hang_report(self) -> HangReport | None:
        """The last hang report, if any."""
        return None if self._ranks.hang is None else self._ranks.hang.last

    def __repr__(self) -> str:
        running = sum(1 for s in self._planner.slots if s.state.alive)
        return (
            f"<Supervisor {self._life.state.value}: {running}/{self._nproc} workers running, "
            f"run {self.run_id}>"
        )
