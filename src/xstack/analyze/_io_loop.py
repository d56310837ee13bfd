"""Is the training loop input-bound: the time each iteration waits for the DataLoader, and the I/O behind it."""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any

from xstack.analyze import _loaders
from xstack.analyze._io_common import (
    CHECKPOINT_NAME,
    CLOSE_OPS,
    COMPRESSED_SUFFIXES,
    FILE_OPEN_OPS,
    FILE_STORAGE,
    FILE_TIME,
    IO_DATA,
    IO_SPANS,
    IO_STORAGE,
    OPEN_OPS,
    READ_OPS,
    SPAN_BYTES,
    SPAN_CLASS,
    SPAN_PATH,
    SYNC_OPS,
    WRITE_OPS,
    IoRun,
    as_count,
    check_options,
    cpu_facts,
    in_list,
    io_pass,
    io_run,
    mapped_files,
    mapped_label,
    median,
    span_rows,
)
from xstack.analyze._timeline_common import DATALOADER, STEP, notes_of, pct, rows
from xstack.analyze.context import merged, past_warmup, warmup_steps
from xstack.analyze.result import Chart, Column, Result
from xstack.text import counted
from xstack.trace import attrs as A
from xstack.trace.store import Store

ID = "io.input_bound"
TITLE = "Input-bound: waiting for data vs the rest of each iteration"
WAIT_SHARE_PCT = 10.0
"""Default threshold: a loop whose median iteration waits longer than this share of its time is input-bound."""

_ITERATIONS = f"""
WITH steps AS (SELECT start_ns AS s, start_ns + dur_ns AS e, NOT {{measured}} AS warm FROM spans
               WHERE run_id = $run AND {STEP}),
loader_spans AS (SELECT start_ns AS s, start_ns + dur_ns AS e, name FROM spans WHERE run_id = $run AND {DATALOADER}),
first_batches AS (SELECT e FROM loader_spans WHERE name <> 'dataloader.iter' ORDER BY s, e LIMIT {{warm_batches}}),
waits AS (
    SELECT s, coalesce(lead(s) OVER (ORDER BY s, e), greatest(e, (SELECT max(start_ns + dur_ns) FROM spans
        WHERE run_id = $run AND level = 'model' AND pid = $main))) AS e
    FROM loader_spans WHERE $main IS NOT NULL
)
SELECT s, e, 'steps', warm FROM steps
UNION ALL
SELECT s, e, 'dataloader waits', coalesce(s < (SELECT max(e) FROM first_batches), false) FROM waits
WHERE NOT EXISTS (SELECT 1 FROM steps)
ORDER BY 1, 2
"""
"""The iterations: step spans (``warm`` for the warm-up ones), else the stretches between DataLoader waits, those
that begin before the ``{warm_batches}``-th batch came (the end of that many waits for a batch, ``iter()``'s left
out: the workers' start-up and first batches) warm; ``{measured}`` is the SQL that tells a step past the warm-up
(``context.past_warmup``)."""

CAPPED_QUANTILE = 0.99
"""The quantile of the workers' file-call durations at which ``worker_io_capped_per_iteration_ns`` caps each call."""

_PER_ITERATION = f"""
WITH it AS (SELECT k, s, e FROM _io_iterations),
loader_spans AS (SELECT start_ns AS s, start_ns + dur_ns AS e FROM spans WHERE run_id = $run AND {DATALOADER}),
loading AS ({merged("loader_spans")}),
io AS (
    SELECT pid, start_ns AS s, start_ns + dur_ns AS e,
        pid IS DISTINCT FROM $main AND NOT list_contains($helpers, pid) AS worker
    FROM {IO_SPANS} WHERE run_id = $run AND {IO_STORAGE}
),
main_waiting AS (
    SELECT greatest(io.s, l.s) AS s, least(io.e, l.e) AS e FROM io JOIN loading l ON io.s < l.e AND io.e > l.s
    WHERE io.pid = $main
),
wait AS (SELECT it.k, sum(least(l.e, it.e) - greatest(l.s, it.s)) AS ns FROM it JOIN loading l
         ON l.s < it.e AND l.e > it.s GROUP BY it.k),
cap AS (SELECT quantile_cont(e - s, {CAPPED_QUANTILE}) AS ns FROM io WHERE worker),
io_in AS (SELECT it.k, sum(least(io.e, it.e) - greatest(io.s, it.s)) FILTER (WHERE io.pid = $main) AS main_ns,
                 sum(least(io.e, it.e) - greatest(io.s, it.s)) FILTER (WHERE io.worker) AS worker_ns,
                 sum(least(least(io.e, it.e) - greatest(io.s, it.s), (SELECT ns FROM cap)))
                     FILTER (WHERE io.worker) AS worker_capped_ns
          FROM it JOIN io ON io.s < it.e AND io.e > it.s GROUP BY it.k),
main_wait AS (SELECT it.k, sum(least(m.e, it.e) - greatest(m.s, it.s)) AS ns FROM it JOIN main_waiting m
              ON m.s < it.e AND m.e > it.s GROUP BY it.k)
SELECT it.k, it.e - it.s, coalesce(wait.ns, 0), coalesce(main_wait.ns, 0), coalesce(io_in.main_ns, 0),
       coalesce(io_in.worker_ns, 0), coalesce(io_in.worker_capped_ns, 0)
FROM it LEFT JOIN wait USING (k) LEFT JOIN io_in USING (k) LEFT JOIN main_wait USING (k) ORDER BY it.k
"""

