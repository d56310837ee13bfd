"""Writing an output file (a report, a timeline) the safe way: into ``NAME.partial`` beside it, renamed into place
only once complete, so that a failure never leaves a file that looks finished. A path that cannot be written
(a directory, a read-only file system, no permission) is a one-line ``XstackError`` naming it."""

from __future__ import annotations

import contextlib
import gzip
import os
from collections.abc import Iterator
from pathlib import Path

from xstack.errors import XstackError

PARTIAL_SUFFIX = ".partial"


def os_reason(path: Path, exc: OSError) -> str:
    """Why writing ``path`` failed, in words: the system's reason, and the file it concerns when that is not
    ``path`` itself (or its ``.partial``), such as a parent folder."""
    where = Path(exc.filename) if exc.filename else path
    if where.name.endswith(PARTIAL_SUFFIX) and where.with_name(where.name[: -len(PARTIAL_SUFFIX)]) == path:
        where = path  # the user named the output, not its .partial
    if isinstance(exc, FileExistsError) and where != path and where.exists() and not where.is_dir():
        return f"{where} is a file, not a folder"
    reason = exc.strerror or str(exc)
    return reason if where == path else f"{reason}: {where}"


def cannot_write(path: Path, exc: OSError) -> XstackError:
    """The error for an ``OSError`` met while writing ``path``."""
    return XstackError(f"{path}: cannot write it ({os_reason(path, exc)})")


def check_output(path: Path) -> None:
    """Raise ``XstackError`` when ``path`` names a directory (before any work is done for it)."""
    if path.is_dir():
        raise XstackError(f"{path}: is a directory; give a file name (-o DIR/name)")


@contextlib.contextmanager
def partial_file(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield the ``.partial`` path to write ``path``'s contents into; on success it is renamed to ``path``, on
    any failure removed. ``OSError`` becomes an ``XstackError`` naming ``path``. A ``path`` that exists and is not a
    regular file (``/dev/null``, ``/dev/stdout``, a named pipe) is yielded itself: renaming a file onto it would
    replace the device or pipe with that file (root may)."""
    out = Path(path)
    check_output(out)
    if out.exists() and not out.is_file():  # /dev/null, /dev/stdout, a FIFO: written in place, never replaced
        try:
            yield out
        except OSError as exc:
            raise cannot_write(out, exc) from exc
        return
    partial = out.with_name(out.name + PARTIAL_SUFFIX)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        yield partial
        os.replace(partial, out)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise cannot_write(out, exc) from exc
        raise


@contextlib.contextmanager
def gzip_writer(path: Path, name: str, *, level: int = 1) -> Iterator[gzip.GzipFile]:
    """``path`` opened for writing gzip at ``level``, its header naming ``name`` (less a ``.gz``) and holding no
    time: ``gzip.open`` stamps the current time and the path it writes (a ``.partial``, a temporary file), so
    the same trace compressed twice gave different bytes."""
    with open(path, "wb") as raw, gzip.GzipFile(name, "wb", level, raw, mtime=0) as fh:
        yield fh
