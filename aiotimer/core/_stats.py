"""Per-scope duration statistics and suggested timeouts. Pure: no I/O, no clock.

How this works
--------------
The server feeds one sample per released timer (``duration = release time - acquire
time``, on its monotonic clock) and one record per expiry. Samples are grouped by the
scope's *site*: a default scope id ``"file.py:42#17"`` belongs to site ``"file.py:42"``
(see :func:`aiotimer.core._scope.scope_site`); any other scope id is its own site.

Each site keeps a :class:`~aiotimer.core._sketch.DurationSketch` (log buckets, the DDSketch
scheme): its quantiles are within a relative error (default 1%) of the exact ones, ``count``
and ``max`` are exact, and its memory is bounded by the dynamic range of the durations, not
by their number.

The number of sites is bounded too (``max_sites``, default 10,000): once it is reached,
samples of new sites are pooled in the site :data:`OTHER_SITE`, so a client that makes
up a fresh scope id per block cannot grow the server's memory without bound.

Suggested timeout (documented rule, :func:`suggest_timeout`):
``nice_ceil(max(1.5 * p99, 1.2 * max, MIN_SUGGESTION))`` where :func:`nice_ceil` rounds
up to the next of 1, 1.5, 2, 3, 5, 7.5 times a power of ten, and only for a site with at
least :data:`SUGGESTION_SAMPLES` durations: from fewer, a p99 is only the largest of a
handful and would suggest a timeout that the next slow block exceeds. Expirations are
counted but are not durations (the true duration of a block that expired is unknown
until it ends): in report-only and shadow mode the server remembers expired timers in
:class:`Overdue` so their eventual release still yields a real duration sample
(:meth:`DurationStats.record_late`), which also becomes the site's ``longest_expired``.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import msgspec

from aiotimer.core._scope import scope_site
from aiotimer.core._sketch import DurationSketch, SketchState
from aiotimer.core._table import TimerKey

__all__ = [
    "MIN_SUGGESTION",
    "OTHER_SITE",
    "SUGGESTION_SAMPLES",
    "DurationStats",
    "Overdue",
    "ScopeStats",
    "SiteState",
    "StatsState",
    "nice_ceil",
    "suggest_timeout",
]

#: The smallest timeout ever suggested, in seconds.
MIN_SUGGESTION: Final[float] = 0.01
#: The fewest durations of a site from which a timeout is suggested.
SUGGESTION_SAMPLES: Final[int] = 20
#: How many scope ids :class:`DurationStats` remembers the site of (then it starts over).
_SCOPE_CACHE_SIZE: Final = 4096
#: The site that pools samples of new sites once ``max_sites`` is reached.
OTHER_SITE: Final[str] = "<other sites>"
#: Mantissas of the "nice" numbers suggestions are rounded up to.
_NICE: Final = (1.0, 1.5, 2.0, 3.0, 5.0, 7.5)


def nice_ceil(x: float) -> float:
    """The smallest of 1, 1.5, 2, 3, 5, 7.5 times a power of ten that is ``>= x > 0``.

    >>> nice_ceil(0.42), nice_ceil(3.0), nice_ceil(3.1), nice_ceil(8)
    (0.5, 3.0, 5.0, 10.0)
    """
    if not (x > 0 and math.isfinite(x)):
        raise ValueError(f"nice_ceil needs a finite number > 0, got {x!r}")
    exp = math.floor(math.log10(x))
    for e in (exp - 1, exp, exp + 1):  # log10 may be off by one near powers of ten
        for m in _NICE:
            candidate = float(f"{m * 10.0**e:.6g}")
            if candidate >= x:
                return candidate
    raise AssertionError("unreachable: 10 ** (exp + 1) > x")  # pragma: no cover


def suggest_timeout(p99: float, maximum: float) -> float:
    """The timeout suggested for a site: ``nice_ceil(max(1.5 p99, 1.2 max, MIN_SUGGESTION))``."""
    return nice_ceil(max(1.5 * p99, 1.2 * maximum, MIN_SUGGESTION))


@dataclass(frozen=True, slots=True)
class ScopeStats:
    """The duration statistics of one scope site: its durations (seconds) and expirations.

    ``p50``/``p99``/``max`` are ``None`` until a duration was recorded;
    ``suggested_timeout`` until :data:`SUGGESTION_SAMPLES` were. ``longest_expired`` is
    the longest an expired block of the site ran: its real duration when it ended
    unreaped (report only, shadow mode), else how long it had run when it expired (a
    lower bound); ``None`` without expirations.
    """

    site: str
    count: int
    p50: float | None
    p99: float | None
    max: float | None
    expirations: int
    longest_expired: float | None
    suggested_timeout: float | None


class SiteState(msgspec.Struct, frozen=True, kw_only=True):
    """One site of :class:`StatsState`."""

    sketch: SketchState
    expirations: int = 0
    longest_expired: float | None = None


class StatsState(msgspec.Struct, frozen=True, kw_only=True):
    """:class:`DurationStats` as plain data, to save and merge back
    (:meth:`DurationStats.to_state`, :meth:`DurationStats.merge_state`)."""

    relative_error: float
    sites: dict[str, SiteState] = {}


class _Site:
    __slots__ = ("expirations", "longest_expired", "sketch")

    def __init__(self, relative_error: float) -> None:
        self.sketch = DurationSketch(relative_error)
        self.expirations = 0
        self.longest_expired: float | None = None


class DurationStats:
    """Duration statistics per scope site, with a suggested timeout for each.

    Feed it with :meth:`record` (a released timer) and :meth:`record_expired` (an expired
    one); read it with :meth:`summary` / :meth:`summaries`. Not thread-safe.
    """

    __slots__ = ("_by_scope", "_max_sites", "_relative_error", "_sites")

    def __init__(self, *, relative_error: float = 0.01, max_sites: int = 10_000) -> None:
        if max_sites < 1:
            raise ValueError(f"max_sites must be >= 1, got {max_sites}")
        DurationSketch(relative_error)  # validates relative_error
        self._relative_error = relative_error
        self._max_sites = max_sites
        self._sites: dict[str, _Site] = {}
        # scope id -> its site, so a busy scope's id is parsed once, not per sample;
        # sites are never removed, and the cache is dropped whenever it grows too big.
        self._by_scope: dict[str, _Site] = {}

    @property
    def relative_error(self) -> float:
        """The relative error bound of every reported quantile."""
        return self._relative_error

    def _site(self, scope_id: str) -> _Site:
        site = self._by_scope.get(scope_id)
        if site is not None:
            return site
        name = scope_site(scope_id)
        site = self._sites.get(name)
        if site is None:
            site = self._new_site(name)
        if len(self._by_scope) >= _SCOPE_CACHE_SIZE:
            self._by_scope.clear()
        self._by_scope[scope_id] = site
        return site

    def _new_site(self, name: str) -> _Site:
        if len(self._sites) >= self._max_sites:
            name = OTHER_SITE
            site = self._sites.get(name)
            if site is not None:
                return site
        site = self._sites[name] = _Site(self._relative_error)
        return site

    def record(self, scope_id: str, duration: float) -> None:
        """Record that a block of ``scope_id`` ran for ``duration`` seconds (>= 0)."""
        self._site(scope_id).sketch.add(duration)

    def record_many(self, counts: Mapping[str, int], duration: float) -> None:
        """Record, for each scope id in ``counts``, that many blocks that each ran
        ``duration`` seconds (a batch's blocks begun and ended at once, say)."""
        # Summed per site first: the scope ids of a busy site are many (file:line#n).
        by_site: dict[_Site, int] = {}
        cached = self._by_scope.get
        for scope_id, count in counts.items():
            site = cached(scope_id) or self._site(scope_id)
            by_site[site] = by_site.get(site, 0) + count
        for site, count in by_site.items():
            site.sketch.add_many(duration, count)

    def record_late(self, scope_id: str, duration: float) -> None:
        """Record that a block of ``scope_id`` that expired unreaped ended after
        ``duration`` seconds: a duration, and the site's longest expired block if longer."""
        site = self._site(scope_id)
        site.sketch.add(duration)
        if site.longest_expired is None or duration > site.longest_expired:
            site.longest_expired = duration

    def record_expired(self, scope_id: str, elapsed: float) -> None:
        """Record that a timer of ``scope_id`` expired after running ``elapsed`` seconds."""
        if not (elapsed >= 0 and math.isfinite(elapsed)):
            raise ValueError(f"elapsed must be a finite number >= 0, got {elapsed!r}")
        site = self._site(scope_id)
        site.expirations += 1
        if site.longest_expired is None or elapsed > site.longest_expired:
            site.longest_expired = elapsed

    def summary(self, site: str) -> ScopeStats | None:
        """The summary of ``site`` (a site name, e.g. ``"a.py:12"``), or ``None``."""
        entry = self._sites.get(site)
        if entry is None:
            return None
        sketch = entry.sketch
        p50 = sketch.quantile(0.5)
        p99 = sketch.quantile(0.99)
        maximum = sketch.max if sketch.count else None
        suggested = None
        if p99 is not None and maximum is not None and sketch.count >= SUGGESTION_SAMPLES:
            suggested = suggest_timeout(p99, maximum)
        return ScopeStats(
            site=site,
            count=sketch.count,
            p50=p50,
            p99=p99,
            max=maximum,
            expirations=entry.expirations,
            longest_expired=entry.longest_expired,
            suggested_timeout=suggested,
        )

    def summaries(self, limit: int | None = None) -> list[ScopeStats]:
        """Every site's summary: most expirations first, then most samples, then by name.

        With ``limit``, only the first ``limit`` of them: ranking costs O(sites), but only
        those are summarised.
        """
        sites = self._sites
        if limit is not None and limit < len(sites):
            names: Iterable[str] = heapq.nsmallest(
                limit, sites, key=lambda n: (-sites[n].expirations, -sites[n].sketch.count, n)
            )
        else:
            names = sites
        out = [s for s in map(self.summary, names) if s is not None]
        out.sort(key=lambda s: (-s.expirations, -s.count, s.site))
        return out

    @property
    def samples(self) -> int:
        """Durations and expirations recorded in all (O(sites)); it grows with every one."""
        return sum(site.sketch.count + site.expirations for site in self._sites.values())

    def to_state(self) -> StatsState:
        """Every site's statistics as plain data (O(sites x buckets))."""
        return StatsState(
            relative_error=self._relative_error,
            sites={
                name: SiteState(
                    sketch=site.sketch.to_state(),
                    expirations=site.expirations,
                    longest_expired=site.longest_expired,
                )
                for name, site in self._sites.items()
            },
        )

    def merge_state(self, state: StatsState) -> None:
        """Add the statistics of ``state`` (e.g. a previous run's) to these.

        Raises:
            ValueError: ``state`` was recorded with another ``relative_error``.
        """
        if state.relative_error != self._relative_error:
            raise ValueError(
                f"statistics recorded with relative error {state.relative_error} cannot be "
                f"merged into ones with {self._relative_error}"
            )
        for name, other in state.sites.items():
            site = self._sites.get(name) or self._new_site(name)
            site.sketch.merge_state(other.sketch)
            site.expirations += other.expirations
            if other.longest_expired is not None and (
                site.longest_expired is None or other.longest_expired > site.longest_expired
            ):
                site.longest_expired = other.longest_expired

    def __len__(self) -> int:
        return len(self._sites)

    def __repr__(self) -> str:
        samples = sum(s.sketch.count for s in self._sites.values())
        return f"<DurationStats {len(self._sites):,} sites, {samples:,} samples>"


class Overdue:
    """Timers that expired but were not reaped, remembered until they are released.

    In shadow mode (and for report-only timers) an expired timer leaves the timer table,
    so its release would be an unknown key; remembering its acquire time here lets the
    server still record the block's real duration. Bounded: beyond ``capacity`` the
    oldest entries are forgotten.
    """

    __slots__ = ("_capacity", "_entries")

    def __init__(self, capacity: int = 10_000) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._entries: OrderedDict[TimerKey, float] = OrderedDict()

    def add(self, key: TimerKey, acquired_at: float) -> None:
        """Remember that timer ``key``, acquired at ``acquired_at``, expired unreaped."""
        self._entries[key] = acquired_at
        self._entries.move_to_end(key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def pop(self, key: TimerKey) -> float | None:
        """Forget ``key`` and return its acquire time, or ``None`` if unknown."""
        return self._entries.pop(key, None)

    def clear_worker(self, pid: int) -> int:
        """Forget every timer of worker ``pid`` (it exited); return how many there were."""
        keys = [k for k in self._entries if k[0] == pid]
        for k in keys:
            del self._entries[k]
        return len(keys)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries
