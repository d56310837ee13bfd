"""Read access patterns per class of path: sequential, consecutive and random reads, zero-length and small reads."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, Final

from xstack.analyze._io_common import (
    COPY_READ_OPS,
    DATA_CLASSES,
    IO_DATA,
    IO_SPANS,
    IO_STORAGE,
    OPEN_OPS,
    READ_OPS,
    SMALL_READ_BYTES,
    IoRun,
    as_count,
    bucket_median,
    in_list,
    io_pass,
    io_run,
    parsed_once,
    small_from_hist,
    span_rows,
)
from xstack.analyze._timeline_common import notes_of, pct, rows
from xstack.analyze.context import run_context
from xstack.analyze.result import Chart, Column, Result, format_value
from xstack.trace import attrs as A
from xstack.trace.store import Store

ID = "io.pattern"
TITLE = "Read access pattern"
BUCKETS = [b[0] for b in A.IO_SIZE_BUCKETS]

_FILE_COUNTS: Final = {
    "seq": A.IO_FILE_SEQ_READS, "consec": A.IO_FILE_CONSEC_READS, "zero": A.IO_FILE_ZERO_READS,
    "open_reads": A.IO_FILE_OPEN_READS, **{f"h{i}": f'{A.IO_FILE_SIZE_READ_HIST}."{b}"' for i, b in enumerate(BUCKETS)},
}  # fmt: skip
"""The counters io.pattern sums per class, by column name, and where ``io_files.attrs`` holds them."""
_HISTOGRAM_SUMS: Final = ", ".join(f"sum(h{i})" for i in range(len(BUCKETS)))
_COUNT_COLUMNS: Final = ", ".join(
    f"coalesce(TRY_CAST(a[{i}] AS BIGINT), 0) AS {name}" for i, name in enumerate(_FILE_COUNTS, 3)
)
_OPEN_READS_AT: Final = 3 + list(_FILE_COUNTS).index("open_reads")
_FILE_PARSED: Final = parsed_once(
    [f"$.{k}" for k in (A.IO_FILE_PATH_CLASS, A.IO_FILE_SIZE_READ_HIST, *_FILE_COUNTS.values())]
)  # a[1], a[2], then the counters from a[3]
_FROM_FILES = f"""
WITH f AS (  -- each row's counters, its JSON parsed once (not once per counter: 16 times)
    SELECT reads, coalesce(a[1], 'unknown') AS class, a[2] IS NOT NULL AS has_hist,
        a[{_OPEN_READS_AT}] IS NOT NULL AS has_open_reads, {_COUNT_COLUMNS}
    FROM (SELECT reads, {_FILE_PARSED} AS a FROM io_files WHERE run_id = $run)
)
SELECT class, sum(reads), sum(seq), sum(consec), sum(zero), sum(zero) FILTER (WHERE has_hist), sum(open_reads),
    count(*) FILTER (WHERE NOT has_open_reads), {_HISTOGRAM_SUMS}
FROM f WHERE class NOT IN ('stream', 'ipc') GROUP BY 1 HAVING sum(reads) > 0 ORDER BY 2 DESC, 1
"""

_SPAN_READS = f"""
SELECT {{key}} AS class, count(*), count(*) FILTER (WHERE nbytes > 0 AND nbytes < {SMALL_READ_BYTES}),
    median(nbytes) FILTER (WHERE nbytes > 0), sum(dur_ns) FILTER (WHERE nbytes = 0), sum(dur_ns),
    sum(dur_ns) FILTER (WHERE nbytes = 0 AND {{warm}}), sum(dur_ns) FILTER (WHERE {{warm}}),
    count(*) FILTER (WHERE nbytes = 0 AND name IN {in_list(COPY_READ_OPS)}),
    sum(dur_ns) FILTER (WHERE nbytes = 0 AND name IN {in_list(COPY_READ_OPS)})
FROM {IO_SPANS} WHERE run_id = $run AND name IN {in_list(READ_OPS)} AND nbytes IS NOT NULL AND {IO_STORAGE}
GROUP BY 1
"""

_SHUFFLED = f"""
WITH ev AS (  -- the path's 64-bit hash, not its text, partitions the windows: a fifth less memory (650,000 reads)
    SELECT pid, hash(path) AS path, start_ns, span_id, name IN ('open', 'openat', 'creat', 'fopen') AS is_open, off,
        nbytes
    FROM {IO_SPANS} WHERE run_id = $run
        AND (name IN ('open', 'openat', 'creat', 'fopen') OR (name IN {in_list(READ_OPS)} AND nbytes > 0))
        AND {IO_DATA} AND path IS NOT NULL
),
numbered AS (  -- each read with the number of the open it was made in
    SELECT *, sum(CASE WHEN is_open THEN 1 ELSE 0 END)
        OVER (PARTITION BY pid, path ORDER BY start_ns, span_id ROWS UNBOUNDED PRECEDING) AS opened
    FROM ev
),
r AS (
    SELECT off, opened, lag(off + nbytes - 1) OVER w AS prev_end, lag(opened) OVER w AS prev_opened
    FROM numbered WHERE NOT is_open
    WINDOW w AS (PARTITION BY pid, path ORDER BY start_ns, span_id)
)
SELECT count(*), count(*) FILTER (WHERE off <> prev_end + 1) FROM r
WHERE off > 0 AND prev_end IS NOT NULL AND opened <> prev_opened
"""
"""Data-file reads (io spans) that start inside their file and follow an earlier read of it, made in an earlier
open, in their process: how many, and how many of them start elsewhere than that read ended. A read that goes
back over what the same open read (``np.load`` reads a ``.npy``'s header page, then the array from past its
header again) is neither."""

SQLITE_COUNTER_OFFSET, SQLITE_COUNTER_BYTES = 24, 16
"""Where a SQLite database file holds its change counter, which SQLite reads at the start of each read
transaction (in its default rollback-journal mode) to know whether its page cache is still good."""

_SMALL_FILE_READS = f"""
WITH r AS (
    SELECT path, coalesce(off, 0) AS off, nbytes FROM {IO_SPANS}
    WHERE run_id = $run AND name IN {in_list(READ_OPS)} AND nbytes > 0 AND {IO_DATA} AND path IS NOT NULL
),
extent AS (SELECT path, max(off + nbytes) AS size FROM r GROUP BY path)
SELECT count(*) FROM r JOIN extent USING (path) WHERE r.nbytes < {SMALL_READ_BYTES} AND extent.size < {SMALL_READ_BYTES}
"""
"""The small data-file reads (io spans) of files smaller than a page, as far as their reads reached: reads that
cannot be larger, whose files are ``io.small_files``' concern."""

