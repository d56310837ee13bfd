"""The io level's interposition library (collect/_io) and its reader (collect/_io_records).

Real programs (``io_programs/native_cases.py`` and three small C programs) run preloaded with the library in
subprocesses; their records are checked exactly against what the programs did: the operation sequence, bytes,
offsets and errno of every call on the files the test made. Attach mode runs in a subprocess too, never in the
pytest process.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from xstack.collect import _io_native
from xstack.collect._io_records import IoTrace, read_trace
from xstack.errors import BadInputError, XstackError

PROGRAMS = Path(__file__).parent / "io_programs"
CASES = PROGRAMS / "native_cases.py"
STREAM_CASES = PROGRAMS / "stream_cases.py"
MAX_STREAMS = 1024  # threads with a record stream of their own at one time (MAX_STREAMS in _io/streams.c)
KNOWN = bytes(range(256)) * 39 + bytes(16)  # 10,000 bytes


def need_library() -> None:
    """Skip, with the reason, where the library was not built (the reader's tests still run)."""
    reason = _io_native.unavailable_reason()
    if reason is not None:
        pytest.skip(f"io library unavailable: {reason}")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    need_library()
    root = tmp_path / "data"
    root.mkdir()
    (root / "known.bin").write_bytes(KNOWN)
    for i in range(8):
        (root / f"t{i}.bin").write_bytes(os.urandom(2000))
    return root


@pytest.fixture(scope="module")
def c_programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C helpers, compiled once; the static one only where a static libc is installed."""
    need_library()
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed: the C test programs cannot be built")
    out = tmp_path_factory.mktemp("c-programs")
    for name in ("native_stdio", "native_sigio", "native_cap", "native_vfork", "native_wide"):
        subprocess.run(["gcc", "-O2", "-o", str(out / name), str(PROGRAMS / f"{name}.c")], check=True)
    # each call as written (gcc would make fputs of a constant an fwrite, an fwrite of one byte an fputc);
    # fortified, fprintf and printf are __fprintf_chk and __printf_chk, fread __fread_chk
    for name, source, fortify in (
        ("native_lines", "native_lines", []),
        ("native_reopen", "native_reopen", []),
        ("native_lines_fortified", "native_lines", ["-D_FORTIFY_SOURCE=2"]),
        ("native_chunks", "native_chunks", []),
        ("native_chunks_fortified", "native_chunks", ["-D_FORTIFY_SOURCE=2"]),
    ):
        subprocess.run(["gcc", "-O2", "-fno-builtin", *fortify, "-o", str(out / name),
                        str(PROGRAMS / f"{source}.c")], check=True)  # fmt: skip
    plugin = str(PROGRAMS / "native_plugin.c")
    subprocess.run(
        ["gcc", "-O2", "-shared", "-fPIC", "-DINNER", "-o", str(out / "libxio_inner.so"), plugin], check=True
    )
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-Wl,--enable-new-dtags,-rpath,$ORIGIN", "-o",
                    str(out / "libxio_outer.so"), plugin, "-ldl"], check=True)  # fmt: skip
    static = subprocess.run(["gcc", "-O2", "-static", "-o", str(out / "native_stdio_static"),
                             str(PROGRAMS / "native_stdio.c")], capture_output=True)  # fmt: skip
    if static.returncode != 0:
        (out / "native_stdio_static").unlink(missing_ok=True)
    return out


def run(
    tmp_path: Path, *command: str, timeout: float = 60, cases: Path = CASES, **env_args: Any
) -> tuple[dict[str, Any], IoTrace]:
    """Run ``command`` (a case of ``cases``, or a program path) preloaded; its JSON output and records."""
    need_library()
    io_dir = tmp_path / "io"
    env = _io_native.preload_env(io_dir, **env_args)
    args = [sys.executable, str(cases), *command] if not command[0].startswith("/") else list(command)
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    return (json.loads(lines[-1]) if lines else {}), read_trace(io_dir)


def on(trace: IoTrace, path: Path) -> list[tuple[str, int, int, int, int]]:
    """(op, offset, bytes, requested, errno) of the calls on one file, in order."""
    return [(op.op, op.offset, op.bytes, op.requested, op.errno) for op in trace.ops if op.path == str(path)]


def test_posix_reads_writes_seeks_and_stats_are_recorded_exactly(tmp_path: Path, data: Path) -> None:
    known, out = data / "known.bin", data / "out.bin"
    _, trace = run(tmp_path, "posix", str(known), str(out))
    rd = os.O_RDONLY | os.O_CLOEXEC
    fd = [op.fd for op in trace.ops if op.path == str(known) and op.op == "open"][-1]
    assert on(trace, known) == [
        ("open", -1, -1, rd, 0),
        ("read", 0, 4096, 4096, 0), ("read", 4096, 4096, 4096, 0), ("read", 8192, 1808, 4096, 0),
        ("read", 10_000, 0, 4096, 0),
        ("close", -1, -1, -1, 0),
        ("open", -1, -1, rd, 0),
        ("read", 0, 100, 100, 0),
        ("lseek", 5000, -1, os.SEEK_SET, 0),
        ("read", 5000, 200, 200, 0),
        ("lseek", 9900, -1, os.SEEK_END, 0),
        ("read", 9900, 100, 1000, 0),
        ("pread", 20, 50, 50, 0),
        ("readv", 10_000, 0, 30, 0),
        ("lseek", 0, -1, os.SEEK_SET, 0),
        ("readv", 0, 30, 30, 0),
        ("close", -1, -1, -1, 0),
        ("stat", -1, -1, -1, 0),
        ("lstat", -1, -1, -1, 0),
        ("open", -1, -1, rd, 0),
        ("fstat", -1, -1, -1, 0),
        # mmap.mmap: fstat, then a dup by fcntl(F_DUPFD_CLOEXEC) (requested: the old descriptor), then the mapping
        ("fstat", -1, -1, -1, 0),
        ("dup", -1, -1, fd, 0),
        ("mmap", 0, -1, 4096, 0),
        # the with-block's end: mmap.close() closes its descriptor, then unmaps; then the program's own close
        ("close", -1, -1, -1, 0),
        ("munmap", -1, -1, 4096, 0),
        ("close", -1, -1, -1, 0),
    ]  # fmt: skip
    assert on(trace, out) == [
        ("open", -1, -1, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0),
        ("write", 0, 1000, 1000, 0),
        ("writev", 1000, 30, 30, 0),
        ("pwrite", 2, 5, 5, 0),
        ("fsync", -1, -1, -1, 0),
        ("fdatasync", -1, -1, -1, 0),
        ("close", -1, -1, -1, 0),
    ]
    mine = [op for op in trace.ops if op.path in (str(known), str(out))]
    (process,) = trace.processes
    assert {op.module for op in mine} == {"POSIX"}
    assert {op.fd_kind for op in mine} == {"file"}
    assert {(op.pid, op.tid) for op in mine} == {(process.pid, process.pid)}
    assert all(op.dur_ns >= 0 for op in trace.ops)
    assert [op.start_ns for op in trace.ops] == sorted(op.start_ns for op in trace.ops)
    assert process.clean_exit and process.end == "exit" and process.mode == "preload" and not process.forked
    assert process.records == len(trace.ops) and process.dropped == {} and not trace.problems


def test_a_descriptor_first_seen_after_its_call_has_the_offset_the_call_started_at(tmp_path: Path, data: Path) -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("the case opens by raw system call numbers of x86-64")
    known, out = data / "known.bin", data / "out.bin"
    seen, trace = run(tmp_path, "unseen", str(known), str(out))
    assert seen == {"reads": [50, 50], "writes": [20, 5], "freads": [1024, 1024]}
    # the library learns of each descriptor (its path, offset) at its first call, once the call has moved it
    assert on(trace, known) == [
        ("read", 100, 50, 50, 0), ("read", 150, 50, 50, 0), ("close", -1, -1, -1, 0),
        ("fread", 1000, 1024, 1024, 0), ("fread", 2024, 1024, 1024, 0), ("fclose", -1, -1, -1, 0),
    ]  # fmt: skip
    assert on(trace, out) == [("write", 10, 20, 20, 0), ("write", 30, 5, 5, 0), ("close", -1, -1, -1, 0)]


def test_a_descriptor_closed_on_one_thread_as_another_opens_it_keeps_the_open_s_entry(
    tmp_path: Path, data: Path
) -> None:
    seen, trace = run(tmp_path, "close_race", str(data), "20000")
    reads = [op for op in trace.ops if op.op == "read" and op.path and op.path.startswith(str(data))]
    assert len(reads) == 20_000 and seen["read"] == 20_000 * 2000 and seen["closes"] > 0
    # each file is read whole from its open; the socket closed on the other thread moved no entry's offset
    assert {(op.offset, op.bytes) for op in reads} == {(0, 2000)}


def _tsc_usable() -> bool:
    """What the library's clock.c requires to time calls with the TSC, read from Linux's side."""
    try:
        source = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource").read_text().strip()
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return os.uname().machine == "x86_64" and source == "tsc" and {"constant_tsc", "nonstop_tsc"} <= set(flags)


@pytest.mark.parametrize("clock", ["default", "realtime"])
def test_call_times_are_on_clock_realtime_within_the_windows_the_program_saw(
    tmp_path: Path, data: Path, clock: str
) -> None:
    """Each read lies inside the CLOCK_REALTIME window Python read around it (2 us of slack), and the reads that
    blocked ~30 ms lasted what their windows say (median shortfall under 150 us, where a rate 0.5 % off would
    lose 150 us): the TSC's conversion to ns holds across flushes and in a fork child, and
    XSTACK_IO_CLOCK=realtime turns it off. (A median, as a busy machine may pause the program between reading
    the clock and entering a call, which widens that one window.)"""
    env = dict(os.environ)
    if clock == "realtime":
        env["XSTACK_IO_CLOCK"] = "realtime"
    else:
        env.pop("XSTACK_IO_CLOCK", None)
    known = data / "known.bin"
    out, trace = run(tmp_path, "timing", str(known), str(tmp_path / "child.json"), base=env)
    expected = "tsc" if clock == "default" and _tsc_usable() else "realtime"
    assert {p.clock for p in trace.processes} == {expected}
    parent = next(p.pid for p in trace.processes if not p.forked)
    for pid, windows in ((parent, out["parent"]), (out["child_pid"], out["child"])):
        recorded = [op for op in trace.ops if op.pid == pid and (
            (op.op == "read" and op.fd_kind == "pipe") or (op.op == "pread" and op.path == str(known)))]  # fmt: skip
        assert [op.fd_kind for op in recorded] == [kind for kind, _, _ in windows]
        shortfalls = []
        for op, (kind, before, after) in zip(recorded, windows, strict=True):
            assert before - 2_000 <= op.start_ns and op.start_ns + op.dur_ns <= after + 2_000, (kind, op, before, after)
            if kind == "pipe":
                shortfalls.append(after - before - op.dur_ns)
        assert sorted(shortfalls)[len(shortfalls) // 2] < 150_000, shortfalls
    # the pipe reads waited for the writer: the windows are long, so the check above measured the clock's rate
    assert min(after - before for kind, before, after in out["parent"] if kind == "pipe") > 5_000_000


def test_directory_listings_are_recorded_as_runs_of_readdir_calls(tmp_path: Path, data: Path) -> None:
    for sub in ("tree/a/b", "tree/c"):
        (data / sub).mkdir(parents=True)
    for f in ("tree/f1", "tree/a/f2", "tree/a/b/f3"):
        (data / f).write_bytes(b"")
    out, trace = run(tmp_path, "listing", str(data))
    entries = len(os.listdir(data)) + 2
    mine = [(op.op, op.fd_kind, op.bytes, op.requested, op.errno) for op in trace.ops
            if op.path and op.path.startswith(str(data)) and op.op not in ("stat", "lstat")]  # fmt: skip
    d, dr = os.O_RDONLY | os.O_DIRECTORY, os.O_RDONLY | os.O_CLOEXEC
    dirfd = out["dirfd"]
    assert mine == [
        # os.listdir: the whole listing is one run of calls, the last one at the end of the directory
        ("opendir", "dir", -1, d, 0), ("readdir", "dir", entries, entries + 1, 0), ("closedir", "dir", -1, -1, 0),
        # os.scandir, one entry taken, a file read, then the rest: the read splits the run in two
        ("opendir", "dir", -1, d, 0), ("readdir", "dir", 1, 1, 0),
        ("open", "file", -1, dr, 0), ("fstat", "file", -1, -1, 0), ("lseek", "file", -1, os.SEEK_CUR, 0),
        ("read", "file", 4096, 4096, 0), ("close", "file", -1, -1, 0),
        ("readdir", "dir", entries - 1, entries, 0), ("closedir", "dir", -1, -1, 0),
        # os.walk, top down
        ("opendir", "dir", -1, d, 0), ("readdir", "dir", 5, 6, 0), ("closedir", "dir", -1, -1, 0),
        ("opendir", "dir", -1, d, 0), ("readdir", "dir", 2, 3, 0), ("closedir", "dir", -1, -1, 0),
        ("opendir", "dir", -1, d, 0), ("readdir", "dir", 4, 5, 0), ("closedir", "dir", -1, -1, 0),
        ("opendir", "dir", -1, d, 0), ("readdir", "dir", 3, 4, 0), ("closedir", "dir", -1, -1, 0),
        # os.listdir(fd): a dup of the descriptor, read by fdopendir's stream, closed by closedir
        ("open", "dir", -1, d | os.O_CLOEXEC, 0), ("dup", "dir", -1, dirfd, 0),
        ("readdir", "dir", entries, entries + 1, 0),
        ("closedir", "dir", -1, -1, 0), ("close", "dir", -1, -1, 0),
        ("opendir", "unknown", -1, d, errno.ENOENT),
    ]  # fmt: skip
    assert [op.path for op in trace.ops if op.op == "opendir" and op.path.startswith(str(data))] == [
        str(data), str(data), str(data / "tree"), str(data / "tree/c"), str(data / "tree/a"), str(data / "tree/a/b"),
        str(data / "missing"),
    ]  # fmt: skip
    # the readdir run started at its first call and lasted the calls' time: it ends before the next record
    ops = [op for op in trace.ops if op.pid == trace.processes[0].pid]
    for op, nxt in zip(ops, ops[1:], strict=False):
        if op.op == "readdir":
            assert op.start_ns + op.dur_ns <= nxt.start_ns
    # closedir closed the dup through glibc's own close: the pipe that took its number is a pipe, not the directory
    r, _ = out["pipe"]
    last_read = [op for op in trace.ops if op.fd == r and op.op == "read"][-1]
    assert (last_read.fd_kind, last_read.path, last_read.bytes) == ("pipe", None, 3)
    assert out["missing"] == errno.ENOENT and out["names"] == entries - 2 and out["rest"] == entries - 3


def test_in_kernel_copies_are_a_read_of_the_source_and_a_write_of_the_destination(tmp_path: Path, data: Path) -> None:
    known, out_dir = data / "known.bin", tmp_path / "out"
    out_dir.mkdir()
    seen, trace = run(tmp_path, "copies", str(known), str(out_dir))
    assert seen["sent"] == [4000, 2000] and seen["ranged"] == 1000
    first = [o for o in on(trace, known) if o[0] != "fstat"]
    assert first[:6] == [
        ("open", -1, -1, os.O_RDONLY | os.O_CLOEXEC, 0),
        ("sendfile_read", 0, 4000, 4000, 0),  # at the descriptor's offset, which it moved
        ("sendfile_read", 8000, 2000, 5000, 0),  # at the offset given; the descriptor's stays at 4000
        ("read", 4000, 10, 10, 0),
        ("copy_file_range_read", 0, 1000, 1000, 0),
        ("close", -1, -1, -1, 0),
    ]  # fmt: skip
    # shutil.copyfile sends the whole file, then once more to find its end: a zero-length read, and no write
    copied = [o for o in first[6:] if o[0].startswith("sendfile")]
    assert [o[:3] for o in copied] == [("sendfile_read", 0, 10_000), ("sendfile_read", 10_000, 0)]
    assert [o[:3] for o in on(trace, out_dir / "copied.bin") if o[0].startswith("sendfile")] == [
        ("sendfile_write", 0, 10_000)
    ]
    assert [o[:3] for o in on(trace, out_dir / "sent.bin")] == [
        ("open", -1, -1), ("sendfile_write", 0, 4000), ("sendfile_write", 4000, 2000), ("close", -1, -1),
        ("rename", -1, -1),
    ]  # fmt: skip
    assert [o[:3] for o in on(trace, out_dir / "ranged.bin")] == [
        ("open", -1, -1), ("copy_file_range_write", 100, 1000), ("close", -1, -1)
    ]  # fmt: skip
    assert (out_dir / "final.bin").read_bytes() == KNOWN[:4000] + KNOWN[8000:]
    renames = [(op.path, op.target, op.fd_kind, op.errno) for op in trace.ops if op.op == "rename"]
    assert renames == [
        (str(out_dir / "sent.bin"), str(out_dir / "moved.bin"), "file", 0),
        (str(out_dir / "moved.bin"), str(out_dir / "final.bin"), "file", 0),  # renameat, by directory descriptors
        (str(out_dir / "tmp-checkpoint"), str(out_dir / "checkpoint"), "dir", 0),
        (str(out_dir / "missing.bin"), str(out_dir / "never.bin"), "unknown", errno.ENOENT),
    ]
    assert seen["failed"] == errno.ENOENT


def test_relative_paths_resolve_against_the_cwd_and_directory_descriptors(tmp_path: Path, data: Path) -> None:
    _, trace = run(tmp_path, "relative", str(data))
    known = str(data / "known.bin")
    expected = ["open", "open", "openat", "fstatat", "stat", "close", "close", "close"]
    assert [op.op for op in trace.ops if op.path == known] == expected
    assert [op.fd_kind for op in trace.ops if op.path == str(data) and op.op in ("open", "close")] == ["dir", "dir"]


def test_an_unnamed_temporary_file_is_recorded_under_the_kernel_s_name_not_its_folder_s(
    tmp_path: Path, data: Path
) -> None:
    """O_TMPFILE holds O_DIRECTORY's bit and names the folder: each file was recorded as the folder, a directory.
    (A file made after another closed may get its inode, and so its name, again, as the kernel shows it.)"""
    seen, trace = run(tmp_path, "unnamed", str(data))
    if "unsupported" in seen:
        pytest.skip(f"O_TMPFILE is not supported where the test's files are: {seen['unsupported']}")
    for inode, size in seen["made"]:
        calls = [(op.op, op.bytes, op.fd_kind) for op in trace.ops if op.path == f"{data}/#{inode} (deleted)"]
        assert calls == [("open", -1, "file"), ("write", size, "file"), ("lseek", -1, "file"),
                         ("read", size, "file"), ("fstat", -1, "file"), ("close", -1, "file")]  # fmt: skip
    # the folder's own calls are its listing's alone
    assert {op.op for op in trace.ops if op.path == str(data)} == {"opendir", "readdir", "closedir"}


def test_errno_is_preserved_and_recorded(tmp_path: Path, data: Path) -> None:
    known = data / "known.bin"
    seen, trace = run(tmp_path, "errnos", str(known))
    assert seen["open"] == errno.ENOENT and seen["read"] == errno.EBADF and seen["close"] == errno.EBADF
    (missing,) = [op for op in trace.ops if op.path == f"{known}.missing"]
    assert (missing.op, missing.fd, missing.errno, missing.fd_kind) == ("open", -1, errno.ENOENT, "unknown")
    closed_at = max(op.start_ns for op in trace.ops if op.path == str(known))  # its close
    after = [op for op in trace.ops if op.fd == seen["fd"] and op.start_ns > closed_at]
    assert [(op.op, op.errno, op.bytes, op.path) for op in after][:2] == [
        ("read", errno.EBADF, -1, None),
        ("close", errno.EBADF, -1, None),
    ]  # fmt: skip


def test_unmaps_of_file_mappings_name_their_file_after_its_descriptor_closed(tmp_path: Path, data: Path) -> None:
    known = data / "known.bin"
    seen, trace = run(tmp_path, "mappings", str(known))
    assert (seen["failed"], seen["errno"], seen["done"], seen["child"], seen["parent"]) == (-1, errno.EINVAL, 0, 0, 0)
    assert seen["same"]  # the other memory took the address the file's first part had
    parent = next(p.pid for p in trace.processes if not p.forked)
    calls = [(op.pid, op.op, op.requested, op.errno, op.fd, op.fd_kind) for op in trace.ops
             if op.path == str(known) and op.op in ("mmap", "munmap")]  # fmt: skip
    assert calls == [
        (parent, "mmap", 8192, 0, calls[0][4], "file"),
        (parent, "munmap", 0, errno.EINVAL, -1, "file"),  # failed: still mapped, so the next unmap is recorded
        (parent, "munmap", 8192, 0, -1, "file"),
        (parent, "mmap", 8192, 0, calls[3][4], "file"),  # unmapped in two parts, other memory mapped between
        (parent, "mmap", 4096, 0, calls[4][4], "file"),
        (seen["child_pid"], "munmap", 4096, 0, -1, "file"),  # a fork child unmaps what it inherited
        (parent, "munmap", 4096, 0, -1, "file"),
    ]
    # the anonymous mappings, and every unmap of memory that is no recorded file mapping, leave no record
    assert [op for op in trace.ops if op.op == "munmap" and op.path != str(known)] == []


def test_a_mapping_grown_by_mremap_is_unmapped_whole_at_its_new_address(tmp_path: Path, data: Path) -> None:
    grow = data / "grow.bin"
    seen, trace = run(tmp_path, "remapped", str(grow))
    assert seen == {"size": 16 * 4096}
    calls = [(op.op, op.requested, op.errno) for op in trace.ops if op.path == str(grow) and "map" in op.op]
    assert calls == [("mmap", 4096, 0), ("munmap", 16 * 4096, 0)]


def test_pipe_and_socket_are_classified(tmp_path: Path) -> None:
    seen, trace = run(tmp_path, "streams")
    (r, w, got_pipe), (a, b, got_socket) = seen["pipe"], seen["socket"]
    assert got_pipe == 100 and got_socket == 64

    def kinds(fd: int, op: str) -> set[tuple[str, int, int, str | None]]:
        # descriptor numbers are reused: the interpreter's own files (which have a path) had them before
        calls = [o for o in trace.ops if o.fd == fd and o.op == op and o.path is None]
        return {(o.fd_kind, o.bytes, o.offset, o.path) for o in calls}

    assert kinds(w, "write") == {("pipe", 100, -1, None)} and kinds(r, "read") == {("pipe", 100, -1, None)}
    assert kinds(a, "write") == {("socket", 64, -1, None)} and kinds(b, "read") == {("socket", 64, -1, None)}


def test_threads_each_get_every_record(tmp_path: Path, data: Path) -> None:
    seen, trace = run(tmp_path, "threads", str(data), "200")
    tids: dict[str, int] = seen["tids"]
    for i in range(8):
        path = data / f"t{i}.bin"
        reads = [op for op in trace.ops if op.path == str(path) and op.op == "read"]
        assert {op.tid for op in reads} == {tids[path.name]}
        assert sorted(op.offset for op in reads) == list(range(0, 2000, 10))
        assert {op.bytes for op in reads} == {10}


def test_forked_child_records_into_its_own_file_with_inherited_descriptors(tmp_path: Path, data: Path) -> None:
    inherited, fresh = data / "known.bin", data / "t0.bin"
    seen, trace = run(tmp_path, "fork", str(inherited), str(fresh))
    parent, child, grandchild = sorted(trace.processes, key=lambda p: (p.forked, p.start_ns))
    assert child.pid == seen["child"] and child.ppid == parent.pid and child.forked
    assert grandchild.pid == seen["grandchild"] and grandchild.ppid == child.pid and grandchild.forked
    assert child.end == "_exit" and child.clean_exit and parent.end == "exit"
    assert child.inherited[seen["fd"]] == str(inherited)
    # the grandchild's paths were written by the process that opened each descriptor: its grandparent, its parent
    assert grandchild.inherited[seen["fd"]] == str(inherited) and grandchild.inherited[seen["other"]] == str(fresh)
    assert [(o.pid, o.op, o.offset, o.bytes) for o in trace.ops if o.path == str(inherited) and o.op == "read"] == [
        (parent.pid, "read", 0, 10),
        (child.pid, "read", 10, 20),
        (grandchild.pid, "read", 30, 7),
    ]
    assert [(o.pid, o.op, o.bytes) for o in trace.ops if o.path == str(fresh)] == [
        (child.pid, "open", -1),
        (child.pid, "read", 5),
        (grandchild.pid, "read", 3),
    ]
    assert child.files[0].name.startswith(f"{child.pid}-") and child.files != parent.files


def test_each_process_s_cpu_time_and_wait_for_a_cpu_are_recorded(tmp_path: Path, data: Path) -> None:
    if not Path("/proc/self/schedstat").exists():
        pytest.skip("the kernel keeps no scheduler statistics (/proc/self/schedstat): no wait for a CPU to read")
    # two children spin on one CPU at once, each waiting while the other runs; a third spins alone
    seen, trace = run(tmp_path, "contended", str(data / "known.bin"))
    by_pid = {p.pid: p for p in trace.processes}
    together, alone = [by_pid[pid] for pid in seen["together"]], by_pid[seen["alone"]]
    for p in [*together, alone]:
        assert p.end == "_exit" and p.cpu_ns is not None and p.run_delay_ns is not None and p.preempted is not None
        # the process's CPU time as it told it, taken just before it left: the library's is read as it leaves (the
        # kernel splits a process's time between user and system anew at each read: the sum may move by some us)
        assert abs(p.cpu_ns - seen["cpu_ns"][str(p.pid)]) < 50_000_000
        assert p.cpu_ns >= 300_000_000
    for p in together:  # about as long as the other's 0.3 s of CPU, less the part spent before it started
        assert p.run_delay_ns >= 100_000_000 and p.preempted > 0
    # the sibling's turns add to each of the two's wait (up to its 0.3 s of CPU), whatever else waits for that CPU:
    # on a busy machine the one alone waits too, for the other programs
    assert alone.run_delay_ns < min(p.run_delay_ns for p in together) - 100_000_000
    parent = next(p for p in trace.processes if not p.forked)
    assert parent.end == "exit" and parent.run_delay_ns is not None and parent.cpu_ns is not None


def test_the_wait_for_a_cpu_counts_the_threads_that_ended_before_the_process(tmp_path: Path, data: Path) -> None:
    """A thread's schedstat file goes with it: the library reads a thread's wait as it ends, so that the process's
    figure counts it, not only the waits of the threads alive as the process ends."""
    if not Path("/proc/self/schedstat").exists():
        pytest.skip("the kernel keeps no scheduler statistics (/proc/self/schedstat): no wait for a CPU to read")
    seen, trace = run(tmp_path, "thread_waits", str(data / "known.bin"))
    process = next(p for p in trace.processes if not p.forked)
    assert process.end == "exit" and process.run_delay_ns is not None
    assert seen["thread"] >= 50_000_000  # it waited while the main thread ran (or the test shows nothing)
    # each read after the thread's or the main thread's own, less the main thread's wait before the library
    # started (some us): without the ended thread, the figure would stay under the main thread's own
    assert process.run_delay_ns > seen["main"] + seen["thread"] / 2, (process.run_delay_ns, seen)


def test_each_process_measures_what_recording_its_calls_costs_it(tmp_path: Path, data: Path) -> None:
    """The library times 1 recorded call in 64 per thread from the call's end to the end of its record, and every
    flush, and measures a clock read: each process's figures count its own calls (a fork child's start afresh),
    and ``recording_ns`` puts them together."""
    seen, trace = run(tmp_path, "self_timed", str(data / "known.bin"), "20000")
    by_pid = {p.pid: p for p in trace.processes}
    parent, child = next(p for p in trace.processes if not p.forked), by_pid[seen["child"]]
    preads = {pid: sum(1 for o in trace.ops if o.pid == pid and o.op == "pread") for pid in by_pid}
    assert preads[parent.pid] == 20_000 and preads[child.pid] == 10_000
    for p in (parent, child):
        assert p.self_ns is not None and p.self_samples is not None and p.flush_ns is not None
        assert p.clock_read_ps is not None and 100 <= p.clock_read_ps <= 1_000_000  # 0.1 ns to 1 us a read
        # every 64th record of a thread, a call that flushed or was descheduled passing it on to the next
        assert 0.9 * p.records / 64 - 4 <= p.self_samples <= p.records / 64, (p.records, p.self_samples)
        assert 0 < p.self_ns / p.self_samples <= 10_000  # what is longer was descheduled: left out
        assert p.flush_ns > 0  # at least the final flush, which wrote the records
        path = p.self_ns / p.self_samples + p.clock_read_ps / 1000
        assert p.recording_ns == round((p.records + sum(p.dropped.values())) * path + p.flush_ns)
        # part of the process's CPU time (a fork child's first writes to the library's pages copy them: a few
        # timed calls of the child take some us, which its 1 in 64 weighs as much as any other)
        assert p.cpu_ns is not None and 0 < p.recording_ns < p.cpu_ns, (p.recording_ns, p.cpu_ns)
    assert child.records < 11_000 < 20_000 < parent.records  # the child's counts start at the fork


def test_fork_while_other_threads_hold_the_lock_does_not_hang(tmp_path: Path, data: Path) -> None:
    known = data / "known.bin"
    seen, trace = run(tmp_path, "fork_storm", str(known), "40", timeout=120)
    children = {p.pid: p for p in trace.processes if p.forked}
    assert sorted(children) == sorted(seen["children"])
    assert {p.end for p in children.values()} == {"_exit"}
    for pid in children:
        assert [(o.op, o.bytes) for o in trace.ops if o.pid == pid and o.path == str(known)] == [
            ("open", -1), ("read", 100), ("close", -1),
        ]  # fmt: skip


def test_python_signal_handler_doing_io_while_reading(tmp_path: Path, data: Path) -> None:
    known, log = data / "known.bin", data / "log.bin"
    seen, trace = run(tmp_path, "signals", str(known), str(log))
    assert [op.op for op in trace.ops if op.path == str(known)].count("pread") == seen["reads"]
    assert [op.op for op in trace.ops if op.path == str(log)].count("write") == seen["fired"]


def _ops_block_threads(directory: Path) -> list[int]:
    """The thread of every operations block in the record files of ``directory`` (0: the shared stream)."""
    tids = []
    for path in directory.glob("*.xio"):
        data = path.read_bytes()
        at = struct.unpack_from("<I", data, 12)[0]
        while at + 16 <= len(data):
            kind, _count, size = struct.unpack_from("<IIQ", data, at)
            if kind == 2:
                tids.append(struct.unpack_from("<i", data, at + 16)[0])
            at += 16 + size
    return tids


def _calls_by_thread(trace: IoTrace, path: Path) -> dict[int, list[tuple[str, int]]]:
    calls: dict[int, list[tuple[str, int]]] = {}
    for op in trace.ops:
        if op.path == str(path):
            calls.setdefault(op.tid, []).append((op.op, op.bytes))
    return calls


def test_threads_that_exit_hand_their_stream_to_later_threads(tmp_path: Path, data: Path) -> None:
    known = data / "known.bin"
    count = MAX_STREAMS + 200
    seen, trace = run(tmp_path, "churn", str(known), str(count), cases=STREAM_CASES)
    calls = _calls_by_thread(trace, known)
    for tid in set(seen["tids"]):
        assert calls.pop(tid) == [("open", -1), ("read", 10), ("close", -1)] * seen["tids"].count(tid)
    assert not calls
    # one thread at a time: each found the stream of a thread that had exited, none had to share
    assert 0 not in _ops_block_threads(tmp_path / "io")
    (process,) = trace.processes
    assert process.clean_exit and process.records == len(trace.ops)


def test_threads_past_the_stream_limit_share_one_and_lose_nothing(tmp_path: Path, data: Path) -> None:
    known = data / "known.bin"
    count = MAX_STREAMS + 40
    seen, trace = run(tmp_path, "crowd", str(known), str(count), cases=STREAM_CASES, timeout=120)
    calls = _calls_by_thread(trace, known)
    assert len(seen["tids"]) == len(set(seen["tids"])) == count
    assert all(calls[tid] == [("open", -1), ("read", 10), ("close", -1)] for tid in seen["tids"])
    assert 0 in _ops_block_threads(tmp_path / "io")  # the shared stream was used
    (process,) = trace.processes
    assert process.records == len(trace.ops) and process.dropped == {}


def test_an_idle_threads_records_are_flushed_by_the_others(tmp_path: Path, data: Path) -> None:
    known = data / "known.bin"
    env = _io_native.preload_env(tmp_path / "io")
    args = [sys.executable, str(STREAM_CASES), "idle_thread", str(known)]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        seen = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    trace = read_trace(tmp_path / "io")
    assert _calls_by_thread(trace, known)[seen["tid"]] == [("open", -1), ("read", 7)]


def test_many_paths_each_keep_their_name(tmp_path: Path) -> None:
    count = 5000  # about 12 times round a thread's stream of paths and records
    seen, trace = run(tmp_path, "many_paths", str(tmp_path), str(count), cases=STREAM_CASES)
    assert seen == {"failed": 2 * count}
    opens = [op.path for op in trace.ops if op.op == "open" and op.errno == errno.ENOENT and op.path]
    expected = [str(tmp_path / f"missing-{i}") for i in range(count)]
    assert [p for p in opens if p.startswith(f"{tmp_path}/missing-")] == expected * 2
    assert trace.processes[0].paths_dropped == 0


def test_values_past_a_records_narrow_fields_are_kept_whole(tmp_path: Path, data: Path, c_programs: Path) -> None:
    known = data / "known.bin"
    seen, trace = run(tmp_path, str(c_programs / "native_wide"), str(known))
    assert (seen["got"], seen["bad"], seen["bad_errno"], seen["mapped"]) == (10_000, -1, errno.EBADF, 1)
    assert on(trace, known) == [
        ("open", -1, -1, os.O_RDONLY, 0),
        ("read", 0, 10_000, 5 << 30, 0),  # 5 GiB asked for
        ("mmap", 0, -1, 5 << 30, 0),
        ("munmap", -1, -1, 5 << 30, 0),
        ("close", -1, -1, -1, 0),
    ]
    (bad,) = [op for op in trace.ops if op.fd == 70_000]  # a descriptor past 16 bits
    assert (bad.op, bad.bytes, bad.requested, bad.errno, bad.path) == ("read", -1, 10, errno.EBADF, None)


def test_signal_handler_inside_a_hook_passes_through_and_is_counted(
    tmp_path: Path, data: Path, c_programs: Path
) -> None:
    seen, trace = run(tmp_path, str(c_programs / "native_sigio"), str(data / "known.bin"))
    (process,) = trace.processes
    handler_writes = [op for op in trace.ops if op.path == "/dev/null" and op.op == "write"]
    # every write of the handler is either recorded or, when it interrupted a hook, passed through and counted
    assert len(handler_writes) + process.reentrant_skipped == seen["fired"]
    assert [op.op for op in trace.ops if op.path == str(data / "known.bin")].count("pread") == seen["reads"]


def test_record_cap_counts_what_it_drops(tmp_path: Path, data: Path, c_programs: Path) -> None:
    _, trace = run(tmp_path, str(c_programs / "native_cap"), str(data / "known.bin"), max_records=100)
    (process,) = trace.processes
    assert len(trace.ops) == process.records == process.max_records == 100
    assert [op.op for op in trace.ops] == ["open"] + ["read"] * 99
    assert process.dropped == {"read": 901, "close": 1}
    assert process.dropped_bytes_read == 9010 and process.dropped_bytes_written == 0


def test_killed_process_keeps_records_older_than_the_flush_interval(tmp_path: Path, data: Path) -> None:
    known = data / "known.bin"
    env = _io_native.preload_env(tmp_path / "io")
    proc = subprocess.Popen([sys.executable, str(CASES), "killed", str(known)], env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and json.loads(proc.stdout.readline()) == {"ready": True}
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    trace = read_trace(tmp_path / "io")
    (process,) = trace.processes
    assert not process.clean_exit and process.end == "running"
    assert [(op.op, op.offset, op.bytes) for op in trace.ops if op.path == str(known)] == [
        ("open", -1, -1), ("read", 0, 10), ("read", 10, 20),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("sig", "default_again"), [(signal.SIGTERM, ""), (signal.SIGHUP, ""), (signal.SIGINT, "SIGINT")]
)
def test_a_termination_signal_writes_the_buffered_records_and_still_kills(
    tmp_path: Path, data: Path, sig: signal.Signals, default_again: str
) -> None:
    """A process killed by a signal left at its default action lost what it had not flushed: here every record,
    as the reads come well within the flush interval. SIGINT is Python's own; the program sets it back to the
    default, which the library then stands in for again."""
    known = data / "known.bin"
    env = _io_native.preload_env(tmp_path / "io")
    proc = subprocess.Popen([sys.executable, str(CASES), "terminated", str(known), default_again], env=env,
                            stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert proc.stdout is not None and json.loads(proc.stdout.readline()) == {"ready": True}
    finally:
        proc.send_signal(sig)
        proc.wait(timeout=30)
    assert proc.returncode == -sig  # killed by it, as without the library
    (process,) = read_trace(tmp_path / "io").processes
    assert process.clean_exit and process.end == sig.name
    assert [(op.op, op.offset, op.bytes) for op in read_trace(tmp_path / "io").ops if op.path == str(known)] == [
        ("open", -1, -1), ("read", 0, 10), ("read", 10, 20),
    ]  # fmt: skip


def test_the_program_sees_the_signal_actions_it_set(tmp_path: Path) -> None:
    """The library's handler never shows: Python and sigaction see the default, a handler the program installs
    replaces it (and runs), and an ignored signal stays ignored."""
    seen, _ = run(tmp_path, "dispositions")
    default = str(signal.Handlers.SIG_DFL)
    assert seen == {
        "python_at_start": default, "sigaction_at_start": 0, "replaced": default, "handled": [signal.SIGTERM],
        "back_to_default": True, "sigaction_after": 0, "python_after": default,
        "sighup_ignored": default, "sighup_now": str(signal.Handlers.SIG_IGN),
    }  # fmt: skip


def test_a_signal_the_program_starts_with_ignored_stays_ignored(tmp_path: Path, data: Path) -> None:
    env = _io_native.preload_env(tmp_path / "io")
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM); print(signal.getsignal(signal.SIGTERM))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == str(signal.Handlers.SIG_IGN)
    (process,) = read_trace(tmp_path / "io").processes
    assert process.end == "exit"


def test_a_terminated_pool_s_workers_keep_their_reads(tmp_path: Path, data: Path) -> None:
    """``Pool.terminate()`` (what leaving ``with Pool(...)`` does) sends SIGTERM to workers still running or
    waiting for work: they lost every read they had made since their last flush."""
    result, trace = run(tmp_path, "pool", str(data))
    workers = [p for p in trace.processes if p.forked]
    assert [p.end for p in workers] == ["SIGTERM", "SIGTERM"]
    reads = [op for op in trace.ops if op.op == "read" and op.path and op.path.startswith(str(data))]
    assert sum(op.bytes for op in reads) == result["bytes"] == sum(f.stat().st_size for f in data.iterdir())


def test_excluded_prefix_leaves_no_record(tmp_path: Path) -> None:
    hidden_dir = tmp_path / "store"
    hidden_dir.mkdir()
    hidden = hidden_dir / "run.duckdb"
    hidden.write_bytes(b"x" * 100)
    kept = tmp_path / "io.bin"  # beside the record directory tmp_path/io, whose own exclusion ends at its "/"
    kept.write_bytes(KNOWN)
    _, trace = run(tmp_path, "excluded", str(kept), str(hidden), exclude=[str(hidden_dir)])
    assert not [op for op in trace.ops if op.path and op.path.startswith(str(hidden_dir))]
    kept_calls = ["open", "read", "dup", "fstat", "close", "close", "stat"]
    assert [op.op for op in trace.ops if op.path == str(kept)] == kept_calls
    # the excluded file's calls came after the kept file's: only the program's output on stdout/stderr follows
    last_kept = max(i for i, op in enumerate(trace.ops) if op.path == str(kept))
    assert {op.fd for op in trace.ops[last_kept + 1 :]} <= {1, 2}


def test_stdio_calls_are_recorded_with_their_stream_offsets(tmp_path: Path, c_programs: Path) -> None:
    target = tmp_path / "stdio.bin"
    seen, trace = run(tmp_path, str(c_programs / "native_stdio"), str(target))
    assert seen == {"wrote": 1000, "items": 10, "small": 10}
    ops = [op for op in trace.ops if op.path == str(target)]
    assert {op.module for op in ops} == {"STDIO"}  # glibc's own reads and writes are not recorded twice
    assert [(op.op, op.offset, op.bytes, op.requested) for op in ops] == [
        ("fopen", -1, -1, os.O_RDWR | os.O_CREAT | os.O_TRUNC),
        ("fwrite", 0, 1000, 1000),
        ("fflush", -1, -1, -1),
        ("fseek", 0, -1, os.SEEK_SET),
        ("fread", 0, 1000, 1000),
        ("fseek", 500, -1, os.SEEK_SET),
        ("fread", 500, 100, 100),
        ("fclose", -1, -1, -1),
    ]


@pytest.mark.parametrize("build", ["native_lines", "native_lines_fortified"])
def test_character_line_and_formatted_stdio_calls_are_recorded_as_runs(
    tmp_path: Path, c_programs: Path, build: str
) -> None:
    target = tmp_path / "lines.txt"
    seen, trace = run(tmp_path, str(c_programs / build), str(target))
    assert seen == {"lines": 98, "fread": 8, "chars": "roxy", "n": 51, "scanned": 1, "w": 42, "end": -1}
    assert target.stat().st_size == 811
    ops = [op for op in trace.ops if op.path == str(target)]
    assert [(op.op, op.offset, op.bytes, op.requested, op.errno) for op in ops] == [
        ("fopen", -1, -1, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0),
        # 100 fprintf, fputs, fputc, putc and putw: one run of 104 calls
        ("stdio_write", 0, 811, 104, 0),
        ("fclose", -1, -1, -1, 0),
        ("fopen", -1, -1, os.O_RDONLY, 0),
        # 50 fgets, an fread of 8 bytes (small: it joins them), fgetc, getc, fscanf (6 bytes), 48 rows and the last
        # line by fgets, fgetc, getc, getw, and the fgetc at the end of the file, which ends the run
        ("stdio_read", 0, 811, 107, 0),
        ("fclose", -1, -1, -1, 0),
    ]  # fmt: skip
    run_of = next(op for op in ops if op.op == "stdio_read")
    assert run_of.module == "STDIO" and run_of.dur_ns > 0
    from xstack.collect.io import _span_attrs  # its span: the calls, not bytes asked for

    attrs = _span_attrs(run_of, "data")
    assert (attrs["io.calls"], attrs["io.bytes"], attrs["io.offset"]) == (107, 811, 0)
    assert "io.requested_bytes" not in attrs
    # the counters count the calls, and the bytes
    from xstack.collect._io_counters import file_counters

    (c,) = file_counters(ops)
    assert (c.writes, c.bytes_written, c.reads, c.bytes_read) == (104, 811, 107, 811)
    # printf's line went to the standard output (a pipe here): a run of one call on it
    (out,) = [op for op in trace.ops if op.fd == 1 and op.op == "stdio_write"]
    assert (out.fd_kind, out.requested, out.bytes) == ("pipe", 1, len(json.dumps(seen)) + 1)


@pytest.mark.parametrize("build", ["native_chunks", "native_chunks_fortified"])
def test_small_freads_and_fwrites_are_recorded_as_runs(tmp_path: Path, c_programs: Path, build: str) -> None:
    """gcc writes a precompiled header with millions of fwrites, most of one byte: a record each made a store of
    500 MB for a torch.compile run. An fread or fwrite under 1 KiB joins the thread's run on its stream."""
    target = tmp_path / "chunks.bin"
    seen, trace = run(tmp_path, str(c_programs / build), str(target))
    assert seen == {"wrote": 7228, "failed": 0, "read": 7229}
    assert target.stat().st_size == 7229
    ops = [op for op in trace.ops if op.path == str(target)]
    assert [(op.op, op.offset, op.bytes, op.requested, op.errno) for op in ops] == [
        ("fopen", -1, -1, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0),
        ("stdio_write", 0, 3001, 3001, 0),  # 3000 fwrites of a byte and an fputc: one run
        ("fwrite", 3001, 4096, 4096, 0),  # 4 KiB: recorded alone, as a larger call always is
        ("stdio_write", 7097, 32, 2, 0),  # two of 2 items of 8 bytes: the run's requested is its calls
        ("fflush", -1, -1, -1, 0),
        ("fwrite", 7129, 100, 100, 0),  # a run of one fwrite (the fflush ends it) is recorded as the fwrite
        ("fflush", -1, -1, -1, 0),
        ("fread", 7229, 0, 10, errno.EBADF),  # a failed call is recorded alone, as itself
        ("fclose", -1, -1, -1, 0),
        ("fopen", -1, -1, os.O_RDONLY, 0),
        ("stdio_read", 0, 4096, 4096, 0),  # a run ends at 4096 calls
        # 904 freads of a byte, then 5 of 500 bytes (short at the end) and the one at the end of the file, which
        # ends the run
        ("stdio_read", 4096, 3133, 910, 0),
        ("fclose", -1, -1, -1, 0),
    ]  # fmt: skip
    from xstack.collect._io_counters import file_counters

    (c,) = file_counters(ops)  # every call counted: Darshan's STDIO_WRITES and STDIO_READS
    assert (c.writes, c.bytes_written, c.reads, c.bytes_read) == (3005, 7229, 5006, 7229)


