"""Sizes: access sizes and file sizes on Darshan's buckets, and tf-Darshan's small-file staging table."""

from __future__ import annotations

from typing import Any, Final

from xstack.analyze._io_common import (
    CHECKPOINT_NAME,
    FILE_OPEN_OPS,
    FILE_OPS,
    FILE_TIME,
    IO_SPANS,
    READ_OPS,
    SPAN_BYTES,
    SPAN_PATH,
    SYNC_OPS,
    IoRun,
    as_count,
    bucket_median,
    bucket_sql,
    check_options,
    class_filter,
    hist_count,
    in_list,
    io_pass,
    io_run,
    median,
    typed_io_spans,
)
from xstack.analyze._timeline_common import STEP, notes_of, pct, rows
from xstack.analyze.context import past_warmup, run_context
from xstack.analyze.result import Chart, Column, Result, format_value
from xstack.text import counted
from xstack.trace import attrs as A
from xstack.trace.store import Store

SIZES_ID, SIZES_TITLE = "io.sizes", "Access sizes and file sizes"
SMALL_ID, SMALL_TITLE = "io.small_files", "Small files: what staging them would move"
SMALL_FILE_BYTES = 2 * 2**20
"""tf-Darshan's default threshold: files up to 2 MiB are the ones worth staging on a faster tier."""
THRESHOLDS = (256 * 2**10, 2**20, 2 * 2**20, 4 * 2**20, 16 * 2**20)
"""Thresholds tabulated side by side, so that users can pick one."""

_MAX_BYTE = "max(coalesce(TRY_CAST(attrs->>'$.{key}' AS BIGINT), -1))"

_FILES = f"""
f AS (
    SELECT path, greatest({_MAX_BYTE.format(key=A.IO_FILE_MAX_BYTE_READ)},
                          {_MAX_BYTE.format(key=A.IO_FILE_MAX_BYTE_WRITTEN)}) + 1 AS counted,
        sum({FILE_OPS}) AS ops, sum(bytes_read + bytes_written) AS nbytes, sum({FILE_TIME}) AS time_ns,
        sum(reads) AS reads, sum(writes) AS writes, sum(opens) AS opens
    FROM io_files WHERE run_id = $run AND {{where}} GROUP BY path
),
extent AS ({{extent}}),
sized AS (SELECT f.*, greatest(counted, coalesce(extent.size, 0)) AS size FROM f LEFT JOIN extent USING (path))
"""
"""Per data file (a path, over its processes and modules): its size estimate, operations, bytes, time, reads,
writes and opens."""

_SPAN_EXTENT = f"""
SELECT path, max(off + CASE WHEN name = 'mmap' THEN coalesce(requested, 0) ELSE coalesce(nbytes, 0) END) AS size
FROM {IO_SPANS} WHERE run_id = $run AND off IS NOT NULL GROUP BY 1
"""
_NO_EXTENT = "SELECT NULL::VARCHAR AS path, NULL::BIGINT AS size WHERE FALSE"


def files_cte(io: IoRun, all_paths: bool) -> str:
    """CTE ``sized(path, counted, ops, nbytes, time_ns, reads, writes, opens, size)`` over the data files (every file
    where ``all_paths``): each file's size is its highest byte read or written + 1, or the furthest offset its calls
    reached (mmap: offset + length). Read from a temp table made once per run and choice of files: the eight queries
    of io.sizes and io.small_files that read it each took every file's counters out of its JSON, and the furthest
    offset out of every io span's."""
    ctx = io.ctx
    name = f"_ax_io_sized_{ctx.run_id}_{'all' if all_paths else 'data'}"
    if name not in ctx._tables:
        if io.has_spans:
            typed_io_spans(ctx.store, ctx.run_id)
        files = _FILES.format(where=class_filter(all_paths), extent=_SPAN_EXTENT if io.has_spans else _NO_EXTENT)
        ctx.store.con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS WITH {files} SELECT * FROM sized",
                              {"run": ctx.run_id})  # fmt: skip
        ctx._tables[name] = name
    return f"sized AS (SELECT * FROM {name})"


SIZE_COLUMNS = [
    Column("size", help="Darshan's size bucket (bytes): 0_100 is 0-100, 100_1K is 101-1024, ..."),
    Column("from", "bytes"),
    Column("to", "bytes"),
    Column("reads", "count", "reads that returned this many bytes"),
    Column("writes", "count", "writes of this many bytes"),
    Column("files", "count", "files of this size (estimated)"),
    Column("of reads", "pct", "share of all the reads counted here"),
    Column("of writes", "pct", "share of all the writes"),
    Column("of files", "pct", "share of the files with a known size"),
]


def size_distribution(store: Store, run_id: int, *, all_paths: bool = False) -> Result:
    """Per Darshan size bucket: reads and writes of that many bytes, and files of that size (counts, and shares in
    percent of all the reads, writes and sized files).

    Notes: access sizes are the ``size_read_hist``/``size_write_hist`` counters of ``io_files`` (bytes each call
    returned, on Darshan's bucket edges), summed over the data files (``all_paths=True``: every file but pipes
    and sockets' own rows are then included too). A file's size is estimated as its highest byte read or
    written + 1 (Darshan's ``MAX_BYTE_READ``/``MAX_BYTE_WRITTEN``), or the furthest offset its recorded calls
    reached (an mmap's offset + length), whichever is larger; files never read or written have no size and
    are counted apart (fact ``files_unsized``).
    """
    io = io_run(store, run_id)
    if (lacking := io.lacking(SIZES_ID, SIZES_TITLE)) is not None:
        return lacking
    names = [b[0] for b in A.IO_SIZE_BUCKETS]
    hist = ", ".join(f"sum({hist_count(k, n)})" for k in (A.IO_FILE_SIZE_READ_HIST, A.IO_FILE_SIZE_WRITE_HIST)
                     for n in names)  # fmt: skip
    counts = rows(store, f"SELECT {hist} FROM io_files WHERE run_id = $run AND {class_filter(all_paths)}", io.run_id)[0]
    reads = dict(zip(names, (as_count(v) for v in counts[: len(names)]), strict=True))
    writes = dict(zip(names, (as_count(v) for v in counts[len(names) :]), strict=True))
    sql = f"""WITH {files_cte(io, all_paths)}
        SELECT {bucket_sql("size")} AS bucket, count(*) FROM sized WHERE size > 0 GROUP BY 1"""
    files = {str(b): int(n) for b, n in rows(store, sql, io.run_id)}
    stats = rows(store, f"""WITH {files_cte(io, all_paths)} SELECT count(*) FILTER (WHERE size <= 0),
        median(size) FILTER (WHERE size > 0), max(size) FROM sized""", io.run_id)[0]  # fmt: skip
    last = A.IO_SIZE_BUCKETS[-1][0]  # open-ended: its stand-in upper edge is no size
    n_reads, n_writes, n_files = sum(reads.values()), sum(writes.values()), sum(files.values())
    table = [
        (n, low, None if n == last else high, reads[n], writes[n], files.get(n, 0), pct(reads[n], n_reads),
         pct(writes[n], n_writes), pct(files.get(n, 0), n_files))
        for n, low, high in A.IO_SIZE_BUCKETS
    ]  # fmt: skip
    return Result(
        SIZES_ID,
        SIZES_TITLE,
        SIZE_COLUMNS,
        table if n_reads + n_writes + n_files else [],
        notes=notes_of(size_distribution),
        run_id=io.run_id,
        chart=Chart(
            "bar",
            x="size",
            y=("of reads", "of writes", "of files"),
            title="Access sizes and file sizes: % of the reads, of the writes and of the files per bucket",
        ),  # fmt: skip
        facts={
            "reads": n_reads,
            "writes": n_writes,
            "median_read_bytes": bucket_median(reads),
            "median_write_bytes": bucket_median(writes),
            "files_sized": n_files,
            "files_unsized": as_count(stats[0]),
            "median_file_bytes": None if stats[1] is None else float(stats[1]),
            "largest_file_bytes": None if stats[2] is None or stats[2] <= 0 else int(stats[2]),
        },
        labels=([] if all_paths else ["data files only (all_paths=True for every file)"])
        + _unsized_label(as_count(stats[0])),
    )


SMALL_COLUMNS = [
    Column("threshold", "bytes", "files of at most this size count as small"),
    Column("small files", "count"),
    Column("files", "pct", "share of the files with a known size"),
    Column("small-file ops", "count", "operations on the small files"),
    Column("ops", "pct", "share of the operations"),
    Column("small-file bytes", "bytes", "bytes read and written from the small files"),
    Column("bytes", "pct", "share of the bytes"),
    Column("small-file time", "ns", "I/O time on the small files"),
    Column("time", "pct", "share of the I/O time"),
    Column("chosen", help="the threshold the facts and the recommendation use"),
]


def small_file_staging(
    store: Store, run_id: int, *, threshold_bytes: int = SMALL_FILE_BYTES, all_paths: bool = False
) -> Result:
    """Per size threshold (bytes): the files at most that large, and their share (%) of the files, of the
    operations, of the bytes and of the I/O time (ns): what staging them on a faster tier would move.

    Notes: tf-Darshan's staging analysis. File sizes are estimated as in ``io.sizes``; only data files count
    (``all_paths=True``: every file), and files never read or written (no size known) are left out of every share
    (fact ``files_unsized`` counts them, as a label says). Operations are opens, reads, writes, seeks, stats, syncs
    and mmaps; time is read + write + metadata time. The facts describe ``threshold_bytes`` (tf-Darshan's 2 MiB by
    default); rows show the thresholds 256 KiB, 1, 2, 4 and 16 MiB as well; fact ``small_size_mean_bytes`` is the
    small files' mean size (not the bytes moved per file, which count a part read twice twice); fact
    ``small_time_warmup_ns`` is the part of the small files' time spent in the warm-up iterations
    (``RunContext.in_warmup``; from the io spans, None without them); in a merged run, whose files are its io
    pass's whole and whose io spans are that pass's median iteration, fact ``small_time_step_ns`` is the small
    files' time in a usual measured iteration of the io pass (the median over them: the merged iteration's own
    few calls can hold one slow read), at most the merged step (the io pass, slowed by its level, may take longer
    over them than the model pass over its whole step). Small files that carry many operations but few
    bytes are the ones to stage or to pack into larger shards. Facts ``small_written_files``, ``small_written_ops`` and
    ``small_written_time_ns`` are those of the small files the program only wrote (no read): its outputs, which staging
    does not concern; ``small_written_checkpoints`` counts those of them named as checkpoints are (``CHECKPOINT_NAME``);
    ``small_written_most_opened`` is the one of them opened most often, and ``small_written_most_opens`` its opens
    (Darshan's, over its processes and modules): a log or a file of results opened for each record it appends. Facts
    ``small_packed_files``, ``small_packed_bytes`` and ``small_packed_path``: the files the program only wrote, not
    checkpoints, of ``PACKED_SIZE`` times the mean size of the small files it read or more (of any size), their bytes
    and the largest: shards it packed them into, against ``small_read_bytes``, the small files' bytes. Facts
    ``small_read_loop`` and ``small_read_in_memory`` count the small files read in the measured iterations
    (``_in_memory``) and those of them that lie in memory already (``IN_MEMORY``), staged there by the program. Facts
    ``small_reads_timed``, ``small_reads_cached_pct`` and ``small_read_median_ns``: the reads of up to 64 KiB of the
    small files in the measured iterations, the share of them fast enough to have been served from memory, the page
    cache (``CACHED_BASE_NS``), and their median time (None, both, under ``CACHED_MIN_READS`` reads). Fact
    ``small_sync_ns`` is the small files' fsync and fdatasync time (from the io spans, None without them), which their
    time counts as write time (as Darshan's does): a sync costs the same in a large file, so the warm-up's and the usual
    iteration's time above leave the syncs out, and so does the time at stake of a finding on the small files.
    """
    check_options(SMALL_ID, threshold_bytes=threshold_bytes)
    io = io_run(store, run_id)
    if (lacking := io.lacking(SMALL_ID, SMALL_TITLE)) is not None:
        return lacking
    limits = sorted({*THRESHOLDS, int(threshold_bytes)})
    parts = ", ".join(
        f"count(*) FILTER (WHERE size <= {t}), sum(ops) FILTER (WHERE size <= {t}), "
        f"sum(nbytes) FILTER (WHERE size <= {t}), sum(time_ns) FILTER (WHERE size <= {t})"
        for t in limits
    )
    sql = f"""WITH {files_cte(io, all_paths)} SELECT count(*), sum(ops), sum(nbytes), sum(time_ns), {parts},
        avg(size) FILTER (WHERE size <= {int(threshold_bytes)}),
        (SELECT count(*) FROM sized WHERE size <= 0),
        count(*) FILTER (WHERE size <= {int(threshold_bytes)} AND reads = 0 AND writes > 0),
        sum(ops) FILTER (WHERE size <= {int(threshold_bytes)} AND reads = 0 AND writes > 0),
        sum(time_ns) FILTER (WHERE size <= {int(threshold_bytes)} AND reads = 0 AND writes > 0),
        count(*) FILTER (WHERE size <= {int(threshold_bytes)} AND reads = 0 AND writes > 0
                         AND regexp_matches(lower(path), '{CHECKPOINT_NAME}')),
        count(*) FILTER (WHERE size <= {int(threshold_bytes)} AND reads > 0 AND regexp_matches(path, '{IN_MEMORY}')),
        arg_max(path, opens) FILTER (WHERE size <= {int(threshold_bytes)} AND reads = 0 AND writes > 0),
        max(opens) FILTER (WHERE size <= {int(threshold_bytes)} AND reads = 0 AND writes > 0),
        coalesce(sum(size) FILTER (WHERE size <= {int(threshold_bytes)} AND reads > 0), 0),
        {_PACKED.replace("{threshold}", str(int(threshold_bytes)))}
        FROM sized WHERE size > 0"""
    [row] = rows(store, sql, io.run_id)
    *found, mean_size, unsized, written, written_ops, written_ns, checkpoints, in_memory, most, most_opens = row[:-4]
    small_read_bytes, packed, packed_bytes, packed_path = row[-4:]
    unsized = as_count(unsized)
    found = [as_count(v) for v in found]
    totals = found[:4]
    table = []
    for i, t in enumerate(limits):
        n, ops, nbytes, time = found[4 + 4 * i : 8 + 4 * i]
        table.append((t, n, pct(n, totals[0]), ops, pct(ops, totals[1]), nbytes, pct(nbytes, totals[2]), time,
                      pct(time, totals[3]), "yes" if t == threshold_bytes else ""))  # fmt: skip
    chosen = next(r for r in table if r[0] == threshold_bytes)
    listed = any(r[1] for r in table)  # no file under any threshold: a label says so, not a table of zeros
    sync_ns = _span_time(store, io, all_paths, threshold_bytes, f"name IN {in_list(SYNC_OPS)}")
    warmup_ns = _warmup_time(store, io, all_paths, threshold_bytes)
    step_ns = _step_time(store, io, all_paths, threshold_bytes) if io.ctx.config.get("merge") else None
    if step_ns is not None and (extent := io.ctx.host_extent()[0]):  # timed under the io level, which slows it:
        step_ns = min(step_ns, int(extent))  # no more than the merged step itself can be at stake
    return Result(
        SMALL_ID,
        SMALL_TITLE,
        SMALL_COLUMNS,
        table if listed else [],
        notes=notes_of(small_file_staging),
        run_id=io.run_id,
        chart=Chart(
            "bar",
            x="threshold",
            y=("files", "ops", "bytes", "time"),
            title="Share of files, operations, bytes and time in files up to each size",
        ),  # fmt: skip
        facts={
            "threshold_bytes": int(threshold_bytes),
            "files": totals[0],
            "small_files": chosen[1],
            "small_files_pct": chosen[2],
            "small_size_mean_bytes": None if mean_size is None else float(mean_size),
            "ops": totals[1],
            "small_ops": chosen[3],
            "small_ops_pct": chosen[4],
            "bytes": totals[2],
            "small_bytes": chosen[5],
            "small_bytes_pct": chosen[6],
            "time_ns": totals[3],
            "small_time_ns": chosen[7],
            "small_time_pct": chosen[8],
            "small_time_warmup_ns": warmup_ns,
            "small_time_step_ns": step_ns,
            "files_unsized": unsized,
            "small_written_files": as_count(written),
            "small_written_ops": as_count(written_ops),
            "small_written_time_ns": as_count(written_ns),
            "small_written_checkpoints": as_count(checkpoints),
            "small_written_most_opened": most,
            "small_written_most_opens": as_count(most_opens),
            "small_read_bytes": as_count(small_read_bytes),
            "small_packed_files": as_count(packed),
            "small_packed_bytes": as_count(packed_bytes),
            "small_packed_path": packed_path,
            **_in_memory(store, io, all_paths, int(threshold_bytes), as_count(in_memory)),
            **_cached(store, io, all_paths, int(threshold_bytes)),
            "small_sync_ns": sync_ns,
        },
        labels=([] if all_paths else ["data files only (all_paths=True for every file)"])
        + _unsized_label(unsized)
        + ([] if listed else _none_small(totals[0], limits[-1], "file" if all_paths else "data file")),
    )