_COMPRESSED = " OR ".join(f"lower(path) LIKE '%{suffix}'" for suffix in COMPRESSED_SUFFIXES)
_WORKER_DATA = f"""
WITH it AS (SELECT s, e FROM _io_iterations WHERE NOT warm),
w AS (  -- the workers' successful calls on data files and listings of folders, one scan of the spans
    SELECT name, dur_ns, path, nbytes AS bytes, {IO_DATA} AS data, requested AS size, entries,
        EXISTS (SELECT 1 FROM it WHERE sp.start_ns >= it.s AND sp.start_ns < it.e) AS measured
    FROM {IO_SPANS} sp
    WHERE run_id = $run AND ({IO_DATA} OR name IN ('opendir', 'readdir')) AND pid IS DISTINCT FROM $main
        AND NOT list_contains($helpers, pid) AND NOT failed
),
ops AS (SELECT * FROM w WHERE data AND measured),
reads AS (SELECT * FROM ops WHERE name IN {in_list(READ_OPS)}),
first AS (SELECT min(start_ns) AS t FROM {IO_SPANS} WHERE run_id = $run AND pid IS DISTINCT FROM $main
            AND NOT list_contains($helpers, pid)),
forked AS (  -- the main process's mappings before its first worker started, which forked workers inherit: not
             -- those it unmapped before then (a file the dataset's __init__ read its length from, say), nor, where
             -- the unmap went unrecorded (an unmap of part of a mapping), those of files the workers mapped themselves
    SELECT path, requested AS size, TRUE AS inherited
    FROM {IO_SPANS} sp WHERE $forked AND run_id = $run AND name = 'mmap' AND pid = $main AND {IO_DATA} AND NOT failed
        AND start_ns < (SELECT t FROM first)
        AND NOT EXISTS (SELECT 1 FROM {IO_SPANS} u WHERE u.run_id = $run AND u.name = 'munmap' AND u.pid = $main
                        AND u.path = sp.path AND u.start_ns > sp.start_ns AND u.start_ns < (SELECT t FROM first)
                        AND NOT u.failed)
        AND NOT EXISTS (SELECT 1 FROM w WHERE w.data AND w.name = 'mmap' AND w.path = sp.path)
),
maps AS (SELECT path, size, FALSE AS inherited FROM w WHERE data AND name = 'mmap' UNION ALL SELECT * FROM forked),
lists AS (SELECT * FROM w WHERE measured AND name IN ('opendir', 'readdir'))
SELECT (SELECT count(*) FROM reads), (SELECT count(*) FROM ops WHERE name IN {in_list(FILE_OPEN_OPS)}),
    (SELECT count(DISTINCT path) FROM reads), (SELECT coalesce(sum(bytes), 0) FROM reads),
    (SELECT path FROM reads GROUP BY path ORDER BY sum(dur_ns) DESC, path LIMIT 1),
    (SELECT count(DISTINCT path) FROM maps), (SELECT arg_max(path, size) FROM maps), (SELECT max(size) FROM maps),
    (SELECT arg_max(inherited, size) FROM maps),
    (SELECT count(*) FROM lists WHERE name = 'opendir'),
    (SELECT coalesce(sum(dur_ns), 0) FROM lists WHERE name = 'readdir'),
    (SELECT coalesce(sum(entries), 0) FROM lists WHERE name = 'readdir'),
    (SELECT path FROM lists WHERE name = 'opendir' GROUP BY path ORDER BY count(*) DESC, path LIMIT 1),
    (SELECT count(DISTINCT path) FROM reads WHERE {_COMPRESSED})
"""
"""The workers' successful calls, in one scan of the spans: on data files, those that started in the measured
iterations (their reads, opens, the files read, the bytes read and the file of the most read time); the data
files they mapped into memory at any time (a dataset maps its file on first use, often in the warm-up: how many,
the one of the largest mapping, its size and whether they inherited it: forked workers inherit the mappings the
main process made before they started); and their listings of folders in the measured iterations (the
opens of a folder to list it, the time of their reads of its entries, a readdir span running from the first call
to the last with the caller's work between them, the entries read and the folder listed most); and the data files
read in the measured iterations that are compressed streams (``COMPRESSED_SUFFIXES``)."""

MOST_OF = 0.9
"""The share of the main process's file I/O outside every stage whose iterations ``_unstaged`` counts: where they
are few, the I/O is occasional work (a checkpoint every N steps), not the usual iteration's."""

_LOOP_FILES = f"{SPAN_CLASS} NOT IN ('stream', 'ipc', 'python', 'profiler')"
"""The files of the loop's own I/O between its stages: storage (``SPAN_STORAGE``), less Python's own (a lazy
import between the stages, its ``.pyc`` written, is no file the loop reads or writes) and the profiler's."""

_UNSTAGED = f"""
WITH steps AS ({{parents}}),
io AS MATERIALIZED (
    SELECT parent_id, {SPAN_PATH} AS path, name, dur_ns,
        CASE WHEN name IN {in_list(WRITE_OPS)} THEN {SPAN_BYTES} END AS bytes,
        CASE WHEN name IN {in_list(FILE_OPEN_OPS)}
            THEN TRY_CAST(attrs->>'$."{A.IO_REQUESTED_BYTES}"' AS BIGINT) & 3 <> 0 ELSE false END AS opened
    FROM spans
    WHERE run_id = $run AND level = 'io' AND pid = $main AND {_LOOP_FILES} AND parent_id IN (SELECT span_id FROM steps)
        AND {{window}}
),
by_path AS MATERIALIZED (
    SELECT path, sum(dur_ns) AS ns, coalesce(sum(dur_ns) FILTER (WHERE name IN {in_list(WRITE_OPS)}), 0) AS written,
        coalesce(sum(dur_ns) FILTER (WHERE name IN {in_list(READ_OPS)}), 0) AS read, count(*) FILTER (WHERE opened)
        AS opens, coalesce(sum(bytes) FILTER (WHERE name IN {in_list(WRITE_OPS)}), 0) AS wbytes,
        coalesce(regexp_matches(lower(path), '{CHECKPOINT_NAME}'), false) AS ckpt
    FROM io GROUP BY path
),
per AS (SELECT parent_id, sum(dur_ns) AS ns FROM io GROUP BY parent_id),
cum AS (SELECT ns, sum(ns) OVER (ORDER BY ns DESC, parent_id ROWS UNBOUNDED PRECEDING) AS upto FROM per)
SELECT coalesce(sum(ns), 0),
    (SELECT path FROM by_path ORDER BY CASE WHEN (SELECT sum(written) >= sum(read) FROM by_path) THEN written
        ELSE read END DESC, ns DESC, path LIMIT 1), coalesce(sum(written), 0),
    coalesce(sum(read), 0), count(*),
    (SELECT count(*) FILTER (WHERE upto - ns < {MOST_OF} * (SELECT sum(ns) FROM per)) FROM cum),
    coalesce(sum(ns) FILTER (WHERE ckpt), 0), coalesce(sum(opens) FILTER (WHERE ckpt), 0),
    coalesce(sum(wbytes) FILTER (WHERE ckpt), 0)
FROM by_path
"""
"""The main process's file I/O in the measured steps outside every stage (its io spans hang from a step span
itself; in a run without steps, from its region, between its first stage's start and its last one's end:
``{parents}`` and ``{window}``, ``_UNSTAGED_STEPS`` or ``_UNSTAGED_REGION``): its time, the file of the most of
its write time, or of its read time where that is the larger (the kind the advice is about), the write and read
time of it all, the files, the fewest iterations that hold ``MOST_OF`` of the time, the time on files named as
checkpoints (``CHECKPOINT_NAME``), and the checkpoint files' opens for writing (an open's flags, ``O_WRONLY`` or
``O_RDWR``, are its ``io.requested_bytes``: a save each, over an earlier file or not) and the bytes written to
them."""

