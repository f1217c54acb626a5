"""Run files: what a supervisor leaves behind so that its workers never outlive it.

A supervisor killed with SIGKILL cannot stop its workers. Three things make up for it:

- each worker is started with a parent-death signal (SIGKILL, see
  :func:`~aiotimer.supervisor._proctree.with_parent_death_signal`), so the kernel ends
  it with its supervisor; but not what it started (the signal is not inherited);
- the supervisor keeps a **run file** in a private per-user directory
  (:func:`runs_dir`: ``aiotimer-runs-<uid>`` beside its runtime directory): its own
  identity, the boot it runs in, the FIFO path every worker finds in ``AIOTIMER_FIFO``
  (unique to the run), the PID namespace its pids belong to, and each running worker's
  pid and start time. Worker ``w`` leads
  session and process group ``w.pid``; its children stay there unless they leave;
- a **guard** (:func:`start_guard`), a small process forked before the supervisor starts
  anything, waits for the supervisor's end; if the run file is still there (the
  supervisor did not stop cleanly), it stops what the file's workers left and removes
  the run's private runtime directory (its FIFO's). The next
  supervisor using the same directory does the same for every run file whose
  supervisor is dead (:func:`sweep`), in case the guard was killed too.

A process is stopped only when it is **proven** to be a run's leftover: it is in a
recorded worker's session or process group ``S`` and either the worker itself is alive
(pid and start time match, so ``S`` is its session), or the process started after the
worker and its environment names the run's FIFO. A session id is never reused while
any process is in the session, so a live member of a session whose leader was proven
stays proven. Everything else is left alone: a process that scrubbed its environment
after its leader died is not stopped, and neither is anything of a run recorded in
another PID namespace (another container sharing the directory): its pids mean other
processes here, so its supervisor cannot be proven dead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import msgspec

from aiotimer._edges.files import (
    check_private_dir,
    make_private_dir,
    read_owned,
    remove_owned,
    write_atomic,
)
from aiotimer._edges.procfs import EXITED_STATES, boot_id, own_start_time, read_stat
from aiotimer.errors import ProcessGoneError, ReapError, RefusedTargetError
from aiotimer.reapers._identity import PinnedProcess
from aiotimer.supervisor._proctree import processes

__all__ = [
    "ProcessId",
    "RunFile",
    "RunRecord",
    "leftovers",
    "runs_dir",
    "runtime_parent",
    "start_guard",
    "stop_leftovers",
    "sweep",
]

logger = logging.getLogger("aiotimer")

#: The most a run file may hold (a worker is ~40 bytes of it).
MAX_RUN_FILE: Final[int] = 1 << 20
#: How often :func:`stop_leftovers` looks again for processes forked meanwhile.
_ROUNDS: Final[int] = 20
#: What the guard may spend telling stderr what it did (it may be a full pipe).
_REPORT_TIMEOUT: Final[int] = 2
_FIFO_VAR: Final[bytes] = b"AIOTIMER_FIFO="


class ProcessId(msgspec.Struct, frozen=True, array_like=True):
    """A process, as a run file names it: its pid and start time (clock ticks)."""

    pid: int
    start_time: int


class RunRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What a run file holds (JSON)."""

    boot_id: str
    supervisor: ProcessId
    fifo: str
    workers: tuple[ProcessId, ...] = ()
    #: The PID namespace of the pids (``/proc/self/ns/pid``'s link); empty if unknown.
    pid_ns: str = ""


def runtime_parent(chosen: str | os.PathLike[str] | None = None) -> str | None:
    """Where a supervisor makes its private runtime directory: ``chosen``, else
    ``$XDG_RUNTIME_DIR``; ``None`` (the temp dir) when that is not a directory."""
    parent = chosen or os.environ.get("XDG_RUNTIME_DIR") or None
    return None if parent is None or not os.path.isdir(parent) else os.fspath(parent)


def runs_dir(parent: str | os.PathLike[str] | None) -> Path:
    """The private directory of this user's run files in ``parent`` (a
    :func:`runtime_parent`; the temp dir when ``None``), made now if missing.

    Raises:
        UnsafePathError: it exists but is not a private directory of this user.
        OSError: it cannot be made.
    """
    parent = Path(parent if parent is not None else tempfile.gettempdir())
    path = parent / f"aiotimer-runs-{os.geteuid()}"
    make_private_dir(path, what="run-file directory")
    return path


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def this_process() -> ProcessId:
    """This process's :class:`ProcessId` (start time 0 without ``/proc``)."""
    return ProcessId(os.getpid(), own_start_time() or 0)


