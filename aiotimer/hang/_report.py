"""The hang report: which rank is the odd one out (pure: no I/O, no clock reads).

When a collective hangs, every rank's timer expires, but the ranks are not alike: one
is stuck somewhere else (its data loader, a lock) while the others wait for it in the
collective. :func:`build_report` takes one :class:`RankStacks` per rank (its stacks read
from its dump, or why no dump came) and groups the ranks by *where they are*:

    key = (innermost frame of the main thread,
           innermost frame of the task holding the loop,
           open timed blocks)

A rank without an answer forms the group "no answer". Groups are ordered smallest
first (then by their first rank), so the report leads with the minority: a unique
smallest group is named as the one that differs ("rank 2 of 4 differs: ..."); when
several groups tie for smallest, the summary says so instead of picking one. Every
rank is in exactly one group.

A place is described by its innermost function and the innermost frame of the user's
own code (outside site-packages and the standard library), which is the line the user
wrote: ``all_reduce (train.py:120)``.

Rendering is size-bounded: each rank's raw dump is cut at :data:`MAX_RANK_TEXT`
characters and the whole text report at :data:`MAX_REPORT_TEXT`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from aiotimer.hang._parse import Frame, parse_stacks

__all__ = [
    "MAX_RANK_TEXT",
    "MAX_REPORT_TEXT",
    "HangReport",
    "RankGroup",
    "RankStacks",
    "build_report",
]

#: The most characters of one rank's raw dump a report keeps.
MAX_RANK_TEXT: Final[int] = 8 * 1024
#: The most characters of a whole text report.
MAX_REPORT_TEXT: Final[int] = 256 * 1024
#: The most frames of one stack a report lists per group.
MAX_FRAMES: Final[int] = 30
_LIBRARY: Final = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")


@dataclass(frozen=True, slots=True)
class RankStacks:
    """One rank's stacks (frames innermost first), or why it gave none (``missing``).

    ``node`` names the rank's node in a job-level report (``None`` on one node);
    ``text`` is the raw dump.
    """

    rank: int
    pid: int = 0
    main: tuple[Frame, ...] = ()
    task: tuple[Frame, ...] = ()
    task_name: str | None = None
    blocks: tuple[str, ...] = ()
    text: str = ""
    missing: str | None = None
    node: str | None = None

    @classmethod
    def from_dump(
        cls, rank: int, pid: int, text: str, *, blocks: Iterable[str] = (), node: str | None = None
    ) -> RankStacks:
        """Read ``text`` (a dump's text, :func:`parse_stacks`); ``blocks`` are open timed
        blocks known from elsewhere (the server's table), merged with the dump's."""
        parsed = parse_stacks(text)
        merged = tuple(dict.fromkeys((*parsed.blocks, *blocks)))
        return cls(
            rank=rank,
            pid=pid,
            main=parsed.main,
            task=parsed.task,
            task_name=parsed.task_name,
            blocks=merged,
            text=_clip(text, MAX_RANK_TEXT),
            node=node,
        )

    @property
    def key(self) -> tuple[object, ...]:
        """Where the rank is: what :func:`build_report` groups by."""
        if self.missing is not None:
            return ("no answer",)
        return (self.main[:1], self.task[:1], tuple(sorted(self.blocks)))

    def where(self) -> str:
        """The place in words: ``in `f` (file.py:N) inside block `step```."""
        if self.missing is not None:
            return f"no answer ({self.missing})"
        parts = []
        if self.main:
            parts.append(f"in {_place(self.main)}")
        if self.task:
            parts.append(f"task {self.task_name!r} in {_place(self.task)}")
        text = ", ".join(parts) if parts else "in no frame read from its dump"
        if self.blocks:
            listed = ", ".join(f"`{b}`" for b in sorted(self.blocks)[:3])
            more = f" (+{len(self.blocks) - 3})" if len(self.blocks) > 3 else ""
            text += f" inside block {listed}{more}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "rank": self.rank,
            "node": self.node,
            "pid": self.pid,
            "main": [_frame_dict(f) for f in self.main[:MAX_FRAMES]],
            "task": [_frame_dict(f) for f in self.task[:MAX_FRAMES]],
            "task_name": self.task_name,
            "blocks": list(self.blocks),
            "missing": self.missing,
            "text": self.text,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankStacks:
        """The inverse of :meth:`to_dict` (a node's part of a job-level report).

        Raises:
            ValueError: a field is missing or of the wrong type.
        """
        try:
            return cls(
                rank=int(data["rank"]),
                pid=int(data.get("pid") or 0),
                main=tuple(_frame_from(f) for f in data.get("main") or ()),
                task=tuple(_frame_from(f) for f in data.get("task") or ()),
                task_name=data.get("task_name"),
                blocks=tuple(str(b) for b in data.get("blocks") or ()),
                text=_clip(str(data.get("text") or ""), MAX_RANK_TEXT),
                missing=None if data.get("missing") is None else str(data["missing"]),
                node=None if data.get("node") is None else str(data["node"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a rank's stacks: {exc}") from None


@dataclass(frozen=True, slots=True)
class RankGroup:
    """Ranks that are in the same place; ``ranks`` ascending."""

    ranks: tuple[RankStacks, ...]

    @property
    def where(self) -> str:
        """The group's place in words (its first rank's)."""
        return self.ranks[0].where()


@dataclass(frozen=True, slots=True)
class HangReport:
    """Every rank grouped by place, smallest group first (see the module docs)."""

    groups: tuple[RankGroup, ...]
    cause: str = ""
    generation: int = 0
    odd: tuple[int, ...] = field(default=())  # the unique minority's ranks, if any

    @property
    def size(self) -> int:
        """How many ranks the report holds."""
        return sum(len(g.ranks) for g in self.groups)

    def summary(self) -> str:
        """One line: the odd one out first, then the rest."""
        n = self.size
        if not self.groups:
            return "no rank to report"
        if len(self.groups) == 1:
            only = self.groups[0]
            return f"all {n} ranks alike: {only.where}" if n > 1 else f"{_names(only)} {only.where}"
        rest = "; ".join(f"{_count(g)} {g.where}" for g in self.groups[1:])
        first = self.groups[0]
        if self.odd:
            verb = "differs" if len(first.ranks) == 1 else "differ"
            return f"{_names(first)} of {n} {verb}: {first.where}; {rest}"
        tied = sum(1 for g in self.groups if len(g.ranks) == len(first.ranks))
        return f"no single odd one out ({tied} groups of {len(first.ranks)} tie): " + "; ".join(
            f"{_names(g)} {g.where}" for g in self.groups
        )

    def to_text(self) -> str:
        """The summary, then each group with its ranks and stacks; cut at
        :data:`MAX_REPORT_TEXT` characters."""
        out = [f"hang report: {self.summary()}"]
        if self.cause:
            out.append(f"cause: {self.cause}")
        for i, group in enumerate(self.groups, 1):
            out.append("")
            out.append(f"== group {i}: {_names(group)} ({len(group.ranks)}): {group.where}")
            head = group.ranks[0]
            if head.main:
                out.append("  main thread (innermost first):")
                out.extend(f"    {f.where}" for f in head.main[:MAX_FRAMES])
            if head.task:
                out.append(f"  task {head.task_name!r} holding the loop (innermost first):")
                out.extend(f"    {f.where}" for f in head.task[:MAX_FRAMES])
            for rank in group.ranks:
                if rank.text:
                    label = _rank_label(rank)
                    out.append(f"  -- {label} (pid {rank.pid}) dump:")
                    out.extend(f"  | {line}" for line in rank.text.splitlines())
        return _clip("\n".join(out) + "\n", MAX_REPORT_TEXT)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: summary, odd ranks, groups with every rank's stacks."""
        return {
            "summary": self.summary(),
            "cause": self.cause,
            "generation": self.generation,
            "ranks": self.size,
            "odd": list(self.odd),
            "groups": [
                {"where": g.where, "ranks": [r.to_dict() for r in g.ranks]} for g in self.groups
            ],
        }


def build_report(
    ranks: Sequence[RankStacks], *, cause: str = "", generation: int = 0
) -> HangReport:
    """Group ``ranks`` by place, smallest group first (see the module docs).

    Raises:
        ValueError: a rank (a ``(node, rank)`` pair) appears twice.
    """
    seen: set[tuple[str | None, int]] = set()
    buckets: dict[tuple[object, ...], list[RankStacks]] = {}
    for r in ranks:
        ident = (r.node, r.rank)
        if ident in seen:
            raise ValueError(f"rank {r.rank} appears twice in one hang report")
        seen.add(ident)
        buckets.setdefault(r.key, []).append(r)
    groups = sorted(
        (RankGroup(tuple(sorted(b, key=_order))) for b in buckets.values()),
        key=lambda g: (len(g.ranks), _order(g.ranks[0])),
    )
    odd: tuple[int, ...] = ()
    if len(groups) > 1 and len(groups[0].ranks) < len(groups[1].ranks):
        odd = tuple(r.rank for r in groups[0].ranks)
    return HangReport(groups=tuple(groups), cause=cause, generation=generation, odd=odd)


def _order(r: RankStacks) -> tuple[str, int]:
    return (r.node or "", r.rank)


def _place(frames: tuple[Frame, ...]) -> str:
    inner = frames[0]
    user = next((f for f in frames if not any(m in f.file for m in _LIBRARY)), None)
    if user is None or user is inner:
        return f"`{inner.function}` ({inner.where.rsplit(' (', 1)[1]}"
    return f"`{inner.function}` ({user.where.rsplit(' (', 1)[1]}"


def _rank_label(r: RankStacks) -> str:
    return f"rank {r.rank}" if r.node is None else f"rank {r.rank} on {r.node}"


def _names(g: RankGroup) -> str:
    labels = [
        _rank_label(r) if i == 0 else _rank_label(r).removeprefix("rank ")
        for i, r in enumerate(g.ranks[:8])
    ]
    if len(g.ranks) > 1:
        labels[0] = "ranks " + labels[0].removeprefix("rank ")
    more = f" (+{len(g.ranks) - 8})" if len(g.ranks) > 8 else ""
    return ", ".join(labels) + more


def _count(g: RankGroup) -> str:
    return "1 rank" if len(g.ranks) == 1 else f"{len(g.ranks)} ranks"


def _frame_dict(f: Frame) -> dict[str, Any]:
    return {"function": f.function, "file": f.file, "line": f.line}


def _frame_from(d: Mapping[str, Any]) -> Frame:
    return Frame(str(d["function"]), str(d["file"]), int(d["line"]))


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: limit - 40] + f"\n[... cut at {limit} characters]\n"
