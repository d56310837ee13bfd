"""Facts about one run that several analyses need, computed once per open store and run.

``run_context(store, run_id)`` returns a cached ``RunContext``: the levels the run has, its config, and on
demand a temporary table ``_ax_owner_<run>`` giving every span its nearest enclosing layer and model span
(the ancestors kernel and op analyses attribute time to). Temporary tables live in the connection only, so
analysing a store opened read-only writes nothing to it.
"""

from __future__ import annotations

import bisect
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from xstack.analyze.result import Result, missing_result
from xstack.errors import UsageError
from xstack.trace import attrs as A
from xstack.trace.store import Store

HINTS = {
    "model": "mark stages with xstack.span() or iterations with xstack.step(); any live profile records them",
    "layer": "profile with the layer level (xstack run/profile record it by default), or import a trace taken "
    "with with_stack=True and with_modules=True",
    "op": "profile with the op level (--levels model,layer,op), or import a PyTorch profiler trace",
    "runtime": "profile on a GPU with the kernel level (--levels model,layer,op,kernel)",
    "kernel": "profile on a GPU with the kernel level (--levels model,layer,op,kernel), or import a trace "
    "recorded on a GPU",
    "io": "profile with the io level (--levels model,io), or import a Darshan log",
    "metrics": "run with the metrics level (Nsight Compute counters per kernel)",
    "memory": "profile on a GPU, CUDA or ROCm (layer memory is recorded there), or import a trace taken with "
    "profile_memory=True",
    "device peaks": "run xstack calibrate --store STORE on the machine that ran it; a profile taken there after "
    "a calibration records them itself",
    "FLOPs": "record hardware counters: the metrics level (Nsight Compute), or ncu --metrics with "
    "sm__sass_thread_inst_executed_op_{d,f,h}{add,mul,fma}_pred_on.sum; for an op trace, record_shapes=True "
    "gives analytic counts of common ops",
    "DRAM bytes": "collect dram__bytes_read.sum and dram__bytes_write.sum: the metrics level does; with ncu add "
    "them to --metrics, with the PyTorch profiler's CUPTI range profiler to its profiler_metrics",
    "kernel durations": "collect gpu__time_duration.sum with the counters, as the CUPTI range profiler does not "
    "time its ranges, or profile with the kernel level",
    "batch sizes": "profile at several batch sizes: xstack sweep --batch-sizes 1,2,4,8 -- python script.py",
    "backward": "profile a training step (forward, loss.backward()) with the op level: its backward pass's "
    "autograd nodes are what this charges to layers",
    "iterations as they ran": "a merged run lays out one iteration, each span its pass's median: the work only "
    "some iterations run is its health row occasional_spans; report a pass's own run (--run N) for its iterations "
    "as they ran",
    "measured iterations": "mark iterations with xstack.step() (xstack run counts an optimizer's step() as one) and "
    "measure five or more past the warm-up",
    "other ranks": "profile each rank of a distributed job into a store of its own, kept beside the others: "
    "torchrun --nproc-per-node N -m xstack run -o 'prof-{rank}.duckdb' -- train.py; this run is of one process",
    "process usage": "profile the program live (xstack run, xstack profile or xstack.profile): each iteration then "
    "records its process's CPU time and page faults; a trace imported from another tool has none",
}
"""How to get each level or input an analysis may need (shown when it is missing)."""

DEVICE_LEVELS = ("kernel", "memcpy", "memset")

ANALYSIS_MEMORY_BYTES = int(float(os.environ.get("XSTACK_ANALYSIS_MEMORY_GB", "2")) * 2**30)
"""DuckDB's memory limit while analysing (env ``XSTACK_ANALYSIS_MEMORY_GB``, default 2): the span-tree walk is a
recursive query, which DuckDB holds in memory (about 100 bytes per span)."""

_COSTED = (
    "CASE WHEN {t}.level = 'op' AND (list_contains($costed, {t}.name) "
    "OR json_exists({t}.attrs, '$.\"op.flops\"')) THEN {t}.span_id END"
)


