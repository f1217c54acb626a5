"""The guard of ``aiotimer run`` after SIGKILL of the run: it never signals a process
that is not the run's, and it leaves nothing of the run behind.

Each test runs twice: as the machine offers (a cgroup v2 the run can make, as here and
in CI as root), and with no cgroup v2 at all (the run in a private mount namespace with
every ``cgroup2`` mount detached, as in a container without one), where the guard has
only the workers' pidfds. Both need root (``unshare``); they skip otherwise.

Tolerances: "gone after SIGKILL of run" is waited for as a condition bounded by 3 s;
other waits are bounded by 20 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiotimer._edges.cgroups import cgroup_dirs

pytestmark = [pytest.mark.process, pytest.mark.timeout(60)]

BOUND = 20.0
MODES = ["cgroup", "no-cgroup"]

#: Run ``argv`` with no cgroup v2 mounted: in a private mount namespace (``unshare
#: --mount``), detach every ``cgroup2`` mount, then exec ``argv`` (same pid).
NO_CGROUP = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
with open("/proc/self/mountinfo") as f:
    mounts = [l.split()[4] for l in f if l.split()[l.split().index("-") + 1] == "cgroup2"]
for mount in sorted(mounts, key=len, reverse=True):
    if libc.umount2(mount.encode(), 2) != 0:  # MNT_DETACH
        sys.exit(f"cannot detach {mount}: errno {ctypes.get_errno()}")
os.execv(sys.argv[1], sys.argv[1:])
"""


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: unshare(1) of mount and PID namespaces, uid 65534")
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) (util-linux)")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def _run_argv(mode: str, *argv: str) -> list[str]:
    """``aiotimer run ARGV`` as ``mode`` asks (``no-cgroup``: no cgroup v2 mounted)."""
    run = [sys.executable, "-m", "aiotimer", "run", *argv]
    if mode == "cgroup":
        return run
    return ["unshare", "--mount", sys.executable, "-c", NO_CGROUP, *run]


def _exited(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def _session_members(session: int) -> list[int]:
    """Live processes whose session or process group is ``session``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in (b"Z", b"X") and session in (int(fields[2]), int(fields[3])):
            found.append(int(name))
    return found


# -- a process that took a dead worker's pid --------------------------------------------

#: Rank 0 keeps no parent-death signal, so it is alive when the guard first looks
#: (proven the run's then) and dies by the guard's hand; rank 1 leaves a child the test
#: freezes (cgroup v1 freezer: SIGKILL cannot end it until thawed), which keeps the
#: guard at work while another user's process takes rank 0's pid.
REUSE_WORKER = """
import ctypes, os, subprocess, time
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 1)
os.dup2(null, 2)
if os.environ["RANK"] == "0":
    ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG 0
    line = f"0 {os.getpid()}"
else:
    line = f"1 {os.getpid()} {subprocess.Popen(['sleep', '60']).pid}"
with open(os.environ["TEST_PIDS"], "a") as f:
    f.write(line + "\\n")
time.sleep(60)
"""

#: PID 1 of a fresh PID namespace (so dead workers come to it, and it decides when one
#: is reaped, and ns_last_pid steers the next pid). Prints what it saw as JSON.
REUSE_HARNESS = """
import atexit, json, os, select, signal, subprocess, sys, time

mode, tmp, worker, freezer = sys.argv[1:5]
run = json.loads(sys.argv[5])
out = {}

def wait_fd(fd, timeout):
    return bool(select.select([fd], [], [], timeout)[0])

