"""Restart policy: what to do when a supervised worker exits. Pure: no I/O, no clock.

How this works
--------------
A supervisor runs ``nproc`` worker *slots* (ranks). Each slot runs one *attempt* (a
process) at a time. The :class:`RestartPlanner` keeps every slot's state and history and
is told what happens, with the time passed in (``now``, monotonic seconds):

* :meth:`~RestartPlanner.started` — an attempt was launched (``INIT``/``BACKOFF`` ->
  ``STARTING``);
* :meth:`~RestartPlanner.running` — evidence that it runs: it survived ``min_uptime``
  or sent its first timer request (``STARTING`` -> ``HEALTHY``); never assumed;
* :meth:`~RestartPlanner.expired` — one of its timers expired and it is being reaped
  (-> ``UNHEALTHY``);
* :meth:`~RestartPlanner.exited` — the attempt ended, with an
  :class:`~aiotimer.supervisor._exits.ExitReason` (see
  :func:`~aiotimer.supervisor._exits.classify_exit`).
  The planner answers with a :data:`Decision`:

  - :class:`Finish` — this slot is done (``SUCCEEDED`` on exit 0, ``FAILED`` on a
    no-restart exit code in worker scope); other slots are unaffected;
  - :class:`Restart` — restart ``ranks`` after ``delay`` seconds (worker scope: the
    slot alone, one_for_one; group scope: every slot, one_for_all, the others being
    stopped first);
  - :class:`GiveUp` — stop every slot and end the run: the budget is exhausted (the
    slot ends ``FATAL``) or, in group scope, a slot exited with a no-restart code (it
    ends ``FAILED``); the others end ``STOPPED``;
  - ``None`` — nothing to do (the supervisor stopped that attempt itself).

The budget is Erlang's restart intensity: at most ``max_restarts`` restarts within any
``window`` seconds, counted over the whole supervisor (a group restart counts once).
The back-off delay of a restart grows with the restarts already in the window:
``initial * factor**n``, capped, times a jitter factor drawn from the injected RNG, so
a crash loop slows down and a failure after hours of calm restarts quickly.

An exit before the attempt reached ``HEALTHY`` is a *start failure*: counted per slot
and reported, and restarted (with back-off) like any other failure.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from aiotimer.events import WorkerState
from aiotimer.supervisor._exits import ExitKind, ExitReason

__all__ = [
    "DEFAULT_NO_RESTART_EXIT_CODES",
    "Attempt",
    "Backoff",
    "Decision",
    "Finish",
    "GiveUp",
    "Restart",
    "RestartPlanner",
    "RestartPolicy",
    "RestartScope",
    "SlotRecord",
    "WorkerState",
]

#: NVIDIA's fault-tolerance launcher convention: a worker exiting 93 must not be restarted.
DEFAULT_NO_RESTART_EXIT_CODES: frozenset[int] = frozenset({93})


class RestartScope(enum.Enum):
    """What a failure restarts: the worker alone, or every worker of the group."""

    WORKER = "worker"  #: one_for_one
    GROUP = "group"  #: one_for_all


def _check_seconds(name: str, value: float, *, infinite: bool = False) -> None:
    if not (value >= 0 and (infinite or math.isfinite(value))):
        raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential back-off: ``min(cap, initial * factor**n)`` times a jitter factor.

    The jitter factor is uniform in ``[1 - jitter, 1 + jitter]``; the result never
    exceeds ``cap``. With the defaults each step is at least ~1.6x the previous one
    until the cap.

    Raises:
        ValueError: a negative or non-finite duration, ``initial`` above ``cap``,
            ``factor < 1`` or ``jitter`` outside ``[0, 1)``.
    """

    initial: float = 1.0
    cap: float = 30.0
    factor: float = 2.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        _check_seconds("initial", self.initial)
        _check_seconds("cap", self.cap)
        if self.initial > self.cap:
            raise ValueError(
                f"the initial delay ({self.initial:g}s) must not exceed the cap ({self.cap:g}s)"
            )
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise ValueError(f"factor must be a finite number >= 1, got {self.factor!r}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter!r}")

    def delay(self, n: int, u: float) -> float:
        """The delay before restart number ``n`` (0-based) given ``u`` uniform in [0, 1)."""
        base = self.cap
        if self.initial == 0:
            base = 0.0  # 0 * factor**n: no back-off at all
        elif self.initial < self.cap and (
            self.factor == 1 or n < math.log(self.cap / self.initial, self.factor)
        ):
            base = min(self.cap, self.initial * self.factor**n)
        return min(self.cap, base * (1 - self.jitter + 2 * self.jitter * u))


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How a supervisor restarts workers.

    Args:
        scope: restart the failed worker alone or the whole group.
        max_restarts: restarts allowed within ``window`` seconds (0: never restart).
        window: the budget's sliding window in seconds, > 0 (``math.inf``: no window,
            the budget counts every restart and never refills, as in torch).
        backoff: the delay before each restart.
        min_uptime: an attempt that ends sooner without having sent a timer request is
            a start failure.
        no_restart_exit_codes: exit codes that mean "do not restart me".

    Raises:
        ValueError: a negative count or duration, or a zero window.
    """

    scope: RestartScope = RestartScope.WORKER
    max_restarts: int = 3
    window: float = 600.0
    backoff: Backoff = field(default_factory=Backoff)
    min_uptime: float = 1.0
    no_restart_exit_codes: frozenset[int] = DEFAULT_NO_RESTART_EXIT_CODES

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        _check_seconds("window", self.window, infinite=True)
        if self.window == 0:  # it would count no restart, and the run would never give up
            raise ValueError(
                "window must be > 0 seconds, or math.inf for no window (every restart counts)"
            )
        _check_seconds("min_uptime", self.min_uptime)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One ended attempt of a slot: its reason, how long it ran, and whether it ever ran."""

    reason: ExitReason
    uptime: float
    start_failure: bool