@dataclass
class RunContext:
    """One run's levels and config, and cached helper tables."""

    store: Store
    run_id: int
    levels: frozenset[str]
    config: dict[str, Any]
    pass_name: str | None
    _tables: dict[str, str] = field(default_factory=dict)
    _warmup: int | None = None
    _warmup_windows: list[tuple[int, int]] | None = None
    _iterations: list[tuple[int, int, bool]] | None = None
    _measured: tuple[str, int] | None = None
    _finder: Callable[[int | None], tuple[int | None, bool]] | None = None
    _rows: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    """Query results several analyses share (the per-layer-call rollup of A11, A12 and A14), by name."""

    @property
    def warmup(self) -> int:
        """The first iterations (step spans) left out of per-iteration statistics: ``warmup_steps(config)``, or 0
        when no step span lies past them (a run whose every iteration is warm-up counts them all)."""
        if self._warmup is None:
            wanted = warmup_steps(self.config)
            past = self.store.query(
                f"SELECT count(*) FROM spans WHERE run_id = ? AND level = 'model' AND {STEP_SPAN} "
                f"AND {past_warmup(wanted)}",
                [self.run_id],
            )[0][0]
            self._warmup = wanted if past else 0
        return self._warmup

    def warmup_windows(self) -> list[tuple[int, int]]:
        """The time the warm-up iterations took, as ``(start_ns, end_ns)`` extents of their step spans (adjoining
        ones joined), in order; empty when no iteration is left out (``warmup`` is 0). The first begins with the
        run's first event: what ran before the first iteration is start-up, which the warm-up stands for (a live
        run's first step begins with the profile; a PARAM trace's start-up, CUDA's and the model's move to the GPU,
        comes before its warm-up call)."""
        if self._warmup_windows is None:
            found = []
            if self.warmup:
                found = self.store.query(
                    f"SELECT start_ns, start_ns + dur_ns FROM spans WHERE run_id = ? AND level = 'model' "
                    f"AND {STEP_SPAN} AND NOT {past_warmup(self.warmup)} ORDER BY 1, 2",
                    [self.run_id],
                )
                first = self.store.query("SELECT min(start_ns) FROM spans WHERE run_id = ?", [self.run_id])[0][0]
                if found and first is not None and first < found[0][0]:
                    found[0] = (first, found[0][1])
            windows: list[tuple[int, int]] = []
            for s, e in found:
                if windows and s <= windows[-1][1]:
                    windows[-1] = (windows[-1][0], max(windows[-1][1], int(e)))
                else:
                    windows.append((int(s), int(e)))
            self._warmup_windows = windows
        return self._warmup_windows

    def in_warmup(self, column: str = "start_ns") -> str:
        """SQL: the time ``column`` (ns, on the run's clock) falls in a warm-up iteration (``warmup_windows``);
        ``FALSE`` where none is left out. A span is taken to belong where it starts."""
        windows = self.warmup_windows()
        if not windows:
            return "FALSE"
        return "(" + " OR ".join(f"({column} >= {s} AND {column} < {e})" for s, e in windows) + ")"

    def after_last_step(self, column: str = "start_ns") -> str:
        """SQL: the time ``column`` (ns, on the run's clock) falls in the run's tail, the stretch after its last
        ``step()`` (a live run's ``after-last-step``, kind ``tail``): in no iteration, nor in the warm-up; ``FALSE``
        for a run without one (a pass that ended at its last step, an imported trace, whose last ``ProfilerStep``
        marked as tail holds no work, a run without steps). A span is taken to belong where it starts."""
        tails = self.store.query(
            f"""SELECT start_ns, start_ns + dur_ns FROM spans WHERE run_id = ? AND level = 'model' AND device = 'cpu'
                AND attrs->>'$."{A.MODEL_KIND}"' = 'tail' ORDER BY 1""",
            [self.run_id],
        )
        if not tails:
            return "FALSE"
        return "(" + " OR ".join(f"({column} >= {int(s)} AND {column} < {int(e)})" for s, e in tails) + ")"

    def iterations(self) -> list[tuple[int, int, bool]]:
        """The run's iterations: ``(start_ns, end_ns, warm-up)`` of its host step spans in start order (a trace's
        copy of a step on the GPU timeline is not another iteration), the first numbered 1 (as ``io.input_bound``
        and the warm-up labels number them); empty for a run without steps."""
        if self._iterations is None:
            found = self.store.query(
                f"SELECT start_ns, start_ns + dur_ns, NOT {past_warmup(self.warmup)} FROM spans "
                f"WHERE run_id = ? AND level = 'model' AND device = 'cpu' AND {STEP_SPAN} ORDER BY 1, 2",
                [self.run_id],
            )
            self._iterations = [(int(s), int(e), bool(w)) for s, e, w in found]
        return self._iterations

    def iteration_of(self, start_ns: int | None) -> tuple[int | None, bool]:
        """The iteration (numbered from 1) of a call that starts at ``start_ns``, and whether it is a warm-up one;
        ``(None, False)`` for a call outside every step. A call belongs to the step it starts in, as in
        ``in_warmup``."""
        return self.iteration_finder()(start_ns)

    def iteration_finder(self) -> Callable[[int | None], tuple[int | None, bool]]:
        """``iteration_of`` as a function with the run's steps looked up once, for a loop over many calls."""
        if self._finder is not None:
            return self._finder
        steps = self.iterations()
        starts = [s for s, _, _ in steps]
        find = bisect.bisect_right

        def iteration_of(start_ns: int | None) -> tuple[int | None, bool]:
            if start_ns is None or not steps:
                return None, False
            i = find(starts, start_ns) - 1  # the last step that starts by then
            if i < 0 or start_ns >= steps[i][1]:
                return None, False
            return i + 1, steps[i][2]

        self._finder = iteration_of
        return iteration_of

    def measured_table(self) -> tuple[str, int] | None:
        """The measured iterations (host step spans past the warm-up), as the name of a temp table ``(ws, we)`` of
        their extents in ns (adjoining or nested ones joined, in order), and their summed length; None for a run
        without them. Join it with ``ASOF JOIN table w ON t >= w.ws`` and keep ``t < w.we``: a time ``t`` then lies
        in a measured iteration (a span belongs where it starts, as in ``in_warmup``)."""
        if self._measured is None:
            name = f"_ax_measured_{self.run_id}"
            self.store.con.execute(
                f"""CREATE OR REPLACE TEMP TABLE {name} AS
                WITH steps AS (SELECT start_ns AS s, start_ns + dur_ns AS e FROM spans
                    WHERE run_id = $run AND level = 'model' AND device = 'cpu' AND {STEP_SPAN}
                        AND {past_warmup(self.warmup)})
                SELECT s AS ws, e AS we FROM ({merged("steps")})""",
                {"run": self.run_id},
            )
            total = self.store.con.execute(f"SELECT sum(we - ws) FROM {name}").fetchall()[0][0]
            self._measured = (name, int(total or 0))
        return self._measured if self._measured[1] else None

    def counted(self, column: str) -> tuple[str, str]:
        """What per-iteration statistics count (the summary's top layers, ops and kernels, the kernel aggregates
        A10 and A15), as SQL: ``(join, condition)`` on the time ``column`` of the calls' alias (ns; a span belongs
        where it starts, device work where its runtime call launched it, ``launched``). In a run with measured
        iterations that is not merged, the calls in them (``measured_table``: start-up, warm-up, a harness's work
        between the steps and the time after the last are left out); else those past the warm-up. The join is a
        LEFT one and the condition never NULL, so that it can be selected as a column too."""
        measured = self.measured_table() if self.pass_name != "merged" else None
        if measured is None:
            return "", f"NOT {self.in_warmup(column)}"
        return f"ASOF LEFT JOIN {measured[0]} w ON {column} >= w.ws", f"coalesce({column} < w.we, false)"

    def host_extent(self) -> tuple[int | None, int]:
        """The run's host wall time (ns; None where it has no host spans) and how far (ns) its host spans run on
        past it. The wall time is the extent of the host spans, 0 past it; in a merged run, the extent of its
        merged iteration (its step span, the median of the pass timing the model level): each deeper level is
        timed in a pass of its own, whose added levels slow its spans, so the layers and operators laid out in
        the step can run on past its end (health ``children_longer_than_parent``), and that overrun is no part
        of the program's step."""
        extent_sql = "SELECT min(start_ns), max(start_ns + dur_ns) FROM spans WHERE run_id = ? AND device = 'cpu'"
        first, last = self.store.query(extent_sql, [self.run_id])[0]
        if first is None:
            return None, 0
        if self.pass_name == "merged":
            s, e = self.store.query(f"{extent_sql} AND level = 'model' AND {STEP_SPAN}", [self.run_id])[0]
            if s is not None:
                return int(e) - int(s), max(int(last) - int(e), 0)
        return int(last) - int(first), 0

    def warmup_ns(self) -> int:
        """The time (ns) the warm-up iterations took: the length of ``warmup_windows``."""
        return sum(e - s for s, e in self.warmup_windows())

    def warmup_label(self) -> str | None:
        """What the run's per-iteration statistics leave out, for a result's labels; None when nothing."""
        wanted = warmup_steps(self.config)
        if not wanted or self.pass_name == "merged":
            return None
        if not self.warmup and not self.iterations():  # no step() at all: no iteration to leave out or count
            return None
        if not self.warmup:
            return f"every iteration is within the {wanted} of warm-up: all of them counted"
        if isinstance(self.config.get("param"), dict):  # an imported trace: PARAM's own warm-up phase
            which = f"iterations 1-{wanted}" if wanted > 1 else "iteration 1"
            return f"{which} left out as warm-up: PARAM's warm-up phase, as its annotations in the trace mark it"
        if wanted == 1 and "measure" not in self.config:  # the default of a live run, not a pass's --warmup
            return "iteration 1 left out as warm-up: it also pays for start-up (--warmup 0 counts it)"
        return f"iterations 1-{wanted} left out as warm-up" if wanted > 1 else "iteration 1 left out as warm-up"

    def replayed_timing(self) -> str | None:
        """Why the run's host times are not the program's own, or None: the run itself recorded counter ranges
        (``metrics`` spans) with a profiler that replays each kernel to read its counters, and the host waits for
        the replays (a merged run takes its counters from a pass of their own and is timed without them). The
        phrase, "inflated by counter replay, not the program's own timing (...)", is what the analyses and the
        summary say of such a run's host times: a latency, throughput or FLOP/s over them is left unknown, and
        times shown anyway carry it."""
        if "metrics" not in self.levels:
            return None
        if "replayed" not in self._tables:
            rows = self.store.query(
                f"""SELECT DISTINCT attrs->>'$."{A.METRICS_SOURCE}"' FROM spans
                    WHERE run_id = ? AND level = 'metrics' ORDER BY 1""",
                [self.run_id],
            )
            who = [REPLAYING_PROFILERS[str(r[0])] for r in rows if str(r[0]) in REPLAYING_PROFILERS]
            replays = "replays" if len(who) == 1 else "replay"
            self._tables["replayed"] = (
                f"inflated by counter replay, not the program's own timing ({' and '.join(who)} {replays} each "
                "kernel to read its counters, and the host waits for the replays)"
                if who
                else ""
            )
        return self._tables["replayed"] or None

    @property
    def gpu_runtime(self) -> str:
        """``HIP`` for a run on AMD ROCm (its importer recorded ``config.gpu_runtime`` as ``hip``, or its runtime
        calls are ``hip*``), else ``CUDA``: the name to give its runtime API calls, graphs and start-up."""
        if "gpu_runtime" not in self._tables:
            hip = self.config.get("gpu_runtime") == "hip" or bool(
                self.store.query(
                    "SELECT count(*) FROM spans WHERE run_id = ? AND level = 'runtime' AND starts_with(name, 'hip')",
                    [self.run_id],
                )[0][0]
            )
            self._tables["gpu_runtime"] = "HIP" if hip else "CUDA"
        return self._tables["gpu_runtime"]

    @property
    def used_gpu(self) -> bool:
        """Whether the run used a GPU, so that its kernels could be recorded: the program had CUDA initialised
        (``config.cuda``), an imported trace lists GPUs (``config.devices``), or spans ran on a device or are
        kernels or runtime calls (a merged run of such passes, an older store)."""
        if "used_gpu" not in self._tables:
            used = bool(self.config.get(A.CONFIG_CUDA)) or bool(self.config.get("devices"))
            used = used or bool(
                self.store.query(
                    "SELECT count(*) FROM spans WHERE run_id = ? AND (device <> 'cpu' OR level IN "
                    "('runtime', 'kernel', 'memcpy', 'memset'))",
                    [self.run_id],
                )[0][0]
            )
            self._tables["used_gpu"] = "yes" if used else ""
        return bool(self._tables["used_gpu"])

    def replayed_labels(self, what: str) -> list[str]:
        """A result's label for host times it shows of a run timed under counter replay ("``what`` inflated by
        counter replay, ..."), or none."""
        return [f"{what} {why}"] if (why := self.replayed_timing()) is not None else []

    def has(self, level: str) -> bool:
        """True when the run holds spans of ``level`` (``metrics``: kernels with hardware counters)."""
        if level == "metrics":
            return self._has_metrics()
        return level in self.levels

    def require(self, id: str, title: str, *levels: str, notes: str = "") -> Result | None:
        """None when every level is present; else a result saying what is missing and how to get it."""
        missing = [lv for lv in levels if not self.has(lv)]
        return self.lacking(id, title, *missing, notes=notes) if missing else None

    def lacking(self, id: str, title: str, *missing: str, notes: str = "") -> Result:
        """A result saying that ``missing`` (levels or inputs such as ``memory``) are absent, and how to get them."""
        return missing_result(id, title, self.run_id, {m: self.hint(m) for m in missing}, notes)

    def hint(self, missing: str) -> str:
        """How to get one missing level or input for this run (``HINTS``; device peaks of an imported trace are
        those of the machine that recorded it, measured there; a Darshan log without I/O holds none to import)."""
        source = self.config.get("source")
        if missing == "io" and isinstance(source, dict) and source.get("format") == "darshan":
            return ("the Darshan log holds no POSIX or STDIO record (see the health table): Darshan kept no file I/O "
                    "of this job")  # fmt: skip
        if missing == "device peaks" and self.pass_name == "import":
            return (
                "measure them on the machine that recorded the trace with xstack calibrate -o peaks.json, and "
                "apply them here with xstack calibrate --apply peaks.json --store STORE"
            )
        return HINTS.get(missing, "record it")

    def owners(self) -> str:
        """Name of a temp table ``(span_id, layer_id, model_id, cost_op_id)``: each span's nearest enclosing layer
        span and model span (the span itself when it is one; NULL when none encloses it), and the shallowest
        enclosing op with an analytic cost formula (``_costs.COSTED_OPS``) or a profiler FLOP count."""
        name = f"_ax_owner_{self.run_id}"
        if name not in self._tables:
            from xstack.analyze._costs import COSTED_OPS

            self.store.con.execute(
                f"""CREATE OR REPLACE TEMP TABLE {name} AS
                WITH RECURSIVE walk(span_id, layer_id, model_id, cost_op_id) AS (
                    SELECT span_id, CASE WHEN level = 'layer' THEN span_id END,
                           CASE WHEN level = 'model' THEN span_id END, {_COSTED.format(t="spans")}
                    FROM spans WHERE run_id = $run AND parent_id IS NULL
                    UNION ALL
                    SELECT c.span_id, CASE WHEN c.level = 'layer' THEN c.span_id ELSE w.layer_id END,
                           CASE WHEN c.level = 'model' THEN c.span_id ELSE w.model_id END,
                           coalesce(w.cost_op_id, {_COSTED.format(t="c")})
                    FROM spans c JOIN walk w ON c.parent_id = w.span_id WHERE c.run_id = $run
                )
                SELECT * FROM walk""",
                {"run": self.run_id, "costed": sorted(COSTED_OPS)},
            )
            self._tables[name] = name
        return name

    def _has_metrics(self) -> bool:
        if "metrics" in self.levels:
            return True
        if "kernel" not in self.levels:
            return False
        if "has_metrics" not in self._tables:
            row = self.store.query(
                "SELECT count(*) FROM spans WHERE run_id = ? AND level = 'kernel' AND "
                "(json_exists(attrs, '$.\"metrics.dram_bytes_read\"') OR "
                "json_exists(attrs, '$.\"metrics.flops_fp32\"'))",
                [self.run_id],
            )
            self._tables["has_metrics"] = "yes" if row[0][0] else "no"
        return self._tables["has_metrics"] == "yes"


