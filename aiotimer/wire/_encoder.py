"""Encoding requests as wire lines, byte for byte what torch writes; and the hot-path
encoder of a timed block's two lines. Pure: no I/O."""

from __future__ import annotations

import math
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from typing import Final

import msgspec

from aiotimer.wire._request import PIPE_BUF, PROTOCOL_VERSION, Request, RequestTooLargeError

__all__ = ["BlockEncoder", "block_encoder", "encode", "fits_block_encoder"]


# Byte-identical to json.dumps, which writes ints with int.__repr__, floats with
# float.__repr__ and (with its default ensure_ascii) strings with encode_basestring_ascii.
def _number(x: float, name: str) -> str:
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x!r}")
    return repr(x)


#: The keys written above one by one, in the order torch's and aiotimer's clients have
#: always written them; any other key of :class:`Request` is written after them, in the
#: record's order, when it is not ``None`` or ``False`` (its default).
_KNOWN_KEYS: Final = frozenset(
    {"version", "pid", "scope_id", "expiration_time", "signal", "mono", "start_time"}
    | {"grace", "group", "dump", "kill_after", "cancelled"}
)
_LATER_KEYS: Final = tuple(f for f in Request.__struct_fields__ if f not in _KNOWN_KEYS)


_struct_json: Final = msgspec.json.Encoder().encode


def _value(value: object, name: str) -> str:
    """``value`` as ``json.dumps`` writes it (a bool, int, float or string)."""
    if value is True:
        return "true"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return _number(value, name)
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    if isinstance(value, msgspec.Struct):  # a nested record (``learned``): compact JSON
        return _struct_json(value).decode()
    raise TypeError(f"{name}: cannot encode {type(value).__name__} on the wire")


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
    if req.kill_after is not None:
        text += f', "kill_after": {_number(float(req.kill_after), "kill_after")}'
    if req.cancelled:
        text += ', "cancelled": true'
    for name in _LATER_KEYS:  # keys added to the record since: as json.dumps writes them
        value = getattr(req, name)
        if value is not None and value is not False:
            text += f", {encode_basestring_ascii(name)}: {_value(value, name)}"
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
#    "start_time": T, "dump": true, "kill_after": K}   (each of the last three only when
#    the encoder was given it: they are the same for every block it encodes)
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


#: The keys a block encoder writes (or that its line leaves at their defaults by
#: construction): a request with any other key set needs :func:`encode`.
_BLOCK_KEYS: Final = frozenset(
    {"version", "pid", "scope_id", "expiration_time", "signal", "mono", "start_time"}
    | {"dump", "kill_after", "cancelled"}
)
_OTHER_KEYS: Final = tuple(
    (name, default)
    for name, default in zip(
        Request.__struct_fields__[-len(Request.__struct_defaults__) :],
        Request.__struct_defaults__,
        strict=True,
    )
    if name not in _BLOCK_KEYS
)


def fits_block_encoder(request: Request) -> bool:
    """Whether a :func:`block_encoder` can write ``request``'s acquire: every key it
    does not write (``grace``, ``group``, and any key added to :class:`Request` since)
    is at its default. A client's ``send()`` takes its fast path only then, so a new
    key is never dropped on the way."""
    return all(getattr(request, name) == default for name, default in _OTHER_KEYS)


def block_encoder(
    pid: int,
    signal: int,
    start_time: int | None = None,
    *,
    dump: bool = False,
    kill_after: float | None = None,
) -> BlockEncoder:
    """The hot-path encoder of the timed blocks of process ``pid`` reaped with ``signal``.

    The returned ``encode_block(scope_id, expiration_time, mono)`` gives the acquire and
    the release line of one block, newlines included: byte for byte
    ``encode(Request(pid, scope_id, expiration_time, signal, mono=mono,
    start_time=start_time, dump=dump, kill_after=kill_after))`` and
    ``encode(Request(pid, scope_id, -1, 0))``, about four times faster (see the comment
    above). It raises what :func:`encode` raises.
    """
    head = f'{{"version": {PROTOCOL_VERSION}, "pid": {int(pid)}, "scope_id": '.encode()
    signal_part = f', "signal": {int(signal)}, "mono": '.encode()
    started = "" if start_time is None else f', "start_time": {int(start_time)}'
    if dump:
        started += ', "dump": true'
    if kill_after is not None:
        started += f', "kill_after": {_number(float(kill_after), "kill_after")}'
    tail = (started + "}\n").encode()

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
        acquire_request = Request(
            pid,
            scope_id,
            expiration_time,
            signal,
            mono=mono,
            start_time=start_time,
            dump=dump,
            kill_after=kill_after,
        )
        return encode(acquire_request), encode(Request(pid, scope_id, -1, 0))

    return encode_block
