"""The rule before an expiry as a pure step (aiotimer.server._decision): it says act
only once every worker due was looked for, and it always comes to act."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aiotimer.server._decision import Decision, Look

DUE = st.sets(st.integers(1, 30), max_size=8) | st.none()


@settings(max_examples=200, deadline=None)
@given(dues=st.lists(DUE, min_size=1, max_size=50))
def test_it_acts_only_once_every_due_worker_was_looked_for_and_always_comes_to_act(
    dues: list[set[int] | None],
) -> None:
    decision = Decision(at=1.0)
    looks = 0
    for due in dues:
        look = decision.next(due)
        if look is None:
            # Acting: every worker due now was looked for (or anyone was).
            assert due is None or all(decision.looked_for(pid) for pid in due)
            break
        looks += 1
        assert look.pids is None or (look.pids and due is not None and look.pids <= due)
    # Each look names a worker not looked for before (or anyone, once): a bounded number.
    assert looks <= 31


def test_a_look_for_anyone_is_the_last_look() -> None:
    decision = Decision(at=0.0)
    assert decision.next({1}) == Look(frozenset({1}))
    assert decision.next(None) == Look(None)
    assert decision.next({1, 2, 3}) is None
    assert decision.looked_for(99)
