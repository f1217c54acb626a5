"""Made-up pids for the workers that unit tests hand to a server, an engine or a reaper.

A server never signals its own process, and the kill policy never signals pid 1 nor
the server's ancestors. In a fresh PID namespace (a container, ``unshare --pid``) the
test process itself is pid 1 or 2 and its children get the next few pids, so a
made-up worker "1" or "100" may be the test process, an ancestor or a live child, and
the test then sees a refusal (or pins a real process) instead of what it meant.

Linux never gives a process a pid above ``PID_MAX_LIMIT`` (2**22 on 64-bit kernels:
the ceiling of ``/proc/sys/kernel/pid_max``), so the pids made here name no process in
any namespace, while still fitting the wire format's ``pid_t``.
"""

from __future__ import annotations

__all__ = ["PID_MAX_LIMIT", "fake_pid"]

#: No Linux process has a pid above this (``PID_MAX_LIMIT`` on 64-bit kernels).
PID_MAX_LIMIT = 1 << 22


def fake_pid(n: int) -> int:
    """The ``n``-th made-up pid (``n >= 1``): never a live process, never this one.

    Raises:
        ValueError: ``n`` is below 1.
    """
    if n < 1:
        raise ValueError(f"fake pids are numbered from 1, not {n}")
    return PID_MAX_LIMIT + n
