"""Keeping what a profiled process recorded when it is killed outright: SIGKILL (the out-of-memory killer's), a
segmentation fault or an abort in native code, an ``exit()`` from C. No handler runs then, so the profile cannot
complete itself as it does at an exception, ``os._exit`` or SIGTERM.

A profile writing a store of its own keeps a journal beside it, ``STORE.journal/``: a header with what the run's
row holds as it starts, and the sink's chunk files (``trace.sink``), appended at the end of an iteration (at most
every 0.02 s) and every 1 MiB of rows. The process that started the program (``xstack run``'s, or the one
running a tracer) calls ``after_child`` once it has ended: if the program left a ``.partial`` store and a
journal, ``salvage`` inserts the chunks the store does not hold yet, adds the run's row (``cut_short``, with
what ended it) and a health row saying what is missing, and renames the store into place.

The ``system`` level's C sampler appends its rows to files of its own in the journal, at most every 0.25 s
(``collect._system_native``): ``salvage`` writes their counters into the run as the sampler does at a run's end,
with a ``config.system`` the system analyses read, so that the memory of the program and of the machine up to
the kill (the out-of-memory killer's) is kept.

What a salvaged run lacks: what ended after the journal was last written (the iterations that ended since), the
spans still open when the process died (the iteration in progress and the layers inside it), the levels that
are read as a run ends (``op``, ``runtime``, ``kernel``), and of the ``system`` level the samples after its last
append, the GPU samples and the roles of the child processes (the Python sampler, ``XSTACK_SYSTEM_SAMPLER=python``,
keeps none of it).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from xstack.collect._system_native import JOURNAL_PERIOD_S
from xstack.errors import StoreError
from xstack.outfile import PARTIAL_SUFFIX
from xstack.text import counted, format_ns
from xstack.trace import attrs as A
from xstack.trace.io_paths import json_dumps
from xstack.trace.sink import CHECKPOINT_INTERVAL_S, CHUNKS_TABLE, Sink, chunk_table, insert_chunk, table_columns
from xstack.trace.store import Store, final_path

JOURNAL_SUFFIX = ".journal"
HEADER = "run.json"
LIVE_LEVELS = ("model", "layer")
"""The levels written as they happen: a salvaged run keeps them."""
READ_BY_PARENT = ("io", "metrics")
"""The levels the process that started the program reads from their own files (the io library's records,
``ncu``'s CSV) once it ends, killed or not."""


def journal_path(store: Path) -> Path:
    """The journal of the store at ``store`` while a profile writes it."""
    return store.with_name(store.name + JOURNAL_SUFFIX)


def new_journal(store: Path) -> Path:
    """An empty journal for ``store`` (one a killed run left is replaced, as its ``.partial`` is)."""
    journal = journal_path(store)
    shutil.rmtree(journal, ignore_errors=True)
    journal.mkdir(parents=True)
    return journal


def write_json(journal: Path, name: str, data: dict[str, Any]) -> None:
    """Keep ``data`` in ``journal`` as the file ``name`` (the run's ``HEADER``, a collector's own), written whole
    or not at all."""
    tmp = journal / (name + ".tmp")
    tmp.write_bytes(json_dumps(data))
    os.replace(tmp, journal / name)


def remove_journal(journal: Path | None) -> None:
    if journal is not None:
        shutil.rmtree(journal, ignore_errors=True)


def left(store: Path) -> bool:
    """Whether a killed profile left ``store`` to salvage: its ``.partial`` and a journal with its header."""
    return store.with_name(store.name + PARTIAL_SUFFIX).exists() and (journal_path(store) / HEADER).exists()


def salvage(store: Path, reason: str, *, read_after: tuple[str, ...] = READ_BY_PARENT) -> int:
    """Complete the store a killed profile left at ``store`` (see the module docstring); ``reason``: what ended
    the program (``config.error``), ``read_after``: the levels the caller reads into the run itself. Returns the
    number of spans the run keeps. Raises ``StoreError`` when nothing can be kept (the leftovers are removed)."""
    journal = journal_path(store)
    try:
        try:
            header = orjson.loads((journal / HEADER).read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise StoreError(f"{journal / HEADER}: cannot be read ({exc}): the run cannot be completed") from exc
        with Store.reopen_partial(store) as partial:
            con = partial.con
            run_id = int(header["run_id"])
            inserted: set[str] = set()
            if partial.query("SELECT 1 FROM duckdb_tables() WHERE table_name = ?", [CHUNKS_TABLE]):
                inserted = {name for (name,) in partial.query(f"SELECT name FROM {CHUNKS_TABLE}")}
            for chunk in sorted(journal.iterdir()):
                table = chunk_table(chunk)
                if table is not None and chunk.name not in inserted and _whole_lines(chunk):
                    insert_chunk(con, table, chunk, table_columns(partial, table))
            con.execute(f"DROP TABLE IF EXISTS {CHUNKS_TABLE}")
            ((spans, last),) = partial.query(
                "SELECT count(*), max(start_ns + dur_ns) FROM _spans WHERE run_id = ?", [run_id]
            )
            if not spans:
                raise NothingRecorded(f"{store}: nothing had been recorded")
            if not partial.query("SELECT 1 FROM _runs WHERE run_id = ?", [run_id]):  # not killed after writing it
                system = _salvage_system(partial, journal, header)
                _add_run(partial, header, reason, read_after, int(spans), last, system)
    finally:
        remove_journal(journal)
    return int(spans)


class _System(NamedTuple):
    """What the system level's journal gave a salvaged run."""

    config: dict[str, Any] | None
    """The run's ``config.system``; None when nothing was kept."""
    last_ns: int | None
    """The last sample's time."""
    why_not: str | None
    """Why nothing was kept, for the health row."""


def _salvage_system(store: Store, journal: Path, header: dict[str, Any]) -> _System | None:
    """Write the counters of the system samples the C sampler appended to ``journal`` into the run (the rows of
    ``collect._system_native.read_journal_rows``, with the functions the sampler uses at a run's end), and the
    ``config.system`` its analyses read; None where the run has no system level."""
    from xstack.collect._system_native import JOURNAL_META, read_journal_rows
    from xstack.collect._system_proc import PROC_STRIDE, write_machine, write_processes

    if "system" not in header["levels"]:
        return None
    try:
        meta = orjson.loads((journal / JOURNAL_META).read_bytes())
    except FileNotFoundError:
        return _System(None, None, "the sampler started no journal")
    except (OSError, orjson.JSONDecodeError) as exc:
        return _System(None, None, f"{journal / JOURNAL_META} cannot be read ({exc})")
    if meta.get("sampler") != "native":
        return _System(None, None, "the Python sampler (XSTACK_SYSTEM_SAMPLER=python) keeps its samples in memory "
                       "until the run ends")  # fmt: skip
    try:
        cpus, stride, root = [str(c) for c in meta["cpus"]], int(meta["machine_stride"]), int(meta["pid"])
    except (KeyError, TypeError, ValueError) as exc:
        return _System(None, None, f"{journal / JOURNAL_META} lacks what reading the samples needs ({exc!r})")
    procs, machine = read_journal_rows(journal, stride)
    if not procs and not machine:
        return _System(None, None, "no sample had been appended to its journal")
    run_id = int(header["run_id"])
    sink = Sink(store, run_id)
    try:
        counters = write_machine(sink, machine, cpus) + write_processes(sink, procs)
    finally:
        sink.close()
    others = Counter(k for k, pid in zip(procs[0::PROC_STRIDE], procs[2::PROC_STRIDE], strict=True) if pid != root)
    last = max(procs[-PROC_STRIDE + 1] if procs else 0, machine[-stride + 1] if machine else 0)
    config = {
        "syscalls": False,
        "syscall_tool": None,
        "interval_ms": meta.get("interval_ms"),
        "full_interval_ms": meta.get("full_interval_ms"),
        "cores": meta.get("cores"),
        "samples": len(set(procs[0::PROC_STRIDE])),
        "counters": counters,
        "torch_threads": None,
        "gpus": [],
        "gpu_names": {},
        "gpu_interval_ms": None,
        "nvml": "GPU samples are not kept when a program is killed outright (they stay in memory until the run ends)",
        "workers": max(others.values(), default=0),  # the roles of the child processes are not known
        "process_roles": {},
        "sampler": "native",
        "salvaged": True,
    }
    return _System(config, last, None)


def _add_run(store: Store, header: dict[str, Any], reason: str, read_after: tuple[str, ...], spans: int,
             last_ns: int | None, system: _System | None) -> None:  # fmt: skip
    from xstack.profile import run_info  # which imports this module

    run_id = int(header["run_id"])
    ((steps,),) = store.query(
        f"SELECT count(*) FROM _spans WHERE run_id = ? AND level = 'model' AND attrs->>'$.\"{A.MODEL_KIND}\"' = 'step'",
        [run_id],
    )
    levels = list(header["levels"])
    kept = (*LIVE_LEVELS, *read_after, *(("system",) if system is not None and system.config is not None else ()))
    lost = [level for level in levels if level not in kept]
    header = header | {"levels": [level for level in levels if level not in lost]}
    if system is not None and system.config is not None:
        header = header | {"config": header["config"] | {A.CONFIG_SYSTEM: system.config}}
    store.add_run(run_info(header, store, error=reason, completed=int(steps), cut_short=True))
    until = f", until {format_ns(last_ns - int(header['started_at_ns']))} into the run" if last_ns else ""
    # ended spans reach the journal at an iteration's end, at most every CHECKPOINT_INTERVAL_S: the last
    # iterations before the death can be lost with the spans still open, however long ago they ended
    inside = " and the layers inside it" if "layer" in levels else ""
    missing = (
        f"what ended after that (the journal is written at the end of an iteration, at most every "
        f"{CHECKPOINT_INTERVAL_S:g} s) and the spans still open as it died (the iteration in progress{inside})"
    )
    sep = ", and"
    if system is not None and system.config is not None:
        sep = "; and"
        until_system = f", until {format_ns(system.last_ns - int(header['started_at_ns']))} into the run" if (
            system.last_ns) else ""  # fmt: skip
        missing += (f"; of the system level (its CPU and memory samples are kept{until_system}): the samples "
                    f"after its last append (at most every {JOURNAL_PERIOD_S:g} s), the GPU samples, and the roles "
                    f"of the child processes (each counts as a worker)")  # fmt: skip
    if lost:
        missing += f"{sep} the {', '.join(lost)} level{'s' if len(lost) > 1 else ''}, read as a run ends"
        if system is not None and system.why_not is not None:
            missing += f" (system: {system.why_not})"
    store.add_health(run_id, [("salvaged", 1, f"{reason} before its profile was complete: what it had written is "
                               f"kept ({counted(spans, 'span')}{until}); missing: {missing}")])  # fmt: skip


def _whole_lines(chunk: Path) -> bool:
    """Cut a chunk file back to its last whole row (a process killed in the middle of appending to it); whether
    any row is left."""
    data = chunk.read_bytes()  # at most a batch and a spill: 33 MiB
    end = data.rfind(b"\n") + 1
    if end < len(data):
        os.truncate(chunk, end)
    return end > 0


def after_child(store: Path, code: int, returncode: int, *, read_after: tuple[str, ...] = READ_BY_PARENT) -> bool:
    """In the process that started the program recording ``store``, once it has ended with ``returncode``
    (``subprocess``'s: -N for signal N) and exit ``code``: salvage what it left, if it left anything, and say
    so; say so too when it was killed before it wrote anything. Returns whether the store was completed here."""
    from xstack.collect._child import killed_by

    # --append records into a scratch store beside the one named: what the user is told about is that one
    named = final_path(store)
    appending_to = named if named != store else None

    existed = store.exists()  # what the program completed itself, or (--force) the store it would replace
    if not left(store):
        if returncode < 0 and not existed:
            print(f"xstack: {killed_by(returncode)} before its profile was written: "
                  f"{_nothing_kept(store, appending_to, existed)}", file=sys.stderr)  # fmt: skip
        return False
    reason = killed_by(returncode) if returncode < 0 else (
        f"the program ended with exit code {code} from native code (exit() or abort() outside Python)")  # fmt: skip
    try:
        spans = salvage(store, reason, read_after=read_after)
    except NothingRecorded:
        print(f"xstack: {reason} before its profile was written: {_nothing_kept(store, appending_to, existed)}",
              file=sys.stderr)  # fmt: skip
        return False
    except StoreError as err:
        print(f"xstack: {reason}; what it recorded could not be kept ({_nothing_kept(store, appending_to, existed)})"
              f": {err}", file=sys.stderr)  # fmt: skip
        return False
    print(f"xstack: {reason}; the profile it had recorded ({counted(spans, 'span')}) was kept", file=sys.stderr)
    return True


def _nothing_kept(store: Path, appending_to: Path | None, existed: bool) -> str:
    """What a killed program that left nothing to keep leaves behind."""
    if appending_to is not None:
        return f"nothing added to {appending_to}"
    return f"{store} is left as it was" if existed else f"no profile in {store}"


class NothingRecorded(StoreError):
    """A killed profile left a store without a span in it: there is nothing to keep."""
