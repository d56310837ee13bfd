"""``xstack diff A B``: what changed between two profiles, beyond noise.

``diff_profiles(a, b)`` matches the layers, ops and kernels of one run of each store by structure and
classifies every item as added, removed, slower, faster or unchanged; it totals the time added, removed,
lost (slower items) and gained (faster items) per level and compares the step latency and the model stages (a
run's tail, what followed its last step, left out: teardown, not a stage of the loop). Layers and ops nest, so
their totals add self times (an item's time less that of the items of its level it encloses): no time is
counted twice, and a level's totals never exceed the time its top items cover. What only one run has (a level,
steps, a host trace) is named and the rest compared: runs without steps compare their host wall times (a Darshan
log's job run time), and kernels known by their counters alone (an Nsight Compute CSV) compare with those of
another such run, never with a kernel trace's, whose times are measured otherwise. Where a run's host times are
inflated by counter replay (a trace taken under the CUPTI range profiler, a run under Nsight Compute:
``RunContext.replayed_timing``), its host-time items get no verdict: the step (or wall time), the stages, and the
layers and ops both runs have are "not compared", their times shown, and their levels have no time lost, gained
or net (None in the facts); items only one run has are still added or removed, and kernel times, measured on the
device, are judged as ever. Its tables are
``Result`` objects (``diff.summary``, ``diff.layers``, ``diff.ops``, ``diff.kernels``, and ``diff.io``: the runs'
file I/O, each measure in its own unit, ``_diff_io``) that print in a terminal, render in the HTML report and
convert to JSON, markdown or CSV.

Notes: the change of an item is ``delta = B - A`` of its median time per call (a kernel name: of its calls, whose
number per step each run shows: a name called fewer times is no faster kernel). It counts as a change only when
``|delta|`` reaches both floors, ``threshold`` times A's time (default 5%) and ``min_delta_ns`` (default 1 us),
and, where both runs carry iteration statistics, when it also exceeds the combined spread of the two
distributions: ``|delta| > (median_A - p5_A) + (median_B - p5_B)``. A merged leveled run carries them on its spans
(``stats.*``). A run that is not merged (a live run, a pass of a leveled run, an imported trace with
``ProfilerStep`` spans) takes them from its own measured steps, past the warm-up: an item's p5 is that of its time
per call in each step, over the steps it occurs in (an item called once per step: its calls' own spread; one
called k times, its mean call per step's); the step latency's is that of the steps (``_diff_read``). The spread is
taken on the low side on purpose: noise on a shared machine makes iterations slower, never faster, so a few
descheduled iterations inflate p95 and the standard deviation (a p5..p95 overlap test would then hide even a 5x
slowdown), while the median and p5 stay put. For normally spread timings the rule asks for about 1.6 (sigma_A +
sigma_B). Items whose statistics come from fewer than ``min_iterations`` iterations (default 3), runs with fewer
measured steps than that, and runs with neither steps nor statistics (a Darshan log, an Nsight Compute CSV, a
trace without steps) are judged by the two floors alone, and the tables say so in a label (naming the run's
measured iterations where it has too few); where a run that is not merged gives the spread, the summary's label
says over how many iterations.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from xstack.analyze import _diff_format
from xstack.analyze._diff_io import io_result, read_io
from xstack.analyze._diff_read import LayerKey, OpKey, Side, Timing, read_side
from xstack.analyze._diff_rule import (
    HOST_LEVELS,
    NESTED,
    RULE_NOTE,
    SELF_DELTA,
    STATUS_COLUMN,
    STATUSES,
    TIMES,
    K,
    Rule,
    Status,
    Table,
    classify,
)
from xstack.analyze._diff_summary import summary as diff_summary
from xstack.analyze.context import HINTS, pick_run
from xstack.analyze.result import Chart, Column, Result, render_result
from xstack.errors import StoreError, UsageError
from xstack.text import counted
from xstack.trace.store import Store

__all__ = ["STATUSES", "ProfileDiff", "Rule", "Status", "diff_profiles"]


@dataclass
class ProfileDiff:
    """Two runs compared: which runs, the rule, and the five tables."""

    a: Side
    b: Side
    rule: Rule
    summary: Result
    layers: Result
    ops: Result
    kernels: Result
    io: Result

    @property
    def results(self) -> list[Result]:
        """The tables, summary first."""
        return [self.summary, self.layers, self.ops, self.kernels, self.io]

    def result(self, id: str) -> Result:
        """One table by id (``diff.layers``); KeyError when there is none."""
        for r in self.results:
            if r.id == id:
                return r
        raise KeyError(f"no diff table {id!r}")

    def heading(self) -> str:
        """Which runs are compared, and the floors."""
        return f"A: {self.a.describe()}\nB: {self.b.describe()}\nchange = B - A; counted beyond {self.rule.floors()}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description: both runs, the rule and every table (``Result.to_dict``)."""
        sides = {k: _side_dict(s) for k, s in (("a", self.a), ("b", self.b))}
        rule = {"threshold_pct": self.rule.threshold * 100, "min_delta_ns": self.rule.min_delta_ns,
                "min_iterations": self.rule.min_iterations}  # fmt: skip
        return {**sides, "rule": rule, "results": [r.to_dict() for r in self.results]}

    def to_markdown(self) -> str:
        """Markdown: the heading, then each table as a markdown table."""
        return _diff_format.markdown(self.heading(), self.results)

    def to_csv(self) -> str:
        """One CSV of every table: a ``table`` column, then the union of the tables' columns."""
        return _diff_format.csv_text(self.results)

    def __rich__(self) -> RenderableType:
        return Group(
            Text(self.heading(), style="bold"), *(render_result(r, max_rows=len(r.rows)) for r in self.results)
        )


