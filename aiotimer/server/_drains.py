"""The sources' drains, as the engine's shell steps them (the protocol is in
:mod:`aiotimer.sources._base`).

The machine asks for input (:class:`~aiotimer.server._effects.NeedInput`); the engine
answers once :class:`Drains` has stepped every drain through what it holds for the
workers named, handing each batch a drain returns to the machine. The work is spread
over turns of the loop, :data:`DRAIN_SLICE` of CPU time at most per turn (and
:data:`MAX_DRAIN_STEPS` steps): when a turn's share is spent, :meth:`Drains.step`
returns ``False`` and the next turn goes on with the same pass. So a reap is late,
never wrong, and late by at most what the drains had to do with the input bounded at
the decision, whatever arrives meanwhile: at most one pipe-full's scan plus the
decoding of the lines in it that name a due worker, for a FIFO; the messages queued on
a due worker's own connection, for a socket. A drain that raises is logged and skips
its turn (its looks then go by its last bound).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet

from aiotimer.sources import Drain
from aiotimer.wire import Decoded

__all__ = ["DRAIN_SLICE", "MAX_DRAIN_STEPS", "Drains", "stop_at"]

logger = logging.getLogger("aiotimer")

#: The most work the sources' drains do in one turn of the loop before an expiry:
#: seconds of the loop thread's CPU time (``time.thread_time``). Once it is spent, the
#: decision is carried on in the next turn, after the loop ran other work (the reap is
#: late, never wrong: nothing is acted on before its input is applied).
DRAIN_SLICE = 0.005
#: The most drain steps in one turn (a bound also where the clock stands still).
MAX_DRAIN_STEPS = 256

#: Where a drain's batch goes: ``apply(batch, source_name)``.
Apply = Callable[[Decoded, str], None]


def stop_at(slice_: float | None = None) -> float:
    """When a turn's share of drain work ends: this thread's CPU clock plus ``slice_``
    seconds (:data:`DRAIN_SLICE` by default)."""
    return time.thread_time() + (DRAIN_SLICE if slice_ is None else slice_)


def _hold(drain: Drain) -> None:
    """``drain.hold()``; logged if it raised (its looks then go by its last bound)."""
    try:
        drain.hold()
    except Exception:
        logger.exception("draining %s before an expiry failed", drain.name)


def _look(drain: Drain, pids: AbstractSet[int] | None) -> bool:
    """``drain.look(pids)``; ``False`` (logged) if it raised: a broken drain skips its turn."""
    try:
        return drain.look(pids)
    except Exception:
        logger.exception("draining %s before an expiry failed", drain.name)
        return False


def _step(drain: Drain) -> Decoded | None:
    """``drain.step()``; ``None`` (logged) if it raised: a broken drain skips its turn."""
    try:
        return drain.step()
    except Exception:
        logger.exception("draining %s before an expiry failed", drain.name)
        return None


class Drains:
    """The drains of one run, and the pass in progress over them, if any."""

    def __init__(self) -> None:
        self._drains: list[Drain] = []
        self._pending: list[Drain] | None = None  # the drains not done with the pass
        #: Whether a pass is in progress (begun by :meth:`look`, not yet done).
        self.passing = False

    def __len__(self) -> int:
        return len(self._drains)

    def add(self, drain: Drain, *, hold: bool) -> Callable[[], None]:
        """Add ``drain`` (held at once with ``hold``: a decision is in progress);
        returns the function that removes it."""
        self._drains.append(drain)
        if hold:
            _hold(drain)

        def remove() -> None:
            self._drains.remove(drain)
            if self._pending is not None and drain in self._pending:
                self._pending.remove(drain)

        return remove

    def hold(self) -> None:
        """A decision is made now: every drain bounds what it holds."""
        for drain in tuple(self._drains):
            _hold(drain)

    def look(self, pids: AbstractSet[int] | None) -> None:
        """Begin a pass for ``pids`` (``None``: anyone) over every drain."""
        self._pending = [drain for drain in self._drains if _look(drain, pids)]
        self.passing = True

    def step(self, stop_at: float, apply: Apply) -> bool:
        """Step the pass's drains in turn, handing ``apply`` what they return, until
        they are done (``True``: the pass is over), or this turn's work is spent
        (``False``): this thread's CPU clock reached ``stop_at`` or
        :data:`MAX_DRAIN_STEPS` steps were taken."""
        pending = self._pending
        steps = 0
        while pending:
            for drain in tuple(pending):
                steps += 1
                batch = _step(drain)
                if batch is None:
                    if drain in pending:
                        pending.remove(drain)
                elif batch.requests or batch.rejections:
                    apply(batch, drain.name)
            if pending and (steps >= MAX_DRAIN_STEPS or time.thread_time() >= stop_at):
                return False
        self._pending = None
        self.passing = False
        return True

    def end(self) -> None:
        """Drop the pass in progress, done or not (a best-effort pass)."""
        self._pending = None
        self.passing = False

    def drain_all(self, apply: Apply) -> None:
        """Hand ``apply`` everything every drain holds now, for anyone, to the end (a
        synchronous round; a pass in progress then finds its drains done)."""
        drains = tuple(self._drains)
        for drain in drains:
            _hold(drain)
        for drain in drains:
            if _look(drain, None):
                while (batch := _step(drain)) is not None:
                    if batch.requests or batch.rejections:
                        apply(batch, drain.name)