PACKED_SIZE: Final = 8
"""Times the mean size of the small files read, at least, of a file the program only wrote for it to be a shard
they were packed into (a tar shard of 100 images, an HDF5 or .npy file of many items), not an output of each."""
_PACKED = """count(*) FILTER (WHERE {packed}), coalesce(sum(size) FILTER (WHERE {packed}), 0),
        arg_max(path, size) FILTER (WHERE {packed})""".replace(
    "{packed}",
    f"""reads = 0 AND writes > 0 AND NOT regexp_matches(lower(path), '{CHECKPOINT_NAME}') AND size >= {PACKED_SIZE}
        * (SELECT avg(size) FROM sized WHERE size > 0 AND size <= {{threshold}} AND reads > 0)""",
)
"""SQL of the files the program only wrote (not checkpoints) that are ``PACKED_SIZE`` times the small files' mean
size read or more (``{threshold}``: the size threshold): how many, their bytes and the largest."""


def _none_small(files: int, largest: int, what: str) -> list[str]:
    """Says that every one of the ``files`` (of kind ``what``) is larger than the ``largest`` threshold; none where
    there are no files."""
    if not files:
        return []
    them = f"the {what} is" if files == 1 else f"all {files:,} {what}s are"
    return [f"{them} larger than {format_value(largest, 'bytes')}, the largest threshold: no small file to stage"]


