"""The event record every event derives from, and the helpers their logged forms share.

Every event has the wall-clock ``time`` it happened (epoch seconds) and a class-level
``kind`` (a short stable string, also the ``"event"`` key of :meth:`Event.to_dict`).
Long texts (stack dumps) are kept whole in the event objects; their logged forms
(:meth:`Event.to_dict` and :meth:`Event.describe`) are cut at :data:`MAX_LOGGED_TEXT`
characters with a note saying how much was left out.
"""

from __future__ import annotations

import ast
import dataclasses
import logging
import re
import signal as _signal
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import msgspec

__all__ = [
    "MAX_LINE_SCOPE",
    "MAX_LINE_TEXT",
    "MAX_LOGGED_TEXT",
    "MAX_REPORTED_SCOPES",
    "Event",
    "clip",
    "clip_scope",
    "clip_text",
    "holding_task",
    "scope_list",
    "signal_name",
]


#: The most scope ids one event lists (a worker may hold many timers; the rest are
#: counted in the event's ``omitted``).
MAX_REPORTED_SCOPES: Final[int] = 100
#: The most characters of one text field (a stack dump) that logs and the event log get.
MAX_LOGGED_TEXT: Final[int] = 64 * 1024
#: The most characters of a free text (a reason, an action, a rejected line) in a
#: one-line description; longer ones end in "...".
MAX_LINE_TEXT: Final[int] = 120
#: The most characters of a scope id or a task name in a one-line description.
MAX_LINE_SCOPE: Final[int] = 60
#: How many scope ids a one-line description lists (then how many in all).
_LISTED_SCOPES: Final[int] = 3
# The line of a worker's asyncio dump that names the task holding its loop (written by
# aiotimer.client._task_stacks): the task's repr'd name, then its open blocks.
_HELD_BY: Final = re.compile(
    r"^The loop is held by task ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")"  # repr of its name
    r"(?:, in aiotimer block\(s\) ([^,\n]+))?",  # its first open block
    re.MULTILINE,
)


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


def clip(text: str, limit: int = MAX_LINE_TEXT) -> str:
    """``text`` cut to ``limit`` characters, ending in ``...`` when it was cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def clip_scope(scope_id: str) -> str:
    """A scope id (or a task name) as a one-line description quotes it: ``repr``'d, at
    most :data:`MAX_LINE_SCOPE` characters of it."""
    return repr(clip(scope_id, MAX_LINE_SCOPE))


def scope_list(scopes: tuple[str, ...], omitted: int = 0) -> str:
    """The first scope ids of ``scopes`` (each clipped), and how many in all when there
    are more: bounded, however many a worker held."""
    shown = ", ".join(clip(s, MAX_LINE_SCOPE) for s in scopes[:_LISTED_SCOPES])
    total = len(scopes) + omitted
    return shown + (f", ... ({total} in all)" if total > _LISTED_SCOPES else "")


def holding_task(stacks: str | None) -> tuple[str, str | None] | None:
    """The task that held the worker's event loop, and the first of its open blocks,
    when the worker's stack dump names them (``The loop is held by task 'Task-201', in
    aiotimer block(s) ...``: an asyncio worker's dump hook writes it); ``None`` when it
    does not."""
    if not stacks:
        return None
    found = _HELD_BY.search(stacks)
    if found is None:
        return None
    try:
        task = ast.literal_eval(found.group(1))
    except (ValueError, SyntaxError):
        return None
    block = found.group(2)
    return str(task), None if block is None else block.strip()


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

    def log_level(self) -> int:
        """The :mod:`logging` level to log this event at: :attr:`level`, unless this
        event's fields say otherwise (a worker stopped on purpose is no warning)."""
        return self.level

    def describe(self) -> str:
        """One human-readable line (the log message)."""
        return self.kind
