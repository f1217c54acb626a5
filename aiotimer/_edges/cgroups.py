"""A cgroup v2 of a run: every process the run starts, whatever it does, until it ends.

A process can leave its session (``setsid()``), scrub its environment and lose its
parent; it cannot leave its cgroup without write access to another cgroup's
``cgroup.procs`` (root, or the cgroup's owner). So where this process may make a child
of its own cgroup v2 (root, or a delegated subtree), :meth:`RunCgroup.make` makes one,
:meth:`RunCgroup.enter` moves this process into it (its children are born there), and
:meth:`RunCgroup.kill` ends every member at once (``cgroup.kill``, Linux >= 5.14: no
pid is named, so none can be the wrong one, and a process forking meanwhile cannot
escape it). Where none can be made (no cgroup v2 mounted, a read-only one, another
user's), :meth:`RunCgroup.make` raises ``OSError`` saying why.

The cgroup is found from ``/proc/self/cgroup`` (the ``0::`` line) and
``/proc/self/mountinfo`` (a ``cgroup2`` mount whose root contains it).
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from pathlib import Path
from typing import Final

__all__ = ["RunCgroup", "cgroup_dirs", "own_cgroup_dir"]

#: The prefix of every cgroup a run makes.
PREFIX: Final[str] = "aiotimer-run-"


def _unescape(field: str) -> str:
    """A ``mountinfo`` path field (``\\040`` for a space, ...)."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def own_cgroup_dir() -> Path:
    """The directory of this process's cgroup v2.

    Raises:
        OSError: this process is in no cgroup v2, or none is mounted where it is seen.
    """
    with open("/proc/self/cgroup") as f:
        cgroups = f.read()
    with open("/proc/self/mountinfo") as f:
        mountinfo = f.read()
    for path in cgroup_dirs(cgroups, mountinfo):
        if path.is_dir():
            return path
    raise OSError("this process is in no cgroup v2 that a mount here shows")


def cgroup_dirs(cgroups: str, mountinfo: str) -> list[Path]:
    """Where the cgroup v2 that ``cgroups`` (a ``/proc/<pid>/cgroup``) names is seen,
    through the ``cgroup2`` mounts of ``mountinfo`` (a ``/proc/<pid>/mountinfo``): one
    path per mount whose root contains it. Pure."""
    own = next((line[3:] for line in cgroups.splitlines() if line.startswith("0::")), None)
    if own is None:
        return []
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        try:
            fstype = fields[fields.index("-") + 1]
        except (ValueError, IndexError):
            continue
        if fstype != "cgroup2":
            continue
        root, mount = _unescape(fields[3]), _unescape(fields[4])
        if own == root or own.startswith(root.rstrip("/") + "/"):
            found.append(Path(mount, own[len(root) :].lstrip("/")))
    return found


class RunCgroup:
    """One run's cgroup (see the module docs).

    Args:
        path: its directory.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def make(cls, name: str) -> RunCgroup:
        """Make ``aiotimer-run-<name>`` in this process's cgroup v2 (see the module docs).

        Raises:
            OSError: it cannot be made here, or has no ``cgroup.kill`` (Linux < 5.14).
        """
        path = own_cgroup_dir() / f"{PREFIX}{name}"
        os.mkdir(path)
        if not (path / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                os.rmdir(path)
            raise OSError("the cgroup has no cgroup.kill (Linux < 5.14)")
        return cls(path)

    @classmethod
    def existing(cls, path: str) -> RunCgroup | None:
        """The run cgroup at ``path``, if it is one (named as :meth:`make` names it, on
        a cgroup v2 file system: it has ``cgroup.kill``); ``None`` otherwise."""
        cgroup = Path(path)
        if not cgroup.name.startswith(PREFIX) or not (cgroup / "cgroup.kill").is_file():
            return None
        return cls(cgroup)

    def enter(self) -> None:
        """Move this process (every thread of it) into the cgroup.

        Raises:
            OSError: it may not (another user's cgroup, a threaded subtree, ...).
        """
        self._write("cgroup.procs", b"0")

    def members(self) -> list[int]:
        """The pids in the cgroup now (not its zombies), for a report; ``[]`` when it is
        gone."""
        try:
            with open(self.path / "cgroup.procs", "rb") as f:
                return [int(p) for p in f.read().split()]
        except OSError:
            return []

    def populated(self) -> bool:
        """Whether a live process is in it (or in a cgroup below it)."""
        try:
            with open(self.path / "cgroup.events", "rb") as f:
                return b"populated 1" in f.read()
        except FileNotFoundError:
            return False

    def kill(self) -> None:
        """SIGKILL every process in the cgroup and below it, forks in flight included.

        Raises:
            OSError: the kernel refused (the cgroup is gone: ``FileNotFoundError``).
        """
        self._write("cgroup.kill", b"1")

    def wait_empty(self, timeout: float) -> bool:
        """Wait until no live process is in it, at most ``timeout`` seconds; whether it
        is empty. Woken by the kernel's notification on ``cgroup.events``, not polled."""
        deadline = time.monotonic() + timeout
        try:
            fd = os.open(self.path / "cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return True
        try:
            poller = select.poll()
            poller.register(fd, select.POLLPRI)
            while True:
                os.lseek(fd, 0, os.SEEK_SET)
                if b"populated 0" in os.read(fd, 4096):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                poller.poll(min(left, 0.5) * 1000)  # a change wakes it; re-read anyway
        finally:
            os.close(fd)

    def remove(self) -> bool:
        """Remove the cgroup's directory; ``False`` if it still holds processes."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def _write(self, name: str, data: bytes) -> None:
        fd = os.open(self.path / name, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def __repr__(self) -> str:
        return f"RunCgroup({str(self.path)!r})"
