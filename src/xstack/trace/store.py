"""The trace store: one DuckDB file per profile, opened only through this module.

A store is created under a temporary ``.partial`` name and renamed into place only once it is complete, so a
crash or a bad input never leaves behind a file that looks like a finished profile.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import orjson

from xstack.errors import StoreError
from xstack.outfile import PARTIAL_SUFFIX, os_reason
from xstack.trace.io_paths import is_utf8, json_dumps, path_text
from xstack.trace.schema import FORMAT_NAME, MIGRATIONS, SCHEMA_VERSION, TABLES, VIEWS

DEFAULT_MEMORY_LIMIT = os.environ.get("XSTACK_MEMORY_LIMIT", "128MB")
"""DuckDB's memory limit for a store's connection; past it, temp tables, sorts and joins spill to disk.

With 128MB, importing a 1 GB trace peaks at about a quarter of its size in RSS (255 MB, bench/README.md): the
process's own memory (Python, DuckDB's code and connection, about 70 MB) and DuckDB's allocations outside its
limit come on top. Less fails: at 112MB, mapping a 1 GB trace's events runs out of memory."""

DATA_PER_MEMORY_BYTE = 8
"""Sorting and joining more data needs more memory to spill without failing (DuckDB keeps a block of every
sorted run in memory while merging them): ``memory_for`` raises the limit to one byte per this many bytes of
input, for inputs past 8 times the limit (a 2 GB trace fails at 128MB and imports at 160MB)."""

OPERATOR_MEMORY_SHARE = 0.375
"""Share of the memory limit that one query's sorts and hash tables may hold before they spill: without a
cap, a hash join sized to nearly the whole limit can leave no room to pin the blocks it reads."""


@dataclass
class RunInfo:
    """One row of ``runs``. ``started_at_ns`` is nanoseconds since the Unix epoch (UTC), when known."""

    run_id: int
    name: str
    started_at_ns: int | None = None
    command: str | None = None
    host: str | None = None
    framework: str | None = None
    device: str | None = None
    levels: list[str] = field(default_factory=list)
    pass_name: str | None = None
    config: dict[str, Any] = field(default_factory=dict)


class Store:
    """An open trace store. Use ``Store.open`` to read or append, ``Store.create`` to make a new one."""

    def __init__(self, path: Path, con: duckdb.DuckDBPyConnection, read_only: bool) -> None:
        self.path = path
        self._con: duckdb.DuckDBPyConnection | None = con
        self.read_only = read_only

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The store's open connection; ``StoreError`` once it is closed. A closed store lets go of it: a closed
        connection kept to the end of a profiled program (its ``Store`` held by the profile) made DuckDB's
        bindings print a page of "leaked instance" warnings as the interpreter shut down, in a program whose
        compiled functions (``torch.compile``) torch keeps alive to the end."""
        if self._con is None:
            raise StoreError(f"{self.path}: the store is closed")
        return self._con

    # -- opening ------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], *, read_only: bool = True) -> Store:
        """Open an existing store, checking that it is an xstack store of a schema version this code reads."""
        p = Path(path)
        if not p.exists():
            partial = p.with_name(p.name + PARTIAL_SUFFIX)
            if partial.exists():  # what a run that never finished left: not a store anyone may read as one
                from xstack import salvage  # which imports this module

                if salvage.left(p):
                    raise StoreError(f"{p}: no such store: {partial.name} beside it is what a profile left whose "
                                     f"process was killed; `xstack recover {p}` keeps what it recorded")  # fmt: skip
                raise StoreError(f"{p}: no such store: {partial.name} beside it is what a run or import left that "
                                 "did not finish (killed, or its machine stopped); run it again")  # fmt: skip
            raise StoreError(f"{p}: no such store (import a trace or run a profile to make one)")
        if p.is_dir():
            raise StoreError(f"{p}: is a directory, not a trace store")
        _utf8_name(p)
        try:
            con = _connect(p, read_only=read_only)
        except duckdb.Error as exc:
            raise StoreError(_open_error(p, exc)) from exc
        store = cls(p, con, read_only)
        try:
            store._check_header()
        except StoreError:
            con.close()
            raise
        _configure(con, p, spill_beside=not read_only)
        return store

    @classmethod
    @contextmanager
    def create(cls, path: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Store]:
        """Create a new store at ``path``: written as ``path.partial``, renamed into place on success.

        On an exception the partial file is removed and the exception propagates; an existing store at
        ``path`` is replaced only with ``overwrite`` and only once the new one is complete.
        """
        final = Path(path)
        _utf8_name(final)
        check_new(final, overwrite=overwrite)
        # absolute: the program a profile runs may change its working folder before the store is renamed
        partial = final.absolute().with_name(final.name + PARTIAL_SUFFIX)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            _remove_db(partial)
            con = _connect(partial)
        except (OSError, duckdb.Error) as exc:
            reason = os_reason(final, exc) if isinstance(exc, OSError) else _first_line(exc)
            raise StoreError(f"{final}: cannot write the store here ({reason})") from exc
        store = cls(partial, con, read_only=False)
        try:
            _configure(con, partial)
            con.execute(TABLES)
            con.execute(VIEWS)
            con.executemany(
                "INSERT INTO _meta VALUES (?, ?)",
                [("format", FORMAT_NAME), ("schema_version", str(SCHEMA_VERSION)), ("complete", "false")],
            )
            yield store
        except BaseException:
            con.close()
            _remove_db(partial)
            raise
        store._complete(final.absolute())

    @classmethod
    @contextmanager
    def reopen_partial(cls, path: str | os.PathLike[str]) -> Iterator[Store]:
        """Open the ``path.partial`` that a process killed while writing the store left behind, to complete it:
        renamed into place as ``create`` does once the block ends, removed if it raises (or cannot be read)."""
        final = Path(path).absolute()
        partial = final.with_name(final.name + PARTIAL_SUFFIX)
        if not partial.exists():
            raise StoreError(f"{path}: nothing to complete: no {partial.name} beside it")
        try:
            con = _connect(partial)  # replays its write-ahead log: what was committed is there
        except duckdb.Error as exc:
            _remove_db(partial)
            raise StoreError(f"{partial}: left unreadable ({_first_line(exc)}): removed") from exc
        store = cls(partial, con, read_only=False)
        try:
            store._check_header(complete=False)
            _configure(con, partial)
            yield store
        except BaseException:
            con.close()
            _remove_db(partial)
            raise
        store._complete(final)

    def _complete(self, final: Path) -> None:
        """Mark the ``.partial`` store open for writing complete, close it and rename it to ``final``."""
        try:
            self.con.execute("UPDATE _meta SET value = 'true' WHERE key = 'complete'")
            self.con.execute("CHECKPOINT")
        except BaseException:
            self.close()
            _remove_db(self.path)
            raise
        self.close()
        _remove_db(final, keep_main=True)
        os.replace(self.path, final)
        self.path = final

    def _check_header(self, *, complete: bool = True) -> None:
        rows = _meta(self.con)
        if rows is None:
            raise StoreError(f"{self.path}: a DuckDB database, but not an xstack trace store")
        version = int(rows.get("schema_version", "0"))
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: written by a newer xstack (store schema {version}, this xstack reads up to "
                f"{SCHEMA_VERSION}): upgrade xstack to read it"
            )
        if version < SCHEMA_VERSION and any(v not in MIGRATIONS for v in range(version, SCHEMA_VERSION)):
            raise StoreError(
                f"{self.path}: store schema {version} is older than this xstack's {SCHEMA_VERSION} and cannot be "
                "migrated: re-import or re-profile to make a new store"
            )
        if complete and rows.get("complete") != "true":
            raise StoreError(f"{self.path}: incomplete store (the run that wrote it did not finish)")

    # -- writing ------------------------------------------------------------------------------------------
    def next_run_id(self) -> int:
        """The run id the next run added to this store will get."""
        row = self.con.execute("SELECT coalesce(max(run_id), 0) + 1 FROM _runs").fetchone()
        return int(row[0]) if row else 1

    def add_run(self, run: RunInfo) -> None:
        """Insert one run row."""
        self.con.execute(
            "INSERT INTO _runs VALUES (?, ?, make_timestamp_ns(?::BIGINT)::TIMESTAMP, ?, ?, ?, ?, ?, ?, ?)",
            [
                run.run_id,
                path_text(run.name),
                run.started_at_ns,
                None if run.command is None else path_text(run.command),
                run.host,
                run.framework,
                run.device,
                run.levels,
                run.pass_name,
                json_dumps(run.config).decode(),
            ],
        )

    def set_run_config(self, run_id: int, key: str, value: Any) -> None:
        """Set one top-level key of a run's ``config`` (device peaks recorded after the run, say)."""
        if self.read_only:
            raise StoreError(f"{self.path}: opened read-only; cannot change run {run_id}")
        row = self.con.execute("SELECT config FROM _runs WHERE run_id = ?", [run_id]).fetchone()
        if row is None:
            raise StoreError(f"{self.path}: no run {run_id}")
        config = orjson.loads(row[0]) if row[0] else {}
        config[key] = value
        self.con.execute("UPDATE _runs SET config = ? WHERE run_id = ?", [json_dumps(config).decode(), run_id])

    def add_health(self, run_id: int, rows: Sequence[tuple[str, int, str]]) -> None:
        """Insert health rows ``(check, count, detail)`` for one run; rows with a zero count are kept out."""
        kept = [(run_id, check, count, detail) for check, count, detail in rows if count]
        if kept:
            self.con.executemany("INSERT INTO _health VALUES (?, ?, ?, ?)", kept)

    def append_runs_from(self, other: Path) -> list[int]:
        """Copy every run of the complete store ``other`` into this one, renumbered after this store's runs,
        in one transaction: all of them or, on any error, none. Returns the new run ids."""
        con = self.con
        offset = self.next_run_id() - 1
        con.execute("ATTACH ? AS src (READ_ONLY)", [str(other)])
        try:
            con.execute("BEGIN TRANSACTION")
            try:
                for table in ("_runs", "_spans", "_counters", "_health", "_io_files"):
                    con.execute(f"INSERT INTO {table} SELECT * REPLACE (run_id + {offset} AS run_id) FROM src.{table}")
                ids = [int(r[0]) + offset for r in con.execute("SELECT run_id FROM src._runs ORDER BY 1").fetchall()]
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")
        finally:
            con.execute("DETACH src")
        return ids

    @contextmanager
    def memory_for(self, data_bytes: int) -> Iterator[None]:
        """Within: DuckDB's memory limit at least ``data_bytes / DATA_PER_MEMORY_BYTE``; restored after."""
        con = self.con
        current = con.execute("SELECT current_setting('memory_limit')").fetchone()
        limit = _parse_bytes(str(current[0])) if current else None
        wanted = data_bytes // DATA_PER_MEMORY_BYTE
        if limit is None or wanted <= limit:
            yield
            return
        operator = con.execute("SELECT value FROM duckdb_settings() WHERE name = 'operator_memory_limit'").fetchone()
        _set_memory_limit(con, wanted)
        try:
            yield
        finally:
            con.execute(f"SET memory_limit = '{limit}B'")
            if operator and operator[0] is not None:
                con.execute(f"SET operator_memory_limit = '{operator[0]}'")
            elif operator:
                con.execute("RESET operator_memory_limit")

    def ensure_memory_limit(self, limit_bytes: int) -> None:
        """Raise DuckDB's memory limit to at least ``limit_bytes`` for the rest of this connection (analyses whose
        recursive queries cannot spill need room proportional to the run, not the import's small buffer)."""
        current = self.con.execute("SELECT current_setting('memory_limit')").fetchone()
        limit = _parse_bytes(str(current[0])) if current else None
        if limit is None or limit < limit_bytes:
            _set_memory_limit(self.con, limit_bytes)

    # -- reading ------------------------------------------------------------------------------------------
    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a query over the public views and return all rows."""
        return self.con.execute(sql, params or []).fetchall()

    def run_ids(self) -> list[int]:
        """The ids of the runs in this store, in order."""
        return [int(r[0]) for r in self.query("SELECT run_id FROM runs ORDER BY run_id")]

    def close(self) -> None:
        """Close the connection, and let go of it; the store stays on disk. Closing twice does nothing."""
        con, self._con = self._con, None
        if con is not None:
            con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_new(path: str | os.PathLike[str], *, overwrite: bool = False, can_append: bool = False) -> None:
    """Raise ``StoreError`` unless a new store can be created at ``path``: not a directory, and not an existing
    file unless ``overwrite`` (and then only an xstack store). Commands that run for a while (a profiled program)
    call it before they start, so that a refusal comes first, not after the work. ``can_append``: the command
    has ``--append``, which the refusal then suggests too."""
    final = Path(path)
    if final.is_dir():
        raise StoreError(f"{final}: is a directory, not a store path (give a file name: -o DIR/name.duckdb)")
    if final.exists() and not overwrite:
        append = ", --append to add to it" if can_append else ""
        raise StoreError(f"{final}: already exists (pass --force to replace it{append}, or choose another -o path)")
    if final.exists():
        _check_replaceable(final)


_SCRATCH_SUFFIX = ".append"


def scratch_path(path: str | os.PathLike[str]) -> Path:
    """Where runs to be appended to the store ``path`` are written first (beside it): they are copied into it
    in one transaction once complete, so that the store gets all of them or none."""
    final = Path(path)
    return final.with_name(final.name + _SCRATCH_SUFFIX)


def final_path(path: str | os.PathLike[str]) -> Path:
    """The store that ``path`` is written for: the store a scratch store (``scratch_path``) is appended to, else
    ``path`` itself."""
    p = Path(path)
    return p.with_name(p.name.removesuffix(_SCRATCH_SUFFIX))


def append_store(path: str | os.PathLike[str], scratch: str | os.PathLike[str]) -> list[int]:
    """Copy every run of the complete store ``scratch`` into the store at ``path`` in one transaction, then
    remove ``scratch``; returns the runs' ids in ``path``."""
    with Store.open(path, read_only=False) as store:
        ids = store.append_runs_from(Path(scratch))
    _remove_db(Path(scratch))
    return ids


def _utf8_name(path: Path) -> None:
    """Raises ``StoreError`` where ``path`` is not UTF-8 (Latin-1's ``é``, say): DuckDB opens no such file."""
    if not is_utf8(path):
        raise StoreError(f"{path_text(str(path))}: a store's path must be UTF-8 (DuckDB opens no other): choose "
                         "another name or folder")  # fmt: skip


def _connect(path: Path, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """A connection to the DuckDB file at ``path`` that draws no progress bar: DuckDB draws one on the process's
    standard output once a query runs 2 s, a file or a pipe as well as a terminal, and it corrupted the output of
    `xstack summary > out.txt` and the JSON of `xstack report --format json -o -` on a large profile."""
    con = duckdb.connect(str(path), read_only=read_only)
    try:
        con.execute("SET enable_progress_bar = false")
    except BaseException:
        con.close()
        raise
    return con


def _configure(con: duckdb.DuckDBPyConnection, path: Path, *, spill_beside: bool = True) -> None:
    # Spill next to a store being written (stores can be larger than /tmp); a reader may not own that
    # directory, so it spills to the system temp dir.
    spill = path.with_name(path.name + ".tmp") if spill_beside else Path(tempfile.gettempdir()) / "xstack-spill"
    con.execute(f"SET temp_directory = '{spill}'")
    con.execute("SET preserve_insertion_order = false")
    limit = _parse_bytes(DEFAULT_MEMORY_LIMIT)
    if limit:
        _set_memory_limit(con, limit)
    else:  # a size DuckDB reads and this module does not, such as a percentage
        con.execute(f"SET memory_limit = '{DEFAULT_MEMORY_LIMIT}'")


def _set_memory_limit(con: duckdb.DuckDBPyConnection, limit: int) -> None:
    con.execute(f"SET memory_limit = '{limit}B'")
    has_operator_limit = con.execute(
        "SELECT count(*) FROM duckdb_settings() WHERE name = 'operator_memory_limit'"
    ).fetchone()
    if has_operator_limit and has_operator_limit[0]:  # not in older DuckDB versions
        con.execute(f"SET operator_memory_limit = '{int(limit * OPERATOR_MEMORY_SHARE)}B'")


def _parse_bytes(text: str) -> int | None:
    """Bytes in a DuckDB size such as ``128MB`` or ``1.5 GiB`` (KB = 1000, KiB = 1024); None if not a size."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(I?)B?\s*", text.upper())
    if not match:
        return None
    number, prefix, binary = match.groups()
    base = 1024 if binary else 1000
    return int(float(number) * base ** " KMGT".index(prefix or " "))


def _meta(con: duckdb.DuckDBPyConnection) -> dict[str, str] | None:
    """The ``_meta`` keys of an xstack store, or None when the database is not one."""
    try:
        rows = dict(con.execute("SELECT key, value FROM _meta").fetchall())
    except duckdb.Error:
        return None
    return rows if rows.get("format") == FORMAT_NAME else None


def _check_replaceable(path: Path) -> None:
    """Raise ``StoreError`` unless ``path`` is an xstack store (or a store another process holds open): an
    existing file is replaced only when it is one, so that ``--force`` never overwrites a trace, a script or
    any other file given as the output by mistake."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(12)
    except OSError as exc:
        raise StoreError(f"{path}: cannot read it to check that it is a store ({exc.strerror})") from exc
    if head[8:12] != b"DUCK":
        raise StoreError(f"{path}: exists and is not an xstack store: not replacing it (remove it, or choose "
                         "another -o path)")  # fmt: skip
    try:
        con = _connect(path, read_only=True)
    except duckdb.Error:
        return  # held open (locked) by another process: a DuckDB file, most likely a store being read
    try:
        rows = _meta(con)
    finally:
        con.close()
    if rows is None:
        raise StoreError(f"{path}: a DuckDB database but not an xstack store: not replacing it (remove it, or "
                         "choose another -o path)")  # fmt: skip


def _remove_db(path: Path, *, keep_main: bool = False) -> None:
    for p in (path.with_name(path.name + ".wal"),) if keep_main else (path, path.with_name(path.name + ".wal")):
        if p.exists():
            p.unlink()
    spill = path.with_name(path.name + ".tmp")
    if spill.is_dir():
        shutil.rmtree(spill, ignore_errors=True)


DUCKDB_MAGIC = b"DUCK"
"""The bytes a DuckDB database file holds at offset 8 (its main header)."""


def _open_error(p: Path, exc: duckdb.Error) -> str:
    """Why DuckDB could not open ``p``: not a DuckDB file at all (its own error would then speak of catalogs or
    in-memory databases), held by another process, or DuckDB's reason."""
    try:
        with p.open("rb") as f:
            magic = f.read(12)[8:12]
    except OSError as e:
        return f"{p}: cannot read it ({e.strerror or e})"
    if magic != DUCKDB_MAGIC:
        return f"{p}: not a DuckDB database (no DuckDB header), so not an xstack store"
    reason = _first_line(exc)
    if "lock" in reason.lower():
        return (f"{p}: in use by another process that has it open for writing (a profile or import still running?); "
                f"wait for it to end ({reason})")  # fmt: skip
    return f"{p}: a DuckDB database this DuckDB cannot open ({reason})"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
