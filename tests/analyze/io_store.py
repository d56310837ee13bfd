"""Built stores with I/O, numbers chosen so that every I/O analysis can be checked by hand.

``loop_store``: a training loop of three 1 us steps in process 100 (DataLoader waits of 300, 100 and 500 ns)
with ``io`` spans of the main process (inside and outside the waits, and a pipe read that must be left out)
and of two workers, 201 and 202 (one read straddles the step boundary). ``FILES`` are ``io_files`` rows of
every path class (data, python, system, stream), with Darshan counters; ``files_store`` writes any such rows
alone, as an imported Darshan log without DXT would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from xstack.trace import attrs as A
from xstack.trace.sink import Sink
from xstack.trace.store import RunInfo, Store

MAIN, W1, W2 = 100, 201, 202
WAITS = (300, 100, 500)
"""DataLoader wait of each 1000 ns step."""

FileRow = tuple[int, str, str, int, int, int, int, int, int, int, int, int, dict[str, Any]]
"""(pid, path, module, opens, reads, writes, seeks, bytes_read, bytes_written, read, write, meta time, attrs)."""


def _a(cls: str, **kw: Any) -> dict[str, Any]:
    return {A.IO_FILE_PATH_CLASS: cls, A.IO_FILE_MAX_BYTE_READ: -1, A.IO_FILE_MAX_BYTE_WRITTEN: -1, **kw}


PY = _a("python", zero_reads=1, size_read_hist={"0_100": 1, "10K_100K": 1}, max_byte_read=39_999)
FILES: list[FileRow] = [
    (MAIN, "/d/a.bin", "POSIX", 2, 10, 0, 1, 5_242_880, 0, 1000, 0, 100,
     _a("data", seq_reads=8, consec_reads=6, zero_reads=2, stats=1, max_byte_read=5_242_879,
        size_read_hist={"0_100": 2, "100K_1M": 7, "1M_4M": 1})),
    (W1, "/d/s1.jpg", "POSIX", 1, 3, 0, 0, 1000, 0, 300, 0, 50,
     _a("data", seq_reads=1, consec_reads=1, zero_reads=1, max_byte_read=999,
        size_read_hist={"0_100": 1, "100_1K": 2})),
    (W2, "/d/s2.jpg", "POSIX", 1, 2, 0, 0, 3000, 0, 200, 0, 40,
     _a("data", zero_reads=1, max_byte_read=2999, size_read_hist={"0_100": 1, "1K_10K": 1})),
    (W1, "/usr/lib/python3.11/os.py", "POSIX", 1, 2, 0, 0, 40_000, 0, 50, 0, 10, PY),
    (W2, "/usr/lib/python3.11/os.py", "POSIX", 1, 2, 0, 0, 40_000, 0, 60, 0, 10, PY),
    (MAIN, "/etc/hosts", "STDIO", 1, 1, 0, 0, 200, 0, 5, 0, 5, _a("system", max_byte_read=199,
                                                                   size_read_hist={"100_1K": 1})),
    (MAIN, "<pipe>", "POSIX", 0, 5, 5, 0, 500, 500, 1_000_000, 10, 0, _a("stream")),
    (MAIN, "/out/ckpt.pt", "POSIX", 1, 0, 4, 0, 0, 8_388_608, 0, 2000, 20,
     _a("data", seq_writes=3, max_byte_written=8_388_607, size_write_hist={"1M_4M": 4})),
    (W1, "/d/listing.txt", "POSIX", 1, 0, 0, 0, 0, 0, 0, 0, 30, _a("data", stats=2)),
]  # fmt: skip


def add_files(store: Store, rows: list[FileRow], run_id: int = 1) -> None:
    """Insert ``io_files`` rows."""
    store.con.executemany(
        "INSERT INTO _io_files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(run_id, *r[:-1], orjson.dumps(r[-1]).decode()) for r in rows],
    )


def io_span(sink: Sink, span_id: int, parent: int | None, op: str, start: int, dur: int, pid: int, path: str,
            nbytes: int | None = None, *, cls: str = "data", offset: int | None = None, tid: int | None = None,
            **extra: Any) -> None:  # fmt: skip
    """One ``io`` span with the io level's attributes."""
    attrs: dict[str, Any] = {A.IO_PATH: path, A.IO_MODULE: "POSIX", A.IO_PATH_CLASS: cls, **extra}
    if nbytes is not None:
        attrs[A.IO_BYTES] = nbytes
    if offset is not None:
        attrs[A.IO_OFFSET] = offset
    sink.span(span_id, parent, "io", op, start, dur, pid, tid or pid, attrs)


