"""The README's examples, run the way a user runs them.

Everything is read from README.md at test time, never copied here:

- the first two code blocks are the two commands (the demo, the whole test suite); they
  install aiotimer, so they are not run, but the second must be the one `.ci/run` runs;
- every ```python block is a program whose first line names its file
  (``# pipeline.py: ...``); all are saved into one fresh directory, where the README's
  commands then run, as written, through ``bash``, with this interpreter's ``bin``
  directory first on ``PATH`` (so ``python`` and ``aiotimer`` are the installed ones);
- example 1: the block that starts ``aiotimer serve`` is two terminals: its first command
  runs in the background (a real server) until the test stops it with SIGINT, as Ctrl-C
  would; once the server serves, its second command runs the pipeline; meanwhile the
  commands of the block with ``aiotimer status`` run against that server; after it has
  stopped, the README's ``aiotimer status --event-log ...`` runs too, once ``aiotimer
  status`` has that option;
- example 2: ``python agent.py``; example 3: the block with ``aiotimer run``.

And the README holds at most 3,000 words, and its links (and docs/performance.md's) to
files of the repository resolve. Each example takes a few seconds; every wait is bounded.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_WORDS = 3000
#: The bound on each command; each example needs a few seconds on an idle machine.
BOUND = 60.0

DEMO = "python -m pip install -e . && python -m aiotimer demo"
SUITE = 'python -m pip install -e ".[test]" && python -m pytest -n 4 --dist loadfile'

#: The programs the README's examples consist of; each is run by a test below.
PROGRAMS = {"pipeline.py", "agent.py", "worker.py"}


@dataclass(frozen=True)
class Block:
    lang: str
    text: str

    @property
    def commands(self) -> list[str]:
        return [line for line in self.text.splitlines() if line.strip()]


def blocks(markdown: str) -> list[Block]:
    """The fenced code blocks of ``markdown``, in order (indented fences too)."""
    found: list[Block] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        opening = re.match(r"^( *)```(\S*)\s*$", lines[i])
        i += 1
        if opening is None:
            continue
        indent = len(opening.group(1))
        body: list[str] = []
        while i < len(lines) and not re.match(r"^ *```\s*$", lines[i]):
            body.append(lines[i][indent:])
            i += 1
        assert i < len(lines), f"an unclosed code block: {body[:1]}"
        i += 1
        found.append(Block(opening.group(2), "\n".join(body) + "\n"))
    return found


def readme() -> str:
    return README.read_text(encoding="utf-8")


def block_with(text: str, lang: str = "bash") -> Block:
    """The one ``lang`` block of the README that contains ``text``."""
    matching = [b for b in blocks(readme()) if b.lang == lang and text in b.text]
    assert len(matching) == 1, f"expected one {lang} block with {text!r}, found {len(matching)}"
    return matching[0]


def programs() -> dict[str, str]:
    """The README's python blocks, by the file name each names on its first line."""
    named: dict[str, str] = {}
    for block in blocks(readme()):
        if block.lang != "python":
            continue
        first = block.text.splitlines()[0]
        match = re.match(r"^# ([\w-]+\.py)\b", first)
        assert match, f"a python block must start with `# NAME.py`: {first!r}"
        assert match.group(1) not in named, f"two python blocks named {match.group(1)}"
        named[match.group(1)] = block.text
    return named


def environment() -> dict[str, str]:
    """The user's shell after the install: the interpreter's ``bin`` first on PATH, and
    this checkout imported (by ``python`` and the ``aiotimer`` command alike)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for name in ("AIOTIMER_FIFO", "TORCHELASTIC_TIMER_FILE"):
        env.pop(name, None)
    if shutil.which("aiotimer", path=env["PATH"]) is None:
        pytest.fail("no `aiotimer` command next to the interpreter: install aiotimer first")
    return env


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A fresh directory holding the README's programs (short, for socket paths)."""
    with tempfile.TemporaryDirectory(prefix="aiotimer-readme-") as tmp:
        for name, text in programs().items():
            (Path(tmp) / name).write_text(text, encoding="utf-8")
        yield Path(tmp)


