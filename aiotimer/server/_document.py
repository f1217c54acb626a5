"""The ``GET /v1/state`` document: ``msgspec`` structs, and the builders of its parts.

:class:`StatusSnapshot` is the whole document. The server's view
(:func:`aiotimer.server._view.take`) builds it once per snapshot, in the server's loop,
from the engine's own records (:func:`timer_info`, :func:`incident_info`,
:func:`counters_by_name`), and every reader takes it from there: the control plane
serves it as it is (adding only its ``control`` path, and a supervisor's part), a
cluster node publishes its workers, ``get_state()`` lists its timers.
:class:`ServerInfo` is the server's own part, :class:`TimerInfo` a timer,
:class:`IncidentInfo` a recent reap or refusal, :class:`SupervisorInfo` a supervisor's
part. :mod:`aiotimer.control.snapshot` re-exports them (their documented home). Pure.
"""

from __future__ import annotations

import dataclasses
from typing import Final

import msgspec

from aiotimer.core import LearnedSummary, ScopeStats, Timer
from aiotimer.events import Event, ServerCounters, WorkerInfo, WorkerReaped
from aiotimer.wire import Request

__all__ = [
    "API_VERSION",
    "DEFAULT_LIMIT",
    "SCOPES_PER_WORKER",
    "WORKER_STATES",
    "IncidentInfo",
    "ServerInfo",
    "StatusSnapshot",
    "SupervisorInfo",
    "TimerInfo",
    "counters_by_name",
    "incident_info",
    "timer_info",
]

#: The version of the control API; it is the ``/v1/`` of every path.
API_VERSION: Final[int] = 1
#: Timers, workers and scope sites listed by default (the totals are always exact).
DEFAULT_LIMIT: Final[int] = 50
#: Scope ids listed per worker (its ``timers`` count is exact).
SCOPES_PER_WORKER: Final[int] = 8
#: The states of a server's workers.
WORKER_STATES: Final[tuple[str, ...]] = ("timed", "idle", "reaping")


class TimerInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One live timer: worker ``pid``, ``scope_id``, when it expires and the server acts
    (``deadline``, epoch seconds; ``seconds_left`` from the snapshot, negative if overdue)
    and its ``signal`` (``<= 0``: report only).

    An ``async with`` block has two deadlines: ``kill_after > 0`` seconds before
    ``deadline`` (the reap) is the block's own (``block_deadline``, epoch seconds;
    ``block_seconds_left``, negative once passed), when the worker cancels its task
    (``TimeoutError``). Both are ``None`` for a block of one tier. ``passed`` says which
    deadline has passed: ``"none"``, ``"block"`` (its task was cancelled, the block has
    not ended yet: it is reaped at ``deadline`` unless it ends first) or ``"reap"``.

    ``request`` is the wire request that set the timer, every key as the worker sent it
    (the journal's, after a restart; ``None`` for a timer made without one): a key the
    wire grows is listed here with no change to this record.

    Not tracked by the cyclic garbage collector (``gc=False``: it holds no cycle), so a
    full listing of many timers adds nothing to every collection.
    """

    pid: int
    scope_id: str
    deadline: float
    seconds_left: float
    signal: int
    kill_after: float = 0.0
    block_deadline: float | None = None
    block_seconds_left: float | None = None
    passed: str = "none"
    request: Request | None = None


class IncidentInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One recent reap or refusal (``aiotimer status`` lists them as what happened):
    event number ``seq`` and ``kind`` (``timer_expired``, ``worker_reaped``,
    ``signal_refused``, ``request_rejected`` ...) at ``time`` (epoch seconds), the
    worker's ``pid`` (and ``rank`` under a supervisor), the block (``scope_id``), the
    task that held the worker's loop when a reap's stack dump named it (``task``), how
    late the server acted (``late``, seconds past the reap deadline; ``kill_after``
    seconds more past the block's own deadline) and ``what`` happened, in one line.
    """

    seq: int
    time: float
    kind: str
    what: str
    pid: int | None = None
    rank: int | None = None
    scope_id: str | None = None
    task: str | None = None
    late: float | None = None
    kill_after: float | None = None


class ServerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The server itself.

    ``state`` is its lifecycle state; ``started_at`` epoch seconds and ``uptime``
    seconds of the current run; ``sources`` where requests arrive; ``policy`` the reap
    policy in words; ``fifo``/``control`` its paths (``None`` when it has none);
    ``next_expiry_in`` seconds to the earliest deadline; ``idle_for`` seconds since it
    last handled input or an expiry; ``max_loop_lag`` the most an expiry was handled
    late (seconds; the host loop was busy elsewhere); ``journal`` the journal's path and
    ``journal_problem`` why it cannot be written now (``None``: it can).
    """

    pid: int
    version: str
    state: str
    started_at: float | None = None
    uptime: float | None = None
    sources: tuple[str, ...] = ()
    policy: str = ""
    fifo: str | None = None
    control: str | None = None
    next_expiry_in: float | None = None
    idle_for: float | None = None
    max_loop_lag: float = 0.0
    journal: str | None = None
    journal_problem: str | None = None


class SupervisorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The supervisor that runs the workers (``aiotimer run``), if any.

    ``state`` is its lifecycle state, ``command`` the workers' argv, ``restarts`` the
    restarts of all slots, ``restarts_in_window`` those counted against the budget now,
    ``outcome`` how the run ended (``None`` while it runs), ``gave_up`` why it gave up,
    ``hang_report`` the last hang report's summary line.
    """

    run_id: str
    state: str
    command: tuple[str, ...]
    nproc: int
    restarts: int
    restarts_in_window: int
    outcome: str | None = None
    gave_up: str | None = None
    hang_report: str | None = None


class StatusSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A server's whole state at ``time`` (epoch seconds), as ``GET /v1/state`` serves it.

    ``timers`` are the earliest-expiring live timers, ``workers`` and ``scopes`` (the
    per-site duration statistics, most expirations first) are cut at the request's
    ``limit``; the ``*_total`` fields count them all. ``counters`` are the run's
    :class:`~aiotimer.server.ServerCounters` by name. ``recent`` are the last reaps and
    refusals, oldest first (at most :data:`~aiotimer.server.RECENT_INCIDENTS`).
    ``learned`` are the learned timeouts' scopes (``expires(after=learned(...))``): the
    samples, the value in force and ``initial`` of each, most samples first.
    """

    api: int = API_VERSION
    time: float
    server: ServerInfo
    workers: tuple[WorkerInfo, ...] = ()
    workers_total: int = 0
    timers: tuple[TimerInfo, ...] = ()
    timers_total: int = 0
    counters: dict[str, int] = {}
    scopes: tuple[ScopeStats, ...] = ()
    scopes_total: int = 0
    supervisor: SupervisorInfo | None = None
    recent: tuple[IncidentInfo, ...] = ()
    learned: tuple[LearnedSummary, ...] = ()

    @property
    def truncated(self) -> bool:
        """Whether any list was cut at the request's limit."""
        return (
            len(self.timers) < self.timers_total
            or len(self.workers) < self.workers_total
            or len(self.scopes) < self.scopes_total
        )


#: :class:`~aiotimer.events.ServerCounters`' field names, in order.
_COUNTER_NAMES: Final[tuple[str, ...]] = tuple(f.name for f in dataclasses.fields(ServerCounters))


def timer_info(timer: Timer, wall: float, mono: float) -> TimerInfo:
    """``timer`` as the document lists it: its monotonic deadline moved to the wall
    clock, for a snapshot taken at ``wall`` (epoch seconds) and ``mono`` (the server's
    monotonic clock). ~0.4 us: a full listing converts every live timer."""
    left = timer.deadline - mono
    request = timer.request
    kill_after = 0.0 if request is None or request.kill_after is None else request.kill_after
    block_left = block_deadline = None
    passed = "reap" if left < 0 else "none"
    if kill_after > 0:  # two tiers: the block's own deadline, kill_after earlier
        block_left = left - kill_after
        block_deadline = wall + block_left
        passed = "block" if passed == "none" and block_left < 0 else passed
    return TimerInfo(
        pid=timer.pid,
        scope_id=timer.scope_id,
        deadline=wall + left,
        seconds_left=left,
        signal=timer.signal,
        kill_after=kill_after,
        block_deadline=block_deadline,
        block_seconds_left=block_left,
        passed=passed,
        request=request,
    )


def incident_info(seq: int, event: Event) -> IncidentInfo:
    """Event number ``seq``, an incident (a reap or a refusal), as ``recent`` lists it."""
    scope = getattr(event, "scope_id", None)
    task = None
    if isinstance(event, WorkerReaped):
        scope = event.scopes[0] if event.scopes else None
        held = event.culprit
        if held is not None:
            task, scope = held[0], held[1] or scope
    return IncidentInfo(
        seq=seq,
        time=event.time,
        kind=event.kind,
        what=event.describe(),
        pid=getattr(event, "pid", None),
        scope_id=scope,
        task=task,
        late=getattr(event, "late", None),
        kill_after=getattr(event, "kill_after", None) or None,
    )


def counters_by_name(counters: ServerCounters) -> dict[str, int]:
    """``counters`` as ``{name: value}`` (the shape every answer carries them in)."""
    return {name: getattr(counters, name) for name in _COUNTER_NAMES}
