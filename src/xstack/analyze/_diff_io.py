"""``diff.io``: the file I/O of two runs compared, with each measure in its own unit.

The totals are those of the run's data files (path classes ``data`` and ``unknown``: ``_io_common.DATA_CLASSES``),
as the summary counts them (``summary.io_totals``): Python's imports, the system's files, the profiler's own and
directories would swamp a change in the program's data, so they are one row of their own (files touched);
standard streams, pipes and sockets are left out. Then the time the loop waited for data (``io.input_bound``),
where both runs have it, and per data file (matched by path) the bytes and read time of the files that changed
most. A run without I/O data (neither the io level nor an imported Darshan log) is not compared.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from typing import Any, Final

from xstack.analyze._diff_rule import Rule
from xstack.analyze._io_common import (
    DATA_CLASSES,
    DATA_FILE,
    DATA_SPAN,
    READ_OPS,
    SHORT_OF_CPUS_PCT,
    SPAN_BYTES,
    SPAN_PATH,
    WRITE_OPS,
    as_count,
    in_list,
    io_run,
    ready_wait_pct,
)
from xstack.analyze._io_loop import input_wait
from xstack.analyze.context import HINTS
from xstack.analyze.result import Column, Result, format_ns, notes_of
from xstack.analyze.summary import io_totals
from xstack.trace.store import Store

ID, TITLE = "diff.io", "I/O: B against A"
FILES_LISTED = 10
"""Data files listed by default (those that changed most); the facts count them all."""
MORE = "the rows of the data files that changed less: a larger --top lists more, in every format"
"""How to list the file rows left out: ``--top`` bounds the files listed in every format, json and csv too."""

TOTALS = (
    ("files", "files", "count"),  # data files with I/O recorded: opened, read, written or stat'ed
    ("opens", "opens", "count"),  # Darshan's OPENS: dups included
    ("reads", "reads", "count"),
    ("writes", "writes", "count"),
    ("bytes read", "bytes_read", "bytes"),
    ("bytes written", "bytes_written", "bytes"),
    ("read time", "read_time_ns", "ns"),
    ("write time", "write_time_ns", "ns"),  # syncs included
    ("metadata time", "meta_time_ns", "ns"),  # opens, closes, seeks, stats, mmaps
    ("zero-length reads", "zero_reads", "count"),  # reads that returned no bytes (end of file)
)
"""The measures of the data files: row label, ``summary.io_totals`` key, unit."""
OTHER = "other files"
"""The item of the row counting the files of the other classes."""
LOOP = "the loop"
"""The item of the rows of the loop's wait for data."""
ALL_DATA = "data files"
"""The item of the totals' rows."""
FILE_MIN_DELTA_NS = 10_000
"""The absolute floor of one file's read time (ns), where the diff's (default 1 us) is lower: a file read in a few
microseconds moves by more than 1 us, and by more than 5%, from one run of the same work to the next."""

COLUMNS = [
    Column("item", help="data files: their totals; the loop: its wait for data; a path: one data file"),
    Column("measure"),
    Column("unit", help="the unit of A, B and delta in this row"),
    Column("A", unit_from="unit"),
    Column("B", unit_from="unit"),
    Column("delta", unit_from="unit", help="B - A (added: B's value; removed: minus A's)"),
    Column("change", "pct", "delta in percent of A"),
    Column(
        "status",
        help="more, less or unchanged beyond the floor; added, removed (a file only one run has); "
        "not compared (a measure one run lacks)",
    ),  # fmt: skip
    Column(
        "floor",
        help="the smallest |delta| that counts: counts and bytes exactly, times both floors (one "
        "file's read time: at least 10 us)",
    ),
]


@dataclass
class IoSide:
    """What ``diff.io`` reads from one run (times ns, bytes bytes)."""

    name: str
    """``A`` or ``B``."""
    run: str
    """The store and run: ``a.duckdb run 1``."""
    source: str | None
    """``io`` (the io level), ``darshan`` (an imported log), ``-`` (not said); None: the run has no I/O data."""
    totals: dict[str, int] = field(default_factory=dict)
    wait: dict[str, Any] | None = None
    """``io.input_bound``'s facts, where the run has iterations to wait in; None otherwise."""
    files: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """Per data file path: bytes read, bytes written, read time (ns), summed over its processes and modules."""
    tails: dict[str, tuple[int, int, int, int, int, float]] = field(default_factory=dict)
    """Per ``read_time_ns`` and ``write_time_ns``, from the data files' io spans: the calls, their time (ns), the
    longest 10% of them (calls, time and the shortest of them, ns) and the median call (ns)."""

    @property
    def has_io(self) -> bool:
        return self.source is not None