def run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``command`` through bash in ``cwd``, as a user types it; fails past :data:`BOUND`."""
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (
        f"{result.args[-1]!r} exited {result.returncode}\n"
        f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    )
    return result.stdout


# -- the shape of the file ------------------------------------------------------------


def test_readme_starts_with_the_demo_and_the_test_suite_commands() -> None:
    text = readme()
    found = blocks(text)
    assert [b.text.strip() for b in found[:2]] == [DEMO, SUITE]
    before_first = text.split("```", 1)[0]
    assert "\n## " not in before_first, "the commands must come before any section"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert f"step bash -c '{SUITE}'" in ci, ".ci/run must run the README's test command"


def test_readme_is_at_most_3000_words() -> None:
    words = len(readme().split())
    assert words <= MAX_WORDS, f"README.md has {words} words, more than {MAX_WORDS}"


@pytest.mark.parametrize("name", ["README.md", "docs/performance.md"])
def test_links_to_repository_files_resolve(name: str) -> None:
    page = ROOT / name
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        assert path.exists(), f"{name} links to {target}, which does not exist"


def test_every_python_block_is_a_program_run_here() -> None:
    assert set(programs()) == PROGRAMS


# -- the three ways to use it ---------------------------------------------------------


def wait_until_serving(server: subprocess.Popen[str], fifo: Path) -> None:
    """Until the server's marker and control socket exist (what `aiotimer status` and a
    worker's client look for), or fail: the server exited, or the bound passed."""
    marker, control = Path(f"{fifo}.aiotimer"), Path(f"{fifo}.control") / "http.sock"
    deadline = time.monotonic() + BOUND
    while not (marker.exists() and control.exists()):
        if server.poll() is not None:
            pytest.fail(f"the server exited with {server.returncode}")
        if time.monotonic() > deadline:
            pytest.fail(f"the server did not serve {fifo} within {BOUND}s")
        time.sleep(0.05)


def test_example_1_a_pipeline_against_aiotimer_serve(workdir: Path) -> None:
    serve, worker = block_with("python pipeline.py").commands
    named = re.search(r"--fifo (\S+)", serve)
    assert named is not None, serve
    fifo = workdir / named.group(1)
    server = subprocess.Popen(
        ["bash", "-c", f"exec {serve}"],
        cwd=workdir,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until_serving(server, fifo)
        out = ok(run(worker, workdir))
        assert "item 2: timed out" in out
        assert all(f"item {n}: done" in out for n in (0, 1, 3)), out

        status, metrics = block_with("aiotimer status --fifo").commands
        assert "RUNNING" in ok(run(status, workdir))
        # curl is not part of a fresh machine with only Python and pip: the metrics
        # command runs where curl is (as on CI's machine), and is skipped otherwise.
        if shutil.which("curl") is not None:
            assert "aiotimer_cancelled_total" in ok(run(metrics, workdir))
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)  # what Ctrl-C in terminal 1 does
        _, err = server.communicate(timeout=BOUND)
    assert server.returncode == 0, err[-3000:]

    after = re.search(r"`(aiotimer status --event-log [^`]+)`", readme())
    assert after is not None, "the README tells how to read what happened in a run"
    if "--event-log" in ok(run("aiotimer status --help", workdir)):
        ok(run(after.group(1), workdir))


def test_example_2_an_agent_embedding_the_server(workdir: Path) -> None:
    assert "`python agent.py`" in readme()
    out = ok(run("python agent.py", workdir))
    assert "worker exit code: -9" in out, out


def test_example_3_aiotimer_run(workdir: Path) -> None:
    (command,) = block_with("aiotimer run").commands
    out = ok(run(command, workdir))
    assert "rank 0 done (restart 0)" in out, out
    assert "rank 1 done (restart 1)" in out, out
