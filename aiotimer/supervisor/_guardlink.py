"""The supervisor's end of its guard's link: hand the guard a pidfd of every worker.

A pidfd names one process for good; a pid number names whatever process has it now.
So that the run's guard (:mod:`aiotimer.supervisor._guard`) never signals a process by
its number once the run is gone, the supervisor sends it, over a ``SOCK_SEQPACKET``
socket made before the guard was forked, a pidfd of each worker as it is launched
(``+<pid> <start time>`` with the descriptor) and says when one is collected
(``-<pid>``: the guard closes it). ``c`` says the supervisor entered the run's cgroup.

The link is process-wide, like the guard: :func:`install` sets it, :func:`current`
returns it (``None`` without a guard). Sending never blocks the supervisor: a guard
that does not keep up (or is gone) is said once, and the run relies on its cgroup and
its run file.
"""

from __future__ import annotations

import logging
import socket

__all__ = ["GuardLink", "current", "install"]

logger = logging.getLogger("aiotimer")


class GuardLink:
    """The supervisor's end of the link (see the module docs).

    Args:
        sock: the socket (made non-blocking here).
        cgroup: the run cgroup's directory, if this process entered it; ``""`` if not.
    """

    def __init__(self, sock: socket.socket, cgroup: str) -> None:
        sock.setblocking(False)
        self._sock = sock
        self.cgroup = cgroup
        self._broken = False

    def pin(self, pid: int, pidfd: int, start_time: int) -> None:
        """Hand the guard a pidfd of worker ``pid`` (started at ``start_time``)."""
        self._send(f"+{pid} {start_time}".encode(), [pidfd])

    def unpin(self, pid: int) -> None:
        """Tell the guard worker ``pid`` is collected: its pidfd can go."""
        self._send(f"-{pid}".encode(), [])

    def entered_cgroup(self) -> None:
        """Tell the guard this process is in the run's cgroup."""
        self._send(b"c", [])

    def _send(self, message: bytes, fds: list[int]) -> None:
        if self._broken:
            return
        try:
            socket.send_fds(self._sock, [message], fds)
        except OSError as exc:
            self._broken = True
            logger.warning(
                "cannot reach the run's guard (%s): if this run is killed, only its "
                "cgroup and the next run stop what its workers leave",
                exc,
            )

    def close(self) -> None:
        """Close this end (the guard then relies on what it was told)."""
        self._sock.close()


_link: list[GuardLink] = []


def install(link: GuardLink) -> None:
    """Make ``link`` this process's guard link."""
    _link[:] = [link]


def current() -> GuardLink | None:
    """This process's guard link, or ``None`` (no guard)."""
    return _link[0] if _link else None
