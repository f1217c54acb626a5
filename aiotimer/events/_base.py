"""The event record every event derives from, and the helpers their logged forms share.

Every event has the wall-clock ``time`` it happened (epoch seconds) and a class-level
``kind`` (a short stable string, also the ``"event"`` key of :meth:`Event.to_dict`).
Long texts (stack dumps) are kept whole in the event objects; their logged forms
(:meth:`Event.to_dict` and :meth:`Event.describe`) are cut at :data:`MAX_LOGGED_TEXT`
characters with a note saying how much was left out.
"""

from __future__ import annotations

import dataclasses
import logging
import signal as _signal
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import msgspec

__all__ = [
    "MAX_LOGGED_TEXT",
    "MAX_REPORTED_SCOPES",
    "Event",
    "clip_text",
    "scope_list",
    "signal_name",
]


#: The most scope ids one event lists (a worker may hold many timers; the rest are
#: counted in the event's ``omitted``).
MAX_REPORTED_SCOPES: Final[int] = 100
#: The most characters of one text field (a stack dump) that logs and the event log get.
MAX_LOGGED_TEXT: Final[int] = 64 * 1024


def signal_name(signum: int) -> str:
    """``"SIGKILL"`` for 9, ``"signal 0"`` for non-signals, ``"signal 77"`` if unknown."""
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def clip_text(text: str, limit: int = MAX_LOGGED_TEXT) -> str:
    """``text`` cut to ``limit`` characters, with a note saying how many were left out."""
    if len(text) <= limit:
        return text
    return (
        text[:limit] + f"\n[aiotimer: {len(text) - limit:,} more characters not logged; "
        "the event object holds the full text]\n"
    )


def _logged(value: object) -> object:
    """``value`` in its JSON-ready, logged form."""
    if isinstance(value, str):
        return clip_text(value)
    if isinstance(value, tuple):
        return [_logged(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, msgspec.Struct):
        return {k: _logged(v) for k, v in msgspec.to_builtins(value).items()}
    return value


def scope_list(scopes: tuple[str, ...], omitted: int = 0) -> str:
    """The first scope ids of ``scopes``, and how many in all when there are more."""
    shown = ", ".join(scopes[:5])
    total = len(scopes) + omitted
    return shown + (f", ... ({total} in all)" if total > 5 else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every event: when it happened (``time``, epoch seconds) and its ``kind``."""

    kind: ClassVar[str] = "event"
    #: The :mod:`logging` level the server logs this kind of event at.
    level: ClassVar[int] = logging.INFO

    time: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{"event": kind, "time": ..., <fields>}``.

        Tuples become lists, records dicts (e.g. :class:`~aiotimer.core.ScopeStats`; a
        :class:`~aiotimer.events.RankStatus` with its state's value), and texts longer
        than :data:`MAX_LOGGED_TEXT` are clipped (:func:`clip_text`).
        """
        out: dict[str, Any] = {"event": self.kind}
        for f in dataclasses.fields(self):
            out[f.name] = _logged(getattr(self, f.name))
        return out

    def describe(self) -> str:
        """One human-readable line (the log message)."""
        return self.kind
