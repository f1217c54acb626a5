"""A learned timeout's spec: what ``expires(after=learned(initial=...))`` asks the server
for, as the acquire's ``learned`` key, and its one validator. Pure: no I/O.

The block is sent with its deadline at ``initial`` seconds (what a server that does not
learn, torch's, applies); an aiotimer server that sees the key times it at the value it
learned for the block's scope instead, never later than ``initial`` (the rule:
:mod:`aiotimer.core._learned`; why the server learns: docs/architecture.md)::

    {"version": 1, "pid": 4242, "scope_id": "step", "expiration_time": 1763712030.5,
     "signal": 9, "mono": 8123.5,
     "learned": {"initial": 30.0, "factor": 5.0, "floor": 1.0, "warmup": 20, "quantile": 1.0}}

The defaults, argued in docs/clients.md ("Timeouts that learn"): ``factor`` 5 and the
observed maximum (``quantile`` 1.0) are NVIDIA's resiliency extension's choices for its
learned heartbeat timeouts; ``floor`` 1 s keeps a value above a loaded host's scheduling
noise; ``warmup`` 20 samples is the statistics' own threshold for a suggested timeout.
"""

from __future__ import annotations

import math
from typing import Final

import msgspec

__all__ = [
    "DEFAULT_FACTOR",
    "DEFAULT_FLOOR",
    "DEFAULT_INITIAL",
    "DEFAULT_QUANTILE",
    "DEFAULT_WARMUP",
    "MAX_WARMUP",
    "Learned",
    "learned",
    "learned_problem",
]

#: The timeout until the scope has ``warmup`` samples, and the most it is ever timed at.
DEFAULT_INITIAL: Final[float] = 600.0
#: The learned value is this many times the scope's high quantile (NVRx's safety factor).
DEFAULT_FACTOR: Final[float] = 5.0
#: The least a learned value can be, in seconds.
DEFAULT_FLOOR: Final[float] = 1.0
#: Durations of the scope before its value is learned rather than ``initial``.
DEFAULT_WARMUP: Final[int] = 20
#: Which quantile of the scope's durations: 1.0 is the observed maximum (exact).
DEFAULT_QUANTILE: Final[float] = 1.0
#: The most samples a warm-up may ask for.
MAX_WARMUP: Final[int] = 1_000_000
_MAX_FLOAT: Final = 1.7976931348623157e308


def _number_type(name: str, value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = type(value).__name__
        return f"learned(): {name} must be a number (int or float), got {kind} {value!r}"
    return None


def learned_problem(
    initial: float, factor: float, floor: float, warmup: int, quantile: float
) -> str | None:
    """Why these cannot be a learned timeout's spec, or ``None`` when they can: the one
    rule the client applies when the block is made and the server when it decodes the
    acquire. Each message names the argument, what it got and what is accepted."""
    if not (math.isfinite(initial) and initial > 0):
        return f"learned(): initial must be a finite number of seconds > 0, got {initial!r}"
    if not (math.isfinite(factor) and factor >= 1):
        return (
            f"learned(): factor must be a finite number >= 1 (the value is factor x the "
            f"scope's durations; below 1 it would reap healthy blocks), got {factor!r}"
        )
    if not (math.isfinite(floor) and floor >= 0):
        return f"learned(): floor must be a finite number of seconds >= 0, got {floor!r}"
    if floor > initial:
        return (
            f"learned(): floor ({floor!r}) must not be above initial ({initial!r}): the "
            "value in force lies between them"
        )
    if not 1 <= warmup <= MAX_WARMUP:
        return f"learned(): warmup must be an int in 1..{MAX_WARMUP:,} (samples), got {warmup!r}"
    if not (math.isfinite(quantile) and 0.5 <= quantile <= 1):
        return (
            f"learned(): quantile must be a number in 0.5..1 (1 is the observed maximum), "
            f"got {quantile!r}"
        )
    return None


class Learned(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A learned timeout: ``initial`` seconds until the scope has ``warmup`` durations,
    then ``max(floor, factor x the quantile of its durations)``, never above ``initial``
    (:func:`learned` makes one; see the module docs). Checked when made and when decoded
    from the wire, by :func:`learned_problem`."""

    initial: float
    factor: float = DEFAULT_FACTOR
    floor: float = DEFAULT_FLOOR
    warmup: int = DEFAULT_WARMUP
    quantile: float = DEFAULT_QUANTILE

    def __post_init__(self) -> None:
        for name in ("initial", "factor", "floor", "quantile"):
            wrong = _number_type(name, getattr(self, name))
            if wrong is not None:
                raise TypeError(wrong)
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int):
            raise TypeError(
                f"learned(): warmup must be an int (samples), got "
                f"{type(self.warmup).__name__} {self.warmup!r}"
            )
        problem = learned_problem(self.initial, self.factor, self.floor, self.warmup, self.quantile)
        if problem is not None:
            raise ValueError(problem)

    def clamp(self, seconds: float) -> float:
        """``seconds`` brought within ``[floor, initial]``."""
        return min(self.initial, max(self.floor, seconds))


def learned(
    initial: float = DEFAULT_INITIAL,
    *,
    factor: float = DEFAULT_FACTOR,
    floor: float = DEFAULT_FLOOR,
    warmup: int = DEFAULT_WARMUP,
    quantile: float = DEFAULT_QUANTILE,
) -> Learned:
    """A timeout the server learns from the scope's durations, for ``expires(after=...)``.

    >>> with expires(after=learned(initial=30), scope="step"):  # doctest: +SKIP
    ...     train_step()

    Until the scope (all the blocks of that scope on the server, of every rank and of
    earlier runs) has ``warmup`` durations, the block is timed at ``initial``; then at
    ``max(floor, factor x the quantile of its durations)``, never above ``initial``. The
    value tightens slowly (at most 5% per sample) and widens at once on a long sample.
    A server that does not learn (torch's) times the block at ``initial``.

    Args:
        initial: seconds, ``> 0``: the timeout before the scope is learned, and the most
            it is ever timed at.
        factor: ``>= 1``: the safety factor over the scope's durations.
        floor: seconds, ``0 <= floor <= initial``: the least the value can be.
        warmup: samples, ``>= 1``, before the value is learned.
        quantile: ``0.5..1``: which quantile of the durations (1: their maximum).

    Raises:
        TypeError: an argument of a wrong type (the message names it).
        ValueError: an argument out of range (the message names it and the range).
    """
    return Learned(initial=initial, factor=factor, floor=floor, warmup=warmup, quantile=quantile)