def read_io(store: Store, run_id: int, name: str) -> IoSide:
    """One run's I/O for ``diff.io`` (``name``: ``A`` or ``B``)."""
    io = io_run(store, run_id)
    if not (io.has_spans or io.has_files):
        return IoSide(name, f"{store.path} run {run_id}", None)
    totals = io_totals(store, run_id, int(io.has_spans), detail=True) or {}
    wait = input_wait(store, run_id)
    facts = wait.facts if not wait.missing and "lacking" not in wait.facts and wait.facts.get("iterations") else None
    per_file = _FILES_FROM_FILES if io.has_files else _FILES_FROM_SPANS
    files = {str(r[0]): (as_count(r[1]), as_count(r[2]), as_count(r[3]))
             for r in store.query(per_file, [run_id])}  # fmt: skip
    source = io.source if io.has_files else "io spans"
    tails = {str(r[0]): (as_count(r[1]), as_count(r[2]), as_count(r[3]), as_count(r[4]), as_count(r[5]), float(r[6]))
             for r in store.query(_TAILS, [run_id])} if io.has_spans else {}  # fmt: skip
    return IoSide(name, f"{store.path} run {run_id}", source, totals, facts, files, tails)


_TAILS = f"""
WITH c AS (
    SELECT CASE WHEN name IN {in_list(READ_OPS)} THEN 'read_time_ns' ELSE 'write_time_ns' END AS key, dur_ns
    FROM spans WHERE run_id = ? AND level = 'io' AND {DATA_SPAN} AND name IN {in_list(READ_OPS + WRITE_OPS)}
),
r AS (SELECT key, dur_ns, row_number() OVER (PARTITION BY key ORDER BY dur_ns DESC) AS k,
             count(*) OVER (PARTITION BY key) AS n FROM c)
SELECT key, max(n), sum(dur_ns), count(*) FILTER (WHERE k <= ceil(n / 10.0)),
    sum(dur_ns) FILTER (WHERE k <= ceil(n / 10.0)), min(dur_ns) FILTER (WHERE k <= ceil(n / 10.0)), median(dur_ns)
FROM r GROUP BY key
"""
"""Per kind of call (reads, writes) of the data files: the calls, their time, the longest 10% of them (calls,
time, the shortest) and the median call."""

TAIL_RATIO: Final = 3.0
"""How many times its calls times their median a run's read (write) time must be for a change in that time to be
said to come from a few long calls."""
TAIL_MIN_CALLS: Final = 100
"""The fewest calls of a run for that."""


_FILES_FROM_FILES = f"""
SELECT path, sum(bytes_read), sum(bytes_written), sum(read_time_ns) FROM io_files
WHERE run_id = ? AND {DATA_FILE} GROUP BY path
"""
_FILES_FROM_SPANS = f"""
SELECT {SPAN_PATH} AS path, sum({SPAN_BYTES}) FILTER (WHERE name IN {in_list(READ_OPS)}),
    sum({SPAN_BYTES}) FILTER (WHERE name IN {in_list(WRITE_OPS)}),
    sum(dur_ns) FILTER (WHERE name IN {in_list(READ_OPS)})
FROM spans WHERE run_id = ? AND level = 'io' AND {DATA_SPAN} AND {SPAN_PATH} IS NOT NULL GROUP BY 1
"""