_SQLITE_CHECKS = f"""
SELECT count(*), mode(path) FROM {IO_SPANS}
WHERE run_id = $run AND name IN ('pread', 'pread64') AND {IO_DATA} AND nbytes = {SQLITE_COUNTER_BYTES}
    AND off = {SQLITE_COUNTER_OFFSET}
"""
"""SQLite's reads of a database's change counter (16 bytes at offset 24, read at the start of every read
transaction, each query made outside one) from the io spans, and the file of most of them."""

_SUFFIXES = f"""
WITH per_path AS (
    SELECT path, count(*) FILTER (WHERE nbytes = 0) AS zero,
        count(*) FILTER (WHERE nbytes > 0 AND nbytes < {SMALL_READ_BYTES}) AS small
    FROM {IO_SPANS}
    WHERE run_id = $run AND name IN {in_list(READ_OPS)} AND name NOT IN {in_list(COPY_READ_OPS)} AND {IO_DATA}
        AND path IS NOT NULL
    GROUP BY 1
)
SELECT lower(regexp_extract(path, '(\\.[A-Za-z0-9]+)$', 1)) AS suffix, sum(zero), sum(small) FROM per_path
GROUP BY 1 HAVING suffix <> ''
"""
"""Per suffix (``.jpg``) of the data files, their zero-length reads that moved no data in the kernel (an in-kernel
copy's end) and their small reads: whose reader reads so (an image decoder reads until ``read()`` returns nothing,
``torch.load`` reads an archive record by record). The suffix is taken once per file."""

_PIECES = f"""
r AS (
    SELECT path, off AS s, nbytes, dur_ns FROM {IO_SPANS}
    WHERE run_id = $run AND name IN {in_list(READ_OPS)} AND nbytes > 0 AND {IO_DATA} AND path IS NOT NULL
        AND off >= 0
),
starts AS (  -- one row per file and offset, the furthest end of the reads from there: both windows below then
            -- order the rows alike (reads of one range, which they ordered each as it pleased, were counted twice)
    SELECT path, s, max(s + nbytes) AS e FROM r GROUP BY path, s
),
ordered AS (
    SELECT path, s, e,
        max(e) OVER (PARTITION BY path ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reached
    FROM starts
),
runs AS (  -- the byte ranges read, overlapping ones joined
    SELECT path, s, e, sum(CASE WHEN reached IS NULL OR s > reached THEN 1 ELSE 0 END)
        OVER (PARTITION BY path ORDER BY s ROWS UNBOUNDED PRECEDING) AS piece
    FROM ordered
),
pieces AS (SELECT path, min(s) AS s, max(e) AS e FROM runs GROUP BY path, piece)
"""
"""CTEs of the data-file reads (``r``) and the byte ranges they read (``pieces``, overlapping ones joined)."""

_REREAD = f"""
WITH {_PIECES},
covered AS (SELECT path, sum(e - s) AS nbytes, max(e) AS end_at FROM pieces GROUP BY path),
per_file AS (SELECT path, sum(nbytes) AS nbytes, sum(dur_ns) AS ns FROM r GROUP BY path)
SELECT f.path, f.nbytes, c.nbytes, f.ns, c.end_at FROM per_file f JOIN covered c USING (path)
"""
"""Per data file, from the io spans of its reads: the bytes read, the distinct bytes they cover (each byte read
counted once, whichever process read it), the time they took and the furthest byte any reached (its size, as far
as the reads tell)."""


def read_whole(store: Store, run_id: int) -> tuple[dict[str, tuple[int, int]], int] | None:
    """The data files run ``run_id`` read whole, ``SHARED_WHOLE`` of the bytes from their first to the furthest any
    read reached, by path, with the bytes read of each and that extent; and the bytes read of every data file. None
    where the run has no io spans."""
    io = io_run(store, run_id)
    if not io.has_spans:
        return None
    files = span_rows(store, _REREAD, io.run_id)
    whole = {str(f[0]): (int(f[1]), int(f[4])) for f in files if f[2] >= SHARED_WHOLE * f[4]}
    return whole, sum(int(f[1]) for f in files)


