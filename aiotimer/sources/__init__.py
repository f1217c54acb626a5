"""Request sources: the transports requests arrive on."""

from __future__ import annotations

from aiotimer.sources._base import RequestSink, Source

__all__ = ["RequestSink", "Source"]
