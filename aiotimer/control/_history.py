"""What happened in a run or a server, read back from its event log. Pure: no I/O.

How this works
--------------
An event log (:class:`~aiotimer._edges.eventlog.EventLog`) is a file of JSON lines, one
event each, appended by every run that names it. :class:`HistoryReader` is fed the
decoded lines in order (:meth:`HistoryReader.feed`, a ``dict`` each) and folds them:

* each ``server_started`` begins a new run; earlier runs are kept as one line each
  (:class:`PastRun`), the last one in full (:class:`RunHistory`);
* a supervised run's ``worker_started`` opens an attempt of its rank
  (:class:`AttemptHistory`); the server's ``timer_expired``, ``stacks_dumped`` and
  ``worker_reaped`` of that pid say how a reap went (when, which block, how late, the
  task or the stack that held the worker); ``worker_ended`` closes the attempt;
* ``restart_scheduled`` is paired with the failure that caused it (the last attempt
  that ended on its own before it), ``hang_report`` and ``supervisor_gave_up`` are kept,
  ``supervisor_stopped`` and ``server_stopped`` give the outcome;
* the incidents (reaps and refusals: the kinds the live ``aiotimer status`` lists as
  what happened) are kept as :class:`~aiotimer.control.snapshot.IncidentInfo`, the last
  :data:`~aiotimer.server.RECENT_INCIDENTS` of them, with a count of each kind.

Everything kept is bounded, however long the log: per rank the last
:data:`KEPT_ATTEMPTS` attempts (and how many there were), the last
:data:`KEPT_RESTARTS` restarts and hang reports. A line that is not an event this
version knows is counted (:attr:`RunHistory.unreadable`), never fatal.
:func:`format_history` is the human view, the same "what happened" block as the live
status (:func:`~aiotimer.control._format.format_incidents`).
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from aiotimer import events as _events
from aiotimer.control._format import format_counters, format_incidents
from aiotimer.control.snapshot import IncidentInfo, incident_info
from aiotimer.core import format_seconds
from aiotimer.events import (
    Event,
    EventsLost,
    HangReported,
    RestartScheduled,
    ServerStarted,
    ServerStopped,
    SourceFailed,
    StacksDumped,
    SupervisorGaveUp,
    SupervisorStopped,
    TimerExpired,
    WorkerEnded,
    WorkerReaped,
    WorkerStarted,
    clip,
    clip_scope,
)
from aiotimer.server import INCIDENT_KINDS, RECENT_INCIDENTS
from aiotimer.supervisor import attempt_story, ending_word

__all__ = [
    "KEPT_ATTEMPTS",
    "KEPT_RESTARTS",
    "AttemptHistory",
    "HistoryReader",
    "PastRun",
    "RunHistory",
    "decode_event",
    "format_history",
    "history_dict",
]

#: The most processes whose attempt :attr:`RunHistory.by_pid` remembers (the newest).
_KEPT_PIDS: Final[int] = 4096
#: The most attempts kept in full per rank (the newest; the rest are counted).
KEPT_ATTEMPTS: Final[int] = 20
#: The most restarts and hang reports kept in full (the newest).
KEPT_RESTARTS: Final[int] = 20

#: Every event class, by kind.
_KINDS: Final[dict[str, type[Event]]] = {
    cls.kind: cls
    for cls in (getattr(_events, name) for name in _events.__all__)
    if isinstance(cls, type) and issubclass(cls, Event) and cls is not Event
}


def decode_event(data: Mapping[str, Any]) -> Event | None:
    """The event an event log's line holds (its ``to_dict()``), or ``None`` when it is
    not one this version knows (another kind, a missing or mistyped field).

    A ``server_stopped`` record comes back without its scope statistics (its
    :class:`~aiotimer.events.ServerStopped` ``scopes`` is empty).
    """
    kind = data.get("event")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return None
    fields = {k: v for k, v in data.items() if k != "event"}
    try:
        if cls is ServerStopped:  # its scope statistics are not needed here
            stopped = msgspec.convert(fields, _StoppedRecord, strict=False)
            return ServerStopped(**msgspec.structs.asdict(stopped))
        return msgspec.convert(fields, cls, strict=False)
    except (msgspec.ValidationError, TypeError, ValueError):
        return None


class _StoppedRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A ``server_stopped`` record but for its scope statistics."""

    time: float
    timers: int
    counters: dict[str, int]
    journal: str | None = None
    journaled: int = 0