def diff_profiles(
    store_a: Store | str | os.PathLike[str],
    store_b: Store | str | os.PathLike[str],
    run_a: int | None = None,
    run_b: int | None = None,
    *,
    threshold: float = 0.05,
    min_delta_ns: int = 1_000,
    min_iterations: int = 3,
    top: int | None = None,
) -> ProfileDiff:
    """Compare run ``run_b`` of ``store_b`` with run ``run_a`` of ``store_a`` (a store or its path; default run:
    the last merged run, else the last run). ``threshold`` is a fraction (0.05 = 5%), ``min_delta_ns`` in ns;
    ``top`` keeps that many rows per table (the totals count every item)."""
    if threshold < 0 or min_delta_ns < 0 or min_iterations < 2 or (top is not None and top < 1):
        raise UsageError("diff: need threshold >= 0, min_delta_ns >= 0, min_iterations >= 2 and top >= 1")
    rule = Rule(threshold, min_delta_ns, min_iterations)
    with ExitStack() as stack:
        a = _open(store_a, stack)
        b = a if _same(store_a, store_b) else _open(store_b, stack)
        side_a = read_side(a, _run(a, run_a))
        side_b = read_side(b, _run(b, run_b))
        io = io_result(read_io(a, side_a.run_id, "A"), read_io(b, side_b.run_id, "B"), rule, top)
    return _build(side_a, side_b, rule, top, io)


def _open(store: Store | str | os.PathLike[str], stack: ExitStack) -> Store:
    if isinstance(store, Store):
        return store
    return stack.enter_context(Store.open(store))


def _same(a: Store | str | os.PathLike[str], b: Store | str | os.PathLike[str]) -> bool:
    if isinstance(a, Store) or isinstance(b, Store):
        return a is b
    return Path(a).resolve() == Path(b).resolve()


def _run(store: Store, run_id: int | None) -> int:
    if not store.run_ids():
        raise StoreError(f"{store.path}: the store holds no runs (import a trace or profile a program into it)")
    return pick_run(store, run_id)


def _side_dict(s: Side) -> dict[str, Any]:
    return {"store": s.path, "run_id": s.run_id, "name": s.name, "pass": s.pass_name, "merged": s.merged,
            "steps": s.steps, "batch_size": s.batch_size}  # fmt: skip


