"""Prometheus metrics over a server's own state (no second bookkeeping).

:class:`ServerCollector` is a ``prometheus_client`` custom collector: at each scrape it
asks for a :class:`MetricsSample` (:func:`sample_of` a server's
:class:`~aiotimer.server.ServerSnapshot`, taken in its loop) and turns it into metric
families. :func:`render` produces the text exposition format for ``GET /metrics``
on the control socket, at most once a second (:class:`RenderedMetrics`).

Metrics: ``aiotimer_live_timers``, ``aiotimer_workers{state}``,
``aiotimer_requests_total``, ``aiotimer_rejected_total``, ``aiotimer_cancelled_total``
(the first tier of async blocks), ``aiotimer_expired_total``,
``aiotimer_reaps_total``, ``aiotimer_reap_failures_total``,
``aiotimer_workers_exited_total``, ``aiotimer_restarts_total``,
``aiotimer_events_dropped_total``, ``aiotimer_events_undelivered_total``,
``aiotimer_cap_rejections_total``, ``aiotimer_timers_evicted_total``,
``aiotimer_rank_slowness_ratio{rank}`` (under a supervisor: each rank's slowness
against its peers, docs/stragglers.md), and the
histograms
``aiotimer_reap_latency_seconds`` (deadline -> first signal of a reap) and
``aiotimer_loop_lag_seconds`` (how late expiries were handled because the event loop
was busy elsewhere). Both run from the arrival instead of the deadline for a request
that arrived already past its deadline. Per learned scope (``expires(after=learned(...))``,
the 100 with most samples), labelled ``scope``: ``aiotimer_learned_timeout_seconds`` (the
value in force), ``aiotimer_learned_initial_seconds`` and ``aiotimer_learned_samples``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from aiotimer.core import LatencyHistogram, LearnedSummary
from aiotimer.server import ServerSnapshot

__all__ = [
    "CONTENT_TYPE",
    "MAX_AGE",
    "MetricsSample",
    "RenderedMetrics",
    "ServerCollector",
    "render",
    "sample_of",
]

#: The content type of the Prometheus text format served by :func:`render`.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Seconds a rendering is served again before a fresh one is made (see
#: :class:`RenderedMetrics`).
MAX_AGE = 1.0

# counter name -> (ServerCounters field, help)
_COUNTERS: dict[str, tuple[str, str]] = {
    "aiotimer_requests": ("requests", "Valid requests received."),
    "aiotimer_rejected": ("rejected", "Bad inputs rejected."),
    "aiotimer_cancelled": (
        "cancelled",
        "Async blocks that ended at their own deadline, their task cancelled in the worker "
        "(the first tier).",
    ),
    "aiotimer_expired": ("expired", "Timers whose (reap) deadline passed."),
    "aiotimer_reaps": ("reaped", "Reaps carried out: the last signal of each delivered."),
    "aiotimer_reap_failures": ("reap_failed", "Failed signal attempts."),
    "aiotimer_workers_exited": ("workers_exited", "Workers seen exiting."),
    "aiotimer_events_dropped": ("events_dropped", "Events the event log had no room for."),
    "aiotimer_cap_rejections": ("cap_rejected", "Acquires refused by a timer cap."),
    "aiotimer_timers_evicted": (
        "evicted",
        "Timers of the largest holder (of the user holding the most) dropped to make room in a "
        "full table.",
    ),
}


@dataclass(frozen=True, slots=True)
class MetricsSample:
    """What one scrape reports: read in the server's loop, turned into metrics by
    :class:`ServerCollector`. ``workers`` counts workers by state; ``counters`` are the
    run's counters by name."""

    live_timers: int
    workers: Mapping[str, int]
    counters: Mapping[str, int]
    reap_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    loop_lag: LatencyHistogram = field(default_factory=LatencyHistogram)
    restarts: int = 0
    undelivered: int = 0
    learned: tuple[LearnedSummary, ...] = ()
    #: Each supervised rank's slowness ratio against its peers (docs/stragglers.md).
    slowness: Mapping[int, float] = field(default_factory=dict)


