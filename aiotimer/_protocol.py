"""The wire codec: FIFO lines in, requests out; requests in, lines out. Pure: no I/O.

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
                     meaning report only (torch's shadow mode).
``mono``             aiotimer extension: the deadline on ``CLOCK_MONOTONIC``
                     (``time.monotonic()``); when present the server prefers it, so
                     wall-clock steps cannot fire or postpone a timer.
``grace``            aiotimer extension: seconds to wait after ``signal`` before SIGKILL.
``group``            aiotimer extension: signal the worker's whole process group.
``dump``             aiotimer extension: ask the worker for a stack dump before reaping.
``start_time``       aiotimer extension: the worker's start time (``/proc/<pid>/stat``
                     field 22, clock ticks since boot) when it sent the request; the
                     server refuses to pin a process whose start time differs (the
                     worker died and its pid was reused before its request was read).

Unknown keys are ignored, so newer clients can talk to older servers. Every malformed
line becomes a :class:`Rejection` (reason plus a truncated copy of the bytes); it never
raises and never costs another line of the same chunk.
"""

from __future__ import annotations

import math
import select
import signal as _signal
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from json.encoder import encode_basestring_ascii
from typing import Annotated, Final

import msgspec

__all__ = [
    "ENV_FIFO",
    "MARKER_SUFFIX",
    "MAX_LINE_BYTES",
    "MAX_SCOPE_ID_LENGTH",
    "MAX_SIGNAL",
    "MAX_START_TIME",
    "PIPE_BUF",
    "PROTOCOL_VERSION",
    "TORCH_ENV_FIFO",
    "BlockEncoder",
    "Decoded",
    "LineDecoder",
    "Rejection",
    "Request",
    "RequestTooLargeError",
    "block_encoder",
    "check_block",
    "encode",
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
#: How many bytes of an offending line a rejection keeps.
REJECTED_BYTES_KEPT: Final[int] = 200

#: The highest signal number a request may name (``SIGRTMAX``, ``NSIG - 1``); ``signal``
#: is either a signal in ``1..MAX_SIGNAL`` or ``<= 0`` (report only).
MAX_SIGNAL: Final[int] = _signal.NSIG - 1
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


@dataclass(frozen=True, slots=True)
class Rejection:
    """A line that was not a valid request: why, and (a prefix of) what it was."""

    reason: str
    line: bytes

    @classmethod
    def of(cls, reason: str, line: bytes) -> Rejection:
        """A rejection keeping at most ``REJECTED_BYTES_KEPT`` bytes of ``line``."""
        return cls(reason, bytes(line[:REJECTED_BYTES_KEPT]))


@dataclass(slots=True)
class Decoded:
    """What one :meth:`LineDecoder.feed` produced, in arrival order within each list."""

    requests: list[Request] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)


_decode_one = msgspec.json.Decoder(Request).decode
_decode_many = msgspec.json.Decoder(list[Request]).decode

#: What decoding hostile bytes can raise: msgspec's errors (a ``ValueError``), invalid
#: UTF-8 inside a string (``UnicodeDecodeError``, also a ``ValueError``) and nesting too
#: deep for msgspec's recursion limit (``RecursionError``).
_DECODE_ERRORS: Final = (ValueError, RecursionError)


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


def signal_problem(signum: int) -> str | None:
    """Why ``signum`` cannot be a request's ``signal``, or ``None`` when it can.

    A signal number in ``1..MAX_SIGNAL``, or an integer ``<= 0`` (report only) that fits
    a C int.
    """
    if not _C_INT_MIN <= signum <= MAX_SIGNAL:
        return (
            f"signal must be a signal number in 1..MAX_SIGNAL ({MAX_SIGNAL}) or <= 0 "
            f"(report only), got {signum}"
        )
    return None


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
        signal_problem(req.signal)
        or scope_id_problem(req.scope_id)
        or number_problem("expiration_time", req.expiration_time)
    )
    if problem is not None:
        return problem
    if req.version is not None and req.version not in _SUPPORTED_VERSIONS:
        return f"unsupported protocol version {req.version}"
    if req.mono is not None and (problem := number_problem("mono", req.mono)):
        return problem
    if req.grace is not None and (problem := number_problem("grace", req.grace, minimum=0)):
        return problem
    if req.start_time is not None and not 0 <= req.start_time <= MAX_START_TIME:
        return f"start_time must be an integer in 0..{MAX_START_TIME}, got {req.start_time}"
    return None


