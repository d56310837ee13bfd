"""The io record reader (collect/_io_records) against files written by hand from the format documented in
collect/_io/core.c: time bases, the shared stream's thread slots, failed and wide records, paths in the
streams and their ids across sessions and forks, a cut file.
The library's own files are checked against real programs in test_io_native.py.
"""

from __future__ import annotations

import errno
import gc
import struct
from pathlib import Path

import pytest

from xstack.collect._io_classes import PathClasses, probe_name
from xstack.collect._io_records import IoOp, read_records, read_trace

HEADER = struct.Struct("<8sIIqqqIIIIIIIIq")
SLOT = struct.Struct("<IIqIiihBB")
WIDE_VALUES = struct.Struct("<qqqii")
NAMES = b"read,close,path,inherit;unknown,file"  # codes 1 to 4; kinds 0 and 1
READ, CLOSE, PATH, INHERIT, FILE = 1, 2, 3, 4, 1
FAILED, WIDE, TIME, THREAD = 0x10, 0x20, 0x40, 0x80
PID = 4242


def slot(start: int = 0, dur: int = 0, offset: int = -1, path: int = 0, nbytes: int = -1, requested: int = -1,
         fd: int = -1, op: int = 0, flags: int = 0) -> bytes:  # fmt: skip
    return SLOT.pack(start, dur, offset, path, nbytes, requested, fd, op, flags)


def block(kind: int, count: int, payload: bytes) -> bytes:
    return struct.pack("<IIQ", kind, count, len(payload)) + payload


def ops(tid: int, *slots: bytes) -> bytes:
    return block(2, len(slots), struct.pack("<iI", tid, 0) + b"".join(slots))


def record_file(path: Path, *blocks: bytes, pid: int = PID, ppid: int = 1, start: int = 100, forked: bool = False,
                seq: int = 0, names: bytes = NAMES) -> None:  # fmt: skip
    """A version 3 record file of process ``pid`` with the given blocks after its header."""
    tail = names + bytes(-len(names) % 8)
    header = HEADER.pack(b"XSTACKIO", 3, HEADER.size + len(tail), pid, ppid, start, 1, int(forked), seq, 32, 0, 0,
                         len(names), 0, start)  # fmt: skip
    path.write_bytes(header + tail + b"".join(blocks))


def path_slots(path_id: int, path: bytes) -> bytes:
    """A PATH slot and the path's bytes, zero-padded to whole slots."""
    return slot(path=path_id, nbytes=len(path), op=PATH) + path + bytes(-len(path) % SLOT.size)


def status_block(records: int) -> bytes:
    return block(3, 1, struct.pack("<IIqQQQQQQQ", 1, 3, 999, records, 100, 0, 0, 0, 0, 0) + bytes(24))


def test_streams_time_bases_failed_and_wide_records(tmp_path: Path) -> None:
    first = ops(
        7,
        slot(offset=1_000_000, flags=TIME),
        path_slots(1, b"/data/a.bin"),
        slot(start=5, dur=3, offset=0, path=1, nbytes=10, requested=10, fd=3, op=READ, flags=FILE),
        slot(start=9, dur=2, offset=10, path=1, nbytes=errno.EIO, requested=10, fd=3, op=READ, flags=FILE | FAILED),
        slot(start=20, offset=10, path=1, op=READ, flags=FILE | WIDE),
        WIDE_VALUES.pack(6 << 30, 8 << 30, 5_000_000_000, 70_000, 0),
    )
    later = ops(7, slot(start=50, dur=1, path=1, fd=3, op=CLOSE, flags=FILE))  # the base carries over
    shared = ops(0, slot(offset=2_000_000, nbytes=9, flags=THREAD | TIME), slot(dur=4, fd=5, op=CLOSE))
    record_file(tmp_path / "4242-100-0.xio", first, later, shared, status_block(5))
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