_UNSTAGED_STEPS = {"parents": f"SELECT span_id FROM spans WHERE run_id = $run AND {STEP} AND {{measured}}",
                   "window": "TRUE"}  # fmt: skip
"""``_UNSTAGED``'s parents and window in a run of steps: the measured steps."""
_UNSTAGED_REGION = {
    "parents": f"""SELECT span_id FROM spans WHERE run_id = $run AND level = 'model'
        AND attrs->>'$."{A.MODEL_KIND}"' = 'region'""",
    "window": "start_ns >= (SELECT min(s) FROM _st) AND start_ns < (SELECT max(e) FROM _st)",
}
"""``_UNSTAGED``'s parents and window in a run without steps: its region, from its first stage to its last
(``_st``, the run's ``_STAGES``)."""

_STAGES = f"""(SELECT start_ns AS s, start_ns + dur_ns AS e FROM spans WHERE run_id = $run AND level = 'model'
    AND pid = $main AND NOT ({STEP}) AND coalesce(attrs->>'$."{A.MODEL_KIND}"', '-') NOT IN ('region', 'tail'))"""
"""The main process's stages (its model spans but the iterations, a run's region and what follows its last step)."""


def _outside_stages(source: str) -> str:
    """SQL of the time that some interval ``(s, e)`` of ``source`` covers outside every stage of the main process
    (``st``: the union of its stages)."""
    return f"""(SELECT coalesce(sum(e - s), 0) FROM ({merged(source)}))
        - (SELECT coalesce(sum(least(u.e, st.e) - greatest(u.s, st.s)), 0) FROM ({merged(source)}) u JOIN st
           ON u.s < st.e AND u.e > st.s)"""


_HELD_OPEN = f"""
WITH steps AS ({{parents}}),
io AS (
    SELECT parent_id, tid, TRY_CAST(attrs->>'$."{A.IO_FD}"' AS INTEGER) AS fd, name, start_ns, span_id,
        start_ns + dur_ns AS e, coalesce(regexp_matches(lower({SPAN_PATH}), '{CHECKPOINT_NAME}'), false) AS ckpt,
        TRY_CAST(attrs->>'$."{A.IO_REQUESTED_BYTES}"' AS BIGINT) AS flags
    FROM spans
    WHERE run_id = $run AND level = 'io' AND pid = $main AND parent_id IN (SELECT span_id FROM steps) AND {{window}}
        AND (name IN {in_list(OPEN_OPS)} OR name IN {in_list(CLOSE_OPS)}) AND NOT json_exists(attrs, '$."{A.IO_ERRNO}"')
        AND {_LOOP_FILES}
),
paired AS (
    SELECT ckpt, start_ns AS s, min(CASE WHEN name IN {in_list(CLOSE_OPS)} THEN e END) OVER (
            PARTITION BY parent_id, tid, fd ORDER BY start_ns, span_id ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING
        ) AS e,
        CASE WHEN name NOT IN {in_list(OPEN_OPS)} THEN NULL WHEN flags & 3 <> 0 THEN 'w'
            WHEN name IN ('open', 'openat', 'fopen') AND flags IS NOT NULL THEN 'r' END AS mode
    FROM io
),
held AS (SELECT s, e, ckpt, mode FROM paired WHERE mode IS NOT NULL AND e IS NOT NULL),
st AS ({merged(_STAGES)})
SELECT {_outside_stages("(SELECT s, e FROM held WHERE mode = 'w')")},
    {_outside_stages("(SELECT s, e FROM held WHERE mode = 'w' AND ckpt)")},
    {_outside_stages("(SELECT s, e FROM held WHERE mode = 'r')")},
    (SELECT count(*) FILTER (WHERE mode = 'w') FROM held), (SELECT count(*) FILTER (WHERE mode = 'w' AND ckpt)
    FROM held), (SELECT count(*) FILTER (WHERE mode = 'r') FROM held)
"""
"""The main process's files opened in the measured steps (``_UNSTAGED``'s ``{parents}`` and ``{window}``), each
from its open to the end of the first close of its descriptor after it, on the same thread in the same iteration:
the time some of them were open outside every stage (the union of those intervals, less the main process's
stages), of those opened for writing, of those of them named as checkpoints (their saves) and of those opened for
reading only (an open's flags are its ``io.requested_bytes``), then how many of each were paired. A file's whole
time, what the program does between its calls included: ``torch.save``'s zip format computes a CRC of the data
before writing it, PIL encodes an image between its writes and decodes one between its reads."""

_THREADS = f"""
WITH w AS (SELECT ws, we FROM {{windows}}),
t AS MATERIALIZED (
    SELECT start_ns AS s, start_ns + dur_ns AS e, tid, span_id, name, dur_ns, {SPAN_PATH} AS path,
        TRY_CAST(attrs->>'$."{A.IO_FD}"' AS INTEGER) AS fd,
        TRY_CAST(attrs->>'$."{A.IO_REQUESTED_BYTES}"' AS BIGINT) AS flags,
        json_exists(attrs, '$."{A.IO_ERRNO}"') AS failed
    FROM spans WHERE run_id = $run AND level = 'io' AND pid = $main AND parent_id IS NULL AND {_LOOP_FILES}
),
tw AS (SELECT t.* FROM t ASOF JOIN w ON t.s >= w.ws WHERE t.s < w.we),
u AS ({merged("tw")}),
st AS ({merged(_STAGES)}),
by_path AS (
    SELECT path, sum(dur_ns) AS ns, coalesce(sum(dur_ns) FILTER (WHERE name IN {in_list(WRITE_OPS)}), 0) AS written,
        coalesce(sum(dur_ns) FILTER (WHERE name IN {in_list(READ_OPS)}), 0) AS read
    FROM tw GROUP BY path
),
top AS (
    SELECT path FROM by_path ORDER BY CASE WHEN (SELECT sum(written) >= sum(read) FROM by_path) THEN written
        ELSE read END DESC, ns DESC, path LIMIT 1
),
oc AS (  -- their opens by path and their closes, successful ones
    SELECT s, e, tid, span_id, name, fd, flags FROM t
    WHERE (name IN {in_list(FILE_OPEN_OPS)} OR name IN {in_list(CLOSE_OPS)}) AND NOT failed
),
nx AS (SELECT s, name, flags, lead(name) OVER k AS next_name, lead(e) OVER k AS next_e FROM oc
       WINDOW k AS (PARTITION BY tid, fd ORDER BY s, span_id)),
held AS (  -- each file from its open to the close that follows it on its thread, both in one measured iteration
    SELECT h.s, h.e FROM (SELECT s, next_e AS e FROM nx WHERE name IN {in_list(FILE_OPEN_OPS)} AND flags IS NOT NULL
                          AND next_name IN {in_list(CLOSE_OPS)}) h
    ASOF JOIN w ON h.s >= w.ws WHERE h.e <= w.we
),
hu AS ({merged("held")})
SELECT (SELECT coalesce(sum(least(u.e, w.we) - greatest(u.s, w.ws)), 0) FROM u JOIN w ON u.s < w.we AND u.e > w.ws)
    - (SELECT coalesce(sum(least(u.e, st.e) - greatest(u.s, st.s)), 0) FROM u JOIN st ON u.s < st.e AND u.e > st.s),
    (SELECT count(DISTINCT tid) FROM tw), (SELECT count(DISTINCT path) FROM tw), (SELECT path FROM top),
    (SELECT coalesce(sum(written), 0) FROM by_path), (SELECT coalesce(sum(read), 0) FROM by_path),
    (SELECT coalesce(sum(e - s), 0) FROM hu)
    - (SELECT coalesce(sum(least(hu.e, st.e) - greatest(hu.s, st.s)), 0) FROM hu JOIN st
       ON hu.s < st.e AND hu.e > st.s),
    (SELECT count(*) FROM held)
"""
"""The file I/O of the main process's other threads (their calls hang from no span: no model span is open on
their thread) in the measured iterations while no stage ran: the time some such call was under way (the union of
the calls, so that threads reading at once count once) in the iterations and outside every stage, the threads
that made them and the files, the file of the most write time, or of the most read time where all of them read
longer than they wrote (the kind the advice is about), and their write and read time; then the time
some file of theirs was open outside every stage (each from its open by path to the close of its descriptor that
follows on the same thread, both in the same measured iteration: ``numpy.load`` parses a header between its reads,
a decoder decodes; a log file a thread keeps open all along is not one), and how many such files were paired."""

