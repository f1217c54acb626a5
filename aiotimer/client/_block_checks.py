"""What a block is refused for when it is made: whatever the server would reject.

A block the server would reject would run with no timer at all, so :class:`~aiotimer.
client._block.Expires` refuses it at creation with ``ValueError``, by the wire
validator's own rules and messages (:mod:`aiotimer.wire._request`). This module holds
what makes the common cases cheap: the explicit scope ids already found valid, and the
one comparison that accepts exactly the numbers the validator accepts.
"""

from __future__ import annotations

import sys
import time
from typing import Final

from aiotimer.wire import Learned, number_problem, scope_id_problem

__all__ = [
    "MAX_DEADLINE_AHEAD",
    "MAX_FLOAT",
    "MAX_VALID_SCOPES",
    "argument_type_error",
    "deadline_problem",
    "scope_checked",
    "valid_scopes",
]

#: An ``expires_at`` deadline further ahead than this (on ``time.monotonic()``) is taken
#: for what it almost surely is, an epoch time (``time.time()``, ~56 years ahead).
MAX_DEADLINE_AHEAD: Final[float] = 10 * 365.25 * 86400.0
#: The largest finite float: ``0 <= x <= MAX_FLOAT`` holds exactly for the numbers
#: ``number_problem(name, x, minimum=0)`` accepts (finite, not negative).
MAX_FLOAT: Final = sys.float_info.max
#: Explicit scope ids already found valid (a program names few, each many times).
valid_scopes: set[str] = set()
#: Past this many explicit scope ids the set starts over (ids built on the fly).
MAX_VALID_SCOPES: Final = 1024


def scope_checked(scope: str) -> str | None:
    """:func:`~aiotimer.wire.scope_id_problem`, remembering the valid ids in
    :data:`valid_scopes`."""
    problem = scope_id_problem(scope)
    if problem is None:
        if len(valid_scopes) >= MAX_VALID_SCOPES:
            valid_scopes.clear()
        valid_scopes.add(scope)
    return problem


def deadline_problem(deadline: float) -> str | None:
    """What is wrong with ``deadline`` as an ``expires_at`` deadline, or ``None``."""
    problem = number_problem("deadline", deadline)
    if problem is None and deadline - time.monotonic() > MAX_DEADLINE_AHEAD:
        years = (deadline - time.monotonic()) / (365.25 * 86400.0)
        problem = (
            f"deadline {deadline!r} is {years:.0f} years ahead on time.monotonic(), more than "
            f"MAX_DEADLINE_AHEAD ({MAX_DEADLINE_AHEAD:.0f} s): it looks like an epoch time "
            "(time.time()); expires_at() takes a time.monotonic() deadline: "
            "expires_at(time.monotonic() + seconds), or use expires(after=seconds)"
        )
    return problem


#: What each argument of ``expires()``/``expires_at()`` takes, in words.
_TAKES: Final[dict[str, tuple[type | tuple[type, ...], str]]] = {
    "after": ((int, float, Learned), "a number of seconds (int or float) or learned(...)"),
    "deadline": ((int, float), "a time.monotonic() deadline (int or float)"),
    "scope": (str, "a str"),
    "signal": (int, "an int signal number (e.g. signal.SIGTERM) or None"),
    "kill_after": ((int, float), "a number of seconds (int or float) or None"),
}


def argument_type_error(function: str, **given: object) -> TypeError | None:
    """A :class:`TypeError` naming the first argument in ``given`` of a type ``function``
    does not take, and the type it takes (``expires(): after must be a number of seconds
    (int or float), got str '10'``); ``None`` when every one is of a right type. ``after``
    and ``deadline`` may not be ``None``; the others may (their default)."""
    for name, value in given.items():
        types, words = _TAKES[name]
        if value is None and name not in ("after", "deadline"):
            continue
        if not isinstance(value, types) or (name == "signal" and isinstance(value, bool)):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            return TypeError(
                f"{function}(): {name} must be {words}, got {type(value).__name__} {shown}"
            )
    return None
