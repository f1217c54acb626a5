"""The human view of a :class:`~aiotimer.control.snapshot.StatusSnapshot`.

A server line, a counters line, then one row per worker with its open timers (soonest
first), like ``supervisorctl status``, then the last reaps and refusals, the way
``systemctl status`` ends with the last lines of the log. Used by ``aiotimer status``
and by the state summary ``aiotimer serve`` logs on SIGUSR1; its counters line and its
last block (what happened) are shared with the account of an event log
(:mod:`aiotimer.control._history`). Every counter it shows is
explained in docs/status.md.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Final

from aiotimer.control._learned import format_learned
from aiotimer.control.snapshot import IncidentInfo, StatusSnapshot, TimerInfo
from aiotimer.core import format_seconds

__all__ = ["RECENT_SHOWN", "format_counters", "format_incidents", "format_status"]

_SHOWN_COUNTERS = (
    "requests",
    "cancelled",
    "expired",
    "reaped",
    "reap_failed",
    "rejected",
    "workers_exited",
)
#: Counters shown only once they are not zero (a server at its timer cap).
_CAP_COUNTERS = ("cap_rejected", "evicted")
#: How many of the recent reaps and refusals the view shows (the newest).
RECENT_SHOWN: Final[int] = 10
#: The widest a line of the recent reaps and refusals gets.
_RECENT_WIDTH: Final[int] = 200


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h"
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _left(seconds: float) -> str:
    return "overdue" if seconds < 0 else format_seconds(seconds)


def _time_left(t: TimerInfo) -> str:
    """A timer's time left: one deadline, or both of a two-tier block's, saying which
    has passed."""
    if t.block_seconds_left is None or t.passed == "reap":
        return _left(t.seconds_left)
    reap = f"reap in {format_seconds(t.seconds_left)}"
    if t.passed == "block":
        # The server cannot know whether the task was cancelled: a blocked loop cannot
        # cancel it (the worker says so only when the block ends).
        return f"cancel due {format_seconds(-t.block_seconds_left)} ago, {reap}"
    return f"cancel in {format_seconds(t.block_seconds_left)}, {reap}"


def _incident(i: IncidentInfo) -> str:
    when = time.strftime("%H:%M:%S", time.localtime(i.time))
    who = "" if i.rank is None else f"rank {i.rank}: "
    line = f"  {when}  {who}{i.what}".splitlines()[0]
    return line if len(line) <= _RECENT_WIDTH else line[: _RECENT_WIDTH - 3] + "..."


def format_counters(counters: Mapping[str, int]) -> str:
    """The counters line: what a server did (the cap counters only once not zero)."""
    return "  ".join(
        f"{k} {counters.get(k, 0):,}"
        for k in _SHOWN_COUNTERS + _CAP_COUNTERS
        if k in _SHOWN_COUNTERS or counters.get(k, 0)
    )


def format_incidents(incidents: Sequence[IncidentInfo]) -> list[str]:
    """What happened: the last :data:`RECENT_SHOWN` reaps and refusals of
    ``incidents`` (oldest first), one line each, under their heading; no lines when
    there are none. The live status and the event log's account end with it."""
    if not incidents:
        return []
    return [
        "recent reaps and refusals (newest last):",
        *(_incident(i) for i in incidents[-RECENT_SHOWN:]),
    ]


def format_status(snap: StatusSnapshot) -> str:
    """The human view of ``snap`` (several lines, ending with a newline)."""
    srv = snap.server
    where = srv.fifo or ", ".join(srv.sources) or "in-process only"
    nxt = "no timers" if srv.next_expiry_in is None else f"next in {_left(srv.next_expiry_in)}"
    lines = [
        f"aiotimer {srv.version}  pid {srv.pid}  {srv.state.upper()}  up {_ago(srv.uptime)}"
        f"  {where}",
        f"  {snap.timers_total:,} timers, {snap.workers_total:,} workers, {nxt}; "
        f"reaping: {srv.policy}",
        f"  {format_counters(snap.counters)}  max loop lag {format_seconds(srv.max_loop_lag)}",
    ]
    if srv.journal_problem is not None:
        lines.append(
            f"  JOURNAL NOT WRITTEN: {srv.journal_problem}; a server restarted after a crash "
            "would not reap the workers hung now"
        )
    sup = snap.supervisor
    if sup is not None:
        ended = f", {sup.outcome}" if sup.outcome else ""
        gave_up = f" (gave up: {sup.gave_up})" if sup.gave_up else ""
        lines.append(
            f"  supervisor {sup.state}{ended}{gave_up}: run {sup.run_id}, {sup.nproc} workers, "
            f"{sup.restarts} restart{'' if sup.restarts == 1 else 's'} "
            f"({sup.restarts_in_window} in the window): " + " ".join(sup.command)
        )
        if sup.hang_report:
            lines.append(f"  last hang report: {sup.hang_report}")
    timers: dict[tuple[int | None, str], TimerInfo] = {(t.pid, t.scope_id): t for t in snap.timers}
    ranked = any(w.rank is not None for w in snap.workers)
    header = ("RANK", "PID", "STATE", "TIMERS") if ranked else ("PID", "STATE", "TIMERS")
    rows: list[tuple[str, ...]] = [(*header, "OPEN SCOPES (time left)")]
    for w in snap.workers:
        restarts = "" if w.restarts is None else f" (restarts {w.restarts})"
        scopes = sorted(
            w.scopes,
            key=lambda s: t.seconds_left if (t := timers.get((w.pid, s))) else float("inf"),
        )
        shown = ", ".join(
            f"{s} ({_time_left(timers[(w.pid, s)])})" if (w.pid, s) in timers else s for s in scopes
        )
        if w.timers > len(w.scopes):
            shown += f", ... {w.timers - len(w.scopes)} more"
        if w.straggler:
            restarts += f" STRAGGLER {w.slowness or 0:.2f}x in {', '.join(w.straggler)}"
        cells = ("-" if w.pid is None else str(w.pid), w.state + restarts, str(w.timers))
        rank = () if not ranked else ("-" if w.rank is None else str(w.rank),)
        rows.append((*rank, *cells, shown or "-"))
    if len(rows) > 1:
        n = len(header)
        widths = [max(len(r[i]) for r in rows) for i in range(n)]
        for r in rows:
            padded = [c.ljust(w) for c, w in zip(r[:n], widths, strict=True)]
            lines.append("  ".join([*padded, r[n]]))
    else:
        lines.append("no workers")
    if snap.truncated:
        lines.append(
            f"(lists cut: {len(snap.workers)} of {snap.workers_total:,} workers, "
            f"{len(snap.timers)} of {snap.timers_total:,} timers; see --limit)"
        )
    lines.extend(format_learned(snap.learned))
    lines.extend(format_incidents(snap.recent))
    return "\n".join(line.rstrip() for line in lines) + "\n"
