"""The machine's ingest: applying one decoded batch of requests to the timer table.
Pure: no I/O, no clock; what it does outside the table it appends as effects
(:mod:`aiotimer.server._effects`) to :attr:`Ingest.out`.

How this works
--------------
A batch (a source's read, or what a drain returned before an expiry) is first
*prepared* (:meth:`Ingest.prepare`): folded if it can be (below), and the workers it
names for the first time listed, to be pinned (:class:`~aiotimer.server._effects.Pin`)
before anything of it is applied. Then :meth:`Ingest.apply` applies its requests in
order, then counts its rejections and reports the first :data:`REPORTED_REJECTIONS`
one by one (:class:`~aiotimer.events.RequestRejected`), the rest in one event, so a read
of garbage costs a bounded number of events. A request:

* *release*: the timer leaves the table; its duration (release time - acquire time)
  is recorded for its scope's site (:mod:`aiotimer.core._stats`). Releasing an unknown
  timer is a no-op, except for a timer that expired unreaped (report only, shadow mode):
  remembered in an :class:`~aiotimer.core._stats.Overdue`, its late release still
  records the block's real duration. A release that says its block was cancelled at
  its own deadline (the first tier of an ``async with`` block) is counted and reported
  (:class:`~aiotimer.events.BlockCancelled`).
* *acquire*: a worker that could not be pinned (the reaper cannot attach it) is
  reported (:class:`~aiotimer.events.WorkerUnknown`) and its request dropped; a worker
  pinned is attributed to the user that runs it (the machine tells the quota). The
  server's own process is never watched: its timers only report their expiry. Caps
  (:mod:`aiotimer.server._quota`): an acquire of a new key is rejected (a counted
  :class:`~aiotimer.events.RequestRejected` naming the worker) when its worker holds
  ``max_timers_per_worker``; when the table holds ``max_timers``, a timer of the user
  that holds the most (at least two more than the acquiring worker's user; else of the
  acquiring user's largest worker, at least two more than the acquiring worker) makes
  room (:class:`~aiotimer.events.TimerEvicted`); otherwise it is rejected.

A batch of several requests is folded first (:mod:`aiotimer.core._fold`): a block whose
acquire and release are both in it never reaches the table; it is counted and its
duration (zero: both arrived now) recorded. Near a cap, where the order of the table's
changes matters, the requests are applied one by one.

With a journal, every change of a timer is an effect for it. Timers restored from it
(:meth:`Ingest.mark_restored`) speak for a worker only until that worker sends
anything: its client re-sends the blocks it still has open, so the restored ones are
dropped first.

Ingest never handles expiries: the machine does, once the batch is applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

from aiotimer.core import DurationStats, Fold, Overdue, Timer, TimerTable, fold, paired_blocks
from aiotimer.events import (
    BlockCancelled,
    RequestRejected,
    ServerCounters,
    TimerAcquired,
    TimerEvicted,
    TimerReleased,
    WorkerUnknown,
)
from aiotimer.server._effects import JournalAcquired, JournalReleased
from aiotimer.server._learning import Learning
from aiotimer.server._quota import Quota
from aiotimer.wire import Decoded, Rejection, Request

if TYPE_CHECKING:
    from aiotimer.server._effects import Effect


__all__ = ["MAX_TIMERS", "MAX_TIMERS_PER_WORKER", "REPORTED_REJECTIONS", "Ingest"]

#: Default cap on live timers in all; acquires past it are rejected.
MAX_TIMERS = 1_000_000
#: Default cap on one worker's live timers; its acquires past it are rejected.
MAX_TIMERS_PER_WORKER = 100_000
#: Acquires of workers gone before their lines were read, held for their releases: at
#: most this many, for at most this many seconds.
MAX_UNPINNED_HELD: Final[int] = 10_000
UNPINNED_HOLD: Final[float] = 5.0
#: Rejections of one batch reported one by one; the rest in one event (all counted).
REPORTED_REJECTIONS: Final = 64


def _took(timer: Timer, release: Request, mono: float) -> float:
    """How long ``timer``'s block ran, its ``release`` applied at ``mono``: by the
    worker's own stamps (``at``) where both lines carry one, so a paced reader does not
    stretch or shrink it; else from the acquire's arrival to the release's."""
    if timer.request is not None:
        took = _stamped_took(timer.request, release, mono)
        if took is not None:
            return took
    return max(0.0, mono - timer.acquired_at)


def _timer_of(acquire: Request, mono: float, wall: float) -> Timer:
    """The timer ``acquire``, read at ``mono``, would set (its block's tiers)."""
    return Timer(
        acquire.pid, acquire.scope_id, acquire.deadline(mono, wall), acquire.signal, mono, acquire
    )


def _stamped_took(acquire: Request, release: Request, mono: float) -> float | None:
    """A block's duration by its worker's stamps (``at``), its release read at
    ``mono``; ``None`` without both stamps."""
    if acquire.at is None or release.at is None:
        return None
    return max(0.0, min(release.at, mono) - acquire.at)


class Ingest:
    """Applies batches of requests to one machine's table (see the module docs).

    ``watched`` is the machine's live set of pinned workers; ``quota`` its caps."""

    def __init__(
        self,
        *,
        table: TimerTable,
        counts: ServerCounters,
        stats: DurationStats,
        overdue: Overdue,
        learning: Learning,
        quota: Quota,
        watched: set[int],
        own_pid: int,
        journal: bool,
        request_events: bool,
        max_timers: int,
        max_timers_per_worker: int,
    ) -> None:
        self._table = table
        self._counts = counts
        self._stats = stats
        self._overdue = overdue
        self._watched = watched
        self._learning = learning
        self._journal = journal
        self._request_events = request_events
        # Acquires of a worker that could not be pinned (reported unknown; often gone
        # before a paced reader got its lines, in several chunks), kept a little while
        # (UNPINNED_HOLD, MAX_UNPINNED_HELD) so that a release that follows still gives
        # its block's duration and tiers.
        self._unpinned_open: dict[tuple[int, str], Timer] = {}
        self._max_timers = max_timers
        self._max_per_worker = max_timers_per_worker
        self._quota = quota
        self._own_pid = own_pid
        self._restored: dict[int, set[str]] = {}  # journal timers, until the worker speaks
        #: Where the effects of the current step go (set by the machine).
        self.out: list[Effect] = []

    def prepare(self, batch: Decoded) -> tuple[Fold | None, dict[int, int | None] | None]:
        """``batch``'s fold, if it is applied folded, and the workers it names for the
        first time in the acquires it applies (pid -> start time, in the order named;
        ``None``: none), to be pinned first."""
        requests = batch.requests
        folded = None
        if len(requests) > 1 and not self._request_events:
            folded = fold(requests)
            if not self._far_from_caps(folded.pids(), len(requests)):
                folded = None
        watched, own = self._watched, self._own_pid
        pins: dict[int, int | None] | None = None
        applied = requests if folded is None else [requests[i] for i in folded.apply]
        for req in applied:
            pid = req.pid
            if pid not in watched and pid != own and not req.is_release:
                if pins is None:
                    pins = {}
                pins.setdefault(pid, req.start_time)
        return folded, pins

    def apply(
        self, batch: Decoded, folded: Fold | None, source: str, mono: float, wall: float
    ) -> None:
        """Apply ``batch`` from ``source``, prepared (``folded`` if so) and its workers
        pinned or found unknown: every request in order, then one event per rejection."""
        requests = batch.requests
        self._counts.requests += len(requests)
        if folded is not None:
            self._apply_folded(folded, requests, source, mono, wall)
        else:
            for req in requests:
                self._apply(req, source, mono, wall)
        if self._unpinned_open:
            self._forget_unpinned(mono)
        if batch.rejections:
            self._reject(batch.rejections, source, wall)

    def _forget_unpinned(self, mono: float) -> None:
        """Forget the held acquires of unpinnable workers read more than
        :data:`UNPINNED_HOLD` seconds ago (a gone worker's lines are all in the pipe, so
        its releases come in the same read or the next), or beyond the bound. The
        oldest are first in the dict: O(1) a batch, amortized."""
        held = self._unpinned_open
        while held:
            key, timer = next(iter(held.items()))
            if len(held) <= MAX_UNPINNED_HELD and mono - timer.acquired_at <= UNPINNED_HOLD:
                break
            del held[key]

    def _reject(self, rejections: Sequence[Rejection], source: str, wall: float) -> None:
        """Count every rejection; report the first :data:`REPORTED_REJECTIONS` of the
        batch one by one and the rest in one event (the work per read stays bounded)."""
        self._counts.rejected += len(rejections)
        for rej in rejections[:REPORTED_REJECTIONS]:
            text = rej.line.decode("ascii", "backslashreplace")
            self.out.append(RequestRejected(time=wall, reason=rej.reason, line=text, source=source))
        more = len(rejections) - REPORTED_REJECTIONS
        if more > 0:
            sample = rejections[REPORTED_REJECTIONS]
            reason = (
                f"{more:,} more bad line(s) in the same read, counted but not reported one "
                f"by one; the first: {sample.reason}"
            )
            text = sample.line.decode("ascii", "backslashreplace")
            self.out.append(RequestRejected(time=wall, reason=reason, line=text, source=source))

    def mark_restored(self, requests: Sequence[Request]) -> int:
        """The acquires ``requests``, applied, came from the journal (see the module
        docs); return how many of them are in the table."""
        count = 0
        for req in requests:
            if self._table.get(req.pid, req.scope_id) is not None:
                self._restored.setdefault(req.pid, set()).add(req.scope_id)
                count += 1
        return count

    def forget(self, pid: int) -> None:
        """Worker ``pid``'s timers are gone (reaped, or it exited): no restored ones left;
        once it is no longer watched (it exited), its user is forgotten too."""
        self._restored.pop(pid, None)
        if pid not in self._watched and pid != self._own_pid:
            self._quota.disown(pid)

    def _apply_folded(
        self, folded: Fold, requests: Sequence[Request], source: str, mono: float, wall: float
    ) -> None:
        """Apply a batch, far from the caps, as its requests one by one (see the module
        docs)."""
        table = self._table
        pairs = folded.pairs
        counts = self._counts
        counts.released += pairs
        counts.acquired += pairs + folded.superseded
        # What the folded requests do to the state before the batch, before the applied
        # requests: nothing of those keys comes first (see aiotimer.core._fold), and far
        # from the caps nothing else can tell the order.
        restored, overdue, journal, out = self._restored, self._overdue, self._journal, self.out
        for pid in folded.pids():
            if restored and pid in restored:
                self._drop_restored(pid)
            live = table.worker_size(pid)
            if not (live or overdue):
                continue
            scopes = folded.scopes(pid)
            if live < len(scopes) and not overdue:
                scopes = table.live_scopes(pid)  # fewer to look at
            for scope_id in [s for s in scopes if folded.ends(pid, s)]:
                if overdue:
                    overdue.pop((pid, scope_id))
                if table.release(pid, scope_id) is not None and journal:
                    out.append(JournalReleased(pid, scope_id))
        for i in folded.apply:
            self._apply(requests[i], source, mono, wall)
        if not folded.paired:
            return
        stamped = requests[0].at is not None or requests[-1].at is not None
        learned = self._learning.wants(folded.paired)
        blocks = paired_blocks(requests, folded) if stamped or learned or folded.cancelled else []
        if stamped:  # the worker's own times: each block's duration
            for acquire, release in blocks:
                took = _stamped_took(acquire, release, mono)
                self._stats.record(release.scope_id, 0.0 if took is None else took)
        else:
            self._stats.record_many(folded.paired, 0.0)  # both arrived now
        if learned:
            self._learning.folded(blocks, mono, wall)
        if folded.cancelled:  # blocks begun and cancelled within the batch
            acquired = {id(release): acquire for acquire, release in blocks}
            for i in folded.cancelled:
                began = acquired.get(id(requests[i]))
                timer = None if began is None else _timer_of(began, mono, wall)
                self._cancelled(requests[i], timer, mono, wall)

    def _far_from_caps(self, pids: Iterable[int], size: int) -> bool:
        """Whether no acquire of a batch of ``size`` requests naming ``pids`` can meet
        a cap, however the batch is applied (each acquire adds at most one timer)."""
        table = self._table
        return len(table) + size <= self._max_timers and all(
            table.worker_size(pid) + size <= self._max_per_worker for pid in pids
        )

    def _apply(self, req: Request, source: str, mono: float, wall: float) -> None:
        if self._restored and req.pid in self._restored:
            self._drop_restored(req.pid)
        if req.is_release:
            self._release(req, source, mono, wall)
            return
        pid, table = req.pid, self._table
        if self._overdue:
            self._overdue.pop((pid, req.scope_id))  # re-acquired: that block's end is unknown
        if pid not in self._watched and pid != self._own_pid:  # it could not be pinned
            self.out.append(WorkerUnknown(time=wall, pid=pid, scope_id=req.scope_id, source=source))
            held = self._unpinned_open
            held.pop((pid, req.scope_id), None)  # the newest last: the dict is by age
            held[(pid, req.scope_id)] = _timer_of(req, mono, wall)
            return
        if (
            len(table) >= self._max_timers or table.worker_size(pid) >= self._max_per_worker
        ) and table.get(pid, req.scope_id) is None:
            admission = self._quota.admit(pid)
            if admission.refused is not None:
                self._reject_over_cap(req, admission.refused, source, wall)
                return
            if admission.evict is not None:
                self._evict(*admission.evict, for_pid=pid, wall=wall)
        deadline = req.deadline(mono, wall)
        if req.learned is not None:
            deadline = self._learning.deadline(req, deadline)
        timer = Timer(pid, req.scope_id, deadline, req.signal, mono, req)
        if table.acquire(timer) is None:
            self._quota.added += 1
        if self._journal:
            self.out.append(JournalAcquired(timer))
        self._counts.acquired += 1
        if self._request_events:
            self.out.append(
                TimerAcquired(
                    time=wall,
                    pid=pid,
                    scope_id=req.scope_id,
                    expires_in=deadline - mono,
                    signal=req.signal,
                    source=source,
                )
            )

    def _release(self, req: Request, source: str, mono: float, wall: float) -> None:
        released = self._table.release(req.pid, req.scope_id)
        journaled = released is not None
        if released is None and self._unpinned_open:
            held = self._unpinned_open.pop((req.pid, req.scope_id), None)
            if held is not None:  # its worker is gone, but the block ended before it went
                released = held
        if req.cancelled:
            self._cancelled(req, released, mono, wall)
        if released is not None:
            if self._journal and journaled:
                self.out.append(JournalReleased(req.pid, req.scope_id))
            self._counts.released += 1
            duration = _took(released, req, mono)
            self._stats.record(req.scope_id, duration)
            if self._learning.live:
                self._learned(req, duration, mono, wall)
            if self._request_events:
                self.out.append(
                    TimerReleased(time=wall, pid=req.pid, scope_id=req.scope_id, source=source)
                )
        elif self._overdue:
            acquired_at = self._overdue.pop((req.pid, req.scope_id))
            if acquired_at is not None:  # the late end of an expired, unreaped block
                self._stats.record_late(req.scope_id, max(0.0, mono - acquired_at))
                if self._learning.live:
                    self._learned(req, max(0.0, mono - acquired_at), mono, wall)

    def _learned(self, req: Request, duration: float, mono: float, wall: float) -> None:
        """Tell the learned timeouts a block's duration; report what they say. A release
        stamped with its worker's time (``at``) ended then, not when it was read."""
        ended = mono if req.at is None else min(mono, req.at)
        event = self._learning.released(req.pid, req.scope_id, duration, ended, wall)
        if event is not None:
            self.out.append(event)

    def _cancelled(self, req: Request, timer: Timer | None, mono: float, wall: float) -> None:
        """``req`` releases a block whose task was cancelled at its own deadline (the
        first tier): count it and say so; ``timer`` is the block's, if the table held it."""
        self._counts.cancelled += 1
        late = kill_after = None
        if timer is not None and timer.kill_after > 0:
            ended = mono if req.at is None else min(mono, req.at)  # the worker's stamp
            late, kill_after = max(0.0, ended - timer.block_deadline), timer.kill_after
        self.out.append(
            BlockCancelled(
                time=wall, pid=req.pid, scope_id=req.scope_id, late=late, kill_after=kill_after
            )
        )

    def _reject_over_cap(self, req: Request, reason: str, source: str, wall: float) -> None:
        self._counts.rejected += 1
        self._counts.cap_rejected += 1
        line = f"acquire {req.scope_id!r} of pid {req.pid}"[:200]
        self.out.append(
            RequestRejected(time=wall, reason=reason, line=line, source=source, pid=req.pid)
        )

    def _evict(self, pid: int, scope_id: str, *, for_pid: int, wall: float) -> None:
        """Drop timer ``(pid, scope_id)`` to make room for a new one of ``for_pid``."""
        holds = self._table.worker_size(pid)
        self._table.release(pid, scope_id)
        if self._journal:
            self.out.append(JournalReleased(pid, scope_id))
        restored = self._restored.get(pid)
        if restored is not None:
            restored.discard(scope_id)
        self._counts.evicted += 1
        self.out.append(
            TimerEvicted(
                time=wall,
                pid=pid,
                scope_id=scope_id,
                holds=holds,
                for_pid=for_pid,
                max_timers=self._max_timers,
            )
        )

    def _drop_restored(self, pid: int) -> None:
        """Worker ``pid`` spoke: drop the timers the journal restored for it."""
        for scope_id in self._restored.pop(pid, ()):
            if self._table.release(pid, scope_id) is not None and self._journal:
                self.out.append(JournalReleased(pid, scope_id))
