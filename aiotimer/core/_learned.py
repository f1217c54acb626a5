"""Learned timeouts: per scope, the timeout in force, learned from the scope's durations.
Pure: no I/O, no clock.

The rule
--------
A scope (its site, :func:`~aiotimer.core._scope.scope_site`: every block of one explicit
scope id, or of one ``file.py:LINE``) keeps a
:class:`~aiotimer.core._sketch.DurationSketch` of its durations and a *learned value*
``v``. For a block whose spec (:class:`~aiotimer.wire.Learned`) is ``initial``,
``factor``, ``floor``, ``warmup`` and ``quantile``:

* **warm-up**: until the scope has ``warmup`` durations, the value in force is
  ``initial`` (a scope whose value was learned before, by a previous server or by
  another node of the job, :meth:`LearnedTimeouts.widen`, starts from that value);
* **in force**: then it is ``clamp(v) = min(initial, max(floor, v))``: never above
  ``initial``, never below ``floor``;
* **each duration** ``d`` (a block's real duration: for a learned block, from its own
  start to its release's arrival at the server) goes into the sketch; from the
  ``warmup``-th on (or at once, for a scope learned before), the *wanted* value is
  ``w = clamp(factor x max(Q, d))`` with ``Q`` the sketch's ``quantile`` (1: the observed
  maximum, exact), and

  - it **widens at once**: if ``w >= v``, then ``v = w``;
  - it **tightens slowly**: else ``v = max(w, v x (1 - TIGHTEN_STEP))``, at most
    :data:`TIGHTEN_STEP` (5%) per sample, so from ``initial`` down to ``w`` takes
    ``ln(initial / w) / -ln(0.95)`` samples (~20 per halving): a value rests on at least
    ``warmup`` plus that many durations, and a phase change (an evaluation, a
    checkpoint in the same scope) that lasts longer than ``v`` is met by a value still
    high from the longest duration seen, then widened by its first long block.

  Before the first sample past the warm-up ``v`` is ``initial`` (tightening starts there).

An expiry is not a duration (the block may be hung: its length is unknown), so a reap
never widens the value; a block that expired unreaped (report only, shadow mode) and
ended later gives its real duration, which does. A duration longer than the value in
force but shorter than ``initial`` is a block this rule would have reaped and a fixed
``initial`` would not: :meth:`LearnedScope.observe` says so (``would_reap``), and the
server reports it (:class:`~aiotimer.events.LearnedWouldReap`).

The error bound: ``Q`` is within the sketch's relative error (1%) of the exact
nearest-rank quantile, and the observed maximum is exact; against a ``factor`` of 5 a 1%
error is immaterial.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import msgspec

from aiotimer.core._scope import scope_site
from aiotimer.core._sketch import DurationSketch, SketchState
from aiotimer.wire import Learned

__all__ = [
    "MAX_LEARNED_SITES",
    "TIGHTEN_STEP",
    "LearnedScope",
    "LearnedScopeState",
    "LearnedSummary",
    "LearnedTimeouts",
    "Observed",
]

#: The most a learned value tightens per sample (a fraction of it).
TIGHTEN_STEP: Final[float] = 0.05
#: The most scopes learned at once; a block of a further scope is timed at ``initial``.
MAX_LEARNED_SITES: Final[int] = 10_000


@dataclass(frozen=True, slots=True)
class Observed:
    """What one duration did to a scope: its value in force before and after, and
    whether the duration is one the value before would have reaped (longer than it,
    shorter than ``initial``)."""

    before: float
    after: float
    would_reap: bool


@dataclass(frozen=True, slots=True)
class LearnedSummary:
    """One learned scope as shown (status, metrics, the snapshot): its site, its
    durations so far, the value in force for its last spec and that spec's ``initial``."""

    site: str
    samples: int
    value: float
    initial: float
    learning: bool
    """True while still in its warm-up (the value in force is ``initial``)."""


class LearnedScopeState(msgspec.Struct, frozen=True, kw_only=True):
    """A :class:`LearnedScope` as plain data (to save, and to merge back)."""

    sketch: SketchState
    value: float | None = None
    spec: Learned | None = None


