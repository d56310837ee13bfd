"""The rule of a profile diff and the classification of one level's matched items: each item's status, its row,
and per status the items and their summed times (ns)."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

from xstack.analyze._diff_read import Timing
from xstack.analyze.result import Column
from xstack.text import format_ns_setting

Status = Literal["added", "removed", "slower", "faster", "unchanged", "not compared"]
STATUSES: tuple[Status, ...] = ("added", "removed", "slower", "faster", "unchanged", "not compared")
K = TypeVar("K", bound=Hashable)
NESTED = ("layer", "op")
"""Levels whose items nest: their sums add self times, so that no time is counted twice."""
NOTCH: Final = 1.58
"""A boxplot's notch: a median's half-width of about 95% confidence is this times the IQR over the square root of
the samples (McGill, Tukey and Larsen, 1978)."""
NOTCH_MIN_ITERATIONS: Final = 10
"""The fewest measured iterations of each side for their notches to judge a change the spreads did not."""
MEAN_Z: Final = 1.96
"""A mean's half-width of about 95% confidence is this times its standard error: how two runs' mean steps are judged
where the spread of their medians hides their change (``Rule._means``)."""
HOST_LEVELS = ("layer", "op")
"""Levels timed on the host clock: where a run's host times are inflated by counter replay, their matched items
get no verdict (kernel times, measured on the device, keep theirs)."""


@dataclass(frozen=True)
class Rule:
    """When a difference counts: both floors, and the spread where both sides have statistics (or, where the spread
    hides it, the medians' notches, ``_notches``, or two mean steps' intervals, ``_means``)."""

    threshold: float = 0.05
    """Relative floor: a fraction of A's time."""
    min_delta_ns: int = 1_000
    """Absolute floor, in ns."""
    min_iterations: int = 3
    """Fewest measured iterations for a side's spread to be used."""

    def floors(self, min_delta_ns: int | None = None) -> str:
        """``5% and 1 us``: the two floors as set (``min_delta_ns`` in place of the rule's absolute one)."""
        floor = self.min_delta_ns if min_delta_ns is None else min_delta_ns
        return f"{self.threshold * 100:g}% and {format_ns_setting(floor)}"

    def classify(self, a: Timing | None, b: Timing | None) -> tuple[Status, float | None]:
        """The status of one matched item, and the spread its change was measured against (None: floors only)."""
        if a is None:
            return "added", None
        if b is None:
            return "removed", None
        delta = b.value_ns - a.value_ns
        spread_a, spread_b = a.spread_ns(self.min_iterations), b.spread_ns(self.min_iterations)
        noise = spread_a + spread_b if spread_a is not None and spread_b is not None else None
        if abs(delta) < max(self.threshold * a.value_ns, self.min_delta_ns, 1):
            return "unchanged", noise
        if noise is not None and abs(delta) <= noise:
            # iterations that alternate (a long wait for a batch, then short ones) spread far below the median; the
            # medians still differ where their notches do not overlap (median +- 1.58 IQR / sqrt(n), McGill et al.)
            notches = self._notches(a, b)
            if notches is None:
                notches = self._means(a, b)
            if notches is None or abs(delta) <= notches:
                return "unchanged", noise
        return ("slower" if delta > 0 else "faster"), noise

    def _means(self, a: Timing, b: Timing) -> float | None:
        """Where both sides are means of their measured steps: their 95% half-widths added (``MEAN_Z`` standard errors
        each), beyond which the means differ; None where a side lacks its standard error or enough iterations. A
        DataLoader whose steps alternate between a long wait and short ones (a median of 8 ms, a 5th percentile of
        0.2 ms) spreads below its median by nearly all of it, and a mean step that went from 9.6 ms to 3.3 ms over 100
        steps each was judged unchanged against that spread."""
        sides = [(t.sem_ns, t.n) for t in (a, b)]
        if any(sem is None or n is None or n < max(self.min_iterations, NOTCH_MIN_ITERATIONS) for sem, n in sides):
            return None
        return sum(MEAN_Z * float(sem or 0) for sem, _ in sides)

    def _notches(self, a: Timing, b: Timing) -> float | None:
        """The half-widths of both sides' median notches added (1.58 IQR / sqrt(n) each): medians further apart
        differ at about 95% confidence. None where a side lacks its interquartile range or enough iterations."""
        sides = [(t.iqr_ns, t.n) for t in (a, b)]
        if any(iqr is None or n is None or n < max(self.min_iterations, NOTCH_MIN_ITERATIONS) for iqr, n in sides):
            return None
        return sum(NOTCH * float(iqr or 0) / math.sqrt(n or 1) for iqr, n in sides)