def test_rewind_fsetpos_and_freopen_keep_the_stream_s_position_and_path(tmp_path: Path, c_programs: Path) -> None:
    first, other = tmp_path / "first.txt", tmp_path / "other.txt"
    other.write_text("hello\n")
    seen, trace = run(tmp_path, str(c_programs / "native_reopen"), str(first), str(other))
    assert seen == {"a": "a", "d": "d", "line": "hello", "end": 1}
    assert [(op.op, op.offset, op.bytes, op.requested) for op in trace.ops if op.path == str(first)] == [
        ("fopen", -1, -1, os.O_RDWR | os.O_CREAT | os.O_TRUNC),
        ("stdio_write", 0, 6, 1),
        ("fseek", 0, -1, os.SEEK_SET),  # rewind
        ("stdio_read", 0, 1, 1),
        ("fseek", 3, -1, os.SEEK_SET),
        ("fseek", 0, -1, os.SEEK_SET),  # rewind
        ("fseek", 3, -1, os.SEEK_SET),  # fsetpos to the position fgetpos saved
        ("stdio_read", 3, 1, 1),
        ("fclose", -1, -1, -1),  # freopen closed it
    ]  # fmt: skip
    assert [(op.op, op.offset, op.bytes, op.requested) for op in trace.ops if op.path == str(other)] == [
        ("fopen", -1, -1, os.O_RDONLY), ("stdio_read", 0, 6, 2), ("fclose", -1, -1, -1),
    ]  # fmt: skip


