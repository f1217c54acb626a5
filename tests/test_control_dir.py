"""The control socket's directory: made private, or reused only if it is ours and private."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import anyio
import pytest

from aiotimer.control.server import ControlServer
from aiotimer.errors import ControlError


@pytest.mark.asyncio
async def test_a_missing_directory_is_made_0700_and_removed_after(tmp_path: Path) -> None:
    path = tmp_path / "t.fifo.control" / "http.sock"
    async with anyio.create_task_group() as tg:
        await tg.start(ControlServer(path, []).serve)
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert stat.S_ISSOCK(path.lstat().st_mode)
        tg.cancel_scope.cancel()
    assert not path.parent.exists()


@pytest.mark.asyncio
@pytest.mark.parametrize("plant", ["group-writable", "symlink", "another user's"])
async def test_a_directory_that_is_not_ours_and_private_is_refused(
    tmp_path: Path, plant: str
) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    control = tmp_path / "t.fifo.control"
    if plant == "symlink":
        control.symlink_to(real)
        problem = "symbolic link"
    elif plant == "group-writable":
        control.mkdir()
        os.chmod(control, 0o770)
        problem = "group or others may write to it"
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to give the directory to another user")
        control.mkdir(mode=0o700)
        os.chown(control, 65534, 65534)
        problem = "belongs to uid 65534"
    with pytest.raises(ControlError) as info:
        await ControlServer(control / "http.sock", []).serve()
    assert f"refusing the control directory {control}: " in str(info.value)
    assert problem in str(info.value)
    assert list(real.iterdir()) == [] and list(control.iterdir()) == []