def _reading_opens(where: str) -> str:
    """SQL of the CTEs up to ``firsts``: for each open of a file that read it (``where`` picks the spans: a path, or
    the data files), by file and process, the offset its first read began at and the bytes its reads moved."""
    return f"""
WITH ev AS (
    SELECT path, pid, start_ns, span_id, name IN ('open', 'openat', 'creat', 'fopen') AS is_open, off, nbytes
    FROM {IO_SPANS} WHERE run_id = $run AND {where}
        AND (name IN ('open', 'openat', 'creat', 'fopen') OR (name IN {in_list(READ_OPS)} AND nbytes > 0))
),
numbered AS (
    SELECT *, sum(CASE WHEN is_open THEN 1 ELSE 0 END)
        OVER (PARTITION BY path, pid ORDER BY start_ns, span_id ROWS UNBOUNDED PRECEDING) AS opened
    FROM ev
),
firsts AS (SELECT path, pid, opened, arg_min(off, start_ns) AS off, sum(nbytes) AS nbytes FROM numbered
           WHERE NOT is_open AND opened > 0 GROUP BY path, pid, opened)"""


_OPENS_READ = (
    _reading_opens("path = $path")
    + """,
common AS (SELECT off, count(*) AS n FROM firsts GROUP BY off ORDER BY n DESC, off LIMIT 1)
SELECT count(*), count(*) FILTER (WHERE off = 0), (SELECT n FROM common), (SELECT off FROM common) FROM firsts
"""
)
"""The opens of one file that read it, how many of them began reading at its first byte, and at the offset most of
them began at (a zip archive's end, where its index is), how many and which."""

_MAPPED_PATH = f"SELECT count(*) FROM {IO_SPANS} WHERE run_id = $run AND name = 'mmap' AND path = $path"
"""The mappings of one file into memory."""

_FILES_REOPENED = (
    _reading_opens(f"{IO_DATA} AND path IS NOT NULL")
    + """,
per_file AS (SELECT path, count(*) AS opens, bool_and(off = 0) AS from_start, avg(nbytes) AS nbytes FROM firsts
             GROUP BY path),
again AS (SELECT * FROM per_file WHERE from_start AND opens >= $opens)
SELECT (SELECT count(*) FROM per_file), (SELECT count(*) FROM again), (SELECT avg(opens) FROM again),
    (SELECT avg(nbytes) FROM again)
"""
)
"""Over the data files: how many were read, and how many of those were read in ``$opens`` opens or more, each
beginning to read it at its first byte (a loader that opens each file again to parse its header), with their
reading opens and the bytes an open read, on average."""

_READ_BY_PROCESS = f"""
SELECT path, pid, sum(nbytes) FROM {IO_SPANS}
WHERE run_id = $run AND name IN {in_list(READ_OPS)} AND nbytes > 0 AND {IO_DATA} AND path IS NOT NULL
    AND pid IS DISTINCT FROM $main AND NOT list_contains($helpers, pid)
GROUP BY 1, 2
"""
"""The bytes each worker process (not the main one, nor a helper) read of each data file."""

_LIFETIMES = f"""
SELECT pid, min(start_ns), max(start_ns + dur_ns) FROM {IO_SPANS} WHERE run_id = $run GROUP BY pid
"""
"""Each process's first and last recorded call: when it lived, as far as the io level saw it."""

_OFFSET_MOVES: Final = ("read", "readv", "fread", "stdio_read", "write", "writev", "fwrite", "stdio_write", "fseek")
"""Calls that move a descriptor's file offset (``lseek`` too, but for a ``SEEK_CUR`` one, mostly a tell)."""
_OFFSET_READS: Final = ("read", "readv", "fread", "stdio_read")
"""Calls that read at a descriptor's file offset."""

_INHERITED_CALLS = f"""
ev AS (
    SELECT pid, fd, path, name, start_ns, span_id, requested, nbytes, off FROM {IO_SPANS}
    WHERE run_id = $run AND {IO_DATA} AND path IS NOT NULL AND NOT failed AND pid IS DISTINCT FROM $main
),
opens AS (SELECT pid, fd, start_ns, span_id FROM ev WHERE fd >= 0 AND name IN {in_list(OPEN_OPS)}),
first_open AS (  -- each descriptor's first open in its process (the lowest span id of those at its time)
    SELECT o.pid, o.fd, o.start_ns, min(o.span_id) AS span_id FROM opens o
    JOIN (SELECT pid, fd, min(start_ns) AS start_ns FROM opens GROUP BY pid, fd) f USING (pid, fd, start_ns)
    GROUP BY o.pid, o.fd, o.start_ns
),
inherited AS (  -- the calls on a descriptor before any open of it by their process: one it inherited
    SELECT ev.* FROM ev LEFT JOIN first_open f ON ev.pid = f.pid AND ev.fd = f.fd
    WHERE ev.fd >= 0 AND (f.start_ns IS NULL OR ev.start_ns < f.start_ns
                          OR (ev.start_ns = f.start_ns AND ev.span_id < f.span_id))
)"""
"""The CTEs ``ev`` (the successful calls on data files of the processes other than the main one, whose data files
it opened itself) and ``inherited`` (those made on a descriptor their process did not open: one a fork child
inherited, opened before the DataLoader's workers started)."""

