"""Process limits a watchdog needs: one descriptor per watched worker.

The server pins every worker with a pidfd, so it holds one descriptor per live worker
besides its own. A soft ``RLIMIT_NOFILE`` of 1024 (a common default) would make the
1,000th worker impossible to pin; :func:`raise_open_file_limit` lifts the soft limit to
the hard one, which needs no privilege.

Whatever the limit, the descriptors it leaves are shared with what outsiders open: a
connection to the control socket or the metrics port takes one. A
:class:`DescriptorReserve` keeps the last few for the server: a listener asks
:meth:`~DescriptorReserve.leaves_room` after each ``accept()`` and closes the connection
when fewer than the reserve are left, so the engine can still pin the next workers.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Final

__all__ = ["DEFAULT_FD_RESERVE", "DescriptorReserve", "raise_open_file_limit"]

#: Descriptors kept free for the server by default (fewer under a low limit: a quarter
#: of the soft ``RLIMIT_NOFILE`` at most, see :meth:`DescriptorReserve.for_limit`).
DEFAULT_FD_RESERVE: Final[int] = 64

logger = logging.getLogger("aiotimer")


def raise_open_file_limit() -> tuple[int, int] | None:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit.

    Returns the ``(soft, hard)`` limits now in force, or ``None`` where the platform has
    no such limit. Never raises: a refusal is logged and the old limits are returned.
    """
    try:
        import resource  # noqa: PLC0415 (POSIX only)
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard or (hard != resource.RLIM_INFINITY and soft > hard):
        return soft, hard
    target = hard
    if hard == resource.RLIM_INFINITY:
        target = 1 << 20  # Linux's nr_open default: an unlimited hard limit is refused
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        logger.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
        return soft, hard
    return target, hard


def _soft_limit() -> int | None:
    try:
        import resource  # noqa: PLC0415 (POSIX only)
    except ImportError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


class DescriptorReserve:
    """Keeps ``count`` file descriptors free for what matters more than the caller.

    :meth:`leaves_room` checks that at least ``count`` more descriptors can be opened
    now, by duplicating one ``count`` times and closing the copies at once: exact
    whatever the process holds, about a microsecond per descriptor, no state between
    calls. Call it in the event loop's thread, like the descriptors it protects are
    opened, so nothing takes one between the check and the caller's decision.
    """

    __slots__ = ("count",)

    def __init__(self, count: int = DEFAULT_FD_RESERVE) -> None:
        if count < 0:
            raise ValueError(f"a descriptor reserve must be >= 0, got {count}")
        self.count = count

    @classmethod
    def for_limit(cls, count: int = DEFAULT_FD_RESERVE) -> DescriptorReserve:
        """A reserve of ``count``, or of a quarter of the soft ``RLIMIT_NOFILE`` if that
        is less (a low limit still leaves the listeners some room)."""
        soft = _soft_limit()
        return cls(count if soft is None else min(count, soft // 4))

    def leaves_room(self, fd: int) -> bool:
        """Whether ``count`` more descriptors are free (``fd``, any open descriptor, is
        what is duplicated to find out).

        Raises:
            OSError: duplicating failed for another reason than a full table.
        """
        taken: list[int] = []
        try:
            for _ in range(self.count):
                taken.append(os.dup(fd))
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                return False
            raise
        finally:
            for copy in taken:
                os.close(copy)
        return True

    def __repr__(self) -> str:
        return f"<DescriptorReserve {self.count}>"
