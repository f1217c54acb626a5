"""Which requests of one batch need the timer table: pure, no I/O, no clock.

How this works
--------------
A source hands the engine its input a batch at a time (one read of the pipe), and
nothing expires in the middle of a batch. So when a block's acquire *and* its release
arrive in the same batch, the timer they describe is set and gone before anyone could
look: applying both to the table (a heap push, a tombstone, an index entry, a journal
record) changes nothing but the counters and the block's duration. :func:`fold` finds
those requests in one pass, keyed by ``(pid, scope_id)``, and counts the folded blocks
of each scope:

* an acquire followed, with no other acquire of its key in between, by a release of
  its key is a *paired acquire*, and that release a *paired release*;
* an acquire followed by another acquire of its key before any release is
  *superseded*: the later acquire replaces its timer anyway;
* everything else is *applied* as usual, in order.

The engine then applies the batch in order, doing only the bookkeeping for the folded
requests (counts, the block's duration, and ending a timer of the key that was live
before the batch: the paired acquire would have replaced it, its release ended it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

from aiotimer._protocol import Request

__all__ = ["APPLY", "PAIRED_ACQUIRE", "PAIRED_RELEASE", "SUPERSEDED", "Fold", "fold"]

#: What to do with each request of a batch (the values in :attr:`Fold.fates`).
APPLY: Final = 0
PAIRED_ACQUIRE: Final = 1
PAIRED_RELEASE: Final = 2
SUPERSEDED: Final = 3


class Fold(NamedTuple):
    """What :func:`fold` found in a batch."""

    #: One fate per request: :data:`APPLY`, :data:`PAIRED_ACQUIRE`, :data:`PAIRED_RELEASE`
    #: or :data:`SUPERSEDED`.
    fates: bytearray
    #: Scope id -> how many of its paired releases (blocks begun and ended) the batch holds.
    paired: dict[str, int]


def fold(requests: Sequence[Request]) -> Fold:
    """The fate of each request of ``requests`` (see the module docs)."""
    fates = bytearray(len(requests))
    paired: dict[str, int] = {}
    # pid -> scope_id -> index of its latest acquire: no key tuple per request.
    open_acquires: dict[int, dict[str, int]] = {}
    for i, req in enumerate(requests):
        scopes = open_acquires.get(req.pid)
        if scopes is None:
            scopes = open_acquires[req.pid] = {}
        scope_id = req.scope_id
        if req.expiration_time < 0:  # a release (Request.is_release, without a call)
            j = scopes.pop(scope_id, -1)
            if j >= 0:
                fates[j] = PAIRED_ACQUIRE
                fates[i] = PAIRED_RELEASE
                paired[scope_id] = paired.get(scope_id, 0) + 1
        else:
            j = scopes.setdefault(scope_id, i)
            if j != i:
                fates[j] = SUPERSEDED
                scopes[scope_id] = i
    return Fold(fates, paired)