_SHARED_OFFSET = f"""
WITH {_INHERITED_CALLS},
moves AS (
    SELECT pid, fd, path, name, start_ns, span_id FROM inherited
    WHERE name IN {in_list(_OFFSET_MOVES)} OR (name IN ('lseek', 'lseek64') AND requested <> 1)
),
life AS (SELECT pid, min(start_ns) AS s, max(start_ns + dur_ns) AS e FROM {IO_SPANS} WHERE run_id = $run
         GROUP BY pid),
movers AS (SELECT DISTINCT m.path, m.fd, m.pid, l.s, l.e FROM moves m JOIN life l USING (pid)),
together AS (  -- the movers that lived at once with another mover of the same descriptor
    SELECT DISTINCT a.path, a.fd, a.pid FROM movers a JOIN movers b
        ON a.path = b.path AND a.fd = b.fd AND a.pid <> b.pid AND a.s < b.e AND b.s < a.e
),
ordered AS (
    SELECT m.*, lag(pid) OVER (PARTITION BY m.path, m.fd ORDER BY start_ns, span_id) AS before
    FROM moves m WHERE (path, fd) IN (SELECT path, fd FROM together)
)
SELECT o.path, o.fd, (SELECT count(*) FROM together t WHERE t.path = o.path AND t.fd = o.fd),
    count(*) FILTER (WHERE name IN {in_list(_OFFSET_READS)}),
    count(*) FILTER (WHERE name IN {in_list(_OFFSET_READS)} AND before IS NOT NULL AND before <> o.pid
                     AND o.start_ns <= l.e)
FROM ordered o LEFT JOIN life l ON l.pid = o.before GROUP BY o.path, o.fd ORDER BY 4 DESC, o.path LIMIT 1
"""
"""The data file of most reads through one descriptor that two processes or more, alive at once, inherited and
moved the offset of: the file, the descriptor, those processes, the reads at its offset, and those of the reads
that started after another process, still alive, had moved it since the reading one last did (each such read
took its bytes from where the other process left the offset). The workers a DataLoader starts anew at each epoch
inherit the descriptor one generation after the other: they share no offset at once."""

SQLITE_SUFFIXES: Final = (".db", ".sqlite", ".sqlite3", ".db3")
"""Suffixes of SQLite database files."""
HDF5_SUFFIXES: Final = (".h5", ".hdf5", ".hdf", ".he5", ".nc", ".nc4")
"""File names that say HDF5 (netCDF-4 files are HDF5 files)."""


def _named(suffixes: tuple[str, ...]) -> str:
    return " OR ".join(f"lower(path) LIKE '%{x}'" for x in suffixes)


def _inherited_reads(kind: str) -> str:
    """The file of ``kind`` (the CTE of that name: its paths) of most reads that processes other than the main one
    made through a descriptor they inherited: the file, the descriptor, the processes and their reads."""
    return f"""
WITH {_INHERITED_CALLS},
reads AS (SELECT * FROM inherited WHERE name IN {in_list(READ_OPS)}),
{kind}
SELECT path, any_value(fd), count(DISTINCT pid), count(*) FROM reads WHERE path IN (SELECT path FROM chosen)
GROUP BY path ORDER BY 4 DESC, path LIMIT 1
"""


_INHERITED_SQLITE = _inherited_reads(f"""chosen AS (
    SELECT path FROM reads GROUP BY path
    HAVING bool_or(nbytes = {SQLITE_COUNTER_BYTES} AND off = {SQLITE_COUNTER_OFFSET} AND name IN ('pread', 'pread64'))
        OR bool_or({_named(SQLITE_SUFFIXES)})
)""")
"""The SQLite database (a ``.db`` file, or one read at its change counter as SQLite does) of most reads that
processes other than the main one made through a descriptor they inherited: a connection opened before the
DataLoader's workers forked, which they query. The file, the descriptor, the processes and their reads."""

_INHERITED_HDF5 = _inherited_reads(f"chosen AS (SELECT DISTINCT path FROM reads WHERE {_named(HDF5_SUFFIXES)})")
"""The HDF5 file (by its name) of most reads that processes other than the main one made through a descriptor they
inherited: an ``h5py.File`` opened before the DataLoader's workers forked, which they read through. The file, the
descriptor, the processes and their reads."""

WHOLE_SHARE: Final = 0.8
"""Share of a file's bytes (those its reads cover) that its opens read on average, from which a file opened and
read from its start again and again is read whole each time (a labels file), not opened for each item (an
HDF5 file whose metadata each open reads)."""
REREAD_WHOLE_MIN: Final = 8
"""How many opens of a file must begin reading it at one place (and eight in ten of those that read it) for it to
be opened again and again (``reread_kind``)."""

SHARED_WHOLE: Final = 0.8
"""The share of a data file's bytes (those its reads cover) a worker must read for it to have read it whole."""

REREAD_PER_EPOCH: Final = 2.0
"""How many times the bytes of data files must be read, per pass over the data the DataLoaders began, for
``io.pattern`` to find them read over again."""
REREAD_MIN_BYTES: Final = 4 * 2**20
"""The fewest bytes read again, beyond one read per pass over the data, for that finding."""

SHUFFLED_MIN_READS = 100
"""The fewest such reads for ``io.pattern`` to say that a file's records were read in shuffled order."""


def read_shuffled(after: int, jumped: int) -> bool:
    """Whether a run's data-file reads are records read in shuffled order: ``SHUFFLED_MIN_READS`` or more of them
    followed an earlier read of their file (``after``), and half of those or more started elsewhere than it ended
    (``jumped``)."""
    return after >= SHUFFLED_MIN_READS and 2 * jumped >= after


COLUMNS = [
    Column("class", help="where the files live: data, python, system, unknown"),
    Column("reads", "count"),
    Column("consecutive", "pct", "reads that started right at the previous read's end"),
    Column("sequential, not consecutive", "pct", "reads that started past the previous read's end"),
    Column(
        "first after an open",
        "pct",
        "reads that were the first after an open, from the start of the file (a "
        "file read whole in one read is one): neither sequential nor consecutive by Darshan's rule; unknown "
        "for a Darshan log, which counts them as random",
    ),
    Column(
        "random",
        "pct",
        "the other reads: backwards, or elsewhere than past the last one (with the first "
        "after an open where those are unknown)",
    ),
    Column("zero reads", "count", "reads that returned no bytes (end of file)"),
    Column("zero share", "pct"),
    Column("sized reads", "count", "reads of known size, the base of the small share and the median"),
    Column("small reads", "count", f"reads of 1 to {SMALL_READ_BYTES - 1} bytes"),
    Column("small share", "pct", "of the sized reads"),
    Column("median read", "bytes", "median bytes a sized read returned, zero-length reads left out"),
]


