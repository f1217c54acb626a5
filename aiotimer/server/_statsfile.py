"""Duration statistics that survive a crash: periodic snapshots to a file, merged back.

A server with an event log keeps its statistics in ``<event log>.stats.json`` too, and
with them its learned timeouts (:mod:`aiotimer.core._learned`: each learned scope's
durations and value), so a restarted server times a learned scope at the value it had
learned, not at ``initial``.
:meth:`StatsFile.load_into` merges what a previous run left there into a fresh run's
statistics; :meth:`StatsFile.run` rewrites the file every ``interval`` seconds while
the statistics change, and :meth:`StatsFile.save` once more on a clean stop. A write is
atomic (a temporary file renamed over the old one, after ``fsync``), so a crash leaves
the previous snapshot or the new one, never a torn file. The state is copied in the
loop; the periodic disk work runs in a worker thread.

The file sits beside the event log, maybe in a shared directory, so it is opened only
through :mod:`aiotimer._edges.files`: the load (in the loop, at start) reads a regular
file of this user of at most :data:`MAX_STATS_BYTES`, never blocking, and anything else
there is reported and ignored; a save never writes through a symlink and never replaces
anything but a regular file of this user.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import msgspec

from aiotimer._edges.files import read_owned, write_atomic
from aiotimer.core import DurationStats, LearnedScopeState, LearnedTimeouts, StatsState

__all__ = ["MAX_STATS_BYTES", "SavedStats", "StatsFile", "stats_path_for"]

logger = logging.getLogger("aiotimer")

_encode = msgspec.json.Encoder().encode
_WHAT: Final[str] = "statistics file"

#: The largest statistics file loaded (at start, in the loop, before any source is
#: served). A site takes ~1.3 KB when its durations span a factor of 10,000, and a
#: server keeps at most 10,000 sites (``max_sites``): 13 MB, which loads in ~0.45 s
#: here (read 20 ms, decode 0.22 s, merge 0.2 s). Twice and a half that bounds the
#: start-up cost of any file that can be there.
MAX_STATS_BYTES: Final[int] = 32 * 1024 * 1024


class SavedStats(StatsState, frozen=True, kw_only=True):
    """What the file holds: the statistics, and the learned timeouts by site."""

    learned: dict[str, LearnedScopeState] = {}


def stats_path_for(event_log: str | os.PathLike[str]) -> Path:
    """Where the statistics of a server with this event log are kept."""
    log = Path(event_log)
    return log.with_name(log.name + ".stats.json")


class StatsFile:
    """Snapshots of one server's :class:`~aiotimer.core._stats.DurationStats` at ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._saved_samples = -1

    def load_into(self, stats: DurationStats, learned: LearnedTimeouts | None = None) -> bool:
        """Merge the saved statistics into ``stats`` (and the learned timeouts into
        ``learned``); ``False`` (and a logged warning) if the file is missing,
        unreadable, not a regular file of this user, larger than
        :data:`MAX_STATS_BYTES` or of another precision. Never blocks on the file."""
        try:
            data = read_owned(self.path, MAX_STATS_BYTES, what=_WHAT)
            saved = msgspec.json.decode(data, type=SavedStats)
            stats.merge_state(saved)
            if learned is not None:
                learned.merge_state(saved.learned)
        except FileNotFoundError:
            return False
        except (OSError, ValueError, msgspec.DecodeError) as exc:
            logger.warning("statistics in %s not reloaded: %s", self.path, exc)
            return False
        return True

    async def run(
        self,
        stats: DurationStats,
        interval: float,
        learned: LearnedTimeouts | None = None,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Save ``stats`` (and ``learned``) every ``interval`` seconds when they
        changed; until cancelled."""
        task_status.started()
        while True:
            await anyio.sleep(interval)
            state = self._changed(stats, learned)
            if state is not None:
                await anyio.to_thread.run_sync(self._write, _encode(state))

    def save(self, stats: DurationStats, learned: LearnedTimeouts | None = None) -> None:
        """Save ``stats`` (and ``learned``) now (blocking: for the end of a run)."""
        state = self._changed(stats, learned)
        if state is not None:
            self._write(_encode(state))

    def _changed(self, stats: DurationStats, learned: LearnedTimeouts | None) -> StatsState | None:
        samples = stats.samples + (0 if learned is None else learned.samples)
        if samples == self._saved_samples:
            return None
        self._saved_samples = samples
        state = stats.to_state()
        if not learned:
            return state
        return SavedStats(
            relative_error=state.relative_error, sites=state.sites, learned=learned.to_state()
        )

    def _write(self, data: bytes) -> None:
        try:
            write_atomic(self.path, data, 0o600, what=_WHAT)
        except OSError as exc:
            logger.error("could not save statistics to %s: %s", self.path, exc)