def sample_of(snap: ServerSnapshot) -> MetricsSample:
    """What a scrape reports about the server ``snap`` shows: take it with
    ``by_state=True`` (its lists are not used: ``limit=0, sites=0``).

    Raises:
        ValueError: ``snap`` does not count the workers by state.
    """
    if snap.worker_states is None:
        raise ValueError("metrics need a snapshot taken with by_state=True")
    return MetricsSample(
        live_timers=snap.document.timers_total,
        workers=snap.worker_states,
        counters=snap.document.counters,
        reap_latency=snap.reap_latency,
        loop_lag=snap.loop_lag,
        undelivered=snap.undelivered,
        learned=snap.document.learned,
    )


class ServerCollector(Collector):
    """A custom collector: each :meth:`collect` reports ``sample()``."""

    def __init__(self, sample: Callable[[], MetricsSample]) -> None:
        self._sample = sample

    def collect(self) -> Iterator[Metric]:
        """The metric families of one fresh sample."""
        s = self._sample()
        yield GaugeMetricFamily("aiotimer_live_timers", "Live timers.", value=s.live_timers)
        workers = GaugeMetricFamily("aiotimer_workers", "Known workers by state.", labels=["state"])
        for state, n in sorted(s.workers.items()):
            workers.add_metric([state], n)
        yield workers
        for name, (key, text) in _COUNTERS.items():
            yield CounterMetricFamily(name, text, value=s.counters.get(key, 0))
        yield CounterMetricFamily("aiotimer_restarts", "Worker restarts.", value=s.restarts)
        slowness = GaugeMetricFamily(
            "aiotimer_rank_slowness_ratio",
            "Each rank's slowness against its peers' median (1: as fast; a straggler from 1.3).",
            labels=["rank"],
        )
        for rank, ratio in sorted(s.slowness.items()):
            slowness.add_metric([str(rank)], ratio)
        yield slowness
        yield CounterMetricFamily(
            "aiotimer_events_undelivered",
            "Events dropped for slow event subscribers or a slow async callback.",
            value=s.undelivered,
        )
        yield from _learned(s.learned)
        yield _histogram(
            "aiotimer_reap_latency_seconds",
            "Seconds from a timer's deadline to the first signal of its reap.",
            s.reap_latency,
        )
        yield _histogram(
            "aiotimer_loop_lag_seconds",
            "Seconds an expiry was handled late because the event loop was busy.",
            s.loop_lag,
        )


def _learned(scopes: tuple[LearnedSummary, ...]) -> Iterator[Metric]:
    """The learned timeouts' gauges, one sample per scope."""
    value = GaugeMetricFamily(
        "aiotimer_learned_timeout_seconds",
        "The timeout in force for a learned scope's blocks.",
        labels=["scope"],
    )
    initial = GaugeMetricFamily(
        "aiotimer_learned_initial_seconds",
        "A learned scope's initial timeout (its most).",
        labels=["scope"],
    )
    samples = GaugeMetricFamily(
        "aiotimer_learned_samples",
        "Durations a learned scope's value rests on.",
        labels=["scope"],
    )
    for scope in scopes:
        value.add_metric([scope.site], scope.value)
        initial.add_metric([scope.site], scope.initial)
        samples.add_metric([scope.site], scope.samples)
    yield value
    yield initial
    yield samples


def _histogram(name: str, text: str, h: LatencyHistogram) -> HistogramMetricFamily:
    buckets = [("+Inf" if b == float("inf") else repr(b), float(n)) for b, n in h.cumulative()]
    return HistogramMetricFamily(name, text, buckets=buckets, sum_value=h.sum)


def render(sample: Callable[[], MetricsSample]) -> bytes:
    """The Prometheus text exposition of one sample."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServerCollector(sample))
    return generate_latest(registry)


class RenderedMetrics:
    """``GET /metrics``'s body, rendered at most once per ``max_age`` seconds.

    A rendering costs the loop about a millisecond; scrapers ask every 15 s or so, so a
    churn of requests is answered from the last one instead of taking the loop from
    expiry. ``sample`` is called only when a fresh rendering is due.
    """

    def __init__(self, sample: Callable[[], MetricsSample], max_age: float = MAX_AGE) -> None:
        self._sample = sample
        self._max_age = max_age
        self._at = -math.inf
        self._body = b""

    def body(self) -> bytes:
        """The exposition, at most ``max_age`` seconds old."""
        now = time.monotonic()
        if now - self._at >= self._max_age:
            sample = self._sample()
            self._body, self._at = render(lambda: sample), now
        return self._body