def _build(a: Side, b: Side, rule: Rule, top: int | None, io: Result) -> ProfileDiff:
    fallback = _fallback_label(a, b, rule)
    opts = (rule, fallback, top)
    layer_cols = [Column("layer"), Column("call", "count", "call index of the path in a step"), Column("type")]
    layers = _level("layer", a, b, a.layers, b.layers, "diff.layers", "Layers: added, removed, slower, faster",
                    layer_cols, _layer_cells, _HOW["layer"], opts)  # fmt: skip
    op_cols = [Column("layer", "", "nearest enclosing layer"), Column("call", "count", "that layer's call index"),
               Column("op"), Column("occurrence", "count", "earlier calls of the name in that layer call")]  # fmt: skip
    ops = _level("op", a, b, a.ops, b.ops, "diff.ops", "Ops: added, removed, slower, faster", op_cols,
                 _op_cells, _HOW["op"], opts)  # fmt: skip
    kernel_cols = [
        Column("kernel"),
        Column("calls A", "count", "the name's calls per measured step in A (in the run, where it has no steps)"),
        Column("calls B", "count", "the name's calls per measured step in B (in the run, where it has no steps)"),
    ]
    kernels = _level("kernel", a, b, a.kernels, b.kernels, "diff.kernels", "Kernels by name: added, removed, "
                     "slower, faster", kernel_cols, _kernel_cells, _HOW["kernel"], opts)  # fmt: skip
    kernels[0].labels += _calls_label(a, b)
    if not layers[0].missing:
        layers[0].labels += _retyped_label(a, b)
    summary = diff_summary(a, b, rule, {"layer": layers[1], "op": ops[1], "kernel": kernels[1]},
                           fallback or _spread_label(a, b))  # fmt: skip
    # a run without host times (an Nsight Compute CSV) has none to be inflated: its wall label says so
    replayed = [f"{n}'s host times are {s.replayed}" for n, s in (("A", a), ("B", b))
                if s.replayed and (s.steps or s.wall is not None)]  # fmt: skip
    summary.labels += replayed
    for result in (layers[0], ops[0]):
        result.labels += [] if result.missing else [f"{why}: {UNJUDGED}" for why in replayed]
    return ProfileDiff(a, b, rule, summary, layers[0], ops[0], kernels[0], io)


UNJUDGED = "the items both runs have are not compared, their times shown (added and removed items still said)"
"""What the layers' and ops' tables say of their matched items where a run's host times are inflated by counter
replay."""


MORE = "a larger --top lists more; --format csv or json without --top lists all"
"""How to list the rows ``--top`` left out of the layers', ops' and kernels' tables."""

_HOW = {
    "layer": "Layers are matched by layer.path and call index (the call's order among the path's calls in a step).",
    "op": "Ops are matched by their nearest enclosing layer (path and call), name and occurrence within it.",
    "kernel": "Kernels are matched by name and compared by their median time per call, as layers and ops are: a "
    "name called more or fewer times per step is not slower or faster for it (calls A and B show how often).",
}


def _layer_cells(key: LayerKey, ta: Timing | None, tb: Timing | None) -> tuple[Any, ...]:
    return (key[0], key[1], _layer_type(ta, tb))


def _layer_type(ta: Timing | None, tb: Timing | None) -> str:
    """The layer's module type, ``A -> B`` where the path holds a module of another type in B (an activation
    swapped): matched by path, its times compare two different modules."""
    types = [t.info for t in (ta, tb) if t is not None and t.info]
    return " -> ".join(types) if len(types) == 2 and types[0] != types[1] else (types[-1] if types else "")


def _retyped_label(a: Side, b: Side) -> list[str]:
    """Where layer paths both runs have hold modules of different types, which (matched by path, compared)."""
    both = [(p, a.layers[(p, c)].info, b.layers[(p, c)].info) for p, c in a.layers if (p, c) in b.layers]
    changed = sorted({row for row in both if row[1] and row[2] and row[1] != row[2]})
    if not changed:
        return []
    named = ", ".join(f"{p} ({ta} -> {tb})" for p, ta, tb in changed[:5])
    more = f" and {len(changed) - 5:,} more" if len(changed) > 5 else ""
    verb = "holds" if len(changed) == 1 else "hold"
    return [f"{counted(len(changed), 'layer path')} {verb} a module of another type in B: {named}{more}; matched "
            "by path, their times compare the two modules"]  # fmt: skip


