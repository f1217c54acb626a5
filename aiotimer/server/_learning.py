"""The engine's learned timeouts: where a learned block's deadline is set, its duration
recorded and its expiry explained. No I/O, no clock: time comes in as arguments.

How this works
--------------
A learned block (``expires(after=learned(initial=...))``) arrives as an acquire whose
deadline is ``initial`` seconds ahead, with its spec in the ``learned`` key
(:mod:`aiotimer.wire._learned`). The engine asks :meth:`Learning.deadline` for the
timer's deadline: the block's start (the client's deadline less ``initial``, so a line
read late, as a paced reader may, costs nothing) plus the scope's value in force
(:mod:`aiotimer.core._learned`), never later than the client's own. Every duration the
engine records (a release, the late release of a block that expired unreaped) goes to
:meth:`Learning.released` as well (the blocks a batch begins and ends, folded away, to
:meth:`Learning.folded`); a learned block's
is taken from its own start to its release's arrival (so a paced reader can make it
longer, never shorter). It returns
the :class:`~aiotimer.events.LearnedWouldReap` to emit when the duration is one the
learned value would have reaped. At an expiry, :meth:`Learning.expired` says whether
the learned value set the deadline, and from how many samples, for the
:class:`~aiotimer.events.TimerExpired` event.

The value each live learned timer got is kept by key, bounded
(:data:`MAX_TRACKED`): a worker that exits leaves its entries to age out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from aiotimer.core import LearnedSummary, LearnedTimeouts, Timer, TimerKey
from aiotimer.events import LearnedWouldReap
from aiotimer.wire import Request

__all__ = ["LEARNED_LISTED", "MAX_TRACKED", "Learning"]

#: The most live learned timers whose value is remembered for their expiry event.
MAX_TRACKED: Final[int] = 100_000
#: The most learned scopes a snapshot lists (status, metrics): those with most samples.
LEARNED_LISTED: Final[int] = 100


@dataclass(frozen=True, slots=True)
class _Applied:
    """A live learned timer: when its block began (server's clock), its deadline, and
    the value and samples that set it."""

    began: float
    deadline: float
    value: float
    samples: int


class Learning:
    """One engine's learned timeouts (see the module docs)."""

    __slots__ = ("_applied", "live", "timeouts")

    def __init__(self, timeouts: LearnedTimeouts | None = None) -> None:
        self.timeouts = LearnedTimeouts() if timeouts is None else timeouts
        #: Whether a learned block was seen: until then the engine skips every call
        #: about durations (a plain attribute: read on every release).
        self.live = False
        # key -> what each live learned timer was given, until its release
        self._applied: OrderedDict[TimerKey, _Applied] = OrderedDict()

    def deadline(self, req: Request, deadline: float) -> float:
        """The deadline of acquire ``req``, which asks for ``deadline`` (``initial``
        seconds after its block began, plus its ``kill_after``): ``initial - value``
        earlier when the request is learned, so the block is timed from its own start
        at the value in force, however late its line was read."""
        spec = req.learned
        if spec is None:
            return deadline
        self.live = True
        value, samples = self.timeouts.in_force(req.scope_id, spec)
        began = deadline - spec.initial - (req.kill_after or 0.0)
        learned = deadline - (spec.initial - value)
        applied = self._applied
        key = (req.pid, req.scope_id)
        applied[key] = _Applied(began, learned, value, samples)
        applied.move_to_end(key)
        if len(applied) > MAX_TRACKED:
            applied.popitem(last=False)
        return learned

    def released(
        self, pid: int, scope_id: str, duration: float, mono: float, wall: float
    ) -> LearnedWouldReap | None:
        """Block ``(pid, scope_id)`` ended, ``duration`` seconds after its acquire was
        applied, its release applied at ``mono``: record how long it ran (from its own
        start, for a learned block); the event to emit when the learned value would
        have reaped it."""
        if self._applied:
            applied = self._applied.pop((pid, scope_id), None)
            if applied is not None:
                duration = max(0.0, mono - applied.began)
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

    def wants(self, paired: Mapping[str, int]) -> bool:
        """Whether any scope of a batch's paired blocks (scope id -> count) is learned."""
        return self.live and any(self.timeouts.scope(s) for s in paired)

    def folded(self, pairs: Sequence[tuple[Request, Request]], mono: float, wall: float) -> None:
        """Blocks begun and ended within one batch (acquire, release), read at ``mono``:
        record each learned one's duration from its own start to its release's ``at``
        stamp (or to ``mono``, without one)."""
        timeouts = self.timeouts
        for acquire, release in pairs:
            spec = acquire.learned
            if spec is None:
                continue
            timeouts.in_force(acquire.scope_id, spec)
            began = acquire.deadline(mono, wall) - spec.initial - (acquire.kill_after or 0.0)
            ended = mono if release.at is None else min(mono, release.at)
            timeouts.observe(release.scope_id, max(0.0, ended - began))

    def expired(self, timer: Timer) -> tuple[float, int] | None:
        """``timer`` expired: the learned value that set its deadline and the samples
        it rested on, or ``None`` when it was not timed at a learned value. (A block
        that expired unreaped is still known at its late release.)"""
        if not self._applied:
            return None
        applied = self._applied.get(timer.key)
        if applied is None or applied.deadline != timer.deadline:
            return None
        return applied.value, applied.samples

    def summaries(self, limit: int | None = None) -> list[LearnedSummary]:
        """The learned scopes, most samples first, at most ``limit`` (see
        :class:`~aiotimer.core._learned.LearnedSummary`)."""
        return self.timeouts.summaries(limit)

    def __repr__(self) -> str:
        return f"<Learning {self.timeouts!r}, {len(self._applied):,} live timers>"