_SYNCS = f"""
SELECT count(*), coalesce(sum(dur_ns), 0), arg_max({SPAN_PATH}, dur_ns) FROM spans
WHERE run_id = $run AND level = 'io' AND name IN {in_list(SYNC_OPS)} AND pid = $main AND {{measured}}
"""
"""The main process's fsync and fdatasync calls in the measured iterations: how many, their time and the file of
the longest."""

_RECEIVING = f"""
SELECT (SELECT CASE WHEN bool_and(attrs->>'$."{A.MODEL_THREAD_CPU_NS}"' IS NOT NULL)
                    THEN sum(TRY_CAST(attrs->>'$."{A.MODEL_THREAD_CPU_NS}"' AS BIGINT)) END
        FROM spans WHERE run_id = $run AND {STEP} AND {{past}}),
       (SELECT count(*) FROM {IO_SPANS} WHERE run_id = $run AND pid = $main AND name = 'mmap' AND cls = 'ipc'
        AND regexp_matches(path, '/torch_[0-9]+_') AND {{measured}})
"""
"""The CPU time of the loop's thread in the measured steps (NULL unless each of them recorded it), and the main
process's maps of PyTorch's shared-memory segments in them (``/dev/shm/torch_PID_N``: a tensor of a batch a worker
handed over, each its own segment)."""

_NOT_COVERED = """SELECT coalesce(sum(count), 0) FROM health WHERE run_id = $run AND "check" = 'io_not_covered'"""
"""The processes the io level did not cover (exec'd in a profile attached at run time: spawned DataLoader workers;
static binaries): their file I/O is unknown."""

_ANY_WAIT = f"SELECT count(*) > 0 FROM spans WHERE run_id = $run AND {DATALOADER}"
"""Whether the run has DataLoader spans at all (a loop without them has nothing to wait on)."""

_TOTALS_FROM_SPANS = f"""
SELECT pid, sum(dur_ns), sum(dur_ns) FILTER (WHERE name IN {in_list(READ_OPS)}),
    sum(dur_ns) FILTER (WHERE name IN {in_list(WRITE_OPS)}),
    sum(dur_ns) FILTER (WHERE name NOT IN {in_list(READ_OPS + WRITE_OPS)})
FROM {IO_SPANS} WHERE run_id = $run AND {IO_STORAGE} GROUP BY pid
"""

_TOTALS_FROM_FILES = f"""
SELECT pid, sum({FILE_TIME}), sum(read_time_ns), sum(write_time_ns), sum(meta_time_ns) FROM io_files
WHERE run_id = $run AND {FILE_STORAGE} GROUP BY pid
"""

COLUMNS = [
    Column("iteration", "count", "the step (or the stretch from one DataLoader wait to the next), from 1"),
    Column("duration", "ns"),
    Column("wait", "ns", "waiting for the DataLoader's next batch"),
    Column("compute", "ns", "the rest of the iteration"),
    Column("wait share", "pct", "wait / duration"),
    Column("main io in wait", "ns", "file I/O of the main process while it waited"),
    Column("main io in compute", "ns", "file I/O of the main process during the rest"),
    Column("worker io", "ns", "file I/O of the worker processes during the iteration, summed over them"),
    Column(
        "warm-up",
        "",
        "a warm-up iteration (a live run's first also pays for start-up, DataLoader workers "
        "included): in the table, left out of the chart, the verdict, the shares and the totals",
    ),  # fmt: skip
]


TOTAL_COLUMNS = [
    Column("process"),
    Column("io time", "ns", "time in file operations"),
    Column("read time", "ns"),
    Column("write time", "ns"),
    Column("metadata time", "ns", "open, close, seek, stat, mmap"),
]
"""The table without model spans: I/O time per process."""