TIMES = [
    Column("A", "ns", "time in A: median per call"),
    Column("B", "ns", "time in B"),
    Column("delta", "ns", "B - A (added: B's time; removed: minus A's time)"),
    Column("change", "pct", "delta in percent of A's time"),
    Column(
        "noise",
        "ns",
        "the combined low-side spread (median - p5) of the two runs' iterations that the change "
        "had to exceed, unless the medians' notches (1.58 IQR / sqrt(n) each; a mean step's 95% intervals, 1.96 "
        "standard errors each) do not overlap (-: judged by the "
        "floors only)",
    ),
]
STATUS_COLUMN = Column(
    "status",
    "",
    "added, removed, slower, faster or unchanged (beyond noise; a CPU time: more or less); not compared: a host "
    "time of a run timed under counter replay, or the wall time of a run cut short before any measured step",
)
SELF_DELTA = Column(
    "self delta", "ns", "B - A of the self time (less the nested spans of the level): what the summary's sums add"
)


@dataclass
class Table:
    """The classified rows of one level, and per status the items and their summed times (ns)."""

    rows: list[tuple[Any, ...]]
    counts: dict[str, int]
    sum_a: dict[str, int]
    sum_b: dict[str, int]
    floors_only: int
    matched: int
    judged: bool = True
    """False where the matched items got no verdict (``classify``'s ``judge``)."""

    @property
    def totals(self) -> dict[str, int | None]:
        """Time added (items only B has), removed (only A), lost (slower items) and gained (faster), and the net;
        lost, gained and net are None where the matched items got no verdict (unknown, not 0)."""
        added, removed = self.sum_b["added"], self.sum_a["removed"]
        if not self.judged:
            return {"added_ns": added, "removed_ns": removed, "lost_ns": None, "gained_ns": None, "net_ns": None}
        lost, gained = self.sum_b["slower"] - self.sum_a["slower"], self.sum_a["faster"] - self.sum_b["faster"]
        return {"added_ns": added, "removed_ns": removed, "lost_ns": lost, "gained_ns": gained,
                "net_ns": added - removed + lost - gained}  # fmt: skip


def classify(
    a: dict[K, Timing],
    b: dict[K, Timing],
    rule: Rule,
    cells: Callable[[K, Timing | None, Timing | None], tuple[Any, ...]],
    nested: bool = False,
    judge: bool = True,
) -> Table:
    """Classify every item; a ``nested`` level's rows end with the change of the self time, and its sums add self
    times (a layer's time holds its sub-layers', which are items of their own). Without ``judge`` (host times
    inflated by counter replay), an item both runs have is "not compared": its times, no verdict nor noise."""
    keyed: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = []
    zero: dict[str, int] = dict.fromkeys(STATUSES, 0)
    t = Table([], dict(zero), dict(zero), dict(zero), floors_only=0, matched=0, judged=judge)
    for key in list(a) + [k for k in b if k not in a]:
        ta, tb = a.get(key), b.get(key)
        status, noise = rule.classify(ta, tb) if judge or ta is None or tb is None else ("not compared", None)
        t.counts[status] += 1
        t.sum_a[status] += own_ns(ta)
        t.sum_b[status] += own_ns(tb)
        if ta is not None and tb is not None:
            t.matched += 1
            t.floors_only += judge and noise is None
        delta = (ns(tb) or 0) - (ns(ta) or 0)
        pct = 100.0 * (tb.value_ns - ta.value_ns) / ta.value_ns if ta and tb and ta.value_ns else None
        row = (status, *cells(key, ta, tb), ns(ta), ns(tb), delta, pct, ns_or_none(noise))
        own = own_ns(tb) - own_ns(ta)
        # a nested level by the change of its own time first: a model called 20 times a step would otherwise
        # fill the top rows with its root's calls, each carrying the change of the layer inside it
        order = (status == "unchanged", -abs(own) if nested else 0, -abs(delta), str(row[1:-5]))
        keyed.append((order, row + ((own,) if nested else ())))
    t.rows = [row for _, row in sorted(keyed, key=lambda kr: kr[0])]
    return t


def own_ns(t: Timing | None) -> int:
    """What a level's sums add of an item, in whole ns (``Timing.own_ns``; 0 for an item a side lacks)."""
    return 0 if t is None else round(t.own_ns)


def ns_or_none(v: float | None) -> int | None:
    """``v`` in whole ns, None staying None."""
    return None if v is None else round(v)


def ns(t: Timing | None) -> int | None:
    """An item's time in whole ns (None for an item a side lacks)."""
    return None if t is None else round(t.value_ns)


RULE_NOTE = (
    "A change counts when |delta| reaches the relative and absolute floors and, where both runs have iteration "
    "statistics, exceeds the combined low-side spread (median - p5) of the two runs: a merged run's statistics, "
    "else the run's measured steps (per step, an item's time per call)."
)