REPLAYING_PROFILERS = {"cupti_range_profiler": "the CUPTI range profiler", "ncu": "Nsight Compute"}
"""Counter profilers (``metrics.source``) that replay each kernel to read its counters, by name for a label."""

REPLAYED_ADVICE = "time the model in a trace recorded without counters"
"""What to do for a latency or rate that counter replay left unknown."""


def step_span(alias: str = "") -> str:
    """SQL: a model span (of ``alias``) is an iteration: one marked by ``prof.step()`` (live) or the profiler's
    ``ProfilerStep#N``, except a last one that holds no work, which the importer marks kind ``tail`` (the
    profiler stopping)."""
    p = f"{alias}." if alias else ""
    return (
        f"""({p}attrs->>'$."{A.MODEL_KIND}"' = 'step' OR ({p}attrs->>'$."{A.MODEL_KIND}"' IS NULL """
        f"AND regexp_matches({p}name, '^ProfilerStep#[0-9]+$')))"
    )


STEP_SPAN = step_span()
"""An iteration among model spans (``step_span``)."""


def merged(source: str) -> str:
    """SQL of the union of the intervals ``(s, e)`` in ``source``: disjoint ``(s, e)`` rows (intervals that
    touch are joined). An interval opens a new group when it starts after every earlier one has ended. The
    intervals that start together are one row first (the longest), so that the two windows order the rows alike:
    ties, each window ordering them as it pleased, could split a group in two and count its time twice."""
    return f"""SELECT min(s) AS s, max(e) AS e FROM (
        SELECT *, sum(CASE WHEN s > prev THEN 1 ELSE 0 END) OVER (ORDER BY s ROWS UNBOUNDED PRECEDING) AS grp
        FROM (SELECT s, e, coalesce(max(e) OVER (ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                                    s - 1) AS prev FROM (SELECT s, max(e) AS e FROM {source} GROUP BY s)))
    GROUP BY grp"""


