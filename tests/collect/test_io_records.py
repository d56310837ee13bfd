"""The io record reader (collect/_io_records) against files written by hand from the format documented in
collect/_io/core.c: time bases, the shared stream's thread slots, failed and wide records, a cut file.
The library's own files are checked against real programs in test_io_native.py.
"""

from __future__ import annotations

import errno
import struct
from pathlib import Path

from xstack.collect._io_records import IoOp, read_trace

HEADER = struct.Struct("<8sIIqqqIIIIIIIIq")
SLOT = struct.Struct("<IIqIiihBB")
WIDE_VALUES = struct.Struct("<qqqii")
NAMES = b"read,close;unknown,file"  # codes 1 and 2; kinds 0 and 1
READ, CLOSE, FILE = 1, 2, 1
FAILED, WIDE, TIME, THREAD = 0x10, 0x20, 0x40, 0x80
PID = 4242


def slot(start: int = 0, dur: int = 0, offset: int = -1, path: int = 0, nbytes: int = -1, requested: int = -1,
         fd: int = -1, op: int = 0, flags: int = 0) -> bytes:  # fmt: skip
    return SLOT.pack(start, dur, offset, path, nbytes, requested, fd, op, flags)


def block(kind: int, count: int, payload: bytes) -> bytes:
    return struct.pack("<IIQ", kind, count, len(payload)) + payload


def ops(tid: int, *slots: bytes) -> bytes:
    return block(2, len(slots), struct.pack("<iI", tid, 0) + b"".join(slots))


def record_file(path: Path, *blocks: bytes) -> None:
    """A version 2 record file of process PID with the given blocks after its header."""
    tail = NAMES + bytes(-len(NAMES) % 8)
    header = HEADER.pack(b"XSTACKIO", 2, HEADER.size + len(tail), PID, 1, 100, 1, 0, 0, 32, 0, 0, len(NAMES), 0, 100)
    path.write_bytes(header + tail + b"".join(blocks))


def paths_block(*paths: tuple[int, bytes]) -> bytes:
    body = b"".join(struct.pack("<II", i, len(p)) + p + bytes(-(8 + len(p)) % 8) for i, p in paths)
    return block(1, len(paths), body)


def status_block(records: int) -> bytes:
    return block(3, 1, struct.pack("<IIqQQQQQQQ", 1, 3, 999, records, 100, 0, 0, 0, 0, 0) + bytes(24))


def test_streams_time_bases_failed_and_wide_records(tmp_path: Path) -> None:
    first = ops(
        7,
        slot(offset=1_000_000, flags=TIME),
        slot(start=5, dur=3, offset=0, path=1, nbytes=10, requested=10, fd=3, op=READ, flags=FILE),
        slot(start=9, dur=2, offset=10, path=1, nbytes=errno.EIO, requested=10, fd=3, op=READ, flags=FILE | FAILED),
        slot(start=20, offset=10, path=1, op=READ, flags=FILE | WIDE),
        WIDE_VALUES.pack(6 << 30, 8 << 30, 5_000_000_000, 70_000, 0),
    )
    later = ops(7, slot(start=50, dur=1, path=1, fd=3, op=CLOSE, flags=FILE))  # the base carries over
    shared = ops(0, slot(offset=2_000_000, nbytes=9, flags=THREAD | TIME), slot(dur=4, fd=5, op=CLOSE))
    record_file(tmp_path / "4242-100-0.xio", paths_block((1, b"/data/a.bin")), first, later, shared, status_block(5))
    trace = read_trace(tmp_path)
    assert trace.ops == [
        IoOp(PID, 7, "read", "POSIX", 1_000_005, 3, 3, "/data/a.bin", "file", 0, 10, 10, 0),
        IoOp(PID, 7, "read", "POSIX", 1_000_009, 2, 3, "/data/a.bin", "file", 10, -1, 10, errno.EIO),
        IoOp(PID, 7, "read", "POSIX", 1_000_020, 5_000_000_000, 70_000, "/data/a.bin", "file", 10, 6 << 30, 8 << 30, 0),
        IoOp(PID, 7, "close", "POSIX", 1_000_050, 1, 3, "/data/a.bin", "file", -1, -1, -1, 0),
        IoOp(PID, 9, "close", "POSIX", 2_000_000, 4, 5, None, "unknown", -1, -1, -1, 0),
    ]  # fmt: skip
    (process,) = trace.processes
    assert process.records == 5 and process.clean_exit and not trace.problems


def test_a_wide_record_cut_before_its_second_slot_is_left_out(tmp_path: Path) -> None:
    whole = ops(
        7,
        slot(offset=1_000, flags=TIME),
        slot(start=1, nbytes=1, requested=1, fd=3, op=READ),
        slot(start=2, op=READ, flags=WIDE),
        WIDE_VALUES.pack(1, 1 << 40, 1, 3, 0),
    )
    record_file(tmp_path / "4242-100-0.xio", whole[:-20])
    trace = read_trace(tmp_path)
    assert [(op.op, op.start_ns, op.bytes) for op in trace.ops] == [("read", 1_001, 1)]
    assert len(trace.problems) == 1 and "truncated" in trace.problems[0]
    assert not trace.processes[0].clean_exit