def test_a_run_of_stdio_calls_ends_once_it_has_lasted_a_flush_interval(tmp_path: Path, c_programs: Path) -> None:
    """A line every 60 ms: a run is written once it has lasted the flush interval (100 ms), so that a thread
    writing now and then keeps none open for long (lost, were the process to exit meanwhile)."""
    slow = tmp_path / "slow.log"
    _, trace = run(tmp_path, str(c_programs / "native_lines"), str(tmp_path / "lines.txt"), str(slow))
    runs = [(op.requested, op.bytes) for op in trace.ops if op.path == str(slow) and op.op == "stdio_write"]
    assert sum(n for n, _ in runs) == 5 and sum(b for _, b in runs) == 35 and 2 <= len(runs) <= 4, runs


def test_static_binary_is_reported_not_covered(tmp_path: Path, c_programs: Path) -> None:
    static = c_programs / "native_stdio_static"
    if not static.exists():
        pytest.skip("no static libc (libc.a) to link a static test program")
    seen, trace = run(tmp_path, "spawn", str(static), str(tmp_path / "static.bin"))
    (note,) = trace.not_covered
    assert (note.pid, note.path, note.reason) == (seen["pid"], str(static), "static")
    assert "LD_PRELOAD" in note.detail
    assert not [op for op in trace.ops if op.pid == seen["pid"]]
    dynamic = c_programs / "native_stdio"
    seen, trace = run(tmp_path / "dyn", "spawn", str(dynamic), str(tmp_path / "dyn.bin"))
    assert not trace.not_covered and [op.op for op in trace.ops if op.pid == seen["pid"]][0] == "fopen"