def check_block(scope_id: str, signal: int, timeout: float) -> None:
    """Refuse, at block entry, a block the server would reject (so never run untimed).

    ``timeout`` is the block's time limit in seconds from now.

    Raises:
        ValueError: ``scope_id`` is empty, longer than ``MAX_SCOPE_ID_LENGTH`` or not
            valid Unicode; ``signal`` is neither in ``1..MAX_SIGNAL`` nor ``<= 0``;
            ``timeout`` is not a finite number ``>= 0``. The message names the limit.
    """
    problem = (
        scope_id_problem(scope_id)
        or signal_problem(signal)
        or number_problem("the time limit", timeout, minimum=0)
    )
    if problem is not None:
        raise ValueError(problem)


def _decode_line(line: bytes, out: Decoded) -> None:
    """Decode one complete line (no newline) into ``out``; never raises."""
    try:
        out.requests.append(_decode_one(line))
    except _DECODE_ERRORS as exc:
        # A writer that died (or stalls) mid-line leaves a prefix that the next writer's
        # complete line is glued to. Well-formed lines start with '{"', so try to
        # recover a valid object starting at a later '{"' before giving up.
        recovered = _resync(line)
        if recovered is not None:
            cut, req = recovered
            partial = Rejection.of("partial line (writer stopped mid-line)", line[:cut])
            out.rejections.append(partial)
            out.requests.append(req)
            return
        out.rejections.append(Rejection.of(_reason(exc), line))


def _resync(line: bytes) -> tuple[int, Request] | None:
    start = line.find(b'{"', 1)
    while start != -1:
        try:
            req = _decode_one(line[start:])
        except _DECODE_ERRORS:
            start = line.find(b'{"', start + 1)
            continue
        return start, req
    return None


def _reason(exc: ValueError | RecursionError) -> str:
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        if text.endswith("at `$.version`"):
            return f"unsupported protocol version (only {PROTOCOL_VERSION} is known): {text}"
        return f"invalid request: {text}"
    if isinstance(exc, UnicodeDecodeError):
        return f"invalid UTF-8: {text}"
    if isinstance(exc, RecursionError):
        return "malformed JSON: nested too deeply"
    return f"malformed JSON: {text}"