@dataclass
class AttemptHistory:
    """One attempt (process) of a rank: launched at ``started`` as ``pid``, its
    ``ending`` (``None`` while it runs, or when the log ends first), and for a reap the
    timer that began it (``expired``), the signal that ended it (``reaped``) and the
    stack dump taken first (``stacks``)."""

    rank: int
    number: int
    pid: int
    started: float
    ending: WorkerEnded | None = None
    expired: TimerExpired | None = None
    reaped: WorkerReaped | None = None
    stacks: str | None = None

    def story_word(self) -> str:
        """What became of it in one word (``"reaped"``, ``"running"`` ...)."""
        if self.ending is None:
            return "running" if self.reaped is None else "reaped"
        return ending_word(self.ending.description)

    def describe_end(self) -> str | None:
        """How it ended, in a few words (``None`` while it runs)."""
        return None if self.ending is None else self.ending.description

    def describe(self) -> str:
        """One line: how it ended, and for a reap when, which block, how late, and the
        task (or the innermost frame of the stack) that held the worker."""
        if self.ending is None:
            how = "no end in the log (still running, or the log ends first)"
            if self.reaped is not None:
                how = f"reaped ({self.reaped.describe()}); no end in the log"
            return how
        how = self.ending.description
        if self.ending.start_failure:
            how += ", before it was seen running (start failure)"
        details = []
        if self.reaped is not None:
            details.append(f"signalled at {_clock(self.reaped.time)}")
        if self.expired is not None:
            late = f"{format_seconds(self.expired.late)} after its reap deadline"
            if self.expired.kill_after > 0:
                late += (
                    f", its block's own deadline {format_seconds(self.expired.kill_after)} "
                    "earlier (kill_after)"
                )
            details.append(f"timer {clip_scope(self.expired.scope_id)} expired {late}")
        if self.ending.reason == "reaped" and self.ending.task is None:
            frame = _innermost_frame(self.stacks)
            details.append(
                f"innermost frame: {clip(frame)}"
                if frame is not None
                else "no stack dump (run with --dump for one)"
            )
        return how + ("; " + "; ".join(details) if details else "")


@dataclass
class RankHistory:
    """One rank's attempts: the last :data:`KEPT_ATTEMPTS`, and every ending's word."""

    rank: int
    attempts: collections.deque[AttemptHistory] = field(
        default_factory=lambda: collections.deque(maxlen=KEPT_ATTEMPTS)
    )
    count: int = 0
    endings: list[str] = field(default_factory=list)  # bounded: see _bound

    def story(self) -> str:
        """What became of its attempts (:func:`~aiotimer.supervisor.attempt_story`)."""
        last = self.attempts[-1] if self.attempts else None
        if last is not None and last.ending is None:
            return attempt_story([*self.endings, "still running"])
        return attempt_story(self.endings, None if last is None else last.describe_end())


@dataclass(frozen=True)
class PastRun:
    """An earlier run in the same log, in one line's worth: when, how it ended."""

    started: float | None
    ended: float | None
    outcome: str


@dataclass
class RunHistory:
    """What happened in one run (a supervised run or a plain server), from its log."""

    started: ServerStarted | None = None
    first_time: float | None = None
    last_time: float | None = None
    events: int = 0
    unreadable: int = 0
    lost: int = 0
    ranks: dict[int, RankHistory] = field(default_factory=dict)
    restarts: collections.deque[tuple[RestartScheduled, str | None]] = field(
        default_factory=lambda: collections.deque(maxlen=KEPT_RESTARTS)
    )
    restarts_total: int = 0
    hang_reports: collections.deque[HangReported] = field(
        default_factory=lambda: collections.deque(maxlen=KEPT_RESTARTS)
    )
    incidents: collections.deque[IncidentInfo] = field(
        default_factory=lambda: collections.deque(maxlen=RECENT_INCIDENTS)
    )
    incident_counts: collections.Counter[str] = field(default_factory=collections.Counter)
    failure: str | None = None  # the last source failure, if any
    gave_up: SupervisorGaveUp | None = None
    supervisor: SupervisorStopped | None = None
    server_stopped: float | None = None
    counters: dict[str, int] | None = None
    #: pid -> the attempt it ran (the last :data:`_KEPT_PIDS`)
    by_pid: dict[int, AttemptHistory] = field(default_factory=dict)
    last_failure: str | None = None

    def outcome(self) -> str:
        """How the run ended, in a few words."""
        sup = self.supervisor
        if sup is not None:
            how = sup.describe().removeprefix("supervisor stopped: ")
            if self.gave_up is not None:
                how += f"; gave up: {self.gave_up.reason}"
            return how
        if self.gave_up is not None:
            return f"gave up: {self.gave_up.reason} (no end in the log)"
        if self.server_stopped is not None:
            return "the server stopped" + (
                f" after a failure: {self.failure}" if self.failure else ""
            )
        return (
            "no end in the log: still running, or killed before it could write one "
            "(SIGKILL, a crash of the machine)"
        )


