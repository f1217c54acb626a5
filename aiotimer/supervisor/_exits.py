"""How a worker process ended, in words a restart policy can act on: succeeded, crashed,
killed by a signal, reaped by its timer, or stopped by the supervisor; and what became
of a rank's attempts, told in one line (:func:`attempt_story`). Pure."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from aiotimer.events import MAX_LINE_SCOPE, clip, exit_phrase

__all__ = [
    "KEPT_SCOPES",
    "ExitKind",
    "ExitReason",
    "attempt_story",
    "classify_exit",
    "ending_word",
]


class ExitKind(enum.Enum):
    """Why an attempt ended."""

    SUCCEEDED = "succeeded"  #: exit code 0
    CRASHED = "crashed"  #: a non-zero exit code
    SIGNALLED = "signalled"  #: killed by a signal the timer did not send
    REAPED = "reaped"  #: reaped by the timer server (its timer expired)
    STOPPED = "stopped"  #: the supervisor stopped it


#: The most scope ids an :class:`ExitReason` keeps (the rest are counted): a reaped
#: worker may have held thousands of blocks, and its reason is shown on one line.
KEPT_SCOPES: Final[int] = 3


@dataclass(frozen=True, slots=True)
class ExitReason:
    """Why an attempt ended: its kind and exit code or signal; for a reap, the first
    (at most :data:`KEPT_SCOPES`, each clipped) of the worker's open blocks, the
    culprit's first, ``omitted`` how many more there were, and ``task`` the task that
    held its loop when its stack dump said so."""

    kind: ExitKind
    exit_code: int | None = None
    signal: int | None = None
    scopes: tuple[str, ...] = ()
    omitted: int = 0
    task: str | None = None

    def describe(self) -> str:
        """A short phrase (:func:`~aiotimer.events.exit_phrase`), e.g.
        ``"reaped (SIGKILL): block 'step' outlived its timer"``."""
        return exit_phrase(
            self.kind.value,
            self.exit_code,
            self.signal,
            scopes=self.scopes,
            omitted=self.omitted,
            task=self.task,
        )


def classify_exit(
    returncode: int,
    *,
    reaped_scopes: tuple[str, ...] | None = None,
    stopped: bool = False,
    omitted: int = 0,
    culprit: tuple[str, str | None] | None = None,
) -> ExitReason:
    """The :class:`ExitReason` of an attempt.

    Args:
        returncode: as :mod:`subprocess` reports it (``-N`` for signal ``N``).
        reaped_scopes: the worker's open blocks when the timer server reaped it, the
            expired one first (``None`` if it did not reap it). A reap wins: it is the
            most telling reason, even for a worker the supervisor was stopping meanwhile.
        stopped: the supervisor itself stopped the attempt.
        omitted: how many more blocks were open than ``reaped_scopes`` lists.
        culprit: the task that held the worker's loop and its block, when the reap's
            stack dump named them: that block is listed first.
    """
    code, sig = (None, -returncode) if returncode < 0 else (returncode, None)
    if reaped_scopes is not None:
        task = None
        if culprit is not None:
            task, block = culprit
            if block is not None:
                total = len(reaped_scopes) + omitted
                reaped_scopes = (block, *(s for s in reaped_scopes if s != block))
                omitted = max(0, total - len(reaped_scopes))
        kept = tuple(clip(s, MAX_LINE_SCOPE) for s in reaped_scopes[:KEPT_SCOPES])
        omitted += len(reaped_scopes) - len(kept)
        return ExitReason(ExitKind.REAPED, code, sig, kept, omitted, task)
    if stopped:
        kind = ExitKind.STOPPED
    elif sig is not None:
        kind = ExitKind.SIGNALLED
    else:
        kind = ExitKind.SUCCEEDED if code == 0 else ExitKind.CRASHED
    return ExitReason(kind, code, sig)


#: How many spans of like endings a story tells before it cuts the middle out.
_STORY_SPANS: Final[int] = 8


def ending_word(phrase: str) -> str:
    """The first word of an exit phrase (:func:`~aiotimer.events.exit_phrase`): what
    became of the attempt, ``"reaped"``, ``"crashed"``, ``"killed"``, ``"stopped"``,
    ``"succeeded"``."""
    return phrase.split(" ", 1)[0]


def attempt_story(endings: Sequence[str], last: str | None = None) -> str:
    """What became of a rank's attempts, oldest first, in one line: like endings in a row
    told once with their count, a restart between them, the last one told whole.

    ``endings`` are the attempts' words (:func:`ending_word`); ``last`` the last one's
    whole phrase (default: its word).

    >>> attempt_story(["reaped", "succeeded"], "succeeded (exit code 0)")
    'reaped, restarted, then succeeded (exit code 0)'
    >>> attempt_story(["crashed"] * 74 + ["stopped"])
    'crashed 74 times, restarted, then stopped'
    """
    if not endings:
        return "-"
    spans: list[list[Any]] = []
    for word in endings[:-1]:
        if spans and spans[-1][0] == word:
            spans[-1][1] += 1
        else:
            spans.append([word, 1])
    told = [w if n == 1 else f"{w} {n} times" for w, n in spans]
    if len(told) > _STORY_SPANS:
        cut = len(told) - _STORY_SPANS + 1
        told = [*told[:2], f"... ({cut} more)", *told[-(_STORY_SPANS - 3) :]]
    final = last if last is not None else endings[-1]
    return ", restarted, ".join([*told, ""]) + "then " + final if told else final
