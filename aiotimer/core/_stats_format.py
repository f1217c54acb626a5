"""Plain-text rendering of durations and of the per-site statistics table."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from aiotimer.core._stats import SUGGESTION_SAMPLES, ScopeStats

__all__ = ["format_seconds", "format_summaries"]


def format_seconds(seconds: float | None) -> str:
    """A short rendering of a duration: ``"850us"``, ``"12.3ms"``, ``"1.5s"``, ``"-"``.

    Three significant digits; a value that rounds up to the next unit is shown in it
    (``0.9996`` is ``"1s"``, never ``"1e+03ms"``).
    """
    if seconds is None:
        return "-"
    if seconds < 0.9995e-3:
        return f"{seconds * 1e6:.0f}us"
    if seconds < 0.9995:
        return f"{seconds * 1e3:.3g}ms"
    return f"{seconds:.3g}s" if seconds < 99.95 else f"{seconds:.0f}s"


_COLUMNS: Final = ("site", "count", "p50", "p99", "max", "expired", "longest", "suggested")


def format_summaries(summaries: Iterable[ScopeStats]) -> str:
    """A plain-text table of site summaries, one row per site, with a header line and
    a footer saying what ``longest`` and ``suggested`` mean.

    ``longest`` is the longest an expired block of the site ran (its real duration when
    it ended unreaped, else a lower bound: how long it had run when it expired);
    ``suggested`` is :func:`suggest_timeout`, from :data:`SUGGESTION_SAMPLES` durations
    of the site or more (``-`` below that).
    """
    rows = [list(_COLUMNS)]
    for s in summaries:
        rows.append(
            [
                s.site,
                str(s.count),
                format_seconds(s.p50),
                format_seconds(s.p99),
                format_seconds(s.max),
                str(s.expirations),
                format_seconds(s.longest_expired),
                format_seconds(s.suggested_timeout),
            ]
        )
    if len(rows) == 1:
        return "no timed blocks recorded\n"
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    lines.append(
        "longest: how long the longest expired block ran (in full if it ended unreaped, "
        "else until it expired)"
    )
    lines.append(
        f"suggested: max(1.5 x p99, 1.2 x max) rounded up, from {SUGGESTION_SAMPLES} "
        "durations or more ('-': fewer)"
    )
    return "\n".join(lines) + "\n"