def _file_name(supervisor: ProcessId) -> str:
    return f"run-{supervisor.pid}-{supervisor.start_time}.json"


def _alive(proc: ProcessId) -> bool:
    try:
        stat = read_stat(proc.pid)
    except FileNotFoundError:
        return True  # no /proc: cannot tell, so never treat it as dead
    return stat is not None and stat[0] not in EXITED_STATES and stat[1] == proc.start_time


class RunFile:
    """The run file of the supervisor in this process (see the module docs).

    Args:
        directory: the run-file directory (:func:`runs_dir`).
        fifo: the FIFO path the run's workers get in ``AIOTIMER_FIFO``.
    """

    def __init__(self, directory: Path, fifo: str) -> None:
        self.me = this_process()
        self.path = directory / _file_name(self.me)
        self._record = RunRecord(
            boot_id=(boot_id() or ""), supervisor=self.me, fifo=fifo, pid_ns=_pid_namespace()
        )
        self._failed = False

    def record(self, workers: Iterable[int]) -> None:
        """Write the run file listing ``workers`` (the running workers' pids); a failure
        is logged once, never raised (the workers run on)."""
        ids = []
        for pid in workers:
            with contextlib.suppress(ProcessGoneError, FileNotFoundError):
                stat = read_stat(pid)
                if stat is not None:
                    ids.append(ProcessId(pid, stat[1]))
        record = msgspec.structs.replace(self._record, workers=tuple(ids))
        try:
            write_atomic(self.path, msgspec.json.encode(record), durable=False, what="run file")
        except OSError as exc:
            if not self._failed:
                self._failed = True
                logger.warning(
                    "cannot write the run file %s (%s): if this run is killed, the next "
                    "one will not know its workers' leftovers",
                    self.path,
                    exc,
                )

    def remove(self) -> None:
        """Remove the run file (a clean stop: nothing is left to stop)."""
        try:
            remove_owned(self.path, what="run file")
        except OSError as exc:
            logger.warning("cannot remove the run file %s: %s", self.path, exc)


def _environ_names(pid: int, fifo: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return False
    return _FIFO_VAR + fifo in data.split(b"\0")


def leftovers(record: RunRecord, proven: set[int]) -> list[ProcessId]:
    """The live processes proven to be left by ``record``'s workers (see the module
    docs). ``proven`` holds the sessions proven by a live leader; it grows."""
    fifo = os.fsencode(record.fifo)
    starts = {w.pid: w.start_time for w in record.workers}
    proven.update(w.pid for w in record.workers if _alive(w))
    me = os.getpid()
    found = []
    for p in processes():
        if p.exited or p.pid == me:
            continue
        group = p.sid if p.sid in starts else p.pgid if p.pgid in starts else None
        if group is None:
            continue
        if group in proven or (p.start_time >= starts[group] and _environ_names(p.pid, fifo)):
            found.append(ProcessId(p.pid, p.start_time))
    return found


def stop_leftovers(record: RunRecord) -> list[int]:
    """SIGKILL every process proven to be left by ``record``'s workers, looking again
    until none is left (they may fork meanwhile). Returns the pids signalled."""
    proven: set[int] = set()
    killed: set[int] = set()
    for _ in range(_ROUNDS):
        found = leftovers(record, proven)
        if not found:
            break
        for proc in found:
            try:
                with PinnedProcess.pin(proc.pid, start_time=proc.start_time) as pinned:
                    pinned.send_signal(signal.SIGKILL)
            except (ProcessGoneError, RefusedTargetError):
                continue
            except ReapError as exc:
                logger.error("could not stop process %d left by a run: %s", proc.pid, exc)
                continue
            killed.add(proc.pid)
        time.sleep(0.01)  # let the kills land before looking again
    return sorted(killed)


def _read(path: Path) -> RunRecord | str:
    try:
        return msgspec.json.decode(read_owned(path, MAX_RUN_FILE, what="run file"), type=RunRecord)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        return f"{exc}"


def _remove_runtime_dir(record: RunRecord) -> None:
    """Remove the dead run's private runtime directory (its FIFO's), if it is still a
    private directory of this user, named as a supervisor names it."""
    runtime = Path(record.fifo).parent
    if not runtime.name.startswith("aiotimer-"):
        return
    try:
        check_private_dir(runtime, what="runtime directory")
    except OSError:
        return  # gone already, or not ours to remove
    shutil.rmtree(runtime, ignore_errors=True)


def sweep(directory: Path) -> list[str]:
    """Stop the leftovers of every run recorded in ``directory`` whose supervisor is
    dead, and remove its run file. Returns one line per run that left something."""
    report = []
    boot, namespace = (boot_id() or ""), _pid_namespace()
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith("run-"))
    except OSError as exc:
        return [f"cannot list {directory}: {exc}"]
    for name in names:
        path = directory / name
        record = _read(path)
        if isinstance(record, str):
            if not name.endswith(".tmp"):  # a live run's write in progress: not ours
                report.append(f"run file {path} removed unread: {record}")
                with contextlib.suppress(OSError):
                    remove_owned(path, what="run file")
            continue
        if record.pid_ns != namespace:
            continue  # another PID namespace's run: its pids name other processes here
        if record.boot_id == boot and _alive(record.supervisor):
            continue  # a live run
        killed = stop_leftovers(record) if record.boot_id == boot else []
        _remove_runtime_dir(record)
        with contextlib.suppress(OSError):
            remove_owned(path, what="run file")
        if killed:
            report.append(
                f"stopped {len(killed)} process(es) left by the run of supervisor "
                f"{record.supervisor.pid}, which died without stopping its workers: "
                f"pids {', '.join(map(str, sorted(killed)))}"
            )
    return report