def io_result(a: IoSide, b: IoSide, rule: Rule, top: int | None) -> Result:
    """``diff.io``: the data files' totals, the files of other classes, the loop's wait for data, then the
    ``top`` data files that changed most (default ``FILES_LISTED``); or, where a run has no I/O data, what is
    missing and how to get it.

    Notes: counts and bytes are exact: any difference counts (more or less). Times count as in the rest of the diff:
    when ``|delta|`` reaches both floors, the relative one (``threshold`` of A's time, default 5%) and the absolute
    one (``min_delta_ns``, default 1 us); one file's read time counts past the same relative floor and at least 10
    us (``FILE_MIN_DELTA_NS``), as a file read in a few microseconds is mostly noise (the page cache, the
    scheduler); the rows give the floor each used. Where the data files' read (write) time changed and one run's is
    ``TAIL_RATIO`` times its calls times their median or more (from the io spans), a label says the change is in a
    few long calls (a process descheduled inside a call, on a machine with more runnable threads than CPUs, or
    reads from disk), with each run's calls times their median and the share of its longest 10% of calls. The totals
    are those of the data files (path classes data and unknown) summed over every process, as ``io.files`` and the
    summary count them; the files of the other classes (Python's imports, system, profiler files, directories) count
    in one row, and standard streams, pipes and sockets are left out. The wait for data is ``io.input_bound``'s: the
    DataLoader waits in the measured iterations (warm-up left out), with the iterations and the mean wait per
    iteration; compared only where both runs have iterations (an imported Darshan log has no model spans).
    Zero-length reads are compared where every data-file record of both runs counts them (a Darshan log does only
    with DXT tracing). Files are matched by path, those in a folder ``tempfile`` made right under a temporary folder
    by their path past its random name (shown as ``*``: ``/tmp/tmp*/data.h5``), and the files loggers and
    launchers name anew for each run (TensorBoard's event files, ``runs/DATE_HOST``, Lightning's ``version_N``,
    W&B's and Hydra's run folders: ``run_key``) past those names, where that names one file in each run; a file only
    one run has is added or removed; they are ranked by their change as a share of the runs' data
    bytes or read time, whichever is larger, and files that did not change are not listed.
    """
    lacking = [s for s in (a, b) if not s.has_io]
    if lacking:
        which = " and ".join(f"{s.name} ({s.run}) has no I/O level" for s in lacking)
        hint = (f"Not compared: {which} (neither the io level nor an imported Darshan log). To compare I/O, "
                f"{HINTS['io']}.")  # fmt: skip
        return Result(ID, TITLE, missing=["io"], hint=hint, notes=notes_of(io_result))
    floors = _Floors(rule)
    rows, facts, labels = _total_rows(a, b, floors)
    file_rows, listed, changed, left_out = _file_rows(a, b, floors, FILES_LISTED if top is None else top)
    rows += file_rows
    facts |= {"classes": list(DATA_CLASSES), "files_changed": changed, "files_listed": listed}
    labels.insert(0, f"data files: path classes {', '.join(DATA_CLASSES)}; {OTHER}: python, profiler, system, "
                     "directory; standard streams, pipes and sockets left out")  # fmt: skip
    if changed > listed:
        labels.append(f"{listed:,} of {changed:,} changed data files listed (those that changed most), "
                      f"{changed - listed:,} left out: a larger --top lists more")  # fmt: skip
    return Result(ID, TITLE, COLUMNS, rows, notes=notes_of(io_result), facts=facts, labels=labels, truncated=left_out,
                  more=MORE)  # fmt: skip


@dataclass(frozen=True)
class _Floors:
    """When a difference counts: counts and bytes exactly, times past both floors of the diff's rule."""

    rule: Rule

    def min_ns(self, per_file: bool) -> int:
        """The absolute floor of a time: the rule's, and at least ``FILE_MIN_DELTA_NS`` for one file's."""
        return max(self.rule.min_delta_ns, FILE_MIN_DELTA_NS) if per_file else self.rule.min_delta_ns

    def text(self, unit: str, per_file: bool = False) -> str:
        if unit != "ns":
            return "exact"
        return self.rule.floors(self.min_ns(per_file))

    def status(self, va: float | None, vb: float | None, unit: str, per_file: bool = False) -> str:
        if va is None:
            return "added"
        if vb is None:
            return "removed"
        delta = vb - va
        floor = max(self.rule.threshold * va, self.min_ns(per_file), 1) if unit == "ns" else 1
        if abs(delta) < floor:
            return "unchanged"
        return "more" if delta > 0 else "less"

    def row(self, item: str, measure: str, unit: str, va: float | None, vb: float | None,
            per_file: bool = False) -> tuple[Any, ...]:  # fmt: skip
        """One compared row: the status, B - A and the change in percent of A (``per_file``: one file's)."""
        delta = (vb or 0) - (va or 0)
        pct = 100.0 * delta / va if va and vb is not None else None
        status = self.status(va, vb, unit, per_file)
        return (item, measure, unit, va, vb, delta, pct, status, self.text(unit, per_file))


def _not_compared(item: str, measure: str, unit: str, va: Any, vb: Any) -> tuple[Any, ...]:
    return (item, measure, unit, va, vb, None, None, "not compared", "")