def access_pattern(store: Store, run_id: int) -> Result:
    """Per class of path (data, python, system, unknown): reads (count), consecutive, sequential-only and random shares
    (%), zero-length and small reads (count and %), and the median read size (bytes).

    Notes: Darshan's counters from ``io_files``: consecutive reads start at the byte after the previous read's last,
    sequential ones anywhere after it (consecutive reads are sequential too); the first read after an open, from the
    start of the file, is neither: it is counted apart (``open_reads``, fact ``open_read_pct``), as Darshan does not
    (a Darshan log's runs count it as random), so that files read whole in one read each do not read as random
    access; random = reads - sequential - first after an open. Zero-length reads return nothing at the end of a file
    (tf-Darshan found half the reads of an input-bound ImageNet run were these; Python's ``f.read()`` makes one per
    file read whole), and with io spans the time they took is a fact (``zero_read_ns``, of ``read_ns`` in all
    data-file reads; ``zero_read_warmup_ns`` the part in the warm-up iterations, ``RunContext.in_warmup``; of them,
    ``zero_copy_reads`` and ``zero_copy_read_ns`` ended in-kernel copies, ``sendfile`` or ``copy_file_range``, whose
    loop, ``shutil.copyfile``'s, asks once more to find the end of the file). Small reads return 1 to 4095 bytes;
    with io spans, fact ``small_reads_small_files`` counts those of files smaller than a page as far as their reads
    reached, which could not be larger, and ``sqlite_change_reads`` those that read a SQLite database's change
    counter (``pread`` of 16 bytes at offset 24, made at the start of every read transaction: every query outside
    one), most of them of ``sqlite_path``; ``zero_read_suffix`` is the suffix of the data files of most
    zero-length reads (``.jpg``: an image decoder reading until EOF), ``zero_read_suffix_reads`` their count, and
    ``small_read_suffix``, ``small_read_suffix_reads`` the same of the small reads (``.pt``: ``torch.load``).
    Facts ``shared_offset_*``: a data file that two processes or more read through one descriptor they inherited
    (opened before a DataLoader's workers forked), sharing its file offset: ``path``, ``fd``, ``processes``,
    ``reads`` at that offset and ``races``, the reads that started after another process had moved it since the
    reading one last did (they read from where the other left it). Facts ``forked_sqlite_*``: a SQLite database
    that processes other than the main one read through a descriptor they inherited, a connection opened before the
    workers forked (``path``, ``fd``, ``processes``, ``reads``); facts ``forked_hdf5_*`` the same of an HDF5 file
    (by its name, ``HDF5_SUFFIXES``): an ``h5py.File`` opened before the workers forked. The
    small reads, their share and the median read size come from one source, and their share is of the reads that
    source sized (``sized reads``, fact ``sized_reads``, source
    ``small_reads_source``): the ``io`` spans when the run has them, counted exactly (a Darshan log's DXT traces
    only some modules, POSIX but not STDIO, so its spans may hold fewer reads than the counters); else Darshan's
    size buckets, estimated (the 1K-10K bucket taken as spread evenly, the median interpolated in its bucket), of
    the reads the buckets hold (STDIO keeps none). The median leaves out zero-length reads (they are counted apart):
    it is the size of the reads that returned data. Pipes and sockets are left out. The facts are over the data
    files (classes data and unknown). A merged run's reads are counted and sized over its io pass (its own io
    spans are one iteration's), their times (``zero_read_ns``, ``read_ns``) its merged iteration's.
    """
    io = io_run(store, run_id)
    if (lacking := io.lacking(ID, TITLE)) is not None:
        return lacking
    per_class = {str(r[0]): r for r in rows(store, _FROM_FILES, io.run_id)}
    exact, counted_in = _span_reads(store, io), io.run_id
    if io.ctx.pass_name == "merged" and (found := io_pass(store, io.ctx.config)) is not None:
        # the merged run's spans are one iteration's, too few to size its reads (the small-reads rule needs 100):
        # counted and sized over the io pass, as its io_files counters are; their times stay the merged iteration's
        counted_in, whole = found[0], _span_reads(store, io_run(store, found[0]))
        exact = {cls: (*r[:3], *(exact[cls][3:] if cls in exact else (0,) * 6)) for cls, r in whole.items()}
    table = [_row(cls, r, exact.get(cls)) for cls, r in per_class.items()]
    data_spans = exact.get("data files")
    data = _data_row(per_class, data_spans)
    source = ("DXT" if io.source == "darshan" else "io spans") if data_spans else "size buckets"
    facts: dict[str, Any] = {
        "reads": data[1],
        "consecutive_pct": data[2],
        "sequential_pct": None if data[2] is None else data[2] + data[3],
        "open_read_pct": data[4],
        "random_pct": data[5],
        "zero_reads": data[6],
        "zero_read_pct": data[7],
        "sized_reads": data[8],
        "small_reads": data[9],
        "small_read_pct": data[10],
        "median_read_bytes": data[11],
        "small_reads_exact": bool(data_spans),
        "small_reads_source": source,
        # the time the zero-length reads took, and all the data-file reads, where the run has io spans
        "zero_read_ns": data_spans[3] if data_spans else None,
        "zero_read_warmup_ns": data_spans[5] if data_spans else None,
        "read_ns": data_spans[4] if data_spans else None,
        "read_warmup_ns": data_spans[6] if data_spans else None,
        # of the zero-length reads, those that ended an in-kernel copy (shutil.copyfile's sendfile loop)
        "zero_copy_reads": data_spans[7] if data_spans else None,
        "zero_copy_read_ns": data_spans[8] if data_spans else None,
    }
    if io.has_spans:
        facts["small_reads_small_files"] = as_count(span_rows(store, _SMALL_FILE_READS, counted_in)[0][0])
        checks, db = span_rows(store, _SQLITE_CHECKS, counted_in)[0]
        facts |= {"sqlite_change_reads": as_count(checks), "sqlite_path": db}
        count_io = io_run(store, counted_in) if counted_in != io.run_id else io
        shared = span_rows(store, _SHARED_OFFSET, counted_in, main=count_io.main_pid)
        path, fd, procs, reads, races = shared[0] if shared else (None, None, 0, 0, 0)
        facts |= {"shared_offset_path": path, "shared_offset_fd": fd, "shared_offset_processes": as_count(procs),
                  "shared_offset_reads": as_count(reads), "shared_offset_races": as_count(races)}  # fmt: skip
        forked = span_rows(store, _INHERITED_SQLITE, counted_in, main=count_io.main_pid)
        db_path, db_fd, db_procs, db_reads = forked[0] if forked else (None, None, 0, 0)
        facts |= {"forked_sqlite_path": db_path, "forked_sqlite_fd": db_fd,
                  "forked_sqlite_processes": as_count(db_procs), "forked_sqlite_reads": as_count(db_reads)}  # fmt: skip
        forked = span_rows(store, _INHERITED_HDF5, counted_in, main=count_io.main_pid)
        h5_path, h5_fd, h5_procs, h5_reads = forked[0] if forked else (None, None, 0, 0)
        facts |= {"forked_hdf5_path": h5_path, "forked_hdf5_fd": h5_fd,
                  "forked_hdf5_processes": as_count(h5_procs), "forked_hdf5_reads": as_count(h5_reads)}  # fmt: skip
        suffixes = span_rows(store, _SUFFIXES, counted_in)
        for key, i in (("zero_read", 1), ("small_read", 2)):  # the suffix of the most such reads, first on a tie
            top = min(suffixes, key=lambda r: (-as_count(r[i]), str(r[0])), default=None)
            top = top if top is not None and as_count(top[i]) > 0 else None
            facts |= {f"{key}_suffix": None if top is None else top[0],
                      f"{key}_suffix_reads": 0 if top is None else as_count(top[i])}  # fmt: skip
    shuffled = _shuffled(store, io, facts)  # adds its facts
    reread = _reread(store, io, facts)  # adds its facts
    return Result(
        ID,
        TITLE,
        COLUMNS,
        table,
        notes=notes_of(access_pattern),
        run_id=io.run_id,
        chart=Chart(
            "stacked",
            x="class",
            y=("consecutive", "sequential, not consecutive", "first after an open", "random"),
            title="Reads by pattern (% of each class's reads)",
        ),  # fmt: skip
        facts=facts,
        labels=_labels(facts, source, bool(per_class)) + shuffled + reread,
    )