# -- the guard --------------------------------------------------------------------------


def start_guard(directory: Path) -> str | None:
    """Fork the guard of this process's run (see the module docs). Returns why no guard
    was started (``None``: started): this process has other threads (forking it would
    be unsafe), or the system has no pidfds; the run then relies on the next run's
    :func:`sweep`.

    Call it before starting any thread or event loop. The guard is its own session,
    re-parented away from this process (so stopping this process's children never
    finds it), and ends with this process: at once after a clean stop (no run file
    left), after stopping the leftovers otherwise.

    Raises:
        OSError: the guard cannot be forked.
    """
    if threading.active_count() > 1:
        return "this process has other threads"
    me = this_process()
    try:
        watch = os.pidfd_open(me.pid)
    except (AttributeError, OSError) as exc:
        return f"no pidfd to watch this process with ({exc})"
    try:
        child = os.fork()
        if child == 0:  # pragma: no cover  (runs in the forked guard)
            code = 1
            try:
                os.setsid()
                if os.fork() == 0:
                    _guard(watch, directory / _file_name(me))
                code = 0
            finally:
                os._exit(code)
        os.waitpid(child, 0)
    finally:
        os.close(watch)
    return None


def _guard(watch: int, path: Path) -> None:  # pragma: no cover  (runs in the forked guard)
    """The guard's body: wait for the supervisor's end, stop what its run left."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    select.select([watch], [], [], None)
    try:
        record = _read(path)
        if isinstance(record, str):
            return  # a clean stop removed it (or it was never written)
        killed = stop_leftovers(record)
        _remove_runtime_dir(record)
        with contextlib.suppress(OSError):
            remove_owned(path, what="run file")
        if killed:
            _report(
                f"aiotimer run guard: supervisor {record.supervisor.pid} died without "
                f"stopping its workers; stopped {len(killed)} process(es) they left: pids "
                f"{', '.join(map(str, killed))}\n"
            )
    except Exception as exc:  # say it, then end: nothing else can
        _report(f"aiotimer run guard: could not stop the leftovers of {path}: {exc}\n")


class _TimedOut(Exception):
    pass


def _time_out(signum: int, frame: object) -> None:  # pragma: no cover  (in the guard)
    raise _TimedOut


def _report(line: str) -> None:  # pragma: no cover  (runs in the forked guard)
    """Write ``line`` to stderr, giving up after a while (nobody may read it)."""
    signal.signal(signal.SIGALRM, _time_out)
    signal.alarm(_REPORT_TIMEOUT)
    with contextlib.suppress(OSError, _TimedOut):
        os.write(2, line.encode())
    signal.alarm(0)
