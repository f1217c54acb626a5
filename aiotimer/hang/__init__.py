"""Hang reports: which rank is the odd one out when a job hangs.

When a timer expires under a group (or job) restart scope, every rank's stacks are taken
before anything is killed (:class:`HangReporter`, with the server's reap policy
:class:`DumpFirstPolicy` so the reaped rank's own stacks come first), read into frames
(:func:`parse_stacks`) and grouped by where each rank is (:func:`build_report`, pure):
a :class:`HangReport` of :class:`RankGroup` s, each rank's :class:`RankStacks`. The
cluster layer (:mod:`aiotimer.cluster`) builds the same report over every node of a job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiotimer._faces import face_getattr
from aiotimer.hang._parse import Frame, ParsedStacks, parse_stacks
from aiotimer.hang._report import (
    MAX_RANK_TEXT,
    MAX_REPORT_TEXT,
    HangReport,
    RankGroup,
    RankStacks,
    build_report,
)

if TYPE_CHECKING:
    from aiotimer.hang._reporter import (
        DEFAULT_HANG_REPORT_TIMEOUT,
        DumpFirstPolicy,
        HangReporter,
        RankProcess,
        open_scopes,
    )

__all__ = [
    "DEFAULT_HANG_REPORT_TIMEOUT",
    "MAX_RANK_TEXT",
    "MAX_REPORT_TEXT",
    "DumpFirstPolicy",
    "Frame",
    "HangReport",
    "HangReporter",
    "ParsedStacks",
    "RankGroup",
    "RankProcess",
    "RankStacks",
    "build_report",
    "open_scopes",
    "parse_stacks",
]

#: The reporter (anyio, the reapers) loads on first use: reading a report needs none of it.
_LAZY: Final[dict[str, str]] = {
    "DEFAULT_HANG_REPORT_TIMEOUT": "aiotimer.hang._reporter",
    "DumpFirstPolicy": "aiotimer.hang._reporter",
    "HangReporter": "aiotimer.hang._reporter",
    "RankProcess": "aiotimer.hang._reporter",
    "open_scopes": "aiotimer.hang._reporter",
}

__getattr__, __dir__ = face_getattr("aiotimer.hang", globals(), lazy=_LAZY)