def input_wait(store: Store, run_id: int, *, threshold_pct: float = WAIT_SHARE_PCT) -> Result:
    """Per iteration: its duration, the time it waited for the DataLoader and the rest (ns), the wait share (%),
    and the file I/O time (ns) of the main process during the wait and during the rest, and of the workers.

    Verdict (fact ``input_bound``): the measured iterations wait more than ``threshold_pct`` percent of their
    time, together (fact ``wait_share_pct``); none (None, fact ``dataloader_waits`` false, and a label) for a
    loop of steps with no DataLoader spans: its waits are 0 by construction, whatever it spends loading data.
    Not the median iteration's share: with several workers the waits often alternate (a long one while every
    worker is busy, then a few short ones for the batches they queued), and the median then hides most of the
    time lost. The time at stake per iteration is the mean wait
    (``mean_wait_ns``); the medians are facts too. Facts ``main_syncs``, ``main_sync_ns`` and ``main_sync_path``:
    the main process's ``fsync``/``fdatasync`` calls in the measured iterations, their time, and the file of the
    longest (the loop waits for the disk in each).

    Notes: iterations are the step spans (``prof.step()``, ``ProfilerStep#N``); without them, the stretches from the
    start of one DataLoader wait to the start of the next (the last ends with the main process's last model span).
    Warm-up steps (a live run's first, which also starts the DataLoader's workers; a pass's --warmup) are rows of
    the table, marked, and left out of the chart, the verdict, the shares and the totals. The wait is the union of
    the DataLoader spans (``model.kind = 'dataloader'``, the profiler's ``enumerate(DataLoader)`` annotations)
    within the iteration; the rest is compute (forward, backward, optimizer, logging). I/O time is the summed
    duration of ``io`` spans, clipped to the iteration (and to the waits for the main process's share); workers'
    calls run in parallel, so their sum may exceed the iteration. Pipes and sockets are left out: the main process
    blocks reading them while it waits for a worker, which is the wait itself, not storage I/O. The main process is
    ``runs.config.pid``, else the process of most model spans; the helpers of multiprocessing (resource tracker,
    forkserver) and the programs started by exec (``subprocess``) are not workers. Without model spans (an imported
    Darshan log) the waits cannot be known: the I/O time totals are still given, per process, as ``io.processes``
    counts them (read + write + metadata time from ``io_files``, from the ``io`` spans when the run has no per-file
    counters: a Darshan log's DXT segments trace its POSIX reads and writes only, up to DXT's limit). The labels
    give each DataLoader's settings (``runs.config.dataloaders``) with the loop's waits for it, and the CPUs the
    program could use (fact ``cores``); fact ``dataloaders`` holds them. Fact ``not_covered``: the processes the
    io level did not cover (health ``io_not_covered``: started by exec in a profile attached at run time, as
    spawned DataLoader workers are; static binaries), whose file I/O is in none of these figures. Facts
    ``loop_programs``, ``loop_program_iterations``, ``loop_program_ns`` and ``loop_program_names``: the programs the
    main process started by exec in the measured iterations (``runs.config.io_programs``), the iterations that
    started one, the time one or more of them ran within them (``loop_program_lived_ns``: their lifetimes summed),
    and how many of each; ``worker_programs``, ``worker_program_ns`` and ``worker_program_names``, those its workers
    started (a program per item). Facts ``worker_cpu_pct`` and ``worker_run_delay_pct`` (with ``workers_timed``,
    ``worker_cpu_ns``, ``worker_run_delay_ns``, ``worker_lived_ns``, and ``main_cpus``, the CPUs the main process
    kept busy on average): the shares of the workers' lives they spent on a CPU and waiting in a run queue for one
    (``runs.config.io_process_cpu``, over their whole lives). Facts ``main_step_cpu_ns`` (the CPU time of the
    loop's thread in the measured steps), ``main_cpu_in_waits_pct`` (that time less the steps' compute, in % of
    their waits for data: at least how busy it kept itself while it waited) and
    ``main_shared_tensors_per_iteration`` (the segments of PyTorch's shared memory the main process mapped per
    iteration, ``/dev/shm/torch_*``: a tensor of a batch each).
    """
    check_options(ID, threshold_pct=threshold_pct)
    io = io_run(store, run_id)
    if io.ctx.pass_name == "merged" and (source := io_pass(store, io.ctx.config)) is not None:
        return _from_pass(input_wait(store, source[0], threshold_pct=threshold_pct), io.ctx.run_id, *source)
    if (lacking := io.lacking(ID, TITLE)) is not None:
        return lacking
    sql = _ITERATIONS.replace("{measured}", past_warmup(io.ctx.warmup))
    iterations = rows(store, sql.replace("{warm_batches}", str(warmup_steps(io.ctx.config))), io.run_id,
                      main=io.main_pid)  # fmt: skip
    if all(r[3] for r in iterations):  # every stretch before the warm-up's last batch: all of them count, as steps do
        iterations = [(*r[:3], False) for r in iterations]
    if not iterations:  # the run's totals, as io.processes counts them: a DXT trace holds only some operations
        per_pid = (
            rows(store, _TOTALS_FROM_FILES, io.run_id)
            if io.has_files
            else span_rows(store, _TOTALS_FROM_SPANS, io.run_id)
        )
        facts = {"lacking": "model", "input_bound": None, "threshold_pct": threshold_pct, **_totals(io, per_pid)}
        staged = bool(rows(store, f"SELECT count(*) FROM {_STAGES}", io.run_id, main=io.main_pid)[0][0])
        if staged:  # model stages but no iterations (a loop of forward calls): its file I/O between them
            facts |= _unstaged(store, io, 0, steps=False)
        return _totals_only(io, per_pid, facts, staged=staged)
    per_pid = (
        span_rows(store, _TOTALS_FROM_SPANS, io.run_id) if io.has_spans else rows(store, _TOTALS_FROM_FILES, io.run_id)
    )
    table, worker_data = _per_iteration(store, io, iterations)
    kind = str(iterations[0][2])
    loaders = _loaders.dataloaders(store, io.ctx)
    waited = bool(rows(store, _ANY_WAIT, io.run_id)[0][0])
    # the verdict and the shares first: the overview shows a result's first facts
    facts = {**_loop_facts(table, threshold_pct, kind, waited=waited), **_totals(io, per_pid), "dataloaders": loaders}
    facts |= _worker_data(worker_data, facts["iterations"])
    measured = f"NOT {io.ctx.in_warmup()} AND NOT {io.ctx.after_last_step()}"
    syncs, sync_ns, sync_path = rows(store, _SYNCS.format(measured=measured), io.run_id, main=io.main_pid)[0]
    facts |= {"main_syncs": as_count(syncs), "main_sync_ns": as_count(sync_ns), "main_sync_path": sync_path}
    facts |= _unstaged(store, io, facts["iterations"], steps=kind == "steps")
    facts |= _programs(io, [(int(r[0]), int(r[1])) for r in iterations if not r[3]])
    facts |= cpu_facts(io)
    facts |= _receiving(store, io, facts, measured)
    facts["not_covered"] = as_count(rows(store, _NOT_COVERED, io.run_id)[0][0])
    return Result(
        ID,
        TITLE,
        COLUMNS,
        table,
        notes=notes_of(input_wait),
        run_id=io.run_id,
        chart=Chart(
            "stacked",
            x="iteration",
            y=("wait", "compute"),
            title="Each iteration: waiting for data vs the rest",
            # a live run's first iteration also starts the workers: drawn, it sets the scale (seconds against the
            # measured iterations' milliseconds); it stays in the table, left out as model.stages' chart leaves it
            extra={"exclude": {"warm-up": "yes"}},
        ),
        facts=facts,
        labels=_labels(io, kind, table, waited=waited)
        + _loaders.labels(loaders, facts["cores"], facts["local_ranks"])
        + _mapped(store, io),
    )


