"""Batched writing of live spans and counters into a store: rows collect in memory and go to DuckDB in bulk.

One round trip per span would cost the profiled program far more than the span is worth. Instead each row is
serialised with orjson as it comes, appended to one in-memory buffer of newline-delimited JSON per table, and
the buffer is inserted with DuckDB's JSON reader when it reaches ``batch_bytes`` and when the sink closes.

Measured on this design's alternatives (a 2-core VM): keeping a list of row dicts, or of ``bytes``, cost
1.4-1.8 us a row in page faults and garbage-collector walks; appending to one ``bytearray`` costs 0.3-0.4 us.
Inserting costs about 2.5 us a row wherever it happens, so the default batch (32 MiB, about 100,000 spans)
keeps a profile of that size from inserting anything before it ends.

A buffer goes to DuckDB through a chunk file: the buffer is appended to its table's current chunk, and a chunk is
inserted once it holds ``batch_bytes``. With a ``journal`` (a live profile's), the chunks are kept in that
folder beside the store, the buffer is appended every ``JOURNAL_SPILL_BYTES`` and at each ``checkpoint()``
(the profile's iterations), and a chunk's insert records its name in ``CHUNKS_TABLE`` in the same transaction,
so that a process killed outright (SIGKILL, a segfault) leaves a store plus the chunks it had not inserted:
``xstack.salvage`` completes the run from them. Without one the chunk is a scratch file written once per batch.
Either way each byte is written to a file once, as before the insert.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from xstack.trace.io_paths import json_dumps
from xstack.trace.store import Store

DEFAULT_BATCH_BYTES = 32 << 20
JOURNAL_SPILL_BYTES = 1 << 20
"""A journaled buffer is appended to its chunk file at this size (about 3,000 spans): what a killed run loses."""
CHECKPOINT_INTERVAL_S = 0.02
"""``checkpoint()`` appends the buffers at most this often (a loop of short iterations calls it at each one): an
append costs about 6 us, between two iterations, so at most 0.03% of the run, outside the iterations' times."""
CHUNKS_TABLE = "_sink_chunks"
"""In a store being written with a journal: the chunk files already inserted (dropped once the sink closes)."""

SCRATCH_PREFIX = "xstack-sink-"
"""Name prefix of the sink's scratch folders under the temp directory (the io level leaves their I/O out)."""

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
_dumps = orjson.dumps


