"""The wire format: its limits, the :class:`Request` record and its validation. Pure.

The line format is torch's (``torch.distributed.elastic.timer.FileTimerRequest``): one
JSON object per ``\\n``-terminated line, written with one ``write(2)`` of at most
``PIPE_BUF`` bytes *including* the newline::

    {"version": 1, "pid": 4242, "scope_id": "a.py#4", "expiration_time": 1763712000.5, "signal": 9}
    {"version": 1, "pid": 4242, "scope_id": "a.py#4", "expiration_time": -1, "signal": 0}

Keys (see docs/protocol.md for the full table):

``version``          optional; absent or ``1``.
``pid``              required int in ``1..2**31-1`` (a ``pid_t``): the worker.
``scope_id``         required non-empty string of at most ``MAX_SCOPE_ID_LENGTH`` chars.
``expiration_time``  required finite number, epoch seconds; negative means release
                     (``0`` is an acquire that expires at once).
``signal``           required int: a signal number in ``1..MAX_SIGNAL``, or ``<= 0``
                     meaning report only (torch's shadow mode). The job-control
                     signals are valid lines (torch's clients may send them), but a
                     timer is never reaped with one (:func:`signal_problem`): the
                     client refuses them at block entry, the server's default kill
                     policy at the deadline, where such a timer abandons only itself.
``mono``             aiotimer extension: the deadline on ``CLOCK_MONOTONIC``
                     (``time.monotonic()``); when present the server prefers it, so
                     wall-clock steps cannot fire or postpone a timer.
``grace``            aiotimer extension: seconds to wait after ``signal`` before SIGKILL.
``group``            aiotimer extension: signal the worker's whole process group.
``dump``             aiotimer extension: ask the worker for a stack dump before reaping.
``kill_after``       aiotimer extension, on an acquire: the block has two tiers; its own
                     deadline (its task is cancelled in the worker) is ``kill_after``
                     seconds before this request's deadline (the reap).
``cancelled``        aiotimer extension, on a release: the block ended at its own
                     deadline, its task cancelled (the first tier: ``TimeoutError``).
``at``               aiotimer extension: when the worker sent the request, on
                     ``CLOCK_MONOTONIC``: an acquire's is its block's start, a
                     release's its end (the block's times, however late the server
                     reads them; see docs/stragglers.md).
``start_time``       aiotimer extension: the worker's start time (``/proc/<pid>/stat``
                     field 22, clock ticks since boot) when it sent the request; the
                     server refuses to pin a process whose start time differs (the
                     worker died and its pid was reused before its request was read).
``learned``          aiotimer extension, on an acquire: a learned timeout's spec
                     (:mod:`aiotimer.wire._learned`); ``expiration_time`` is then the
                     block's deadline at ``initial``, and an aiotimer server times it at
                     the value it learned for the scope, never later.

Unknown keys are ignored, so newer clients can talk to older servers.
"""

from __future__ import annotations

import math
import select
import signal as _signal
from collections.abc import Set as AbstractSet
from typing import Annotated, Final

import msgspec

from aiotimer.wire._learned import Learned

__all__ = [
    "ENV_FIFO",
    "JOB_CONTROL_SIGNALS",
    "MARKER_SUFFIX",
    "MAX_LINE_BYTES",
    "MAX_SCOPE_ID_LENGTH",
    "MAX_SIGNAL",
    "MAX_START_TIME",
    "PIPE_BUF",
    "PROTOCOL_VERSION",
    "REAP_SIGNALS",
    "TORCH_ENV_FIFO",
    "Request",
    "RequestTooLargeError",
    "check_block",
    "number_problem",
    "scope_id_problem",
    "signal_problem",
    "validate",
]

#: The size up to which a pipe write is atomic (4096 on Linux).
PIPE_BUF: Final[int] = select.PIPE_BUF
#: The longest accepted line, newline included.
MAX_LINE_BYTES: Final[int] = PIPE_BUF
#: The longest accepted ``scope_id``, in characters.
MAX_SCOPE_ID_LENGTH: Final[int] = 2048
#: The only wire version there is (torch's).
PROTOCOL_VERSION: Final[int] = 1
#: Beside an aiotimer server's FIFO ``P`` lies the marker file ``P + MARKER_SUFFIX`` (JSON:
#: ``{"server": "aiotimer", "version": ..., "pid": ..., "protocol": 1}``, plus optional
#: keys). Its presence tells a client that the server reads without blocking, so the
#: client may keep one descriptor open; torch's server stalls if a client does that, so
#: without a marker a client must open, write and close for every request.
MARKER_SUFFIX: Final[str] = ".aiotimer"
#: aiotimer's own discovery variable: the path of the server's FIFO.
ENV_FIFO: Final[str] = "AIOTIMER_FIFO"
#: torch's discovery variable (set by torchelastic agents): the path of the server's FIFO.
TORCH_ENV_FIFO: Final[str] = "TORCHELASTIC_TIMER_FILE"