def test_paths_of_every_length_are_read_from_the_stream_and_interned(tmp_path: Path) -> None:
    paths = [b"/", b"/d/" + b"x" * 29, b"/d/" + b"y" * 30, "/d/\u00e9t\u00e9/\u65e5.bin".encode(), b"/d/" + b"z" * 4000]
    slots = [slot(offset=0, flags=TIME)]
    for i, path in enumerate(paths, 1):  # 1, 32 and 33 bytes: the slot boundaries; then several slots
        slots += [path_slots(i, path), slot(start=i, path=i, fd=3, op=CLOSE, flags=FILE)]
    slots += [path_slots(9, paths[1]), slot(start=9, path=9, fd=3, op=CLOSE, flags=FILE)]  # the same path again
    record_file(tmp_path / "4242-100-0.xio", ops(7, *slots), status_block(6))
    trace = read_trace(tmp_path)
    assert [op.path for op in trace.ops] == [p.decode() for p in [*paths, paths[1]]]
    assert trace.ops[1].path is trace.ops[5].path  # one string for one path
    assert trace.processes[0].records == 6 and not trace.problems


def test_ids_name_one_path_across_an_images_sessions_and_a_fork_child_reads_its_parents(tmp_path: Path) -> None:
    a, b, c = b"/data/a.bin", b"/data/b.bin", b"/data/c.bin"
    # the parent's first session defines 1; its second session names 1 again and defines 2
    record_file(tmp_path / "10-100-0.xio", ops(1, slot(offset=1_000, flags=TIME), path_slots(1, a),
                                               slot(path=1, fd=3, op=READ, flags=FILE)), pid=10)  # fmt: skip
    record_file(tmp_path / "10-100-1.xio", ops(1, slot(offset=3_000, flags=TIME), slot(path=1, fd=3, op=CLOSE),
                                               path_slots(2, b), slot(start=1, path=2, fd=4, op=READ)),
                pid=10, seq=1)  # fmt: skip
    # a child forked at 2_000 inherits fd 3 (id 1, defined before the fork) and defines id 2 itself, as its
    # parent does after the fork: its own definition wins for its records
    record_file(tmp_path / "11-2000-0.xio", ops(11, slot(offset=2_000, flags=TIME), slot(path=1, fd=3, op=INHERIT),
                                               slot(start=1, path=1, fd=3, op=READ), path_slots(2, c),
                                               slot(start=2, path=2, fd=5, op=READ)),
                pid=11, ppid=10, start=2_000, forked=True)  # fmt: skip
    # a grandchild names its grandparent's id 1 and its parent's 2
    record_file(tmp_path / "12-2500-0.xio", ops(12, slot(offset=2_500, flags=TIME), slot(path=1, fd=3, op=READ),
                                               slot(start=1, path=2, fd=5, op=READ)),
                pid=12, ppid=11, start=2_500, forked=True)  # fmt: skip
    # an image that was not forked (a program exec'd in pid 11) resolves only its own ids
    record_file(tmp_path / "11-9000-0.xio", ops(11, slot(offset=9_000, flags=TIME), slot(path=1, fd=3, op=READ)),
                pid=11, ppid=10, start=9_000)  # fmt: skip
    trace = read_trace(tmp_path)
    seen = [(op.pid, op.start_ns, op.op, op.path) for op in trace.ops]
    assert seen == [
        (10, 1_000, "read", "/data/a.bin"),
        (11, 2_001, "read", "/data/a.bin"),
        (11, 2_002, "read", "/data/c.bin"),
        (12, 2_500, "read", "/data/a.bin"),
        (12, 2_501, "read", "/data/c.bin"),
        (10, 3_000, "close", "/data/a.bin"),
        (10, 3_001, "read", "/data/b.bin"),
        (11, 9_000, "read", None),
    ]
    child = next(p for p in trace.processes if p.pid == 11 and p.forked)
    assert child.inherited == {3: "/data/a.bin"}
    # one process image at a time, in the order they started, each image's sessions together in time order,
    # built anew at each pass until a pass frees them
    records = read_records(tmp_path)
    images = [[(op.pid, op.start_ns, op.op, op.path) for op in image] for image in records.by_process()]
    assert images == [
        [(10, 1_000, "read", "/data/a.bin"), (10, 3_000, "close", "/data/a.bin"), (10, 3_001, "read", "/data/b.bin")],
        [(11, 2_001, "read", "/data/a.bin"), (11, 2_002, "read", "/data/c.bin")],
        [(12, 2_500, "read", "/data/a.bin"), (12, 2_501, "read", "/data/c.bin")],
        [(11, 9_000, "read", None)],
    ]
    again = [[(op.pid, op.start_ns, op.op, op.path) for op in image] for image in records.by_process(keep=False)]
    assert again == images
    assert list(records.by_process()) == [[], [], [], []]
    assert sorted(op for image in images for op in image) == sorted(seen)


