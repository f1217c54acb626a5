"""Where this process's cgroup v2 is seen (pure: ``/proc/self/cgroup`` and
``/proc/self/mountinfo`` texts in, paths out)."""

from __future__ import annotations

from pathlib import Path

from aiotimer._edges.cgroups import cgroup_dirs

HYBRID = """\
31 24 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
33 31 0:29 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_the_unified_mount_of_a_hybrid_system() -> None:
    cgroups = "4:memory:/elsewhere\n0::/a/b\n"
    assert cgroup_dirs(cgroups, HYBRID) == [Path("/sys/fs/cgroup/unified/a/b")]
    assert cgroup_dirs("0::/\n", HYBRID) == [Path("/sys/fs/cgroup/unified")]


def test_a_mount_of_a_subtree_shows_only_what_is_below_its_root() -> None:
    # A container's view: the host's /docker/abc mounted at /sys/fs/cgroup.
    mountinfo = "50 40 0:30 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert cgroup_dirs("0::/docker/abc/x\n", mountinfo) == [Path("/sys/fs/cgroup/x")]
    assert cgroup_dirs("0::/docker/abcd\n", mountinfo) == [], "a sibling is not below"


def test_escaped_mount_points_and_optional_fields() -> None:
    mountinfo = "50 40 0:30 / /mnt/my\\040cgroups rw shared:7 master:1 - cgroup2 none rw\n"
    assert cgroup_dirs("0::/x\n", mountinfo) == [Path("/mnt/my cgroups/x")]


def test_no_cgroup_v2() -> None:
    assert cgroup_dirs("4:memory:/x\n", HYBRID) == [], "in no cgroup v2"
    assert cgroup_dirs("0::/x\n", HYBRID.replace("cgroup2 cgroup2", "tmpfs tmpfs")) == []
    assert cgroup_dirs("0::/x\n", "garbage\n\n") == []