def until(test, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not test():
        if time.monotonic() > deadline:
            sys.exit(f"no {what} within {timeout} s")
        time.sleep(0.01)

frozen = os.path.join(freezer, f"aiotimer-test-{os.getppid()}-{time.time_ns()}")
os.mkdir(frozen)

def thaw():  # also when the harness gives up: never leave a frozen process behind
    try:
        with open(os.path.join(frozen, "freezer.state"), "w") as f:
            f.write("THAWED")
    except OSError:
        pass

atexit.register(thaw)
pids = os.path.join(tmp, "pids")
env = {**os.environ, "TEST_PIDS": pids}
sup = subprocess.Popen([*run, "--nproc", "2", "--", sys.executable, worker],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
lines = lambda: open(pids).read().split("\\n")[:-1] if os.path.exists(pids) else []
until(lambda: len(lines()) == 2, "two workers")
ranks = {l.split()[0]: [int(x) for x in l.split()[1:]] for l in lines()}
(w1,), (w2, held) = ranks["0"], ranks["1"]
w1_fd, held_fd = os.pidfd_open(w1), os.pidfd_open(held)
with open(os.path.join(frozen, "cgroup.procs"), "w") as f:
    f.write(str(held))
with open(os.path.join(frozen, "freezer.state"), "w") as f:
    f.write("FROZEN")
until(lambda: open(os.path.join(frozen, "freezer.state")).read().strip() == "FROZEN", "freeze")
argv = open(f"/proc/{sup.pid}/cmdline", "rb").read()
def cmdline(p):
    try:
        return open(f"/proc/{p}/cmdline", "rb").read()
    except OSError:
        return None
(guard,) = [int(p) for p in os.listdir("/proc")
            if p.isdigit() and int(p) != sup.pid and cmdline(p) == argv]
guard_fd = os.pidfd_open(guard)

sup.kill()
sup.wait()
if not wait_fd(w1_fd, 10):
    sys.exit("rank 0 was not stopped by the guard within 10 s")
_, status = os.waitpid(w1, 0)  # dead rank 0 came to PID 1: reap it, its pid is free
out["rank0_signal"] = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None

attacker = None
deadline = time.monotonic() + 10
while attacker is None and time.monotonic() < deadline:
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(w1 - 1))
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        if os.getpid() == w1:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.setsid()
            os.write(w, b"r")
            time.sleep(30)
        os._exit(0)
    os.close(w)
    if child == w1 and os.read(r, 1) == b"r":
        attacker = child
    else:
        os.waitpid(child, 0)
    os.close(r)
if attacker is None:
    sys.exit(f"could not get pid {w1} again")
attacker_fd = os.pidfd_open(attacker)
out["attacker_session"] = os.getsid(attacker)
out["guard_busy"] = not wait_fd(guard_fd, 0)
time.sleep(0.5)  # the guard keeps looking, the frozen child in its way
with open(os.path.join(frozen, "freezer.state"), "w") as f:
    f.write("THAWED")
out["guard_ended"] = wait_fd(guard_fd, 15)
out["held_ended"] = wait_fd(held_fd, 5)
out["attacker_alive"] = not wait_fd(attacker_fd, 0)
if out["attacker_alive"]:
    os.kill(attacker, signal.SIGKILL)
_, status = os.waitpid(attacker, 0)
out["attacker_signal"] = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
out["report"] = sup.stderr.read().decode(errors="replace")[-2000:] if out["guard_ended"] else ""
os.rmdir(frozen)
print(json.dumps(out))
"""


def _freezer() -> str | None:
    """The mount point of the cgroup v1 freezer, if there is one."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            tail = fields[fields.index("-") + 1 :]
            if tail[0] == "cgroup" and "freezer" in tail[2].split(","):
                return fields[4]
    return None


@pytest.mark.parametrize("mode", MODES)
def test_the_guard_never_signals_another_users_process_that_took_a_dead_workers_pid(
    mode: str, tmp_path: Path
) -> None:
    _need_root()
    freezer = _freezer()
    if freezer is None:
        pytest.skip("needs the cgroup v1 freezer (to hold a leftover the guard waits for)")
    worker = tmp_path / "worker.py"
    worker.write_text(REUSE_WORKER)
    # The run's cgroup mode is chosen inside the namespace: detach cgroup2 there.
    run = [sys.executable, "-m", "aiotimer", "run"]
    if mode == "no-cgroup":
        run = [sys.executable, "-c", NO_CGROUP, *run]
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--mount",
         sys.executable, "-c", REUSE_HARNESS, mode, str(tmp_path), str(worker), freezer,
         json.dumps(run)],
        env=_env(), capture_output=True, timeout=50, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    out = json.loads(done.stdout)
    assert out["rank0_signal"] == signal.SIGKILL, out
    assert out["guard_busy"], f"the pid was taken while the guard was still at work: {out}"
    assert out["guard_ended"] and out["held_ended"], out
    assert "died without stopping its workers" in out["report"], out
    assert out["attacker_alive"], (
        f"the guard signalled uid 65534's process, which took dead rank 0's pid and "
        f"called setsid() (killed by signal {out['attacker_signal']}): {out}"
    )


# -- leftovers that escape ----------------------------------------------------------------