class Sink:
    """Buffers span and counter rows of one run and inserts them into ``store`` in batches."""

    def __init__(self, store: Store, run_id: int, *, batch_bytes: int = DEFAULT_BATCH_BYTES,
                 journal: Path | None = None) -> None:  # fmt: skip
        """``journal``: an empty folder for the chunk files, kept until ``close`` (see the module docstring)."""
        self.store = store
        self.run_id = run_id
        self.batch_bytes = batch_bytes
        self.spans_written = 0
        self.counters_written = 0
        self.io_files_written = 0
        self._buffers = {"_spans": bytearray(), "_counters": bytearray(), "_io_files": bytearray()}
        self._pending = {"_spans": 0, "_counters": 0, "_io_files": 0}
        self._spans = self._buffers["_spans"]
        self._columns = {table: table_columns(store, table) for table in self._buffers}
        self._journal = journal
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if journal is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX)
            self._dir = Path(self._tmp.name)
            self._spill_bytes = batch_bytes
        else:
            self._dir = journal
            self._spill_bytes = min(batch_bytes, JOURNAL_SPILL_BYTES)
            store.con.execute(f"CREATE TABLE IF NOT EXISTS {CHUNKS_TABLE} (name VARCHAR)")
        self._chunks: dict[str, tuple[Path, int, int, int] | None] = dict.fromkeys(self._buffers)
        """Per table: the chunk file being filled, its descriptor, bytes and rows."""
        self._seq = 0
        self._checkpointed = time.monotonic()
        self.journal_error: str | None = None
        """Why the journal's appends stopped (a full disk), if they did: a killed run would lose what came after."""

    def span(
        self,
        span_id: int,
        parent_id: int | None,
        level: str,
        name: str,
        start_ns: int,
        dur_ns: int,
        pid: int | None,
        tid: int | None,
        attrs: dict[str, Any] | None = None,
        *,
        device: str = "cpu",
        stream: int | None = None,
        correlation_id: int | None = None,
    ) -> None:
        """Queue one span; times are integer nanoseconds on the run's clock."""
        row = {
            "run_id": self.run_id,
            "span_id": span_id,
            "parent_id": parent_id,
            "level": level,
            "name": name,
            "start_ns": start_ns,
            "dur_ns": dur_ns,
            "pid": pid,
            "tid": tid,
            "device": device,
            "stream": stream,
            "correlation_id": correlation_id,
            "attrs": attrs or None,
        }
        # ``_add`` inlined: this runs for every live span
        buffer = self._spans
        try:
            buffer += _dumps(row, option=_OPTIONS, default=str)
        except TypeError:  # a name or attribute with lone surrogates (a file name that is not UTF-8): escaped
            buffer += json_dumps(row, _OPTIONS)
        self._pending["_spans"] += 1
        if len(buffer) >= self._spill_bytes:
            self._spill("_spans", optional=len(buffer) < self.batch_bytes)

    def counter(self, name: str, ts_ns: int, value: float, *, pid: int | None = None, device: str = "cpu") -> None:
        """Queue one counter sample."""
        row = {"run_id": self.run_id, "name": name, "ts_ns": ts_ns, "value": value, "pid": pid, "device": device}
        self._add("_counters", row)

    def io_file(self, pid: int | None, path: str, module: str, counters: dict[str, int],
                attrs: dict[str, Any] | None = None) -> None:  # fmt: skip
        """Queue one ``io_files`` row: the I/O counters of ``path`` in process ``pid`` and ``module`` (``POSIX``
        or ``STDIO``); ``counters`` holds the view's count, byte and ``_ns`` columns by name."""
        row = {"run_id": self.run_id, "pid": pid, "path": path, "module": module, **counters, "attrs": attrs or None}
        self._add("_io_files", row)

    def flush(self) -> None:
        """Insert everything queued."""
        for table in self._buffers:
            self._spill(table)
            self._insert(table)

    def checkpoint(self) -> bool:
        """With a journal: append what is queued to the chunk files, if the last time was ``CHECKPOINT_INTERVAL_S``
        ago or more, so that it outlives the process; whether it did."""
        if self._journal is None or self.journal_error is not None:
            return False
        now = time.monotonic()
        if now - self._checkpointed < CHECKPOINT_INTERVAL_S:
            return False
        self._checkpointed = now
        for table in self._buffers:
            self._spill(table, optional=True)
        return True

    def close(self) -> None:
        """Flush and remove the scratch directory (with a journal: forget the inserted chunks; the folder is the
        caller's)."""
        try:
            self.flush()
            if self._journal is not None:
                self.store.con.execute(f"DROP TABLE IF EXISTS {CHUNKS_TABLE}")
        finally:
            for chunk in self._chunks.values():
                if chunk is not None:
                    os.close(chunk[1])
            self._chunks = dict.fromkeys(self._buffers)
            if self._tmp is not None:
                self._tmp.cleanup()

    def _add(self, table: str, row: dict[str, Any]) -> None:
        buffer = self._buffers[table]
        try:
            buffer += orjson.dumps(row, option=_OPTIONS, default=str)
        except TypeError:  # as in ``span``
            buffer += json_dumps(row, _OPTIONS)
        self._pending[table] += 1
        if len(buffer) >= self._spill_bytes:
            self._spill(table, optional=len(buffer) < self.batch_bytes)

    def _spill(self, table: str, *, optional: bool = False) -> None:
        """Append ``table``'s buffer to its chunk file; insert the chunk once it holds a batch. ``optional``: a
        journal's append before a batch is due, which a failure (a full disk) turns off, the rows kept in memory
        and ``journal_error`` set, rather than raise into the program."""
        buffer, rows = self._buffers[table], self._pending[table]
        if not rows:
            return
        chunk = self._chunks[table]
        try:
            if chunk is None:
                path = self._dir / f"{self._seq + 1:06d}{table}.ndjson"
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
                chunk = self._chunks[table] = (path, os.open(path, flags, 0o644), 0, 0)
                self._seq += 1
            path, fd, size, chunk_rows = chunk
            with memoryview(buffer) as view:
                done = 0
                while done < len(view):  # a regular file takes it all at once; a full disk raises
                    done += os.write(fd, view[done:])
        except OSError as exc:
            if chunk is not None:  # no row half written: what the buffer holds is appended whole, later
                with contextlib.suppress(OSError):
                    os.ftruncate(chunk[1], chunk[2])
            if not optional:
                raise
            self.journal_error = f"{exc.filename or self._dir}: {exc.strerror or exc}"
            self._spill_bytes = self.batch_bytes
            return
        self._chunks[table] = (path, fd, size + len(buffer), chunk_rows + rows)
        buffer.clear()
        self._pending[table] = 0
        if size + done >= self.batch_bytes:
            self._insert(table)

    def _insert(self, table: str) -> None:
        """Insert ``table``'s chunk file (with a journal, recording it as inserted in the same transaction)."""
        chunk = self._chunks[table]
        if chunk is None:
            return
        path, fd, _, rows = chunk
        self._chunks[table] = None
        os.close(fd)
        con = self.store.con
        if self._journal is None:
            insert_chunk(con, table, path, self._columns[table])
        else:
            con.execute("BEGIN TRANSACTION")
            try:
                insert_chunk(con, table, path, self._columns[table])
                con.execute(f"INSERT INTO {CHUNKS_TABLE} VALUES (?)", [path.name])
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        path.unlink()
        if table == "_spans":
            self.spans_written += rows
        elif table == "_counters":
            self.counters_written += rows
        else:
            self.io_files_written += rows


def insert_chunk(con: Any, table: str, path: Path, columns: str) -> None:
    """Insert the newline-delimited JSON rows of ``path`` into ``table`` (``columns``: ``table_columns``)."""
    con.execute(
        f"INSERT INTO {table} BY NAME SELECT * FROM read_json(?, format = 'newline_delimited', columns = {columns})",
        [str(path)],
    )


def chunk_table(path: Path) -> str | None:
    """The table a chunk file of a journal holds rows of, from its name (None: not a chunk file)."""
    name = path.name
    if not name.endswith(".ndjson") or not name[:6].isdigit():
        return None
    table = name[6 : -len(".ndjson")]
    return table if table in ("_spans", "_counters", "_io_files") else None


def table_columns(store: Store, table: str) -> str:
    """The ``columns`` argument of ``read_json`` for ``table``, read from the store's own schema."""
    rows = store.con.execute(
        "SELECT column_name, data_type FROM duckdb_columns() "
        "WHERE table_name = ? AND database_name = current_database() ORDER BY column_index",
        [table],
    ).fetchall()
    return "{" + ", ".join(f"{name}: '{kind}'" for name, kind in rows) + "}"
