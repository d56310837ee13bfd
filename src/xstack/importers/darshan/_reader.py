"""Read a Darshan log with PyDarshan into plain Python values, or fail with a message that names the file.

The log is read in a child process. PyDarshan's C reader reports most problems only by printing ``Error: ...``
to standard error and returning no more records (a log cut short reads as one whose last modules are empty),
and on a log cut inside its job region it crashes the process (SIGSEGV, SIGABRT). In a child, a crash is an
exit status and the error lines are its captured standard error, so both fail the import cleanly.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from xstack.errors import BadInputError, UsageError
from xstack.trace.io_paths import is_utf8

IMPORTED: Final = ("POSIX", "STDIO")
"""Modules whose records become ``io_files`` rows."""
DXT: Final = "DXT_POSIX"
"""The DXT module whose segments become ``io`` spans (PyDarshan reads no DXT module for STDIO)."""
INSTALL_HINT: Final = "pip install darshan (or pip install 'xstack[darshan]')"
_READ_FAILED: Final = 3  # the child's exit status when PyDarshan raised
_LOAD_FAILED: Final = 4  # the child's exit status when PyDarshan did not import (a wheel without its C library)
_CHILD: Final = (
    "import sys; from xstack.importers.darshan._reader import _child_main; sys.exit(_child_main(*sys.argv[1:]))"
)


@dataclass
class Record:
    """One record of a counter module: a file as one rank (or, for ``rank`` -1, all ranks) saw it."""

    record_id: int
    rank: int
    counters: dict[str, int]
    fcounters: dict[str, float]


@dataclass
class Segment:
    """One DXT-traced read or write: offset and length in bytes, start and end in seconds from the job start."""

    offset: int
    length: int
    start_s: float
    end_s: float


@dataclass
class DxtRecord:
    """The DXT trace of one file on one rank."""

    record_id: int
    rank: int
    hostname: str
    reads: list[Segment]
    writes: list[Segment]


@dataclass
class DarshanLog:
    """Everything the importer uses from one log, read and checked."""

    path: Path
    job: dict[str, Any]
    exe: str
    mounts: list[tuple[str, str]]
    modules: dict[str, dict[str, Any]]
    names: dict[int, str]
    records: dict[str, list[Record]] = field(default_factory=dict)
    dxt: list[DxtRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    pydarshan_version: str = ""


def read_log(path: Path) -> DarshanLog:
    """Read the Darshan log at ``path``; raises ``BadInputError`` if it is missing, not a Darshan log, or
    truncated or damaged, and ``UsageError`` if PyDarshan is not installed."""
    if not path.is_file():
        raise BadInputError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    if importlib.util.find_spec("darshan") is None:
        raise UsageError(f"{path}: reading Darshan logs needs PyDarshan: {INSTALL_HINT}")
    with tempfile.TemporaryDirectory(prefix="xstack-darshan-") as tmp:
        out = Path(tmp) / "log.json"
        log_path = path
        if not is_utf8(path):  # PyDarshan opens only a UTF-8 name (Latin-1's é, say): one that is, a link to it
            log_path = Path(tmp) / "log.darshan"
            log_path.symlink_to(path.absolute())
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(log_path), str(out)],
            capture_output=True,
            text=True,
            errors="replace",
            env=_child_env(),
        )
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        errors = list(dict.fromkeys(_message(line) for line in lines if line.lower().startswith("error")))
        if proc.returncode == _LOAD_FAILED:
            raise UsageError(
                f"{path}: PyDarshan is installed but does not load ({proc.stdout.strip()}); reinstall it in a "
                "Python version its wheels support: pip install --force-reinstall darshan"
            )
        if proc.returncode != 0:
            last = lines[-1] if lines else ""  # an uncaught exception's traceback ends with it
            raise BadInputError(f"{path}: {_failure(proc.returncode, proc.stdout.strip() or last, errors)}")
        if errors:
            raise BadInputError(f"{path}: truncated or damaged Darshan log ({'; '.join(errors[:2])})")
        log = _from_json(path, orjson.loads(out.read_bytes()))
    log.warnings = [line for line in lines if not line.lower().startswith("error")]
    return log


def _child_env() -> dict[str, str]:
    """The environment of the reading child: this process's, with this xstack first on the module path."""
    root = str(Path(__file__).resolve().parents[3])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _failure(status: int, raised: str, errors: list[str]) -> str:
    """Why the reading child failed, from its exit status, what PyDarshan raised and the reader's errors."""
    detail = errors[0] if errors else raised or "no message"
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"truncated or damaged Darshan log: PyDarshan's reader crashed ({name}; {detail})"
    if status == _READ_FAILED:
        return f"not a Darshan log, or an unreadable one ({detail})"
    return f"PyDarshan failed to read it (exit status {status}; {raised or detail})"