def _unsized_label(unsized: int) -> list[str]:
    """Says how many files no call read or wrote (opened or stat'ed only): with no size known, no share counts
    them."""
    if not unsized:
        return []
    return [f"{counted(unsized, 'file')} never read or written (only opened or stat'ed), of unknown size, left out"]


_NO_SYNC = f"name NOT IN {in_list(SYNC_OPS)}"
IN_MEMORY: Final = r"^/(dev|run)/shm/"
"""Where a file lies in memory (a tmpfs every Linux mounts): the fast tier that staging small files moves them
to, and that leaves each file's open, reads and close as many calls."""


def _in_memory(store: Store, io: IoRun, all_paths: bool, threshold_bytes: int, run_wide: int) -> dict[str, int | None]:
    """Facts ``small_read_loop``, the files of at most ``threshold_bytes`` read in the measured iterations (a
    merged run's: its io pass's; without iterations or io spans, in the whole run), and ``small_read_in_memory``,
    those of them in ``IN_MEMORY``: the files the loop reads, not those a copy read once to stage them there.
    Where the run read none of them in memory (``run_wide``, the count over the whole run, is 0),
    ``small_read_in_memory`` is 0 and ``small_read_loop`` None: not counted (it takes a pass over the io spans)."""
    if not run_wide:
        return {"small_read_loop": None, "small_read_in_memory": 0}
    run = _loop_run(store, io)
    measured = run_context(store, run).measured_table() if io.has_spans else None
    if measured is None:
        sql = f"""WITH {files_cte(io, all_paths)} SELECT count(*), count(*) FILTER (WHERE regexp_matches(path,
            '{IN_MEMORY}')) FROM sized WHERE size > 0 AND size <= {threshold_bytes} AND reads > 0"""
        found = rows(store, sql, io.run_id)[0]
    else:
        sql = f"""WITH {files_cte(io, all_paths)},
            read AS (SELECT DISTINCT {SPAN_PATH} AS path FROM spans ASOF JOIN {measured[0]} w ON start_ns >= w.ws
                     WHERE run_id = $source AND level = 'io' AND start_ns < w.we AND name IN {in_list(READ_OPS)}
                         AND NOT json_exists(attrs, '$."{A.IO_ERRNO}"'))
            SELECT count(*), count(*) FILTER (WHERE regexp_matches(path, '{IN_MEMORY}')) FROM read
            WHERE path IN (SELECT path FROM sized WHERE size > 0 AND size <= {threshold_bytes})"""
        found = rows(store, sql, io.run_id, source=run)[0]
    return {"small_read_loop": as_count(found[0]), "small_read_in_memory": as_count(found[1])}


