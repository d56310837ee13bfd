"""Import files into a store as one all-or-nothing step."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from xstack.errors import BadInputError
from xstack.importers.kineto import ImportedRun, import_kineto
from xstack.trace.store import DUCKDB_MAGIC, Store, check_new, scratch_path


def import_file(store: Store, path: str | Path) -> ImportedRun:
    """Import one file as a run of ``store``, by its kind: an Nsight Compute CSV (``.csv``), a Darshan log
    (``.darshan``) or a Kineto trace."""
    _refuse_store(Path(path))
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        from xstack.importers.ncu import import_ncu

        return import_ncu(store, path)
    if suffix == ".darshan":
        from xstack.importers.darshan import import_darshan

        return import_darshan(store, path)
    return import_kineto(store, path)


def _refuse_store(path: Path) -> None:
    """Raise ``BadInputError`` where ``path`` is a DuckDB database (a store given where a trace belongs): read
    as a trace, it failed on its first bytes with a message that never said what the file was."""
    try:
        with path.open("rb") as fh:
            head = fh.read(12)
    except OSError:
        return  # missing, a directory, unreadable: the importer says which, naming the file
    if head[8:12] == DUCKDB_MAGIC:
        raise BadInputError(f"{path}: a DuckDB database (an xstack store?), not a file to import: read a store with "
                            f"xstack summary {path}")  # fmt: skip


def import_files(
    traces: Sequence[str | Path], out: str | Path, *, force: bool = False, append: bool = False
) -> list[ImportedRun]:
    """Import each trace as a run of the store ``out``; if any file fails, the store is left as it was.

    A new store is only renamed into place when every file imported. With ``append``, the files are imported
    into a scratch store beside ``out`` first and its runs then copied into ``out`` in one transaction.

    A file given twice, or (with ``append``) already imported into ``out``, is refused, unless ``force``: the
    same content (size and SHA-256, recorded in ``config.source``) would be two runs of one measurement.
    """
    prints = [Fingerprint.of(Path(t)) for t in traces]
    if not append:
        check_new(out, overwrite=force, can_append=True)
        if not force:
            _refuse_repeats(prints, {}, None, first_run=1)
        with Store.create(out, overwrite=force) as store:
            return [_import(store, t, fp) for t, fp in zip(traces, prints, strict=True)]
    target = Store.open(out, read_only=False)  # fails early, and clearly, on a missing or foreign store
    try:
        if not force:
            _refuse_repeats(prints, imported(target), str(out), first_run=target.next_run_id())
        scratch = scratch_path(out)
        with Store.create(scratch, overwrite=True) as store:
            runs = [_import(store, t, fp) for t, fp in zip(traces, prints, strict=True)]
        try:
            new_ids = target.append_runs_from(scratch)
        finally:
            scratch.unlink(missing_ok=True)
    finally:
        target.close()
    for run, run_id in zip(runs, new_ids, strict=True):
        run.run_id = run_id
    return runs


@dataclass(frozen=True)
class Fingerprint:
    """What tells one input file from another: its size and the SHA-256 of its bytes; and its name as given."""

    size_bytes: int
    sha256: str
    path: str

    @classmethod
    def of(cls, path: Path) -> Fingerprint | None:
        """The file's fingerprint; None when it cannot be read (its importer then says why, naming it)."""
        digest = hashlib.sha256()
        try:
            with path.open("rb") as fh:
                while chunk := fh.read(1 << 20):
                    digest.update(chunk)
            size = path.stat().st_size
        except OSError:
            return None
        return cls(size, digest.hexdigest(), str(path))

    @property
    def key(self) -> tuple[int, str]:
        return self.size_bytes, self.sha256


def imported(store: Store) -> dict[tuple[int, str], tuple[int, str]]:
    """The files the runs of ``store`` were imported from, by (size, SHA-256): (run id, path) of the first."""
    rows = store.query(
        "SELECT run_id, config->>'$.source.bytes', config->>'$.source.sha256', config->>'$.source.path' FROM runs "
        "WHERE config->>'$.source.sha256' IS NOT NULL ORDER BY run_id"
    )
    found: dict[tuple[int, str], tuple[int, str]] = {}
    for run_id, size, sha, path in rows:
        if str(size).isdigit():
            found.setdefault((int(size), str(sha)), (int(run_id), str(path)))
    return found


def _refuse_repeats(prints: Sequence[Fingerprint | None], before: dict[tuple[int, str], tuple[int, str]],
                    store: str | None, *, first_run: int) -> None:  # fmt: skip
    """Raise ``BadInputError`` for the first file whose content is already a run of ``store`` (``before``) or
    was given earlier on the command line; the runs of this import are numbered from ``first_run``."""
    given: dict[tuple[int, str], tuple[int, str]] = {}
    for k, fp in enumerate(prints):
        if fp is None:
            continue
        if fp.key in before:
            run_id, path = before[fp.key]
            origin = "" if path == fp.path else f", imported from {path}"
            raise BadInputError(f"{fp.path}: already imported as run {run_id} of {store} (same size and SHA-256"
                                f"{origin}): pass --force to import it again")  # fmt: skip
        if fp.key in given:
            run_id, path = given[fp.key]
            same = "given twice" if path == fp.path else f"the same file as {path} (same size and SHA-256)"
            raise BadInputError(f"{fp.path}: {same}, already run {run_id} of this import: pass --force to import "
                                "it twice")  # fmt: skip
        given[fp.key] = (first_run + k, fp.path)


def _import(store: Store, path: str | Path, fp: Fingerprint | None) -> ImportedRun:
    """Import one file and record its size and SHA-256 in its run's ``config.source``."""
    run = import_file(store, path)
    if fp is not None:
        row = store.query("SELECT config FROM runs WHERE run_id = ?", [run.run_id])[0][0]
        source = (orjson.loads(row) if row else {}).get("source") or {}
        store.set_run_config(run.run_id, "source", source | {"bytes": fp.size_bytes, "sha256": fp.sha256})
    return run
