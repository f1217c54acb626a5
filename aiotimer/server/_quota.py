"""Who makes room when the timer table is full: fair shares per user, then per worker.

How this works
--------------
Two caps bound the table: ``max_timers`` in all (memory) and ``max_per_worker`` per
worker (a leak in one worker). A global cap alone lets one party starve everyone: many
processes, each under the per-worker cap, fill the table, and every other worker's
acquire is then refused, or its oldest (hung) block evicted, so it is never reaped. So
the table is shared first between *users*, then between the workers of each user. A
timer belongs to the user (uid) that runs its worker: the machine tells
:meth:`Quota.own` when the worker is first pinned (docs/operations.md argues why, per
transport). For the acquire of a new timer by worker ``W`` of user ``u``
(:meth:`Quota.admit`):

1. ``W`` at ``max_per_worker``: refused (it leaks timers);
2. the table below ``max_timers``: admitted;
3. the table full, and another user ``H`` holds the most of the other users and at
   least two more than ``u``: the oldest timer of ``H``'s largest worker makes room;
4. otherwise (``u`` holds as many as any other user, give or take one): room is made
   inside ``u`` alone, from the oldest timer of ``u``'s largest worker, if that one
   holds at least two more than ``W``; otherwise ``W`` is refused, and the message
   says both facts.

What this guarantees, whatever other users do (``U`` users holding timers, ``M`` the
cap): a user's timer is evicted for another user only while it holds the most of all
users and at least two more than the newcomer's user, so no user is pushed below
``ceil(M / U) - 1`` timers by another; and a user that holds fewer than the most of the
others minus one is never refused for room. An unprivileged user cannot mint users,
so however many processes it starts, it competes with each other user for one share.
Inside a user the same rule holds between its workers: a worker holding ``k`` timers
always opens its ``k + 1``-th (up to ``max_per_worker``) while its user holds fewer
than the most of the others minus one, or while a worker of the same user holds
``k + 2`` or more. Evictions fall on
the largest holder of the largest user: a leaker, or a flooder. Workers whose user is
unknown (no ``/proc``) share one user, ``None``.

Cost. Admission only runs with the table full (or a worker at its cap). It needs each
user's total: :class:`Quota` keeps them in a tally made by one scan of the workers
(O(workers)), then kept exact through its own admissions (each adds one timer of the
newcomer and evicts at most one), and made again only when the table changed outside
them: the caller counts every new timer it adds in :attr:`Quota.added`, and timers that
left change the table's size. So while the table stays full and only takes admissions,
each costs O(users) to compare the totals; the first after an outside change costs a
scan (:meth:`~aiotimer.core._table.TimerTable.worker_sizes`, about 0.3 us a worker). The
tally also holds each user's workers and a stack of its largest ones (stale entries are
dropped as they surface; once none is left at that size, a scan of the user's workers
finds the next), so the largest worker of a user is found in O(1) amortised. Evicted
timers are taken from a list of the holder's scopes made once, oldest first. Pure: no
I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiotimer.core import TimerTable

__all__ = ["Admission", "Quota"]


@dataclass(frozen=True, slots=True)
class Admission:
    """What :meth:`Quota.admit` decided: ``refused`` (why, or ``None`` if admitted),
    and the timer to ``evict`` first, if any: ``(pid, scope_id)``."""

    refused: str | None = None
    evict: tuple[int, str] | None = None


_ADMITTED = Admission()


class _Tally:
    """Each user's total and its workers by size, exact while the table changed only
    through admissions since it was made (see the module docs).

    One scan makes each user's total, its workers and its largest workers (a stack of
    those of the largest size: entries go stale when a worker changes size, and are
    dropped as they surface); a user's largest are found again, by a scan of its
    workers, once none is left at that size."""

    __slots__ = ("added", "length", "levels", "members", "owners", "stacks", "table", "totals")

    def __init__(self, table: TimerTable, owners: dict[int, int | None], added: int) -> None:
        self.table, self.owners = table, owners
        self.length = len(table)  # the table's size when it was last exact
        self.added = added  # Quota.added then
        members: dict[int | None, set[int]] = {}
        totals: dict[int | None, int] = {}
        #: user -> the size of its largest workers, and a stack of them.
        levels: dict[int | None, int] = {}
        stacks: dict[int | None, list[int]] = {}
        get = owners.get
        for worker, n in table.worker_sizes():  # one pass: the scan is the quota's cost
            uid = get(worker)
            group = members.get(uid)
            if group is None:
                members[uid], totals[uid], levels[uid], stacks[uid] = {worker}, n, n, [worker]
                continue
            group.add(worker)
            totals[uid] += n
            if n > levels[uid]:
                levels[uid], stacks[uid] = n, [worker]
            elif n == levels[uid]:
                stacks[uid].append(worker)
        self.members, self.totals, self.levels, self.stacks = members, totals, levels, stacks

    def move(self, uid: int | None, pid: int, old: int, new: int) -> None:
        """Worker ``pid`` of ``uid`` goes from ``old`` timers to ``new``."""
        self.totals[uid] = self.totals.get(uid, 0) + new - old
        if not old:
            self.members.setdefault(uid, set()).add(pid)
        level = self.levels.get(uid)
        if level is not None and new >= level:
            if new > level:
                self.levels[uid], self.stacks[uid] = new, [pid]
            else:
                self.stacks[uid].append(pid)

    def top(self, uid: int | None) -> int:
        """How many timers the largest worker of ``uid`` holds (0: none)."""
        level = self.levels.get(uid)
        if level is not None:
            table, owners, stack = self.table, self.owners, self.stacks[uid]
            while stack:
                pid = stack[-1]
                if table.worker_size(pid) == level and owners.get(pid) == uid:
                    return level
                stack.pop()  # stale: it changed size since
        size, level, stack = self.table.worker_size, 0, []
        for pid in self.members.get(uid, ()):
            n = size(pid)
            if n > level:
                level, stack = n, [pid]
            elif n == level:
                stack.append(pid)
        if level:
            self.levels[uid], self.stacks[uid] = level, stack
        return level

    def largest(self, uid: int | None) -> int:
        """A worker of ``uid`` holding :meth:`top` timers (it holds some)."""
        self.top(uid)
        return self.stacks[uid][-1]


def _user(uid: int | None) -> str:
    return "an unknown user" if uid is None else f"uid {uid}"


class Quota:
    """The caps of one table, shared per user (see the module docs).

    The caller tells :meth:`own` who runs each worker, counts in :attr:`added` every
    timer with a new key it adds to the table, and carries out each admission: evict
    the timer it names, then add the newcomer's.
    """

    __slots__ = ("_max", "_max_per_worker", "_owners", "_table", "_tally", "_victims", "added")

    def __init__(self, table: TimerTable, max_timers: int, max_per_worker: int) -> None:
        self._table = table
        self._max = max_timers
        self._max_per_worker = max_per_worker
        self._owners: dict[int, int | None] = {}
        self._tally: _Tally | None = None
        #: Scope ids of workers evicted from, newest first: taken from the end.
        self._victims: dict[int, list[str]] = {}
        #: How many timers with a new key the caller has added to the table.
        self.added = 0

    def own(self, pid: int, uid: int | None) -> None:
        """Worker ``pid`` is run by user ``uid`` (``None``: unknown); told when it is
        first pinned, before it holds a timer."""
        if self._table.worker_size(pid) and self._owners.get(pid) != uid:
            self._tally = None  # its timers change hands
        self._owners[pid] = uid

    def disown(self, pid: int) -> None:
        """Worker ``pid`` has gone (it holds no timer any more)."""
        self._owners.pop(pid, None)
        self._victims.pop(pid, None)

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
        tally = self._exact_tally()
        uid = self._owners.get(pid)
        mine = tally.totals.get(uid, 0)
        rich, most = None, 0  # the other user that holds the most, and how many
        for user, total in tally.totals.items():
            if user != uid and total > most:
                rich, most = user, total
        if most < mine + 2:
            top = tally.top(uid)
            if top < own + 2:
                return Admission(
                    self._refusal(pid, uid, own=own, mine=mine, rich=rich, most=most, top=top)
                )
            rich = uid
        donor = tally.largest(rich)
        level = table.worker_size(donor)
        tally.move(rich, donor, level, level - 1)
        tally.move(uid, pid, own, own + 1)
        tally.added += 1  # the newcomer's timer; the table's size stays
        return Admission(evict=(donor, self._oldest(donor)))

    def _refusal(
        self,
        pid: int,
        uid: int | None,
        *,
        own: int,
        mine: int,
        rich: int | None,
        most: int,
        top: int,
    ) -> str:
        """Why worker ``pid`` is refused for room: both facts, with their figures."""
        others = (
            "no other user holds timers"
            if not most
            else f"no other user holds {mine + 2:,} or more (the most: {most:,}, {_user(rich)})"
        )
        return (
            f"timer cap reached: the server holds {len(self._table):,} timers "
            f"(max_timers={self._max:,}); {_user(uid)} holds {mine:,} of them and {others}; "
            f"worker {pid} holds {own:,} and no worker of {_user(uid)} holds {own + 2:,} or "
            f"more (the most: {top:,}). Room is made only from a user, then a worker, "
            "holding at least two more: release timers or raise the cap"
        )

    def _exact_tally(self) -> _Tally:
        """The tally, made again (O(workers)) if the table changed outside admissions."""
        tally, table = self._tally, self._table
        if tally is None or tally.added != self.added or tally.length != len(table):
            tally = self._tally = _Tally(table, self._owners, self.added)
            self._victims.clear()
        return tally

    def _oldest(self, holder: int) -> str:
        """The oldest live timer of ``holder`` (which holds one): its scopes are listed
        once, then taken from the end of the list, so a run of evictions is O(1) each."""
        table = self._table
        victims = self._victims.get(holder)
        while True:
            if not victims:
                victims = self._victims[holder] = list(table.live_scopes(holder))[::-1]
            scope_id = victims.pop()
            if table.get(holder, scope_id) is not None:
                return scope_id