def _shuffled(store: Store, io: IoRun, facts: dict[str, Any]) -> list[str]:
    """A label for records read in shuffled order, one open (and seek) each, from one file: Darshan's counters
    start over at each open, so each such read is sequential there (it starts past byte 0) and the table shows no
    random reads; the io spans, across opens, show the jumps. Facts ``reads_after_earlier``, ``jumped_reads``."""
    if not io.has_spans:
        return []
    after, jumped = (as_count(v) for v in span_rows(store, _SHUFFLED, io.run_id)[0])
    facts |= {"reads_after_earlier": after, "jumped_reads": jumped}
    if not read_shuffled(after, jumped) or (facts["random_pct"] or 0) >= 10:
        return []
    return [
        f"data files: {jumped:,} of the {after:,} reads inside a file that followed an earlier read of it "
        f"({pct(jumped, after):.0f}%) started elsewhere than that read ended, each in an open of its own: records read "
        "in shuffled order, which Darshan's counters, starting over at each open, count as sequential"
    ]


def _reread(store: Store, io: IoRun, facts: dict[str, Any]) -> list[str]:
    """A label for data files read over again: more than ``REREAD_PER_EPOCH`` times the bytes their reads cover per pass
    over the data that the program's DataLoaders began (``iterated``, an epoch each), by at least ``REREAD_MIN_BYTES``.
    Items read from an HDF5 file in shuffled order each pull in the whole chunk that holds them; a reader that reads
    ahead past the item (a buffer larger than the record) reads the next records again for their own items. Facts
    ``reread_bytes`` (read beyond the bytes covered, an epoch's worth each pass), ``reread_ns`` and ``reread_warmup_ns``
    (the run's data-file read time, ``read_ns``, and that of its warm-up iterations, ``read_warmup_ns``, in that
    proportion: a merged run's is its merged iteration's), ``read_covered_bytes``, ``read_epochs`` (None where no
    DataLoader was seen: then no finding), ``reread_path`` (the file read again most, the first name on a tie),
    ``reread_covered`` (the bytes of it its reads cover), ``reread_times`` (how many times its bytes were read),
    ``reread_opens`` (the opens of it that read it), ``reread_same_start`` and ``reread_first_offset`` (how many of
    those began at the offset most of them began at, and which: a zip archive's end, where its index is),
    ``reread_kind`` (``_reread_kind``; ``reopened``, not ``whole``, for a file also mapped into memory, whose reads
    cover its header alone: ``reread_mapped``) and ``reread_from_start`` (how many of those began at its first byte: a
    file read
    whole again and again, as a labels file that each item loads, opens it for each, and so does a file opened for each
    item, whose header each open reads). Where no one file is read again and again, but most data files
    (``REREAD_WHOLE_MIN`` at least) are each read from their start in two opens or more per pass, ``reread_kind`` is
    ``reloaded`` (a loader that opens each file again to parse its header: ``np.load(path, mmap_mode='r')``), with
    ``reread_files`` (those files), ``reread_opens_per_file`` (their reading opens per pass, on average) and
    ``reread_open_bytes`` (the bytes an open read, on average). A merged run's bytes are its io pass's, over the
    pass."""
    if not io.has_spans or facts["read_ns"] is None:
        return []
    found = io_pass(store, io.ctx.config) if io.ctx.config.get("merge") else None
    run, config = (found[0], run_context(store, found[0]).config) if found else (io.run_id, io.ctx.config)
    loaders = [e for e in config.get(A.CONFIG_DATALOADERS) or [] if isinstance(e, dict)]
    epochs = sum(int(e.get("iterated") or 0) for e in loaders) or None
    files = span_rows(store, _REREAD, run)
    facts |= _shared(store, io_run(store, run) if found else io, {str(f[0]): int(f[2] or 0) for f in files})
    read, covered, ns = (sum(int(f[i] or 0) for f in files) for i in (1, 2, 3))
    again = max(read - covered * (epochs or 1), 0)
    top = min(files, key=lambda f: (int(f[2]) - int(f[1]), str(f[0])), default=None)  # the first name on a tie
    share = again / read if read else 0.0  # of the bytes read: the run's own data-file read time in proportion
    facts |= {
        "read_covered_bytes": covered, "read_epochs": epochs, "reread_bytes": again,
        "reread_ns": round((facts["read_ns"] or 0) * share),
        "reread_warmup_ns": round((facts["read_warmup_ns"] or 0) * share),
        "reread_path": None if top is None else str(top[0]),
        "reread_covered": None if top is None else int(top[2]),
        "reread_times": None if top is None else round(int(top[1]) / int(top[2]), 1),
        "reread_opens": None,
        "reread_from_start": None,
        "reread_same_start": None,
        "reread_first_offset": None,
        "reread_kind": None,
        "reread_mapped": None,
        "reread_files": None,
        "reread_opens_per_file": None,
        "reread_open_bytes": None,
    }  # fmt: skip
    if top is None or epochs is None or read < REREAD_PER_EPOCH * epochs * covered or again < REREAD_MIN_BYTES:
        facts["reread_bytes"] = facts["reread_ns"] = facts["reread_warmup_ns"] = 0
        return []
    opens, from_start, same, first = span_rows(store, _OPENS_READ, run, path=str(top[0]))[0]
    opens, from_start, same = as_count(opens), as_count(from_start), as_count(same)
    kind = _reread_kind(opens, from_start, same, int(top[1]), int(top[2]))
    # a file its reads cover whole but that is mapped too: they read its header, and the rest is mapped, not read
    # (np.load(path, mmap_mode='r') for each item read 4 KiB of a 20 MiB token file and mapped it, 9,920 times)
    mapped = kind == "whole" and bool(span_rows(store, _MAPPED_PATH, run, path=str(top[0]))[0][0])
    kind = "reopened" if mapped else kind
    facts |= {"reread_opens": opens, "reread_from_start": from_start, "reread_same_start": same,
              "reread_first_offset": first, "reread_kind": kind, "reread_mapped": mapped}  # fmt: skip
    if kind is None:  # no one file read again and again: each file, read from its start in two opens or more a pass
        read_files, files, per_file, each = span_rows(store, _FILES_REOPENED, run, opens=2 * epochs)[0]
        if as_count(files) >= REREAD_WHOLE_MIN and as_count(files) >= 0.8 * as_count(read_files):
            facts |= {"reread_kind": "reloaded", "reread_files": as_count(files), "reread_open_bytes": float(each),
                      "reread_opens_per_file": round(float(per_file) / epochs, 1)}  # fmt: skip
    passes = f"{epochs:,} pass{'es' if epochs > 1 else ''} over the data begun"
    return [
        f"data files: {format_value(read, 'bytes')} read from {format_value(covered, 'bytes')} of them "
        f"({read / covered:.1f} times, with {passes}); most from {PurePosixPath(str(top[0])).name} "
        f"({facts['reread_times']:g} times its bytes read)"
    ]


