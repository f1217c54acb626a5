"""Who the server may signal, and with which signals: a pure judgement over facts.

Whoever can write to the server's FIFO can name any pid and any signal. The kill policy
decides, before every signal, whether this target may receive it. It reads no clock and
does no I/O: the shell gathers the facts (:class:`ServerIdentity` once at start-up, a
:class:`Target` before each signal, from ``/proc`` and the pinned handle) and asks
:meth:`KillPolicy.refusal`, which returns why not, or ``None``.

The rules, in the order they are checked (the first that matches refuses):

1. the signal is not in the allowed set (by default every signal but the job-control
   ones: SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU, SIGCONT, so a request cannot freeze a
   process or wake one an operator froze). The message is the one the client gives at
   block entry for the same signal (:func:`~aiotimer.wire.signal_problem`, one rule for
   both); the server refuses only the timer that asked for it, not its worker's others;
2. the target never registered (the server could not pin it);
3. the target is the server itself or one of its ancestors (its agent, its shell...);
4. a group signal to a system group (pgid <= 1) or to the server's own group;
5. the target's uid is not allowed: by default only the server's own (effective) uid,
   any uid when the server runs as root; or the explicit ``uids`` set. An unknown uid
   (no ``/proc``) is allowed only where any uid is;
6. with ``descendants_only``, the target is not a descendant of the server (what a
   supervisor that starts its workers wants). Unknown ancestry refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from aiotimer.wire import JOB_CONTROL_SIGNALS, MAX_SIGNAL, REAP_SIGNALS, signal_problem

__all__ = [
    "DEFAULT_SIGNALS",
    "JOB_CONTROL_SIGNALS",
    "KillPolicy",
    "ServerIdentity",
    "Target",
    "fifo_mode_warning",
]

#: The signals a default policy allows: every signal number but the job-control ones
#: (:data:`~aiotimer.wire.JOB_CONTROL_SIGNALS`, refused by default), the very set the
#: client accepts at block entry (:data:`~aiotimer.wire.REAP_SIGNALS`).
DEFAULT_SIGNALS: Final[frozenset[int]] = REAP_SIGNALS


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """The server's own process, as the policy needs it (gathered once)."""

    pid: int
    uid: int
    """The server's effective uid."""
    pgid: int
    ancestors: frozenset[int]
    """The pids of the server's parent, grandparent, ... (empty without ``/proc``)."""


@dataclass(frozen=True, slots=True)
class Target:
    """What the server knows about a worker it is about to signal."""

    pid: int
    registered: bool
    """True when the worker registered and was pinned."""
    uid: int | None
    """The worker's real uid; ``None`` when unknown (no ``/proc``)."""
    descendant: bool | None
    """True when the server is an ancestor of the worker; ``None`` when unknown."""
    pgid: int | None = None
    """The worker's process group (needed for a group signal only)."""


@dataclass(frozen=True, slots=True)
class KillPolicy:
    """Which targets and signals the server may use (see the module docstring).

    Args:
        uids: the uids whose processes may be signalled; ``None`` (the default) means the
            server's own uid, or any uid when the server runs as root.
        descendants_only: signal only descendants of the server.
        signals: the allowed signal numbers.
    """

    uids: frozenset[int] | None = None
    descendants_only: bool = False
    signals: frozenset[int] = DEFAULT_SIGNALS

    def __post_init__(self) -> None:
        bad = sorted(s for s in self.signals if not 1 <= s <= MAX_SIGNAL)
        if bad:
            raise ValueError(f"signals must be in 1..{MAX_SIGNAL}, got {bad}")
        if self.uids is not None and any(u < 0 for u in self.uids):
            raise ValueError(f"uids must be >= 0, got {sorted(self.uids)}")

    def refusal(
        self, server: ServerIdentity, target: Target, signum: int, *, group: bool = False
    ) -> str | None:
        """Why ``signum`` must not be sent to ``target`` (its group with ``group``), or
        ``None`` when it may."""
        pid = target.pid
        if signum not in self.signals:
            return signal_problem(signum, self.signals) or f"signal {signum} is not allowed"
        if not target.registered:
            return f"pid {pid} never registered, so its identity cannot be proven"
        if pid <= 1 or pid == server.pid:
            return f"pid {pid} is the server itself or init"
        if pid in server.ancestors:
            return f"pid {pid} is an ancestor of the server"
        if group:
            pgid = target.pgid
            if pgid is None or pgid <= 1 or pgid == server.pgid:
                return (
                    f"process group {pgid} of pid {pid} is the server's own group or a system group"
                )
            if pgid == server.pid or pgid in server.ancestors:
                return f"process group {pgid} of pid {pid} is led by the server or its ancestor"
        allowed = self.uids
        if allowed is None and server.uid != 0:
            allowed = frozenset({server.uid})
        if allowed is not None and target.uid not in allowed:
            owner = "an unknown user" if target.uid is None else f"uid {target.uid}"
            return (
                f"pid {pid} belongs to {owner}; the kill policy allows uid(s) "
                f"{', '.join(map(str, sorted(allowed)))}"
            )
        if self.descendants_only and not target.descendant:
            return f"pid {pid} is not a descendant of the server (descendants_only)"
        return None


def fifo_mode_warning(mode: int) -> str | None:
    """A warning when permission bits ``mode`` let other users write to the FIFO."""
    who = [name for bit, name in ((0o020, "its group"), (0o002, "every user")) if mode & bit]
    if not who:
        return None
    return (
        f"the FIFO's mode {mode & 0o777:04o} lets {' and '.join(who)} write to it: they "
        "can ask the server to signal processes (within its kill policy); use mode 0600 "
        "or the Unix-socket source, whose peers the kernel names"
    )