def _total_rows(a: IoSide, b: IoSide, floors: _Floors) -> tuple[list[tuple[Any, ...]], dict[str, Any], list[str]]:
    """The data files' measures, the other files, and the loop's wait: rows, facts and what is not compared."""
    rows, facts, labels = [], {}, []
    for label, key, unit in TOTALS:
        va, vb = a.totals.get(key, 0), b.totals.get(key, 0)
        if key == "zero_reads" and (unknown := [s for s in (a, b) if s.totals.get("zero_reads_unknown")]):
            rows.append(_not_compared(ALL_DATA, label, unit, *(None if s in unknown else v for s, v in
                                                                 ((a, va), (b, vb)))))  # fmt: skip
            labels.append(f"not compared: zero-length reads ({_names(unknown)} from a Darshan log without DXT "
                          "tracing, which does not count them)")  # fmt: skip
            continue
        row = floors.row(ALL_DATA, label, unit, va, vb)
        rows.append(row)
        facts[key] = {"a": va, "b": vb, "delta": row[5], "status": row[7]}
        if row[7] in ("more", "less") and (tail := _tail(a, b, key, label)):
            labels.append(tail)
    other_a, other_b = (s.totals.get("all_files", 0) - s.totals.get("files", 0) for s in (a, b))
    if a.source == b.source:
        rows.append(floors.row(OTHER, "files", "count", other_a, other_b))
        facts["other_files"] = {"a": other_a, "b": other_b, "delta": other_b - other_a, "status": rows[-1][7]}
    else:  # Darshan leaves out system directories (and often Python's) by default, the io level records them
        rows.append(_not_compared(OTHER, "files", "count", other_a, other_b))
        labels.append(f"A's I/O from {_source(a)}, B's from {_source(b)}: the data files' counters compare "
                      "(Darshan's meanings in both); the other files do not, as Darshan leaves out system "
                      "directories by default")  # fmt: skip
    rows += _wait_rows(a, b, floors, facts, labels)
    labels += _short_of_cpus(a, b, facts)
    return rows, facts, labels


def _short_of_cpus(a: IoSide, b: IoSide, facts: dict[str, Any]) -> list[str]:
    """A label for each run whose workers waited for a CPU ``SHORT_OF_CPUS_PCT`` or more of the time they were ready
    to run (facts ``ready_wait_a_pct``, ``ready_wait_b_pct``): their calls' times hold those waits, so a read time that
    grew with the workers is not storage grown slower (8 workers on 2 CPUs against 2: data files' read time 24.1 ms
    against 523 ms, the same 13,500 reads)."""
    short = []
    for side in (a, b):
        share = ready_wait_pct(side.wait or {})
        facts[f"ready_wait_{side.name.lower()}_pct"] = share
        if share is not None and share >= SHORT_OF_CPUS_PCT:
            short.append((side.name, share))
    if not short:
        return []
    names = " and ".join(f"{name}'s" for name, _ in short)
    shares = " and ".join(f"{share:.0f}%" for _, share in short)
    return [f"{names} workers waited for a CPU {shares} of the time they were ready to run: a call that returns while "
            "they are short of CPUs lasts until one is free, so their read, write and metadata times hold waits for a "
            "CPU, not the storage's time alone"]  # fmt: skip


def _tail(a: IoSide, b: IoSide, key: str, label: str) -> str:
    """Where one run's read (write) time is ``TAIL_RATIO`` times its calls times their median or more, that a change
    in that time comes from a few long calls (a process descheduled inside a call, reads from disk), with each
    run's calls times their median and the share of its longest 10% of calls; empty otherwise."""
    sides = [(s, s.tails[key]) for s in (a, b) if key in s.tails and s.tails[key][0] and s.tails[key][5] > 0]
    if len(sides) < 2:
        return ""
    ratio = {s.name: t[1] / (t[0] * t[5]) for s, t in sides}
    s, t = max(sides, key=lambda st: ratio[st[0].name])
    if ratio[s.name] < TAIL_RATIO or t[0] < TAIL_MIN_CALLS:
        return ""
    kind = label.split()[0] + "s"  # reads, writes
    o, u = next((o, u) for o, u in sides if o is not s)
    return (f"{label}: {s.name}'s is {ratio[s.name]:.1f} times its calls times their median ({t[0]:,} x "
            f"{format_ns(t[5])} = {format_ns(t[0] * t[5])}), {o.name}'s {ratio[o.name]:.1f} times ({u[0]:,} x "
            f"{format_ns(u[5])} = {format_ns(u[0] * u[5])}): the change is in a few long calls, as a process "
            "descheduled inside a call (more runnable threads than CPUs) or a read from disk makes them; the longest "
            f"10% of {s.name}'s {kind} ({t[2]:,}, {format_ns(t[4])} or more each) took {100.0 * t[3] / t[1]:.0f}% of "
            f"its {label}")  # fmt: skip