NO_ITERATIONS = (
    "no step or DataLoader spans: no iterations whose waits for data to judge; I/O totals, and the main process's "
    "file I/O between its model stages (main_io_unstaged_*)"
)
"""The label of a run with model stages but no iterations (a loop of forward calls, without xstack.step())."""

NO_WAITS = (
    "no DataLoader waits: the loop has no enumerate(DataLoader) spans, so every wait is 0 by construction and "
    "whether it is input-bound is not judged; data it loads itself is in its compute ('main io in compute')"
)
"""The label of a loop of steps that never waited on a DataLoader."""


def _from_pass(r: Result, run_id: int, source: int, pass_name: str) -> Result:
    """``r``, computed on the io pass ``source`` of the merged run ``run_id``, said to be so (fact
    ``source_run``)."""
    if r.missing:
        return r
    said = (f"from the io pass (run {source}, {pass_name}): a merged run holds one iteration of medians, which hide "
            "waits that alternate from one step to the next")  # fmt: skip
    return dataclasses.replace(r, run_id=run_id, facts={**r.facts, "source_run": source}, labels=[said, *r.labels])


def _mapped(store: Store, io: IoRun) -> list[str]:
    """Where data files were mapped into memory, the I/O per iteration leaves their reads out."""
    files, size = mapped_files(store, io.run_id)
    return [mapped_label(files, size)] if files else []


def _labels(io: IoRun, kind: str, table: list[tuple[Any, ...]], *, waited: bool) -> list[str]:
    if kind != "steps":
        warm, batches = sum(1 for r in table if r[-1]), warmup_steps(io.ctx.config)
        came = "its first batch came" if batches == 1 else f"its first {batches:,} batches came"
        return ["no step spans: iterations run from one DataLoader wait to the next"
                + (f"; the first {counted(warm, 'iteration')}, until {came} (the workers' start-up), left out as "
                   "warm-up" if warm else "")]  # fmt: skip
    warmup = io.ctx.warmup_label()
    return ([] if waited else [NO_WAITS]) + ([warmup] if warmup and any(r[-1] for r in table) else [])


def _totals_only(io: IoRun, per_pid: list[tuple[Any, ...]], facts: dict[str, Any], *, staged: bool) -> Result:
    """Without iterations (model spans but no step or DataLoader spans: ``staged``; or no model spans at all): the I/O
    time of each process, its read, write and metadata parts (ns)."""
    table: list[tuple[Any, ...]] = [(io.process(pid), *(as_count(v) for v in times)) for pid, *times in per_pid]
    table.sort(key=lambda r: (-r[1], r[0]))
    return Result(
        ID,
        TITLE,
        TOTAL_COLUMNS,
        table,
        notes=notes_of(input_wait),
        run_id=io.run_id,
        chart=Chart("hbar", x="process", y=("io time",), title="I/O time per process", limit=40),
        facts=facts,
        labels=[
            NO_ITERATIONS if staged else "no step or DataLoader spans: the waits need the model level; I/O totals only"
        ],
    )


def _receiving(store: Store, io: IoRun, facts: dict[str, Any], measured: str) -> dict[str, Any]:
    """What receiving its batches cost the main process in the measured steps: ``main_step_cpu_ns`` (the CPU time
    of the loop's thread in them, ``A.MODEL_THREAD_CPU_NS``, not the process's, whose intra-op threads compute on
    several CPUs at once; None where the steps did not record it), ``main_cpu_in_waits_pct`` (that CPU time less
    the time the loop computed, in % of its waits for data: at least how busy the thread kept itself while it
    waited; None without waits or CPU figures), and ``main_shared_tensors`` with
    ``main_shared_tensors_per_iteration`` (the segments of shared memory it mapped, a tensor of a batch each)."""
    sql = _RECEIVING.replace("{past}", past_warmup(io.ctx.warmup)).replace("{measured}", measured)
    cpu, tensors = span_rows(store, sql, io.run_id, main=io.main_pid)[0]
    n, wait, compute = facts["iterations"], facts["wait_ns"], facts["compute_ns"]
    busy = None
    if cpu is not None and wait > 0:
        busy = min(100.0, max(0.0, 100.0 * (int(cpu) - compute) / wait))
    return {"main_step_cpu_ns": as_count(cpu) if cpu is not None else None, "main_cpu_in_waits_pct": busy,
            "main_shared_tensors": as_count(tensors),
            "main_shared_tensors_per_iteration": as_count(tensors) / n if n else None}  # fmt: skip


def _per_iteration(store: Store, io: IoRun, iterations: list[tuple[Any, ...]]
                   ) -> tuple[list[tuple[Any, ...]], tuple[Any, ...]]:  # fmt: skip
    """The table's rows, and the workers' data-file calls in the measured iterations (``_WORKER_DATA``), then their
    file I/O per measured iteration with each call capped at the ``CAPPED_QUANTILE`` of their calls' durations."""
    con = store.con
    con.execute("CREATE OR REPLACE TEMP TABLE _io_iterations (k INTEGER, s BIGINT, e BIGINT, warm BOOLEAN)")
    con.executemany(
        "INSERT INTO _io_iterations VALUES (?, ?, ?, ?)",
        [(k, s, e, bool(warm)) for k, (s, e, _, warm) in enumerate(iterations, 1)],
    )
    try:
        who = {"main": io.main_pid, "helpers": io.helper_pids}
        found = span_rows(store, _PER_ITERATION, io.run_id, **who)
        data = span_rows(store, _WORKER_DATA, io.run_id, **who, forked=_forked(io))[0]
    finally:
        con.execute("DROP TABLE IF EXISTS _io_iterations")
    out, measured_capped = [], []
    for k, dur, wait, main_wait, main_io, worker_io, capped in found:
        d, w, mw = as_count(dur), as_count(wait), as_count(main_wait)
        warm = "yes" if iterations[int(k) - 1][3] else ""
        out.append((int(k), d, w, d - w, pct(w, d), mw, as_count(main_io) - mw, as_count(worker_io), warm))
        if not warm:
            measured_capped.append(as_count(capped))
    data = (*data, sum(measured_capped) / len(measured_capped) if measured_capped else None)
    return out, data


