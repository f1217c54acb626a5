"""Where a timed block is in its life, and what a block out of turn is told.

The states of :class:`~aiotimer.client._block.Expires` (see that module's docs for the
chart), as an enum compared by identity with module constants (a global lookup, not an
attribute of the enum class: the block's hot path compares them), and the
``RuntimeError`` for a transition out of turn, naming the block, its state and what to
do instead.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = [
    "CREATED",
    "ENTERED",
    "EXITED",
    "EXPIRED",
    "EXPIRING",
    "TEMPLATE",
    "State",
    "misuse",
]


class State(enum.Enum):
    """Where an :class:`~aiotimer.client._block.Expires` is in its life."""

    CREATED = "created"
    ENTERED = "active"
    EXPIRING = "expiring"
    EXPIRED = "expired"
    EXITED = "exited"
    TEMPLATE = "template"


CREATED: Final = State.CREATED
ENTERED: Final = State.ENTERED
EXPIRING: Final = State.EXPIRING
EXPIRED: Final = State.EXPIRED
EXITED: Final = State.EXITED
TEMPLATE: Final = State.TEMPLATE
#: Why a block in each state cannot do what it was asked (the misuse errors).
_WHY_NOT: Final = {
    CREATED: "it was never entered",
    ENTERED: "it is running",
    EXPIRING: "its deadline passed and its task is being cancelled",
    EXPIRED: "it has ended at its deadline",
    EXITED: "it has ended",
    TEMPLATE: "it decorates a function, whose every call is a block of its own",
}
#: What to do instead, by what was asked.
_INSTEAD: Final = {
    "enter": "a block can be entered only once: make a fresh expires() for each",
    "exit": "a block is left once, after it was entered",
    "reschedule": "only a running block can move its deadline",
    "decorate": "decorate with a fresh expires()",
}


def misuse(block: object, state: State, action: str) -> RuntimeError:
    """The error for asking ``block``, in ``state``, to ``action`` (a key of the
    instructions: ``enter``, ``exit``, ``reschedule``, ``decorate``)."""
    return RuntimeError(f"{block!r} cannot {action}: {_WHY_NOT[state]} ({_INSTEAD[action]})")