@dataclass(frozen=True, slots=True)
class SlotRecord:
    """A slot's state and history (immutable; the planner replaces it on each change).

    ``restarts`` is the slot's restart count (``AIOTIMER_RESTART_COUNT`` of its current
    or next attempt); ``started_at`` the current attempt's start (monotonic), if alive.
    """

    rank: int
    state: WorkerState = WorkerState.INIT
    restarts: int = 0
    started_at: float | None = None
    attempts: tuple[Attempt, ...] = ()

    @property
    def start_failures(self) -> int:
        """How many attempts ended before they were seen running."""
        return sum(a.start_failure for a in self.attempts)


@dataclass(frozen=True, slots=True)
class Finish:
    """Slot ``rank`` is done for good, in ``state``."""

    rank: int
    state: WorkerState


@dataclass(frozen=True, slots=True)
class Restart:
    """Restart ``ranks`` after ``delay`` seconds (stop those still running first).

    ``restarts`` is the restart count each gets (``AIOTIMER_RESTART_COUNT``); ``attempt``
    the restart's number within the budget window (1-based) and ``budget`` its size, or
    ``-1`` when the restart is not charged to the budget. ``cause``: ``"failure"`` (the
    policy's answer to an exit), ``"operator"`` or ``"job"`` (a job-wide restart).
    """

    ranks: tuple[int, ...]
    delay: float
    restarts: tuple[int, ...]
    attempt: int
    budget: int
    cause: str = "failure"


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Stop every slot and end the run (the slots still running end ``STOPPED``)."""

    reason: str


Decision = Finish | Restart | GiveUp

_ALIVE = frozenset(s for s in WorkerState if s.alive)
_ALLOWED: dict[str, frozenset[WorkerState]] = {
    "started": frozenset({WorkerState.INIT, WorkerState.BACKOFF}),
    "running": frozenset({WorkerState.STARTING}),
    "expired": _ALIVE,
    "exited": _ALIVE,
}


class RestartPlanner:
    """The restart policy's state for one group of ``nproc`` slots (see the module doc).

    Args:
        policy: the restart policy.
        nproc: the number of slots (ranks ``0 .. nproc-1``).
        rng: returns a float uniform in ``[0, 1)`` for the back-off jitter (inject a
            seeded ``random.Random().random`` for reproducible delays).

    Raises:
        ValueError: ``nproc < 1``; a transition not allowed from the slot's state.
    """

    def __init__(self, policy: RestartPolicy, nproc: int, rng: Callable[[], float]) -> None:
        if nproc < 1:
            raise ValueError(f"nproc must be >= 1, got {nproc}")
        self.policy = policy
        self._rng = rng
        self._slots = [SlotRecord(rank) for rank in range(nproc)]
        self._restart_times: deque[float] = deque()
        self.gave_up: GiveUp | None = None

    @property
    def slots(self) -> tuple[SlotRecord, ...]:
        """Every slot's record, by rank."""
        return tuple(self._slots)

    def slot(self, rank: int) -> SlotRecord:
        """Slot ``rank``'s record."""
        return self._slots[rank]

    def restarts_in_window(self, now: float) -> int:
        """How many restarts the budget counts at ``now``."""
        self._prune(now)
        return len(self._restart_times)

    def done(self) -> bool:
        """True when every slot is terminal."""
        return all(s.state.terminal for s in self._slots)

    # -- transitions -------------------------------------------------------------------

    def _move(self, rank: int, event: str, **changes: object) -> SlotRecord:
        record = self._slots[rank]
        if record.state not in _ALLOWED[event]:
            raise ValueError(f"slot {rank} is {record.state.value}: cannot be {event}")
        record = self._slots[rank] = replace(record, **changes)  # type: ignore[arg-type]
        return record

    def started(self, rank: int, now: float) -> None:
        """An attempt of slot ``rank`` was launched."""
        self._move(rank, "started", state=WorkerState.STARTING, started_at=now)

    def running(self, rank: int) -> bool:
        """Evidence that slot ``rank`` runs; ``True`` if that made it ``HEALTHY``."""
        if self._slots[rank].state is not WorkerState.STARTING:
            return False
        self._move(rank, "running", state=WorkerState.HEALTHY)
        return True

    def healthy_at(self, rank: int) -> float | None:
        """When slot ``rank`` counts as running by uptime, if it is still ``STARTING``."""
        record = self._slots[rank]
        if record.state is not WorkerState.STARTING or record.started_at is None:
            return None
        return record.started_at + self.policy.min_uptime

    def expired(self, rank: int) -> None:
        """A timer of slot ``rank`` expired and it is being reaped."""
        self._move(rank, "expired", state=WorkerState.UNHEALTHY)

    def set_state(self, ranks: Iterable[int], state: WorkerState) -> None:
        """Force ``ranks`` (those not running) into ``state``: operator stops, give-ups."""
        for rank in ranks:
            if not self._slots[rank].state.alive:
                self._slots[rank] = replace(self._slots[rank], state=state)

    def exited(
        self, rank: int, reason: ExitReason, now: float, *, stopped: bool = False
    ) -> Decision | None:
        """Attempt of slot ``rank`` ended for ``reason``; what to do (see the module doc).

        ``stopped``: the supervisor was stopping this attempt (a shutdown, a group
        restart, an operator), so its exit decides nothing, whatever its reason (a
        ``STOPPED`` reason implies it).
        """
        record = self._slots[rank]
        started = record.started_at if record.started_at is not None else now
        stopped = stopped or reason.kind is ExitKind.STOPPED
        start_failure = (
            record.state is WorkerState.STARTING
            and not stopped
            and reason.kind is not ExitKind.SUCCEEDED
        )
        attempt = Attempt(reason, max(0.0, now - started), start_failure)
        self._move(
            rank,
            "exited",
            state=WorkerState.BACKOFF,
            started_at=None,
            attempts=(*record.attempts, attempt),
        )
        if self.gave_up is not None:
            self._finish(rank, WorkerState.STOPPED)
            return None
        if stopped:
            return None  # the supervisor decides what happens to slots it stopped
        if reason.kind is ExitKind.SUCCEEDED:
            return self._finish(rank, WorkerState.SUCCEEDED)
        if reason.exit_code in self.policy.no_restart_exit_codes:
            why = f"worker {rank} exited with no-restart code {reason.exit_code}"
            self._finish(rank, WorkerState.FAILED)
            if self.policy.scope is not RestartScope.WORKER:
                return self.give_up(why)
            return Finish(rank, WorkerState.FAILED)
        ranks = (
            tuple(range(len(self._slots)))
            if self.policy.scope is not RestartScope.WORKER
            else (rank,)
        )
        n = self.restarts_in_window(now)
        if n >= self.policy.max_restarts:
            window = "" if math.isinf(self.policy.window) else f" in {self.policy.window:g}s"
            self._finish(rank, WorkerState.FATAL)
            return self.give_up(
                f"restart budget exhausted ({self.policy.max_restarts} restart(s){window}); "
                f"worker {rank} {reason.describe()}"
            )
        return self.restart(ranks, now)

    def restart(
        self,
        ranks: tuple[int, ...],
        now: float,
        *,
        budget: bool = True,
        count: int | None = None,
        cause: str = "failure",
    ) -> Restart:
        """Restart ``ranks``: bump their restart counts and pick the back-off delay.

        With ``budget`` the restart is counted in the budget window (callers check
        :meth:`restarts_in_window` first); a restart decided elsewhere (an operator's, or
        a job-wide one, ``budget=False``) is neither counted nor delayed, and its
        decision's ``budget`` is ``-1``. ``count`` sets the slots' restart count (a
        job-wide generation) instead of adding one; ``cause`` goes into the decision.
        """
        n = self.restarts_in_window(now)
        if budget:
            self._restart_times.append(now)
        for r in ranks:
            restarts = self._slots[r].restarts + 1 if count is None else count
            self._slots[r] = replace(self._slots[r], restarts=restarts)
            if not self._slots[r].state.alive:
                self._slots[r] = replace(self._slots[r], state=WorkerState.BACKOFF)
        return Restart(
            ranks=ranks,
            delay=self.policy.backoff.delay(n, self._rng()) if budget else 0.0,
            restarts=tuple(self._slots[r].restarts for r in ranks),
            attempt=n + 1 if budget else n,
            budget=self.policy.max_restarts if budget else -1,
            cause=cause,
        )

    def give_up(self, reason: str) -> GiveUp:
        """End the run: every slot not yet terminal ends ``STOPPED`` (once it has exited)."""
        self.gave_up = GiveUp(reason)
        self.set_state((s.rank for s in self._slots if not s.state.terminal), WorkerState.STOPPED)
        return self.gave_up

    def _finish(self, rank: int, state: WorkerState) -> Finish:
        self._slots[rank] = replace(self._slots[rank], state=state)
        return Finish(rank, state)

    def _prune(self, now: float) -> None:
        times = self._restart_times
        while times and times[0] <= now - self.policy.window:
            times.popleft()
