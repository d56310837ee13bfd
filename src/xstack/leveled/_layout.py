"""Where the merged spans go on the timeline: one representative iteration, each span as long as its median.

A span's median comes from its own pass, its position from the same pass: its median offset from its parent's
start there, scaled by how much shorter the parent is in the merged profile than in that pass (the deeper
pass slowed the parent down). Host spans then follow their earlier siblings on the same thread without
overlapping them and, when they fit, end inside their parent. Device spans (kernels, copies) keep their
unscaled offset from their launch: they run asynchronously, not inside it.

Medians do not add up (the median of a sum is not the sum of medians), and a level's pass also records that
level's nested calls, so the children of a span can last longer together than it: those follow each other
from its start and end past it (``merge`` counts them in health).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from xstack.trace.schema import DEVICE_LEVELS


@dataclass(slots=True)
class Node:
    """A matched key: its level (``model@device`` for annotations on a device), its median duration, and its
    median offset and parent duration in its own pass."""

    key: int
    parent_key: int | None
    level: str
    dur_ns: int
    offset_ns: float
    parent_dur_ns: float
    tid: int | None
    name: str = ""
    start_ns: int = 0
    span_id: int = 0
    pos: int = 0
    """Its place among its parent's children of its level (the matched structure's order)."""


def _in_order(kids: list[Node]) -> list[Node]:
    """``kids``, in the order of their median offsets, with those of each level in their structure's order in the
    places that level's take: a span that some iterations lack has its median offset from those that have it
    and could pass a sibling that follows it in every iteration."""
    places: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(kids):
        places[node.level].append(i)
    ordered = list(kids)
    for slots in places.values():
        for i, node in zip(slots, sorted((kids[i] for i in slots), key=lambda n: n.pos), strict=True):
            ordered[i] = node
    return ordered


def layout(nodes: list[Node], root_start_ns: int) -> tuple[list[Node], int]:
    """Place ``nodes`` (one has no parent: the step) from ``root_start_ns``; number them by start.

    Returns the nodes reachable from the root, placed, and how many were not (their parent key was not
    matched).
    """
    children: dict[int | None, list[Node]] = defaultdict(list)
    for node in nodes:
        children[node.parent_key].append(node)
    roots = children.get(None, [])
    if len(roots) != 1:
        return [], len(nodes)
    root = roots[0]
    root.start_ns = root_start_ns
    placed = [root]
    queue = [root]
    while queue:
        parent = queue.pop()
        kids = _in_order(sorted(children.get(parent.key, ()), key=lambda n: (n.offset_ns, n.key)))
        _place(parent, kids)
        placed += kids
        queue += kids
    placed.sort(key=lambda n: (n.start_ns, -n.dur_ns))
    for i, node in enumerate(placed, 1):
        node.span_id = i
    return placed, len(nodes) - len(placed)


def on_device(level: str) -> bool:
    """Whether spans of this (matching) level run on a device: kernels, copies, device-side annotations."""
    return level in DEVICE_LEVELS or level.endswith("@device")


def _place(parent: Node, kids: list[Node]) -> None:
    lanes: dict[int | None, list[Node]] = defaultdict(list)  # host kids per thread, in offset order
    for kid in kids:
        if on_device(kid.level):
            kid.start_ns = parent.start_ns + round(kid.offset_ns)
            continue
        scale = parent.dur_ns / kid.parent_dur_ns if kid.parent_dur_ns > 0 else 1.0
        kid.start_ns = parent.start_ns + round(kid.offset_ns * scale)
        lanes[kid.tid].append(kid)
    for lane in lanes.values():
        _fit(lane, parent.start_ns, parent.start_ns + parent.dur_ns)


def _fit(lane: list[Node], start_ns: int, end_ns: int) -> None:
    """Spans of one thread one after the other, from their wanted starts, inside [start_ns, end_ns] when
    their durations fit in it: late ones move earlier, taking the gaps before them. When they do not fit
    (they were timed in a deeper pass than their parent), they follow each other with no gap from start_ns
    and end past end_ns."""
    if sum(n.dur_ns for n in lane) > end_ns - start_ns:
        at = start_ns
        for node in lane:
            node.start_ns, at = at, at + node.dur_ns
        return
    free = start_ns
    for node in lane:
        node.start_ns = max(node.start_ns, free)
        free = node.start_ns + node.dur_ns
    limit = end_ns
    for node in reversed(lane):
        node.start_ns = min(node.start_ns, limit - node.dur_ns)
        limit = node.start_ns