#: The highest signal number a request may name (``SIGRTMAX``, ``NSIG - 1``); ``signal``
#: is either a signal in ``1..MAX_SIGNAL`` or ``<= 0`` (report only).
MAX_SIGNAL: Final[int] = _signal.NSIG - 1
#: Signals that stop or continue a process: a timer is never reaped with one (a request
#: could freeze a worker, or wake one an operator froze). The client refuses them at
#: block entry and the server's default kill policy at the deadline, by
#: :func:`signal_problem`.
JOB_CONTROL_SIGNALS: Final[frozenset[int]] = frozenset(
    int(s)
    for s in (_signal.SIGCONT, _signal.SIGSTOP, _signal.SIGTSTP, _signal.SIGTTIN, _signal.SIGTTOU)
)
#: The signals a timer may be reaped with: ``1..MAX_SIGNAL`` but the job-control ones.
REAP_SIGNALS: Final[frozenset[int]] = frozenset(range(1, MAX_SIGNAL + 1)) - JOB_CONTROL_SIGNALS
#: The highest ``start_time`` (a 64-bit count of clock ticks since boot).
MAX_START_TIME: Final[int] = 2**63 - 1

_SUPPORTED_VERSIONS: Final = frozenset({PROTOCOL_VERSION})
#: ``pid_t`` and report-only signals are C ints; JSON integers are unbounded, and an
#: out-of-range one would make ``os.kill`` raise ``OverflowError`` in the server.
_C_INT_MAX: Final[int] = 2**31 - 1
_C_INT_MIN: Final[int] = -(2**31)


# The rules that JSON typing cannot express, as msgspec constraints: decoding a line
# checks them in C, so every Request the codec yields is valid. validate() states the
# same rules for Requests built in Python (msgspec does not check them on __init__);
# tests/test_protocol.py pins that both agree. (JSON itself has no NaN or infinity, and
# msgspec rejects out-of-range numbers, so decoded floats are always finite.)
_Pid = Annotated[int, msgspec.Meta(gt=0, le=_C_INT_MAX)]
_Signal = Annotated[int, msgspec.Meta(ge=_C_INT_MIN, le=MAX_SIGNAL)]
_StartTime = Annotated[int, msgspec.Meta(ge=0, le=MAX_START_TIME)]
_ScopeId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_SCOPE_ID_LENGTH)]
_Version = Annotated[int, msgspec.Meta(ge=PROTOCOL_VERSION, le=PROTOCOL_VERSION)]
_Grace = Annotated[float, msgspec.Meta(ge=0)]


class RequestTooLargeError(ValueError):
    """An encoded request would not fit in one atomic pipe write (``PIPE_BUF`` bytes)."""


class Request(msgspec.Struct, frozen=True, gc=False):
    """One acquire (``expiration_time >= 0``) or release (``expiration_time < 0``).

    Field names follow the wire. ``expiration_time`` is epoch seconds as torch sends it;
    ``mono``, when set, is the same deadline on ``time.monotonic()`` and takes precedence
    on the server. See the module docstring for every key.
    """

    pid: _Pid
    scope_id: _ScopeId
    expiration_time: float
    signal: _Signal
    version: _Version | None = None
    mono: float | None = None
    grace: _Grace | None = None
    group: bool = False
    dump: bool = False
    start_time: _StartTime | None = None
    kill_after: _Grace | None = None
    cancelled: bool = False
    learned: Learned | None = None
    at: float | None = None

    @property
    def is_release(self) -> bool:
        """True when this request releases its scope (negative ``expiration_time``)."""
        return self.expiration_time < 0

    def deadline(self, mono_now: float, wall_now: float) -> float:
        """This request's deadline on the server's monotonic clock.

        The ``mono`` extension is used as is; otherwise the epoch ``expiration_time`` is
        translated with the given pair of simultaneous clock readings.
        """
        if self.mono is not None:
            return self.mono
        return mono_now + (self.expiration_time - wall_now)


def scope_id_problem(scope_id: str) -> str | None:
    """Why ``scope_id`` cannot name a timer, or ``None`` when it can.

    A scope id is a non-empty string of at most ``MAX_SCOPE_ID_LENGTH`` characters that
    is valid Unicode (no lone surrogates: JSON cannot carry them to the server).
    """
    if not scope_id:
        return "scope_id must not be empty"
    if len(scope_id) > MAX_SCOPE_ID_LENGTH:
        return (
            f"scope_id is {len(scope_id)} characters long, longer than "
            f"MAX_SCOPE_ID_LENGTH ({MAX_SCOPE_ID_LENGTH})"
        )
    if not scope_id.isascii():
        try:
            scope_id.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"scope_id is not valid Unicode ({exc.reason} at index {exc.start})"
    return None