def _reread_kind(opens: int, from_start: int, same: int, read: int, covered: int) -> str | None:
    """How a file read over again was read (``reread_kind``), from the opens of it that read it, those that began
    at its first byte, those that began where most did, the bytes read and the bytes those reads cover: ``whole``
    (opened again and again, and read whole from its start each time: a labels file each item loads),
    ``reopened`` (opened for each item, each open reading its header from its start: ``h5py.File`` in
    ``__getitem__``), ``indexed`` (opened for each item, each open beginning at one place elsewhere: a zip
    archive's central directory at its end), or None (read again within its opens: reads larger than their
    items)."""
    if from_start >= REREAD_WHOLE_MIN and from_start >= 0.8 * opens:
        return "whole" if opens and read / opens >= WHOLE_SHARE * covered else "reopened"
    if same >= REREAD_WHOLE_MIN and same >= 0.8 * opens:
        return "indexed"
    return None


def _shared(store: Store, io: IoRun, covered: dict[str, int]) -> dict[str, Any]:
    """The data files that two worker processes or more each read whole (``SHARED_WHOLE`` of the bytes its reads
    cover): facts ``shared_files``, ``shared_readers`` (the most workers that read one whole), ``shared_path`` (the
    largest), ``shared_read_bytes`` (all the workers' reads of them), ``worker_read_bytes`` (all the workers'
    reads of data files) and ``worker_files`` (the data files they read). An ``IterableDataset`` that does not
    split its shards between the workers has each read every one. The readers must have lived at once (their
    first to last recorded call overlapping): the workers of the next epoch, started anew, read the same shards
    as the last epoch's did."""
    readers: dict[str, int] = {}
    shared_bytes = worker_bytes = 0
    by_file: dict[str, list[tuple[int, int]]] = {}
    for path, pid, nbytes in span_rows(store, _READ_BY_PROCESS, io.run_id, main=io.main_pid, helpers=io.helper_pids):
        by_file.setdefault(str(path), []).append((int(pid), int(nbytes)))
        worker_bytes += int(nbytes)
    lives = {int(pid): (int(s), int(e)) for pid, s, e in span_rows(store, _LIFETIMES, io.run_id)} if by_file else {}
    for path, each in by_file.items():
        whole = [lives[pid] for pid, n in each if n >= SHARED_WHOLE * covered.get(path, 0) > 0 and pid in lives]
        if (together := _most_at_once(whole)) >= 2:
            readers[path] = together
            shared_bytes += sum(n for _, n in each)
    largest = min(readers, key=lambda p: (-covered.get(p, 0), p), default=None)  # the first name of the largest
    return {
        "shared_files": len(readers),
        "shared_readers": max(readers.values(), default=0),
        "shared_path": largest,
        "shared_read_bytes": shared_bytes,
        "worker_read_bytes": worker_bytes,
        "worker_files": len(by_file),
    }


