"""The bell's ring byte (aiotimer._edges.ring): a lead coded in one byte, never longer
than the lead it codes."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from aiotimer._edges.ring import PLAIN_RING, ring_byte, ring_lead


@settings(max_examples=500, deadline=None)
@given(lead=st.floats(allow_nan=False))
def test_a_ring_says_at_most_its_lead_and_not_much_less(lead: float) -> None:
    (code,) = ring_byte(lead)
    said = ring_lead(code)
    if lead <= 0.0:  # already due: a plain ring, which teaches no lead
        assert said is None
        return
    assert said is not None and said <= lead
    if 0.01 <= lead <= 200.0:  # inside the scale: one step (19 %) short at most
        assert said > lead / 2 ** (1 / 4) * 0.999


def test_short_and_long_leads_are_clamped_to_the_scale() -> None:
    assert ring_byte(0.0) == ring_byte(-1.0) == PLAIN_RING  # already due
    assert ring_lead(ring_byte(1e-6)[0]) == 0.0
    assert ring_lead(ring_byte(1.0)[0]) == 1.0
    assert 100.0 < (ring_lead(ring_byte(math.inf)[0]) or 0.0) <= ring_lead(ring_byte(1e9)[0])


def test_other_bytes_are_plain_rings() -> None:
    assert ring_lead(PLAIN_RING[0]) is None
    assert ring_lead(0) is None
    assert ring_lead(0xFF) is None
