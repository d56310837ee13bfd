"""Per-file counters from recorded calls, by Darshan's rules (darshan-posix.c), on hand-made call sequences."""

from __future__ import annotations

from dataclasses import dataclass

from xstack.collect._io_counters import file_counters
from xstack.trace import attrs as A


@dataclass
class Op:
    op: str
    offset: int = -1
    bytes: int = -1
    start_ns: int = 0
    dur_ns: int = 10
    path: str | None = "/data/a.bin"
    fd: int = 3
    module: str = "POSIX"
    fd_kind: str = "file"
    errno: int = 0
    pid: int = 100
    tid: int = 100
    requested: int = -1
    target: str | None = None


def _seq(*ops: Op) -> list[Op]:
    for i, op in enumerate(ops):
        op.start_ns = op.start_ns or 100 * (i + 1)
    return list(ops)


def test_whole_file_read_in_chunks_then_eof() -> None:
    ops = _seq(Op("open"), Op("read", 0, 4096), Op("read", 4096, 4096), Op("read", 8192, 100), Op("read", 8292, 0),
               Op("close"))  # fmt: skip
    (c,) = file_counters(ops)
    assert (c.opens, c.reads, c.bytes_read, c.zero_reads) == (1, 4, 8292, 1)
    # the first read after an open is neither sequential nor consecutive (Darshan's last_byte_read starts at 0)
    assert (c.seq_reads, c.consec_reads) == (3, 3)
    assert c.max_byte_read == 8291
    assert c.open_reads == 1  # the first read, from the start of the file: neither sequential nor random
    assert c.read_hist == {"1K_10K": 2, "0_100": 2}
    attrs = c.attrs()
    assert attrs[A.IO_FILE_SOURCE] == "io" and attrs[A.IO_FILE_PATH_CLASS] == "data"


def test_seeks_backwards_are_not_sequential_and_reopen_resets() -> None:
    ops = _seq(Op("open"), Op("read", 0, 10), Op("lseek", 100, -1), Op("read", 100, 10), Op("lseek", 0),
               Op("read", 0, 10), Op("close"), Op("open"), Op("read", 0, 10))  # fmt: skip
    (c,) = file_counters(ops)
    assert (c.opens, c.seeks, c.reads, c.bytes_read) == (2, 2, 4, 40)
    assert c.seq_reads == 1  # only the read at 100 (after byte 9); not the one back at 0, nor those after opens
    assert c.consec_reads == 0
    assert c.open_reads == 2  # the first read of each open; the read back at 0 after a seek is random


def test_failed_calls_are_not_counted_and_writes_switch() -> None:
    ops = _seq(Op("open"), Op("read", 0, -1, errno=9), Op("write", 0, 50), Op("read", 50, 50), Op("write", 100, 5),
               Op("fsync"))  # fmt: skip
    (c,) = file_counters(ops)
    assert (c.reads, c.writes, c.bytes_written, c.fsyncs) == (1, 2, 55, 1)
    assert c.rw_switches == 2
    assert c.max_byte_written == 104


def test_overlapping_reads_of_two_threads_count_their_time_once() -> None:
    ops = [Op("read", 0, 10, start_ns=0, dur_ns=100, tid=1), Op("read", 10, 10, start_ns=50, dur_ns=100, tid=2),
           Op("read", 20, 10, start_ns=400, dur_ns=10, tid=1)]  # fmt: skip
    (c,) = file_counters(ops)
    assert c.read_time_ns == 150 + 10


def test_records_per_process_module_and_stream() -> None:
    pipe, socket = Op("read", -1, 3, path=None, fd_kind="pipe", fd=5), Op("read", -1, 3, path=None, fd_kind="socket")
    ops = _seq(Op("read", 0, 5, pid=1), Op("read", 0, 5, pid=2), Op("fread", 0, 5, module="STDIO"), pipe, socket)
    rows = {(c.pid, c.path, c.module) for c in file_counters(ops)}
    assert rows == {(1, "/data/a.bin", "POSIX"), (2, "/data/a.bin", "POSIX"), (100, "/data/a.bin", "STDIO"),
                    (100, "<pipe>", "POSIX"), (100, "<socket>", "POSIX")}  # fmt: skip
    pipe = next(c for c in file_counters(ops) if c.path == "<pipe>")
    assert pipe.attrs()[A.IO_FILE_PATH_CLASS] == "stream"


def test_size_buckets_use_darshans_edges() -> None:
    assert [A.size_bucket(n) for n in (0, 100, 101, 1024, 1025, 10240, 10241, 1 << 20, (1 << 20) + 1)] == [
        "0_100", "0_100", "100_1K", "100_1K", "1K_10K", "1K_10K", "10K_100K", "100K_1M", "1M_4M"]  # fmt: skip
    assert A.size_bucket(1 << 40) == "1G_PLUS"


def test_a_directory_listing_is_an_open_and_metadata_time_of_the_directory() -> None:
    d = "/data/images"
    ops = _seq(Op("opendir", path=d, fd_kind="dir", dur_ns=30),
               Op("readdir", -1, 52, path=d, fd_kind="dir", dur_ns=500),
               Op("closedir", path=d, fd_kind="dir", dur_ns=20, start_ns=800))  # fmt: skip
    (c,) = file_counters(ops)
    assert (c.opens, c.reads, c.bytes_read, c.meta_time_ns, c.read_time_ns) == (1, 0, 0, 550, 0)


def test_renames_count_on_both_paths_and_the_target_keeps_its_first_source() -> None:
    tmp, final, other = "/data/.ckpt.tmp", "/data/ckpt.pt", "/data/.ckpt2.tmp"
    ops = _seq(Op("open", path=tmp), Op("write", 0, 4096, path=tmp), Op("close", path=tmp),
               Op("rename", path=tmp, target=final, dur_ns=40), Op("rename", path=other, target=final),
               Op("rename", path="/data/gone", target="/data/x", errno=2))  # fmt: skip
    rows = {c.path: c for c in file_counters(ops)}
    assert set(rows) == {tmp, final, other}  # a failed rename counts nowhere
    assert (rows[tmp].rename_sources, rows[tmp].rename_targets, rows[tmp].bytes_written) == (1, 0, 4096)
    assert rows[tmp].meta_time_ns == 10 + 10 + 40  # open, close and the rename: the source's metadata time
    target = rows[final].attrs()
    assert (target[A.IO_FILE_RENAME_SOURCES], target[A.IO_FILE_RENAME_TARGETS]) == (0, 2)
    assert target[A.IO_FILE_RENAMED_FROM] == tmp and A.IO_FILE_RENAMED_FROM not in rows[tmp].attrs()
    assert (rows[final].opens, rows[final].meta_time_ns, rows[final].first_ns) == (0, 0, 400)


def test_an_in_kernel_copy_is_a_read_of_its_source_and_a_write_of_its_destination() -> None:
    src, dst = "/data/a.bin", "/fast/a.bin"
    ops = _seq(Op("sendfile_read", 0, 8192, path=src), Op("sendfile_write", 0, 8192, path=dst, fd=4),
               Op("sendfile_read", 8192, 0, path=src))  # fmt: skip
    rows = {c.path: c for c in file_counters(ops)}
    assert (rows[src].reads, rows[src].bytes_read, rows[src].zero_reads, rows[src].writes) == (2, 8192, 1, 0)
    assert (rows[dst].writes, rows[dst].bytes_written, rows[dst].reads) == (1, 8192, 0)
    assert rows[src].read_time_ns == 20 and rows[dst].write_time_ns == 10
