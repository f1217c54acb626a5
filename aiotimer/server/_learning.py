"""The engine's learned timeouts: where a learned block's deadline is set, its duration
recorded and its expiry explained. No I/O, no clock: time comes in as arguments.

How this works
--------------
A learned block (``expires(after=learned(initial=...))``) arrives as an acquire whose
deadline is ``initial`` seconds ahead, with its spec in the ``learned`` key
(:mod:`aiotimer.wire._learned`). The engine asks :meth:`Learning.deadline` for the
timer's deadline: the acquire's arrival plus the scope's value in force
(:mod:`aiotimer.core._learned`), never later than the client's own. Every duration the
engine records (a release, the late release of a block that expired unreaped, the pairs
of a batch that cancel out) goes to :meth:`Learning.released` as well, which returns
the :class:`~aiotimer.events.LearnedWouldReap` to emit when the duration is one the
learned value would have reaped. At an expiry, :meth:`Learning.expired` says whether
the learned value set the deadline, and from how many samples, for the
:class:`~aiotimer.events.TimerExpired` event.

The value each live learned timer got is kept by key, bounded
(:data:`MAX_TRACKED`): a worker that exits leaves its entries to age out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Final

from aiotimer.core._learned import LearnedSummary, LearnedTimeouts
from aiotimer.core._timer import Timer, TimerKey
from aiotimer.events import LearnedWouldReap
from aiotimer.wire import Request

__all__ = ["LEARNED_LISTED", "MAX_TRACKED", "Learning"]

#: The most live learned timers whose value is remembered for their expiry event.
MAX_TRACKED: Final[int] = 100_000
#: The most learned scopes a snapshot lists (status, metrics): those with most samples.
LEARNED_LISTED: Final[int] = 100


class Learning:
    """One engine's learned timeouts (see the module docs)."""

    __slots__ = ("_applied", "timeouts")

    def __init__(self, timeouts: LearnedTimeouts | None = None) -> None:
        self.timeouts = LearnedTimeouts() if timeouts is None else timeouts
        # key -> (deadline, value, samples) of live timers the learned value set
        self._applied: OrderedDict[TimerKey, tuple[float, float, int]] = OrderedDict()

    def deadline(self, req: Request, mono: float, deadline: float) -> float:
        """The deadline of acquire ``req``, which arrived at ``mono`` asking for
        ``deadline``: the learned value's, when the request is learned and it is earlier."""
        spec = req.learned
        if spec is None:
            return deadline
        value, samples = self.timeouts.in_force(req.scope_id, spec)
        learned = mono + value + (req.kill_after or 0.0)
        key = (req.pid, req.scope_id)
        if learned >= deadline:
            self._applied.pop(key, None)
            return deadline
        applied = self._applied
        applied[key] = (learned, value, samples)
        applied.move_to_end(key)
        if len(applied) > MAX_TRACKED:
            applied.popitem(last=False)
        return learned

    def released(
        self, pid: int, scope_id: str, duration: float, wall: float
    ) -> LearnedWouldReap | None:
        """Block ``(pid, scope_id)`` ended after ``duration`` seconds: record it; the
        event to emit when the learned value would have reaped it."""
        if self._applied:
            self._applied.pop((pid, scope_id), None)
        if not self.timeouts:
            return None
        seen = self.timeouts.observe(scope_id, duration)
        if seen is None:
            return None
        observed, scope = seen
        if not observed.would_reap:
            return None
        assert scope.spec is not None
        return LearnedWouldReap(
            time=wall,
            pid=pid,
            scope_id=scope_id,
            duration=duration,
            value=observed.before,
            samples=scope.samples - 1,
            initial=scope.spec.initial,
            widened_to=observed.after,
        )

    def released_many(self, counts: Mapping[str, int], duration: float) -> None:
        """Blocks begun and ended within one batch, ``counts`` per scope id, each of
        ``duration`` seconds."""
        if self.timeouts:
            self.timeouts.observe_many(duration, dict(counts))

    def expired(self, timer: Timer) -> tuple[float, int] | None:
        """``timer`` expired: the learned value that set its deadline and the samples
        it rested on, or ``None`` when its deadline was the client's own."""
        if not self._applied:
            return None
        applied = self._applied.pop(timer.key, None)
        if applied is None or applied[0] != timer.deadline:
            return None
        return applied[1], applied[2]

    def summaries(self, limit: int | None = None) -> list[LearnedSummary]:
        """The learned scopes, most samples first, at most ``limit`` (see
        :class:`~aiotimer.core._learned.LearnedSummary`)."""
        return self.timeouts.summaries(limit)

    def __repr__(self) -> str:
        return f"<Learning {self.timeouts!r}, {len(self._applied):,} live timers>"
