"""Linux ``timerfd``: a descriptor that becomes readable at a ``CLOCK_MONOTONIC`` instant.

The event loop's own timers have millisecond granularity (uvloop may fire up to ~1 ms
early, asyncio ~0.3 ms late on average); a timerfd armed at an absolute
``CLOCK_MONOTONIC`` time (the clock of ``time.monotonic()``) fires at that instant, to
the kernel's timer resolution, and re-arming it is one system call, whoever waits on it.
Python 3.13 has ``os.timerfd_create``; before that the two calls go through ``ctypes``.
:func:`open_timerfd` returns ``None`` where there is neither (not Linux).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import sys
from typing import Final

__all__ = ["TimerFd", "open_timerfd"]

_CLOCK_MONOTONIC: Final = 1
_TFD_TIMER_ABSTIME: Final = 1
#: Armed this much after the deadline: ``time.monotonic()`` rounds nanoseconds to a
#: float, so the instant the kernel fires must be past the deadline in that float too.
_SLACK_NS: Final = 1_000
#: Deadlines further off (~146 years of uptime) are armed at this: the kernel's and
#: ``c_long``'s range, never reached.
_MAX_NS: Final = 2**62


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


class TimerFd:
    """One non-blocking timerfd on ``CLOCK_MONOTONIC`` (see the module docs)."""

    __slots__ = ("_spec", "fd")

    def __init__(self) -> None:
        self.fd = _create()
        self._spec = _Itimerspec()

    def arm(self, deadline: float) -> None:
        """Fire once ``time.monotonic() >= deadline`` (``math.inf``: never; a past
        deadline fires at once; one centuries off, never); replaces the previous arming.

        Raises:
            OSError: the kernel refused (a deadline beyond its range).
        """
        if deadline == math.inf:
            _settime(self.fd, 0, self._spec)
        else:
            ns = math.ceil(min(deadline, _MAX_NS / 1e9) * 1e9) + _SLACK_NS
            _settime(self.fd, min(max(ns, 1), _MAX_NS), self._spec)

    def clear(self) -> None:
        """Consume a firing (the descriptor is readable until then)."""
        with contextlib.suppress(BlockingIOError):
            os.read(self.fd, 8)

    def close(self) -> None:
        """Close the descriptor."""
        os.close(self.fd)


if sys.version_info >= (3, 13):

    def _create() -> int:
        return os.timerfd_create(_CLOCK_MONOTONIC, flags=os.TFD_NONBLOCK | os.TFD_CLOEXEC)

    def _settime(fd: int, ns: int, spec: _Itimerspec) -> None:
        os.timerfd_settime_ns(fd, flags=os.TFD_TIMER_ABSTIME, initial=ns)

else:
    _libc = ctypes.CDLL(None, use_errno=True)

    def _check(result: int, what: str) -> int:
        if result < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")
        return result

    def _create() -> int:
        flags = os.O_NONBLOCK | os.O_CLOEXEC
        return _check(_libc.timerfd_create(_CLOCK_MONOTONIC, flags), "timerfd_create")

    def _settime(fd: int, ns: int, spec: _Itimerspec) -> None:
        spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(ns, 1_000_000_000)
        _check(
            _libc.timerfd_settime(fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None),
            "timerfd_settime",
        )


def open_timerfd() -> TimerFd | None:
    """A new timerfd (non-blocking, close-on-exec), or ``None`` where the system has
    none (the caller then falls back to the loop's timers).

    Raises:
        OSError: the system has timerfds but will not make one (out of descriptors).
    """
    if not sys.platform.startswith("linux"):
        return None
    return TimerFd()