class HistoryReader:
    """Folds an event log's records, in order, into :attr:`run` (see the module docs)."""

    def __init__(self) -> None:
        self.run = RunHistory()
        self.past: list[PastRun] = []
        self.past_total = 0

    def feed(self, data: object) -> None:
        """Fold one decoded line (anything JSON gives; what is no event is counted)."""
        event = decode_event(data) if isinstance(data, Mapping) else None
        if event is None:
            self.run.unreadable += 1
            return
        if isinstance(event, ServerStarted) and self.run.events:
            self._begin_run()
        run = self.run
        run.events += 1
        run.first_time = event.time if run.first_time is None else run.first_time
        run.last_time = event.time
        self._fold(run, event)

    def _begin_run(self) -> None:
        old = self.run
        self.past_total += 1
        self.past.append(PastRun(old.first_time, old.last_time, old.outcome()))
        del self.past[:-KEPT_RESTARTS]
        self.run = RunHistory()

    def _fold(self, run: RunHistory, event: Event) -> None:
        if isinstance(event, ServerStarted):
            run.started = event
        elif isinstance(event, WorkerStarted):
            rank = run.ranks.setdefault(event.rank, RankHistory(event.rank))
            if rank.attempts and rank.attempts[-1].ending is None:
                rank.endings.append(rank.attempts[-1].story_word())  # its end was lost
            att = AttemptHistory(event.rank, event.attempt, event.pid, event.time)
            rank.attempts.append(att)
            rank.count += 1
            run.by_pid[event.pid] = att
            if len(run.by_pid) > _KEPT_PIDS:
                del run.by_pid[next(iter(run.by_pid))]
        elif isinstance(event, WorkerEnded):
            ended = run.by_pid.get(event.pid)
            if ended is not None and ended.ending is None:
                ended.ending = event
                words = run.ranks[ended.rank].endings
                words.append(ended.story_word())
                _bound(words)
            if event.reason not in ("stopped", "succeeded"):
                run.last_failure = f"worker {event.rank} {event.description}"
        elif isinstance(event, RestartScheduled):
            run.restarts_total += 1
            cause = run.last_failure if event.cause == "failure" else None
            run.restarts.append((event, cause))
        elif isinstance(event, HangReported):
            run.hang_reports.append(event)
        elif isinstance(event, SupervisorGaveUp):
            run.gave_up = event
        elif isinstance(event, SupervisorStopped):
            run.supervisor = event
        elif isinstance(event, ServerStopped):
            run.server_stopped = event.time
            run.counters = event.counters
        elif isinstance(event, SourceFailed):
            run.failure = event.describe()
        elif isinstance(event, EventsLost):
            run.lost += event.count
        self._fold_reap(run, event)

    def _fold_reap(self, run: RunHistory, event: Event) -> None:
        if event.kind not in INCIDENT_KINDS and not isinstance(event, StacksDumped):
            return
        pid = getattr(event, "pid", None)
        att = run.by_pid.get(pid) if isinstance(pid, int) else None
        if att is not None and att.ending is None:
            if isinstance(event, TimerExpired) and att.expired is None:
                att.expired = event
            elif isinstance(event, StacksDumped) and event.text is not None:
                att.stacks = event.text
            elif isinstance(event, WorkerReaped):
                att.reaped = event
                att.stacks = event.stacks or att.stacks
        if event.kind in INCIDENT_KINDS:
            run.incident_counts[event.kind] += 1
            info = incident_info(run.events, event)
            if att is not None:
                info = msgspec.structs.replace(info, rank=att.rank)
            run.incidents.append(info)


def _bound(words: list[str]) -> None:
    """Keep a rank's ending words bounded: runs of like words are what a story tells,
    so a long list is cut to its last 1,000 words (the story says how many were cut)."""
    if len(words) > 1000:
        del words[:-1000]


def _innermost_frame(stacks: str | None) -> str | None:
    """The innermost frame line of a Python stack dump (``File "w.py", line 3 in f``):
    faulthandler and traceback list the most recent call first and last respectively,
    so the first ``File`` line after a faulthandler header, else the last one."""
    if not stacks:
        return None
    frames = [line.strip() for line in stacks.splitlines() if line.strip().startswith("File ")]
    if not frames:
        return None
    most_recent_first = "most recent call first" in stacks
    return frames[0] if most_recent_first else frames[-1]


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _span(first: float | None, last: float | None) -> str:
    if first is None or last is None:
        return "no events"
    day = time.strftime("%Y-%m-%d", time.localtime(first))
    took = format_seconds(max(0.0, last - first)) if math.isfinite(last - first) else "?"
    return f"{day} {_clock(first)} to {_clock(last)} ({took})"