#: A child exec'd with its own environment (no sign of the run in it), and a child that
#: hops pids: every 2 ms it forks and its parent exits. Both stay in the worker's session
#: and process group, and hold the write end of the test's FIFO: once every one of them
#: is gone, the test reads end-of-file.
ESCAPE_WORKER = """
import os, subprocess, sys, time
alive = os.open(os.environ["TEST_ALIVE"], os.O_WRONLY)
quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(alive,))
own_env = subprocess.Popen(["sleep", "60"], env={"PATH": "/bin:/usr/bin"}, **quiet)
hop = "import os, time\\nwhile True:\\n    time.sleep(0.002)\\n    if os.fork(): os._exit(0)\\n"
hopper = subprocess.Popen([sys.executable, "-c", hop], **quiet)
with open(os.environ["TEST_PIDS"], "w") as f:
    f.write(f"{os.getpid()} {own_env.pid} {hopper.pid}\\n")
time.sleep(60)
"""


def _wait_state(pid: int, state: str) -> None:
    deadline = time.monotonic() + BOUND
    while True:
        with open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == state.encode():
                return
        assert time.monotonic() < deadline, f"process {pid} in state {state}"
        time.sleep(0.01)


@pytest.fixture
def pinned() -> Iterator[list[int]]:
    fds: list[int] = []
    yield fds
    for fd in fds:
        if not _exited(fd):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        os.close(fd)