def _loop_facts(rows: list[tuple[Any, ...]], threshold_pct: float, kind: str, *, waited: bool) -> dict[str, Any]:
    """The verdict, shares and totals of the measured iterations (the warm-up left out); no verdict (None) for a
    loop that has no DataLoader spans (``waited`` False): its waits are 0 whatever it spends loading data."""
    table = [r for r in rows if not r[8]]
    loop, wait = sum(r[1] for r in table), sum(r[2] for r in table)
    share = pct(wait, loop) if table else None
    return {
        "input_bound": None if share is None or not waited else share > threshold_pct,
        "dataloader_waits": waited,
        "wait_share_pct": share,
        "threshold_pct": threshold_pct,
        "mean_wait_ns": wait / len(table) if table else None,
        "median_wait_share_pct": median([r[4] for r in table if r[4] is not None]),
        "median_wait_ns": median([r[2] for r in table]),
        "iterations": len(table),
        "warmup_iterations": len(rows) - len(table),
        "iteration_kind": kind,
        "loop_ns": loop,
        "wait_ns": wait,
        "compute_ns": loop - wait,
        "main_io_wait_ns": sum(r[5] for r in table),
        "main_io_compute_ns": sum(r[6] for r in table),
        "worker_io_per_iteration_ns": sum(r[7] for r in table) / len(table),
    }


def _unstaged(store: Store, io: IoRun, iterations: int, *, steps: bool) -> dict[str, Any]:
    """Facts on the main process's file I/O in the measured steps but in no stage (``steps`` False: in a run
    without steps, between its first stage and its last): ``main_io_unstaged_ns`` (per measured iteration),
    ``main_io_unstaged_total_ns`` (all of it), ``main_io_unstaged_path`` (the file of the most of it, of its kind) and
    ``main_io_unstaged_kind`` (``write`` or ``read``: which took more of its time; None: neither, opens and
    closes), ``main_io_unstaged_files`` (the files), ``main_io_unstaged_iterations`` (the fewest measured
    iterations that hold ``MOST_OF`` its time; None without steps), ``main_io_unstaged_checkpoint_ns`` (all of
    it on files named as checkpoints), ``main_io_unstaged_checkpoints`` and
    ``main_io_unstaged_checkpoint_bytes`` (the opens of checkpoint files for writing, a save each, and the bytes
    written to them), ``main_io_unstaged_written_open_ns`` (the time some file opened for writing was open, from
    its open to its close, outside every stage: what the program did between its calls, encoding an image,
    included; None where none was closed in the iteration that opened it),
    ``main_io_unstaged_checkpoint_save_ns`` (the same of the checkpoints: their saves, serialising included) and
    ``main_io_unstaged_read_open_ns`` (the same of the files opened for reading only: decoding an image between
    its reads included; ``_HELD_OPEN``), those of the loop's own thread;
    ``thread_io_unstaged_ns`` (per measured iteration), ``thread_io_threads``, ``thread_io_files``,
    ``thread_io_path`` and ``thread_io_kind``, the same of its other threads (a thread pool that reads the batch
    while the loop waits on its results), as the time some call of theirs was under way outside every stage, and
    ``thread_io_open_ns`` (per measured iteration), the time some file of theirs was open there, from its open to
    its close in one iteration (what they did between its calls, such as ``numpy.load`` parsing its header,
    included; None where no file was paired) (``_THREADS``)."""
    total, path, written, read, files, most, ckpt_ns, ckpt_files, ckpt_bytes = rows(
        store, _in_no_stage(_UNSTAGED, io, steps=steps), io.run_id, main=io.main_pid
    )[0]
    writing_ns, saving_ns, reading_ns, writes, saves, reads = (
        rows(store, _in_no_stage(_HELD_OPEN, io, steps=steps), io.run_id, main=io.main_pid)[0]
        if files
        else (0, 0, 0, 0, 0, 0)
    )
    facts = {
        "main_io_unstaged_ns": as_count(total) / iterations if iterations else None,
        "main_io_unstaged_total_ns": as_count(total),
        "main_io_unstaged_path": path,
        "main_io_unstaged_kind": _kind(written, read),
        "main_io_unstaged_files": as_count(files),
        "main_io_unstaged_iterations": as_count(most) if steps else None,
        "main_io_unstaged_checkpoint_ns": as_count(ckpt_ns),
        "main_io_unstaged_checkpoints": as_count(ckpt_files),
        "main_io_unstaged_checkpoint_bytes": as_count(ckpt_bytes),
        "main_io_unstaged_written_open_ns": max(as_count(writing_ns), 0) if writes else None,
        "main_io_unstaged_checkpoint_save_ns": max(as_count(saving_ns), 0) if saves else None,
        "main_io_unstaged_read_open_ns": max(as_count(reading_ns), 0) if reads else None,
    }
    measured = io.ctx.measured_table()
    if measured is None or not iterations:
        return facts | {"thread_io_unstaged_ns": None, "thread_io_threads": 0, "thread_io_files": 0,
                        "thread_io_path": None, "thread_io_kind": None, "thread_io_open_ns": None}  # fmt: skip
    total, threads, files, path, written, read, held, pairs = rows(
        store, _THREADS.replace("{windows}", measured[0]), io.run_id, main=io.main_pid
    )[0]
    return facts | {"thread_io_unstaged_ns": max(as_count(total), 0) / iterations, "thread_io_threads":
                    as_count(threads), "thread_io_files": as_count(files), "thread_io_path": path,
                    "thread_io_kind": _kind(written, read),
                    "thread_io_open_ns": max(as_count(held), 0) / iterations if pairs else None}  # fmt: skip


def _in_no_stage(template: str, io: IoRun, *, steps: bool) -> str:
    """``template`` (``_UNSTAGED``, ``_HELD_OPEN``) over the measured steps, or (``steps`` False) over a run's region
    between its first stage and its last."""
    parts = _UNSTAGED_STEPS if steps else _UNSTAGED_REGION
    sql = template.replace("{parents}", parts["parents"]).replace("{window}", parts["window"])
    sql = sql.replace("{measured}", past_warmup(io.ctx.warmup))
    return sql if steps else sql.replace("WITH steps AS", f"WITH _st AS {_STAGES}, steps AS", 1)


