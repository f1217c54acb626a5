"""The pure kill policy (aiotimer/reapers/_kill_policy.py): examples, then properties over any
facts: the never-signalled targets stay refused whatever the policy, a narrower policy
never allows more, and the default allows exactly what its rules say."""

from __future__ import annotations

import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiotimer import expires
from aiotimer.cli import build_parser
from aiotimer.cli._args import kill_policy_from_args
from aiotimer.reapers._kill_policy import (
    DEFAULT_SIGNALS,
    JOB_CONTROL_SIGNALS,
    KillPolicy,
    ServerIdentity,
    Target,
    fifo_mode_warning,
)
from aiotimer.wire import MAX_SIGNAL, signal_problem

SERVER = ServerIdentity(pid=100, uid=1000, pgid=90, ancestors=frozenset({90, 50, 1}))
ROOT = ServerIdentity(pid=100, uid=0, pgid=90, ancestors=frozenset({90, 50, 1}))


def worker(pid: int = 200, uid: int | None = 1000, **kw: object) -> Target:
    facts: dict[str, object] = {"registered": True, "descendant": True, "pgid": pid}
    facts.update(kw)
    return Target(pid=pid, uid=uid, **facts)  # type: ignore[arg-type]


def test_default_allows_a_registered_worker_of_the_servers_uid() -> None:
    assert KillPolicy().refusal(SERVER, worker(), signal.SIGKILL) is None
    assert KillPolicy().refusal(SERVER, worker(), signal.SIGTERM, group=True) is None


@pytest.mark.parametrize(
    ("server", "target", "signum", "group", "says"),
    [
        (SERVER, worker(uid=1001), signal.SIGKILL, False, "belongs to uid 1001"),
        (SERVER, worker(uid=None), signal.SIGKILL, False, "unknown user"),
        (SERVER, worker(registered=False), signal.SIGKILL, False, "never registered"),
        (SERVER, worker(), signal.SIGSTOP, False, "got 19 (SIGSTOP)"),
        (SERVER, worker(), signal.SIGCONT, False, "got 18 (SIGCONT)"),
        (SERVER, worker(pid=100), signal.SIGKILL, False, "server itself"),
        (SERVER, worker(pid=50), signal.SIGKILL, False, "ancestor of the server"),
        (ROOT, worker(pid=50, uid=0), signal.SIGKILL, False, "ancestor of the server"),
        (SERVER, worker(pgid=90), signal.SIGKILL, True, "server's own group"),
        (SERVER, worker(pgid=50), signal.SIGKILL, True, "led by the server or its ancestor"),
        (SERVER, worker(pgid=None), signal.SIGKILL, True, "system group"),
    ],
)
def test_refusals_say_why(
    server: ServerIdentity, target: Target, signum: int, group: bool, says: str
) -> None:
    reason = KillPolicy().refusal(server, target, signum, group=group)
    assert reason is not None and says in reason


def test_root_signals_any_uid_but_an_explicit_set_narrows_it() -> None:
    foreign = worker(uid=1001)
    assert KillPolicy().refusal(ROOT, foreign, signal.SIGKILL) is None
    assert KillPolicy().refusal(ROOT, worker(uid=None), signal.SIGKILL) is None
    only = KillPolicy(uids=frozenset({1002}))
    assert only.refusal(ROOT, foreign, signal.SIGKILL) is not None
    assert only.refusal(ROOT, worker(uid=1002), signal.SIGKILL) is None
    # An explicit set also widens a non-root server's (the kernel still has its say).
    assert KillPolicy(uids=frozenset({1001})).refusal(SERVER, foreign, signal.SIGKILL) is None


def test_descendants_only() -> None:
    policy = KillPolicy(descendants_only=True)
    assert policy.refusal(SERVER, worker(), signal.SIGKILL) is None
    for descendant in (False, None):
        reason = policy.refusal(SERVER, worker(descendant=descendant), signal.SIGKILL)
        assert reason is not None and "not a descendant" in reason


def test_allowed_signals_are_configurable_and_checked() -> None:
    assert signal.SIGKILL in DEFAULT_SIGNALS
    assert not DEFAULT_SIGNALS & JOB_CONTROL_SIGNALS
    with_stop = KillPolicy(signals=DEFAULT_SIGNALS | {signal.SIGSTOP})
    assert with_stop.refusal(SERVER, worker(), signal.SIGSTOP) is None
    for bad in (0, -9, MAX_SIGNAL + 1):
        with pytest.raises(ValueError, match="signals must be"):
            KillPolicy(signals=frozenset({bad}))
    with pytest.raises(ValueError, match="uids must be"):
        KillPolicy(uids=frozenset({-1}))


def test_the_client_refuses_at_entry_what_the_kill_policy_refuses_in_the_same_words() -> None:
    for signum in sorted(JOB_CONTROL_SIGNALS):
        refusal = KillPolicy().refusal(SERVER, worker(), signum)
        assert refusal is not None and refusal == signal_problem(signum)
        with pytest.raises(ValueError) as refused:
            expires(after=5, signal=signum)
        assert str(refused.value) == refusal
        assert str(refused.value).startswith("signal must be ")  # the argument's name
        assert "but the job-control ones" in refusal and f"got {signum} (" in refusal
    narrow = KillPolicy(signals=frozenset({signal.SIGKILL, signal.SIGTERM}))
    refusal = narrow.refusal(SERVER, worker(), signal.SIGINT)
    assert refusal is not None and "one of the kill policy's signals (9, 15)" in refusal
    for signum in sorted(DEFAULT_SIGNALS):
        assert signal_problem(signum) is None
        assert KillPolicy().refusal(SERVER, worker(), signum) is None
        expires(after=5, signal=signum)


