"""Who makes room when the timer table is full: the worker that holds the most.

How this works
--------------
Two caps bound the table: ``max_timers`` in all (memory) and ``max_per_worker`` per
worker (a leak in one worker). A global cap alone lets one writer starve everyone: a
writer naming a few pids can fill the table under the per-worker cap, and every other
worker's acquire is then refused, so its hung blocks are never reaped. Over a FIFO the
writer's identity is unknown (a line names a pid; anyone who may write the pipe may name
any), so a quota per writer cannot be kept there, and one per named pid is the
per-worker cap already. What can always be told is who *holds* the timers. So, for the
acquire of a new timer by worker ``W`` (:meth:`Quota.admit`):

* ``W`` at ``max_per_worker``: refused (it leaks timers);
* the table below ``max_timers``: admitted;
* the table full: room is made by *evicting* one timer of the worker ``H`` that holds
  the most, its oldest (the likeliest leak), as long as ``H`` holds at least two more
  than ``W`` (so ``W`` never ends up holding more than ``H``); otherwise ``W`` is among
  the largest holders itself and is refused.

A worker that holds few timers is therefore never refused for the global cap: to
starve it, an attacker would need more live processes holding timers than the table has
room (a million by default). Evictions fall on whoever holds the most, which is the
leaker or the flooder, and each is reported (:class:`~aiotimer.events.TimerEvicted`).

Cost: the largest holder is found by a scan of the workers (O(workers)) only when the
one last found no longer holds two more than the newcomer, and its timers are listed
once (O(its timers)) and then evicted from that list one per admitted acquire: O(1)
amortised per acquire while the table stays full. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiotimer.core._table import TimerTable

__all__ = ["Admission", "Quota"]


@dataclass(frozen=True, slots=True)
class Admission:
    """What :meth:`Quota.admit` decided: ``refused`` (why, or ``None`` if admitted),
    and the timer to ``evict`` first, if any: ``(pid, scope_id)``."""

    refused: str | None = None
    evict: tuple[int, str] | None = None


_ADMITTED = Admission()


class Quota:
    """The caps of one table (see the module docs)."""

    __slots__ = ("_holder", "_max", "_max_per_worker", "_table", "_victims")

    def __init__(self, table: TimerTable, max_timers: int, max_per_worker: int) -> None:
        self._table = table
        self._max = max_timers
        self._max_per_worker = max_per_worker
        self._holder: int | None = None  # the largest holder, as last found
        self._victims: list[str] = []  # its scope ids, newest first: evicted from the end

    def admit(self, pid: int) -> Admission:
        """Whether worker ``pid`` may add a timer (a new key) now, and what to evict first."""
        table = self._table
        own = table.worker_size(pid)
        if own >= self._max_per_worker:
            return Admission(
                f"timer cap reached: worker {pid} holds {own:,} timers "
                f"(max_timers_per_worker={self._max_per_worker:,}); it leaks timers, or "
                "raise the cap"
            )
        if len(table) < self._max:
            return _ADMITTED
        holder = self._holder
        if holder is None or holder == pid or table.worker_size(holder) < own + 2:
            holder = self._holder = self._largest(pid)
            self._victims = []
        if holder is None:
            return Admission(
                f"timer cap reached: the server holds {len(table):,} timers "
                f"(max_timers={self._max:,}) and worker {pid} holds {own:,} of them, as "
                "many as any other worker; release timers or raise the cap"
            )
        if not self._victims:
            self._victims = list(table.live_scopes(holder))[::-1]
        while self._victims:
            scope_id = self._victims.pop()
            if table.get(holder, scope_id) is not None:
                return Admission(evict=(holder, scope_id))
        # Every listed timer has gone since: list the holder's timers again (it holds
        # at least two more than ``pid``, so some are live).
        self._victims = list(table.live_scopes(holder))[::-1]
        return Admission(evict=(holder, self._victims.pop()))

    def _largest(self, pid: int) -> int | None:
        """The worker holding the most timers, if it holds at least two more than
        ``pid`` (O(workers))."""
        table = self._table
        best, most = None, table.worker_size(pid) + 1
        for worker in table.workers():
            size = table.worker_size(worker)
            if size > most:
                best, most = worker, size
        return best