def _op_cells(key: OpKey, ta: Timing | None, tb: Timing | None) -> tuple[Any, ...]:
    return (key[0], key[1] if key[1] >= 0 else None, key[2], key[3])  # call -1: outside any layer


def _kernel_cells(key: str, ta: Timing | None, tb: Timing | None) -> tuple[Any, ...]:
    return (key, _calls(ta), _calls(tb))


def _calls(t: Timing | None) -> int | float:
    """A kernel name's calls per measured step (whole where they are), or in the run where it has no steps."""
    if t is None:
        return 0
    if t.per_step is None:
        return t.count
    return int(t.per_step) if t.per_step.is_integer() else round(t.per_step, 2)


def _calls_label(a: Side, b: Side) -> list[str]:
    """Where kernel names both runs have are called a different number of times (per step, or in runs without
    steps), how many: compared per call, their time per step moved with the calls as well."""
    both = [k for k in a.kernels if k in b.kernels]
    changed = [k for k in both if _calls(a.kernels[k]) != _calls(b.kernels[k])]
    if not changed:
        return []
    per = "per step" if a.steps and b.steps else "in the run"
    which = f"{len(changed):,} of the {counted(len(both), 'kernel name')}" if len(changed) < len(both) else (
        "the kernel name" if len(both) == 1 else f"all {len(both):,} kernel names")  # fmt: skip
    return [
        f"{which} both runs have {'is' if len(changed) == 1 else 'are'} called a different number of times {per} "
        "(calls A, calls B): judged per call, as more or fewer calls do not make a kernel slower or faster; their "
        "time per step changes with the calls too"
    ]


def _level(
    level: str,
    a: Side,
    b: Side,
    items_a: dict[K, Timing],
    items_b: dict[K, Timing],
    id: str,
    title: str,
    columns: list[Column],
    cells: Callable[[K, Timing | None, Timing | None], tuple[Any, ...]],
    how: str,
    opts: tuple[Rule, str | None, int | None],
) -> tuple[Result, Table | None]:
    """One level's table, or the result saying what one run lacks, or why the two cannot be compared."""
    gap = _kernel_gap(a, b) if level == "kernel" else _level_gap(level, a, b)
    if gap is not None:
        return Result(id=id, title=title, missing=[gap[0]], hint=gap[1], notes=f"{how} {RULE_NOTE}"), None
    rule, fallback, top = opts
    nested = level in NESTED
    judge = level not in HOST_LEVELS or not (a.replayed or b.replayed)
    t = classify(items_a, items_b, rule, cells, nested, judge)
    times = [*TIMES, SELF_DELTA] if nested else TIMES
    result = _result(id, title, [STATUS_COLUMN, *columns, *times], t, how, fallback if judge else None, top, rule)
    if level == "kernel" and a.kernel_source == "replay":
        result.labels.append(_REPLAYED)
    for name, s in (("A", a), ("B", b)):
        if level == "kernel" and s.untimed_kernels:
            result.labels.append(f"{s.untimed_kernels:,} kernel calls of {name} have no duration: left out")
    return result, t


_REPLAYED = (
    "kernel times as Nsight Compute measured them, each kernel replayed alone (gpu__time_duration.sum), in both runs"
)


def _level_gap(level: str, a: Side, b: Side) -> tuple[str, str] | None:
    """What is missing and how to get it, where a run lacks the level; None where both have it."""
    lacking = [s for s in (a, b) if level not in s.levels]
    if not lacking:
        return None
    return level, f"{_which(a, lacking)} recorded no {level} spans; to compare them, {HINTS[level]}."


