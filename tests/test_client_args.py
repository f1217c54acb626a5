"""expires()/expires_at() name the argument of a wrong type and the type it takes."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from aiotimer import expires, expires_at


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"after": "10"},
            "expires(): after must be a number of seconds (int or float) or learned(...), "
            "got str '10'",
        ),
        ({"after": None}, "expires(): after must be a number of seconds"),
        ({"after": 10, "scope": 123}, "expires(): scope must be a str, got int 123"),
        ({"after": 10, "signal": "KILL"}, "expires(): signal must be an int signal number"),
        ({"after": 10, "signal": 9.0}, "got float 9.0"),
        ({"after": 10, "signal": True}, "got bool True"),
        ({"after": 10, "kill_after": "1"}, "expires(): kill_after must be a number of seconds"),
    ],
)
def test_expires_names_the_argument_and_its_type(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        expires(**kwargs)


def test_expires_at_names_the_argument_and_its_type() -> None:
    with pytest.raises(TypeError, match=r"expires_at\(\): deadline must be a time.monotonic"):
        expires_at("soon")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"expires_at\(\): scope must be a str"):
        expires_at(time.monotonic() + 1, scope=b"x")  # type: ignore[arg-type]


def test_right_types_still_make_a_block() -> None:
    assert expires(after=1, scope="s", signal=signal.SIGTERM, kill_after=0.5).scope == "s"
    assert expires(after=1.5, signal=-1).scope