def test_a_path_cut_short_is_left_out(tmp_path: Path) -> None:
    whole = ops(7, slot(offset=1_000, flags=TIME), slot(start=1, fd=3, op=READ), path_slots(1, b"/d/" + b"p" * 60))
    record_file(tmp_path / "4242-100-0.xio", whole[:-40])
    trace = read_trace(tmp_path)
    assert [(op.op, op.path) for op in trace.ops] == [("read", None)]
    assert len(trace.problems) == 1 and "truncated" in trace.problems[0]


def cpu_status(end: int, cpu: int, delay: int, threads: int, preempted: int) -> bytes:
    """A status block with the CPU figures after its 3 dropped counts."""
    fixed = struct.pack("<IIqQQQQQQQ", end, 3, 999, 1, 100, 0, 0, 0, 0, 0) + bytes(24)
    return block(3, 1, fixed + struct.pack("<qqqq", cpu, delay, threads, preempted))


def test_a_process_s_cpu_figures_come_from_its_last_status_and_its_sessions_add_up(tmp_path: Path) -> None:
    # a status that is not final holds no run-queue wait (threads 0); the final one does, from the image's start
    record_file(tmp_path / "10-100-0.xio", cpu_status(0, 5_000, 0, 0, 1), cpu_status(1, 9_000, 400, 3, 7), pid=10)
    # a process killed before its final status: CPU time known, its wait not
    record_file(tmp_path / "11-100-0.xio", cpu_status(0, 2_000, 0, 0, 4), pid=11)
    # an attached image's two sessions, each counted from its own start
    record_file(tmp_path / "12-100-0.xio", cpu_status(4, 1_000, 10, 2, 1), pid=12)
    record_file(tmp_path / "12-100-1.xio", cpu_status(4, 3_000, 30, 2, 2), pid=12, seq=1)
    # a file from a library before the figures: a status without them
    record_file(tmp_path / "13-100-0.xio", status_block(1), pid=13)
    by_pid = {p.pid: (p.cpu_ns, p.run_delay_ns, p.preempted) for p in read_records(tmp_path).processes}
    assert by_pid == {10: (9_000, 400, 7), 11: (2_000, None, 4), 12: (4_000, 40, 3), 13: (None, None, None)}


def self_status(records: int, dropped: int, self_ns: int, samples: int, flush_ns: int, clock_ps: int) -> bytes:
    """A final status with the CPU figures, then what recording cost the process (``_STATUS_SELF``)."""
    fixed = struct.pack("<IIqQQQQQQQ", 1, 3, 999, records, 100, 0, 0, 0, 0, 0) + struct.pack("<3Q", dropped, 0, 0)
    return block(3, 1, fixed + struct.pack("<qqqq", 9_000, 40, 1, 2)
                 + struct.pack("<qqqq", self_ns, samples, flush_ns, clock_ps))  # fmt: skip