def loop_store(path: Path, *, steps: bool = True, files: bool = True, config: dict[str, Any] | None = None,
               waits: tuple[int, ...] = WAITS, more_files: list[FileRow] | None = None,
               dataloader: bool = True, more_io: list[tuple[Any, ...]] | None = None) -> Store:  # fmt: skip
    """The training loop described in the module docstring (``steps=False``: DataLoader waits and a forward
    span, no step spans; ``dataloader=False``: steps with no DataLoader spans, a loop that loads its data
    itself), with ``FILES`` (and ``more_files``) as its ``io_files`` rows; ``more_io``: more io spans, each
    ``io_span``'s arguments from ``span_id`` to ``path`` and a dict of its keyword arguments."""
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "loop", levels=["model", "io"], config={"pid": MAIN} if config is None else config))
        sink = Sink(store, 1)
        for k, wait in enumerate(waits):
            if steps:
                sink.span(1 + k, None, "model", f"step#{k}", 1000 * k, 1000, MAIN, 1,
                          {A.MODEL_KIND: "step", A.MODEL_STEP: k})  # fmt: skip
            if dataloader:
                sink.span(10 + k, 1 + k if steps else None, "model", "dataloader.next", 1000 * k, wait, MAIN, 1,
                          {A.MODEL_KIND: "dataloader"})  # fmt: skip
        if not steps:
            sink.span(20, None, "model", "Net", 2600, 300, MAIN, 1, {A.MODEL_KIND: "forward"})
        io_span(sink, 100, 10, "read", 100, 50, MAIN, "/d/a.bin", 4096, offset=0, tid=1)
        io_span(sink, 101, 1, "open", 500, 20, MAIN, "/d/a.bin", tid=1)
        io_span(sink, 102, 10, "read", 200, 90, MAIN, "<pipe>", 100, cls="stream", tid=1)
        io_span(sink, 103, 11, "read", 1050, 100, MAIN, "/d/a.bin", 4096, offset=4096, tid=1)
        io_span(sink, 104, None, "read", 10, 100, W1, "/d/s1.jpg", 999, offset=0)
        io_span(sink, 105, None, "read", 1200, 100, W1, "/d/s1.jpg", 0, offset=999)
        io_span(sink, 106, None, "read", 2100, 300, W2, "/d/s2.jpg", 3000, offset=0)
        io_span(sink, 107, None, "read", 950, 100, W2, "/d/s2.jpg", 0, offset=3000)
        for *args, kw in more_io or []:
            io_span(sink, *args, **kw)
        sink.close()
        if files:
            add_files(store, FILES + (more_files or []))
    return Store.open(path)


def files_store(path: Path, rows: list[FileRow], *, config: dict[str, Any] | None = None) -> Store:
    """A run with ``io_files`` rows only (an imported Darshan log without DXT: no spans at all)."""
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "darshan-like", levels=["io"], config=config or {}))
        add_files(store, rows)
    return Store.open(path)


def data_file(pid: int, path: str, size: int, reads: int, *, opens: int = 1, read_ns: int = 100,
              **attrs: Any) -> FileRow:  # fmt: skip
    """A data file read whole in ``reads`` calls (counters only)."""
    return (pid, path, "POSIX", opens, reads, 0, 0, size, 0, read_ns, 0, 10,
            _a("data", max_byte_read=size - 1, **attrs))  # fmt: skip