def test_child_with_its_own_environment_is_reported_not_covered(tmp_path: Path, c_programs: Path) -> None:
    dynamic = c_programs / "native_stdio"
    seen, trace = run(tmp_path, "spawn_clean_env", str(dynamic), str(tmp_path / "env.bin"))
    assert [(n.pid, n.path, n.reason) for n in trace.not_covered] == [(seen["pid"], str(dynamic), "env")]
    assert not [op for op in trace.ops if op.pid == seen["pid"]]


def test_exec_flushes_and_the_new_program_records_under_the_same_pid(tmp_path: Path, data: Path) -> None:
    known = data / "known.bin"
    _, trace = run(tmp_path, "execs", str(known))
    before, after = sorted(trace.processes, key=lambda p: p.start_ns)
    assert before.pid == after.pid and before.end == "exec" and after.end == "exit"
    reads = [op for op in trace.ops if op.op == "read" and op.path == str(known)]
    assert [(op.bytes, op.start_ns < after.start_ns) for op in reads] == [(10, True), (30, False)]


def test_program_closing_every_descriptor_gets_no_records_in_its_files(tmp_path: Path) -> None:
    out = tmp_path / "mine.bin"
    seen, trace = run(tmp_path, "close_all", str(out))
    assert out.read_bytes() == b"a" * 100 + b"b" * 100  # the library reopened its own file instead
    (process,) = trace.processes
    assert process.clean_exit and process.write_errors == 0
    assert [(op.op, op.fd, op.bytes) for op in trace.ops if op.path == str(out)] == [
        ("open", seen["fd"], -1), ("write", seen["fd"], 100), ("write", seen["fd"], 100), ("close", seen["fd"], -1),
    ]  # fmt: skip