@pytest.mark.parametrize("mode", MODES)
def test_a_child_with_its_own_environment_and_a_pid_hopper_are_gone_after_sigkill_of_run(
    mode: str, tmp_path: Path, pinned: list[int]
) -> None:
    _need_root()
    worker = tmp_path / "worker.py"
    worker.write_text(ESCAPE_WORKER)
    pids, alive = tmp_path / "pids", tmp_path / "alive"
    os.mkfifo(alive)
    reader = os.open(alive, os.O_RDONLY | os.O_NONBLOCK)
    sup = subprocess.Popen(
        _run_argv(mode, "--", sys.executable, str(worker)),
        env={**_env(), "TEST_PIDS": str(pids), "TEST_ALIVE": str(alive)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + BOUND
        while not (pids.exists() and pids.read_text().endswith("\n")):
            assert time.monotonic() < deadline, "the worker started its children"
            time.sleep(0.02)
        session, own_env, hopper = map(int, pids.read_text().split())
        pinned.extend(os.pidfd_open(p) for p in (own_env, hopper))
        cgroup = _run_cgroup(session)
        assert (cgroup is not None) == (mode == "cgroup" and _can_make_cgroup(tmp_path.name))
        # The worker dies first, as its parent-death signal makes it do when the run is
        # killed; here before, so that nobody can see it alive once the run is gone.
        sup.send_signal(signal.SIGSTOP)
        _wait_state(sup.pid, "T")
        os.kill(session, signal.SIGKILL)
        _wait_state(session, "Z")  # not reaped: the run is stopped
        _wait_hop(pinned[1])
        sup.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        while not (_exited(pinned[0]) and _all_closed(reader)):
            assert time.monotonic() - killed_at < 3.0, (
                f"3 s after SIGKILL of run: the child with its own environment "
                f"{'runs' if not _exited(pinned[0]) else 'is gone'}; the pid hopper "
                f"{'runs' if not _all_closed(reader) else 'is gone'}; in the worker's "
                f"session: {_session_members(session)}"
            )
            time.sleep(0.02)
        _, err = sup.communicate(timeout=BOUND)
        assert b"died without stopping its workers" in err, err
        assert cgroup is None or not cgroup.exists(), "the guard removed the run's cgroup"
    finally:
        sup.kill()
        sup.communicate()
        os.close(reader)
        if "session" in locals():
            _kill_session(session)


def _kill_session(session: int) -> None:
    """Kill what is left in the worker's session. A pid hopper outruns a kill by pid: its
    process group (the worker's, whose number is the session's) is killed at once."""
    for _ in range(3):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(session, signal.SIGKILL)
        for pid in _session_members(session):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _wait_hop(first: int) -> None:
    """Wait until the hopper's first process has hopped on (it has exited)."""
    assert select.select([first], [], [], BOUND)[0], "the pid hopper hops"


def _all_closed(reader: int) -> bool:
    """Every writer of the FIFO ``reader`` reads is gone (end-of-file)."""
    try:
        return os.read(reader, 1) == b""
    except BlockingIOError:
        return False


def test_the_next_run_stops_a_child_with_its_own_environment_in_a_dead_runs_cgroup(
    tmp_path: Path, pinned: list[int]
) -> None:
    # Guard and run both killed: the next run's sweep kills the dead run's cgroup. (With
    # no cgroup the sweep cannot prove such a child the run's: see docs/supervisor.md.)
    _need_root()
    if not _can_make_cgroup(tmp_path.name):
        pytest.skip("no cgroup v2 can be made here (see the no-cgroup tests)")
    runtime = tmp_path / "runtime"  # run files of their own: no other test's run sweeps
    runtime.mkdir(mode=0o700)
    worker = tmp_path / "worker.py"
    worker.write_text(ESCAPE_WORKER)
    pids, alive = tmp_path / "pids", tmp_path / "alive"
    os.mkfifo(alive)
    reader = os.open(alive, os.O_RDONLY | os.O_NONBLOCK)
    env = {**_env(), "XDG_RUNTIME_DIR": str(runtime)}
    sup = subprocess.Popen(
        _run_argv("cgroup", "--", sys.executable, str(worker)),
        env={**env, "TEST_PIDS": str(pids), "TEST_ALIVE": str(alive)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + BOUND
        while not (pids.exists() and pids.read_text().endswith("\n")):
            assert time.monotonic() < deadline, "the worker started its children"
            time.sleep(0.02)
        session, own_env, _ = map(int, pids.read_text().split())
        pinned.append(os.pidfd_open(own_env))
        argv = Path(f"/proc/{sup.pid}/cmdline").read_bytes()
        (guard,) = [
            int(p)
            for p in os.listdir("/proc")
            if p.isdigit() and int(p) != sup.pid and _cmdline(p) == argv
        ]  # a fork of the run: the same command line
        os.kill(guard, signal.SIGKILL)
        sup.send_signal(signal.SIGKILL)
        sup.wait(timeout=BOUND)
        time.sleep(0.5)
        assert not _exited(pinned[0]), "nobody stopped the child with its own environment"
        nxt = subprocess.run(
            [sys.executable, "-m", "aiotimer", "run", "--", "true"],
            env=env, capture_output=True, timeout=BOUND, check=False,
        )  # fmt: skip
        assert nxt.returncode == 0, nxt.stderr
        assert b"left by the run of supervisor" in nxt.stderr, nxt.stderr
        killed_at = time.monotonic()
        while not (_exited(pinned[0]) and _all_closed(reader)):
            assert time.monotonic() - killed_at < 3.0, "the sweep stopped the dead run's cgroup"
            time.sleep(0.02)
    finally:
        sup.kill()
        sup.wait()
        os.close(reader)
        if "session" in locals():
            _kill_session(session)


def _cmdline(pid: str) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def test_a_run_that_ends_cleanly_leaves_no_cgroup(tmp_path: Path) -> None:
    if not _can_make_cgroup(tmp_path.name):
        pytest.skip("no cgroup v2 can be made here")
    done = subprocess.run(
        [sys.executable, "-m", "aiotimer", "run", "--", "sh", "-c",
         "grep ^0:: /proc/self/cgroup; echo $$"],
        env=_env(), capture_output=True, text=True, timeout=BOUND, check=True,
    )  # fmt: skip
    line, _ = done.stdout.splitlines()
    assert "/aiotimer-run-" in line, "the worker ran in the run's cgroup"
    (cgroup,) = cgroup_dirs(line, Path("/proc/self/mountinfo").read_text())
    deadline = time.monotonic() + BOUND
    while cgroup.exists():  # the guard removes it once the run has ended
        assert time.monotonic() < deadline, f"{cgroup} removed"
        time.sleep(0.02)


def _run_cgroup(pid: int) -> Path | None:
    """The run cgroup ``pid`` is in, if it is in one."""
    with open(f"/proc/{pid}/cgroup") as f:
        own = f.read()
    if "/aiotimer-run-" not in own:
        return None
    (path,) = cgroup_dirs(own, Path("/proc/self/mountinfo").read_text())
    return path


def _can_make_cgroup(name: str) -> bool:
    """Whether a child of this process's cgroup v2 can be made (and is, then removed)."""
    with open("/proc/self/cgroup") as f:
        own = next((line[3:].strip() for line in f if line.startswith("0::")), None)
    with open("/proc/self/mountinfo") as f:
        mounts = [
            (fields[3], fields[4])
            for fields in map(str.split, f)
            if fields[fields.index("-") + 1] == "cgroup2"
        ]
    for root, mount in mounts:
        if own is not None and (own + "/").startswith(root.rstrip("/") + "/"):
            probe = Path(mount, own[len(root) :].lstrip("/"), f"aiotimer-probe-{name}")
            try:
                probe.mkdir()
            except OSError:
                continue
            probe.rmdir()
            return True
    return False