def _signal_range_problem(signum: int) -> str | None:
    """Why ``signum`` cannot be a request's ``signal`` on the wire, or ``None``.

    A signal number in ``1..MAX_SIGNAL``, or an integer ``<= 0`` (report only) that fits
    a C int. (The line decoder checks the same bounds.)
    """
    if not _C_INT_MIN <= signum <= MAX_SIGNAL:
        return (
            f"signal must be a signal number in 1..MAX_SIGNAL ({MAX_SIGNAL}) or <= 0 "
            f"(report only), got {signum}"
        )
    return None


def _named(signum: int) -> str:
    try:
        return f"{signum} ({_signal.Signals(signum).name})"
    except ValueError:
        return str(signum)


def _spans(numbers: AbstractSet[int]) -> str:
    """``numbers`` as runs: ``1..17, 23..64``."""
    runs: list[str] = []
    ordered = sorted(numbers)
    start = prev = ordered[0]
    for n in [*ordered[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        runs.append(str(start) if start == prev else f"{start}..{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(runs)


def signal_problem(signum: int, allowed: AbstractSet[int] = REAP_SIGNALS) -> str | None:
    """Why a timer cannot be reaped with ``signum``, or ``None`` when it can: the one
    rule the client applies at block entry and the server's kill policy at the deadline.

    ``signum`` is a signal number in ``allowed`` (by default :data:`REAP_SIGNALS`: every
    signal but the job-control ones, :data:`JOB_CONTROL_SIGNALS`), or an integer
    ``<= 0`` (report only) that fits a C int. The message names the argument, what it
    got and the accepted values.
    """
    problem = _signal_range_problem(signum)
    if problem is not None or signum <= 0 or signum in allowed:
        return problem
    if allowed == REAP_SIGNALS:
        accepted = (
            f"a signal number in 1..MAX_SIGNAL ({MAX_SIGNAL}) but the job-control ones "
            f"({', '.join(_named(n) for n in sorted(JOB_CONTROL_SIGNALS))}), which would "
            "freeze or wake the worker instead of reaping it,"
        )
    elif allowed:
        accepted = f"one of the kill policy's signals ({_spans(allowed)})"
    else:
        accepted = "no signal at all (the kill policy allows none)"
    return f"signal must be {accepted} or <= 0 (report only), got {_named(signum)}"


def number_problem(name: str, value: float, *, minimum: float | None = None) -> str | None:
    """Why ``value`` cannot be the request's number ``name``, or ``None`` when it can.

    Every number on the wire is finite (JSON has no NaN or infinity); ``minimum``, when
    given, is the smallest allowed value.
    """
    if not math.isfinite(value):
        return f"{name} must be a finite number, got {value!r}"
    if minimum is not None and value < minimum:
        return f"{name} must be >= {minimum}, got {value!r}"
    return None


def validate(req: Request) -> str | None:
    """Return why ``req`` is invalid, or ``None`` when it is a valid request.

    These are the checks JSON typing cannot express (pid in ``1..2**31-1``, signal
    in ``1..MAX_SIGNAL`` or ``<= 0``, non-empty bounded valid-Unicode scope, finite
    numbers, known version). Decoding a line applies the same rules; sources that
    receive :class:`Request` objects by other means than the line codec (e.g. a
    multiprocessing queue) must apply it too.
    """
    if not 0 < req.pid <= _C_INT_MAX:
        return f"pid must be an integer in 1..{_C_INT_MAX}, got {req.pid}"
    problem = (
        _signal_range_problem(req.signal)
        or scope_id_problem(req.scope_id)
        or number_problem("expiration_time", req.expiration_time)
    )
    if problem is not None:
        return problem
    if req.version is not None and req.version not in _SUPPORTED_VERSIONS:
        return f"unsupported protocol version {req.version}"
    if req.mono is not None and (problem := number_problem("mono", req.mono)):
        return problem
    if req.at is not None and (problem := number_problem("at", req.at)):
        return problem
    if req.grace is not None and (problem := number_problem("grace", req.grace, minimum=0)):
        return problem
    if req.kill_after is not None and (
        problem := number_problem("kill_after", req.kill_after, minimum=0)
    ):
        return problem
    if req.start_time is not None and not 0 <= req.start_time <= MAX_START_TIME:
        return f"start_time must be an integer in 0..{MAX_START_TIME}, got {req.start_time}"
    return None


def check_block(scope_id: str, signal: int, timeout: float) -> None:
    """Refuse, at block entry, a block the server would reject (so never run untimed).

    ``timeout`` is the block's time limit in seconds from now.

    Raises:
        ValueError: ``scope_id`` is empty, longer than ``MAX_SCOPE_ID_LENGTH`` or not
            valid Unicode; ``signal`` is neither in :data:`REAP_SIGNALS` nor ``<= 0``;
            ``timeout`` is not a finite number ``>= 0``. The message names the limit.
    """
    problem = (
        scope_id_problem(scope_id)
        or signal_problem(signal)
        or number_problem("the time limit", timeout, minimum=0)
    )
    if problem is not None:
        raise ValueError(problem)
