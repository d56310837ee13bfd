"""The calibration file: measured peaks per host and device, in JSON, shared by every process of the host.

``{"format": "xstack-calibration", "version": 1, "entries": {"<host>|<device key>": entry}}``. The same format is
what ``xstack calibrate -o FILE.json`` writes and ``--apply`` reads. Saving takes an exclusive lock on a sibling
``.lock`` file (so that two calibrations saving at once both keep their entries), writes a temporary file beside
the cache and renames it over the old one: a reader sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from xstack.errors import BadInputError

FORMAT = "xstack-calibration"
VERSION = 1

_memo: dict[str, tuple[tuple[int, int], dict[str, dict[str, Any]]]] = {}


def cache_path() -> Path:
    """``$XSTACK_CALIBRATION`` if set, else ``$XDG_CACHE_HOME/xstack/calibration.json`` (default ``~/.cache``)."""
    if explicit := os.environ.get("XSTACK_CALIBRATION"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "xstack" / "calibration.json"


def entry_key(entry: dict[str, Any]) -> str:
    """The key of an entry in the file: its host and device key."""
    return f"{entry.get('host')}|{entry.get('key')}"


def read_entries(path: Path) -> dict[str, dict[str, Any]]:
    """The entries of a calibration file; ``BadInputError`` naming the file when it is unreadable or not one."""
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError as exc:
        raise BadInputError(f"{path}: no such calibration file") from exc
    except OSError as exc:
        raise BadInputError(f"{path}: cannot read the calibration file ({exc.strerror or exc})") from exc
    except orjson.JSONDecodeError as exc:
        raise BadInputError(f"{path}: not valid JSON ({exc}): not an xstack calibration file") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        raise BadInputError(f"{path}: not an xstack calibration file (written by xstack calibrate -o FILE.json)")
    if int(data.get("version") or 0) > VERSION:
        raise BadInputError(f"{path}: written by a newer xstack (calibration format {data.get('version')})")
    entries = {
        str(k): v for k, v in data["entries"].items() if isinstance(v, dict) and isinstance(v.get("peaks"), dict)
    }
    if len(entries) != len(data["entries"]):
        raise BadInputError(f"{path}: an entry has no 'peaks': not an xstack calibration file")
    return entries


def cached_entries(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The cache's entries, re-read only when the file changed; empty when it is absent or unreadable (asked at
    every recorded run, which must not fail on a damaged cache)."""
    path = path or cache_path()
    try:
        st = path.stat()
    except OSError:
        return {}
    stamp = (st.st_mtime_ns, st.st_size)
    memo = _memo.get(str(path))
    if memo is not None and memo[0] == stamp:
        return memo[1]
    try:
        entries = read_entries(path)
    except BadInputError:
        entries = {}
    _memo[str(path)] = (stamp, entries)
    return entries


def save_entries(entries: list[dict[str, Any]], path: Path | None = None) -> Path:
    """Add or replace ``entries`` in the cache (or the file at ``path``), atomically and under a lock."""
    path = path or cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        current = read_entries(path) if path.exists() else {}
        current.update({entry_key(e): e for e in entries})
        write_entries(current, path)
    return path


def write_entries(entries: dict[str, dict[str, Any]], path: Path) -> None:
    """Write a calibration file: to a temporary file beside it, then renamed into place (a device or named pipe
    is written in place)."""
    data = orjson.dumps({"format": FORMAT, "version": VERSION, "entries": entries}, option=orjson.OPT_INDENT_2)
    if path.exists() and not path.is_file():  # /dev/null, a named pipe: a rename would replace it with a file
        path.write_bytes(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: the rename still keeps the file whole; concurrent saves may lose one entry
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