def test_attach_records_only_the_attached_window_and_restores_the_calls(
    tmp_path: Path, data: Path, c_programs: Path
) -> None:
    first, second, plugin_target = data / "t1.bin", data / "t2.bin", data / "t3.bin"
    io_dir = tmp_path / "io"
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", _io_native.DIR_ENV)}
    args = [str(first), str(second), str(io_dir), str(c_programs / "libxio_outer.so"), str(plugin_target)]
    proc = subprocess.run([sys.executable, str(CASES), "attach", *args], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["patched"] > 0 and seen["after"] == 0 and seen["rc"] == 0
    assert seen["plugin"] == 2000  # the plugin found its neighbour through its own RUNPATH, then read the file
    trace = read_trace(io_dir)
    (process,) = trace.processes
    assert process.mode == "attach" and process.end == "detach" and process.clean_exit
    assert [op.op for op in trace.ops if op.path == str(first)][:2] == ["open", "fstat"]
    assert ("read", 2000) in [(op.op, op.bytes) for op in trace.ops if op.path == str(first)]
    assert [(op.op, op.bytes) for op in trace.ops if op.path == str(data)] == [
        ("opendir", -1), ("readdir", seen["listed"] + 2), ("closedir", -1),
    ]  # fmt: skip
    # loaded after attach: patched by the dlopen wrapper
    assert [(op.op, op.bytes) for op in trace.ops if op.path == str(plugin_target)] == [
        ("open", -1), ("read", 2000), ("read", 0), ("close", -1),
    ]  # fmt: skip
    assert not [op for op in trace.ops if op.path == str(second)]
    assert [(note.path, note.reason) for note in trace.not_covered] == [(shutil.which("true"), "attach")]


def test_a_second_attach_restarts_every_threads_stream(tmp_path: Path, data: Path) -> None:
    known, io_dir = data / "known.bin", tmp_path / "io"
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", _io_native.DIR_ENV)}
    proc = subprocess.run([sys.executable, str(STREAM_CASES), "reattach", str(known), str(io_dir)], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    trace = read_trace(io_dir)
    reads = [(op.tid, op.bytes) for op in trace.ops if op.path == str(known) and op.op == "read"]
    assert reads == [(seen["main"], 3), (seen["other"], 1), (seen["main"], 5), (seen["main"], 6), (seen["other"], 2)]
    assert [op.op for op in trace.ops if op.path == str(known) and op.tid == seen["main"]][-2:] == ["read", "close"]
    (process,) = trace.processes
    assert len(process.files) == 2 and process.end == "detach" and process.records == len(trace.ops)


def test_vfork_children_leave_the_parents_state_alone(tmp_path: Path, c_programs: Path) -> None:
    seen, trace = run(tmp_path, str(c_programs / "native_vfork"))
    assert seen == {"done": 1}
    parent = next(p for p in trace.processes if p.exe == str(c_programs / "native_vfork"))
    mine = [op for op in trace.ops if op.pid == parent.pid]
    # the children's close(1) and dup2(2, 1) ran on the parent's memory but are neither recorded nor applied
    assert [(op.op, op.fd, op.fd_kind) for op in mine] == [("write", 1, "pipe")]
    assert len([p for p in trace.processes if p.exe.endswith("/true")]) == 3


def test_attach_in_a_preloaded_process_says_why(tmp_path: Path) -> None:
    need_library()
    code = (
        "import sys; from pathlib import Path; from xstack.collect import _io_native as n\n"
        "assert n.preloaded()\n"
        "try:\n    n.attach(Path(sys.argv[1]))\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    env = _io_native.preload_env(tmp_path / "io")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "other")], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("XstackError") and "preloaded" in proc.stdout


def test_preload_env_prepends_the_library_and_sets_the_variables(tmp_path: Path) -> None:
    need_library()
    env = _io_native.preload_env(tmp_path / "io", exclude=["/x/store.duckdb"], max_records=5,
                                 base={"LD_PRELOAD": "/opt/other.so", "PATH": "/bin"})  # fmt: skip
    assert env["LD_PRELOAD"] == f"{_io_native.library_path()}:/opt/other.so"
    assert env[_io_native.DIR_ENV] == str((tmp_path / "io").resolve()) and (tmp_path / "io").is_dir()
    assert env[_io_native.EXCLUDE_ENV] == "/x/store.duckdb" and env[_io_native.MAX_RECORDS_ENV] == "5"
    assert env["PATH"] == "/bin" and not _io_native.preloaded()
    _io_native.flush()  # not loaded in this process: nothing to do


@pytest.mark.slow
def test_torch_import_and_dataloader_workers_under_the_library(tmp_path: Path, data: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "imp.py"
    script.write_text("import torch\nprint('{\"ok\": 1}')\n")
    seen, trace = run(tmp_path / "import", sys.executable, str(script), timeout=240)
    assert seen == {"ok": 1} and trace.processes[0].clean_exit and len(trace.ops) > 1000
    seen, trace = run(tmp_path / "loader", "dataloader", str(data), timeout=240)
    assert seen == {"bytes": 10_000 + 8 * 2000}
    workers = [p for p in trace.processes if p.forked]
    assert len(workers) == 2 and {p.end for p in workers} == {"_exit"}
    read_by = {op.pid for op in trace.ops if op.path and op.path.startswith(str(data)) and op.op == "read"}
    assert read_by == {p.pid for p in workers}


def test_reader_keeps_whole_records_of_a_truncated_file(tmp_path: Path, data: Path) -> None:
    _, trace = run(tmp_path, "posix", str(data / "known.bin"), str(data / "out.bin"))
    (path,) = (tmp_path / "io").glob("*.xio")
    whole = path.read_bytes()
    ops_end = _last_ops_block_end(whole)
    # cut the last ops block inside its last record, whatever its size (32 bytes, 64 with wide values): cutting
    # 42 bytes off, meant to fall in the next-to-last record, fell in the last one when that one was wide, or in
    # the block's header when the last flush held a single record
    path.write_bytes(whole[: ops_end - 10])
    cut = read_trace(tmp_path / "io")
    assert len(cut.ops) == len(trace.ops) - 1 and cut.ops == trace.ops[: len(cut.ops)]
    assert len(cut.problems) == 1 and cut.problems[0].startswith(f"{path}: truncated")
    assert not cut.processes[0].clean_exit  # the final status block was past the cut


def test_missing_library_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_io_native, "library_path", lambda: None)
    reason = _io_native.unavailable_reason()
    assert reason is not None and "was not built" in reason and "gcc" in reason
    with pytest.raises(XstackError, match="was not built"):
        _io_native.preload_env(tmp_path / "io")
    with pytest.raises(XstackError, match="was not built"):
        _io_native.attach(tmp_path / "io")


def test_reader_rejects_a_file_that_is_not_a_record_file(tmp_path: Path) -> None:
    (tmp_path / "1-2-0.xio").write_bytes(b"PK\x03\x04 not ours")
    with pytest.raises(BadInputError, match="1-2-0.xio: not an xstack io record file"):
        read_trace(tmp_path)


def test_op_names_in_the_files_are_the_documented_ones(tmp_path: Path, data: Path) -> None:
    _, trace = run(tmp_path, "posix", str(data / "known.bin"), str(data / "out.bin"))
    (tmp_path / "out").mkdir()
    _, copies = run(tmp_path / "copies", "copies", str(data / "known.bin"), str(tmp_path / "out"))
    assert {"rename", "sendfile_read", "sendfile_write", "copy_file_range_read"} <= {op.op for op in copies.ops}
    documented = {
        "open", "openat", "creat", "close", "read", "pread", "readv", "write", "pwrite", "writev", "lseek",
        "fsync", "fdatasync", "mmap", "munmap", "stat", "lstat", "fstat", "fstatat", "statx", "dup", "fopen", "fdopen",
        "fread", "fwrite", "fclose", "fseek", "fflush", "opendir", "readdir", "closedir", "rename", "sendfile_read",
        "sendfile_write", "copy_file_range_read", "copy_file_range_write", "stdio_read", "stdio_write",
    }  # fmt: skip
    assert {op.op for op in trace.ops + copies.ops} <= documented
    assert {op.fd_kind for op in trace.ops} <= {"file", "dir", "pipe", "socket", "chr", "blk", "unknown"}


def _last_ops_block_end(data: bytes) -> int:
    """Byte offset just past the last operations block of a record file."""
    at = struct.unpack_from("<I", data, 12)[0]
    end = 0
    while at < len(data):
        kind, _count, size = struct.unpack_from("<IIQ", data, at)
        at += 16 + size
        if kind == 2:
            end = at
    return end