def format_history(reader: HistoryReader, path: str) -> str:
    """The human view of the last run in an event log (several lines, ending with a
    newline): the run, each rank's attempts, the restarts and their causes, the hang
    reports, the last reaps and refusals, and the outcome."""
    run = reader.run
    lines = []
    if reader.past_total:
        earlier = "; ".join(f"{_clock(p.started or 0)}: {p.outcome}" for p in reader.past[-3:])
        lines.append(
            f"{path} holds {reader.past_total + 1} runs; the last one is shown "
            f"(the {min(3, reader.past_total)} before it: {earlier})"
        )
    who = "aiotimer run" if run.ranks or run.supervisor else "server"
    srv = run.started
    where = "" if srv is None else f", server pid {srv.pid} on {', '.join(srv.sources) or '-'}"
    lines.append(f"{who}{where}: {_span(run.first_time, run.last_time)}")
    if run.counters is not None:
        lines.append("  " + format_counters(run.counters))
    noted = []
    if run.unreadable:
        noted.append(f"{run.unreadable:,} line(s) not read (not an event this version knows)")
    if run.lost:
        noted.append(f"{run.lost:,} event(s) lost by the writer (see its events_lost records)")
    if noted:
        lines.append("  " + "; ".join(noted))
    if run.ranks:
        rows = [("RANK", "ATTEMPTS", "WHAT HAPPENED")]
        rows += [
            (str(r.rank), str(r.count), r.story())
            for r in sorted(run.ranks.values(), key=lambda r: r.rank)
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(2)]
        for row in rows:
            lines.append("  ".join([row[0].ljust(widths[0]), row[1].ljust(widths[1]), row[2]]))
        lines.append("attempts (oldest first):")
        for r in sorted(run.ranks.values(), key=lambda r: r.rank):
            if r.count > len(r.attempts):
                lines.append(
                    f"  rank {r.rank}: {r.count - len(r.attempts)} earlier attempt(s) not shown"
                )
            for a in r.attempts:
                up = "" if a.ending is None else f"  up {format_seconds(a.ending.uptime)}"
                lines.append(
                    f"  rank {r.rank} attempt {a.number}  pid {a.pid}  {_clock(a.started)}{up}  "
                    f"{a.describe()}"
                )
    if run.restarts_total:
        lines.append(f"restarts ({run.restarts_total}; newest last):")
        for restart, cause in run.restarts:
            why = f": after {cause}" if cause else ""
            lines.append(f"  {_clock(restart.time)}  {restart.describe()}{why}")
    if run.hang_reports:
        lines.append("hang reports (newest last):")
        lines.extend(f"  {_clock(h.time)}  {h.describe()}" for h in run.hang_reports)
    if run.incidents:
        counts = ", ".join(f"{k} {n:,}" for k, n in sorted(run.incident_counts.items()))
        lines.append(f"reaps and refusals: {counts}")
    lines.extend(format_incidents(tuple(run.incidents)))
    lines.append(f"outcome: {run.outcome()}")
    return "\n".join(line.rstrip() for line in lines) + "\n"


def history_dict(reader: HistoryReader) -> dict[str, Any]:
    """The last run of an event log as plain JSON-ready data (``aiotimer status
    --event-log FILE --json``): the same account as :func:`format_history`, with each
    event in its logged form (:meth:`~aiotimer.events.Event.to_dict`)."""
    run = reader.run

    def logged(event: Event | None) -> dict[str, Any] | None:
        return None if event is None else event.to_dict()

    return {
        "runs": reader.past_total + 1,
        "earlier": [
            {"started": p.started, "ended": p.ended, "outcome": p.outcome} for p in reader.past
        ],
        "server": logged(run.started),
        "first": run.first_time,
        "last": run.last_time,
        "events": run.events,
        "unreadable": run.unreadable,
        "lost": run.lost,
        "counters": run.counters,
        "ranks": [
            {
                "rank": r.rank,
                "attempts": r.count,
                "story": r.story(),
                "shown": [
                    {
                        "attempt": a.number,
                        "pid": a.pid,
                        "started": a.started,
                        "what": a.describe(),
                        "ended": logged(a.ending),
                        "expired": logged(a.expired),
                        "reaped": logged(a.reaped),
                    }
                    for a in r.attempts
                ],
            }
            for r in sorted(run.ranks.values(), key=lambda r: r.rank)
        ],
        "restarts": run.restarts_total,
        "recent_restarts": [
            {**restart.to_dict(), "after": cause} for restart, cause in run.restarts
        ],
        "hang_reports": [logged(h) for h in run.hang_reports],
        "incident_counts": dict(run.incident_counts),
        "recent": [msgspec.to_builtins(i) for i in run.incidents],
        "gave_up": None if run.gave_up is None else run.gave_up.reason,
        "outcome": run.outcome(),
        "exit_code": None if run.supervisor is None else run.supervisor.exit_code,
    }