def _wait_rows(a: IoSide, b: IoSide, floors: _Floors, facts: dict[str, Any], labels: list[str]) -> list[Any]:
    measures = (("iterations", "iterations", "count"), ("waited for data", "wait_ns", "ns"),
                ("mean wait per iteration", "mean_wait_ns", "ns"))  # fmt: skip
    if a.wait is None or b.wait is None:
        without = [s for s in (a, b) if s.wait is None]
        labels.append(
            f"not compared: the loop's wait for data ({_names(without)} without iterations: no step or "
            f"DataLoader spans{', as an imported Darshan log has none' if _darshan(without) else ''})"
        )
        return []
    unwaited = [s for s in (a, b) if (s.wait or {}).get("dataloader_waits") is False]
    if unwaited:  # no DataLoader spans: the waits are 0 by construction, whatever the loop spends loading data
        labels.append(f"not compared: the loop's wait for data ({_names(unwaited)} without DataLoader spans: "
                      "every wait is 0 by construction; data loaded in the loop itself is in its compute)")  # fmt: skip
    rows = []
    for label, key, unit in measures:
        va, vb = _waited(a, key), _waited(b, key)
        compared = va is not None and vb is not None and (not unwaited or key == "iterations")
        rows.append(floors.row(LOOP, label, unit, va, vb) if compared else _not_compared(LOOP, label, unit, va, vb))
    facts["wait_ns"] = {"a": rows[1][3], "b": rows[1][4], "delta": rows[1][5], "status": rows[1][7]}
    if a.wait.get("iteration_kind") != b.wait.get("iteration_kind"):
        labels.append(f"iterations: A's are {a.wait.get('iteration_kind')}, B's {b.wait.get('iteration_kind')}")
    return rows


def _waited(s: IoSide, key: str) -> int | None:
    value = (s.wait or {}).get(key)
    return None if value is None else round(value)


def _names(sides: list[IoSide]) -> str:
    return " and ".join(s.name for s in sides)


def _darshan(sides: list[IoSide]) -> bool:
    return any(s.source == "darshan" for s in sides)


def _source(s: IoSide) -> str:
    return {"io": "the io level", "darshan": "an imported Darshan log"}.get(str(s.source), str(s.source))


_FILE_MEASURES = (("bytes read", 0, "bytes"), ("bytes written", 1, "bytes"), ("read time", 2, "ns"))


TEMP_ROOTS: Final = frozenset({"/tmp", "/var/tmp", "/dev/shm", tempfile.gettempdir()})
"""The folders that ``tempfile`` makes its folders in."""
_TEMP_NAME = re.compile(r"(?P<prefix>[^/]*?)(?P<random>[a-z0-9_]{8})(?P<suffix>\.[^/]*)?")
"""A name ``tempfile`` gave (``mkdtemp``, ``TemporaryDirectory``, ``mkstemp``): a prefix, ``tmp`` by default,
eight characters of ``[a-z0-9_]``, and the suffix asked for (``.pt``)."""


TFEVENTS: Final = "events.out.tfevents."
"""How a TensorBoard event file's name starts; the time, host name and process id of the run that wrote it
follow."""
RUN_FOLDERS: Final = (
    (re.compile(r"[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}_.+"), "*"),  # SummaryWriter's default: runs/Nov24_01-59-01_HOST
    (re.compile(r"version_\d+"), "version_*"),  # Lightning's loggers: lightning_logs/version_3
    (re.compile(r"(offline-)?run-\d{8}_\d{6}-[a-z0-9]+"), "run-*"),  # Weights & Biases: wandb/run-20261124_015901-ID
    (re.compile(r"\d{4}-\d{2}-\d{2}|\d{2}-\d{2}-\d{2}"), "*"),  # Hydra's: outputs/2026-11-24/01-59-01
)
"""Folders that a logger or launcher names anew for each run, and what they are shown as."""
UNNAMED: Final = re.compile(r"#\d+ \(deleted\)")
"""The kernel's name for an unnamed temporary file (``O_TMPFILE``: ``tempfile.TemporaryFile``), which the io level
records it under in its folder: its inode, ``/tmp/#1234 (deleted)``."""