def _most_at_once(lives: list[tuple[int, int]]) -> int:
    """The most of these (start, end) lifetimes that overlap at one time: the workers of one epoch together, not
    those of the next, which a DataLoader without persistent workers starts anew and which read the same shards."""
    edges = sorted([(s, 1) for s, _ in lives] + [(e, -1) for _, e in lives], key=lambda x: (x[0], x[1]))
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def _labels(facts: dict[str, Any], source: str, any_reads: bool) -> list[str]:
    """Where the small reads and the median size come from, and how many of the data-file reads that covers."""
    labels = ["small reads and median size estimated from Darshan's buckets"] if source == "size buckets" else []
    sized, reads = facts["sized_reads"], facts["reads"]
    if any_reads and sized < reads:
        by = "in Darshan's size buckets" if source == "size buckets" else f"traced one by one ({source})"
        labels.append(f"small share and median read: of the {sized:,} data-file reads {by}, of {reads:,} counted")
    return labels


SpanReads = tuple[int, int, float | None, int, int, int, int, int, int]
"""Reads in spans, small reads, median size (bytes), time in zero-length reads and in all reads, and in the
zero-length reads and all reads of the warm-up iterations (ns); the zero-length reads that ended an in-kernel
copy, and their time (ns)."""


def _span_reads(store: Store, io: IoRun) -> dict[str, SpanReads]:
    """Per class, and for the data files together (``data files``): ``SpanReads``."""
    if not io.has_spans:
        return {}
    out = {}
    data = f"CASE WHEN {IO_DATA} THEN 'data files' END"
    for key in ("cls", data):
        sql = _SPAN_READS.format(key=key, warm=io.ctx.in_warmup())
        for cls, n, small, mid, *times in span_rows(store, sql, io.run_id):
            if cls is not None:
                zero_ns, read_ns, warm_ns, warm_read_ns, copy_ends, copy_ends_ns = (int(t or 0) for t in times)
                out[str(cls)] = (int(n), int(small), None if mid is None else float(mid), zero_ns, read_ns, warm_ns,
                                 warm_read_ns, copy_ends, copy_ends_ns)  # fmt: skip
    return out


def _row(cls: str, r: tuple[Any, ...], exact: SpanReads | None) -> tuple[Any, ...]:
    reads, seq, consec, zero, hist_zero, opened, unknown = (as_count(v) for v in r[1:8])
    hist = dict(zip(BUCKETS, (as_count(v) for v in r[8:]), strict=True))
    first = None if unknown else opened  # a Darshan log's files do not have them
    if exact is not None:  # the spans' reads, counted one by one
        sized, small, mid = exact[0], exact[1], exact[2]
        small_pct = pct(small, sized)
    else:  # the reads in the size buckets (the empty ones among them are in the lowest)
        sized, estimate = sum(hist.values()), small_from_hist(hist, hist_zero)
        small, small_pct = round(estimate), pct(estimate, sum(hist.values()))
        mid = bucket_median({**hist, BUCKETS[0]: max(hist[BUCKETS[0]] - hist_zero, 0)})
    return (cls, reads, pct(consec, reads), pct(seq - consec, reads), None if first is None else pct(first, reads),
            pct(reads - seq - (first or 0), reads), zero, pct(zero, reads), sized, small, small_pct, mid)  # fmt: skip


def _data_row(per_class: dict[str, tuple[Any, ...]], exact: SpanReads | None) -> tuple[Any, ...]:
    kept = [r for cls, r in per_class.items() if cls in DATA_CLASSES]
    if not kept:
        return ("data files", 0, None, None, None, None, 0, None, 0, 0, None, None)
    summed = tuple(sum(as_count(r[i]) for r in kept) for i in range(1, len(kept[0])))
    return _row("data files", ("data files", *summed), exact)