def _programs(io: IoRun, windows: list[tuple[int, int]]) -> dict[str, Any]:
    """Facts on the programs started by exec in the measured iterations ``windows`` (``(start, end)`` ns, in order;
    ``runs.config.io_programs``): by the main process, ``loop_programs`` (how many), ``loop_program_iterations``
    (the iterations that started one), ``loop_program_ns`` (the time some of them ran, from their start to their
    exit or the end of the iteration: the union of their lifetimes, programs run side by side counted once),
    ``loop_program_lived_ns`` (their lifetimes summed), ``loop_program_names`` (program -> times started, the most
    first) and ``loop_program_builds`` (those that are compilers, assemblers or linkers: torch.compile building
    code); by its workers (a program per item in a dataset's ``__getitem__``), ``worker_programs``,
    ``worker_program_ns``, ``worker_program_lived_ns`` and ``worker_program_names``. The programs those started (a
    shell's commands) lie within their lifetimes and are not counted again."""
    starts = [w[0] for w in windows]
    found: dict[str, dict[str, int]] = {"loop": {}, "worker": {}}
    spans: dict[str, list[tuple[int, int]]] = {"loop": [], "worker": []}
    held: set[int] = set()
    builds = 0
    for e in io.programs.values():
        start, end, ppid = e.get("start_ns"), e.get("end_ns"), e.get("ppid")
        if not isinstance(start, int) or not isinstance(end, int) or ppid in io.programs or ppid in io.helpers:
            continue
        k = bisect.bisect_right(starts, start) - 1
        if k < 0 or start >= windows[k][1]:
            continue
        who = "loop" if ppid == io.main_pid else "worker"
        spans[who].append((start, max(start, min(end, windows[k][1]))))
        found[who][str(e["program"])] = found[who].get(str(e["program"]), 0) + 1
        if who == "loop":
            held.add(k)
            builds += e.get("build") is True
    facts: dict[str, Any] = {"loop_program_iterations": len(held), "loop_program_builds": builds}
    for who, listed in spans.items():
        facts |= {f"{who}_programs": len(listed), f"{who}_program_ns": _covered(listed),
                  f"{who}_program_lived_ns": sum(e - s for s, e in listed),
                  f"{who}_program_names": dict(sorted(found[who].items(), key=lambda kv: (-kv[1], kv[0])))}  # fmt: skip
    return facts


def _covered(intervals: list[tuple[int, int]]) -> int:
    """The time (ns) that some of ``intervals`` (``(start, end)``) cover: each instant once."""
    total, reach = 0, None
    for s, e in sorted(intervals):
        if reach is None or s > reach:
            total, reach = total + e - s, e
        elif e > reach:
            total, reach = total + e - reach, e
    return total


def _kind(written: Any, read: Any) -> str | None:
    """``write`` or ``read``: which took more of a file's call time; None where neither did (opens, closes)."""
    return None if not (written or read) else "write" if as_count(written) >= as_count(read) else "read"


def _forked(io: IoRun) -> bool:
    """Whether every DataLoader with workers the run recorded forks them (``start_method``), so that they inherit
    the main process's memory mappings; False where none is known to."""
    loaders = [d for d in io.ctx.config.get("dataloaders") or [] if isinstance(d, dict) and d.get("num_workers")]
    return bool(loaders) and all(d.get("start_method") == "fork" for d in loaders)


def _worker_data(data: tuple[Any, ...], iterations: int) -> dict[str, Any]:
    """Per measured iteration, the workers' reads of data files, their opens of them (neither a descriptor's dup
    nor a stream opened on a descriptor is one: ``mmap.mmap`` dups the one it maps, and ``numpy.load`` reads a file
    it opened through ``fdopen`` of a dup of its descriptor) and the bytes they read;
    the data files they read over those iterations and the one of the most read time (None without iterations);
    the data files they mapped into memory, whose reads are page faults and in none of these figures
    (``worker_mapped_files``), the one of the largest mapping (``worker_mapped_path``) and its size in bytes
    (``worker_mapped_bytes``, None where unknown), and whether the main process mapped it before they forked
    (``worker_mapped_inherited``: a Hugging Face dataset or a ``numpy.memmap`` opened in the dataset's
    ``__init__``; counted only where every DataLoader with workers forks them); the directories they listed per
    measured iteration (``worker_listings_per_iteration``), the time their reads of the entries took
    (``..._ns_per_iteration``), the entries of a listing on average (``worker_listing_entries``) and the directory
    listed most (``worker_listing_path``); the data files they read that are compressed streams
    (``worker_compressed_files``, of ``worker_data_files``), whose every byte they decompress; and the workers' file
    I/O per measured iteration with each call's time capped at the 99th percentile of their calls'
    (``worker_io_capped_per_iteration_ns``): on CPUs the loop and its workers contend for, a few calls of a few
    microseconds are switched out as they return and last milliseconds, a time no I/O took (a DataLoader's 4,800
    reads from an HDF5 file: 1.35 us median, 4.7 us at the 99th percentile, 38 ms in all against 6.5 ms for as many
    at the median, some calls of 4.5 ms)."""
    reads, opens, files, read_bytes, path = data[:5]  # the data files read in the measured iterations
    mapped, mapped_path, mapped_bytes, inherited = data[5:9]  # mapped into memory
    listings, listing_ns, entries, listed_path = data[9:13]  # the folders listed
    compressed, capped = data[13:15]
    per = (lambda n: as_count(n) / iterations) if iterations else (lambda n: None)
    return {
        "worker_data_reads_per_iteration": per(reads),
        "worker_data_opens_per_iteration": per(opens),
        "worker_data_read_bytes_per_iteration": per(read_bytes),
        "worker_data_files": as_count(files),
        "worker_data_path": path,
        "worker_mapped_files": as_count(mapped),
        "worker_mapped_path": mapped_path,
        "worker_mapped_bytes": None if mapped_bytes is None else int(mapped_bytes),
        "worker_mapped_inherited": bool(inherited),
        "worker_listings_per_iteration": per(listings),
        "worker_listing_ns_per_iteration": per(listing_ns),
        "worker_listing_entries": as_count(entries) / as_count(listings) if as_count(listings) else None,
        "worker_listing_path": listed_path,
        "worker_compressed_files": as_count(compressed),
        "worker_io_capped_per_iteration_ns": capped,
    }


def _totals(io: IoRun, per_pid: list[tuple[Any, ...]]) -> dict[str, Any]:
    """I/O time of the whole run (ns): all of it, read, write and metadata time, the main process's and the
    workers'; and the worker count (None where no main process is known)."""
    known = io.main_pid is not None
    workers = [r for r in per_pid if io.role(r[0]) == "worker"]
    return {
        "io_ns": sum(as_count(r[1]) for r in per_pid),
        "read_time_ns": sum(as_count(r[2]) for r in per_pid),
        "write_time_ns": sum(as_count(r[3]) for r in per_pid),
        "meta_time_ns": sum(as_count(r[4]) for r in per_pid),
        "main_io_ns": sum(as_count(r[1]) for r in per_pid if r[0] == io.main_pid) if known else None,
        "worker_io_ns": sum(as_count(r[1]) for r in workers) if known else None,
        "workers": len(workers) if known else None,
        "cores": _loaders.cores(io.ctx.config),
        "local_ranks": _loaders.local_ranks(io.ctx.config),
    }