def test_what_recording_cost_a_process_is_read_from_its_status_and_its_sessions_add_up(tmp_path: Path) -> None:
    # 6,400 calls written and 100 left out by the cap: 100 timed for 8,000 ns (80 ns each), a read of 7.5 ns
    record_file(tmp_path / "10-100-0.xio", self_status(6_400, 100, 8_000, 100, 50_000, 7_500), pid=10)
    # no call timed (fewer than 64): the clock reads and the flushes only
    record_file(tmp_path / "11-100-0.xio", self_status(50, 0, 0, 0, 9_000, 7_500), pid=11)
    # an attached image's two sessions, each counted from its own start
    record_file(tmp_path / "12-100-0.xio", self_status(640, 0, 1_000, 10, 2_000, 10_000), pid=12)
    record_file(tmp_path / "12-100-1.xio", self_status(1_280, 0, 3_000, 20, 4_000, 10_000), pid=12, seq=1)
    # files from a library before these figures: CPU figures without them, or neither
    record_file(tmp_path / "13-100-0.xio", cpu_status(1, 9_000, 400, 3, 7), pid=13)
    record_file(tmp_path / "14-100-0.xio", status_block(1), pid=14)
    by_pid = {p.pid: p for p in read_records(tmp_path).processes}
    assert [(by_pid[10].self_ns, by_pid[10].self_samples, by_pid[10].flush_ns, by_pid[10].clock_read_ps)] == [
        (8_000, 100, 50_000, 7_500)
    ]
    assert by_pid[10].recording_ns == 6_500 * (80 + 7.5) + 50_000
    assert by_pid[11].recording_ns == round(50 * 7.5 + 9_000)
    assert (by_pid[12].self_ns, by_pid[12].self_samples, by_pid[12].flush_ns) == (4_000, 30, 6_000)
    assert by_pid[12].recording_ns == round(1_920 * (4_000 / 30 + 10) + 6_000)
    assert by_pid[13].recording_ns is None and by_pid[13].cpu_ns == 9_000
    assert by_pid[14].recording_ns is None


def test_the_classes_read_one_call_of_each_path_and_every_call_they_need(tmp_path: Path) -> None:
    """``distinct_calls``: of each path only one call per (descriptor kind, errno), except on descriptors 1 and 2
    (whether the process opened them itself depends on their order) and on paths named as tempfile's probes (their
    calls are counted); the classes made of them are those made of every call."""
    names = b"read,close,path,inherit,open,write;unknown,file,dir"
    read, close, open_, write, file, folder = 1, 2, 5, 6, 1, 2
    data, out, probe, folder_path = b"/data/a.bin", b"/home/u/out.txt", b"/tmp/v52ns_va", b"/data/train"
    calls = [
        slot(offset=1_000, flags=TIME), path_slots(1, data), path_slots(2, out), path_slots(3, probe),
        path_slots(4, folder_path), path_slots(5, b"/data/b.bin"),
        *(slot(start=i, dur=1, offset=i * 10, path=1, nbytes=10, requested=10, fd=3, op=read, flags=file)
          for i in range(1, 6)),
        slot(start=6, path=1, nbytes=errno.EBADF, fd=3, op=read, flags=file | FAILED),
        slot(start=7, path=2, nbytes=5, requested=5, fd=1, op=write, flags=file),  # the shell's `> out.txt`
        slot(start=8, path=2, nbytes=5, requested=5, fd=1, op=write, flags=file),
        slot(start=9, path=3, fd=9, op=open_, flags=file), slot(start=10, path=3, nbytes=4, requested=4, fd=9, op=write,
                                                                  flags=file),
        slot(start=11, path=3, fd=9, op=close, flags=file),
        slot(start=12, path=4, fd=4, op=open_, flags=folder), slot(start=13, path=4, fd=4, op=close, flags=folder),
        slot(start=14, path=5, fd=2, op=open_, flags=file),  # a process that closed 2 and opened a file on it
        slot(start=15, path=5, nbytes=3, requested=3, fd=2, op=read, flags=file),
        slot(start=16, path=5, nbytes=3, requested=3, fd=2, op=read, flags=file),
    ]  # fmt: skip
    record_file(tmp_path / f"{PID}-100-0.xio", ops(7, *calls), names=names)
    records = read_records(tmp_path)
    (every,) = list(records.by_process())
    some = list(records.distinct_calls(probe_name))
    seen = [(op.start_ns - 1_000, op.op, op.path, op.errno != 0) for op in some]
    assert seen == [
        (5, "read", "/data/a.bin", False),  # one of the five
        (6, "read", "/data/a.bin", True),
        (7, "write", "/home/u/out.txt", False),
        (8, "write", "/home/u/out.txt", False),
        (9, "open", "/tmp/v52ns_va", False),
        (10, "write", "/tmp/v52ns_va", False),
        (11, "close", "/tmp/v52ns_va", False),
        (13, "close", "/data/train", False),
        (14, "open", "/data/b.bin", False),
        (15, "read", "/data/b.bin", False),
        (16, "read", "/data/b.bin", False),
    ]
    whole, part = PathClasses(every), PathClasses(some)
    for facts in ("directories", "outputs", "probes", "built"):
        assert getattr(part, facts) == getattr(whole, facts)
    assert (whole.outputs, whole.probes, whole.directories) == ({"/home/u/out.txt"}, {"/tmp/v52ns_va"}, {"/data/train"})
    assert list(records.by_process()) == [every]  # the calls stay packed for the spans


