"""How a worker process ended, in words a restart policy can act on: succeeded, crashed,
killed by a signal, reaped by its timer, or stopped by the supervisor. Pure."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from aiotimer.events._base import signal_name

__all__ = ["ExitKind", "ExitReason", "classify_exit"]


class ExitKind(enum.Enum):
    """Why an attempt ended."""

    SUCCEEDED = "succeeded"  #: exit code 0
    CRASHED = "crashed"  #: a non-zero exit code
    SIGNALLED = "signalled"  #: killed by a signal the timer did not send
    REAPED = "reaped"  #: reaped by the timer server (its timer expired)
    STOPPED = "stopped"  #: the supervisor stopped it


@dataclass(frozen=True, slots=True)
class ExitReason:
    """Why an attempt ended: its kind, exit code or signal, and the expired scopes."""

    kind: ExitKind
    exit_code: int | None = None
    signal: int | None = None
    scopes: tuple[str, ...] = ()

    def describe(self) -> str:
        """A short phrase, e.g. ``"reaped by timer 'step' (SIGKILL)"``."""
        how = _how(self.exit_code, self.signal)
        if self.kind is ExitKind.REAPED:
            return f"reaped by timer {', '.join(map(repr, self.scopes)) or '?'} ({how})"
        if self.kind is ExitKind.SIGNALLED:
            return f"killed by {how}"
        if self.kind is ExitKind.STOPPED:
            return f"stopped by the supervisor ({how})"
        return f"{self.kind.value} ({how})"


def _how(exit_code: int | None, signum: int | None) -> str:
    return signal_name(signum) if signum is not None else f"exit code {exit_code}"


def classify_exit(
    returncode: int, *, reaped_scopes: tuple[str, ...] | None = None, stopped: bool = False
) -> ExitReason:
    """The :class:`ExitReason` of an attempt.

    Args:
        returncode: as :mod:`subprocess` reports it (``-N`` for signal ``N``).
        reaped_scopes: the expired scopes when the timer server reaped this worker
            (``None`` if it did not). A reap wins: it is the most telling reason, even
            for a worker the supervisor was stopping meanwhile.
        stopped: the supervisor itself stopped the attempt.
    """
    code, sig = (None, -returncode) if returncode < 0 else (returncode, None)
    if reaped_scopes is not None:
        return ExitReason(ExitKind.REAPED, code, sig, reaped_scopes)
    if stopped:
        kind = ExitKind.STOPPED
    elif sig is not None:
        kind = ExitKind.SIGNALLED
    else:
        kind = ExitKind.SUCCEEDED if code == 0 else ExitKind.CRASHED
    return ExitReason(kind, code, sig)