def test_fifo_mode_warning() -> None:
    assert fifo_mode_warning(0o600) is None
    assert fifo_mode_warning(0o640) is None
    group = fifo_mode_warning(0o620)
    assert group is not None and "its group" in group and "0620" in group
    everyone = fifo_mode_warning(0o10666)  # with the S_IFIFO bits
    assert everyone is not None and "every user" in everyone and "0666" in everyone


# -- properties ------------------------------------------------------------------------

pids = st.integers(-5, 400)
uids = st.none() | st.integers(0, 1003)
servers = st.builds(
    ServerIdentity,
    pid=st.integers(2, 400),
    uid=st.sampled_from([0, 1000, 1001]),
    pgid=st.integers(1, 400),
    ancestors=st.frozensets(st.integers(1, 400), max_size=4),
)
targets = st.builds(
    Target,
    pid=pids,
    registered=st.booleans(),
    uid=uids,
    descendant=st.none() | st.booleans(),
    pgid=st.none() | st.integers(-1, 400),
)
policies = st.builds(
    KillPolicy,
    uids=st.none() | st.frozensets(st.integers(0, 1003), max_size=3),
    descendants_only=st.booleans(),
    signals=st.frozensets(st.integers(1, MAX_SIGNAL), max_size=8) | st.just(DEFAULT_SIGNALS),
)
signums = st.integers(-3, MAX_SIGNAL + 2)


@settings(max_examples=500)
@given(policy=policies, server=servers, target=targets, signum=signums, group=st.booleans())
def test_never_signalled_whatever_the_policy(
    policy: KillPolicy, server: ServerIdentity, target: Target, signum: int, group: bool
) -> None:
    allowed = policy.refusal(server, target, signum, group=group) is None
    if allowed:
        assert signum in policy.signals
        assert target.registered
        assert target.pid > 1 and target.pid != server.pid
        assert target.pid not in server.ancestors
        if group:
            assert target.pgid is not None and target.pgid > 1
            assert target.pgid not in {server.pgid, server.pid, *server.ancestors}
        if policy.descendants_only:
            assert target.descendant is True


@settings(max_examples=500)
@given(
    policy=policies,
    server=servers,
    target=targets,
    signum=signums,
    group=st.booleans(),
    narrower_uids=st.frozensets(st.integers(0, 1003), max_size=3),
)
def test_a_narrower_policy_never_allows_more(
    *,
    policy: KillPolicy,
    server: ServerIdentity,
    target: Target,
    signum: int,
    group: bool,
    narrower_uids: frozenset[int],
) -> None:
    if policy.refusal(server, target, signum, group=group) is not None:
        stricter = KillPolicy(policy.uids, True, policy.signals)
        assert stricter.refusal(server, target, signum, group=group) is not None
    if policy.uids is not None:
        subset = KillPolicy(policy.uids & narrower_uids, policy.descendants_only, policy.signals)
        if policy.refusal(server, target, signum, group=group) is not None:
            assert subset.refusal(server, target, signum, group=group) is not None


@settings(max_examples=500)
@given(server=servers, target=targets, signum=signums)
def test_default_uid_rule(server: ServerIdentity, target: Target, signum: int) -> None:
    """By default: the server's own uid, any uid for root; nothing else decides on uid."""
    default = KillPolicy().refusal(server, target, signum)
    any_uid = KillPolicy(uids=None).refusal(
        ServerIdentity(server.pid, 0, server.pgid, server.ancestors), target, signum
    )
    uid_ok = server.uid in {0, target.uid}
    assert (default is None) == (any_uid is None and uid_ok)


def test_serve_kill_policy_options() -> None:
    parse = build_parser().parse_args
    assert kill_policy_from_args(parse(["serve", "--fifo", "/tmp/f"])) == KillPolicy()
    narrow = parse(["serve", "--fifo", "/tmp/f", "--kill-uid", "7", "--kill-uid", "0"])
    assert kill_policy_from_args(narrow) == KillPolicy(uids=frozenset({0, 7}))
    supervised = parse(["serve", "--fifo", "/tmp/f", "--descendants-only"])
    assert kill_policy_from_args(supervised) == KillPolicy(descendants_only=True)


def test_run_kill_policy_options_mean_what_serves_mean_but_default_to_descendants() -> None:
    parse = build_parser().parse_args
    assert kill_policy_from_args(parse(["run", "--", "x"])) == KillPolicy(descendants_only=True)
    wide = parse(["run", "--no-descendants-only", "--kill-uid", "7", "--", "x"])
    assert kill_policy_from_args(wide) == KillPolicy(uids=frozenset({7}))
    serve_wide = parse(["serve", "--fifo", "/tmp/f", "--no-descendants-only", "--kill-uid", "7"])
    assert kill_policy_from_args(serve_wide) == kill_policy_from_args(wide)
