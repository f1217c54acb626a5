"""The supervisor's public data: outcomes, its state, and the restart coordinator hook;
and how outcomes and each rank's :class:`~aiotimer.events.RankStatus` are read off the
planner's slot records. Pure.

A leaf: it imports nothing above the supervisor's pure parts (no supervisor, no server at
run time), so the layers that show these records (control, cluster) sit on top without
cycles. Re-exported by :mod:`aiotimer.supervisor`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

from aiotimer._edges.lifecycle import LifecycleState
from aiotimer.events import RankStatus, clip
from aiotimer.supervisor._exits import ExitReason, attempt_story, ending_word
from aiotimer.supervisor._restart import GiveUp, Restart, RestartPolicy, SlotRecord, WorkerState

if TYPE_CHECKING:
    from aiotimer.server import ServerState

__all__ = [
    "SUMMARY_EXIT_WIDTH",
    "Decision",
    "LocalCoordinator",
    "RestartCoordinator",
    "RunOutcome",
    "SupervisorActions",
    "SupervisorState",
    "WorkerFailure",
    "format_summary",
    "rank_status",
    "run_outcome",
]

#: What a coordinator may answer: carry this out, or ``None`` (it will call back).
Decision = Restart | GiveUp


class RunOutcome(enum.IntEnum):
    """How a supervised run ended; the value is ``aiotimer run``'s exit status."""

    SUCCEEDED = 0  #: every worker exited 0
    FAILED = 1  #: a worker failed for good (a no-restart exit code)
    #: the supervisor gave up (restart budget exhausted, the timer server could no
    #: longer watch the workers, or a coordinator's give-up)
    GAVE_UP = 3
    STOPPED = 4  #: stopped before every worker finished (aclose, an operator's stop)


@dataclass(frozen=True, slots=True)
class SupervisorState:
    """A snapshot of a supervisor: plain typed data (see :meth:`Supervisor.get_state`);
    ``workers`` has one :class:`~aiotimer.events.RankStatus` per rank; ``ranks_by_pid``
    the rank of each process it launched lately (the last 1,000), ended ones too;
    ``hang_report`` the summary line of the last hang report, if any."""

    state: LifecycleState
    run_id: str
    command: tuple[str, ...]
    policy: RestartPolicy
    fifo: Path | None
    restarts_in_window: int
    workers: tuple[RankStatus, ...]
    outcome: RunOutcome | None
    gave_up: str | None
    server: ServerState | None
    ranks_by_pid: Mapping[int, int] = field(default_factory=dict)
    hang_report: str | None = None


@dataclass(frozen=True, slots=True)
class WorkerFailure:
    """A worker exit that calls for a restart (or a give-up): given to the coordinator."""

    rank: int
    pid: int
    reason: ExitReason
    start_failure: bool


class SupervisorActions(Protocol):
    """What a :class:`RestartCoordinator` may do to the supervisor that asks it (a
    :class:`~aiotimer.supervisor.Supervisor` is one)."""

    async def restart_workers(
        self, ranks: Sequence[int] | None = None, *, count: int | None = None
    ) -> None:
        """Restart ``ranks`` (default: all) now, outside the budget; ``count`` sets their
        restart count."""
        ...

    def give_up(self, reason: str) -> None:
        """End the run: stop every worker."""
        ...


class RestartCoordinator(Protocol):
    """Who carries out the planner's restart decisions.

    The local default, :class:`LocalCoordinator`, returns the proposal unchanged. A
    job-wide coordinator (restarts across nodes) may return another decision, or
    ``None`` to defer: it then calls :meth:`Supervisor.restart_workers` (with the
    job-wide restart count) or :meth:`Supervisor.give_up` when the job decides. It may
    run as long as it needs; the supervisor keeps serving meanwhile.
    """

    async def decide(
        self, supervisor: SupervisorActions, failure: WorkerFailure, proposal: Decision
    ) -> Decision | None:
        """The decision to carry out for ``failure`` (``proposal`` is the local one)."""
        ...


class LocalCoordinator:
    """The default :class:`RestartCoordinator`: the local restart policy decides."""

    async def decide(
        self, supervisor: SupervisorActions, failure: WorkerFailure, proposal: Decision
    ) -> Decision | None:
        """Return ``proposal``."""
        return proposal


def run_outcome(slots: Iterable[SlotRecord], *, gave_up: bool) -> RunOutcome:
    """How a run ended, from its slots' states and whether a coordinator gave up (e.g. a
    job-wide give-up, which leaves the slots ``STOPPED``)."""
    states = {s.state for s in slots}
    if WorkerState.FATAL in states:
        return RunOutcome.GAVE_UP
    if WorkerState.FAILED in states:
        return RunOutcome.FAILED
    if gave_up:
        return RunOutcome.GAVE_UP
    if states == {WorkerState.SUCCEEDED}:
        return RunOutcome.SUCCEEDED
    return RunOutcome.STOPPED


def rank_status(slot: SlotRecord, running: tuple[int, float] | None) -> RankStatus:
    """``slot`` as a :class:`~aiotimer.events.RankStatus`; ``running`` is its live
    attempt's ``(pid, uptime)``, ``None`` between attempts."""
    ended = sum(a.uptime for a in slot.attempts)
    return RankStatus(
        rank=slot.rank,
        state=slot.state,
        pid=None if running is None else running[0],
        restarts=slot.restarts,
        attempts=len(slot.attempts) + (running is not None),
        start_failures=slot.start_failures,
        uptime=ended if running is None else ended + running[1],
        attempt_uptime=None if running is None else running[1],
        reasons=tuple(a.reason.describe() for a in slot.attempts),
    )


#: The widest the summary's last column (why the last attempt ended) gets.
SUMMARY_EXIT_WIDTH: Final[int] = 120


def format_summary(ranks: Sequence[RankStatus]) -> str:
    """The final summary as a table: one row per rank, one screen wide (its uptime is
    the sum over its attempts); its last column says what became of the rank's attempts
    (:func:`attempt_story`: ``reaped, restarted, then succeeded (exit code 0)``), cut at
    :data:`SUMMARY_EXIT_WIDTH` characters; every reason is in the event log, and
    ``aiotimer status --event-log`` tells them."""
    rows = [("rank", "state", "attempts", "start failures", "total uptime", "what happened")]
    for w in ranks:
        story = attempt_story(
            [ending_word(r) for r in w.reasons], w.reasons[-1] if w.reasons else None
        )
        rows.append(
            (
                str(w.rank),
                w.state.value,
                str(w.attempts),
                str(w.start_failures),
                f"{w.uptime:.1f}s",
                clip(story, SUMMARY_EXIT_WIDTH),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for r in rows:
        cells = [c.ljust(widths[i]) for i, c in enumerate(r[:-1])]
        lines.append("  ".join([*cells, r[-1]]))
    return "\n".join(lines) + "\n"