def warmup_steps(config: dict[str, Any]) -> int:
    """How many of a run's first iterations are warm-up, as recorded: ``config.warmup_steps`` (live runs), else
    ``config.measure.warmup`` (the passes of stores written before it), else 0 (imported traces, merged runs)."""
    measure = config.get("measure")
    for value in (config.get(A.CONFIG_WARMUP_STEPS), measure.get("warmup") if isinstance(measure, dict) else None):
        if isinstance(value, int) and not isinstance(value, bool):
            return max(value, 0)
    return 0


def iteration_numbers(table: str = "spans") -> str:
    """SQL (a table ``(run_id, span_id, iteration)``): each host step span of ``table`` with the number the reports
    give its iteration (``RunContext.iteration_of``: from 1, in start order within its run, warm-up included), not
    the ``N`` of its name: ``step#N`` counts from 0, and an imported ``ProfilerStep#N`` from where the profiler's
    schedule began."""
    return f"""(SELECT run_id, span_id, row_number() OVER (
                    PARTITION BY run_id ORDER BY start_ns, start_ns + dur_ns, span_id) AS iteration
                FROM {table} WHERE level = 'model' AND device = 'cpu' AND {STEP_SPAN})"""


def past_warmup(warmup: int, alias: str = "") -> str:
    """SQL: a step span (of ``alias``) is past the first ``warmup`` iterations; spans without an iteration
    number (``ProfilerStep#N`` of imported traces, whose warm-up the profiler's schedule left out) always are."""
    col = f"{alias}.attrs" if alias else "attrs"
    return f"""coalesce(TRY_CAST({col}->>'$."{A.MODEL_STEP}"' AS BIGINT) >= {int(warmup)}, true)"""


