"""Reapers: how the server acts on a worker whose timer expired.

The server talks to workers only through a :class:`Reaper`, injected at construction, so
tests (and unusual deployments: containers, remote hosts) can replace the default
:class:`SignalReaper`. :class:`aiotimer.testing.RecordingReaper` records every call.

Call order, per worker pid: ``attach`` once when the pid first registers a timer; then
one ``wait_exit`` watcher; any number of ``signal``/``dump_stacks`` calls; ``detach`` once
the worker has exited (or the server stops).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import anyio

from aiotimer._process import WorkerProcess
from aiotimer.errors import ProcessGoneError, RefusedTargetError

__all__ = ["Reaper", "SignalReaper"]


@runtime_checkable
class Reaper(Protocol):
    """What the server needs to act on workers. Every method is called in the loop thread."""

    def attach(self, pid: int) -> bool:
        """Pin the identity of worker ``pid`` when it first registers a timer.

        Returns ``False`` if there is no such process (the server then drops the worker's
        timers and emits :class:`~aiotimer.events.WorkerUnknown`). Called once per worker.
        """
        ...

    async def wait_exit(self, pid: int) -> None:
        """Return when the attached worker ``pid`` has exited."""
        ...

    async def signal(self, pid: int, signum: int, *, group: bool = False) -> None:
        """Send ``signum`` to the attached worker (its process group when ``group``).

        Raises:
            ProcessGoneError: the worker had already exited (not a failure).
            RefusedTargetError: the target must never be signalled (pid <= 1, the
                server itself, the server's own process group).
            ReapError: the signal could not be sent (e.g. permission denied).
        """
        ...

    async def dump_stacks(self, pid: int, timeout: float) -> str | None:
        """Ask the worker for a dump of its stacks; ``None`` if none came within ``timeout``."""
        ...

    def detach(self, pid: int) -> None:
        """Forget worker ``pid`` and release what :meth:`attach` holds.

        May be called while ``wait_exit(pid)`` is pending (the server cancels that wait
        right after); a later ``attach(pid)`` must pin afresh (the pid may be reused).
        """
        ...


class SignalReaper:
    """The default reaper: signals through a pidfd-pinned process handle.

    :meth:`attach` pins the worker (a pidfd on Linux), so a recycled pid is never
    signalled; "no such process" means already gone. It refuses pid <= 1, the server's
    own process and (for group signals) the server's own process group.

    :meth:`dump_stacks` is not implemented yet by this reaper: it returns ``None`` at once
    (the escalation then proceeds to its next step).
    """

    __slots__ = ("_procs", "_waiting")

    def __init__(self) -> None:
        self._procs: dict[int, WorkerProcess] = {}
        # Handles a wait_exit is waiting on: detach() leaves closing them to that wait.
        self._waiting: set[WorkerProcess] = set()

    def attach(self, pid: int) -> bool:
        """Pin worker ``pid``; ``False`` if no such process exists."""
        if pid in self._procs:
            return True
        try:
            self._procs[pid] = WorkerProcess.pin(pid)
        except ProcessGoneError:
            return False
        except RefusedTargetError:
            # Never signalled (signal() refuses it again), but it exists: keep its timers.
            return True
        return True

    async def wait_exit(self, pid: int) -> None:
        """Return when the worker exits (sleeps forever for a refused, unpinned target)."""
        proc = self._procs.get(pid)
        if proc is None:
            await anyio.sleep_forever()
            return
        self._waiting.add(proc)
        try:
            await proc.wait_exit()
        finally:
            self._waiting.discard(proc)
            if self._procs.get(pid) is not proc:
                proc.close()  # detached while we waited

    async def signal(self, pid: int, signum: int, *, group: bool = False) -> None:
        """Send ``signum`` to the pinned worker (see :meth:`Reaper.signal`)."""
        proc = self._procs.get(pid)
        if proc is None:
            raise RefusedTargetError(
                f"refusing to signal pid {pid}: it was never attached, so its identity "
                "cannot be proven"
            )
        proc.send_signal(signum, group=group)

    async def dump_stacks(self, pid: int, timeout: float) -> str | None:
        """Not implemented by this reaper yet: always ``None``."""
        return None

    def detach(self, pid: int) -> None:
        """Close the worker's pidfd."""
        proc = self._procs.pop(pid, None)
        if proc is not None and proc not in self._waiting:
            proc.close()

    def close(self) -> None:
        """Detach every worker."""
        for pid in list(self._procs):
            self.detach(pid)

    def __repr__(self) -> str:
        return f"<SignalReaper {len(self._procs)} workers attached>"