def _loop_run(store: Store, io: IoRun) -> int:
    """The run whose measured iterations hold the loop's calls: a merged run's io pass, else the run itself."""
    source = io_pass(store, io.ctx.config) if io.ctx.config.get("merge") else None
    return source[0] if source is not None else io.run_id


CACHED_BASE_NS: Final = 4_000
CACHED_NS_PER_BYTE: Final = 0.5
"""A read of ``n`` bytes that took at most ``CACHED_BASE_NS + CACHED_NS_PER_BYTE * n`` ns (6 us for 4 KiB, 37 us
for 64 KiB) was served from memory, the page cache: a copy at 2 GB/s or more after the call's own cost, where a
read from an SSD takes tens of microseconds and one from a network file system hundreds."""
CACHED_MAX_BYTES: Final = 64 * 2**10
"""The reads judged by their time (``CACHED_BASE_NS``): larger ones take long enough from memory that a fast SSD's
overlaps."""
CACHED_MIN_READS: Final = 200
"""The fewest such reads that say where the files lie: fewer may be fast or slow by chance (a file read twice, a
process taken off its CPU in one)."""


def _cached(store: Store, io: IoRun, all_paths: bool, threshold_bytes: int) -> dict[str, Any]:
    """Facts ``small_reads_timed`` (the successful reads of 1 byte to ``CACHED_MAX_BYTES`` of the files of at most
    ``threshold_bytes``, in the measured iterations: a merged run's io pass's; without iterations, in the whole
    run), ``small_reads_cached_pct`` (the share of them fast enough to have come from the page cache,
    ``CACHED_BASE_NS``) and ``small_read_median_ns`` (their median time); None without io spans. The same of the
    first read of each file, in its first open by its path (``small_first_*``: the one that finds it on storage
    if it is not in the page cache, the reads after it in that open served by the kernel's read-ahead), and of
    the reads in its later opens (``small_later_pass_*``: a later epoch's), where each counts ``CACHED_MIN_READS``
    or more (None otherwise): a dataset that the page cache holds after its first epoch reads from storage in
    that epoch alone."""
    keys = ("small_reads_timed", "small_reads_cached_pct", "small_read_median_ns", "small_first_reads",
            "small_first_reads_cached_pct", "small_first_read_median_ns", "small_later_pass_reads",
            "small_later_pass_cached_pct", "small_later_pass_read_median_ns")  # fmt: skip
    none: dict[str, Any] = dict.fromkeys(keys)
    if not io.has_spans:
        return none
    run = _loop_run(store, io)
    measured = run_context(store, run).measured_table()
    join, within = (f"ASOF JOIN {measured[0]} w ON start_ns >= w.ws", "AND start_ns < w.we") if measured else ("", "")
    small = f"{SPAN_PATH} IN (SELECT path FROM sized WHERE size > 0 AND size <= {threshold_bytes})"
    fast = f"dur_ns <= {CACHED_BASE_NS} + {CACHED_NS_PER_BYTE} * n"
    sql = f"""WITH {files_cte(io, all_paths)},
        reads AS (SELECT {SPAN_PATH} AS path, start_ns, dur_ns, {SPAN_BYTES} AS n FROM spans {join}
                  WHERE run_id = $source AND level = 'io' {within} AND name IN {in_list(READ_OPS)}
                      AND {SPAN_BYTES} BETWEEN 1 AND {CACHED_MAX_BYTES} AND {small}),
        opens AS (SELECT {SPAN_PATH} AS path, start_ns,
                      row_number() OVER (PARTITION BY {SPAN_PATH} ORDER BY start_ns) AS pass
                  FROM spans WHERE run_id = $source AND level = 'io' AND name IN {in_list(FILE_OPEN_OPS)}
                      AND NOT json_exists(attrs, '$."{A.IO_ERRNO}"') AND {small}),
        passed AS (SELECT r.*, o.pass, row_number() OVER (PARTITION BY r.path ORDER BY r.start_ns) AS k
                   FROM reads r ASOF LEFT JOIN opens o ON r.path = o.path AND r.start_ns >= o.start_ns)
        SELECT count(*), count(*) FILTER (WHERE {fast}), median(dur_ns),
            count(*) FILTER (WHERE k = 1 AND pass = 1), count(*) FILTER (WHERE k = 1 AND pass = 1 AND {fast}),
            median(dur_ns) FILTER (WHERE k = 1 AND pass = 1),
            count(*) FILTER (WHERE pass > 1), count(*) FILTER (WHERE pass > 1 AND {fast}),
            median(dur_ns) FILTER (WHERE pass > 1)
        FROM passed"""
    n, cached, med, first, first_cached, first_med, later, later_cached, later_med = rows(
        store, sql, io.run_id, source=run
    )[0]
    if not n or n < CACHED_MIN_READS:
        return none | {"small_reads_timed": int(n or 0)}
    found = {"small_reads_timed": int(n), "small_reads_cached_pct": pct(as_count(cached), int(n)),
             "small_read_median_ns": None if med is None else float(med)}  # fmt: skip
    if as_count(first) >= CACHED_MIN_READS and as_count(later) >= CACHED_MIN_READS:
        found |= {"small_first_reads": int(first),
                  "small_first_reads_cached_pct": pct(as_count(first_cached), int(first)),
                  "small_first_read_median_ns": float(first_med), "small_later_pass_reads": int(later),
                  "small_later_pass_cached_pct": pct(as_count(later_cached), int(later)),
                  "small_later_pass_read_median_ns": float(later_med)}  # fmt: skip
    return none | found