def launched(level: str = "kernel") -> str:
    """SQL (a table): the spans of the device ``level`` (kernel, memcpy, memset) of run ``$run``, with
    ``launch_ns``: the start of the runtime call that launched each (its parent), else, where none is known, its
    own start. Device work belongs to the iteration whose host launched it, as in the timeline's measured window
    (``_timeline_common.WINDOWS_CTES``), even where it runs on after the host moved on."""
    return f"""(SELECT d.*, coalesce(r.start_ns, d.start_ns) AS launch_ns FROM spans d
        LEFT JOIN spans r ON r.run_id = $run AND r.span_id = d.parent_id AND r.level = 'runtime'
        WHERE d.run_id = $run AND d.level = '{level}')"""


_CACHE: weakref.WeakKeyDictionary[Store, dict[int, RunContext]] = weakref.WeakKeyDictionary()


def run_context(store: Store, run_id: int | None = None) -> RunContext:
    """The (cached) context of a run; ``run_id`` None picks the last merged run, else the last run."""
    rid = pick_run(store, run_id)
    if store not in _CACHE:
        store.ensure_memory_limit(ANALYSIS_MEMORY_BYTES)
    per_store = _CACHE.setdefault(store, {})
    if rid not in per_store:
        levels = frozenset(str(r[0]) for r in store.query("SELECT DISTINCT level FROM spans WHERE run_id = ?", [rid]))
        row = store.query("SELECT config, pass FROM runs WHERE run_id = ?", [rid])[0]
        config = orjson.loads(row[0]) if row[0] else {}
        per_store[rid] = RunContext(store, rid, levels, config if isinstance(config, dict) else {}, row[1])
    return per_store[rid]


def pick_run(store: Store, run_id: int | None) -> int:
    """``run_id`` checked against the store, or the default run: the last merged run, else the last run."""
    ids = store.run_ids()
    if not ids:
        raise UsageError(f"{store.path}: the store holds no runs")
    if run_id is None:
        merged = store.query("SELECT max(run_id) FROM runs WHERE pass = 'merged'")[0][0]
        return int(merged) if merged is not None else ids[-1]
    if run_id not in ids:
        raise UsageError(f"{store.path}: no run {run_id} (runs: {', '.join(map(str, ids))})")
    return run_id
