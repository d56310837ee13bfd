"""The ``io`` level: every file operation of the profiled program and of its worker processes.

How the calls are seen, best first:
- **preloaded**: ``xstack run``/``xstack profile`` start the program with the interposition library in
  ``LD_PRELOAD`` (``collect._io_native``), so every process of its tree records its POSIX and stdio calls
  (DataLoader workers, subprocesses, exec'd children). The records are read once the program and its children
  have ended (``ingest``), so that the workers' last calls are in.
- **attached**: ``xstack.profile(levels=[..., "io"])`` in a process that was not preloaded loads the library
  and redirects the calls of every loaded object to it for the region (as tf-Darshan attached Darshan at run
  time); forked workers inherit it, workers started by exec (``spawn``) are not covered, and health says so.
- **Python only**: where attaching fails, only the files Python opens are seen (an audit hook on ``open``),
  with no reads or writes; health says so.

Each call becomes an ``io`` span under the model or layer span open on its thread at the time (``design.md``
§2), and the calls are counted per (process, file, module) into ``io_files`` with Darshan's meanings
(``collect._io_counters``). Calls outside the profiled region (interpreter start-up, imports) are left out and
counted in health.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import orjson

from xstack import salvage
from xstack.collect import _child
from xstack.collect._ingest import gc_paused, last_span_id, measured_region
from xstack.collect._io_classes import PathClasses, build_processes, is_builder, probe_name, process_roles
from xstack.collect._io_counters import RUNS, file_counters, op_path
from xstack.collect._io_records import RECORD_BYTES, IoProcess
from xstack.collect._recorder import Recorder
from xstack.collect.torch_profiler import SCRATCH_PREFIX as PROFILER_SCRATCH
from xstack.errors import XstackError
from xstack.outfile import PARTIAL_SUFFIX
from xstack.text import counted
from xstack.trace import attrs as A
from xstack.trace.io_paths import path_text
from xstack.trace.sink import SCRATCH_PREFIX, Sink
from xstack.trace.store import Store, final_path

CHILD_ENV = "XSTACK_IO_CHILD"
"""Set in a program started preloaded by ``xstack run``: the parent reads the records once it has ended."""

_PY_ONLY = "python"


class IoCollector:
    """Records the file operations of the profiled process tree (see the module docstring)."""

    level = "io"

    def __init__(self) -> None:
        self.mode: str | None = None
        self.reason = ""
        self._dir: Path | None = None
        self._owns_dir = False
        self._start_ns = 0
        self._opens: list[tuple[int, int, str, int]] = []

    def unavailable_reason(self) -> str | None:
        if not sys.platform.startswith("linux"):
            return f"the io level interposes the C library's calls, which needs Linux (this is {sys.platform})"
        from xstack.collect import _io_native

        return _io_native.unavailable_reason()

    def start(self, recorder: Recorder) -> None:
        from xstack.collect import _io_native

        self._start_ns = recorder.now_ns()
        if _io_native.preloaded():
            self.mode = "preload"
            self._dir = Path(os.environ[_io_native.DIR_ENV])
            return
        self._dir = Path(tempfile.mkdtemp(prefix="xstack-io-"))
        self._owns_dir = True
        store_path = getattr(recorder.sink.store, "path", None)
        try:
            _io_native.attach(self._dir, exclude=exclusions(Path(store_path)) if store_path else [])
            self.mode = "attach"
        except XstackError as exc:
            self.mode = _PY_ONLY
            self.reason = str(exc)
            _python_opens.start(self._opens)

    def stop(self) -> None:
        from xstack.collect import _io_native

        if self.mode == "attach":
            _io_native.detach()
        elif self.mode == _PY_ONLY:
            _python_opens.stop()
        _io_native.flush()

    def finish(self, store: Store, run_id: int) -> list[tuple[str, int, str]]:
        if self.mode == "preload" and os.environ.get(CHILD_ENV):
            return []  # the parent that preloaded this program reads the records when the whole tree has ended
        if self.mode == _PY_ONLY:
            return _write_python_opens(store, run_id, self._opens, self.reason)
        if self._dir is None:
            return []
        try:
            health = ingest_run(store, run_id, self._dir)
        finally:
            if self._owns_dir:
                shutil.rmtree(self._dir, ignore_errors=True)
        if self.mode == "attach":
            note = ("the io level attached at run time: workers started by exec (spawn, forkserver) and "
                    "subprocesses are not covered; run under `xstack run` to cover them")  # fmt: skip
            health.append(("io_attached", 1, note))
        return health


def exclusions(store: Path) -> list[str]:
    """Path prefixes whose I/O is the profiler's own: the store (and its ``.partial``/``.wal`` files), the
    stores of the processes the program starts with ``torch.multiprocessing`` (``STORE.rankN.duckdb``:
    ``profile.RankProfile``; a prefix per first digit, so that the program's ``STORE.ranking.csv`` is kept),
    the sink's scratch files and the trace the op level writes as it ends. ``store`` may be the ``.partial`` of
    a store being written (an in-process profile's): its journal, ``STORE.journal/``, is the profiler's too."""
    temp = Path(tempfile.gettempdir()).resolve()
    store = store.with_name(store.name.removesuffix(PARTIAL_SUFFIX))
    store, final = store.resolve(), final_path(store).resolve()  # a scratch store appended to the final one
    ranks = [str(final.with_name(f"{final.stem}.rank{digit}")) for digit in range(10)]
    return [str(store), *ranks, str(temp / SCRATCH_PREFIX), str(temp / PROFILER_SCRATCH)]


def run_preloaded(child: list[str], store: Path, *, keep_unread: bool = True) -> int:
    """Run ``child`` (an ``xstack run`` command line writing ``store``) with the interposition library preloaded
    into its whole process tree, then read the records into the run it wrote; returns its exit code. Where they
    cannot be read (an error, Ctrl-C), they are kept for ``xstack recover`` and the run says so
    (``_mark_unread``), with ``keep_unread``; else the error is raised, the records removed."""
    import subprocess

    from xstack.collect import _io_native

    reason = IoCollector().unavailable_reason()
    if reason:
        from xstack.errors import UsageError

        raise UsageError(f"level 'io' cannot run here: {reason}")
    earlier = _kept_folders(final_path(store))
    directory = _records_folder(store, earlier)
    shutil.rmtree(directory, ignore_errors=True)  # what a run killed while it read them left
    directory.mkdir(parents=True)
    env = _io_native.preload_env(directory, exclude=exclusions(store)) | {CHILD_ENV: "1"}
    process = subprocess.Popen(child, env=env)
    code = _child.wait(process)  # the child gets a Ctrl-C too: it finishes writing what it traced
    kept = False
    try:
        salvage.after_child(store, code, process.returncode)  # killed outright: keep what it wrote
        if store.exists():
            # marked first, the mark dropped as they are read in: this process killed meanwhile (out of memory)
            # leaves the run saying where they are too
            run_id = _mark_unread(store, directory, None) if keep_unread else None
            try:
                if run_id is None:
                    ingest(store, directory)
                else:
                    _announce(directory, final_path(store))
                    _read_marked(store, run_id, directory)
            except (Exception, KeyboardInterrupt) as exc:  # the program's profile stands: its records wait
                kept = run_id is not None
                if not kept:
                    raise
                _mark_unread(store, directory, exc)  # why, where it can say it
                code = code or (130 if _interrupted(exc) else 0)
    finally:
        if not kept:
            shutil.rmtree(directory, ignore_errors=True)
    for gone in earlier - (_kept_folders(final_path(store)) if earlier else set()):  # --force replaced their store
        shutil.rmtree(gone, ignore_errors=True)
    return code


ANNOUNCED_BYTES = 16 << 20
"""Record files past this size (some 500,000 calls, a few seconds to read back) are announced (``_announce``)."""


def _announce(directory: Path, shown: Path) -> None:
    """Say on standard error that the records in ``directory`` are being read back, where they are many: the wait
    after the program's end is then explained, and Ctrl-C's effect said."""
    size = sum(f.stat().st_size for f in directory.glob("*.xio"))
    if size > ANNOUNCED_BYTES:
        print(f"xstack: reading the io level's records back ({size / 2**20:,.0f} MiB, about "
              f"{size // RECORD_BYTES:,} calls; Ctrl-C keeps them for `xstack recover {shown}`)",
              file=sys.stderr, flush=True)  # fmt: skip


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C: a KeyboardInterrupt, or the error DuckDB raises in its place when the Ctrl-C came
    during a query (it takes the signal to stop the query: a plain RuntimeError)."""
    return isinstance(exc, KeyboardInterrupt) or (isinstance(exc, RuntimeError) and str(exc) == "Query interrupted")


def _kept_folders(store: Path) -> set[Path]:
    """The folders where the runs of the store at ``store`` keep io records unread (``_mark_unread``); none where it
    is no store."""
    try:
        return {folder for _, folder in unread(store)} if store.is_file() else set()
    except XstackError:  # not a store (yet): --force replaces it, or the run refuses it
        return set()


def _records_folder(store: Path, kept: set[Path]) -> Path:
    """Where the program's records go: ``STORE.io`` beside the store it writes, or ``STORE.io.N`` where the store it
    is written for keeps records of an earlier run unread there (``kept``)."""
    base = store.with_name(store.name.removesuffix(".duckdb") + ".io")
    folder, n = base, 1
    while folder.absolute() in kept:
        n += 1
        folder = base.with_name(f"{base.name}.{n}")
    return folder


NOT_READ = "io_not_read"
"""The health check of a run whose io records could not be read into it once the program ended (``_mark_unread``)."""


def _mark_unread(store: Path, directory: Path, why: BaseException | None) -> int | None:
    """Say in the last run of ``store`` that its io records are kept unread in ``directory`` (config ``io_unread``,
    health ``io_not_read``, ``io`` out of its levels), for ``xstack recover`` to read them in: before they are read
    (``why`` None: the reading drops it, and a reading killed outright leaves it), and where reading them failed
    (``why``: the run as the program left it, the read rolled back), then on standard error too. Returns the run's
    id; None where the store cannot be written (before reading: the records are then read unmarked)."""
    directory = directory.absolute()
    shown = final_path(store)  # the store named on the command line, where --append writes a scratch one first
    if why is None:
        reason = "xstack stopped while it read them: killed, out of memory?"
    else:
        reason = "interrupted by Ctrl-C" if _interrupted(why) else str(why) or type(why).__name__
    detail = (f"the io level's records could not be read into the run once the program ended ({reason}): they are "
              f"kept in {directory}; `xstack recover {shown}` reads them in")  # fmt: skip
    try:
        with Store.open(store, read_only=False) as opened:
            run_id = max(opened.run_ids())
            opened.con.execute("BEGIN TRANSACTION")
            _patch_config(opened, run_id, {A.CONFIG_IO_UNREAD: str(directory)})
            # not an io level that saw nothing: the analyses say it is not in the run (reading them in lists it)
            levels = opened.query("SELECT coalesce(levels, []) FROM _runs WHERE run_id = ?", [run_id])[0][0]
            opened.con.execute(
                "UPDATE _runs SET levels = ? WHERE run_id = ?", [[v for v in levels if v != "io"], run_id]
            )
            opened.con.execute("""DELETE FROM _health WHERE run_id = ? AND "check" = ?""", [run_id, NOT_READ])
            opened.add_health(run_id, [(NOT_READ, 1, detail)])
            opened.con.execute("COMMIT")
    except Exception:  # noqa: BLE001 (before: read unmarked; after: the mark made before stands)
        return None
    if why is not None:
        print(f"xstack: warning: {detail}", file=sys.stderr)
    return run_id


def unread(store_path: Path) -> list[tuple[int, Path]]:
    """The runs of the store at ``store_path`` whose io records ``xstack run`` kept unread (``_mark_unread``), with
    the folder of each."""
    with Store.open(store_path) as store:
        rows = store.query(f"SELECT run_id, config->>'$.{A.CONFIG_IO_UNREAD}' FROM runs "
                           f"WHERE config->>'$.{A.CONFIG_IO_UNREAD}' IS NOT NULL ORDER BY run_id")  # fmt: skip
    return [(int(run_id), Path(folder)) for run_id, folder in rows]


def read_unread(store_path: Path, run_id: int, directory: Path) -> tuple[int, Path]:
    """Read the io records kept unread in ``directory`` into run ``run_id`` of the store at ``store_path``, as ``xstack
    run`` would have (``ingest``), and drop the run's note of them, in one transaction; then remove the folder. Returns
    the io spans written and the folder read. Raises ``XstackError`` naming the folder where it is gone. A folder no
    longer where it was kept is looked for beside the store (the two copied to another machine together)."""
    beside = store_path.with_name(directory.name)
    if not _holds_records(directory) and _holds_records(beside):
        directory = beside
    if not _holds_records(directory):
        raise XstackError(f"{store_path}: run {run_id}'s io records were kept in {directory}, which holds none now "
                          f"(removed?), nor does {beside}: they cannot be read in")  # fmt: skip
    _read_marked(store_path, run_id, directory)
    shutil.rmtree(directory, ignore_errors=True)
    with Store.open(store_path) as store:
        spans = store.query("SELECT count(*) FROM spans WHERE run_id = ? AND level = 'io'", [run_id])[0][0]
    return int(spans), directory


def _holds_records(directory: Path) -> bool:
    return directory.is_dir() and any(directory.glob("*.xio"))


def _read_marked(store_path: Path, run_id: int, directory: Path) -> None:
    """Read the records in ``directory`` into run ``run_id`` (marked by ``_mark_unread``) and drop its mark, in one
    transaction."""
    from xstack.collect._ingest import into_run

    def write(store: Store, run: int) -> list[tuple[str, int, str]]:
        store.con.execute("""DELETE FROM _health WHERE run_id = ? AND "check" = ?""", [run, NOT_READ])
        _patch_config(store, run, {A.CONFIG_IO_UNREAD: None})  # (a merge patch's null removes the key)
        return ingest_run(store, run, directory)

    into_run(store_path, write, run_id=run_id)


def ingest(store_path: Path, directory: Path) -> list[tuple[str, int, str]]:
    """Read the records a preloaded program tree left in ``directory`` into the last run of the complete store
    at ``store_path`` (the run that program recorded); returns the health rows written."""
    from xstack.collect._ingest import into_run

    return into_run(store_path, lambda store, run_id: ingest_run(store, run_id, directory))


def ingest_run(store: Store, run_id: int, directory: Path) -> list[tuple[str, int, str]]:
    """Write the io spans and ``io_files`` rows of the records in ``directory`` into run ``run_id``, whose
    model and layer spans are already in the store; returns health rows."""
    with gc_paused():
        return _ingest_run(store, run_id, directory)


def _ingest_run(store: Store, run_id: int, directory: Path) -> list[tuple[str, int, str]]:
    from xstack.collect._io_records import read_records

    records = read_records(directory)
    lo, hi = measured_region(store, run_id)
    # the calls before the region say what the standard streams are, too; the classes need every process's calls
    # before any span is written: those they read are built first (one of each path), then each process's all
    classes = PathClasses(records.distinct_calls(probe_name), build_processes(records.processes))
    roles = process_roles(records.processes)
    sink = Sink(store, run_id)
    kept = outside = 0
    try:
        span_id = last_span_id(store, run_id)
        for calls in records.by_process(keep=False):
            ops = [op for op in calls if lo <= op.start_ns <= hi]
            kept, outside = kept + len(ops), outside + len(calls) - len(ops)
            del calls
            for op in ops:
                attrs = _span_attrs(op, classes.of(op.path, op.fd_kind))
                if op.pid in roles:
                    attrs[A.IO_PROCESS_ROLE] = roles[op.pid]
                span_id += 1
                sink.span(span_id, None, "io", op.op, op.start_ns, op.dur_ns, op.pid, op.tid, attrs)
            for c in file_counters(ops, classes):  # a process's own: its calls are all of a record's
                role = {A.IO_FILE_PROCESS_ROLE: roles[c.pid]} if c.pid in roles else {}
                sink.io_file(c.pid, c.path, c.module, _columns(c), c.attrs() | role)
    finally:
        sink.close()
    set_io_parents(store.con, run_id)
    _add_level(store, run_id)
    _add_programs(store, run_id, programs(records.processes, roles, lo, hi))
    _add_process_cpu(store, run_id, process_cpu(records.processes, roles, lo, hi))
    return _health(records, kept, outside)


def programs(processes: list[IoProcess], roles: dict[int, str], lo: int, hi: int) -> list[dict[str, Any]]:
    """The processes of role ``subprocess`` (programs started by exec, and those below them) that lived during
    ``[lo, hi]``, one entry each (``A.CONFIG_IO_PROGRAMS``), in the order they started: a process's images (its fork
    of the parent, then each exec) are one, named by the program it exec'd first."""
    out = []
    for pid, seen, start, end in _lived(processes, lambda p: roles.get(p.pid) == "subprocess", lo, hi):
        ran = next((p for p in seen if not p.forked), seen[0])
        command = " ".join(ran.argv) or ran.exe
        name = PurePosixPath(ran.argv[0] if ran.argv else ran.exe).name  # as the program was called: sh, not dash
        entry = {"pid": pid, "ppid": seen[0].ppid, "program": name or ran.exe,
                 "command": command[: A.IO_PROGRAM_COMMAND_CHARS], "start_ns": start, "end_ns": end}  # fmt: skip
        if is_builder(PurePosixPath(ran.exe).name) or is_builder(name):
            entry["build"] = True
        out.append(entry)
    return out


def _lived(processes: list[IoProcess], keep: Callable[[IoProcess], bool], lo: int, hi: int
           ) -> Iterator[tuple[int, list[IoProcess], int, int]]:  # fmt: skip
    """The pids of the images ``keep`` keeps that lived during ``[lo, hi]``, in the order they started: each with its
    images in order, its start (its first image's) and its end (its last image's)."""
    images: dict[int, list[IoProcess]] = {}
    for p in sorted(processes, key=lambda p: (p.start_ns, p.pid)):
        if keep(p):
            images.setdefault(p.pid, []).append(p)
    for pid, seen in images.items():
        start, end = seen[0].start_ns, max(p.end_ns for p in seen)
        if end >= lo and start <= hi:
            yield pid, seen, start, end


def process_cpu(processes: list[IoProcess], roles: dict[int, str], lo: int, hi: int) -> list[dict[str, Any]]:
    """What the processes that lived during ``[lo, hi]`` did with the CPUs (``A.CONFIG_IO_PROCESS_CPU``), a pid's
    images summed: the main process and workers (no role) first, then the others, each in the order they
    started; those whose files predate the figures left out."""
    out = []
    for pid, seen, start, end in _lived(processes, lambda p: p.cpu_ns is not None, lo, hi):
        entry = {"pid": pid, "start_ns": start, "end_ns": end, "cpu_ns": sum(p.cpu_ns or 0 for p in seen),
                 "preempted": sum(p.preempted or 0 for p in seen)}  # fmt: skip
        if all(p.run_delay_ns is not None for p in seen):
            entry["run_delay_ns"] = sum(p.run_delay_ns or 0 for p in seen)
        if all(p.recording_ns is not None for p in seen):
            entry["recording_ns"] = sum(p.recording_ns or 0 for p in seen)
        out.append(entry)
    out.sort(key=lambda e: roles.get(e["pid"]) is not None)  # stable: each part in the order it started
    return out[: A.IO_PROCESS_CPU_KEPT]


def _add_process_cpu(store: Store, run_id: int, found: list[dict[str, Any]]) -> None:
    """Record ``found`` (``process_cpu``) in the run's config."""
    if found:
        _patch_config(store, run_id, {A.CONFIG_IO_PROCESS_CPU: found})


def _add_programs(store: Store, run_id: int, found: list[dict[str, Any]]) -> None:
    """Record ``found`` (``programs``) in the run's config, the first ``A.IO_PROGRAMS_KEPT`` of them."""
    if not found:
        return
    patch: dict[str, Any] = {A.CONFIG_IO_PROGRAMS: found[: A.IO_PROGRAMS_KEPT]}
    if len(found) > A.IO_PROGRAMS_KEPT:
        patch[A.CONFIG_IO_PROGRAMS_MORE] = len(found) - A.IO_PROGRAMS_KEPT
    _patch_config(store, run_id, patch)


def _patch_config(store: Store, run_id: int, patch: dict[str, Any]) -> None:
    """Merge ``patch`` into the run's config."""
    store.con.execute(
        "UPDATE _runs SET config = json_merge_patch(coalesce(config, '{}'), ?::JSON) WHERE run_id = ?",
        [orjson.dumps(patch).decode(), run_id],
    )


def set_io_parents(con: Any, run_id: int) -> None:
    """Hang each io span of run ``run_id`` from the innermost model or layer span open on its thread when it
    started (``design.md`` §2); one with none open (a worker's call) keeps no parent."""
    from xstack.collect._ingest import set_parents

    set_parents(con, run_id, "io")


def _span_attrs(op: Any, path_class: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        A.IO_PATH: op_path(op),
        A.IO_FD: op.fd,
        A.IO_MODULE: op.module,
        A.IO_FD_KIND: op.fd_kind,
        A.IO_PATH_CLASS: path_class,
    }
    if op.op == "readdir":  # a run of calls: entries returned and calls made (``hooks_dir.c``)
        if op.bytes >= 0:
            attrs[A.IO_DIR_ENTRIES] = op.bytes
            attrs[A.IO_CALLS] = op.requested
        if op.errno:
            attrs[A.IO_ERRNO] = op.errno
        return attrs
    if op.offset >= 0:
        attrs[A.IO_OFFSET] = op.offset
    if op.bytes >= 0:
        attrs[A.IO_BYTES] = op.bytes
    if op.requested >= 0:  # a stdio run's is the calls it made (``hooks_stdio.c``)
        attrs[A.IO_CALLS if op.op in RUNS else A.IO_REQUESTED_BYTES] = op.requested
    if op.target is not None:
        attrs[A.IO_TARGET] = op.target
    if op.errno:
        attrs[A.IO_ERRNO] = op.errno
    return attrs


_COLUMNS = ("opens", "reads", "writes", "seeks", "bytes_read", "bytes_written", "read_time_ns", "write_time_ns",
            "meta_time_ns")  # fmt: skip


def _columns(c: Any) -> dict[str, int]:
    return {name: getattr(c, name) for name in _COLUMNS}


def _add_level(store: Store, run_id: int) -> None:
    """List ``io`` among the run's levels, in the store's level order (a run still being recorded has no row
    yet: its profile lists its levels itself)."""
    from xstack.trace.schema import LEVELS

    found = store.query("SELECT coalesce(levels, []) FROM _runs WHERE run_id = ?", [run_id])
    if not found:
        return
    levels = found[0][0]
    ordered = [lv for lv in LEVELS if lv in {*levels, "io"}]
    store.con.execute("UPDATE _runs SET levels = ? WHERE run_id = ?", [ordered, run_id])


def _health(trace: Any, kept: int, outside: int) -> list[tuple[str, int, str]]:
    health: list[tuple[str, int, str]] = [
        ("io_outside_region", outside, f"file operations before or after the profiled region (start-up, imports), "
         f"not kept; the {kept:,} in it, from {counted(len(trace.processes), 'process', 'processes')}, are kept"),
    ]  # fmt: skip
    dropped = sum(sum(p.dropped.values()) for p in trace.processes)
    if dropped:
        worst = max(trace.processes, key=lambda p: sum(p.dropped.values()))
        health.append(("io_cap_hit", dropped, f"records past the cap were counted, not kept (pid {worst.pid}: "
                       f"{sum(worst.dropped.values())} calls); raise XSTACK_IO_MAX_RECORDS"))  # fmt: skip
    unclean = [p for p in trace.processes if not p.clean_exit]
    if unclean:
        pids = ", ".join(str(p.pid) for p in unclean[:5])
        health.append(("io_process_cut_short", len(unclean), f"processes that did not exit cleanly (killed?): "
                       f"their last calls may be missing (pids {pids})"))  # fmt: skip
    signalled = [p for p in trace.processes if p.end.startswith("SIG")]
    if signalled:
        pids = ", ".join(f"{p.pid} ({p.end})" for p in signalled[:5])
        health.append(("io_processes_signalled", len(signalled), "processes killed by a termination signal (a "
                       f"pool's workers when it is terminated), their calls up to it kept: pids {pids}"))  # fmt: skip
    skipped = sum(p.reentrant_skipped for p in trace.processes)
    if skipped:
        health.append(("io_reentrant_skipped", skipped, "calls made inside a recorded call (signal handlers): "
                       "passed through, not recorded"))  # fmt: skip
    paths = sum(p.paths_dropped for p in trace.processes)
    if paths:
        health.append(("io_paths_dropped", paths, "paths past the path table's cap: recorded without a path"))
    for nc in trace.not_covered:
        health.append(("io_not_covered", 1, f"pid {nc.pid} exec'd {nc.path}: {nc.reason}; its I/O is not seen"))
    for problem in trace.problems:
        health.append(("io_record_problem", 1, problem))
    return health


# -- Python-only fallback: the files Python opens ------------------------------------------------------------
class _PythonOpens:
    """An audit hook on ``open`` (it cannot be removed once added, so it stays, idle, between profiles)."""

    def __init__(self) -> None:
        self._sink: list[tuple[int, int, str, int]] | None = None
        self._installed = False

    def start(self, sink: list[tuple[int, int, str, int]]) -> None:
        if not self._installed:
            sys.addaudithook(self._hook)
            self._installed = True
        self._sink = sink

    def stop(self) -> None:
        self._sink = None

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        sink = self._sink
        if sink is not None and event == "open" and isinstance(args[0], str | bytes):
            path = path_text(os.path.abspath(args[0]))
            sink.append((time.time_ns(), threading.get_native_id(), path, os.getpid()))


_python_opens = _PythonOpens()


def _write_python_opens(
    store: Store, run_id: int, opens: list[tuple[int, int, str, int]], reason: str
) -> list[tuple[str, int, str]]:
    from xstack.trace.io_paths import path_class

    sink = Sink(store, run_id)
    try:
        first_id = last_span_id(store, run_id)
        for i, (ts, tid, path, pid) in enumerate(opens):
            attrs = {A.IO_PATH: path, A.IO_MODULE: "python", A.IO_PATH_CLASS: path_class(path)}
            sink.span(first_id + i + 1, None, "io", "open", ts, 0, pid, tid, attrs)
    finally:
        sink.close()
    set_io_parents(store.con, run_id)
    _add_level(store, run_id)
    note = (f"only the files Python opened are seen (no reads, writes or native I/O): the interposition library "
            f"could not attach: {reason}; run under `xstack run` instead")  # fmt: skip
    return [("io_python_only", len(opens), note)]