def _kernel_gap(a: Side, b: Side) -> tuple[str, str] | None:
    """Kernels compare when both runs time them the same way: both from a kernel trace, or both replayed by
    Nsight Compute (durations measured alone, under its clock and cache control, differ from a trace's)."""
    lacking = [s for s in (a, b) if s.kernel_source is None]
    if lacking:
        return "kernel", f"{_which(a, lacking)} recorded no kernel spans; to compare them, {HINTS['kernel']}."
    untimed = [s for s in (a, b) if s.kernel_source == "untimed"]
    if untimed:
        return "kernel durations", (f"The kernels of {_which(a, untimed)} carry counters but no duration; "
                                    f"to compare them, {HINTS['kernel durations']}.")  # fmt: skip
    if a.kernel_source != b.kernel_source:
        replayed = [s for s in (a, b) if s.kernel_source == "replay"]
        return "kernel times measured alike", (
            f"The kernel times of {_which(a, replayed)} were measured by Nsight Compute, each kernel replayed alone "
            "(its clocks and caches set for the replay), the other run's on its kernel trace: they do not compare. "
            "To compare kernels, profile both with the kernel level, or import an Nsight Compute CSV of each."
        )
    return None


def _which(a: Side, sides: list[Side]) -> str:
    return " and ".join(("A" if s is a else "B") + f" ({s.describe()})" for s in sides)


_NESTED_IDS = ("diff.layers", "diff.ops")
_BY_SELF = " of the self time, then of the time"
"""How the rows of a nested level (layers, ops) are ordered within a group."""


def _result(id: str, title: str, columns: list[Column], t: Table, how: str, fallback: str | None,
            top: int | None, rule: Rule) -> Result:  # fmt: skip
    rows = t.rows if top is None else t.rows[:top]
    labels = [fallback] if fallback else []
    if not fallback and t.floors_only:
        labels.append(f"{t.floors_only} of {t.matched} matched items have under {rule.min_iterations} measured "
                      "iterations on a side: judged by the floors only")  # fmt: skip
    x = columns[1].name if id != "diff.ops" else "op"
    return Result(
        id=id, title=title, columns=columns, rows=rows, truncated=len(t.rows) - len(rows), more=MORE, labels=labels,
        notes=f"{how} Rows: changes first, each group by |delta|{_BY_SELF if id in _NESTED_IDS else ''}. {RULE_NOTE}",
        chart=Chart("hbar", x=x, y=("delta",), title="B - A", series="status", limit=20),
        facts={**t.counts, **t.totals},
    )  # fmt: skip


def _fallback_label(a: Side, b: Side, rule: Rule) -> str | None:
    """Why the changes are judged by the floors alone, where a run has no spread (no steps nor statistics, or too
    few measured steps); None where both have one."""
    lacking = [(f"{n} (run {s.run_id}: {s.pass_name or 'single pass'})", s.steps)
               for n, s in (("A", a), ("B", b)) if not s.has_spread(rule.min_iterations)]  # fmt: skip
    if not lacking:
        return None
    parts = []
    if none := [run for run, steps in lacking if not steps]:
        parts.append(f"no iteration statistics in {' and '.join(none)}")
    if few := [(run, steps) for run, steps in lacking if steps]:
        if len(few) == 2 and few[0][1] == few[1][1]:
            counts = f"{few[0][0]} and {few[1][0]} have {counted(few[0][1], 'measured iteration')} each"
        else:
            counts = " and ".join(f"{run} has {counted(steps, 'measured iteration')}" for run, steps in few)
        parts.append(f"{counts}, fewer than {rule.min_iterations}")
    return (f"{'; '.join(parts)}: changes judged by the floors only "
            f"({rule.floors()})")  # fmt: skip


def _spread_label(a: Side, b: Side) -> str | None:
    """Where the spreads a change had to exceed come from, where a run that is not merged gives its own (both
    runs having one); None for two merged runs, whose statistics the notes describe."""
    if a.merged and b.merged:
        return None
    src_a, src_b = a.spread_source(), b.spread_source()
    over = f"A's and B's {src_a} each" if src_a == src_b else f"A's {src_a} and B's {src_b}"
    return (
        f"noise: each item's low-side spread (median - p5) over {over} (per step: an item's time per call); a "
        "change within it still counts where the two medians' notches (1.58 IQR / sqrt(n)) do not overlap (the mean "
        "step's: its 95% intervals, 1.96 standard errors)"
    )
