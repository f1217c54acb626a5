"""Which journal entries a new server restores: checked, one per worker, of live workers.

A journal (:mod:`aiotimer.server._journal`) is a file of this user beside the FIFO, but
whoever could write it (a bug, another program of the same user, a half-restored
backup) must not make the next server slow to start or reap a process the entry does
not name. So each entry is:

* decoded as the wire's own record (:class:`~aiotimer.wire.Request`: an entry is the
  request that set the timer, its deadline and start time brought up to date), checked
  with the wire's validator (:func:`~aiotimer.wire.validate`) and as an acquire with a
  ``mono`` deadline that would signal (what the journal holds): anything else is
  *invalid*;
* of a process that is still the journaled one (same start time, read once per pid from
  ``/proc``): else *gone*;
* the only one of its worker: the journal names each worker once (its earliest timer),
  so of several entries of one worker only the earliest is kept, the others are
  *duplicates*;

then turned into the acquire that restores it, its deadline moved ``grace`` seconds
ahead if it has passed. The work is one ``/proc`` read per distinct pid plus a pass
over the entries, whatever the file holds; :class:`Restored` says what became of each.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Final

import msgspec

from aiotimer._edges.procfs import read_start_time
from aiotimer.errors import ProcessGoneError
from aiotimer.wire import Request, validate

__all__ = ["Restored", "restore_entries"]

_decode_entry: Final = msgspec.json.Decoder(Request).decode


@dataclass(frozen=True, slots=True)
class Restored:
    """What a journal gave: the ``requests`` to apply, and how many entries were left
    out as ``invalid``, ``duplicates`` of a pid already restored, or of processes
    ``gone`` (exited, or the pid names another process now)."""

    requests: list[Request] = field(default_factory=list)
    invalid: int = 0
    duplicates: int = 0
    gone: int = 0

    @property
    def entries(self) -> int:
        """How many entries the journal held."""
        return len(self.requests) + self.invalid + self.duplicates + self.gone

    def describe_dropped(self) -> str:
        """The entries left out, in words (``""`` when none was)."""
        parts = [
            f"{n:,} {what}"
            for n, what in (
                (self.invalid, "invalid"),
                (self.duplicates, "duplicate"),
                (self.gone, "of processes gone or replaced"),
            )
            if n
        ]
        return f"; left out: {', '.join(parts)}" if parts else ""


def _request(entry: msgspec.Raw, mono_now: float, grace: float) -> Request | None:
    """The acquire restoring ``entry`` (its deadline at least ``grace`` ahead), or
    ``None`` if it is not a valid acquire with a monotonic deadline that would signal."""
    try:
        req = _decode_entry(entry)
    except msgspec.DecodeError:
        return None
    if validate(req) is not None or req.signal <= 0 or req.is_release or req.mono is None:
        return None
    mono = max(req.mono, mono_now + grace)
    return msgspec.structs.replace(
        req, expiration_time=req.expiration_time + (mono - req.mono), mono=mono
    )


def _start_time(pid: int) -> int | None:
    """Process ``pid``'s start time; ``-1`` if there is no such process (``None``: the
    platform cannot tell)."""
    try:
        return read_start_time(pid)
    except ProcessGoneError:
        return -1


def restore_entries(entries: list[msgspec.Raw], mono_now: float, grace: float) -> Restored:
    """What to restore of ``entries`` at ``mono_now`` (see the module docs)."""
    best: dict[int, Request] = {}
    started: dict[int, int | None] = {}  # pid -> its start time now: one read per pid
    invalid = duplicates = gone = 0
    own = os.getpid()
    for entry in entries:
        req = _request(entry, mono_now, grace)
        if req is None or req.pid == own:
            invalid += 1
            continue
        pid = req.pid
        if pid not in started:
            started[pid] = _start_time(pid)
        now = started[pid]
        if now == -1 or (now is not None and now != req.start_time):
            gone += 1
            continue
        held = best.get(pid)
        if held is not None:
            duplicates += 1
            if held.mono is not None and req.mono is not None and req.mono >= held.mono:
                continue
        best[pid] = req
    return Restored(list(best.values()), invalid, duplicates, gone)
