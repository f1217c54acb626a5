"""Learned timeouts: the pure rule (hypothesis), the spec's one validator (client and
wire alike), and ``expires(after=learned(...))`` on the client."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiotimer import expires, learned
from aiotimer.core._learned import (
    TIGHTEN_STEP,
    LearnedScope,
    LearnedScopeState,
    LearnedTimeouts,
)
from aiotimer.testing import RecordingClient
from aiotimer.wire import Learned, LineDecoder, Request, encode

# -- the rule ---------------------------------------------------------------------------

specs = st.builds(
    lambda initial, floor_frac, factor, warmup, quantile: Learned(
        initial=initial,
        floor=initial * floor_frac,
        factor=factor,
        warmup=warmup,
        quantile=quantile,
    ),
    st.floats(0.01, 4000),
    st.floats(0, 1),
    st.floats(1, 20),
    st.integers(1, 30),
    st.sampled_from([0.5, 0.9, 0.99, 1.0]),
)
durations = st.lists(
    st.one_of(st.floats(0, 5), st.floats(0, 5000), st.just(0.0)), min_size=1, max_size=120
)


@settings(max_examples=150, deadline=None)
@given(specs, durations)
def test_the_value_in_force_stays_within_floor_and_initial(
    spec: Learned, samples: list[float]
) -> None:
    scope = LearnedScope(spec)
    assert scope.in_force(spec) == spec.initial
    for d in samples:
        observed = scope.observe(d, spec)
        value = scope.in_force(spec)
        assert spec.floor <= value <= spec.initial, "never below floor, never above initial"
        assert observed.after == value
        if scope.samples < spec.warmup:
            assert value == spec.initial, "nothing is learned during the warm-up"


@settings(max_examples=150, deadline=None)
@given(specs, durations)
def test_a_long_sample_widens_at_once_and_tightening_is_bounded(
    spec: Learned, samples: list[float]
) -> None:
    scope = LearnedScope(spec)
    for d in samples:
        before = scope.in_force(spec)
        scope.observe(d, spec)
        after = scope.in_force(spec)
        if scope.samples >= spec.warmup:
            # widens at once: the value covers factor x the sample just seen
            assert after >= min(spec.initial, spec.factor * d) * (1 - 1e-12)
        # tightens slowly: at most TIGHTEN_STEP of the value per sample
        assert after >= before * (1 - TIGHTEN_STEP) * (1 - 1e-12)


def test_it_tightens_step_by_step_to_factor_times_the_maximum() -> None:
    spec = learned(30, warmup=20)
    scope = LearnedScope(spec)
    for _ in range(19):
        scope.observe(0.1, spec)
    assert scope.in_force(spec) == 30.0
    scope.observe(0.1, spec)  # the warm-up's last: the first step down
    assert scope.in_force(spec) == pytest.approx(30 * (1 - TIGHTEN_STEP))
    steps = math.ceil(math.log(30 / 1.0) / -math.log(1 - TIGHTEN_STEP))
    for _ in range(steps):
        scope.observe(0.1, spec)
    assert scope.in_force(spec) == 1.0  # floor: 5 x 0.1 s is below it
    observed = scope.observe(0.9, spec)  # a long sample: widens at once
    assert observed.would_reap is False  # 0.9 s is within the value (1 s)
    assert scope.in_force(spec) == pytest.approx(4.5)
    observed = scope.observe(6.0, spec)  # past the value, short of initial
    assert observed.would_reap and observed.before == pytest.approx(4.5)
    assert scope.in_force(spec) == 30.0  # 5 x 6 s = 30 s: initial


def test_a_quantile_below_one_follows_the_bulk_of_the_durations() -> None:
    spec = learned(600, quantile=0.9, warmup=10)
    scope = LearnedScope(spec)
    for i in range(400):
        scope.observe(10.0 if i % 50 == 0 else 1.0, spec)  # 2% of blocks are 10x slower
    assert scope.in_force(spec) == pytest.approx(5.0, rel=0.02)  # 5 x p90 (1 s)


def test_the_table_learns_only_scopes_a_learned_block_named() -> None:
    table = LearnedTimeouts(max_sites=2)
    assert table.observe("a.py:1#3", 1.0) is None
    spec = learned(10, warmup=1)
    assert table.in_force("a.py:1#4", spec) == (10, 0)
    seen = table.observe("a.py:1#5", 0.5)  # the same site, another block
    assert seen is not None and seen[1].samples == 1
    assert table.in_force("a.py:1#6", spec)[0] == pytest.approx(9.5)
    table.in_force("b", spec)
    assert table.in_force("c", spec) == (10, 0), "past max_sites: timed at initial"
    assert len(table) == 2
    assert [s.site for s in table.summaries()] == ["a.py:1", "b"]


def test_the_saved_state_merges_back_to_the_same_value() -> None:
    spec = learned(30, warmup=5)
    table = LearnedTimeouts()
    table.in_force("step", spec)
    for _ in range(100):
        table.observe("step", 0.05)
    fresh = LearnedTimeouts()
    fresh.merge_state(table.to_state())
    assert fresh.in_force("step", spec) == table.in_force("step", spec) == (1.0, 100)
    fresh.widen({"step": 7.0, "elsewhere": 3.0, "tighter": 0.5})
    assert fresh.in_force("step", spec)[0] == 7.0
    assert fresh.in_force("elsewhere", spec) == (3.0, 0), "learned elsewhere: no warm-up"
    fresh.widen({"step": 2.0})
    assert fresh.in_force("step", spec)[0] == 7.0, "only a wider value is taken"


# -- the spec's validator ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"initial": "30"}, TypeError, "initial must be a number"),
        ({"initial": True}, TypeError, "initial must be a number"),
        ({"initial": 0}, ValueError, "initial must be a finite number of seconds > 0"),
        ({"initial": math.inf}, ValueError, "initial must be a finite"),
        ({"factor": 0.5}, ValueError, "factor must be a finite number >= 1"),
        ({"floor": -1}, ValueError, "floor must be a finite number of seconds >= 0"),
        ({"floor": 100}, ValueError, "floor (100) must not be above initial (30)"),
        ({"warmup": 0}, ValueError, "warmup must be an int in 1.."),
        ({"warmup": 2.0}, TypeError, "warmup must be an int"),
        ({"quantile": 0.1}, ValueError, "quantile must be a number in 0.5..1"),
        ({"quantile": math.nan}, ValueError, "quantile must be a number in 0.5..1"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(
    kwargs: dict[str, object], error: type[Exception], names: str
) -> None:
    args: dict[str, object] = {"initial": 30, **kwargs}
    initial = args.pop("initial")
    with pytest.raises(
        error, match="^learned\\(\\): " + names.replace("(", r"\(").replace(")", r"\)")
    ):
        learned(initial, **args)  # type: ignore[arg-type]


def test_the_wire_carries_the_spec_and_the_decoder_applies_the_same_rule() -> None:
    spec = learned(30)
    line = encode(Request(4242, "step", 1e9, 9, mono=50.0, learned=spec))
    assert b'"learned": {"initial":30,"factor":5.0,"floor":1.0,"warmup":20' in line
    [req] = LineDecoder().feed(line).requests
    assert req.learned == spec
    bad = line.replace(b'"factor":5.0', b'"factor":0.5')
    decoded = LineDecoder().feed(bad)
    assert decoded.requests == []
    [rejection] = decoded.rejections
    assert "learned(): factor must be a finite number >= 1" in rejection.reason


def test_a_torch_style_server_sees_only_the_initial_deadline() -> None:
    """torch's server reads pid, scope_id, expiration_time and signal only: the deadline
    on the line is ``initial`` away."""
    client = RecordingClient()
    with expires(after=learned(30), scope="step", client=client):
        pass
    acquire, release = client.requests
    assert acquire.learned == learned(30)
    assert acquire.mono is not None
    assert 29 < acquire.expiration_time - __import__("time").time() <= 30
    assert release.is_release and release.learned is None


@pytest.mark.asyncio
async def test_the_async_face_and_the_decorator_send_the_spec_too() -> None:
    client = RecordingClient()
    async with expires(after=learned(10), scope="s", client=client, kill_after=0):
        pass

    @expires(after=learned(20), client=client)
    def step() -> int:
        return 1

    assert step() == 1
    assert [r.learned.initial for r in client.requests if r.learned is not None] == [10, 20]


def test_a_wrong_after_names_both_accepted_forms() -> None:
    with pytest.raises(TypeError, match=r"after must be a number of seconds .* or learned"):
        expires(after="10")  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(
    st.one_of(st.floats(-10, 5000), st.just(math.nan)),
    st.floats(0, 30),
    st.floats(-1, 6000),
    st.integers(-3, 50),
    st.floats(0, 1.5),
)
def test_the_client_and_the_decoder_accept_exactly_the_same_specs(
    initial: float, factor: float, floor: float, warmup: int, quantile: float
) -> None:
    """One validator: what ``learned()`` refuses, the server's decoder rejects."""
    fields = {"initial": initial, "factor": factor, "floor": floor, "warmup": warmup}
    fields["quantile"] = quantile
    try:
        spec: Learned | None = learned(
            initial, factor=factor, floor=floor, warmup=warmup, quantile=quantile
        )
    except ValueError:
        spec = None
    body = msgspec.json.encode(fields) if math.isfinite(initial) else None
    if body is None:  # JSON has no NaN: the client alone meets it
        assert spec is None
        return
    line = (
        b'{"pid": 4242, "scope_id": "s", "expiration_time": 1e9, "signal": 9, "learned": '
        + body
        + b"}\n"
    )
    decoded = LineDecoder().feed(line)
    if spec is None:
        assert decoded.requests == [] and len(decoded.rejections) == 1
    else:
        assert [r.learned for r in decoded.requests] == [spec]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.floats(0, 50)), max_size=80))
def test_a_saved_table_comes_back_with_the_same_values(samples: list[tuple[str, float]]) -> None:
    spec = learned(60, warmup=3)
    table = LearnedTimeouts()
    for site, duration in samples:
        table.in_force(site, spec)
        table.observe(site, duration)
    state = msgspec.json.decode(
        msgspec.json.encode(table.to_state()), type=dict[str, LearnedScopeState]
    )
    fresh = LearnedTimeouts()
    fresh.merge_state(state)
    for site in {s for s, _ in samples}:
        assert fresh.in_force(site, spec) == table.in_force(site, spec)