class LearnedScope:
    """One scope's learned value (see the module docs)."""

    __slots__ = ("sketch", "spec", "value")

    def __init__(self, spec: Learned | None = None, relative_error: float = 0.01) -> None:
        self.sketch = DurationSketch(relative_error)
        #: The learned value before clamping; ``None`` until the warm-up is over.
        self.value: float | None = None
        #: The spec of the scope's last learned block (how it is shown).
        self.spec = spec

    @property
    def samples(self) -> int:
        """Durations recorded."""
        return self.sketch.count

    def in_force(self, spec: Learned) -> float:
        """The timeout of a block of this scope with ``spec``, in seconds."""
        return spec.initial if self.value is None else spec.clamp(self.value)

    def observe(self, duration: float, spec: Learned) -> Observed:
        """Record one block's real ``duration`` (seconds, ``>= 0``) and apply the rule."""
        before = self.in_force(spec)
        sketch = self.sketch
        sketch.add(duration)
        if sketch.count >= spec.warmup or self.value is not None:
            q = sketch.quantile(spec.quantile)
            assert q is not None  # a sample was just added
            wanted = spec.clamp(spec.factor * max(q, duration))
            value = spec.initial if self.value is None else spec.clamp(self.value)
            self.value = wanted if wanted >= value else max(wanted, value * (1 - TIGHTEN_STEP))
        return Observed(before, self.in_force(spec), before < duration < spec.initial)

    def widen_to(self, value: float) -> None:
        """Take a value learned elsewhere (another node of the job) if it is wider."""
        if self.value is None or value > self.value:
            self.value = value

    def to_state(self) -> LearnedScopeState:
        """This scope as plain data."""
        return LearnedScopeState(sketch=self.sketch.to_state(), value=self.value, spec=self.spec)

    def merge_state(self, state: LearnedScopeState) -> None:
        """Add a saved scope's durations, and keep the wider of the two values."""
        self.sketch.merge_state(state.sketch)
        if state.value is not None:
            self.widen_to(state.value)
        if self.spec is None:
            self.spec = state.spec

    def summary(self, site: str) -> LearnedSummary | None:
        """How this scope is shown; ``None`` before a learned block named its spec."""
        spec = self.spec
        if spec is None:
            return None
        learning = self.value is None
        return LearnedSummary(site, self.sketch.count, self.in_force(spec), spec.initial, learning)


class LearnedTimeouts:
    """Every learned scope of a server, by site (see the module docs). Not thread-safe.

    A scope is learned once a block of it came with a spec (:meth:`in_force`); from
    then on every duration of the scope counts, learned block or not. At most
    ``max_sites`` scopes: a block of another scope is timed at its ``initial``.
    """

    __slots__ = ("_by_scope", "_max_sites", "_sites")

    def __init__(self, *, max_sites: int = MAX_LEARNED_SITES) -> None:
        if max_sites < 1:
            raise ValueError(f"max_sites must be >= 1, got {max_sites}")
        self._max_sites = max_sites
        self._sites: dict[str, LearnedScope] = {}
        self._by_scope: dict[str, LearnedScope] = {}  # scope id -> its site's, a cache

    def __len__(self) -> int:
        return len(self._sites)

    def __bool__(self) -> bool:
        return bool(self._sites)

    def scope(self, scope_id: str) -> LearnedScope | None:
        """The learned scope of ``scope_id``, or ``None`` if it is not learned."""
        found = self._by_scope.get(scope_id)
        if found is None:
            found = self._sites.get(scope_site(scope_id))
            if found is not None:
                if len(self._by_scope) >= 4096:
                    self._by_scope.clear()
                self._by_scope[scope_id] = found
        return found

    def in_force(self, scope_id: str, spec: Learned) -> tuple[float, int]:
        """The timeout of a block of ``scope_id`` with ``spec`` and the samples it rests
        on; the scope is learned from now on (unless ``max_sites`` are)."""
        scope = self.scope(scope_id)
        if scope is None:
            if len(self._sites) >= self._max_sites:
                return spec.initial, 0
            scope = self._sites[scope_site(scope_id)] = LearnedScope(spec)
        scope.spec = spec
        return scope.in_force(spec), scope.samples

    def observe(self, scope_id: str, duration: float) -> tuple[Observed, LearnedScope] | None:
        """Record a duration of ``scope_id`` if the scope is learned (else ``None``)."""
        scope = self.scope(scope_id)
        if scope is None or scope.spec is None:
            return None
        return scope.observe(duration, scope.spec), scope

    def summaries(self, limit: int | None = None) -> list[LearnedSummary]:
        """Every learned scope (with ``limit``: only the first ``limit``), most samples
        first, then by site."""
        sites = self._sites
        names: Iterable[str] = sites
        if limit is not None and limit < len(sites):
            names = heapq.nsmallest(limit, sites, key=lambda n: (-sites[n].samples, n))
        out = [s for name in names if (s := sites[name].summary(name))]
        out.sort(key=lambda s: (-s.samples, s.site))
        return out

    @property
    def samples(self) -> int:
        """Durations recorded in all (O(sites))."""
        return sum(scope.samples for scope in self._sites.values())

    def values(self) -> dict[str, float]:
        """Every learned value (past its warm-up), by site: what a node shares."""
        return {name: scope.value for name, scope in self._sites.items() if scope.value is not None}

    def widen(self, values: Mapping[str, float]) -> None:
        """Take the values other nodes learned where they are wider (see
        docs/architecture.md: the job's value of a scope is its widest); a scope not
        seen here yet starts from its value."""
        for name, value in values.items():
            scope = self._sites.get(name)
            if scope is None:
                if len(self._sites) >= self._max_sites:
                    continue
                scope = self._sites[name] = LearnedScope()
            scope.widen_to(value)

    def to_state(self) -> dict[str, LearnedScopeState]:
        """Every scope as plain data."""
        return {name: scope.to_state() for name, scope in self._sites.items()}

    def merge_state(self, state: dict[str, LearnedScopeState]) -> None:
        """Add saved scopes (a previous run's) to these."""
        for name, saved in state.items():
            scope = self._sites.get(name)
            if scope is None:
                if len(self._sites) >= self._max_sites:
                    continue
                scope = self._sites[name] = LearnedScope(saved.spec)
            scope.merge_state(saved)

    def __repr__(self) -> str:
        return f"<LearnedTimeouts {len(self._sites):,} scopes, {self.samples:,} samples>"