class LineDecoder:
    """Incremental decoder for a byte stream of request lines.

    Feed it chunks as they are read (any size, any split); each :meth:`feed` returns the
    complete lines' requests and rejections. A trailing partial line is kept until its
    newline arrives, but never more than ``max_line`` bytes of it: a longer line is
    rejected once and skipped up to its newline (a valid line glued to its end by
    another writer is still recovered).

    Chunks of only valid lines take a fast path that decodes them all in one call.
    """

    __slots__ = ("_buf", "_max_line", "_overflow")

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        if max_line < 2:
            raise ValueError("max_line must be at least 2 bytes")
        self._max_line = max_line
        self._buf = b""
        self._overflow = False

    @property
    def pending(self) -> int:
        """Bytes of an incomplete line currently held."""
        return len(self._buf)

    def feed(self, chunk: bytes) -> Decoded:
        """Decode every complete line in ``self``'s buffer plus ``chunk``."""
        out = Decoded()
        if not chunk:
            return out
        last_nl = chunk.rfind(b"\n")
        if last_nl == -1:
            self._hold(chunk)
            return out
        head = chunk[: last_nl + 1]
        rest = chunk[last_nl + 1 :]
        if self._buf or self._overflow:
            first_nl = head.find(b"\n")
            self._hold(head[:first_nl])
            line, overflowed = self._buf, self._overflow
            self._buf, self._overflow = b"", False
            self._finish_line(line, overflowed, out)
            head = head[first_nl + 1 :]
        if head:
            self._decode_block(head, out)
        if rest:
            self._hold(rest)
        return out

    def flush(self) -> Decoded:
        """At end of stream: report a held partial line as a rejection and reset."""
        out = Decoded()
        if self._buf or self._overflow:
            reason = (
                f"line longer than {self._max_line} bytes"
                if self._overflow
                else "incomplete line at end of stream"
            )
            out.rejections.append(Rejection.of(reason, self._buf))
        self._buf, self._overflow = b"", False
        return out

    # -- internals ------------------------------------------------------------------

    def _hold(self, data: bytes) -> None:
        buf = self._buf + data
        limit = self._max_line - 1  # the newline counts toward the limit
        if len(buf) > limit:
            self._overflow = True
            buf = buf[-limit:]  # keep only a tail: enough to recover a glued valid line
        self._buf = buf

    def _finish_line(self, line: bytes, overflowed: bool, out: Decoded) -> None:
        if not overflowed:
            if line.strip():
                _decode_line(line, out)
            return
        out.rejections.append(Rejection.of(f"line longer than {self._max_line} bytes", line))
        start = line.find(b'{"')
        if start != -1:
            recovered = Decoded()
            _decode_line(line[start:], recovered)
            out.requests.extend(recovered.requests)

    def _decode_block(self, block: bytes, out: Decoded) -> None:
        """Decode ``block``: complete lines, each ending in a newline."""
        lines = block.split(b"\n")
        lines.pop()  # the empty string after the final newline
        limit = self._max_line - 1
        n = len(lines)
        # The fast path joins the lines into one JSON array. Getting n valid objects
        # back does not prove that each line held one of them: "{a}, {b}" on one line
        # and an object split over two lines also add up to n. It does when the block
        # holds exactly n '{' and n '}' bytes, every line ends with '}' and the array
        # has n elements: the n objects then use one '{' and one '}' each (no nesting,
        # none inside strings), and each closes at the end of its own line. Other
        # blocks (CRLF, braces in a scope_id, nested extension keys) take the exact
        # line-by-line path.
        if (
            block.count(b"{") == n
            and block.count(b"}") == n
            and all(map(bytes.endswith, lines, repeat(b"}")))
            and max(map(len, lines)) <= limit
        ):
            try:
                reqs = _decode_many(b"[" + b",".join(lines) + b"]")
            except _DECODE_ERRORS:
                pass  # at least one bad line: fall back to line by line
            else:
                # Fewer objects than lines: braces inside strings joined lines into one
                # object (`{"scope_id": "}` then `{", ...}` reads as one valid request).
                if len(reqs) == n:
                    out.requests.extend(reqs)
                    return
        for line in lines:
            if len(line) > limit:
                self._finish_line(line[-limit:], True, out)
            elif line.strip():
                _decode_line(line, out)


# Byte-identical to json.dumps, which writes ints with int.__repr__, floats with
# float.__repr__ and (with its default ensure_ascii) strings with encode_basestring_ascii.
def _number(x: float, name: str) -> str:
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x!r}")
    return repr(x)


