"""Run files: what a supervisor leaves behind so that its workers never outlive it.

A supervisor killed with SIGKILL cannot stop its workers. Four things make up for it:

- each worker is started with a parent-death signal (SIGKILL, see
  :func:`~aiotimer.supervisor._proctree.with_parent_death_signal`), so the kernel ends
  it with its supervisor; but not what it started (the signal is not inherited);
- where a cgroup v2 can be made, ``aiotimer run`` runs in a cgroup of its own
  (:mod:`aiotimer._edges.cgroups`): everything the run starts is born in it and stays
  in it, whatever its session or environment;
- the supervisor keeps a **run file** in a private per-user directory
  (:func:`runs_dir`: ``aiotimer-runs-<uid>`` beside its runtime directory): its own
  identity, the boot it runs in, the FIFO path every worker finds in ``AIOTIMER_FIFO``
  (unique to the run), the PID namespace its pids belong to, the run's cgroup, and each
  running worker's pid and start time. Worker ``w`` leads session and process group
  ``w.pid``; its children stay there unless they leave;
- a **guard** (:mod:`aiotimer.supervisor._guard`), a small process forked before the
  supervisor starts anything, holds a pidfd of every worker (handed over at launch)
  and waits for the supervisor's end; if the run file is still there (the supervisor
  did not stop cleanly), it kills the run's cgroup, or without one stops what it can
  prove the workers left (:func:`~aiotimer.supervisor._pins.stop_leftovers`), and
  removes the run's private runtime directory. The next supervisor using the same
  directory does the same for every run file whose supervisor is dead (:func:`sweep`),
  in case the guard was killed too: it kills the dead run's cgroup; without one it can
  pin only the workers still alive with their recorded start time.

Nothing is signalled by a pid number alone: see :mod:`aiotimer.supervisor._pins` for
what is proven, and what is left alone. A run recorded in another PID namespace
(another container sharing the directory) is left alone: its pids mean other processes
here, so its supervisor cannot be proven dead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import msgspec

from aiotimer._edges.cgroups import RunCgroup
from aiotimer._edges.files import (
    check_private_dir,
    make_private_dir,
    read_owned,
    remove_owned,
    write_atomic,
)
from aiotimer._edges.procfs import EXITED_STATES, boot_id, own_start_time, read_stat
from aiotimer.errors import ProcessGoneError
from aiotimer.supervisor import _guardlink
from aiotimer.supervisor._pins import close_pins, pin, stop_leftovers

__all__ = [
    "ProcessId",
    "RunFile",
    "RunRecord",
    "kill_cgroup",
    "make_runtime_dir",
    "read_run_file",
    "remove_runtime_dir",
    "run_file_name",
    "runs_dir",
    "runtime_parent",
    "stop_dead_run",
    "sweep",
    "this_process",
]

logger = logging.getLogger("aiotimer")

#: The most a run file may hold (a worker is ~40 bytes of it).
MAX_RUN_FILE: Final[int] = 1 << 20
#: The longest a sweep waits for a dead run's cgroup to empty once killed.
CGROUP_EMPTY_TIMEOUT: Final[float] = 5.0


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
    #: The run's cgroup directory (:mod:`aiotimer._edges.cgroups`); empty if none.
    cgroup: str = ""


def runtime_parent(chosen: str | os.PathLike[str] | None = None) -> str | None:
    """Where a supervisor makes its private runtime directory: ``chosen``, else
    ``$XDG_RUNTIME_DIR``; ``None`` (the temp dir) when that is not a directory."""
    parent = chosen or os.environ.get("XDG_RUNTIME_DIR") or None
    return None if parent is None or not os.path.isdir(parent) else os.fspath(parent)


def make_runtime_dir(parent: str | None, run_id: str) -> tuple[Path, str]:
    """Make the run's private ``0700`` runtime directory in ``parent`` (its FIFO and
    control socket live there), named after ``run_id``: (the directory, the run's tag,
    a safe name made of any run id)."""
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:24]
    return Path(tempfile.mkdtemp(prefix=f"aiotimer-{tag}-", dir=parent)), tag


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


def run_file_name(supervisor: ProcessId) -> str:
    """The name of ``supervisor``'s run file in its run-file directory."""
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
        self.path = directory / run_file_name(self.me)
        self._guard = _guardlink.current()
        cgroup = "" if self._guard is None else self._guard.cgroup
        self._record = RunRecord(
            boot_id=(boot_id() or ""),
            supervisor=self.me,
            fifo=fifo,
            pid_ns=_pid_namespace(),
            cgroup=cgroup,
        )
        self._failed = False
        if self._guard is not None and not cgroup:
            logger.info(
                "this run has no cgroup of its own: if it is killed, its guard stops "
                "only what it can prove its workers left (their process groups, see "
                "docs/supervisor.md)"
            )

    def pin(self, pid: int, pidfd: int | None) -> None:
        """Hand the run's guard (if any) a pidfd of worker ``pid``, just launched."""
        if self._guard is None or pidfd is None:
            return
        with contextlib.suppress(ProcessGoneError, FileNotFoundError):
            stat = read_stat(pid)
            if stat is not None:
                self._guard.pin(pid, pidfd, stat[1])

    def unpin(self, pid: int) -> None:
        """Tell the run's guard (if any) worker ``pid`` is collected."""
        if self._guard is not None:
            self._guard.unpin(pid)

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


