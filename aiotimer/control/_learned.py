"""The learned timeouts in the human status view: one row per learned scope."""

from __future__ import annotations

from collections.abc import Sequence

from aiotimer.core import LearnedSummary, format_seconds

__all__ = ["format_learned"]


def format_learned(scopes: Sequence[LearnedSummary]) -> list[str]:
    """The learned scopes under their heading (no lines when there are none): each
    scope's samples, the timeout in force and its ``initial`` (``learning``: still in
    its warm-up, timed at ``initial``)."""
    if not scopes:
        return []
    rows = [("LEARNED SCOPE", "SAMPLES", "IN FORCE", "INITIAL")]
    for s in scopes:
        value = format_seconds(s.value) + (" (learning)" if s.learning else "")
        rows.append((s.site, f"{s.samples:,}", value, format_seconds(s.initial)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
