"""Reapers: how the server acts on a worker whose timer expired.

The server talks to workers only through a :class:`Reaper`, injected at construction, so
tests (and unusual deployments: containers, remote hosts) can replace the default
:class:`SignalReaper`. :class:`aiotimer.testing.RecordingReaper` records every call.

Call order, per worker pid: ``attach`` once when the pid first registers a timer; then
one ``wait_exit`` watcher; any number of ``signal``/``dump_stacks`` calls; ``detach`` once
the worker has exited (or the server stops).

``signal`` is synchronous and must never block: the server sends the first signal of a
reap right in its expiry handler, at the deadline (``kill(2)`` and
``pidfd_send_signal(2)`` never block). A reaper that must do slow work to signal (a
remote call, say) should start it and return.
"""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable

import anyio

from aiotimer.errors import ProcessGoneError, RefusedTargetError
from aiotimer.reapers._dumps import NoDump, collect_dump_or_why, py_spy_dump_or_why
from aiotimer.reapers._identity import PinnedProcess, server_identity
from aiotimer.reapers._kill_policy import KillPolicy, ServerIdentity
from aiotimer.reapers._left_dumps import LeftDumps

__all__ = ["NoDump", "Reaper", "SignalReaper"]


@runtime_checkable
class Reaper(Protocol):
    """What the server needs to act on workers. Every method is called in the loop thread."""

    def attach(self, pid: int, *, start_time: int | None = None) -> bool:
        """Pin the identity of worker ``pid`` when it first registers a timer.

        ``start_time``, when the request carried one (the worker's start time when it
        sent the request, ``/proc/<pid>/stat`` field 22), must match the pinned process;
        the server passes it only when the request has one.

        Returns ``False`` if there is no such process, or it is not the process that sent
        the request (the server then drops the worker's timers and emits
        :class:`~aiotimer.events.WorkerUnknown`). Called once per worker.
        """
        ...

    async def wait_exit(self, pid: int) -> None:
        """Return when the attached worker ``pid`` has exited."""
        ...

    def signal(self, pid: int, signum: int, *, group: bool = False) -> None:
        """Send ``signum`` to the attached worker (its process group when ``group``).

        Called in the loop's thread; must not block.

        Raises:
            ProcessGoneError: the worker had already exited (not a failure).
            RefusedTargetError: the target must never be signalled (pid <= 1, the
                server itself, the server's own process group, the kill policy), or
                the kernel refused for good (``EPERM``, ``EINVAL``): never retried.
            ReapError: the signal could not be sent this time; it is retried.
        """
        ...

    async def dump_stacks(self, pid: int, timeout: float) -> str | NoDump | None:
        """Ask the worker for a dump of its stacks, within about ``timeout`` seconds.

        Returns the dump's text, or a :class:`NoDump` saying why none came (reported on
        the ``stacks_dumped`` event); ``None`` means no dump, with no reason given.
        """
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
    own process, thread ids, and (for group signals) the server's own process group.
    Before every signal, stack-dump signals included, it asks the kill policy
    (:class:`~aiotimer.KillPolicy`) and raises
    :class:`~aiotimer.errors.RefusedTargetError` with its reason.

    Args:
        kill_policy: who may be signalled and with what (default: ``KillPolicy()``:
            the server's own uid, any uid for root; never its ancestors; no job-control
            signals).
        dump_dir: where the workers' dump hooks write (see
            :func:`aiotimer.diagnostics.dump_path_for`; default ``$AIOTIMER_DUMP_DIR`` or
            the system temp dir).
        py_spy: fall back to ``py-spy dump`` for a worker without the hook, when py-spy
            is installed.
        keep_dumps: keep the dump files that exited workers leave behind (a reaped
            worker cannot remove its own), at most
            :data:`~aiotimer.reapers._left_dumps.MAX_KEPT_DUMPS`, instead of removing each
            once its worker is gone (:class:`~aiotimer.reapers._left_dumps.LeftDumps`).
    """

    __slots__ = ("_kill_policy", "_left", "_procs", "_py_spy", "_server", "_waiting")

    def __init__(
        self,
        *,
        dump_dir: str | os.PathLike[str] | None = None,
        py_spy: bool = True,
        kill_policy: KillPolicy | None = None,
        keep_dumps: bool = False,
    ) -> None:
        self._kill_policy = kill_policy if kill_policy is not None else KillPolicy()
        self._server: tuple[tuple[int, int], ServerIdentity] | None = None
        self._left = LeftDumps(dump_dir, keep=keep_dumps)
        self._py_spy = py_spy
        self._procs: dict[int, PinnedProcess] = {}
        # Handles a wait_exit is waiting on: detach() leaves closing them to that wait.
        self._waiting: set[PinnedProcess] = set()

    def _server_identity(self) -> ServerIdentity:
        """The server as the kill policy sees it; read again only when this process's
        pid or parent changed (a fork, a reparenting), as walking ``/proc`` up to the
        root costs a read per ancestor."""
        key = (os.getpid(), os.getppid())
        if self._server is None or self._server[0] != key:
            self._server = (key, server_identity())
        return self._server[1]

    @property
    def dump_dir(self) -> str | os.PathLike[str] | None:
        """Where the workers' dump hooks write (``None``: the default directory). An
        owner that gives its workers a directory of their own sets it before they start."""
        return self._left.dump_dir

    @dump_dir.setter
    def dump_dir(self, value: str | os.PathLike[str] | None) -> None:
        self._left.dump_dir = value

    @property
    def kill_policy(self) -> KillPolicy:
        """The kill policy every signal is checked against."""
        return self._kill_policy

    def attach(self, pid: int, *, start_time: int | None = None) -> bool:
        """Pin worker ``pid``; ``False`` if no such process exists (or, with
        ``start_time``, if the process with that pid started at another time)."""
        if pid in self._procs:
            return True
        try:
            self._procs[pid] = PinnedProcess.pin(pid, start_time=start_time)
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

    def signal(self, pid: int, signum: int, *, group: bool = False) -> None:
        """Send ``signum`` to the pinned worker (see :meth:`Reaper.signal`); a pidfd (or
        ``kill``) signal never blocks."""
        proc = self._procs.get(pid)
        if proc is None:
            raise RefusedTargetError(
                f"refusing to signal pid {pid}: it was never attached, so its identity "
                "cannot be proven"
            )
        if not proc.is_alive():  # identity first: the facts below must be this process's
            raise ProcessGoneError(f"process {pid} has exited (or its pid was recycled)")
        server, policy = self._server_identity(), self._kill_policy
        target = proc.target(server.pid, ancestry=policy.descendants_only)
        refusal = policy.refusal(server, target, signum, group=group)
        if refusal is not None:
            raise RefusedTargetError(f"kill policy: {refusal}")
        proc.send_signal(signum, group=group)

    async def dump_stacks(self, pid: int, timeout: float) -> str | NoDump:
        """The worker's stack dump, or why none came; takes about ``timeout`` seconds at most.

        A worker with the dump hook (:func:`aiotimer.diagnostics.install_dump_handler`)
        is signalled through its pinned handle and its dump file read
        (:func:`~aiotimer.diagnostics.collect_dump`); a worker without it is never
        signalled, and is read from outside with ``py-spy dump`` instead (if enabled and
        installed, in the time left). No dump for a worker that has exited, was never
        pinned, or gave nothing: the :class:`NoDump` names which.
        """
        proc = self._procs.get(pid)
        if proc is None:
            return NoDump("the worker was never pinned")
        if not proc.is_alive():
            return NoDump("the worker has exited")
        started = anyio.current_time()
        try:
            result = await collect_dump_or_why(
                pid,
                send_signal=lambda signum: self.signal(pid, signum),
                dump_dir=self._left.dump_dir,
                timeout=timeout,
            )
        except ProcessGoneError:
            return NoDump("the worker exited meanwhile")
        except RefusedTargetError as exc:
            return NoDump(f"the dump signal is refused: {exc}")
        if isinstance(result, str):
            return result
        if not self._py_spy:
            return NoDump(f"{result.reason}; the py-spy fallback is off")
        if not proc.is_alive():
            return NoDump(f"{result.reason}; the worker exited meanwhile")
        left = timeout - (anyio.current_time() - started)
        if left <= 0:
            return NoDump(f"{result.reason}; no time left for py-spy")
        spied = await py_spy_dump_or_why(pid, timeout=left)
        if isinstance(spied, str):
            return spied
        return NoDump(f"{result.reason}; {spied.reason}")

    def detach(self, pid: int) -> None:
        """Close the worker's pidfd; once it has exited, deal with the dump file it left."""
        proc = self._procs.pop(pid, None)
        if proc is None:
            return
        if not proc.is_alive():
            self._left.exited(pid, proc.start_time)
        if proc not in self._waiting:
            proc.close()

    def close(self) -> None:
        """Detach every worker."""
        for pid in list(self._procs):
            self.detach(pid)

    def __repr__(self) -> str:
        return f"<SignalReaper {len(self._procs)} workers attached>"