def test_reading_back_pauses_the_garbage_collector_and_restores_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:  # fmt: skip
    """Reading back builds millions of objects, none in a cycle: the cyclic collector is off meanwhile, and after
    it as it was before, an error included."""
    from xstack.collect import io
    from xstack.collect._ingest import gc_paused

    seen = []
    monkeypatch.setattr(io, "_ingest_run", lambda *args: seen.append(gc.isenabled()) or [])
    assert gc.isenabled()
    assert io.ingest_run(None, 1, tmp_path) == [] and seen == [False]  # type: ignore[arg-type]
    assert gc.isenabled()
    with pytest.raises(ValueError), gc_paused():
        assert not gc.isenabled()
        raise ValueError
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a program that runs without it keeps it off
    finally:
        gc.enable()


def test_calls_of_processes_with_no_model_span_are_not_walked_for_a_parent(tmp_path: Path) -> None:
    """torch.compile's cc1plus wrote a precompiled header in 6.7 million fwrite calls of 22 bytes: the walk that hangs
    each call from the model span open on its thread took them all in, and DuckDB ran out of its memory (128 MB), so
    the run's io records were kept unread. A process with no model span has no owner for its calls: they are left
    out of the walk, which runs in the memory of the calls that do have one."""
    from xstack.collect._ingest import set_parents
    from xstack.trace.store import RunInfo, Store

    with Store.create(tmp_path / "p.duckdb") as store:
        store.add_run(RunInfo(1, "t", levels=["model", "io"], config={}))
        con = store.con
        columns = "(run_id, span_id, parent_id, level, name, start_ns, dur_ns, pid, tid)"
        con.execute(f"INSERT INTO _spans {columns} VALUES (1, 1, NULL, 'model', 'step', 0, 10**9, 1, 1), "
                    "(1, 2, 1, 'model', 'work', 10, 10**9 - 1000, 1, 1)")  # fmt: skip
        con.execute(f"INSERT INTO _spans {columns} SELECT 1, 10 + i, NULL, 'io', 'fwrite', i * 100, 50, 2, 2 "
                    "FROM range(3000000) t(i)")  # a compiler's calls  # fmt: skip
        con.execute(f"INSERT INTO _spans {columns} SELECT 1, 10**10 + i, NULL, 'io', 'read', 100 + i * 100, 50, 1, 1 "
                    "FROM range(1000) t(i)")  # the loop's own, inside its span "work"  # fmt: skip
        con.execute("SET memory_limit = '32MB'")
        set_parents(con, 1, "io")
        found = con.execute("SELECT pid, parent_id, count(*) FROM _spans WHERE level = 'io' GROUP BY ALL").fetchall()
    assert sorted(found) == [(1, 2, 1000), (2, None, 3000000)]