def _warmup_time(store: Store, io: IoRun, all_paths: bool, threshold_bytes: int) -> int | None:
    """The time (ns) of the successful calls but syncs on the files of at most ``threshold_bytes`` that started in
    the warm-up iterations, from the io spans (None where the run has none)."""
    if not io.has_spans:
        return None
    if not io.ctx.warmup_windows():
        return 0
    return _span_time(store, io, all_paths, threshold_bytes, f"{io.ctx.in_warmup()} AND {_NO_SYNC}")


def _step_time(store: Store, io: IoRun, all_paths: bool, threshold_bytes: int) -> int | None:
    """In a merged run, whose io_files hold its io pass whole: the time (ns) of the successful calls but syncs on
    the files of at most ``threshold_bytes`` in a usual measured iteration of that pass, the median over its measured
    iterations of the calls that started in each. Not the merged run's own io spans: they are one iteration's,
    whose few calls a single slow read (the process taken off its CPU) makes several times the others'. Where
    the io pass is not found (a store merged before passes were listed), the merged run's own io spans."""
    source = io_pass(store, io.ctx.config)
    if source is None:
        return _span_time(store, io, all_paths, threshold_bytes, _NO_SYNC)
    sql = f"""WITH {files_cte(io, all_paths)},
        steps AS (SELECT start_ns AS s, start_ns + dur_ns AS e FROM spans
                  WHERE run_id = $source AND {STEP} AND {past_warmup(run_context(store, source[0]).warmup)}),
        calls AS (SELECT start_ns AS s, dur_ns FROM spans
                  WHERE run_id = $source AND level = 'io' AND NOT json_exists(attrs, '$."{A.IO_ERRNO}"') AND {_NO_SYNC}
                      AND {SPAN_PATH} IN (SELECT path FROM sized WHERE size > 0 AND size <= {int(threshold_bytes)}))
        SELECT coalesce(sum(c.dur_ns), 0) FROM steps st LEFT JOIN calls c ON c.s >= st.s AND c.s < st.e
        GROUP BY st.s"""
    per_step = median([int(r[0]) for r in rows(store, sql, io.run_id, source=source[0])])
    return None if per_step is None else round(per_step)


def _span_time(store: Store, io: IoRun, all_paths: bool, threshold_bytes: int, where: str = "true") -> int | None:
    """The time (ns) of the io spans of successful calls on the files of at most ``threshold_bytes`` (those
    ``where`` holds), None where the run has none."""
    if not io.has_spans:
        return None
    sql = f"""WITH {files_cte(io, all_paths)}
        SELECT coalesce(sum(dur_ns), 0) FROM spans
        WHERE run_id = $run AND level = 'io' AND {where} AND NOT json_exists(attrs, '$."{A.IO_ERRNO}"')
            AND {SPAN_PATH} IN (SELECT path FROM sized WHERE size > 0 AND size <= {int(threshold_bytes)})"""
    return as_count(rows(store, sql, io.run_id)[0][0])
