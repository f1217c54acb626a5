"""Duration statistics that survive a crash: periodic snapshots to a file, merged back.

A server with an event log keeps its statistics in ``<event log>.stats.json`` too.
:meth:`StatsFile.load_into` merges what a previous run left there into a fresh run's
statistics; :meth:`StatsFile.run` rewrites the file every ``interval`` seconds while
the statistics change, and :meth:`StatsFile.save` once more on a clean stop. A write is
atomic (a temporary file renamed over the old one, after ``fsync``), so a crash leaves
the previous snapshot or the new one, never a torn file. The state is copied in the
loop; the disk work runs in a worker thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import anyio
import anyio.abc
import msgspec

from aiotimer.core._stats import DurationStats, StatsState

__all__ = ["StatsFile", "stats_path_for"]

logger = logging.getLogger("aiotimer")

_encode = msgspec.json.Encoder().encode


def stats_path_for(event_log: str | os.PathLike[str]) -> Path:
    """Where the statistics of a server with this event log are kept."""
    log = Path(event_log)
    return log.with_name(log.name + ".stats.json")


class StatsFile:
    """Snapshots of one server's :class:`~aiotimer.core._stats.DurationStats` at ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._saved_samples = -1

    def load_into(self, stats: DurationStats) -> bool:
        """Merge the saved statistics into ``stats``; ``False`` (and a logged warning) if
        the file is missing, unreadable or of another precision."""
        try:
            state = msgspec.json.decode(self.path.read_bytes(), type=StatsState)
            stats.merge_state(state)
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
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Save ``stats`` every ``interval`` seconds when it changed; until cancelled."""
        task_status.started()
        while True:
            await anyio.sleep(interval)
            state = self._changed(stats)
            if state is not None:
                await anyio.to_thread.run_sync(self._write, _encode(state))

    def save(self, stats: DurationStats) -> None:
        """Save ``stats`` now (blocking: for the end of a run)."""
        state = self._changed(stats)
        if state is not None:
            self._write(_encode(state))

    def _changed(self, stats: DurationStats) -> StatsState | None:
        samples = stats.samples
        if samples == self._saved_samples:
            return None
        self._saved_samples = samples
        return stats.to_state()

    def _write(self, data: bytes) -> None:
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            logger.error("could not save statistics to %s: %s", self.path, exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