def _message(line: str) -> str:
    """A reader's error line without its ``Error:`` prefix and final period."""
    return line.split(":", 1)[1].strip().rstrip(".") if ":" in line else line


def _from_json(path: Path, data: dict[str, Any]) -> DarshanLog:
    log = DarshanLog(
        path=path,
        job=data["job"],
        exe=data["exe"],
        mounts=[(m, t) for m, t in data["mounts"]],
        modules=data["modules"],
        names={int(k): v for k, v in data["names"]},
        pydarshan_version=data["version"],
    )
    for module, part in data["records"].items():
        cn, fn = part["counters"], part["fcounters"]
        log.records[module] = [
            Record(rid, rank, dict(zip(cn, c, strict=True)), dict(zip(fn, f, strict=True)))
            for rid, rank, c, f in part["rows"]
        ]
    for rid, rank, host, reads, writes in data["dxt"]:
        log.dxt.append(DxtRecord(rid, rank, host, [Segment(*s) for s in reads], [Segment(*s) for s in writes]))
    return log


# -- the child --------------------------------------------------------------------------------------------
def _extract(report: Any) -> dict[str, Any]:
    """A report's content as JSON-ready values (record ids are unsigned 64-bit: kept as integers)."""
    records = {}
    for module in IMPORTED:
        if module in report.records:
            records[module] = {
                "counters": list(report.counters[module]["counters"]),
                "fcounters": list(report.counters[module]["fcounters"]),
                "rows": [[int(r["id"]), int(r["rank"]), r["counters"], r["fcounters"]] for r in report.records[module]],
            }
    dxt = [
        [
            int(r["id"]),
            int(r["rank"]),
            str(r["hostname"]),
            _segments(r["read_segments"]),
            _segments(r["write_segments"]),
        ]
        for r in report.records.get(DXT, [])
    ]
    return {
        "job": dict(report.metadata.get("job", {})),
        "exe": str(report.metadata.get("exe", "")).strip(),
        "mounts": [[str(m), str(t)] for m, t in getattr(report, "mounts", [])],
        "modules": {name: dict(info) for name, info in report.modules.items()},
        "names": [[int(k), str(v)] for k, v in report.name_records.items()],
        "records": records,
        "dxt": dxt,
    }


def _segments(raw: Any) -> list[list[Any]]:
    return [[int(s["offset"]), int(s["length"]), float(s["start_time"]), float(s["end_time"])] for s in raw]


def _child_main(log_path: str, out_path: str) -> int:
    try:
        import darshan
    except Exception as exc:  # PyDarshan raises RuntimeError on import where its libdarshan-util is missing
        print(f"{type(exc).__name__}: {exc}", flush=True)
        return _LOAD_FAILED
    try:
        with darshan.DarshanReport(log_path, read_all=True) as report:
            data = _extract(report)
    except Exception as exc:  # PyDarshan raises bare RuntimeError/ValueError/KeyError on bad logs
        print(f"{type(exc).__name__}: {exc}", flush=True)
        return _READ_FAILED
    data["version"] = str(getattr(darshan, "__version__", ""))
    Path(out_path).write_bytes(orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY))
    return 0
