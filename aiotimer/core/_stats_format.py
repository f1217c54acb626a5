"""Plain-text rendering of durations and of the per-site statistics table."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from aiotimer.core._stats import ScopeStats

__all__ = ["format_seconds", "format_summaries"]


def format_seconds(seconds: float | None) -> str:
    """A short rendering of a duration: ``"850us"``, ``"12.3ms"``, ``"1.50s"``, ``"-"``."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}us"
    if seconds < 1:
        return f"{seconds * 1e3:.3g}ms"
    return f"{seconds:.3g}s" if seconds < 100 else f"{seconds:.0f}s"


_COLUMNS: Final = ("site", "count", "p50", "p99", "max", "expired", "longest", "suggested")


def format_summaries(summaries: Iterable[ScopeStats]) -> str:
    """A plain-text table of site summaries, one row per site, with a header line.

    ``longest`` is the longest an expired timer of the site had run (a lower bound of
    that block's duration); ``suggested`` is :func:`suggest_timeout`.
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
    return "\n".join(lines) + "\n"