def encode(req: Request) -> bytes:
    """Encode ``req`` as one wire line, newline included.

    Without extension fields the bytes are exactly torch's ``FileTimerRequest.to_json()``
    plus ``"\\n"`` (a release is written with ``"expiration_time": -1`` as torch does).

    Raises:
        RequestTooLargeError: the line, newline included, exceeds ``PIPE_BUF`` bytes.
        ValueError: a number is not finite.
    """
    expiration = "-1" if req.is_release else _number(req.expiration_time, "expiration_time")
    text = (
        f'{{"version": {PROTOCOL_VERSION}, "pid": {int(req.pid)}, '
        f'"scope_id": {encode_basestring_ascii(req.scope_id)}, '
        f'"expiration_time": {expiration}, "signal": {int(req.signal)}'
    )
    if req.mono is not None:
        text += f', "mono": {_number(req.mono, "mono")}'
    if req.start_time is not None:
        text += f', "start_time": {int(req.start_time)}'
    if req.grace is not None:
        text += f', "grace": {_number(req.grace, "grace")}'
    if req.group:
        text += ', "group": true'
    if req.dump:
        text += ', "dump": true'
    data = (text + "}\n").encode("ascii")
    if len(data) > PIPE_BUF:
        raise RequestTooLargeError(
            f"request line is {len(data)} bytes (newline included) but at most "
            f"{PIPE_BUF} bytes can be written atomically; use a shorter scope_id"
        )
    return data


# -- the hot path: both lines of one block --------------------------------------------
#
# A block's two lines share everything up to the expiration time:
#
#   {"version": 1, "pid": P, "scope_id": S, "expiration_time": E, "signal": N, "mono": M,
#    "start_time": T}    (the last key only when the encoder was given a start time)
#   {"version": 1, "pid": P, "scope_id": S, "expiration_time": -1, "signal": 0}
#
# block_encoder(P, N) encodes the parts that depend on P and N once; its encode_block()
# then escapes S once for both lines and joins the pieces. The numbers cost most:
# float.__repr__ (what json.dumps writes) runs David Gay's dtoa on big integers, ~0.5 us
# per float. msgspec writes floats with Ryu, ~0.06 us: the same digits (both print the
# shortest string that reads back as the same float, and of those the one closest to
# it), and for 1e-4 <= x < 1e16 the same notation as repr (plain decimal, ".0" when
# integral; outside it, repr switches to "1e-05" / "1e+16" and msgspec to "1e-5" /
# "1e16"). So E and M take msgspec's path inside that range, and a block falls back to
# encode() outside it (also for NaN and infinities, which encode() refuses) and for
# lines too long (encode() raises the error). tests/test_protocol.py pins the equality.

#: ``encode_block(scope_id, expiration_time, mono) -> (acquire line, release line)``.
BlockEncoder = Callable[[str, float, float], tuple[bytes, bytes]]

_ryu: Final = msgspec.json.encode
_join: Final = b"".join


def block_encoder(pid: int, signal: int, start_time: int | None = None) -> BlockEncoder:
    """The hot-path encoder of the timed blocks of process ``pid`` reaped with ``signal``.

    The returned ``encode_block(scope_id, expiration_time, mono)`` gives the acquire and
    the release line of one block, newlines included: byte for byte
    ``encode(Request(pid, scope_id, expiration_time, signal, mono=mono,
    start_time=start_time))`` and ``encode(Request(pid, scope_id, -1, 0))``, about four
    times faster (see the comment above). It raises what :func:`encode` raises.
    """
    head = f'{{"version": {PROTOCOL_VERSION}, "pid": {int(pid)}, "scope_id": '.encode()
    signal_part = f', "signal": {int(signal)}, "mono": '.encode()
    tail = b"}\n" if start_time is None else f', "start_time": {int(start_time)}}}\n'.encode()

    def encode_block(scope_id: str, expiration_time: float, mono: float) -> tuple[bytes, bytes]:
        if 1e-4 <= expiration_time < 1e16 and 1e-4 <= mono < 1e16:  # literals: the hot path
            scope = encode_basestring_ascii(scope_id).encode()
            acquire = _join(
                (
                    head,
                    scope,
                    b', "expiration_time": ',
                    _ryu(expiration_time),
                    signal_part,
                    _ryu(mono),
                    tail,
                )
            )
            if len(acquire) <= PIPE_BUF:
                return acquire, _join((head, scope, b', "expiration_time": -1, "signal": 0}\n'))
        return (
            encode(
                Request(pid, scope_id, expiration_time, signal, mono=mono, start_time=start_time)
            ),
            encode(Request(pid, scope_id, -1, 0)),
        )

    return encode_block
