"""Which requests of one batch need the timer table: pure, no I/O, no clock.

How this works
--------------
A source hands the engine its input a batch at a time (one read of the pipe), and
nothing expires in the middle of a batch. So when a block's acquire *and* its release
arrive in the same batch, the timer they describe is set and gone before anyone could
look: applying both to the table (a heap push, a tombstone, an index entry, a journal
record) changes nothing but the counters and the block's duration. :func:`fold` finds
those requests in one pass, keyed by ``(pid, scope_id)``:

* an acquire followed, with no other acquire of its key in between, by a release of
  its key is a *paired acquire*, and that release a *paired release*;
* an acquire followed by another acquire of its key before any release is
  *superseded*: the later acquire replaces its timer anyway;
* everything else is *applied* as usual, in order (:attr:`Fold.apply`).

What the folded requests still do to the state before the batch: only the *first*
request of a key can meet a timer of that key live before the batch (or the record of
one that expired unreaped). When that first request is a folded acquire whose chain of
acquires ends paired, the batch ends that timer without a release of it being applied
(:meth:`Fold.ends`): the paired acquire would have replaced it, its release ended it.
When the chain ends in an applied acquire, that acquire replaces the timer itself; when
the first request is applied, it meets the timer itself. No applied request of a key
comes before its first request, so a caller may end those timers first and then apply
the rest in order: only the caps could tell (a timer ended earlier frees room earlier).

The pass keeps one state per key, an int: the index ``i`` of the key's open acquire
offset by which chain it is in (``i`` in the first chain, begun by the key's first
request; ``i + n`` after that chain ended paired; ``i + 2n`` when the key's first
request was a release), or, with no open acquire, ``_ENDED`` (the first chain ended
paired) or ``_RELEASED_FIRST``.
"""

from __future__ import annotations

from collections.abc import KeysView, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from aiotimer.wire import Request

__all__ = ["Fold", "fold", "paired_blocks"]

# A key's state when it has no open acquire (see the module docs).
_ENDED: Final = -1
_RELEASED_FIRST: Final = -2
_ABSENT: Final = -3
_NO_SCOPES: KeysView[str] = {}.keys()


@dataclass(frozen=True, slots=True)
class Fold:
    """What :func:`fold` found in a batch of ``size`` requests."""

    size: int
    #: The indices of the requests to apply, ascending.
    apply: list[int]
    #: Scope id -> how many of its paired releases (blocks begun and ended) the batch holds.
    paired: Mapping[str, int]
    #: How many acquires are superseded.
    superseded: int
    #: pid -> scope id -> the state of that key at the end (see the module docs).
    states: Mapping[int, Mapping[str, int]]
    #: The indices of the paired releases that say their block was cancelled at its
    #: deadline (``Request.cancelled``): folded, but still to be reported.
    cancelled: list[int]

    @property
    def pairs(self) -> int:
        """How many blocks the batch begins and ends (paired releases)."""
        return (self.size - len(self.apply) - self.superseded) // 2

    def pids(self) -> KeysView[int]:
        """The pids the batch names."""
        return self.states.keys()

    def scopes(self, pid: int) -> KeysView[str]:
        """The scope ids the batch names for ``pid``."""
        scopes = self.states.get(pid)
        return _NO_SCOPES if scopes is None else scopes.keys()

    def ends(self, pid: int, scope_id: str) -> bool:
        """Whether the batch ends a timer of this key live before it without applying a
        release of it: its first request of the key is an acquire, folded, whose chain
        of acquires a release pairs with (see the module docs)."""
        scopes = self.states.get(pid)
        state = _ABSENT if scopes is None else scopes.get(scope_id, _ABSENT)
        return state == _ENDED or self.size <= state < 2 * self.size


def fold(requests: Sequence[Request]) -> Fold:
    """What to do with each request of ``requests`` (see the module docs)."""
    n = len(requests)
    n2 = 2 * n
    paired: dict[str, int] = {}
    apply: list[int] = []  # the applied releases, then the acquires left open
    cancelled: list[int] = []
    superseded = 0
    # pid -> scope_id -> state: no key tuple per request. (Plain dicts: CPython
    # specialises their subscripts, not a defaultdict's.)
    by_pid: dict[int, dict[str, int]] = {}
    for i, req in enumerate(requests):
        scopes = by_pid.get(req.pid)
        if scopes is None:
            scopes = by_pid[req.pid] = {}
        scope_id = req.scope_id
        if req.expiration_time < 0.0:  # a release (Request.is_release, without a call)
            j = scopes.get(scope_id, _ABSENT)
            if j >= 0:  # it pairs with the open acquire
                scopes[scope_id] = _RELEASED_FIRST if j >= n2 else _ENDED
                paired[scope_id] = paired.get(scope_id, 0) + 1
                if req.cancelled:
                    cancelled.append(i)
            else:
                apply.append(i)
                if j == _ABSENT:
                    scopes[scope_id] = _RELEASED_FIRST
        else:
            j = scopes.setdefault(scope_id, i)
            if j != i:  # the key was seen before: its chain goes on, or a new one begins
                if j >= 0:
                    superseded += 1
                    scopes[scope_id] = i + j - j % n
                else:
                    scopes[scope_id] = i + (n if j == _ENDED else n2)
    opened = [j for scopes in by_pid.values() for j in scopes.values() if j >= 0]
    if opened:
        apply += [j % n for j in opened]
        apply.sort()
    return Fold(n, apply, paired, superseded, by_pid, cancelled)


def paired_blocks(requests: Sequence[Request], folded: Fold) -> list[tuple[Request, Request]]:
    """The blocks ``folded`` paired in ``requests``: each paired release with the acquire
    it ends (the last acquire of its key before it that was not applied), in order."""
    applied = set(folded.apply)
    open_: dict[tuple[int, str], Request] = {}
    pairs = []
    for i, req in enumerate(requests):
        if i in applied:
            continue
        key = (req.pid, req.scope_id)
        if not req.is_release:
            open_[key] = req
        elif (acquire := open_.pop(key, None)) is not None:
            pairs.append((acquire, req))
    return pairs