def run_key(path: str) -> str | None:
    """``path`` with the parts each run names anew put as ``*``: the random part of the ``tempfile`` folder or
    file right under a temporary folder (``/tmp/tmp86c2rbay/data.h5`` -> ``/tmp/tmp*/data.h5``), the time, host
    and process id in a TensorBoard event file's name (``events.out.tfevents.1795485348.vm.11803.0`` ->
    ``events.out.tfevents.*``), and the folders of ``RUN_FOLDERS`` (``runs/Nov24_01-59-01_vm/...`` ->
    ``runs/*/...``), the inode in an unnamed temporary file's name (``/tmp/#1234 (deleted)`` -> ``/tmp/#* (deleted)``);
    None when it has none. Past a prefix other than ``tmp``, the random part must hold a digit or
    an underscore, which a word (``/tmp/datasets``) does not."""
    parts = path.split("/")
    masked = False
    if parts[-1].startswith(TFEVENTS) and len(parts[-1]) > len(TFEVENTS):
        parts[-1], masked = f"{TFEVENTS}*", True
    elif UNNAMED.fullmatch(parts[-1]):
        parts[-1], masked = "#* (deleted)", True
    for i in range(1, len(parts) - 1):
        for pattern, shown in RUN_FOLDERS:
            if pattern.fullmatch(parts[i]):
                parts[i], masked = shown, True
                break
    for i in range(2, len(parts)):
        m = _TEMP_NAME.fullmatch(parts[i]) if "/".join(parts[:i]) in TEMP_ROOTS else None
        if m and (m["prefix"] == "tmp" or any(c.isdigit() or c == "_" for c in m["random"])):
            return "/".join([*parts[:i], f"{m['prefix']}*{m['suffix'] or ''}", *parts[i + 1 :]])
    return "/".join(parts) if masked else None


def _pair_run_paths(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The data files only one run has, paired across the runs where their paths differ only in a temporary
    folder's random name (each run's ``tempfile.mkdtemp``): masked path -> (A's path, B's path), where the masked
    path names one file on each side."""
    sides = []
    for mine, theirs in ((a, b), (b, a)):
        keys: dict[str, list[str]] = {}
        for path in mine:
            if path not in theirs and (key := run_key(path)) is not None:
                keys.setdefault(key, []).append(path)
        sides.append({k: v[0] for k, v in keys.items() if len(v) == 1})
    return {key: (pa, sides[1][key]) for key, pa in sides[0].items() if key in sides[1]}


def _file_rows(a: IoSide, b: IoSide, floors: _Floors, limit: int) -> tuple[list[tuple[Any, ...]], int, int, int]:
    """The rows of the ``limit`` data files that changed most (a row per measure either run has of the file),
    how many files were listed, how many changed, and the rows of those left out. A file in a temporary folder
    is matched to the other run's by its path past the folder's random name (``_pair_run_paths``)."""
    scale = [max(sum(f[i] for f in s.files.values()) for s in (a, b)) or 1 for i in range(3)]
    ranked = []
    paired = _pair_run_paths(a.files, b.files)
    in_a, in_b = {pa for pa, _ in paired.values()}, {pb for _, pb in paired.values()}
    a_files = {k: v for k, v in a.files.items() if k not in in_a} | {k: a.files[pa] for k, (pa, _) in paired.items()}
    b_files = {k: v for k, v in b.files.items() if k not in in_b} | {k: b.files[pb] for k, (_, pb) in paired.items()}
    for path in list(a_files) + [p for p in b_files if p not in a_files]:
        fa, fb = a_files.get(path), b_files.get(path)
        done = [i for _, i, _ in _FILE_MEASURES if (fa and fa[i]) or (fb and fb[i])] or [0]  # none: bytes read
        rows = [floors.row(path, label, unit, fa[i] if fa else None, fb[i] if fb else None, per_file=True)
                for label, i, unit in _FILE_MEASURES if i in done]  # fmt: skip
        if any(r[7] != "unchanged" for r in rows):
            change = max(abs((fb[i] if fb else 0) - (fa[i] if fa else 0)) / scale[i] for i in range(3))
            ranked.append((-change, path, rows))
    ranked.sort(key=lambda r: r[:2])
    listed = ranked[:limit]
    return ([row for *_, rows in listed for row in rows], len(listed), len(ranked),
            sum(len(rows) for *_, rows in ranked[limit:]))  # fmt: skip