def read_run_file(path: Path) -> RunRecord | str:
    """The run file at ``path``, or why it cannot be read (it is gone, not this
    user's, too large, not a run file)."""
    try:
        return msgspec.json.decode(read_owned(path, MAX_RUN_FILE, what="run file"), type=RunRecord)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        return f"{exc}"


def remove_runtime_dir(record: RunRecord) -> None:
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
        record = read_run_file(path)
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
        killed, errors = stop_dead_run(record) if record.boot_id == boot else ([], [])
        remove_runtime_dir(record)
        with contextlib.suppress(OSError):
            remove_owned(path, what="run file")
        if killed:
            report.append(
                f"stopped {len(killed)} process(es) left by the run of supervisor "
                f"{record.supervisor.pid}, which died without stopping its workers: "
                f"pids {', '.join(map(str, sorted(killed)))}"
            )
        report.extend(errors)
    return report


def stop_dead_run(record: RunRecord) -> tuple[list[int], list[str]]:
    """Stop what the dead run of ``record`` left, without pins of its own: its cgroup
    if it had one, else what :func:`~aiotimer.supervisor._pins.stop_leftovers` proves
    from its workers still alive (pinned by pid and recorded start time). Returns the
    pids stopped and one line per failure."""
    cgroup = RunCgroup.existing(record.cgroup) if record.cgroup else None
    if cgroup is not None:
        return kill_cgroup(cgroup, CGROUP_EMPTY_TIMEOUT)
    pins = [p for w in record.workers if (p := pin(w.pid, w.start_time)) is not None]
    workers = [w for w, _ in pins]
    pinned = {w.pid for w in workers}
    dead = {w.pid: w.start_time for w in record.workers if w.pid not in pinned}
    try:
        return stop_leftovers(workers, record.fifo, unpinned=dead)
    finally:
        close_pins(workers)


def kill_cgroup(cgroup: RunCgroup, timeout: float) -> tuple[list[int], list[str]]:
    """SIGKILL everything in ``cgroup``, wait up to ``timeout`` seconds for it to
    empty, remove it. Returns the pids it held and one line per failure."""
    members = cgroup.members()
    try:
        cgroup.kill()
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [f"could not kill the run's cgroup {cgroup.path}: {exc}"]
    if not cgroup.wait_empty(timeout):
        return members, [
            f"processes of the run's cgroup {cgroup.path} still alive {timeout:g}s after "
            f"SIGKILL (stuck in the kernel): {', '.join(map(str, cgroup.members()))}"
        ]
    cgroup.remove()
    return members, []
