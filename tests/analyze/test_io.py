"""The I/O analyses on built stores whose numbers are worked out by hand (``tests/analyze/io_store.py``), their
"lacking the io level" answer on runs without I/O, the I/O rules firing and staying silent, and a real Darshan
log when its importer is there."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.analyze.io_store import (
    FILES,
    MAIN,
    W1,
    W2,
    add_files,
    data_file,
    files_store,
    io_span,
    loop_store,
)
from tests.analyze.test_timeline import union as union_of
from tests.conftest import skip_without_torch
from xstack.analyze import _io_loop, io
from xstack.analyze._recommend_common import loop_waits_for_data
from xstack.analyze._recommend_input import _hdf5, _reading_share, cheaper
from xstack.analyze._recommend_loop import FED_BY_PROCESSES, THREADS_READ_MANY
from xstack.analyze.pipeline import ANALYSES, Recommendation, analyze, run_analyses
from xstack.analyze.recommend import (
    HDF5_SMALL_READS,
    PACK_CACHED_AFTER_FIRST,
    PACK_CACHED_FILES,
    PACK_STAGED_FILES,
    RULES,
    SAVE_FEWER_CHECKPOINTS,
    SCATTERED_READS,
    STAGE_SMALL_FILES,
    WRITE_FEWER_FILES,
    recommend,
)
from xstack.analyze.result import Result, format_ns
from xstack.analyze.summary import summarize
from xstack.errors import UsageError
from xstack.report._charts import render_chart
from xstack.report.formats import md_result, render_markdown
from xstack.report.html import render_html
from xstack.report.terminal import io_line
from xstack.trace import attrs as A
from xstack.trace.sink import Sink
from xstack.trace.store import RunInfo, Store

IO_IDS = [i for i in ANALYSES if i.startswith("io.")]
FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "darshan"


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Store]:
    with loop_store(tmp_path / "loop.duckdb") as store:
        yield store


@pytest.fixture
def darshan_like(tmp_path: Path) -> Iterator[Store]:
    with files_store(tmp_path / "files.duckdb", FILES) as store:
        yield store


def _one(store: Store, id: str, **options: Any) -> Result:
    return run_analyses(store, None, [id], **({id: options} if options else {}))[0]


def _fired(store: Store, rule: str) -> Recommendation | None:
    return RULES[rule]({r.id: r for r in run_analyses(store)})


def _row(result: Result, key: Any) -> dict[str, Any]:
    return next(r for r in result.to_records() if r[result.columns[0].name] == key)


# -- registry and the run without I/O ------------------------------------------------------------------------
def test_the_io_analyses_come_after_the_timeline_ones_and_before_health() -> None:
    ids = list(ANALYSES)
    assert IO_IDS == ["io.input_bound", "io.files", "io.processes", "io.bandwidth", "io.sizes", "io.pattern",
                      "io.small_files"]  # fmt: skip
    assert (
        ids.index("timeline.memory") < ids.index("io.input_bound") and ids.index("io.small_files") + 1 == len(ids) - 1
    )


def test_a_run_without_io_says_it_lacks_the_io_level(tmp_path: Path) -> None:
    with Store.create(tmp_path / "plain.duckdb") as store:
        store.add_run(RunInfo(1, "plain", levels=["model"]))
        sink = Sink(store, 1)
        sink.span(1, None, "model", "step#0", 0, 1000, 1, 1, {A.MODEL_KIND: "step"})
        sink.span(2, 1, "model", "dataloader.next", 0, 900, 1, 1, {A.MODEL_KIND: "dataloader"})
        sink.close()
    with Store.open(tmp_path / "plain.duckdb") as store:
        results = {r.id: r for r in run_analyses(store, ids=IO_IDS)}
        for r in results.values():
            assert r.missing == ["io"] and not r.rows and not r.facts, r.id
            assert "io level" in r.hint and "Darshan" in r.hint
        assert summarize(store).io is None
        a = analyze(store)
        assert {r.rule for r in a.recommendations} == {"input_bound"}  # from model.stages only: 90% waiting
        rec = a.recommendations[0]
        assert rec.sources == ["model.stages"] and "stage many small files" in rec.action


# -- io.input_bound ------------------------------------------------------------------------------------------
def test_a_run_that_recorded_the_io_level_and_read_no_file_is_analysed_not_sent_to_record_it(tmp_path: Path) -> None:
    # an in-memory dataset: the io level ran over the whole region and found no file operation in it
    with Store.create(tmp_path / "mem.duckdb") as store:
        store.add_run(RunInfo(1, "mem", levels=["model", "io"], config={"pid": 1}))
        sink = Sink(store, 1)
        for k in range(3):
            sink.span(1 + k, None, "model", f"step#{k}", 1000 * k, 1000, 1, 1, {A.MODEL_KIND: "step"})
            sink.span(10 + k, 1 + k, "model", "dataloader.next", 1000 * k, 900, 1, 1, {A.MODEL_KIND: "dataloader"})
        sink.close()
    with Store.open(tmp_path / "mem.duckdb") as store:
        results = {r.id: r for r in run_analyses(store, ids=IO_IDS)}
        rec = next(r for r in analyze(store).recommendations if r.rule == "input_bound")
    assert not any(r.missing for r in results.values()), [r.id for r in results.values() if r.missing]
    bound = results["io.input_bound"]
    assert [row[:5] for row in bound.rows] == [(k + 1, 1000, 900, 100, 90.0) for k in range(3)]
    assert bound.facts["input_bound"] is True and rec.sources == ["model.stages", "io.input_bound"]
    assert not results["io.files"].rows and not results["io.small_files"].rows


def test_input_bound_shows_the_warm_up_marked_and_leaves_it_out_of_the_verdict(tmp_path: Path) -> None:
    """A live run's first iteration also starts the DataLoader's workers: its long wait is shown (marked in the
    table) but is no evidence of an input-bound loop, and it is left out of the chart, whose scale it would set."""
    from xstack.report._charts import render_chart

    with loop_store(tmp_path / "warm.duckdb", config={"pid": MAIN, A.CONFIG_WARMUP_STEPS: 1},
                    waits=(900, 100, 50)) as store:  # fmt: skip
        r = _one(store, "io.input_bound")
    assert [(row[0], row[4], row[8]) for row in r.rows] == [(1, 90.0, "yes"), (2, 10.0, ""), (3, 5.0, "")]
    f = r.facts
    assert (f["iterations"], f["warmup_iterations"], f["loop_ns"], f["wait_ns"]) == (2, 1, 2000, 150)
    assert (f["median_wait_share_pct"], f["input_bound"]) == (7.5, False)
    assert r.labels == ["iteration 1 left out as warm-up: it also pays for start-up (--warmup 0 counts it)"]
    svg = render_chart(r)
    ticks = re.findall(r'<text class="tick"[^>]*text-anchor="end">([^<]*)<title>', svg)
    assert ticks == ["2", "3"] and "fill-opacity" not in svg  # the measured iterations alone, none faded
    assert "<figcaption>rows not marked warm-up: 2 of 3</figcaption>" in svg


def test_input_bound_judges_the_loop_s_whole_wait_not_the_median_iteration(tmp_path: Path) -> None:
    """Two workers: a long wait while both are busy, then short ones for the batches they queued. The median
    iteration hardly waits (1%), yet the loop loses 28.6% of its time: that is the verdict and the time at stake."""
    with loop_store(tmp_path / "alt.duckdb", waits=(700, 10, 10, 700, 10)) as store:
        r = _one(store, "io.input_bound")
        rec = _fired(store, "input_bound")
    f = r.facts
    assert (f["median_wait_share_pct"], f["median_wait_ns"]) == (1.0, 10.0)
    assert (f["wait_share_pct"], f["mean_wait_ns"], f["input_bound"]) == (28.6, 286.0, True)
    assert rec is not None and rec.impact_ns == 286
    line = next(e for e in rec.evidence if e.endswith("(io.input_bound)"))
    assert (
        "the loop waits 28.6% of its time" in line
        and "286 ns per iteration on average over 5 iterations (median" in line
    )


@contextmanager
def _merged_loop(path: Path, waits: tuple[int, ...], *, median_wait: int) -> Iterator[Store]:
    """The loop of ``waits`` as its io pass (run 1), and a merged run (run 2) of one 1 us step whose DataLoader
    wait is ``median_wait``: the store, open for writing."""
    with loop_store(path, waits=waits):
        pass
    with Store.open(path, read_only=False) as store:
        merge = {"passes": [], "counter_passes": [{"pass": "model+io", "run_id": 1}]}
        store.add_run(
            RunInfo(2, "loop", pass_name="merged", levels=["model", "io"], config={"pid": MAIN, "merge": merge})
        )
        sink = Sink(store, 2)
        sink.span(1, None, "model", "step", 0, 1000, MAIN, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: 0})
        sink.span(2, 1, "model", "dataloader.next", 0, median_wait, MAIN, 1, {A.MODEL_KIND: "dataloader"})
        sink.close()
        yield store


def test_a_merged_run_s_input_bound_is_read_from_its_io_pass(tmp_path: Path) -> None:
    """A merged run holds one iteration of medians: its one DataLoader wait is the median wait (10 ns), which
    hides the long waits that alternate with short ones. The analysis reads the io pass's own iterations."""
    with _merged_loop(tmp_path / "m.duckdb", (700, 10, 10, 700, 10), median_wait=10) as store:
        r = run_analyses(store, 2, ["io.input_bound"])[0]
        pass_alone = run_analyses(store, 1, ["io.input_bound"])[0]
    assert r.run_id == 2 and r.facts == {**pass_alone.facts, "source_run": 1} and r.rows == pass_alone.rows
    assert (r.facts["wait_share_pct"], r.facts["input_bound"]) == (28.6, True)
    assert r.labels[0].startswith("from the io pass (run 1, model+io): a merged run holds one iteration of medians")


def test_input_bound_splits_each_step_into_wait_and_compute_and_places_the_io(loop: Store) -> None:
    r = _one(loop, "io.input_bound")
    # iteration, duration, wait, compute, share, main io in wait, main io in compute, worker io, warm-up
    assert r.rows == [
        (1, 1000, 300, 700, 30.0, 50, 20, 150, ""),  # read 100-150 in the wait, open 500-520 after; workers 100 + 50
        (2, 1000, 100, 900, 10.0, 50, 50, 150, ""),  # read 1050-1150 straddles the wait's end; workers 50 + 100
        (3, 1000, 500, 500, 50.0, 0, 0, 300, ""),
    ]
    f = r.facts
    assert (f["iterations"], f["iteration_kind"]) == (3, "steps")
    assert (f["loop_ns"], f["wait_ns"], f["compute_ns"]) == (3000, 900, 2100)
    assert (f["wait_share_pct"], f["median_wait_share_pct"], f["median_wait_ns"]) == (30.0, 30.0, 300.0)
    assert f["input_bound"] is True and f["threshold_pct"] == 10.0
    # the pipe read (90 ns) is the wait itself, not storage I/O: left out everywhere
    assert (f["io_ns"], f["main_io_ns"], f["worker_io_ns"], f["workers"]) == (770, 170, 600, 2)
    assert (f["main_io_wait_ns"], f["main_io_compute_ns"], f["worker_io_per_iteration_ns"]) == (100, 70, 200.0)
    # each worker call counted at most the 99th percentile of theirs (100, 100, 100 and 300 ns: 294 ns)
    assert f["worker_io_capped_per_iteration_ns"] == pytest.approx((150 + 150 + 294) / 3)
    assert (f["read_time_ns"], f["write_time_ns"], f["meta_time_ns"]) == (750, 0, 20)  # the open is metadata
    assert r.chart is not None and r.chart.y == ("wait", "compute") and not r.labels
    assert _one(loop, "io.input_bound", threshold_pct=30.0).facts["input_bound"] is False  # above, not at
    with pytest.raises(UsageError, match="io.input_bound: threshold_pct"):
        _one(loop, "io.input_bound", threshold_pct=0)


def test_without_steps_iterations_run_from_one_dataloader_wait_to_the_next(tmp_path: Path) -> None:
    with loop_store(tmp_path / "s.duckdb", steps=False) as store:
        r = _one(store, "io.input_bound")
    # the last iteration ends with the forward span, at 2900
    assert [row[:5] for row in r.rows] == [
        (1, 1000, 300, 700, 30.0),
        (2, 1000, 100, 900, 10.0),
        (3, 900, 500, 400, 500 / 9),
    ]
    assert r.facts["iteration_kind"] == "dataloader waits" and "no step spans" in r.labels[0]


def test_a_loop_with_no_dataloader_says_its_waits_are_zero_by_construction_and_gives_no_verdict(tmp_path: Path) -> None:
    """Steps that load their data themselves: no enumerate(DataLoader) spans, so nothing to wait on. Every wait is
    0, which the result says, and it does not call the loop 'not input-bound' (nor does the rule fire)."""
    with loop_store(tmp_path / "nodl.duckdb", dataloader=False) as store:
        r = _one(store, "io.input_bound")
        rec = _fired(store, "input_bound")
    assert [row[2] for row in r.rows] == [0, 0, 0]
    assert r.facts["input_bound"] is None and r.facts["dataloader_waits"] is False
    assert r.labels[0].startswith("no DataLoader waits: the loop has no enumerate(DataLoader) spans, so every wait")
    assert rec is None
    with loop_store(tmp_path / "dl.duckdb") as store:
        assert _one(store, "io.input_bound").facts["dataloader_waits"] is True


def test_without_model_spans_the_io_totals_are_still_given(darshan_like: Store) -> None:
    r = _one(darshan_like, "io.input_bound")
    assert r.available and r.facts["lacking"] == "model" and r.facts["input_bound"] is None
    # read + write + metadata time of every file but the pipe, per process
    assert r.rows == [("pid 100", 3130, 1005, 2000, 125), ("pid 201", 440, 350, 0, 90), ("pid 202", 310, 260, 0, 50)]
    f = r.facts
    assert (f["io_ns"], f["read_time_ns"], f["write_time_ns"], f["meta_time_ns"]) == (3880, 1615, 2000, 265)
    assert f["main_io_ns"] is None and f["workers"] is None  # no main process known
    assert "model level" in r.labels[0]


# -- io.files and io.processes --------------------------------------------------------------------------------
def test_files_fold_system_and_python_files_and_sort_by_time(darshan_like: Store) -> None:
    r = _one(darshan_like, "io.files")
    assert r.column("path") == ["<pipe>", "/out/ckpt.pt", "/d/a.bin", "/d/s1.jpg", "/d/s2.jpg", "(python files)",
                                "/d/listing.txt", "(system files)"]  # fmt: skip
    a = _row(r, "/d/a.bin")
    assert (a["class"], a["files"], a["processes"], a["opens"], a["reads"], a["bytes read"], a["time"]) == (
        "data",
        1,
        1,
        2,
        10,
        5_242_880,
        1100,
    )
    assert a["bandwidth"] == 5_242_880 * 1e9 / 1000 and a["sequential share"] == 80.0 and a["consecutive share"] == 60.0
    assert a["zero reads"] == 2
    py = _row(r, "(python files)")  # one path read by two workers
    assert (py["files"], py["processes"], py["reads"], py["bytes read"], py["time"], py["zero reads"]) == (
        1,
        2,
        4,
        80_000,
        130,
        2,
    )
    assert py["bandwidth"] == 80_000 * 1e9 / 110
    assert _row(r, "(system files)")["module"] == "STDIO"
    assert _row(r, "/out/ckpt.pt")["sequential share"] is None  # no reads
    f = r.facts
    assert (f["files"], f["data_files"], f["processes"], f["opens"], f["reads"], f["writes"]) == (7, 5, 3, 9, 25, 9)
    assert f["streams"] == 1  # <pipe>: a row of its own, not a file, as in io.processes and the summary
    assert (f["bytes_read"], f["bytes_written"], f["time_ns"]) == (5_327_580, 8_389_108, 1_003_890)
    listed = _one(darshan_like, "io.files", all_paths=True)
    assert "/usr/lib/python3.11/os.py" in listed.column("path") and "/etc/hosts" in listed.column("path")
    top = _one(darshan_like, "io.files", limit=2)
    assert top.rows == r.rows[:2] and top.truncated == 6 and top.facts == r.facts and f["rows"] == 8
    assert r.labels == [
        "7 files, and 1 stream (<pipe>) that io.processes, the other I/O analyses and the summary "
        "leave out, in 8 rows: one per path and module, and one per folded class (python, system)"
    ]
    assert top.labels == [r.labels[0] + "; the 2 rows with the most I/O time are listed, 6 left out by the row limit: "
                          f"the store's io_files view has every file, a row per process (duckdb -readonly "
                          f"{darshan_like.path} \"SELECT * FROM io_files WHERE run_id = 1\"; in Python, "
                          "file_table(store, 1, limit=None) lists every row)"]  # fmt: skip
    query = top.labels[0].split('"')[1]  # what a user of the CLI runs: every file, every process
    assert len(darshan_like.query(query)) == len(FILES) and "SELECT * FROM io_files WHERE run_id = N" in top.notes
    assert len(io.file_table(darshan_like, 1, limit=None).rows) == f["rows"]


def test_files_fold_directories_and_the_profiler_s_files_too(tmp_path: Path) -> None:
    def meta(pid: int, path: str, cls: str, opens: int) -> tuple[Any, ...]:
        return (pid, path, "POSIX", opens, 0, 0, 0, 0, 0, 0, 0, 10 * opens, {A.IO_FILE_PATH_CLASS: cls})

    rows = [meta(MAIN, "/d", "directory", 1), meta(W1, "/d", "directory", 2), meta(MAIN, "/d/sub", "directory", 1),
            meta(MAIN, "/src/xstack/runner.py", "profiler", 1)]  # fmt: skip
    with files_store(tmp_path / "f.duckdb", FILES + rows) as store:
        r = _one(store, "io.files")
        listed = _one(store, "io.files", all_paths=True)
    d = _row(r, "(directories)")
    assert (d["class"], d["files"], d["processes"], d["opens"], d["time"]) == ("directory", 2, 2, 4, 40)
    assert _row(r, "(profiler files)")["files"] == 1
    assert not {"/d", "/d/sub", "/src/xstack/runner.py"} & set(r.column("path"))
    assert {"/d", "/d/sub", "/src/xstack/runner.py"} <= set(listed.column("path"))
    assert r.facts["data_files"] == 5  # neither is data


def test_processes_from_the_counters_name_main_and_workers(tmp_path: Path) -> None:
    with files_store(tmp_path / "f.duckdb", FILES, config={"pid": MAIN}) as store:
        r = _one(store, "io.processes")
    assert r.column("process") == [f"main (pid {MAIN})", f"worker (pid {W1})", f"worker (pid {W2})"]
    main = _row(r, f"main (pid {MAIN})")  # a.bin, hosts, ckpt: the pipe is left out
    assert (main["ops"], main["reads"], main["writes"], main["bytes read"], main["bytes written"]) == (
        21,
        11,
        4,
        5_243_080,
        8_388_608,
    )
    assert (main["data bytes read"], main["io time"], main["files"]) == (5_242_880, 3130, 3)
    assert main["bandwidth"] == (5_243_080 + 8_388_608) * 1e9 / 3005
    w1 = _row(r, f"worker (pid {W1})")
    assert (w1["ops"], w1["bytes read"], w1["data bytes read"], w1["io time"], w1["files"]) == (
        10,
        41_000,
        1000,
        440,
        3,
    )
    f = r.facts
    assert (f["processes"], f["workers"], f["main_io_ns"], f["worker_io_ns"], f["io_ns"]) == (3, 2, 3130, 750, 3880)
    assert f["worker_io_pct"] == 100 * 750 / 3880


def test_processes_without_counters_come_from_the_spans(tmp_path: Path) -> None:
    with loop_store(tmp_path / "s.duckdb", files=False) as store:
        r = _one(store, "io.processes")
        assert _one(store, "io.files").rows == []
    main = _row(r, f"main (pid {MAIN})")
    assert (main["ops"], main["reads"], main["bytes read"], main["io time"], main["files"]) == (3, 2, 8192, 170, 1)
    assert _row(r, f"worker (pid {W2})")["io time"] == 400


# -- io.bandwidth -------------------------------------------------------------------------------------------
def test_bandwidth_spreads_each_call_over_the_bins_it_overlaps(loop: Store) -> None:
    r = _one(loop, "io.bandwidth", bins=8)
    width = 375  # 3000 / 8: the bins span the run, its first step's start (0) to its last step's end (3000)
    assert r.facts["bin_ns"] == width and r.facts["bytes_read"] == 4096 * 2 + 999 + 3000
    total = {row[0]: row[2] for row in r.rows if row[1] == "all"}
    assert list(total) == [b * width for b in range(8)]  # from the run's first span (the step, at 0)
    # 1050-1150 straddles bins 2 and 3, 2100-2400 bins 5 and 6
    expected = {0: 4096 + 999, 2: 4096 * 0.75, 3: 4096 * 0.25, 5: 1500, 6: 1500}
    assert total == pytest.approx({b * width: expected.get(b, 0.0) for b in range(8)})
    assert list(dict.fromkeys(r.column("process"))) == ["all", f"main (pid {MAIN})", f"worker (pid {W2})",
                                                        f"worker (pid {W1})"]  # most bytes first  # fmt: skip
    assert r.facts["peak_bandwidth"] == pytest.approx((4096 + 999) * 1e9 / width)
    assert r.chart is not None and r.chart.kind == "line" and r.chart.series == "process"
    with pytest.raises(UsageError, match="io.bandwidth: bins"):
        _one(loop, "io.bandwidth", bins=0)


def test_a_merged_run_s_bandwidth_is_its_io_pass_s_over_the_pass(tmp_path: Path) -> None:
    """A merged run holds the I/O of its one merged iteration: its bins spanned that iteration's few calls (a
    DataLoader over a zip file: 50 bins of 25.7 us, over 1.3 ms of a 2-second pass). They are now the io pass's,
    its main process named by the merged run's pid, which the merge gives it (io.processes names it so too)."""
    with loop_store(tmp_path / "m.duckdb"):
        pass
    with Store.open(tmp_path / "m.duckdb", read_only=False) as store:
        merge = {"passes": [], "counter_passes": [{"pass": "model+io", "run_id": 1}]}
        store.add_run(
            RunInfo(2, "loop", pass_name="merged", levels=["model", "io"], config={"pid": 999, "merge": merge})
        )
        sink = Sink(store, 2)
        sink.span(1, None, "model", "step", 0, 1000, 999, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: 0})
        io_span(sink, 3, 1, "read", 100, 50, 999, "/d/a.bin", 4096, offset=0, tid=1)
        sink.close()
        r = run_analyses(store, 2, ["io.bandwidth"])[0]
        pass_alone = run_analyses(store, 1, ["io.bandwidth"])[0]
    assert r.run_id == 2 and r.facts == {**pass_alone.facts, "source_run": 1}
    assert r.facts["bytes_read"] == 4096 * 2 + 999 + 3000  # the pass's reads, not the merged iteration's one
    named = {f"main (pid {MAIN})": "main (pid 999)"}
    assert r.rows == [(t, named.get(p, p), *rest) for t, p, *rest in pass_alone.rows]
    assert f"worker (pid {W1})" in r.column("process")
    assert r.labels[0] == "from the io pass (run 1, model+io), over the pass: a merged run holds one iteration's I/O"


def test_bandwidth_draws_six_processes_and_sums_the_rest(tmp_path: Path) -> None:
    with Store.create(tmp_path / "w.duckdb") as store:
        store.add_run(RunInfo(1, "workers", levels=["io"]))
        sink = Sink(store, 1)
        for i in range(8):
            io_span(sink, i + 1, None, "read", 100 * i, 10, 300 + i, f"/d/{i}", 1000 + i)
        sink.close()
    with Store.open(tmp_path / "w.duckdb") as store:
        r = _one(store, "io.bandwidth", bins=4)
    names = list(dict.fromkeys(r.column("process")))
    assert names == ["all", *(f"pid {300 + i}" for i in range(7, 1, -1)), "2 other processes"]
    others = sum(row[2] for row in r.rows if row[1] == "2 other processes")
    assert others == pytest.approx(1000 + 1001)


def test_bandwidth_of_one_process_draws_its_line_once(tmp_path: Path, loop: Store) -> None:
    """The total of a run whose I/O is one process's is that process's line: drawn too, it lay hidden under it,
    a legend entry with no line to be seen. The table keeps it; with several processes it is drawn."""
    from xstack.report._charts import render_chart

    with Store.create(tmp_path / "one.duckdb") as store:
        store.add_run(RunInfo(1, "one", levels=["io"]))
        sink = Sink(store, 1)
        for i in range(4):
            io_span(sink, i + 1, None, "read", 100 * i, 10, 300, f"/d/{i}", 1000 + i)
        sink.close()
    with Store.open(tmp_path / "one.duckdb") as store:
        r = _one(store, "io.bandwidth", bins=4)
    assert list(dict.fromkeys(r.column("process"))) == ["all", "pid 300"]
    svg = render_chart(r)
    assert re.findall(r'class="legend"[^>]*>([^<]*)<', svg) == ["pid 300"] and svg.count('class="mark line"') == 1
    assert "<figcaption>all not drawn: only pid 300 read or wrote, its line is the total</figcaption>" in svg
    svg = render_chart(_one(loop, "io.bandwidth", bins=10))
    assert re.findall(r'class="legend"[^>]*>([^<]*)<', svg)[0] == "all" and svg.count('class="mark line"') == 4


def test_bandwidth_of_a_darshan_log_without_dxt_is_an_estimate(tmp_path: Path) -> None:
    row = data_file(7, "/d/x", 1000, 4, first_ns=0, last_ns=1000)
    with files_store(tmp_path / "f.duckdb", [row]) as store:
        r = _one(store, "io.bandwidth", bins=4)
    assert [x[2] for x in r.rows if x[1] == "all"] == pytest.approx([250.0] * 4)
    assert [x[0] for x in r.rows if x[1] == "all"] == [0, 250, 500, 750]
    assert r.labels[:2] == ["data files only (all_paths=True for every file)",
                            "estimated: each file's bytes spread over its first to last access (no DXT)"]  # fmt: skip


def test_bandwidth_bins_are_labelled_in_one_unit_and_span_the_run(tmp_path: Path) -> None:
    """A run whose data reads all came in its first 40 us (a Hugging Face dataset's metadata, read before the
    loop; its Arrow file is mapped) had its bandwidth drawn over those 40 us, in bins of 764 ns. The bins span
    the run, as the Perfetto trace does."""
    # a run of 120 ms, 50 bins of 2.40 ms: the first bin starts at "0.00 ms", not "0 ns", and the last at
    # "117.60 ms", not "118 ms"
    with Store.create(tmp_path / "b.duckdb") as store:
        store.add_run(RunInfo(1, "reads", levels=["io"]))
        sink = Sink(store, 1)
        io_span(sink, 1, None, "read", 0, 1_000, MAIN, "/d/a", 4096)
        io_span(sink, 2, None, "read", 39_000, 1_000, MAIN, "/d/a", 4096)
        # the interpreter's imports, the run's last call: every file's with all_paths, else left out
        io_span(sink, 3, None, "read", 119_999_000, 1_000, MAIN, "/usr/lib/python3.11/os.py", 40_000, cls="python")
        sink.close()
    with Store.open(tmp_path / "b.duckdb") as store:
        r = _one(store, "io.bandwidth")
        every = _one(store, "io.bandwidth", all_paths=True)
    assert r.facts["bin_ns"] == every.facts["bin_ns"] == 2_400_000 and r.labels == [
        "data files only (all_paths=True for every file)", "time bins of 2.40 ms, each labelled by its start"
    ]  # fmt: skip
    assert (r.facts["bytes_read"], every.facts["bytes_read"]) == (8192, 48_192)
    assert every.labels == ["time bins of 2.40 ms, each labelled by its start"]
    assert [row[2] for row in r.rows if row[1] == "all"] == [8192] + [0] * 49
    cells = [line.split(" | ")[0].removeprefix("| ") for line in md_result(r) if " | all | " in line]
    assert cells[:3] == ["0.00 ms", "2.40 ms", "4.80 ms"] and cells[-1] == "117.60 ms" and len(cells) == 50


# -- io.sizes, io.pattern, io.small_files ---------------------------------------------------------------------
def test_sizes_sum_the_histograms_and_estimate_file_sizes(darshan_like: Store) -> None:
    r = _one(darshan_like, "io.sizes")
    reads = dict(zip(r.column("size"), r.column("reads"), strict=True))
    assert {k: v for k, v in reads.items() if v} == {"0_100": 4, "100_1K": 2, "1K_10K": 1, "100K_1M": 7, "1M_4M": 1}
    writes = {k: v for k, v in zip(r.column("size"), r.column("writes"), strict=True) if v}
    assert writes == {"1M_4M": 4}
    files = {k: v for k, v in zip(r.column("size"), r.column("files"), strict=True) if v}
    assert files == {"100_1K": 1, "1K_10K": 1, "4M_10M": 2}  # s1 1000 B, s2 3000 B, a.bin 5 MiB, ckpt 8 MiB
    assert _row(r, "100K_1M")["of reads"] == 100 * 7 / 15 and _row(r, "4M_10M")["of files"] == 50.0
    assert _row(r, "1G_PLUS")["to"] is None  # open-ended
    f = r.facts
    assert (f["files_sized"], f["files_unsized"], f["largest_file_bytes"]) == (4, 1, 8_388_608)
    assert f["median_file_bytes"] == (3000 + 5_242_880) / 2
    # the 8th of 15 reads falls in 100K_1M (7 before it): interpolated half a read into its 7
    assert f["median_read_bytes"] == pytest.approx(102_401 + (1_048_576 - 102_401) * 0.5 / 7)
    assert r.labels == [
        "data files only (all_paths=True for every file)",
        "1 file never read or written (only opened or stat'ed), of unknown size, left out",
    ]
    every = _one(darshan_like, "io.sizes", all_paths=True)
    assert dict(zip(every.column("size"), every.column("reads"), strict=True))["10K_100K"] == 2
    assert every.facts["files_unsized"] == 2  # the listing and the pipe


def test_sizes_take_the_furthest_offset_of_the_calls(tmp_path: Path) -> None:
    with Store.create(tmp_path / "m.duckdb") as store:
        store.add_run(RunInfo(1, "mmap", levels=["io"]))
        sink = Sink(store, 1)
        io_span(sink, 1, None, "mmap", 0, 5, 9, "/d/big.npy", offset=0, **{A.IO_REQUESTED_BYTES: 50_000_000})
        sink.close()
        add_files(store, [(9, "/d/big.npy", "POSIX", 1, 0, 0, 0, 0, 0, 0, 0, 5, {"path_class": "data", "mmaps": 1})])
    with Store.open(tmp_path / "m.duckdb") as store:
        r = _one(store, "io.sizes")
    assert r.facts["largest_file_bytes"] == 50_000_000 and _row(r, "10M_100M")["files"] == 1


def test_pattern_splits_reads_per_class(darshan_like: Store) -> None:
    r = _one(darshan_like, "io.pattern")
    assert r.column("class") == ["data", "python", "system"]  # the pipe is left out
    data = _row(r, "data")
    assert data["reads"] == 15 and data["zero reads"] == 4 and data["zero share"] == pytest.approx(400 / 15)
    assert (data["consecutive"], data["sequential, not consecutive"], data["random"]) == pytest.approx(
        (700 / 15, 200 / 15, 600 / 15)
    )
    assert data["first after an open"] is None  # a Darshan log counts them with the random reads
    small = 4 + 2 - 4 + 3071 / 9216  # buckets under 1 KiB less the empty reads, a third of 1K-10K
    assert data["small reads"] == round(small) and data["small share"] == pytest.approx(100 * small / 15)
    # the median of the 11 reads that returned data: the 6th, 2.5 into the 7 of 100K_1M (3 below it)
    assert data["sized reads"] == 15 and data["median read"] == pytest.approx(102_401 + (1_048_576 - 102_401) * 2.5 / 7)
    py = _row(r, "python")  # one empty read and one of 10K-100K per file: the median is of the latter
    assert (py["random"], py["zero share"], py["small reads"]) == (100.0, 50.0, 0)
    assert py["median read"] == pytest.approx(10_241 + (102_400 - 10_241) * 0.5)
    assert _row(r, "system")["median read"] == pytest.approx(101 + 923 * 0.5)
    f = r.facts
    assert (f["reads"], f["zero_reads"], f["small_reads_exact"]) == (15, 4, False)
    assert (f["sized_reads"], f["small_reads_source"]) == (15, "size buckets")
    assert f["sequential_pct"] == pytest.approx(60.0) and f["random_pct"] == pytest.approx(40.0)
    assert "estimated" in r.labels[0]


def test_pattern_tells_the_first_read_after_an_open_from_random_reads(tmp_path: Path) -> None:
    # 100 files read whole in one read each (and an empty read at the end), then one read back after a seek
    whole = data_file(5, "/d/a", 400_000, 200, opens=100, seq_reads=100, consec_reads=100, open_reads=100)
    seeked = data_file(5, "/d/b", 1000, 2, opens=1, seq_reads=0, consec_reads=0, open_reads=1)
    with files_store(tmp_path / "o.duckdb", [whole, seeked]) as store:
        r = _one(store, "io.pattern")
    data = _row(r, "data")
    assert (data["reads"], data["consecutive"], data["first after an open"], data["random"]) == pytest.approx(
        (202, 100 * 100 / 202, 100 * 101 / 202, 100 * 1 / 202)
    )
    assert r.facts["open_read_pct"] == pytest.approx(100 * 101 / 202)


def test_pattern_counts_small_reads_exactly_from_spans(loop: Store) -> None:
    r = _one(loop, "io.pattern")
    f = r.facts  # spans of data files: 4096, 4096, 999, 0, 3000, 0 bytes
    assert (
        f["small_reads_exact"] is True and f["small_reads"] == 2 and f["small_read_pct"] == pytest.approx(100 * 2 / 6)
    )
    # the median of the reads that returned data (the two empty ones are the zero reads')
    assert f["median_read_bytes"] == (3000 + 4096) / 2
    assert (f["sized_reads"], f["small_reads_source"]) == (6, "io spans")
    # the built store's counters hold more reads than its spans: the shares say which they are of
    label = "small share and median read: of the 6 data-file reads traced one by one (io spans), of 15 counted"
    assert r.labels == [label]


def test_pattern_small_share_is_of_the_reads_the_buckets_sized(tmp_path: Path) -> None:
    # a Darshan log's STDIO module keeps no size buckets: its reads are counted, but of no known size
    posix = data_file(5, "/d/a", 200 * 500, 200, size_read_hist={"100_1K": 200})
    stdio = (5, "/d/b", "STDIO", 1, 1000, 0, 0, 1000, 0, 100, 0, 10, {A.IO_FILE_PATH_CLASS: "data"})
    with files_store(tmp_path / "s.duckdb", [posix, stdio]) as store:
        r = _one(store, "io.pattern")
    f = r.facts
    assert (f["reads"], f["sized_reads"], f["small_reads"], f["small_read_pct"]) == (1200, 200, 200, 100.0)
    assert r.labels[1] == ("small share and median read: of the 200 data-file reads in Darshan's size buckets, "
                           "of 1,200 counted")  # fmt: skip


def test_files_chart_tells_apart_a_path_read_by_both_modules(tmp_path: Path) -> None:
    # torch.load opens a file as a stream (STDIO) and reads it through its descriptor (POSIX): two rows, one path
    posix = data_file(5, "/d/22.pt", 4096, 2, read_ns=900)
    stdio = (5, "/d/22.pt", "STDIO", 1, 0, 0, 0, 0, 0, 0, 0, 800, {A.IO_FILE_PATH_CLASS: "data"})
    with files_store(tmp_path / "s.duckdb", [posix, stdio]) as store:
        r = _one(store, "io.files")
    svg = render_chart(r)
    ticks = re.findall(r'<text class="tick"[^>]*text-anchor="end">([^<]*)<title>', svg)
    assert sorted(ticks) == ["/d/22.pt (POSIX)", "/d/22.pt (STDIO)"]


def test_files_chart_shows_a_file_of_microseconds_beside_a_class_of_hundreds_of_milliseconds(tmp_path: Path) -> None:
    # the folded Python files take 221 ms, a data file 100 us: on a linear scale its bar would be under a pixel
    python = (5, "/usr/lib/python3/os.py", "POSIX", 1, 1, 0, 0, 10, 0, 221_000_000, 0, 0,
              {A.IO_FILE_PATH_CLASS: "python"})  # fmt: skip
    with files_store(tmp_path / "l.duckdb", [python, data_file(5, "/d/a.bin", 4096, 1, read_ns=100_000)]) as store:
        r = _one(store, "io.files")
    widths = [float(w) for w in re.findall(r'<rect class="mark"[^>]* width="([0-9.]+)"', render_chart(r))]
    assert len(widths) == 2 and min(widths) > 0.1 * max(widths), widths


def test_small_files_tabulate_every_threshold(darshan_like: Store) -> None:
    r = _one(darshan_like, "io.small_files")
    assert r.column("threshold") == [256 * 1024, 2**20, 2 * 2**20, 4 * 2**20, 16 * 2**20]
    under = _row(r, 2 * 2**20)  # s1 (1000 B, 4 ops, 350 ns) and s2 (3000 B, 3 ops, 240 ns) of 4 sized files
    assert (under["small files"], under["files"], under["small-file ops"], under["small-file bytes"]) == (
        2,
        50.0,
        7,
        4000,
    )
    assert under["small-file time"] == 590 and under["time"] == pytest.approx(59_000 / 3710)
    assert under["ops"] == pytest.approx(700 / 26) and under["bytes"] == pytest.approx(400_000 / 13_635_488)
    assert under["chosen"] == "yes" and _row(r, 16 * 2**20)["files"] == 100.0
    f = r.facts
    assert (f["threshold_bytes"], f["files"], f["small_files"], f["ops"], f["small_time_ns"]) == (
        2 * 2**20,
        4,
        2,
        26,
        590,
    )
    custom = _one(darshan_like, "io.small_files", threshold_bytes=2000)
    assert 2000 in custom.column("threshold") and custom.facts["small_files"] == 1
    with pytest.raises(UsageError):
        _one(darshan_like, "io.small_files", threshold_bytes=-1)


# -- recommendations ----------------------------------------------------------------------------------------
def _small_files_rows(small: int = 1000) -> list[Any]:
    rows = [data_file(5, f"/d/img{i}.jpg", 10_240, 2, read_ns=1000) for i in range(small)]
    return [*rows, data_file(5, "/d/big.tar", 100 * 2**20, 10, read_ns=50_000)]


def test_small_files_rule_fires_on_many_small_files_only(tmp_path: Path) -> None:
    with files_store(tmp_path / "a.duckdb", _small_files_rows()) as store:
        rec = _fired(store, "small_files")
    assert rec is not None and rec.sources == ["io.small_files"] and "(io.small_files)" in rec.evidence[0]
    assert "1,000 data files of at most 2 MiB" in rec.evidence[0] and "Stage" in rec.action and "shards" in rec.action
    assert "take 100% of the I/O operations" in rec.evidence[0] and "8.9% of the bytes" in rec.evidence[0]
    # the time is the small files' own, its share one of all the data files' I/O time
    assert re.search(r"; they spend 1\.01 ms in I/O, \d+% of the data files' I/O time \(", rec.evidence[0])
    # a log has no iterations: the I/O time of the small files is at stake over the run
    assert (rec.impact_ns, rec.impact_per) == (1000 * 1000 + 1000 * 10, "run")
    with files_store(tmp_path / "b.duckdb", _small_files_rows(small=1)) as store:
        assert _fired(store, "small_files") is None  # 3 of 14 operations
    with files_store(tmp_path / "c.duckdb", FILES) as store:
        assert _fired(store, "small_files") is None  # 27% of operations: under the threshold


SMALL_FILES_LOOP = """
import os, xstack
os.makedirs("d", exist_ok=True)
for i in range(40):
    with open(f"d/{i}.bin", "wb") as f:
        f.write(os.urandom(2048))
for _ in range(8):
    with xstack.span("load"):
        data = [open(f"d/{i}.bin", "rb").read() for i in range(40)]
    xstack.step()
"""


PACKING_SCRIPT = """
import os, tarfile
os.makedirs("d", exist_ok=True)
os.makedirs("out", exist_ok=True)
for i in range(300):
    with open(f"d/{i}.jpg", "wb") as f:
        f.write(os.urandom(4096))
for shard in range(3):  # the small files packed into shards, as the advice on them says
    with tarfile.open(f"out/{shard}.tar", "w") as tar:
        for i in range(100 * shard, 100 * shard + 100):
            tar.add(f"d/{i}.jpg", arcname=f"{i}.jpg")
"""


def test_a_script_that_packs_small_files_into_shards_is_not_told_to_pack_them(tmp_path: Path) -> None:
    """A preparation script read 600 JPEG files and wrote them, resized, into 6 tar shards: it was told to pack the
    small files into shards, what it was doing. A run without iterations that wrote files many times their size
    holding a tenth of their bytes or more is their packing; the same files copied one by one are not."""
    results = _run_io_loop(tmp_path, PACKING_SCRIPT)
    facts = results["io.small_files"].facts
    assert facts["small_packed_files"] == 3 and facts["small_packed_path"] in {
        str(tmp_path / f"out/{i}.tar") for i in range(3)
    }
    assert facts["small_packed_bytes"] > facts["small_read_bytes"] == 300 * 4096  # each tar: headers and padding
    assert RULES["small_files"](results) is None
    copying = PACKING_SCRIPT.replace(
        '    with tarfile.open(f"out/{shard}.tar", "w") as tar:\n',
        "    if True:\n",
    ).replace('            tar.add(f"d/{i}.jpg", arcname=f"{i}.jpg")', '            shutil.copy(f"d/{i}.jpg", "out")')
    assert "shutil.copy" in copying and "tarfile.open" not in copying
    (tmp_path / "copying").mkdir()
    results = _run_io_loop(tmp_path / "copying", copying.replace("import os, tarfile", "import os, shutil"))
    assert results["io.small_files"].facts["small_packed_files"] == 0
    assert RULES["small_files"](results) is not None


def test_a_merged_run_puts_the_small_files_time_of_one_iteration_at_stake(tmp_path: Path) -> None:
    """A merged run's io_files hold its io pass whole (its 8 iterations and the files written before them),
    and the rule put that whole time at stake per iteration: several times the merged step itself. It is now
    the small files' time in a usual iteration of the io pass: the median over its measured iterations, not the
    merged iteration's own calls, which a single slow read (5.8 ms of a worker's 6.6 ms in a CNN's profile)
    makes several times the others'."""
    import subprocess
    import sys

    (tmp_path / "loop.py").write_text(SMALL_FILES_LOOP)
    done = subprocess.run([sys.executable, "-m", "xstack", "profile", "--pass", "model", "--io", "--warmup", "2",
                           "--iters", "6", "-o", "p.duckdb", "--", "python", "loop.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Store.open(tmp_path / "p.duckdb") as store:
        (merged,) = [r for (r,) in store.query("SELECT run_id FROM runs WHERE pass = 'merged'")]
        results = {r.id: r for r in run_analyses(store, merged)}
        step_ns = store.query(f"SELECT dur_ns FROM spans WHERE run_id = ? AND attrs->>'$.\"{A.MODEL_KIND}\"' = 'step'",
                              [merged])[0][0]  # fmt: skip
    rec = RULES["small_files"](results)
    facts = results["io.small_files"].facts
    assert rec is not None and rec.impact_per == "iteration"
    # at most the merged step: a loop of nothing but small reads can take the io pass longer than the whole step
    assert rec.impact_ns is not None and 0 < rec.impact_ns <= step_ns
    assert rec.impact_ns == facts["small_time_step_ns"]
    assert facts["small_time_ns"] > 5 * rec.impact_ns  # the io pass's whole, as the evidence says
    # the loop reads them itself, with no DataLoader to read ahead: on its path, as severe as their share says
    assert rec.severity == "high" and rec.sources == ["io.small_files"]
    with Store.open(tmp_path / "p.duckdb") as store:
        io_run = store.query("SELECT run_id FROM runs WHERE list_contains(levels, 'io') AND pass != 'merged'")[0][0]
        per_step = [ns for (ns,) in store.query(
            f"""SELECT coalesce(sum(c.dur_ns), 0) FROM spans s LEFT JOIN spans c ON c.run_id = s.run_id
                AND c.level = 'io' AND c.name = 'read' AND c.start_ns >= s.start_ns
                AND c.start_ns < s.start_ns + s.dur_ns AND c.attrs->>'$."{A.IO_PATH}"' LIKE '%/d/%'
            WHERE s.run_id = ? AND s.attrs->>'$."{A.MODEL_KIND}"' = 'step'
                AND (s.attrs->>'$."{A.MODEL_STEP}"')::INT >= 2 GROUP BY s.span_id""", [io_run])]  # fmt: skip
    assert len(per_step) == 6
    # reads, opens, stats and closes: the reads' median is a floor
    assert min(statistics.median(per_step), step_ns) <= rec.impact_ns
    # one of the merged iteration's reads 100 times slower: the io pass's usual iteration is unchanged
    with Store.open(tmp_path / "p.duckdb", read_only=False) as store:
        store.con.execute(
            "UPDATE _spans SET dur_ns = dur_ns * 100 WHERE run_id = ? AND span_id = (SELECT min(span_id) "
            "FROM _spans WHERE run_id = ? AND level = 'io' AND name = 'read')", [merged, merged])  # fmt: skip
    with Store.open(tmp_path / "p.duckdb") as store:
        again = RULES["small_files"]({r.id: r for r in run_analyses(store, merged)})
    assert again is not None and again.impact_ns == rec.impact_ns


def _run_io_loop(tmp_path: Path, source: str) -> dict[str, Result]:
    """``source`` run as loop.py under ``xstack run --levels model,io``: its analyses, by id."""
    import subprocess
    import sys

    skip_without_torch(source)
    (tmp_path / "loop.py").write_text(source)
    done = subprocess.run([sys.executable, "-m", "xstack", "run", "--levels", "model,io", "-o", "p.duckdb", "--",
                           "python", "loop.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Store.open(tmp_path / "p.duckdb") as store:
        return {r.id: r for r in run_analyses(store)}


def test_small_files_the_loop_reads_itself_are_of_low_severity_where_its_step_hardly_feels_them(
    tmp_path: Path,
) -> None:
    """The loop reads its 40 small files itself, then computes for 200 ms: the files' I/O time is a sliver of
    the step, so the rule is low and says so (a hand-fed CNN's loop of 241 ms steps had it high at 0.2%)."""
    compute = "    with xstack.span('compute'):\n        time.sleep(0.2)\n    xstack.step()"
    loop = SMALL_FILES_LOOP.replace("    xstack.step()", compute).replace("import os,", "import os, time,")
    results = _run_io_loop(tmp_path, loop)
    rec = RULES["small_files"](results)
    stages = results["model.stages"].facts
    step = stages["step_total_ns"] / stages["steps"]
    assert rec is not None and rec.impact_per == "iteration" and rec.impact_ns is not None
    assert 0 < rec.impact_ns < step / 100 and rec.severity == "low"
    assert rec.sources == ["io.small_files", "model.stages"]
    assert rec.evidence[1] == (
        f"but that is {100 * rec.impact_ns / step:.1f}% of the step ({format_ns(rec.impact_ns)} of {format_ns(step)} "
        "per iteration; threshold 1%): even gone, it would barely shorten the step (model.stages)"
    )


SMALL_FILES_WORKERS = """
import os, sys, time, torch, xstack

class Files(torch.utils.data.Dataset):
    def __len__(self):
        return 320
    def __getitem__(self, i):
        with open(f"d/{i}.bin", "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)[:8].float()

if __name__ == "__main__":
    os.makedirs("d", exist_ok=True)
    for i in range(320):
        with open(f"d/{i}.bin", "wb") as f:
            f.write(os.urandom(2048))
    for x in torch.utils.data.DataLoader(Files(), batch_size=16, num_workers=2):
        with xstack.span("compute"):  # far longer than the workers take to read a batch: they read ahead
            time.sleep(0.06)
        xstack.step()
"""


def test_small_files_the_workers_read_ahead_of_the_loop_are_of_low_severity(tmp_path: Path) -> None:
    """Every data file is small, but the DataLoader's workers read them while the loop computes, and it hardly
    waits: staging them would not shorten a step. A 2-core machine's profile of a small CNN trained from PNG
    files had put this rule first, of high severity, with 0.2% of the step at stake."""
    results = _run_io_loop(tmp_path, SMALL_FILES_WORKERS)
    recs = {r.rule: r for r in recommend(results.values())}
    loop = results["io.input_bound"].facts
    assert loop["input_bound"] is False, loop
    rec = recs["small_files"]
    assert rec.title.startswith("Only small files") and rec.severity == "low"
    assert rec.sources == ["io.small_files", "io.input_bound"]
    assert re.fullmatch(
        r"but the loop waited only \d+\.\d% of its time for the DataLoader \(threshold 10%\), and its main process "
        r"(spent [0-9.]+ [mu]?s in file I/O over|did no file I/O in) its 19 measured steps: the workers read ahead of "
        r"it, so cheaper I/O "
        r"would not shorten its steps now, only once it waits for its data \(a faster model or device\) "
        r"\(io\.input_bound\)",
        rec.evidence[1],
    ), rec.evidence
    assert "input_bound" not in recs
    # f.read() reads each file until a read returns nothing: half the reads, as much off the loop's path
    zero = recs["zero_reads"]
    assert zero.severity == "low" and zero.evidence[1] == rec.evidence[1] and "io.input_bound" in zero.sources


CHUNKED_READER = """
import os, torch, xstack

CHUNK, ITEM = 65_536, 4096  # 16 items per chunk, read whole for each item, as HDF5 reads a chunk

class Chunked(torch.utils.data.Dataset):
    def __len__(self):
        return 1024
    def __getitem__(self, i):
        fd = os.open("items.bin", os.O_RDONLY)
        try:
            chunk = os.pread(fd, CHUNK, i * ITEM // CHUNK * CHUNK)
        finally:
            os.close(fd)
        at = i * ITEM % CHUNK
        return torch.frombuffer(bytearray(chunk[at : at + ITEM]), dtype=torch.uint8)[:8].float()

if __name__ == "__main__":
    with open("items.bin", "wb") as f:
        f.write(os.urandom(1024 * ITEM))
    loader = torch.utils.data.DataLoader(Chunked(), batch_size=32, num_workers=2, shuffle=True)
    for x in loader:
        with xstack.span("compute"):
            x.sum()
        xstack.step()
"""


def test_a_reader_that_reads_a_whole_chunk_for_each_item_reads_the_data_over_again(tmp_path: Path) -> None:
    results = _run_io_loop(tmp_path, CHUNKED_READER)
    facts = results["io.pattern"].facts
    assert (facts["read_covered_bytes"], facts["read_epochs"], facts["reread_times"]) == (4 * 2**20, 1, 16.0), facts
    rec = RULES["reread"](results)
    assert rec is not None and "items.bin (16 times its bytes read)" in rec.evidence[0]
    assert "shuffle shards or blocks rather than items" in rec.action


def _written(pid: int, path: str, size: int) -> Any:
    """A file the program wrote whole in one write and never read (counters only)."""
    return (pid, path, "POSIX", 1, 0, 1, 0, 0, size, 0, 1000, 10, {
        A.IO_FILE_PATH_CLASS: "data", A.IO_FILE_MAX_BYTE_READ: -1, A.IO_FILE_MAX_BYTE_WRITTEN: size - 1,
    })  # fmt: skip


def test_small_files_the_program_writes_are_not_to_be_staged(tmp_path: Path) -> None:
    """An inference loop writing each prediction to a JSON file of its own (2,560 files of 213 B): it was told to
    stage them on a faster tier before training, advice for the files a program reads."""
    with files_store(tmp_path / "a.duckdb", [_written(5, f"/out/{i}.json", 213) for i in range(400)]) as store:
        small = _one(store, "io.small_files")
        rec = _fired(store, "small_files")
    assert (small.facts["small_written_files"], small.facts["small_written_ops"]) == (400, 800)
    assert rec is not None and rec.title.startswith("Only small files written")
    assert (
        "all of them only written, not read (the program's output), with 100% of their operations" in (rec.evidence[0])
    )
    assert "Stage" not in rec.action and rec.action.startswith("Write the outputs into fewer, larger files")
    # inputs and outputs alike: both pieces of advice
    rows = [_written(5, f"/out/{i}.json", 213) for i in range(200)]
    rows += [data_file(5, f"/d/img{i}.jpg", 10_240, 2, read_ns=1000) for i in range(200)]
    with files_store(tmp_path / "b.duckdb", rows) as store:
        rec = _fired(store, "small_files")
    assert (
        rec is not None
        and rec.title.startswith("Only small files:")
        and "200 of them only written" in (rec.evidence[0])
    )
    assert rec.action.startswith("Stage the files of at most 2 MiB") and "Write the outputs" in rec.action
    # a dataset staged by a copy whose last few files were never read: no output said, with 0% of the operations
    rows = [_written(5, f"/dev/shm/d/{i}.npy", 1152) for i in range(2)]
    rows += [data_file(5, f"/d/{i}.npy", 1152, 200, read_ns=1000) for i in range(200)]
    with files_store(tmp_path / "c.duckdb", rows) as store:
        small = _one(store, "io.small_files")
        rec = _fired(store, "small_files")
    assert (
        small.facts["small_written_files"] == 2 and small.facts["small_written_ops"] < 0.005 * small.facts["small_ops"]
    )
    assert rec is not None and "only written" not in rec.evidence[0], rec.evidence[0]


def test_one_output_file_opened_for_each_record_is_to_be_kept_open_not_split_into_fewer_files(tmp_path: Path) -> None:
    """An inference loop appending each prediction to one JSON Lines file, opened for each (``with open(path,
    'a')``): it was told to write its outputs into fewer, larger files "instead of a file each", which it does."""
    log = ("/out/preds.jsonl", "POSIX", 2000, 0, 2000, 0, 0, 46_000, 0, 2_000_000, 9_000_000, {
        A.IO_FILE_PATH_CLASS: "data", A.IO_FILE_MAX_BYTE_READ: -1, A.IO_FILE_MAX_BYTE_WRITTEN: 45_999})  # fmt: skip
    rows = [data_file(5, f"/d/{i}.npy", 12_416, 2, read_ns=1000) for i in range(200)]
    with files_store(tmp_path / "a.duckdb", [*rows, (5, *log)]) as store:
        small = _one(store, "io.small_files")
        rec = _fired(store, "small_files")
    facts = small.facts
    assert (facts["small_written_most_opened"], facts["small_written_most_opens"]) == ("/out/preds.jsonl", 2000)
    assert rec is not None and "/out/preds.jsonl opened 2,000 times to be written" in rec.evidence[0], rec.evidence
    assert "Keep preds.jsonl open: the program opened it 2,000 times to write to it" in rec.action, rec.action
    assert "Write the outputs into fewer, larger files" not in rec.action
    # beside many outputs of a file each, both pieces of advice
    with files_store(tmp_path / "b.duckdb", [*[_written(5, f"/out/{i}.json", 213) for i in range(400)], (5, *log)]
                     ) as store:  # fmt: skip
        rec = _fired(store, "small_files")
    assert rec is not None and "Keep preds.jsonl open" in rec.action and "Write the outputs into fewer" in rec.action
    # outputs opened a few times each are outputs of a file each
    with files_store(
        tmp_path / "c.duckdb", [*rows, *[_written(5, f"/out/{i}.json", 213) for i in range(400)]]
    ) as store:
        rec = _fired(store, "small_files")
    assert rec is not None and "Keep" not in rec.action and "Write the outputs into fewer" in rec.action


def test_small_files_read_beside_a_loop_fed_by_no_dataloader_are_at_stake_only_outside_its_computing(
    tmp_path: Path,
) -> None:
    """A loop fed by a ``multiprocessing.Pool``'s ``imap`` from 2,000 small files: no DataLoader wait to weigh the
    workers' I/O against, so all of it was at stake, 4.52 ms per iteration at high severity in steps of 6.05 ms, of
    which the loop spent 1.31 ms outside its forward, backward and optimizer stages: all it can have waited on the
    pool. Where the main process did the I/O itself, it is on the steps' path, and all of it stays at stake."""
    rows = [data_file(W1, f"/d/{k}.npy", 12_416, 2, read_ns=200_000) for k in range(2000)]
    with files_store(tmp_path / "a.duckdb", rows) as store:
        results = {r.id: r for r in run_analyses(store)}
    stages = [("Sequential", "forward", 60, 156_000_000, 2_600_000.0, 1, 156_000_000, 43.0),
              ("backward", "backward", 60, 117_600_000, 1_960_000.0, 1, 117_600_000, 32.4),
              ("SGD.step", "optimizer", 60, 10_500_000, 175_000.0, 1, 10_500_000, 2.9),
              ("Sequential", "warm-up", 2, 17_400_000, 8_700_000.0, 1, 17_400_000, None)]  # fmt: skip
    results["model.stages"] = Result("model.stages", "", rows=stages, facts={"steps": 60, "step_total_ns": 363_000_000})
    loop = {"input_bound": None, "dataloader_waits": False, "loop_ns": 363_000_000, "worker_io_ns": 283_000_000,
            "main_io_compute_ns": 0, "main_io_wait_ns": 0, "workers": 2, "threshold_pct": 10.0}  # fmt: skip
    results["io.input_bound"] = Result("io.input_bound", "", facts=loop)
    rec = RULES["small_files"](results)
    free = 363_000_000 / 60 - (156_000_000 + 117_600_000 + 10_500_000) / 60  # 1.31 ms
    assert rec is not None and rec.severity == "medium" and rec.impact_ns == round(free), rec
    assert rec.evidence[-1] == (
        "but no DataLoader wait was seen, and the main process did no file I/O in its 60 measured steps: the file "
        "I/O was that of 2 other processes, side by side with the loop, which can have waited on them only outside "
        "the stages in which it computes, 1.31 ms per iteration (22% of its mean step): cheaper I/O would shorten "
        "its steps by that at most (io.input_bound, model.stages)"
    )
    # a little file I/O of the main process's own: the rest is the pool's
    results["io.input_bound"] = Result("io.input_bound", "", facts=loop | {"main_io_compute_ns": 10_000_000})
    rec = RULES["small_files"](results)
    assert rec is not None and rec.evidence[-1].startswith(
        "but no DataLoader wait was seen, and the main process spent 10.0 ms in file I/O in its 60 measured steps: "
        "the rest of the file I/O was that of 2 other processes"
    ), rec.evidence
    # the main process reading the files in its steps: on their path, all of it at stake
    results["io.input_bound"] = Result("io.input_bound", "", facts=loop | {"main_io_compute_ns": 200_000_000})
    rec = RULES["small_files"](results)
    assert rec is not None and rec.severity == "high" and rec.impact_ns > 6_000_000, rec
    assert not any(line.startswith("but no DataLoader wait was seen") for line in rec.evidence)


STAGED_LOOP = """
import os, shutil, sys, xstack
os.makedirs("d", exist_ok=True)
for i in range(40):
    with open(f"d/{i}.bin", "wb") as f:
        f.write(os.urandom(2048))
staged = sys.argv[1] if len(sys.argv) > 1 else "d"
if staged != "d":
    shutil.copytree("d", staged)  # read once, by in-kernel copies, before the loop
for _ in range(8):
    with xstack.span("load"):
        data = [open(f"{staged}/{i}.bin", "rb").read() for i in range(40)]
    xstack.step()
"""


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this machine")
def test_small_files_the_program_staged_in_dev_shm_are_to_pack_not_to_stage_again(tmp_path: Path) -> None:
    """A loader that copied its 3,000 small .npy files to /dev/shm before training, as the advice says, was told
    to stage them on a faster tier (/dev/shm among them): every file in /dev/shm was shared memory, not data, and
    the files that the copy read had been staged anyway. Files in memory already are to pack into shards."""
    import subprocess
    import sys
    import tempfile

    (tmp_path / "loop.py").write_text(STAGED_LOOP)
    shm = Path(tempfile.mkdtemp(prefix="xstack-staged-", dir="/dev/shm"))
    try:
        command = [sys.executable, "-m", "xstack", "run", "--levels", "model,io", "-o", "p.duckdb", "--", "python",
                   "loop.py", str(shm / "d")]  # fmt: skip
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(shm)
    assert done.returncode == 0, done.stderr
    with Store.open(tmp_path / "p.duckdb") as store:
        results = {r.id: r for r in run_analyses(store)}
        classes = {c for (c,) in store.query(f"SELECT DISTINCT attrs->>'$.{A.IO_FILE_PATH_CLASS}' FROM io_files "
                                              "WHERE path LIKE '/dev/shm/xstack-staged-%/d/%.bin'")}  # fmt: skip
    assert classes == {"data"}
    facts = results["io.small_files"].facts
    # 80 files: the 40 written and copied, and their 40 copies, which the loop reads
    assert (facts["small_files"], facts["small_read_loop"], facts["small_read_in_memory"]) == (80, 40, 40), facts
    rec = RULES["small_files"](results)
    assert rec is not None and rec.action == PACK_STAGED_FILES.format(limit="2 MiB")
    assert "; all 40 of those the loop reads lie in /dev/shm, in memory (io.small_files)" in rec.evidence[0]
    (tmp_path / "unstaged").mkdir()
    results = _run_io_loop(tmp_path / "unstaged", STAGED_LOOP)  # read where they were written: in the page cache
    facts = results["io.small_files"].facts
    assert (facts["small_read_loop"], facts["small_read_in_memory"]) == (None, 0)  # none in memory: not counted
    # the 7 measured iterations' 280 reads of 2 KiB, each at memory speed: the files were just written
    assert facts["small_reads_timed"] == 280 and facts["small_reads_cached_pct"] >= 90.0, facts
    rec = RULES["small_files"](results)
    assert rec is not None and rec.action == PACK_CACHED_FILES.format(limit="2 MiB")
    assert "in the measured iterations took the time of a copy from memory (median " in rec.evidence[0]


def _timed_reads(path: Path, read_ns: int | list[int], files: int = 300, *, region_ns: int | None = None) -> Store:
    """A run without iterations whose worker reads ``files`` small files of 4 KiB once each, ``read_ns`` a read (a
    list: a pass over them each, each read of that pass that long); ``region_ns``: the main process's profiled
    region lasts that long, from 0 (the run's wall time)."""
    passes = read_ns if isinstance(read_ns, list) else [read_ns]
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "reads", levels=["model", "io"] if region_ns else ["io"], config={"pid": MAIN}))
        sink = Sink(store, 1)
        if region_ns:
            sink.span(10**7, None, "model", "region", 0, region_ns, MAIN, MAIN, {A.MODEL_KIND: "region"})
        ids = iter(range(1, 10**6))
        for at, ns in ((100_000 * (k + files * p), ns) for p, ns in enumerate(passes) for k in range(files)):
            name = f"/d/{at // 100_000 % files}.bin"
            io_span(sink, next(ids), None, "open", at, 2_000, W1, name)
            io_span(sink, next(ids), None, "read", at + 2_000, ns, W1, name, 4096, offset=0)
            io_span(sink, next(ids), None, "close", at + 2_000 + ns, 1_000, W1, name)
        sink.close()
        add_files(store, [data_file(W1, f"/d/{k}.bin", 4096, len(passes), opens=len(passes), read_ns=sum(passes))
                          for k in range(files)])  # fmt: skip
    return Store.open(path)


def test_small_files_read_at_memory_speed_are_to_pack_and_those_read_from_storage_to_stage(tmp_path: Path) -> None:
    """The same 300 small files, read at the page cache's speed (1 us for 4 KiB) and at an SSD's (60 us): staging
    them on a faster tier helps only the second; the first are in memory already."""
    with _timed_reads(tmp_path / "cached.duckdb", 1_000) as store:
        facts = _one(store, "io.small_files").facts
        rec = _fired(store, "small_files")
    assert (facts["small_reads_timed"], facts["small_reads_cached_pct"], facts["small_read_median_ns"]) == (
        300, 100.0, 1000.0)  # fmt: skip
    assert rec is not None and rec.action == PACK_CACHED_FILES.format(limit="2 MiB")
    assert rec.evidence[0].endswith(
        "; 100% of their reads of up to 64 KiB in the run took the time of "
        "a copy from memory (median 1.00 us): the page cache served them (io.small_files)"
    )
    with _timed_reads(tmp_path / "storage.duckdb", 60_000) as store:
        facts = _one(store, "io.small_files").facts
        rec = _fired(store, "small_files")
    assert facts["small_reads_cached_pct"] == 0.0
    assert rec is not None and rec.action == STAGE_SMALL_FILES.format(limit="2 MiB")
    assert rec.evidence[0].endswith("; 100% of their reads of up to 64 KiB in the run took longer "
                                    "than a copy from memory (median 60.0 us): read from storage, not the page cache "
                                    "(io.small_files)")  # fmt: skip
    # a 4 KiB read of 6 us is the limit of a copy from memory; too few reads say nothing of where the files lie
    with _timed_reads(tmp_path / "limit.duckdb", 6_048) as store:
        assert _one(store, "io.small_files").facts["small_reads_cached_pct"] == 100.0
    with _timed_reads(tmp_path / "few.duckdb", 1_000, files=199) as store:
        facts = _one(store, "io.small_files").facts
        rec = _fired(store, "small_files")
    assert (facts["small_reads_timed"], facts["small_reads_cached_pct"]) == (199, None)
    assert rec is not None and rec.action == STAGE_SMALL_FILES.format(limit="2 MiB")


def test_small_files_in_a_run_without_iterations_are_weighed_against_its_wall_time(tmp_path: Path) -> None:
    """A run without iterations (a preprocessing script) whose data files are all small was rated by the share of its
    I/O operations alone: high wherever every file was small, with its I/O a sliver of the run. Its time at stake is
    now weighed against the run's wall time, as a loop's is against its step."""
    # 300 files read from storage (60 us a read, and 10 ns of metadata time): 18.0 ms at stake, in a 30 ms run
    with _timed_reads(tmp_path / "short.duckdb", 60_000, region_ns=30_000_000) as store:
        rec = _fired(store, "small_files")
    assert rec is not None and rec.impact_per == "run" and rec.impact_ns == 300 * 60_010 and rec.severity == "high"
    # the same files in a run of 10 s: 0.2% of it
    with _timed_reads(tmp_path / "long.duckdb", 60_000, region_ns=10_000_000_000) as store:
        rec = _fired(store, "small_files")
    assert rec is not None and rec.severity == "low", rec
    assert rec.evidence[-1] == (
        "but that is 0.2% of the run's wall time (18.0 ms of 10.0 s; threshold 1%): even gone, it would barely "
        "shorten the run (model.stages)"
    )
    # in a run of 1 s: 1.8% of it, no more severe than that share
    with _timed_reads(tmp_path / "second.duckdb", 60_000, region_ns=1_000_000_000) as store:
        rec = _fired(store, "small_files")
    assert rec is not None and rec.severity == "low" and "of the run's wall time" not in rec.evidence[-1], rec


def test_small_files_read_from_storage_once_then_from_the_page_cache_are_said_to_be(tmp_path: Path) -> None:
    """Two passes over 300 small files: the first from storage (120 us a read), the second from the page cache (2
    us): half the reads fast, which said nothing of where the files lie, and the advice was to stage them on a
    faster tier, which would save only the first pass (a DataLoader's first epoch over 2,000 .npy files: 115 us a
    read, then 2.8 us)."""
    with _timed_reads(tmp_path / "two.duckdb", [120_000, 2_000]) as store:
        facts = _one(store, "io.small_files").facts
        rec = _fired(store, "small_files")
    assert (facts["small_reads_timed"], facts["small_reads_cached_pct"]) == (600, 50.0)
    assert (facts["small_first_reads"], facts["small_first_reads_cached_pct"]) == (300, 0.0)
    assert (facts["small_later_pass_reads"], facts["small_later_pass_cached_pct"]) == (300, 100.0)
    assert (facts["small_first_read_median_ns"], facts["small_later_pass_read_median_ns"]) == (120_000.0, 2_000.0)
    assert rec is not None and rec.action == PACK_CACHED_AFTER_FIRST.format(limit="2 MiB")
    assert rec.evidence[0].endswith(
        "; the first read of each file took longer than a copy from memory 100% of the time (median 120 us, 300 "
        "reads): from storage; the reads of its later opens took the time of a copy from memory 100% of the time "
        "(median 2.00 us, 300 reads): the page cache kept the files once read (io.small_files)"
    ), rec.evidence[0]
    # from storage in both passes: a dataset the page cache did not keep, to stage
    with _timed_reads(tmp_path / "storage.duckdb", [120_000, 90_000]) as store:
        facts = _one(store, "io.small_files").facts
        rec = _fired(store, "small_files")
    assert facts["small_later_pass_cached_pct"] == 0.0
    assert rec is not None and rec.action == STAGE_SMALL_FILES.format(limit="2 MiB")
    # one pass, its first reads alone: no later pass to tell
    with _timed_reads(tmp_path / "one.duckdb", 120_000) as store:
        facts = _one(store, "io.small_files").facts
    assert facts["small_first_reads"] is None and facts["small_later_pass_cached_pct"] is None


POOLED_LOOP = """
import os, time, xstack
from concurrent.futures import ThreadPoolExecutor
os.makedirs("d", exist_ok=True)
for i in range(600):
    with open(f"d/{i}.bin", "wb") as f:
        f.write(os.urandom(131_072))  # reads long enough to stay a large share of the step on a busy machine
def read(path):
    with open(path, "rb") as f:
        return f.read()
pool = ThreadPoolExecutor(4)
for step in range(10):
    batch = list(pool.map(read, [f"d/{(60 * step + i) % 600}.bin" for i in range(60)]))
    with xstack.span("compute"):
        time.sleep(0.001)
    xstack.step()
"""


def _thread_calls(tmp_path: Path, columns: str, where: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The io calls of p.duckdb's main process's other threads that ``where`` keeps (SQL on ``path``, ``fd`` and the
    span's columns), as ``columns``, in start order; and the measured iterations' (start, end)."""
    with Store.open(tmp_path / "p.duckdb") as store:
        main = store.query("SELECT pid, tid FROM spans WHERE level = 'model' LIMIT 1")[0]
        calls = store.query(
            f"SELECT {columns} FROM (SELECT *, attrs->>'$.\"{A.IO_PATH}\"' AS path, attrs->>'$.\"{A.IO_FD}\"' AS fd "
            f"FROM spans WHERE level = 'io' AND pid = ? AND tid <> ?) WHERE {where} ORDER BY start_ns",
            list(main),
        )
        windows = store.query("SELECT start_ns, start_ns + dur_ns FROM spans WHERE level = 'model' AND name LIKE "
                              "'step#%' AND name <> 'step#0' ORDER BY 1")  # fmt: skip
    return calls, windows


def test_a_thread_pool_that_reads_inside_a_stage_is_not_counted_outside_every_stage(tmp_path: Path) -> None:
    """The same pool, waited on inside a span of the loop's: its threads' calls ran while a stage ran, so none of
    their time is outside every stage (the stages were left out of that subtraction by a misplaced NOT)."""
    staged = POOLED_LOOP.replace("    batch = list(", '    with xstack.span("load"):\n        batch = list(')
    assert 'with xstack.span("load"):' in staged
    results = _run_io_loop(tmp_path, staged)
    facts = results["io.input_bound"].facts
    assert facts["thread_io_threads"] >= 1 and facts["thread_io_unstaged_ns"] == 0, facts
    assert RULES["work_outside_stages"](results) is None


def test_a_thread_pool_that_reads_the_batch_between_the_stages_is_named(tmp_path: Path) -> None:
    """A loop that has a thread pool read its batch of .npy files and waits for it: the time in no stage was 92%
    of the step, and the advice named no file I/O, as only the loop's own thread's was counted. The pool's
    threads' calls hang from no span (none is open on their threads): their union in the measured iterations,
    outside every stage, is what the loop waited on."""
    results = _run_io_loop(tmp_path, POOLED_LOOP)
    facts = results["io.input_bound"].facts
    steps = results["model.stages"].facts["steps"]
    calls, windows = _thread_calls(tmp_path, "tid, path, start_ns, start_ns + dur_ns", "path LIKE '%/d/%.bin'")
    measured = [c for c in calls if any(s <= c[2] < e for s, e in windows)]
    assert facts["main_io_unstaged_ns"] == 0 and facts["thread_io_kind"] == "read"
    assert 1 <= facts["thread_io_threads"] == len({c[0] for c in measured}) <= 4
    assert facts["thread_io_files"] == len({c[1] for c in measured}) == 60 * steps
    # the calls' union, no more than their sum, in no stage (the pool runs before the compute span)
    union = sum(e - s for s, e in union_of([(c[2], c[3]) for c in measured]))
    assert 0 < facts["thread_io_unstaged_ns"] * steps <= union
    rec = RULES["work_outside_stages"](results)
    assert rec is not None
    line = next(e for e in rec.evidence if "other thread" in e)
    assert line.startswith(f"{facts['thread_io_threads']} other thread")
    assert (
        "of the main process did file I/O during " in line and f"most of it reading {60 * steps} files such as " in line
    )
    # 60 files a step: the advice is about their number, each one's open, parsing and close run under the GIL
    assert THREADS_READ_MANY.format(files="60").strip() in rec.action, rec.action
    # the threads prepare the batch: not told twice, once without the cost, to move it into DataLoader workers
    assert "Then move the batch's preparation into DataLoader workers" not in rec.action


PARSING_POOL = """
import os, queue, threading, time, xstack
from concurrent.futures import ThreadPoolExecutor
os.makedirs("d", exist_ok=True)
for i in range(160):
    with open(f"d/{i}.bin", "wb") as f:
        f.write(os.urandom(4096))
def load(path):  # a header read, then parsed in Python (as numpy.load does), then the rest
    with open(path, "rb", buffering=0) as f:
        head = f.read(16)
        until = time.perf_counter() + 0.0002
        while time.perf_counter() < until:
            pass
        return head + f.read()
lines = queue.Queue()
def log():  # a thread that keeps its log file open from the fourth iteration to the end of the run
    with open("train.log", "w") as out:
        while (line := lines.get()) is not None:
            out.write(line)
            out.flush()
pool, logger = ThreadPoolExecutor(2), threading.Thread(target=log)
for step in range(10):
    if step == 3:
        logger.start()
    batch = list(pool.map(load, [f"d/{(16 * step + i) % 160}.bin" for i in range(16)]))
    with xstack.span("compute"):
        time.sleep(0.001)
    lines.put(f"step {step}\\n")
    xstack.step()
lines.put(None)
logger.join()
"""


def test_a_thread_pool_that_parses_its_files_between_their_reads_is_named_with_the_files_time_open(
    tmp_path: Path,
) -> None:
    """A thread pool loading 64 small .npy files a batch for a loop that waits on it: numpy.load parses each
    file's header in Python between its reads, so the threads' calls were under way during 9% of the loop's time
    in no stage, under the 10% at which they are named, while the files were open during 77% of it: the finding
    told the loop to find its own work with spans. Their files' time from open to close counts, as the loop's own
    files' does, each in the iteration that opened it: a log file another thread keeps open from the fourth
    iteration on is not one."""
    results = _run_io_loop(tmp_path, PARSING_POOL)
    facts = results["io.input_bound"].facts
    steps = results["model.stages"].facts["steps"]
    calls, windows = _thread_calls(tmp_path, "path, name, start_ns, start_ns + dur_ns, fd, tid",
                                   "path LIKE '%/d/%.bin' OR path LIKE '%train.log'")  # fmt: skip
    with Store.open(tmp_path / "p.duckdb") as store:
        stages = store.query("SELECT start_ns, start_ns + dur_ns FROM spans WHERE level = 'model' AND name NOT LIKE "
                             "'step#%' AND name <> 'after-last-step'")  # fmt: skip
    log_opens = [c for c in calls if c[0].endswith("train.log") and c[1] in ("open", "openat")]
    assert len(log_opens) == 1 and any(s <= log_opens[0][2] < e for s, e in windows)  # opened in a measured one
    held = []  # each pool file from its open to its close, in a measured iteration
    for c in calls:
        if c[0].endswith(".bin") and c[1] in ("open", "openat"):
            close = next(d for d in calls if d[1] == "close" and d[4] == c[4] and d[5] == c[5] and d[2] > c[2])
            if any(s <= c[2] and close[3] <= e for s, e in windows):
                held.append((c[2], close[3]))
    union = union_of(held)
    outside = sum(e - s for s, e in union) - sum(max(0, min(e, se) - max(s, ss)) for s, e in union for ss, se in stages)
    assert len(held) == 16 * steps and facts["thread_io_open_ns"] * steps == pytest.approx(outside)
    # parsing between the reads: the files were open far longer than their calls ran
    assert facts["thread_io_open_ns"] > 3 * facts["thread_io_unstaged_ns"] > 0, facts
    rec = RULES["work_outside_stages"](results)
    assert rec is not None
    line = next(e for e in rec.evidence if "other thread" in e)
    assert f"; they had those files open during {format_ns(facts['thread_io_open_ns'])} of it, from each open" in line
    assert THREADS_READ_MANY.format(files=f"{facts['thread_io_files'] / steps:,.0f}").strip() in rec.action


POOL_FED_LOOP = """
import multiprocessing as mp, os, time, xstack
def load(path):
    with open(path, "rb") as f:
        data = f.read()
    until = time.perf_counter() + 0.0001  # decoding the item
    while time.perf_counter() < until:
        pass
    return data
if __name__ == "__main__":
    os.makedirs("d", exist_ok=True)
    for i in range(1200):
        with open(f"d/{i}.bin", "wb") as f:
            f.write(os.urandom(2048))
    with mp.get_context("fork").Pool(2) as pool:
        items = pool.imap(load, [f"d/{i}.bin" for i in range(1200)], chunksize=4)
        for step in range(12):
            batch = [next(items) for _ in range(100)]  # one by one: 40 a step took under 1 ms where the pool ran ahead
            with xstack.span("compute"):
                time.sleep(0.001)
            xstack.step()
"""


def test_a_loop_fed_by_a_process_pool_is_not_told_to_move_its_batches_into_dataloader_workers(
    tmp_path: Path,
) -> None:
    """A loop that took 64 small .npy files a step from Pool.imap and stacked them spent 37% of its step in no
    stage, and was told to move its batch's preparation into DataLoader workers: the pool's processes read and
    built the items already. It is now told so, and to have each task return a whole batch (4.2 ms a step against
    2.6 ms)."""
    results = _run_io_loop(tmp_path, POOL_FED_LOOP)
    facts = results["io.input_bound"].facts
    assert facts["dataloader_waits"] is False and facts["workers"] == 2, facts
    assert facts["main_io_compute_ns"] == facts["main_io_wait_ns"] == 0
    rec = RULES["work_outside_stages"](results)
    stages = results["model.stages"].facts
    assert rec is not None and "io.input_bound" in rec.sources, {
        k: stages.get(k) for k in ("unstaged_pct", "unstaged_ns", "steps")
    }
    line = next(e for e in rec.evidence if e.startswith("no DataLoader ran"))
    opens = facts["worker_data_opens_per_iteration"]
    assert line.startswith(f"no DataLoader ran: 2 other processes opened the data files, {opens:,.1f} a measured")
    # 100 items a step, the pool running ahead of the loop by as much as the machine lets it (a loaded CI machine's
    # measured iterations saw 25.6 a step of 40): no more than the 1,200 files in all
    assert 0 < opens * results["model.stages"].facts["steps"] <= 1200, opens
    assert f"they ran on a CPU {facts['worker_cpu_pct']:.0f}% of their lives" in line
    assert FED_BY_PROCESSES in rec.action and "DataLoader workers" not in rec.action, rec.action


CHECKPOINTING = """
import os, torch, xstack

model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
os.makedirs("ck", exist_ok=True)
os.makedirs("logs", exist_ok=True)
with open("logs/metrics.log", "w") as log:
    for step in range(30):
        with xstack.span("compute"):
            model(torch.randn(32, 256)).sum().backward()
            opt.step()
        log.write(f"{step}\\n")
        log.flush()
        os.fsync(log.fileno())
        if step % 3 == 0:
            torch.save(model.state_dict(), f"ck/step-{step}.pt")
        xstack.step()
"""


def test_checkpoints_saved_every_few_steps_are_not_outputs_to_write_into_one_file(tmp_path: Path) -> None:
    """A loop that saves a checkpoint every 10 steps and syncs its log at each (20 .pt files of 768 KiB) was told
    at high severity to append each result to one file kept open, a log's fsync time counted as the small files'
    time at stake: the time of the very file kept open, which the sync finding already covers."""
    results = _run_io_loop(tmp_path, CHECKPOINTING)
    facts = results["io.small_files"].facts
    assert (facts["small_written_files"], facts["small_written_checkpoints"]) == (11, 10), facts
    with Store.open(tmp_path / "p.duckdb") as store:
        ((syncs,),) = store.query(
            f"SELECT sum(dur_ns) FROM spans WHERE level = 'io' AND name = 'fsync' "
            f"AND attrs->>'$.\"{A.IO_PATH}\"' = ?", [str(tmp_path / "logs" / "metrics.log")])  # fmt: skip
    assert facts["small_sync_ns"] == syncs > 0
    rec = RULES["small_files"](results)
    assert rec is not None and rec.title.startswith("Small checkpoint files written in the loop"), rec
    assert rec.action == SAVE_FEWER_CHECKPOINTS and "Write the outputs" not in rec.action
    assert f", {format_ns(syncs)} of it in fsync or fdatasync, left out of the time at stake" in rec.evidence[0]
    assert "; 10 of those named as checkpoints" in rec.evidence[0]
    steps = results["model.stages"].facts["steps"]
    stake = facts["small_time_ns"] - syncs - facts["small_time_warmup_ns"]
    assert (rec.impact_ns, rec.impact_per) == (round(stake / steps), "iteration")
    # no more severe than the share of the step at stake says
    share = 100 * rec.impact_ns / (results["model.stages"].facts["step_total_ns"] / steps)
    assert rec.severity == ("high" if share >= 30 else "medium" if share >= 10 else "low")


def test_a_pt_file_written_for_each_item_is_an_output_not_a_checkpoint(tmp_path: Path) -> None:
    """Items cached as .pt files, hundreds of them in ten steps: outputs to write into fewer files. Checkpoints are
    fewer files than steps."""
    rows = [_written(5, f"/cache/{i}.pt", 1200) for i in range(400)]
    stages = Result("model.stages", "t", facts={"steps": 10, "step_total_ns": 10**8})
    with files_store(tmp_path / "a.duckdb", rows) as store:
        results = {r.id: r for r in run_analyses(store)}
    assert results["io.small_files"].facts["small_written_checkpoints"] == 400
    rec = RULES["small_files"]({**results, "model.stages": stages})
    assert rec is not None and rec.action == WRITE_FEWER_FILES and rec.title.startswith("Only small files written")
    rows = [_written(5, f"/run/checkpoint-{i}/model.safetensors", 1200) for i in range(12)]
    with files_store(tmp_path / "b.duckdb", rows) as store:
        results = {r.id: r for r in run_analyses(store)}
    longer = Result("model.stages", "t", facts={"steps": 100, "step_total_ns": 10**9})
    rec = RULES["small_files"]({**results, "model.stages": longer})
    assert rec is not None and rec.action == SAVE_FEWER_CHECKPOINTS
    alone = RULES["small_files"](results)  # no loop: a pass that writes a file per item
    assert alone is not None and alone.action == WRITE_FEWER_FILES
    # a folder above the file's own that says checkpoint is a project's or a run's name, not the file's
    rows = [_written(5, f"/home/u/checkpointing/logs/{i}.json", 1200) for i in range(12)]
    with files_store(tmp_path / "c.duckdb", rows) as store:
        assert _one(store, "io.small_files").facts["small_written_checkpoints"] == 0


SYNCED_LOG = """
import os, torch, xstack

model = torch.nn.Linear(64, 64)
with open("metrics.log", "w") as log:
    for step in range(12):
        with xstack.span("compute"):
            model(torch.randn(32, 64)).sum().backward()
        log.write(f"{step}\\n")
        log.flush()
        os.fsync(log.fileno())
        xstack.step()
"""


def test_a_log_synced_at_every_step_makes_the_loop_wait_for_the_disk(tmp_path: Path) -> None:
    results = _run_io_loop(tmp_path, SYNCED_LOG)
    facts = results["io.input_bound"].facts
    measured = facts["iterations"]
    assert facts["main_syncs"] == measured and facts["main_sync_path"] == str(tmp_path / "metrics.log"), facts
    rec = RULES["loop_syncs"](results)
    share = 100 * facts["main_sync_ns"] / facts["loop_ns"]
    if share < 2:  # a file system whose fsync costs nothing here (tmpfs): nothing to say
        assert rec is None
        return
    assert (
        rec is not None
        and f"called fsync or fdatasync {measured} times in the {measured} measured" in (rec.evidence[0])
    )
    assert rec.impact_ns == round(facts["main_sync_ns"] / measured) and "Sync less often" in rec.action


def test_syncs_under_two_percent_of_the_loop_are_not_worth_a_word() -> None:
    facts = {"main_syncs": 10, "main_sync_ns": 10_000, "loop_ns": 10**7, "iterations": 10}
    assert RULES["loop_syncs"]({"io.input_bound": Result("io.input_bound", "t", facts=facts)}) is None
    facts["main_sync_ns"] = 2 * 10**6  # 20% of the loop
    rec = RULES["loop_syncs"]({"io.input_bound": Result("io.input_bound", "t", facts=facts)})
    assert rec is not None and rec.severity == "medium" and rec.impact_ns == 200_000


def test_small_files_rule_fires_when_every_data_file_is_small(tmp_path: Path) -> None:
    # an image dataset of 10 KiB files and nothing else: the small files hold all the bytes, as they must
    rows = [data_file(5, f"/d/img{i}.jpg", 10_240, 2, read_ns=1000) for i in range(500)]
    with files_store(tmp_path / "a.duckdb", rows) as store:
        rec = _fired(store, "small_files")
    assert rec is not None and rec.title.startswith("Only small files")
    assert rec.evidence[0] == (
        "all 500 data files are of at most 2 MiB (10.0 KiB on average): every one of the 1,500 I/O operations, 3.0 "
        "per file, goes to a small file, 505 us of I/O time (io.small_files)"
    )
    assert rec.action.startswith("Stage the files of at most 2 MiB") and "shards" in rec.action
    with files_store(tmp_path / "b.duckdb", rows[:5]) as store:
        assert _fired(store, "small_files") is None  # five files are no dataset to stage


def test_small_files_without_any_small_file_say_so_instead_of_a_table_of_zeros(tmp_path: Path) -> None:
    # one zip archive of 40 MiB, read item by item: no file under any threshold
    rows = [data_file(5, "/d/items.zip", 40 * 2**20, 3000, read_ns=1000)]
    with files_store(tmp_path / "a.duckdb", rows) as store:
        small = _one(store, "io.small_files")
        assert _fired(store, "small_files") is None
    assert small.rows == [] and small.facts["files"] == 1 and small.facts["small_files"] == 0
    assert small.labels[-1] == "the data file is larger than 16.0 MiB, the largest threshold: no small file to stage"
    with files_store(tmp_path / "b.duckdb", rows + [data_file(5, "/d/b.zip", 20 * 2**20, 10)]) as store:
        assert _one(store, "io.small_files").labels[-1].startswith("all 2 data files are larger than 16.0 MiB")
    with files_store(tmp_path / "c.duckdb", rows + [data_file(5, "/d/labels.csv", 2**20, 10)]) as store:
        small = _one(store, "io.small_files")
    assert len(small.rows) == 5 and not any("no small file" in label for label in small.labels)


def test_small_files_say_which_files_they_could_not_size(tmp_path: Path) -> None:
    # a dataset whose constructor checks every file with os.path.exists and whose loop reads some of them: the
    # files only stat'ed have no size, so no share counts them, and the summary's count of data files holds them
    read = [data_file(5, f"/d/s{i}.pt", 1917, 10, read_ns=1000) for i in range(272)]
    stated = [(5, f"/d/s{i}.pt", "POSIX", 0, 0, 0, 0, 0, 0, 0, 0, 2, {
        A.IO_FILE_PATH_CLASS: "data", A.IO_FILE_MAX_BYTE_READ: -1, A.IO_FILE_MAX_BYTE_WRITTEN: -1, "stats": 1,
    }) for i in range(272, 320)]  # fmt: skip
    with files_store(tmp_path / "a.duckdb", read + stated) as store:
        small, sizes = _one(store, "io.small_files"), _one(store, "io.sizes")
        rec = _fired(store, "small_files")
        summary = summarize(store)
    assert summary.io is not None and summary.io["files"] == 320
    assert (small.facts["files"], small.facts["files_unsized"]) == (272, 48)
    label = "48 files never read or written (only opened or stat'ed), of unknown size, left out"
    assert label in small.labels and label in sizes.labels
    assert rec is not None and rec.evidence[0].startswith(
        "all 272 data files read or written are of at most 2 MiB (1.87 KiB on average); 48 others only opened or "
        "stat'ed: every one of the 2,992 I/O operations on them, 11.0 per file, goes to a small file"
    )


def test_small_files_rule_gives_the_files_mean_size_not_the_bytes_read_per_file(tmp_path: Path) -> None:
    # np.load reads a .npy's first 4 KiB page, then the array from past its header again: 16 KiB read from each
    # 12,416-byte file; the files are 12.1 KiB on average, what was read of them is not their size
    rows = [(W1, f"/d/img{i}.npy", "POSIX", 1, 2, 0, 1, 16_384, 0, 1000, 0, 10, {
        A.IO_FILE_PATH_CLASS: "data", A.IO_FILE_MAX_BYTE_READ: 12_415, A.IO_FILE_MAX_BYTE_WRITTEN: -1,
    }) for i in range(320)]  # fmt: skip
    with files_store(tmp_path / "a.duckdb", rows) as store:
        small = _one(store, "io.small_files")
        rec = _fired(store, "small_files")
    assert small.facts["small_size_mean_bytes"] == 12_416 and small.facts["small_bytes"] == 320 * 16_384
    assert rec is not None and "all 320 data files are of at most 2 MiB (12.1 KiB on average)" in rec.evidence[0]


def test_zero_reads_rule(tmp_path: Path) -> None:
    with files_store(tmp_path / "a.duckdb", [data_file(5, "/d/a", 10**6, 200, zero_reads=50)]) as store:
        rec = _fired(store, "zero_reads")
    assert rec is not None and "50 of 200 data-file reads (25.0%" in rec.evidence[0] and "f.read(size)" in rec.action
    with files_store(tmp_path / "b.duckdb", [data_file(5, "/d/a", 10**6, 200, zero_reads=30)]) as store:
        assert _fired(store, "zero_reads") is None  # 15%
    with files_store(tmp_path / "c.duckdb", [data_file(5, "/d/a", 10**6, 50, zero_reads=25)]) as store:
        assert _fired(store, "zero_reads") is None  # too few reads to matter


def _whole_file_reads(path: Path, zero_ns: int, config: dict[str, Any] | None = None,
                      more_files: list[Any] | None = None, *, op: str = "read", copied: int = 0,
                      suffix: str = ".bin") -> Store:  # fmt: skip
    """100 files read whole as Python's f.read() does: a read of the file (10 us), then one finding its end (``op``
    ``sendfile_read``: copied as shutil.copyfile does); and ``copied`` more files copied that way (1 us each);
    ``suffix``: the files' (``.jpg``: images, whose decoder reads until the end)."""
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "reads", levels=["model", "io"], config={"pid": MAIN, **(config or {})}))
        sink = Sink(store, 1)
        for k in range(4):  # four iterations of 25 files each
            sink.span(1000 + k, None, "model", f"step#{k}", 500_000 * k, 500_000, MAIN, MAIN,
                      {A.MODEL_KIND: "step", A.MODEL_STEP: k})  # fmt: skip
        for k in range(100):
            name, t = f"/d/{k}{suffix}", 20_000 * k
            io_span(sink, 2 * k + 1, None, op, t, 10_000, MAIN, name, 4096, offset=0)
            io_span(sink, 2 * k + 2, None, op, t + 10_000, zero_ns, MAIN, name, 0, offset=4096)
        for k in range(copied):
            name, t = f"/d/copy{k}.bin", 10**6 + 2000 * k
            io_span(sink, 300 + 2 * k, None, "sendfile_read", t, 1000, MAIN, name, 4096, offset=0)
            io_span(sink, 301 + 2 * k, None, "sendfile_read", t + 1000, 1000, MAIN, name, 0, offset=4096)
        sink.close()
        rows = [data_file(MAIN, f"/d/{k}{suffix}", 4096, 2, zero_reads=1, read_ns=10_000 + zero_ns)
                for k in range(100)]  # fmt: skip
        rows += [data_file(MAIN, f"/d/copy{k}.bin", 4096, 2, zero_reads=1, read_ns=2000) for k in range(copied)]
        add_files(store, rows + (more_files or []))
    return Store.open(path)


def test_zero_reads_rule_is_weighed_by_the_time_the_reads_took(tmp_path: Path) -> None:
    # f.read() on each file: half the reads return nothing, but each takes 300 ns against 10 us for the data
    with _whole_file_reads(tmp_path / "a.duckdb", 300) as store:
        rec = _fired(store, "zero_reads")
    assert rec is not None and rec.severity == "low" and rec.impact_ns == 30_000 // 4  # per iteration
    assert "100 of 200 data-file reads (50.0%" in rec.evidence[0] and "(2.9%)" in rec.evidence[0]
    assert "f.read() with no size" in rec.action
    # end-of-file reads that cost (a network file system asking the server each time) are worth more
    with _whole_file_reads(tmp_path / "b.duckdb", 5_000) as store:
        rec = _fired(store, "zero_reads")
    assert rec is not None and rec.severity == "medium" and "(33.3%)" in rec.evidence[0]


def test_zero_reads_of_images_are_told_to_read_each_image_whole_and_decode_it_from_memory(tmp_path: Path) -> None:
    """PIL's Image.open on a file reads a JPEG in three reads, the last returning nothing (a buffered 4 KiB read of
    the header, then 64 KiB chunks until EOF): "f.read(size)" did not say how, as the decoder makes the reads.
    Read whole first and decoded from memory: 8 calls an image (open, fstat, two lseeks, three reads, close) became
    5, and the zero-length reads went."""
    with _whole_file_reads(tmp_path / "a.duckdb", 300, suffix=".jpg") as store:
        rec = _fired(store, "zero_reads")
        facts = run_analyses(store, None, ["io.pattern"])[0].facts
    assert (facts["zero_read_suffix"], facts["zero_read_suffix_reads"]) == (".jpg", 100)
    assert rec is not None and "100 of 200 data-file reads (50.0%" in rec.evidence[0]
    assert rec.evidence[0].endswith("; 100 of them of .jpg files (io.pattern)")
    assert rec.action.startswith(
        "Read each image whole in one call of its size and decode it from memory: with open(path, 'rb', buffering=0) "
        "as f: data = f.read(os.fstat(f.fileno()).st_size), then Image.open(io.BytesIO(data))."
    )
    with _whole_file_reads(tmp_path / "b.duckdb", 300) as store:  # other files: the general advice
        rec = _fired(store, "zero_reads")
        facts = run_analyses(store, None, ["io.pattern"])[0].facts
    assert facts["zero_read_suffix"] == ".bin" and rec is not None and "Image.open" not in rec.action


def test_zero_reads_rule_leaves_the_ends_of_in_kernel_copies_out(tmp_path: Path) -> None:
    # shutil.copyfile on each file: sendfile until it returns 0, a call the advice to read the known size cannot save
    with _whole_file_reads(tmp_path / "a.duckdb", 5_000, op="sendfile_read") as store:
        assert _fired(store, "zero_reads") is None
        facts = run_analyses(store, None, ["io.pattern"])[0].facts
    assert (facts["zero_reads"], facts["zero_copy_reads"], facts["zero_copy_read_ns"]) == (100, 100, 500_000)
    # f.read() on the same files, and 20 of them copied beforehand: the copies' ends are named, not counted
    with _whole_file_reads(tmp_path / "b.duckdb", 5_000, copied=20) as store:
        rec = _fired(store, "zero_reads")
    assert rec is not None and "100 of 240 data-file reads (41.7%" in rec.evidence[0]
    assert "in 500 us of the" in rec.evidence[0] and "20 more ended in-kernel copies" in rec.evidence[0]


def _chunked_reads(path: Path, loaders: list[dict[str, Any]] | None, name: str = "/d/data.h5") -> Store:
    """Four iterations reading items of one 1 MiB file whose 16 chunks of 64 KiB are each read whole 20 times (as
    HDF5 reads the chunk of each item), and a small file read twice with overlapping reads."""
    config: dict[str, Any] = {"pid": MAIN} | ({A.CONFIG_DATALOADERS: loaders} if loaders is not None else {})
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "reads", levels=["model", "io"], config=config))
        sink = Sink(store, 1)
        for k in range(4):
            sink.span(1000 + k, None, "model", f"step#{k}", 10**7 * k, 10**7, MAIN, MAIN,
                      {A.MODEL_KIND: "step", A.MODEL_STEP: k})  # fmt: skip
        for i in range(320):
            chunk = (i * 7) % 16  # shuffled items: their chunks in no order
            io_span(sink, i + 1, None, "pread", 4 * 10**7 * i // 320, 20_000, W1, name, 65_536, offset=chunk * 65_536)
        for i, (offset, nbytes) in enumerate([(0, 100), (50, 100), (400, 10)]):
            io_span(sink, 500 + i, None, "read", 10**5 * i, 1000, W1, "/d/small.bin", nbytes, offset=offset)
        sink.close()
        add_files(store, [data_file(W1, name, 2**20, 320), data_file(W1, "/d/small.bin", 410, 3)])
    return Store.open(path)


def test_data_read_over_again_within_a_pass_over_it_is_found(tmp_path: Path) -> None:
    with _chunked_reads(tmp_path / "a.duckdb", [{"index": 0, "iterated": 1}]) as store:
        facts = run_analyses(store, None, ["io.pattern"])[0].facts
        rec = _fired(store, "reread")
    covered = 2**20 + 150 + 10  # the small file's two first reads overlap by 50 bytes
    assert (facts["read_covered_bytes"], facts["read_epochs"]) == (covered, 1)
    assert facts["reread_bytes"] == 320 * 65_536 + 210 - covered and facts["reread_times"] == 20.0
    assert facts["reread_path"] == "/d/data.h5" and facts["reread_ns"] == round(
        facts["read_ns"] * facts["reread_bytes"] / (320 * 65_536 + 210)
    )
    assert (
        rec is not None
        and "20.0 MiB read from 1.00 MiB of them (20.0 times, with 1 pass over the data begun)" in (rec.evidence[0])
    )
    assert "data.h5 is HDF5" in rec.action and "chunks=(1, *item_shape)" in rec.action
    assert rec.impact_ns == round(facts["reread_ns"] / 4)
    with _chunked_reads(tmp_path / "b.duckdb", [{"index": 0, "iterated": 1}], name="/d/records.bin") as store:
        rec = _fired(store, "reread")
    assert rec is not None and "HDF5" not in rec.action and "shuffle shards" in rec.action
    with _chunked_reads(tmp_path / "c.duckdb", [{"index": 0, "iterated": 1}], name="/d/train.parquet") as store:
        rec = _fired(store, "reread")
    assert rec is not None and "train.parquet is Parquet" in rec.action and "row_group_size" in rec.action
    # a torch.save archive: torch.load on its path reads a 13 KiB file in 31 calls, 2.3 times its bytes (a
    # DataLoader of 2,000 such files was told to shuffle shards)
    with _chunked_reads(tmp_path / "d.duckdb", [{"index": 0, "iterated": 1}], name="/d/1873.pt") as store:
        rec = _fired(store, "reread")
    assert rec is not None and rec.title == "Data read over again: torch.load reads each archive in many small pieces"
    assert rec.action.startswith("1873.pt is a torch.save archive (a zip file): torch.load on its path reads it in "
                                 "many small calls")  # fmt: skip
    assert "torch.load(io.BytesIO(f.read(os.fstat(f.fileno()).st_size)))" in rec.action
    # numpy's .npz, an archive per item: np.load read 4.3 times the bytes of 2,000 files of 1.35 KiB, and was told
    # to read only each item's offset and length
    with _chunked_reads(tmp_path / "npz.duckdb", [{"index": 0, "iterated": 1}], name="/d/1968.npz") as store:
        rec = _fired(store, "reread")
    assert rec is not None and rec.title == "Data read over again: each zip archive is read in many pieces"
    assert rec.action.startswith("1968.npz is a zip archive (numpy.savez writes one)") and ".npy" in rec.action
    assert "offset and length" not in rec.action
    # a gzip stream read by seeks: 849 MiB read from a 1.84 MiB file, each backward seek decompressing it again from
    # its start (a DataLoader's step went from 44.5 ms to 724 us with the stream decompressed once per worker)
    with _chunked_reads(tmp_path / "e.duckdb", [{"index": 0, "iterated": 1}], name="/d/rec.bin.gz") as store:
        rec = _fired(store, "reread")
    assert (
        rec is not None
        and rec.title == "Data read over again: seeks in a compressed stream decompress it from its start"
    )
    assert rec.action.startswith("rec.bin.gz is a compressed stream: Python's gzip, bz2 and lzma files seek backwards "
                                 "by decompressing again from the start")  # fmt: skip
    assert "decompress it once in each worker and keep it in memory" in rec.action


def test_the_bytes_covered_count_each_range_once_when_reads_of_it_tie(tmp_path: Path) -> None:
    """1,200 files, each read twice over the same 4 KiB, one after the other (np.load(mmap_mode='r') reads an .npy
    file's header twice): the two windows that joined the ranges ordered the tied reads each as it pleased, and
    three files' ranges counted twice, as in the real run these reads are from; the bytes read again went
    unfound."""
    with Store.create(tmp_path / "t.duckdb") as store:
        store.add_run(RunInfo(1, "ties", levels=["model", "io"],
                              config={"pid": MAIN, A.CONFIG_DATALOADERS: [{"index": 0, "iterated": 1}]}))  # fmt: skip
        sink = Sink(store, 1)
        for i in range(2400):
            io_span(sink, 10 + i, None, "read", 1000 * i, 1000, MAIN, f"/d/items/{i // 2:04d}.npy", 4096, offset=0)
        sink.close()
    with Store.open(tmp_path / "t.duckdb") as store:
        facts = run_analyses(store, None, ["io.pattern"])[0].facts
    assert facts["read_covered_bytes"] == 1200 * 4096 and facts["reread_bytes"] == 1200 * 4096


def test_a_loop_waiting_on_workers_that_decompress_a_stream_again_for_each_item_is_told_so(tmp_path: Path) -> None:
    """A gzip stream read by seeks in shuffled order, 460.8 times its bytes: the loop waited 39.7 ms a step for
    workers whose file I/O took 3.37 ms of it, and was told that building the items was what it waited for."""
    from xstack.analyze._recommend_input import cheaper
    from xstack.analyze.result import Result

    pattern = Result(
        "io.pattern", "p", facts={"reread_bytes": 10**9, "reread_path": "/d/rec.bin.gz", "reread_times": 460.8}
    )
    io = Result("io.input_bound", "i", facts={"worker_io_per_iteration_ns": 3_370_000, "mean_wait_ns": 39_700_000})
    assert cheaper({"io.pattern": pattern, "io.input_bound": io}) == (
        "make each batch cheaper to build: the workers' file I/O (3.37 ms per iteration, against 39.7 ms of waiting) "
        "is not what the loop waits for, decompressing rec.bin.gz again from its start for each item is (460.8 times "
        "its bytes read): see the finding on data read over again"
    )
    for facts in ({"reread_path": "/d/rec.bin"}, {"reread_times": 3.0}):  # not compressed; read again a little
        other = Result("io.pattern", "p", facts=pattern.facts | facts)
        assert "building the items is" in cheaper({"io.pattern": other, "io.input_bound": io})


def _opened_per_item(path: Path, name: str) -> Store:
    """A file of one 16 KiB header and 600 items of 1 KiB, opened for each item in one pass over the data: each
    open reads the header from its start, then the item (as h5py.File in __getitem__ reads HDF5's metadata)."""
    with Store.create(path) as store:
        loaders = [{"index": 0, "iterated": 1}]
        store.add_run(RunInfo(1, "items", levels=["model", "io"], config={"pid": MAIN, A.CONFIG_DATALOADERS: loaders}))
        sink = Sink(store, 1)
        sink.span(1000, None, "model", "step#0", 0, 10**7, MAIN, MAIN, {A.MODEL_KIND: "step", A.MODEL_STEP: 0})
        for i in range(600):
            at = 10_000 * i
            io_span(sink, 3 * i + 1, None, "open", at, 10, W1, name)
            io_span(sink, 3 * i + 2, None, "pread", at + 10, 100, W1, name, 16_384, offset=0)
            io_span(sink, 3 * i + 3, None, "pread", at + 110, 100, W1, name, 1024, offset=16_384 + 1024 * i)
        sink.close()
    return Store.open(path)


def test_a_file_opened_for_each_item_is_told_to_be_kept_open(tmp_path: Path) -> None:
    """h5py.File opened in each __getitem__: 4,032 opens of one HDF5 file, each reading 63 KiB of its metadata from
    its start, 49.7 times the file's bytes. It was told the file was read whole again and again, to load it once."""
    with _opened_per_item(tmp_path / "a.duckdb", "/d/items.h5") as store:
        rec = _fired(store, "reread")
        facts = _one(store, "io.pattern").facts
    assert (facts["reread_opens"], facts["reread_from_start"], facts["reread_covered"]) == (
        600,
        600,
        16_384 + 600 * 1024,
    )
    assert rec is not None and rec.title == "Data read over again: a file opened for each item"
    assert rec.action.startswith("items.h5 is opened 600 times, and each open reads it again from its start (17.0 KiB "
                                 "of its 616 KiB on average: its superblock and metadata, as HDF5 reads them at each "
                                 "open): open it once in each worker (h5py.File on first use")  # fmt: skip
    with _opened_per_item(tmp_path / "b.duckdb", "/d/items.rec") as store:
        rec = _fired(store, "reread")
    assert rec is not None and "(17.0 KiB of its 616 KiB on average: its header or index): open it once" in rec.action


MAPPED_EACH_ITEM = """
import numpy as np, torch, xstack

class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 2048
    def __getitem__(self, i):
        tokens = np.load("tokens.npy", mmap_mode="r")  # its header read, and the file mapped, again for each item
        return torch.from_numpy(np.array(tokens[i], dtype=np.int64))

if __name__ == "__main__":
    np.save("tokens.npy", np.arange(2048 * 256, dtype=np.int32).reshape(2048, 256))  # 2 MiB, 1 KiB an item
    for x in torch.utils.data.DataLoader(Rows(), batch_size=64, num_workers=2):
        with xstack.span("compute"):
            x.sum()
        xstack.step()
"""


def test_a_file_mapped_again_for_each_item_is_told_to_be_kept_mapped_not_loaded_whole(tmp_path: Path) -> None:
    """np.load(path, mmap_mode='r') in __getitem__: each item read the first 4 KiB of a 20 MiB token file and mapped
    it, 9,920 times. The reads cover the header alone, so the file was said to be read whole again and again, and
    to be loaded once: it is mapped, not read, and is to be kept mapped."""
    results = _run_io_loop(tmp_path, MAPPED_EACH_ITEM)
    facts = results["io.pattern"].facts
    assert facts["reread_path"] == str(tmp_path / "tokens.npy") and facts["reread_opens"] >= 2000, facts
    assert facts["reread_mapped"] is True and facts["reread_kind"] == "reopened", facts
    rec = RULES["reread"](results)
    assert rec is not None and rec.title == "Data read over again: a file opened for each item"
    assert "its header, before each open maps it again, as np.load(path, mmap_mode='r') does" in rec.action
    assert "np.load(path, mmap_mode='r') on first use in __getitem__, the array kept on the dataset" in rec.action
    assert " of its " not in rec.action.split("(")[1], rec.action  # its reads cover its header, not the file


LABELS_EACH_ITEM = """
import json, os, torch, xstack

class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 256
    def __getitem__(self, i):
        with open("labels.json") as f:  # the whole labels file, loaded again for each item
            labels = json.load(f)
        return torch.tensor([float(labels[str(i)])])

if __name__ == "__main__":
    with open("labels.json", "w") as f:
        json.dump({str(i): i % 10 for i in range(4000)}, f)
    for x in torch.utils.data.DataLoader(Items(), batch_size=16, num_workers=2):
        with xstack.span("compute"):
            x.sum()
        xstack.step()
"""


def test_a_file_loaded_whole_for_each_item_is_to_be_loaded_once(tmp_path: Path) -> None:
    results = _run_io_loop(tmp_path, LABELS_EACH_ITEM)
    facts = results["io.pattern"].facts
    assert facts["reread_path"] == str(tmp_path / "labels.json") and facts["reread_from_start"] >= 200, facts
    rec = RULES["reread"](results)
    assert rec is not None and rec.title == "Data read over again: a file read whole again and again"
    assert rec.action.startswith("labels.json is read whole again and again (") and "__init__" in rec.action
    # the loop, computing next to nothing, waits for its items: parsing the file again is part of building them
    assert loop_waits_for_data(results) is not None, results["io.input_bound"].facts
    assert rec.severity == "medium" and "the workers' CPU time to parse what it holds again" in rec.evidence[1]
    loaded = RULES["input_bound"](results)
    assert loaded is not None and "reading labels.json (" in loaded.action, loaded.action
    assert "whole again and again, and parsing what it holds each time, is (" in loaded.action


GZIPPED_ITEMS = """
import gzip, io, numpy, torch, xstack

class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 96
    def __getitem__(self, i):
        with gzip.open(f"{i % 48}.npy.gz", "rb") as f:  # each byte decompressed for each item
            return torch.from_numpy(numpy.load(io.BytesIO(f.read())))

if __name__ == "__main__":
    for i in range(48):
        b = io.BytesIO()
        numpy.save(b, numpy.random.default_rng(i).random((64, 1024), dtype=numpy.float32))
        with gzip.open(f"{i}.npy.gz", "wb") as f:
            f.write(b.getvalue())
    for x in torch.utils.data.DataLoader(Items(), batch_size=8, num_workers=2):
        with xstack.span("compute"):
            x.sum()
        xstack.step()
"""


def test_workers_that_decompress_each_item_are_told_of_it(tmp_path: Path) -> None:
    """A DataLoader reading gzipped .npy files, 256 KiB each: it was told to decode and augment less, or on the
    GPU, while what its workers do is decompress each item (2.4 ms of file I/O per iteration against 10.1 ms of
    waiting, in a run of 1,000 such files)."""
    results = _run_io_loop(tmp_path, GZIPPED_ITEMS)
    facts = results["io.input_bound"].facts
    assert (facts["worker_compressed_files"], facts["worker_data_files"]) == (48, 48), facts
    named = (
        "; all the data files they read are compressed streams (gzip, bzip2, LZMA), each byte of which they "
        "decompress for each item: store them uncompressed, or compressed with a faster codec (zstd, LZ4)"
    )
    how = cheaper(results)
    if _reading_share(facts, main=False) is not None:  # the usual case: decompressing, not reading, is the wait
        assert "building the items is" in how and named in how, how
    else:  # a loaded machine's reads, taken off their CPU, can take 25% of the wait: reading fewer files, then
        assert "building the items is" not in how and named not in how, how
    rec = RULES["input_bound"](results)  # the advice on building the items, where it gives it, names them
    assert rec is not None and ("building the items is" in rec.action) == (named in rec.action), rec.action


HDF5_ITEMS = """
import h5py, numpy, torch, xstack

class Rows(torch.utils.data.Dataset):
    def __init__(self):
        self.file = None
    def __len__(self):
        return 4096
    def __getitem__(self, i):
        if self.file is None:
            self.file = h5py.File("rows.h5", "r")
        return torch.from_numpy(self.file["x"][i]), int(self.file["y"][i])  # each dataset looked up by name

if __name__ == "__main__":
    with h5py.File("rows.h5", "w") as f:
        rows = numpy.random.default_rng(0).random((4096, 256), dtype=numpy.float32)
        f.create_dataset("x", data=rows, chunks=(1, 256))
        f.create_dataset("y", data=numpy.arange(4096) % 10, chunks=(1,))
    loader = torch.utils.data.DataLoader(Rows(), batch_size=64, shuffle=True, num_workers=2)
    for x, y in loader:
        with xstack.span("compute"):
            x.sum()
        xstack.step()
"""


def test_workers_that_read_hdf5_rows_through_h5py_are_told_to_keep_its_datasets_open(tmp_path: Path) -> None:
    """A DataLoader whose dataset read each item as self.file['x'][i] from an HDF5 file kept open: the loop waited
    4.4 ms of its 9.6 ms step, its workers' file I/O 0.54 ms of it, and it was told to decode and augment less. Each
    lookup by name opens the HDF5 dataset again, its chunk cache empty: with the datasets kept open, the step took
    3.3 ms."""
    pytest.importorskip("h5py", reason="h5py is not installed")
    results = _run_io_loop(tmp_path, HDF5_ITEMS)
    facts = results["io.input_bound"].facts
    assert facts["worker_data_path"] == str(tmp_path / "rows.h5"), facts
    named = "; rows.h5 is HDF5, read through h5py: keep its datasets open as well as the file (self.x = self.file['x']"
    how = cheaper(results)
    if _reading_share(facts, main=False) is not None:  # the usual case: h5py's work per item, not reading, is the wait
        assert "building the items is" in how and named in how and "rather than a list of indices" in how, how
    else:  # a loaded machine's reads, taken off their CPU, can take 25% of the wait: reading fewer, larger pieces
        assert "building the items is" not in how and named not in how, how
    rec = RULES["input_bound"](results)
    assert rec is not None and ("building the items is" in rec.action) == (named in rec.action), rec.action
    # where the workers' data files are not HDF5, nothing is said of h5py
    assert _hdf5({"worker_data_path": "/d/items.npy"}, "__getitem__") == ""


def test_data_read_once_per_epoch_is_not_read_over_again(tmp_path: Path) -> None:
    # twelve passes over the data explain twenty reads of each chunk; with no DataLoader seen, nothing is said
    for loaders, epochs in (([{"index": 0, "iterated": 4}, {"index": 1, "iterated": 8}], 12), (None, None)):
        with _chunked_reads(tmp_path / f"{epochs}.duckdb", loaders) as store:
            facts = run_analyses(store, None, ["io.pattern"])[0].facts
            assert _fired(store, "reread") is None
        assert facts["read_epochs"] == epochs and facts["reread_bytes"] == 0


NPY_ITEMS = """
import os, sys
import numpy as np
import torch
import xstack
from torch.utils.data import DataLoader, Dataset

os.makedirs("items", exist_ok=True)
for i in range(1200):
    np.save(f"items/{i:04d}.npy", np.full((3, 32, 32), i, dtype=np.float32))
mode = sys.argv[1] if len(sys.argv) > 1 else "r"


class Items(Dataset):
    def __len__(self):
        return 1200

    def __getitem__(self, i):
        return torch.from_numpy(np.array(np.load(f"items/{i:04d}.npy", mmap_mode=mode or None)))


model = torch.nn.Linear(3 * 32 * 32, 1)
for x in DataLoader(Items(), batch_size=50):
    model(x.flatten(1)).sum().backward()
    xstack.step()
"""


def test_each_file_read_from_its_start_again_within_one_load_is_said_so(tmp_path: Path) -> None:
    """np.load(path, mmap_mode='r') for each item of 1,200 small .npy files: each is opened three times, its
    header read twice, then mapped. The finding on data read over again advised reading only each item's bytes and
    shuffling shards; each file read from its start by two opens per pass is a loader opening it again, and
    np.load(path) opens and reads it once."""
    results = _run_io_loop(tmp_path, NPY_ITEMS)
    facts = results["io.pattern"].facts
    assert (facts["reread_kind"], facts["reread_files"], facts["reread_opens_per_file"]) == ("reloaded", 1200, 2.0)
    assert facts["reread_open_bytes"] == 4096  # a buffered read of the header, each time
    rec = RULES["reread"](results)
    assert rec is not None and rec.title == (
        "Data read over again: each file opened and read from its start more than once per load"
    )
    assert rec.action.startswith(
        "1,200 data files are each read from their start by 2 opens of them per pass over the data, on average "
        "(4.00 KiB an open): the loader opens a file again to parse its header"
    ), rec.action
    assert _reading_opens(tmp_path / "p.duckdb", "0007.npy") == 3  # as the advice says
    # np.load(path): one open a file, each byte read once: no finding
    once = tmp_path / "once"
    once.mkdir()
    results = _run_io_loop(once, NPY_ITEMS.replace('else "r"', 'else ""'))
    assert results["io.pattern"].facts["reread_bytes"] == 0 and RULES["reread"](results) is None
    assert _reading_opens(once / "p.duckdb", "0007.npy") == 1


def _reading_opens(store_path: Path, name: str) -> int:
    """The opens for reading (not the program's own writing of it) of the file called ``name``."""
    with Store.open(store_path) as store:
        return int(store.query(
            f"SELECT count(*) FROM spans WHERE level = 'io' AND name IN ('open', 'openat') "
            f"AND attrs->>'$.\"{A.IO_PATH}\"' LIKE ? AND (attrs->>'$.\"{A.IO_REQUESTED_BYTES}\"')::BIGINT & 3 = 0",
            [f"%/{name}"],
        )[0][0])  # fmt: skip


def test_the_io_time_at_stake_per_iteration_leaves_the_warm_up_out(tmp_path: Path) -> None:
    """A live run's first iteration is warm-up: the I/O done in it (files 0-24 of the 100, read in the first of
    the four 500 us steps) is not spread over the three measured ones."""
    big = [data_file(MAIN, "/d/big.tar", 100 * 2**20, 10, read_ns=50_000)]  # the bytes, in few operations
    with _whole_file_reads(tmp_path / "a.duckdb", 300, {A.CONFIG_WARMUP_STEPS: 1}, big) as store:
        zero, small = _fired(store, "zero_reads"), _fired(store, "small_files")
        facts = {r.id: r.facts for r in run_analyses(store, None, ["io.pattern", "io.small_files"])}
    assert zero is not None and zero.impact_ns == (30_000 - 25 * 300) // 3
    assert (facts["io.pattern"]["zero_read_ns"], facts["io.pattern"]["zero_read_warmup_ns"]) == (30_000, 7_500)
    # each small file: its two reads (10.3 us) and its open (10 ns, counters only): the warm-up's reads left out
    small_ns = facts["io.small_files"]["small_time_ns"]
    assert (small_ns, facts["io.small_files"]["small_time_warmup_ns"]) == (100 * 10_310, 25 * 10_300)
    assert small is not None and small.impact_ns == round((small_ns - 25 * 10_300) / 3)
    with _whole_file_reads(tmp_path / "b.duckdb", 300, {A.CONFIG_WARMUP_STEPS: 0}, big) as store:
        assert (_fired(store, "zero_reads") or zero).impact_ns == 30_000 // 4  # every iteration measured


def test_the_io_time_at_stake_over_a_run_is_at_most_the_run(tmp_path: Path) -> None:
    """A preprocessing script whose two pool workers read and wrote 6,000 small files side by side, 1.41 s of I/O
    in a run of 1.10 s, had 1.41 s at stake: more than the whole run, which no change can save."""
    from xstack.analyze._recommend_common import at_stake

    rows = [data_file(W1 + k % 2, f"/d/{k}.npy", 2048, 2, read_ns=1_000_000) for k in range(100)]
    with files_store(tmp_path / "a.duckdb", rows) as store:
        results = {r.id: r for r in run_analyses(store)}
    stages = Result("model.stages", "t", facts={"wall_ns": 60_000_000, "steps": 0})
    rec = RULES["small_files"]({**results, "model.stages": stages})
    assert rec is not None and (rec.impact_ns, rec.impact_per) == (60_000_000, "run")
    assert at_stake({"model.stages": stages}, 5_000_000) == (5_000_000, "run")  # under the wall: as it is
    assert at_stake(results, 100_000_000) == (100_000_000, "run")  # no wall time known (a Darshan log's)


def test_small_reads_rule_leaves_the_empty_reads_out_of_the_median(tmp_path: Path) -> None:
    # f.read() on 100 files of 4 KiB: 100 reads of 4096 bytes and 100 empty reads finding the end; the reads
    # that move data are not small (the empty ones are the zero-read rule's)
    with _whole_file_reads(tmp_path / "a.duckdb", 300) as store:
        assert _one(store, "io.pattern").facts["median_read_bytes"] == 4096
        assert _fired(store, "small_reads") is None
        assert _fired(store, "zero_reads") is not None


def test_small_reads_of_files_smaller_than_a_page_are_not_to_be_made_larger(tmp_path: Path) -> None:
    """512 .npy files of 384 bytes, each read whole: reads of 384 bytes could not be larger. They were told to
    read in larger pieces; the small files' rule weighs them."""
    with Store.create(tmp_path / "a.duckdb") as store:
        store.add_run(RunInfo(1, "npy", levels=["model", "io"], config={"pid": MAIN}))
        sink = Sink(store, 1)
        for k in range(200):
            io_span(sink, k + 1, None, "read", 1000 * k, 100, W1, f"/d/{k}.npy", 384, offset=0)
        for k in range(50):  # and a big file read in small pieces: a quarter of the small reads
            io_span(sink, 300 + k, None, "read", 10**6 + 1000 * k, 100, W1, "/d/big.bin", 512, offset=512 * k)
        sink.close()
        add_files(store, [data_file(W1, f"/d/{k}.npy", 384, 1) for k in range(200)]
                  + [data_file(W1, "/d/big.bin", 512 * 50, 50)])  # fmt: skip
    with Store.open(tmp_path / "a.duckdb") as store:
        facts = _one(store, "io.pattern").facts
        assert (facts["small_reads"], facts["small_reads_small_files"], facts["median_read_bytes"]) == (250, 200, 384)
        assert _fired(store, "small_reads") is None


SHUFFLED_RECORDS = """
import os, random, xstack
with open("records.bin", "wb") as f:
    f.write(os.urandom(256 * 4096))
order = list(range(4096))
random.Random(0).shuffle(order)
{keep}
for step in range(8):
    for i in order[64 * step:64 * step + 64]:  # a batch of 256-byte records, in shuffled order
{read}
    xstack.step()
"""
_OPEN_EACH = """        with open("records.bin", "rb", buffering=0) as f:  # as np.fromfile(path, offset=...) does
            f.seek(256 * i)
            f.read(256)"""
_OPEN_ONCE = """        f.seek(256 * i)
        f.read(256)"""


@pytest.mark.parametrize("opens", ["each", "once"])
def test_small_reads_at_scattered_places_are_not_told_to_use_a_larger_buffer(tmp_path: Path, opens: str) -> None:
    """A DataLoader of 256-byte records read in shuffled order (np.fromfile with an offset, an open each) was told
    to read through buffered streams of 1 MiB, which made its step go from 3.2 ms to 12.6 ms: each seek throws the
    buffer away. Reads at scattered places, random by Darshan's counters or in shuffled order with an open each
    (which those counters take for sequential), are told to read each record's own bytes or to map the file."""
    keep = 'f = open("records.bin", "rb", buffering=0)' if opens == "once" else ""
    program = SHUFFLED_RECORDS.replace("{keep}", keep).replace("{read}", _OPEN_ONCE if opens == "once" else _OPEN_EACH)
    results = _run_io_loop(tmp_path, program)
    facts = results["io.pattern"].facts
    rec = RULES["small_reads"](results)
    assert rec is not None and facts["median_read_bytes"] == 256
    assert rec.action == SCATTERED_READS and "buffering=1 << 20" not in rec.action.split("):")[-1]
    if opens == "each":  # each read starts past byte 0 of its open: sequential to Darshan
        assert facts["random_pct"] < 25 and facts["jumped_reads"] * 2 >= facts["reads_after_earlier"] >= 100
        assert "records read in shuffled order (io.pattern)" in rec.evidence[0]
    else:
        assert facts["random_pct"] >= 25 and "random (by Darshan's counters" in rec.evidence[0], facts


H5_PER_ITEM = """
import random, h5py, xstack
random.seed(0)
for step in range(12):
    for i in random.sample(range(2000), 32):
        with h5py.File("data.h5", "r") as f:  # opened for each item
            row = f["x"][i]
    xstack.step()
"""


def test_small_reads_of_hdf5_files_opened_for_each_item_are_told_to_keep_them_open(tmp_path: Path) -> None:
    """h5py.File opened for each item: HDF5 reads the file's metadata again at each open, in reads of 512 bytes.
    They were told to read each record's bytes with os.pread or to map the file with np.load, neither of which
    reads an HDF5 file."""
    h5py = pytest.importorskip("h5py")
    import numpy as np

    with h5py.File(tmp_path / "data.h5", "w") as f:
        f.create_dataset("x", data=np.zeros((2000, 32), dtype="f4"), chunks=(64, 32))
    results = _run_io_loop(tmp_path, H5_PER_ITEM)
    facts = results["io.pattern"].facts
    rec = RULES["small_reads"](results)
    assert facts["small_read_suffix"] == ".h5" and facts["small_read_suffix_reads"] >= 0.5 * facts["small_reads"]
    assert rec is not None and rec.action == HDF5_SMALL_READS, rec
    assert re.search(r"; [\d,]+ of them of \.h5 files \(HDF5 files\) \(io\.pattern\)$", rec.evidence[0]), rec.evidence


def test_small_reads_of_torch_archives_are_told_to_load_each_file_from_memory(tmp_path: Path) -> None:
    """A DataLoader's workers loading 4,096 .pt files of 13 KiB by path: 12 reads a load, half of them small, 2.3
    times the file's bytes. They were told to use buffered streams, which torch.load on a path does not take.
    Read whole in one call of its size and loaded from memory: reads -83%, bytes read -56%, read time -61%."""
    with Store.create(tmp_path / "a.duckdb") as store:
        store.add_run(RunInfo(1, "pt", levels=["model", "io"], config={"pid": MAIN}))
        sink = Sink(store, 1)
        for k in range(100):  # each load: 4 small reads of its zip records, one of the tensor's 12 KiB
            for i, (size, at) in enumerate(((64, 0), (30, 12_000), (512, 12_100), (22, 13_700), (12_288, 64))):
                io_span(sink, 10 * k + i + 1, None, "read", 10_000 * k + 100 * i, 50, W1, f"/d/{k}.pt", size,
                        offset=at)  # fmt: skip
        sink.close()
        add_files(store, [data_file(W1, f"/d/{k}.pt", 13_722, 5) for k in range(100)])
    with Store.open(tmp_path / "a.duckdb") as store:
        facts = _one(store, "io.pattern").facts
        rec = _fired(store, "small_reads")
    assert (facts["small_read_suffix"], facts["small_read_suffix_reads"]) == (".pt", 400)
    assert rec is not None and rec.evidence[0].endswith("; 400 of them of .pt files (torch.save archives) (io.pattern)")
    assert rec.action.startswith("Read each file whole and load it from memory: with open(path, 'rb') as f: obj = "
                                 "torch.load(io.BytesIO(f.read(os.fstat(f.fileno()).st_size))).")  # fmt: skip


def _shard_readers(path: Path, *, split: bool, iterable: bool = True, vocab: bool = False, epochs: int = 1,
                   shards: int = 8) -> Store:  # fmt: skip
    """Four steps of a DataLoader over 8 shards (``shards``) of 64 KiB with 2 workers: each worker reads all 8
    (``split``: its own 4), in 4 reads of 16 KiB each; ``vocab``: each worker first reads a 1 MiB vocabulary file
    whole; ``epochs``: the workers start anew for each (not persistent), later, and read the same."""
    loader = {"index": 0, "dataset": "Shards", "batch_size": 64, "num_workers": 2, "persistent_workers": False,
              "pin_memory": False, "prefetch_factor": 2, "iterated": 1, "cuda": False}  # fmt: skip
    loader["iterable"] = iterable
    with Store.create(path) as store:
        config = {"pid": MAIN, A.CONFIG_CPU_COUNT: 2, A.CONFIG_DATALOADERS: [loader]}
        store.add_run(RunInfo(1, "shards", levels=["model", "io"], config=config))
        sink = Sink(store, 1)
        for k in range(4):
            sink.span(1 + k, None, "model", f"step#{k}", 10**6 * k, 10**6, MAIN, 1,
                      {A.MODEL_KIND: "step", A.MODEL_STEP: k})  # fmt: skip
            sink.span(10 + k, 1 + k, "model", "dataloader.next", 10**6 * k, 1000, MAIN, 1, {A.MODEL_KIND: "dataloader"})
        span = iter(range(100, 10_000))
        for epoch in range(epochs):
            t0 = 10**7 * epoch
            for w, pid in enumerate((W1 + 100 * epoch, W2 + 100 * epoch)):
                if vocab:
                    for i in range(16):
                        io_span(sink, next(span), None, "read", t0 + 1000 * i, 10, pid, "/d/vocab.json", 65_536,
                                offset=65_536 * i)  # fmt: skip
                for shard in range(w, shards, 2) if split else range(shards):
                    for i in range(4):
                        io_span(sink, next(span), None, "read", t0 + 500_000 * shard + 1000 * i, 10, pid,
                                f"/d/{shard}.jsonl", 16_384, offset=16_384 * i)  # fmt: skip
        sink.close()
    return Store.open(path)


def test_workers_of_an_iterable_dataset_that_each_read_every_shard_are_told_to_split_them(tmp_path: Path) -> None:
    """An IterableDataset whose __iter__ read every shard in each of its 2 workers: twice the iterations per epoch
    (998 against 499), every item yielded twice. It was told "each read pulls in more than its item"."""
    with _shard_readers(tmp_path / "a.duckdb", split=False) as store:
        facts = _one(store, "io.pattern").facts
        results = {r.id: r for r in run_analyses(store)}
    assert (facts["shared_files"], facts["shared_readers"], facts["shared_path"]) == (8, 2, "/d/0.jsonl")
    assert facts["shared_read_bytes"] == facts["worker_read_bytes"] == 2 * 8 * 65_536
    rec = RULES["shared_shards"](results)
    assert rec is not None and rec.severity == "high"
    assert rec.title == "The 2 DataLoader workers each read all the data: items repeated, or read 2 times"
    assert rec.evidence[0] == ("2 worker processes each read 8 data files whole (/d/0.jsonl the largest): 1.00 MiB of "
                               "the 1.00 MiB the workers read from data files (io.pattern)")  # fmt: skip
    assert rec.action.startswith(
        "Give each worker its own shards in Shards.__iter__: info = torch.utils.data.get_worker_info(), then "
        "files[info.id::info.num_workers]"
    )
    assert "repeats each item 2 times an epoch" in rec.action and "still reads all the data 2 times" in rec.action
    assert RULES["reread"](results) is None  # the reading again is the workers', not each read's
    # one file, which each worker read whole (a CSV parsed in chunks, each worker keeping every other one): there are
    # no shards to split; each is to read its own part of it
    with _shard_readers(tmp_path / "one.duckdb", split=False, shards=1) as store:
        rec = _fired(store, "shared_shards")
    assert rec is not None and rec.action.startswith(
        "The workers read one data file, 0.jsonl: give each worker its own part of it in Shards.__iter__"
    ), rec.action
    assert "its own byte range (seek to info.id * size // info.num_workers" in rec.action, rec.action
    assert "still reads and parses all of it 2 times" in rec.action
    for name, kw in (("split", {"split": True}), ("map", {"split": False, "iterable": False}),
                     ("vocab", {"split": True, "vocab": True}),
                     ("epochs", {"split": True, "epochs": 2})):  # fmt: skip
        # epochs: the workers each epoch starts anew read the same shards as the last epoch's, never at once
        with _shard_readers(tmp_path / f"{name}.duckdb", **kw) as store:
            facts = _one(store, "io.pattern").facts
            assert _fired(store, "shared_shards") is None, name
        if name == "vocab":  # both read the vocabulary whole, their own shards apart: most bytes are not shared
            assert (facts["shared_files"], facts["shared_path"]) == (1, "/d/vocab.json")


def test_reads_through_a_descriptor_workers_inherited_are_found_with_their_races(tmp_path: Path) -> None:
    """The main process opens a file (fd 6), two workers forked after it seek and read it through that descriptor:
    one offset for both. A read whose last offset move, before it, was the other worker's is a race. Tells
    (lseek SEEK_CUR) move nothing; preads take their own offset; a descriptor a worker opened itself is its own."""
    with Store.create(tmp_path / "a.duckdb") as store:
        store.add_run(RunInfo(1, "fd", levels=["model", "io"], config={"pid": MAIN}))
        sink = Sink(store, 1)
        span = iter(range(1, 1000))

        def call(op: str, at: int, pid: int, path: str = "/d/rec.bin", fd: int = 6, nbytes: int | None = None,
                 whence: int | None = None, offset: int | None = None) -> None:  # fmt: skip
            extra = {A.IO_FD: fd} | ({} if whence is None else {A.IO_REQUESTED_BYTES: whence})
            io_span(sink, next(span), None, op, at, 5, pid, path, nbytes, offset=offset, **extra)

        call("open", 0, MAIN)
        call("lseek", 10, W1, whence=0)  # W1 seeks
        call("lseek", 20, W2, whence=0)  # W2 seeks: W1's read below starts where W2 put the offset
        call("read", 30, W1, nbytes=1024)  # a race
        call("read", 40, W2, nbytes=1024)  # a race: W1's read moved it last
        call("lseek", 50, W2, whence=1)  # a tell moves nothing
        call("read", 60, W2, nbytes=1024)  # not a race: W2's own read moved it last
        call("pread", 70, W1, nbytes=1024, offset=0)  # its own offset
        call("open", 80, W1, "/d/own.bin", fd=7)  # opened by the worker itself: not shared
        call("read", 90, W1, "/d/own.bin", fd=7, nbytes=10)
        call("read", 95, W2, "/d/own.bin", fd=7, nbytes=10)  # W2's inherited fd 7 is another file's; one reader
        sink.close()
    with Store.open(tmp_path / "a.duckdb") as store:
        facts = _one(store, "io.pattern").facts
        rec = _fired(store, "shared_offset")
    got = tuple(facts[f"shared_offset_{k}"] for k in ("path", "fd", "processes", "reads", "races"))
    assert got == ("/d/rec.bin", 6, 2, 3, 2)
    assert rec is not None and rec.severity == "high"
    assert rec.title == "DataLoader workers share the file offset of rec.bin: items read from the wrong place"
    assert rec.evidence[0].startswith("2 processes read /d/rec.bin through descriptor 6, which they did not open but "
                                      "inherited")  # fmt: skip
    assert "3 reads at that offset, 2 of them started after another process had moved that offset" in rec.evidence[0]
    assert rec.action.startswith("Open rec.bin in each worker, not before they start")
    # one worker an epoch, started anew for each (no persistent workers): each inherits the descriptor when the one
    # before has ended, and seeks before it reads: no offset shared at once
    with Store.create(tmp_path / "b.duckdb") as store:
        store.add_run(RunInfo(1, "fd", levels=["model", "io"], config={"pid": MAIN}))
        sink = Sink(store, 1)
        io_span(sink, 1, None, "open", 0, 5, MAIN, "/d/rec.bin", **{A.IO_FD: 6})
        for epoch, pid in enumerate((W1, W2)):
            for i in range(3):
                at = 1000 * epoch + 100 * i
                io_span(sink, 10 + 10 * epoch + 2 * i, None, "lseek", at, 5, pid, "/d/rec.bin",
                        **{A.IO_FD: 6, A.IO_REQUESTED_BYTES: 0})  # fmt: skip
                io_span(sink, 11 + 10 * epoch + 2 * i, None, "read", at + 10, 5, pid, "/d/rec.bin", 1024,
                        **{A.IO_FD: 6})  # fmt: skip
        sink.close()
    with Store.open(tmp_path / "b.duckdb") as store:
        facts = _one(store, "io.pattern").facts
        assert _fired(store, "shared_offset") is None
    assert (facts["shared_offset_processes"], facts["shared_offset_races"]) == (0, 0)


def test_workers_querying_a_sqlite_connection_opened_before_they_forked_are_told_to_open_their_own(
    tmp_path: Path,
) -> None:
    """sqlite3.connect in the dataset's __init__: the workers query the database through the descriptor they
    inherited, which SQLite's documentation says not to do. Nothing was said; a connection opened in each worker
    on first use, or another file read through an inherited descriptor, is not a finding."""
    for name, db, own in (("a", "/d/items.db", False), ("b", "/d/items.db", True), ("c", "/d/rows.bin", False)):
        with Store.create(tmp_path / f"{name}.duckdb") as store:
            store.add_run(RunInfo(1, "db", levels=["model", "io"], config={"pid": MAIN}))
            sink = Sink(store, 1)
            io_span(sink, 1, None, "open", -200, 5, MAIN, db, **{A.IO_FD: 6})
            for k, pid in enumerate((W1, W2)):
                if own:
                    io_span(sink, 10 + k, None, "open", -100 + k, 5, pid, db, **{A.IO_FD: 7})
                for i in range(3):
                    fd = 7 if own else 6
                    io_span(sink, 20 + 10 * k + 2 * i, None, "pread", 100 * i + k, 5, pid, db, 16, offset=24,
                            **{A.IO_FD: fd})  # fmt: skip
                    io_span(sink, 21 + 10 * k + 2 * i, None, "pread", 100 * i + k + 50, 5, pid, db, 4096,
                            offset=4096 * (i + 1), **{A.IO_FD: fd})  # fmt: skip
            sink.close()
        with Store.open(tmp_path / f"{name}.duckdb") as store:
            facts = _one(store, "io.pattern").facts
            rec = _fired(store, "forked_sqlite")
        if name == "a":
            assert (facts["forked_sqlite_path"], facts["forked_sqlite_fd"]) == ("/d/items.db", 6)
            assert (facts["forked_sqlite_processes"], facts["forked_sqlite_reads"]) == (2, 12)
            assert rec is not None and rec.severity == "medium"
            assert rec.title == "DataLoader workers use a SQLite connection opened before they forked (items.db)"
            assert rec.evidence[0].startswith(
                "2 processes other than the main one read /d/items.db through descriptor 6, which they did not open "
                "but inherited, 12 reads"
            )
            assert "fork()" in rec.action and "on first use" in rec.action
            assert facts["forked_hdf5_processes"] == 0 and facts["forked_hdf5_path"] is None  # not an HDF5 file
        elif name == "c":  # read at SQLite's change counter, so SQLite's whatever its name
            assert facts["forked_sqlite_path"] == "/d/rows.bin" and rec is not None
        else:
            assert facts["forked_sqlite_processes"] == 0 and rec is None, name


REWRITE_LOOP = """
import json, xstack
results = []
for step in range(40):
    with xstack.span("work"):
        results.append({"step": step, "note": "x" * 2000})
        with open("results.json", MODE) as f:
            json.dump(results if MODE == "w" else results[-1], f)
            f.write("\\n")
    xstack.step()
"""


def test_a_file_rewritten_whole_at_every_step_is_found(tmp_path: Path) -> None:
    """A list of results dumped whole to one JSON file at each of 40 steps: 1.6 MiB written for an 80 KiB file,
    and an open, truncation and close each time (a preprocessing job rewriting its index for each of its 300
    images spent 46 ms of its 75 ms of I/O on it). Appended to, one record a step, it is not a finding."""
    (tmp_path / "w").mkdir()
    results = _run_io_loop(tmp_path / "w", REWRITE_LOOP.replace("MODE", repr("w")))
    facts = results["io.files"].facts
    path = str(tmp_path / "w" / "results.json")
    assert (facts["rewrite_path"], facts["rewrite_opens"]) == (path, 40)
    size = facts["rewrite_size"]
    assert size == (tmp_path / "w" / "results.json").stat().st_size
    assert facts["rewrite_bytes"] + size == sum(len(json.dumps([{"step": k, "note": "x" * 2000} for k in range(n)]))
                                                + 1 for n in range(1, 41))  # fmt: skip
    assert facts["rewrite_times"] > 15 and facts["rewrite_ns"] > 0
    rec = RULES["rewritten"](results)
    assert (
        rec is not None and rec.evidence[0].startswith(f"{path} was written ") and "opened 40 times" in rec.evidence[0]
    )
    assert rec.action.startswith("results.json grows and is rewritten whole at each addition") and (
        rec.impact_per == "iteration"
    )
    (tmp_path / "a").mkdir()
    appended = _run_io_loop(tmp_path / "a", REWRITE_LOOP.replace("MODE", repr("a")))
    assert appended["io.files"].facts["rewrite_path"] is None and RULES["rewritten"](appended) is None
    # a checkpoint saved over itself at every step: torch.save opens with fopen (STDIO) and writes with write
    # (POSIX), two rows of io_files, counted together
    (tmp_path / "c").mkdir()
    saved = _run_io_loop(tmp_path / "c", "import torch, xstack\nw = torch.ones(80_000)\nfor step in range(20):\n"
                         "    torch.save(w, 'ckpt.pt')\n    xstack.step()\n")  # fmt: skip
    facts = saved["io.files"].facts
    assert (facts["rewrite_path"], facts["rewrite_opens"]) == (str(tmp_path / "c" / "ckpt.pt"), 20)
    rec = RULES["rewritten"](saved)
    assert rec is not None and rec.action.startswith("ckpt.pt is saved over itself again and again (20 saves)")
    assert facts["rewrite_write_opens"] == 20
    # loaded as often as it is saved: 40 opens, still 20 saves of its size, a snapshot (its opens alone said "grows")
    (tmp_path / "l").mkdir()
    loaded = _run_io_loop(tmp_path / "l", "import torch, xstack\nw = torch.ones(80_000)\nfor step in range(20):\n"
                          "    torch.save(w, 'ckpt.pt')\n    torch.load('ckpt.pt')\n    xstack.step()\n")  # fmt: skip
    assert (loaded["io.files"].facts["rewrite_opens"], loaded["io.files"].facts["rewrite_write_opens"]) == (40, 20)
    rec = RULES["rewritten"](loaded)
    assert rec is not None and rec.action.startswith("ckpt.pt is saved over itself again and again (20 saves)")
    # numpy.save opens the file, then writes it through fdopen of a dup of its descriptor: three opens to Darshan's
    # counters, one save (counted as two, it read "state.npy grows and is rewritten whole at each addition")
    (tmp_path / "n").mkdir()
    numpy_saved = _run_io_loop(tmp_path / "n", "import numpy, xstack\nw = numpy.ones(80_000)\nfor step in range(20):\n"
                               "    numpy.save('state.npy', w)\n    xstack.step()\n")  # fmt: skip
    facts = numpy_saved["io.files"].facts
    assert (facts["rewrite_opens"], facts["rewrite_write_opens"]) == (20, 20), facts
    rec = RULES["rewritten"](numpy_saved)
    assert rec is not None and rec.action.startswith("state.npy is saved over itself again and again (20 saves)")
    assert "opened 20 times" in rec.evidence[0], rec.evidence


UNSTAGED_SAVE = """
import torch, xstack
model = torch.nn.Linear(256, 256)
w = torch.ones(WORDS)
for step in range(12):
    model(torch.randn(64, 256)).sum().backward()
    torch.save(w, f"ckpt{step % 2}.pt", _use_new_zipfile_serialization=ZIP)  # in no forward, backward or span
    xstack.step()
"""


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_file_io_between_the_stages_is_named_by_the_loop_s_own_work_rule(tmp_path: Path, zip_format: bool) -> None:
    """A checkpoint saved at every step between the model's stages: the loop's time in no stage was told to be
    found with spans or the op level, while the io level had seen it: 15 of the 21 ms per iteration writing the
    checkpoint. Facts ``main_io_unstaged_*``; the rule's evidence names the saves and their size, and its advice,
    led by them, is to save less often or off the step's path. ``torch.save``'s zip format computes a CRC of the
    data between its file calls (20 ms per iteration from each open to its close, where a loaded machine had the
    calls under half of the time in no stage): the evidence gives that time too, and the advice is led by the saves
    all the same; the legacy format writes the tensor as it goes, little between its calls but on a busy
    machine."""
    results = _run_io_loop(tmp_path, UNSTAGED_SAVE.replace("WORDS", "4_000_000").replace("ZIP", str(zip_format)))
    facts = results["io.input_bound"].facts
    assert facts["main_io_unstaged_path"] in (str(tmp_path / "ckpt0.pt"), str(tmp_path / "ckpt1.pt"))
    assert facts["main_io_unstaged_kind"] == "write" and facts["main_io_unstaged_ns"] > 0
    iterations = facts["iterations"]  # each saves: none of them is occasional
    assert facts["main_io_unstaged_checkpoints"] == iterations and facts["main_io_unstaged_iterations"] > 1
    assert 16_000_000 <= facts["main_io_unstaged_checkpoint_bytes"] / iterations < 16_100_000  # the tensor, pickled
    calls, saves = facts["main_io_unstaged_checkpoint_ns"], facts["main_io_unstaged_checkpoint_save_ns"]
    assert calls == pytest.approx(facts["main_io_unstaged_total_ns"], rel=0.01)
    assert calls < saves <= results["model.stages"].facts["unstaged_ns"]  # the calls lie within the saves
    assert saves > 1.1 * calls or not zip_format, (saves, calls)  # the CRC between the calls
    rec = RULES["work_outside_stages"](results)
    assert rec is not None and rec.sources == ["model.stages", "io.input_bound"]
    name = facts["main_io_unstaged_path"].rsplit("/", 1)[-1]
    said = f" of it per iteration; 100% of it in {iterations} checkpoint saves, 15.3 MiB each on average, {name} among"
    took = f", which took {format_ns(saves / iterations)} per iteration from each file's open to its close, serialising"
    took += " included"
    assert rec.evidence[1].startswith("the main process's file I/O took ") and rec.evidence[1].endswith(
        f"{said} them{took if saves >= 1.1 * calls else ''} (io.input_bound)"  # legacy: only on a busy machine
    ), rec.evidence[1]
    assert rec.action.startswith("Saving checkpoints between the stages puts their writing on the step's path: save "
                                 "less often, or off the loop's critical path"), rec.action  # fmt: skip
    assert "For the rest of that time: find what the loop does between its stages" in rec.action


def test_a_checkpoint_saved_by_numpy_counts_one_save_not_two(tmp_path: Path) -> None:
    """``numpy.save`` opens its file for writing, then writes through ``fdopen`` of a dup of the descriptor: two
    opens for writing, one save (it read "24 checkpoint saves" for 12)."""
    program = UNSTAGED_SAVE.replace("WORDS", "400_000").replace(
        'torch.save(w, f"ckpt{step % 2}.pt", _use_new_zipfile_serialization=ZIP)',
        'numpy.save(f"ckpt{step % 2}.npy", w.numpy())',
    )
    results = _run_io_loop(tmp_path, program.replace("import torch, xstack", "import numpy, torch, xstack"))
    facts = results["io.input_bound"].facts
    assert facts["main_io_unstaged_path"] in (str(tmp_path / "ckpt0.npy"), str(tmp_path / "ckpt1.npy"))
    assert facts["main_io_unstaged_checkpoints"] == facts["iterations"], facts


UNSTAGED_DUMP = """
import torch, xstack
model = torch.nn.Linear(256, 256)
w = torch.ones(16_000_000)  # 64 MB a write: other I/O between the stages, slowed by a loaded machine, stays under 10%
for step in range(12):
    model(torch.randn(64, 256)).sum().backward()
    if step % 4 == 3:
        w.numpy().tofile(f"emb{step}.bin")  # every 4th step, between the stages
    xstack.step()
"""


def test_file_io_between_the_stages_in_some_iterations_only_is_said_to_be_occasional(tmp_path: Path) -> None:
    """Files that are no checkpoints written every 4th step between the stages: the evidence says in how many of
    the measured iterations most of that I/O ran, and the advice, which already runs every N steps, is to do it
    less often or from a background thread."""
    results = _run_io_loop(tmp_path, UNSTAGED_DUMP)
    facts = results["io.input_bound"].facts
    # steps 3, 7 and 11 write: 90% of the time in those three, or in two where one write was quick
    held = facts["main_io_unstaged_iterations"]
    assert 1 <= held <= 3 and facts["iterations"] == 11, facts
    assert facts["main_io_unstaged_checkpoints"] == 0 and facts["main_io_unstaged_files"] == 3
    rec = RULES["work_outside_stages"](results)
    assert rec is not None
    path = facts["main_io_unstaged_path"]
    said = f" of it per iteration, 90% of it in {held} of the 11 measured iterations, most of it writing 3 files "
    assert rec.evidence[1].endswith(f"{said}({path} the longest) (io.input_bound)"), rec.evidence[1]
    assert rec.action.startswith(
        "Writing 3 files between the stages puts file I/O on the step's path: do it less often, or from a background "
        "thread. For the rest of that time: "
    ), rec.action


INFERENCE_WRITES = """
import torch
model = torch.nn.Linear(256, 256).eval()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(256, 256)), batch_size=16)
with torch.no_grad():
    for k, (x,) in enumerate(loader):
        out = model(x).numpy()
        for i, row in enumerate(out):  # an output file per item, between the forwards: no stage, no step
            with open(f"out{k}_{i}.bin", "wb") as f:
                f.write(row.tobytes())
        with open(f"sink{k}.txt", "w") as f:  # a few more writes, so the outputs are most but not all of it
            f.write("x")
"""


def test_file_io_between_the_stages_of_a_run_without_steps_is_named(tmp_path: Path) -> None:
    """An inference loop (no optimizer step, so no iterations) that writes a file per output between its forward
    passes: the loop's own work was told to be found with spans, though the io level saw the main process write
    1,600 PNG files there, 98 ms of the 381 ms in no stage. Its I/O from the first stage to the last counts now
    (fact ``main_io_unstaged_total_ns``), and the advice is to write fewer, larger files (a .npy per batch took
    that loop from 2.6 s to 1.3 s) or from a background thread."""
    results = _run_io_loop(tmp_path, INFERENCE_WRITES)
    facts = results["io.input_bound"].facts
    assert facts["iteration_kind"] == "dataloader waits" and facts["main_io_unstaged_iterations"] is None
    assert facts["main_io_unstaged_files"] >= 256 + 16 and facts["main_io_unstaged_kind"] == "write"
    assert facts["main_io_unstaged_total_ns"] > 0 and facts["main_io_unstaged_checkpoints"] == 0
    stages = results["model.stages"].facts
    assert stages["unstaged_of"] == "stages"
    rec = RULES["work_outside_stages"](results)
    if rec is None:  # the writes were under 20% of the loop on this machine, or under 1 ms: nothing to say
        assert stages["unstaged_pct"] < 20.0 or stages["unstaged_ns"] < 1_000_000, stages
        return
    line = next(e for e in rec.evidence if e.endswith("(io.input_bound)"))
    files = facts["main_io_unstaged_files"]
    assert f" of it, most of it writing {files:,} files (" in line, line  # of the run's time: no "per iteration"
    advice = (f"Writing {files:,} files between the stages puts file I/O on the loop's path: write them into fewer, "
              "larger files (a .npy or .npz per batch, a tar shard), or from a background thread")  # fmt: skip
    assert advice in rec.action, rec.action
    assert rec.title == "The loop spends much of its time outside every model stage"


def test_file_io_between_the_forwards_of_a_loop_without_steps_or_dataloader_is_named(tmp_path: Path) -> None:
    """The same loop over slices of one tensor, without a DataLoader: no step spans and no waits, so io.input_bound
    gave the I/O totals only, and the rule on time in no stage said to find the loop's work with spans, beside a
    rule on the 6,400 small files it wrote (392 ms of the 488 ms in no stage of an inference loop that saved a .npy
    per output). The main process's file I/O between its first stage and its last counts there too now."""
    source = INFERENCE_WRITES.replace(
        "loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(256, 256)), batch_size=16)",
        "loader = [(x,) for x in torch.randn(256, 256).split(16)]",
    )
    results = _run_io_loop(tmp_path, source)
    io = results["io.input_bound"]
    facts = io.facts
    assert facts["lacking"] == "model" and io.labels == [_io_loop.NO_ITERATIONS]
    # from the first forward's start to the last one's end: the last slice's 17 files come after it
    assert facts["main_io_unstaged_files"] == 15 * 17 and facts["main_io_unstaged_kind"] == "write"
    assert facts["main_io_unstaged_total_ns"] > 0 and facts["main_io_unstaged_ns"] is None
    assert results["model.stages"].facts["unstaged_of"] == "stages"
    rec = RULES["work_outside_stages"](results)
    if rec is None:  # the writes were under 20% of the loop on this machine, or under 1 ms: nothing to say
        return
    assert any(e.endswith("(io.input_bound)") for e in rec.evidence), rec.evidence
    assert "between the stages puts file I/O on the loop's path: write them into fewer" in rec.action, rec.action


SLOW_START_LOOP = """
import time
import torch
def slow_start(worker_id):  # a worker's start-up: imports, opening files, a spawned or forkserver worker's torch
    time.sleep(0.6)
model = torch.nn.Linear(64, 64)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(320, 64)), batch_size=16,
                                     num_workers=2, worker_init_fn=slow_start)
for (x,) in loader:  # no optimizer, no xstack.step(): its iterations run from one wait for a batch to the next
    model(x)
    time.sleep(0.03)
"""


def test_a_loop_without_steps_leaves_its_workers_start_up_out_of_its_waits_as_warm_up(tmp_path: Path) -> None:
    """A loop without steps over DataLoader workers started through a forkserver: their start-up, 866 ms in the
    loop's first wait for a batch, made 98% of its 22 iterations' time waiting for data, 42.4 ms per iteration at
    stake, against about 1.4 ms past it. The stretches until the first batch came are now its warm-up, as a loop of
    steps' first step is."""
    io = _run_io_loop(tmp_path, SLOW_START_LOOP)["io.input_bound"]
    facts = io.facts
    assert facts["iteration_kind"] == "dataloader waits" and facts["warmup_iterations"] == 2, facts
    assert io.column("warm-up")[:3] == ["yes", "yes", ""], io.column("warm-up")
    assert io.labels[0] == (
        "no step spans: iterations run from one DataLoader wait to the next; the first 2 "
        "iterations, until its first batch came (the workers' start-up), left out as warm-up"
    )
    # 20 batches and the wait that ends the loop, the start-up's 600 ms out: a batch's wait is well under a millisecond
    # on a quiet machine (the loop waits 1 to 5% of its time; 12 to 18% beside two busy programs on 2 CPUs), and
    # over half of the loop's time with the start-up in
    assert facts["iterations"] == 20 and facts["mean_wait_ns"] < 100_000_000, facts
    assert facts["wait_share_pct"] < 40, facts


PNG_OUTPUTS = """
import torch
from PIL import Image
model = torch.nn.Conv2d(3, 3, 3, padding=1).eval()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.rand(64, 3, 96, 96)), batch_size=16)
with torch.no_grad():
    for k, (x,) in enumerate(loader):
        out = (model(x).clamp(0, 1) * 255).byte().permute(0, 2, 3, 1).numpy()
        for i, image in enumerate(out):  # a PNG per output, between the forwards: encoded between open and close
            Image.fromarray(image).save(f"out{k}_{i}.png")
"""


def test_outputs_encoded_between_their_open_and_close_count_their_whole_time(tmp_path: Path) -> None:
    """An inference loop that saves each output as a PNG: PIL opens the file, encodes the image (zlib) and writes
    it as it goes, so that its file calls took 3.5 ms of the 305 ms in no stage, under the 10% from which the
    rule names file I/O, and the time went unnamed, though 284 ms of it passed with an output file open. The files'
    time from open to close counts now (fact ``main_io_unstaged_written_open_ns``), and the advice leads with
    them. The first save's lazy import of PIL's PNG plugin (its .pyc written) is no output of the loop's."""
    results = _run_io_loop(tmp_path, PNG_OUTPUTS)
    facts = results["io.input_bound"].facts
    assert facts["main_io_unstaged_kind"] == "write" and facts["main_io_unstaged_files"] >= 64
    assert facts["main_io_unstaged_path"].endswith(".png"), facts["main_io_unstaged_path"]
    calls, held = facts["main_io_unstaged_total_ns"], facts["main_io_unstaged_written_open_ns"]
    unstaged = results["model.stages"].facts["unstaged_ns"]
    assert 2 * calls < held <= unstaged, (calls, held, unstaged)
    rec = RULES["work_outside_stages"](results)
    assert rec is not None
    line = next(e for e in rec.evidence if e.endswith("(io.input_bound)"))
    assert line.endswith(f", which took {format_ns(held)} from each file's open to its close, what the program did "
                         "between its calls included (io.input_bound)"), line  # fmt: skip
    if held >= 0.5 * unstaged:  # the encoding, most of the time in no stage: the advice starts with it
        assert rec.action.startswith(f"Writing {facts['main_io_unstaged_files']} files between the stages"), rec.action


DECODED_IN_THE_LOOP = """
import numpy as np, torch, xstack
from PIL import Image
torch.set_num_threads(1)  # one thread: on a busy machine several wait for each other and swell the stages
model = torch.nn.Conv2d(3, 4, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(16):  # enough steps that a preemption in one is no swing
    batch = []
    for i in range(8):  # the loop decodes its batch itself, between the stages: between each file's reads
        with Image.open(f"imgs/{(8 * step + i) % 64}.png") as im:
            batch.append(torch.from_numpy(np.asarray(im.convert("RGB"), dtype=np.float32)).permute(2, 0, 1))
    opt.zero_grad()
    model(torch.stack(batch)).mean().backward()
    opt.step()
    with open("log.txt", "a") as log:  # a line of log: a file written too, far less than those read
        log.write(f"{step}\\n")
"""


def test_images_the_loop_decodes_between_the_stages_count_their_whole_time(tmp_path: Path) -> None:
    """A loop that opens and decodes its batch's PNG files itself: their reads took 298 us of the 5.62 ms per
    iteration in no stage, under the 10% from which the rule names file I/O, while the files were open 2.24 ms,
    PIL decoding between the reads. That time counts now (fact ``main_io_unstaged_read_open_ns``), and the advice
    to read them in DataLoader workers comes with it."""
    from PIL import Image

    (tmp_path / "imgs").mkdir()
    for i in range(64):
        Image.frombytes("RGB", (96, 96), os.urandom(96 * 96 * 3)).save(tmp_path / "imgs" / f"{i}.png")
    results = _run_io_loop(tmp_path, DECODED_IN_THE_LOOP)
    facts = results["io.input_bound"].facts
    # the log, one file written at every step, takes longer than any one image: the file named is one read
    assert facts["main_io_unstaged_kind"] == "read" and facts["main_io_unstaged_path"].endswith(".png"), facts
    calls, held = facts["main_io_unstaged_total_ns"], facts["main_io_unstaged_read_open_ns"]
    assert 0 < facts["main_io_unstaged_written_open_ns"] < held and 2 * calls < held, facts
    assert held <= results["model.stages"].facts["unstaged_ns"]
    rec = RULES["work_outside_stages"](results)
    assert rec is not None
    line = next(e for e in rec.evidence if e.endswith("(io.input_bound)"))
    each = format_ns(held / facts["iterations"])
    assert line.endswith(f", which took {each} per iteration from each file's open to its close, what the program "
                         "did between its calls included (io.input_bound)"), line  # fmt: skip
    advice = "between the stages puts file I/O on the step's path: read them once, before the loop, or in DataLoader"
    assert f"Reading {facts['main_io_unstaged_files']} files {advice} workers." in rec.action, rec.action


HELD_ACROSS_STAGES = """
import time, torch, xstack
model = torch.nn.Linear(512, 512)
x = torch.randn(256, 512)
for step in range(8):
    with open(f"log{step % 2}.txt", "w") as f:  # open across the step's stages
        f.write("start\\n")
        model(x).sum().backward()
        f.write("end\\n")
    time.sleep(0.003)  # in no stage, no file open
    xstack.step()
"""


def test_a_file_held_open_across_the_stages_counts_only_outside_them(tmp_path: Path) -> None:
    """A file opened before the forward and closed after the backward of each step: its time from open to close
    outside every stage is the little between its calls and the stages, not the stages it holds: exactly its
    time from open to close less theirs."""
    results = _run_io_loop(tmp_path, HELD_ACROSS_STAGES)
    facts = results["io.input_bound"].facts
    stages = results["model.stages"].facts
    held = facts["main_io_unstaged_written_open_ns"]
    assert held is not None and 0 < held < stages["unstaged_ns"] - 3_000_000 * facts["iterations"], (held, stages)
    with Store.open(tmp_path / "p.duckdb") as store:  # each measured step's open to its close, less its two stages
        path = f"attrs->>'$.\"{A.IO_PATH}\"'"
        spans = store.query(
            f"SELECT parent_id, name, start_ns, start_ns + dur_ns FROM spans WHERE level = 'io' AND {path} LIKE "
            "'%/log_.txt' AND name IN ('open', 'openat', 'close') AND parent_id IN (SELECT span_id FROM spans "
            "WHERE level = 'model' AND name LIKE 'step#%' AND name <> 'step#0')"
        )
        stages = store.query("SELECT start_ns, start_ns + dur_ns FROM spans WHERE level = 'model' AND name IN "
                             "('Linear', 'backward')")  # fmt: skip
    opens = {p: s for p, name, s, _ in spans if name != "close"}
    closes = {p: e for p, name, _, e in spans if name == "close"}
    assert len(opens) == len(closes) == facts["iterations"] == 7
    windows = [(opens[p], closes[p]) for p in opens]
    inside = sum(e - s for s, e in stages if any(ws <= s and e <= we for ws, we in windows))
    assert held == sum(e - s for s, e in windows) - inside


def test_input_bound_says_inference_where_the_stages_hold_no_backward_or_optimizer() -> None:
    facts = {"input_bound": True, "wait_share_pct": 30.0, "iterations": 4, "mean_wait_ns": 1_000_000,
             "threshold_pct": 10.0}  # fmt: skip
    loop = Result("io.input_bound", "Input-bound", facts=facts)
    for kinds, title in ((["forward", "dataloader"], "Inference"), (["forward", "backward", "dataloader"], "Training"),
                         (["step", "dataloader"], "Training")):  # fmt: skip
        stages = Result("model.stages", "Model stages", rows=[("s", kind, 1) for kind in kinds])
        rec = RULES["input_bound"]({"io.input_bound": loop, "model.stages": stages})
        assert rec is not None and rec.title == f"{title} is input-bound: the model waits for data", kinds


SQLITE_LOOP = """
import sqlite3, sys, xstack
db = sqlite3.connect(sys.argv[1], uri=True)
for step in range(4):
    with xstack.span("load"):
        for i in range(50 * step, 50 * (step + 1)):
            db.execute("SELECT x FROM items WHERE id = ?", (i,)).fetchone()
    xstack.step()
"""


def test_sqlite_s_change_counter_reads_get_sqlite_s_advice(tmp_path: Path) -> None:
    """A dataset that queries SQLite once per item: SQLite reads the database's 16-byte change counter at the start
    of each query, half the reads. They were told to use buffered streams, which SQLite's reads cannot; a database
    opened as immutable makes no such reads (a DataLoader over one: 19,421 reads, 9,920 of them these)."""
    import sqlite3

    con = sqlite3.connect(tmp_path / "items.db")
    con.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, x BLOB)")
    con.executemany("INSERT INTO items VALUES (?, ?)", [(i, bytes(500)) for i in range(400)])
    con.commit()
    con.close()
    db = str(tmp_path / "items.db")
    results = _run_io_loop(tmp_path, SQLITE_LOOP.replace("sys.argv[1]", repr(db)))
    facts = results["io.pattern"].facts
    assert facts["sqlite_path"] == db and facts["sqlite_change_reads"] >= 200  # one per query at least
    rec = RULES["small_reads"](results)
    assert (
        rec is not None
        and f"are SQLite reading the change counter of {db} (16 bytes at offset 24)" in (rec.evidence[0])
    )
    assert rec.action.startswith(f"Open {db} as immutable where nothing writes it while the program reads it "
                                 f"(sqlite3.connect('file:{db}?immutable=1', uri=True))")  # fmt: skip
    (tmp_path / "immutable").mkdir()
    immutable = _run_io_loop(tmp_path / "immutable", SQLITE_LOOP.replace("sys.argv[1]", repr(f"file:{db}?immutable=1")))
    assert immutable["io.pattern"].facts["sqlite_change_reads"] == 0  # what the advice says it does


def test_a_merged_run_s_reads_are_sized_over_its_io_pass(tmp_path: Path) -> None:
    """A merged run's io spans are its one iteration's: 48 reads of a SQLite loader's 3,814, under the 100 the
    small-reads rule needs, so ``xstack profile --io`` never gave it. They are counted and sized over the io pass;
    their times stay the merged iteration's (the time at stake per iteration)."""
    with Store.create(tmp_path / "m.duckdb") as store:
        merge = {"passes": [], "counter_passes": [{"pass": "model+io", "run_id": 1}]}
        store.add_run(RunInfo(1, "db", levels=["model", "io"], config={"pid": MAIN}))
        store.add_run(
            RunInfo(2, "db", pass_name="merged", levels=["model", "io"], config={"pid": MAIN, "merge": merge})
        )
        for run, reads in ((1, 150), (2, 2)):
            sink = Sink(store, run)
            sink.span(1, None, "model", "step", 0, 10**6, MAIN, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: 0})
            for i in range(reads):
                io_span(sink, 10 + 2 * i, None, "pread64", 100 * i, 10 * run, W1, "/d/items.db", 16, offset=24)
                io_span(sink, 11 + 2 * i, None, "pread64", 100 * i + 50, 10, W1, "/d/items.db", 4096, offset=4096 * i)
            sink.close()
        add_files(store, [data_file(W1, "/d/items.db", 300 * 4096, 300)], run_id=1)
        add_files(store, [data_file(W1, "/d/items.db", 300 * 4096, 300)], run_id=2)
    with Store.open(tmp_path / "m.duckdb") as store:
        merged = run_analyses(store, 2, ["io.pattern"])[0].facts
        rec = RULES["small_reads"]({r.id: r for r in run_analyses(store, 2)})
    assert (merged["sized_reads"], merged["small_reads"], merged["sqlite_change_reads"]) == (300, 150, 150)
    assert merged["read_ns"] == 2 * 20 + 2 * 10  # the merged iteration's own reads' time
    assert rec is not None and "150 of them are SQLite reading the change counter of /d/items.db" in rec.evidence[0]


def test_small_reads_rule(tmp_path: Path) -> None:
    small = data_file(5, "/d/a", 200 * 500, 200, size_read_hist={"100_1K": 200})
    with files_store(tmp_path / "a.duckdb", [small]) as store:
        rec = _fired(store, "small_reads")
    assert rec is not None and "estimated from Darshan's size buckets" in rec.evidence[0] and "buffering" in rec.action
    large = data_file(5, "/d/a", 200 * 2**20, 200, size_read_hist={"1M_4M": 200})
    with files_store(tmp_path / "b.duckdb", [large]) as store:
        assert _fired(store, "small_reads") is None


def test_input_bound_rule_quotes_the_io_analysis_and_suggests_staging(tmp_path: Path) -> None:
    with loop_store(tmp_path / "a.duckdb", config={"pid": MAIN, "cpu_count": 8}) as store:
        rec = _fired(store, "input_bound")
    assert rec is not None and rec.sources == ["model.stages", "io.input_bound"]
    line = next(e for e in rec.evidence if e.endswith("(io.input_bound)"))
    assert "the loop waits 30.0% of its time" in line and "2 worker processes" in line
    assert "300 ns per iteration on average over 3 iterations (median 300 ns)" in line
    assert "from 2 towards the 8 cores" in rec.action and "prefetch_factor" in rec.action
    assert rec.impact_ns == 300 and "Stage" not in rec.action
    with loop_store(tmp_path / "b.duckdb", config={"pid": MAIN, "cpu_count": 2}) as store:
        assert "already match the 2 cores" in (_fired(store, "input_bound") or rec).action
    with loop_store(tmp_path / "c.duckdb", waits=(50, 50, 50)) as store:
        assert _fired(store, "input_bound") is None  # 5% of each step
    with loop_store(tmp_path / "d.duckdb", more_files=_small_files_rows()) as store:
        rec = _fired(store, "input_bound")
    assert rec is not None and "io.small_files" in rec.sources and "Stage the files" in rec.action
    assert any(e.endswith("(io.small_files)") for e in rec.evidence)


def test_input_bound_folds_in_the_small_files_staging_only_where_the_step_feels_it() -> None:
    """Spawned workers restarted at each epoch made a loop wait 82% of its step, while its small files' I/O was
    0.7% of it: the input-bound advice still ended with staging them. Now the staging is folded in only where
    the small files' time at stake is not a sliver of the step; otherwise it stays a finding of its own, low."""
    stages = Result("model.stages", "Model stages", facts={"dataloader_pct_of_steps": 30.0, "steps": 10,
                    "dataloader_in_steps_ns": 30_000_000, "step_total_ns": 100_000_000})  # fmt: skip
    loop = Result("io.input_bound", "Input-bound", facts={"input_bound": True, "wait_share_pct": 30.0,
                  "iterations": 10, "mean_wait_ns": 3_000_000, "threshold_pct": 10.0})  # fmt: skip
    small = {"small_ops_pct": 100.0, "small_files": 500, "files": 500, "small_bytes_pct": 100.0, "small_ops": 1500,
             "threshold_bytes": 2 * 2**20, "small_size_mean_bytes": 1000}  # fmt: skip
    for small_ns, folded in ((500_000, False), (50_000_000, True)):  # 50 us, 5 ms per iteration of 10 ms
        files = Result("io.small_files", "Small files", facts=small | {"small_time_ns": small_ns})
        results = {"model.stages": stages, "io.input_bound": loop, "io.small_files": files}
        rec, staging = RULES["input_bound"](results), RULES["small_files"](results)
        assert rec is not None and staging is not None
        assert ("io.small_files" in rec.sources) is folded and ("Stage the files" in rec.action) is folded
        assert (staging.severity == "low") is not folded
        assert any("barely shorten the step" in e for e in staging.evidence) is not folded


def test_a_rule_that_input_bound_took_in_whole_is_not_said_again(tmp_path: Path) -> None:
    with loop_store(tmp_path / "a.duckdb", more_files=_small_files_rows()) as store:
        fired = {rec.rule: rec for rec in recommend(run_analyses(store))}
    # the small-file staging is one of the input-bound rule's facts and actions: one recommendation says it
    assert "input_bound" in fired and "small_files" not in fired
    assert "io.small_files" in fired["input_bound"].sources
    with files_store(tmp_path / "b.duckdb", _small_files_rows()) as store:
        assert "small_files" in {rec.rule for rec in recommend(run_analyses(store))}  # no wait: on its own


def test_input_bound_shows_the_dataloader_and_advises_only_what_it_lacks(tmp_path: Path) -> None:
    loader = {"index": 0, "dataset": "ImageFolder", "batch_size": 32, "num_workers": 4, "persistent_workers": False,
              "pin_memory": False, "prefetch_factor": 2, "iterated": 3, "cuda": True}  # fmt: skip
    config = {"pid": MAIN, A.CONFIG_CPU_COUNT: 16, A.CONFIG_DATALOADERS: [loader]}
    with loop_store(tmp_path / "a.duckdb", config=config) as store:
        r = _one(store, "io.input_bound")
        rec = _fired(store, "input_bound")
    shown = "DataLoader(ImageFolder, batch_size=32, num_workers=4, persistent_workers=False, pin_memory=False, "
    shown += "prefetch_factor=2)"
    # the built store's waits name no DataLoader: none counted for it
    assert r.labels == [shown, "16 usable CPUs"] and r.facts["cores"] == 16
    none = {"waits": 0, "wait_ns": 0, "warmup_waits": 0, "warmup_wait_ns": 0, "after_last_step_waits": 0,
            "after_last_step_wait_ns": 0, "first_waits": 0, "first_wait_ns": 0, "last_waits": 0,
            "last_wait_ns": 0}  # fmt: skip
    assert r.facts["dataloaders"] == [loader | none]
    assert rec is not None and f"the loop waits on {shown}; 16 usable CPUs (io.input_bound)" in rec.evidence
    assert rec.action == (
        f"{shown}: raise num_workers from 4 towards the 16 usable CPUs; set persistent_workers=True (workers kept "
        "across its 3 epochs, not restarted); raise prefetch_factor from 2 (batches each worker loads ahead); set "
        "pin_memory=True (faster copies to the GPU)."
    )
    once = loader | {"iterated": 1}  # one epoch: no workers are restarted, persistent ones would change nothing
    with loop_store(tmp_path / "c.duckdb", config=config | {A.CONFIG_DATALOADERS: [once]}) as store:
        rec = _fired(store, "input_bound")
    assert rec is not None and "persistent_workers=True" not in rec.action and "raise prefetch_factor" in rec.action
    full = loader | {"num_workers": 16}  # workers that fill the CPUs: loading further ahead is no faster
    with loop_store(tmp_path / "d.duckdb", config=config | {A.CONFIG_DATALOADERS: [full]}) as store:
        rec = _fired(store, "input_bound")
    assert rec is not None and "prefetch_factor from" not in rec.action and "persistent_workers=True" in rec.action
    done = loader | {"num_workers": 16, "persistent_workers": True, "pin_memory": True, "prefetch_factor": 4}
    with loop_store(tmp_path / "b.duckdb", config=config | {A.CONFIG_DATALOADERS: [done]}) as store:
        rec = _fired(store, "input_bound")
    assert rec is not None and rec.action.endswith("): its 16 workers already match the 16 usable CPUs: make each "
                                                   "batch cheaper to load (decode and augment less, or on the GPU; "
                                                   "read fewer, larger files).")  # fmt: skip
    more = done | {"num_workers": 64}  # more workers than CPUs (PyTorch warns of it): not said to match them
    with loop_store(tmp_path / "m.duckdb", config=config | {A.CONFIG_DATALOADERS: [more]}) as store:
        rec = _fired(store, "input_bound")
    assert rec is not None and "its 64 workers already outnumber the 16 usable CPUs: make each batch" in rec.action


def _reader_loop(path: Path, *, shards: bool, iterable: bool = False, batched: bool = False, reopen: bool = False
                 ) -> Store:  # fmt: skip
    """Three 1000 ns steps, each waiting 600 ns for a DataLoader of 2 workers that fill the 2 CPUs, whose workers
    read for 300 ns per step: ``shards``: 4 files a step, each opened and read once (then its descriptor dup'ed, as
    ``mmap.mmap`` does: no open of the file); else 6 reads a step of 2 KiB
    from one database kept open (opened once, before the first step), or with ``reopen`` opened again for each
    read. Calls before the steps (the open) are not the measured iterations'; a failed read is not counted."""
    loader = {"index": 0, "dataset": "Rows", "batch_size": 4, "num_workers": 2, "persistent_workers": True,
              "pin_memory": False, "prefetch_factor": 2, "iterated": 1, "cuda": False}  # fmt: skip
    loader |= {"iterable": iterable, "batched": batched}
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "loop", levels=["model", "io"],
                              config={"pid": MAIN, A.CONFIG_CPU_COUNT: 2, A.CONFIG_DATALOADERS: [loader]}))  # fmt: skip
        sink = Sink(store, 1)
        span = iter(range(100, 1000))
        if not shards:
            io_span(sink, next(span), None, "open", -500, 10, W1, "/d/rows.db")
        for k in range(3):
            sink.span(
                1 + k, None, "model", f"step#{k}", 1000 * k, 1000, MAIN, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: k}
            )
            sink.span(10 + k, 1 + k, "model", "dataloader.next", 1000 * k, 600, MAIN, 1, {A.MODEL_KIND: "dataloader"})
            for i in range(4 if shards else 6):
                at = 1000 * k + 50 * i
                if shards:
                    io_span(sink, next(span), None, "open", at, 25, W1, f"/d/shard{k}-{i}.bin")
                    io_span(sink, next(span), None, "read", at + 25, 50, W1, f"/d/shard{k}-{i}.bin", 65536, offset=0)
                    io_span(sink, next(span), None, "dup", at + 75, 1, W1, f"/d/shard{k}-{i}.bin")  # no open: mmap's
                    # nor a stream on a descriptor (numpy.load reads through fdopen of a dup)
                    io_span(sink, next(span), None, "fdopen", at + 76, 1, W1, f"/d/shard{k}-{i}.bin")
                else:
                    if reopen:
                        io_span(sink, next(span), None, "open", at, 1, W1 if i % 2 else W2, "/d/rows.db")
                    io_span(sink, next(span), None, "pread64", at, 50, W1 if i % 2 else W2, "/d/rows.db", 2048,
                            offset=4096 * (7 * k + i))  # fmt: skip
            io_span(sink, next(span), None, "read", 1000 * k + 400, 1, W2, "/d/rows.db", **{A.IO_ERRNO: 5})
        sink.close()
    return Store.open(path)


def test_workers_reading_one_file_kept_open_are_told_to_read_fewer_times_not_fewer_files(tmp_path: Path) -> None:
    """A DataLoader over a SQLite file, one query per item: 129 reads of 2 KiB per iteration from one file that
    each worker keeps open, 44% of the waits. "Read fewer, larger files" named the wrong thing; a batch fetched in
    one query through the dataset's __getitems__ took the workers' file I/O from 836 us to 102 us an iteration."""
    with _reader_loop(tmp_path / "db.duckdb", shards=False) as store:
        r = _one(store, "io.input_bound")
        rec = _fired(store, "input_bound")
    f = r.facts
    assert (f["worker_data_reads_per_iteration"], f["worker_data_opens_per_iteration"]) == (6.0, 0.0)
    assert (f["worker_data_read_bytes_per_iteration"], f["worker_data_files"]) == (6 * 2048, 1)
    assert f["worker_data_path"] == "/d/rows.db"
    assert rec is not None and rec.action.endswith(
        "make each batch cheaper to load (decode and augment less, or on the GPU; the workers read /d/rows.db, kept "
        "open, in 6 reads of 2.00 KiB on average per iteration: read a batch's items in fewer, larger reads (the "
        "records a batch takes stored together, fetched in one read or query by the dataset's __getitems__, which "
        "the DataLoader calls with a batch's indices), or keep the file in each worker's memory)."
    )
    with _reader_loop(tmp_path / "it.duckdb", shards=False, iterable=True) as store:
        rec = _fired(store, "input_bound")  # an IterableDataset has no __getitems__: its reads are its own
    assert rec is not None and "stored together, read in order in larger blocks), or keep" in rec.action
    with _reader_loop(tmp_path / "b.duckdb", shards=False, batched=True) as store:
        rec = _fired(store, "input_bound")  # its __getitems__ already has a batch's indices
    assert rec is not None and "fetched in one read or query by the dataset's __getitems__, which has a batch's " in (
        rec.action
    )
    with _reader_loop(tmp_path / "reopen.duckdb", shards=False, reopen=True) as store:
        rec = _fired(store, "input_bound")  # the same file opened for each item (h5py.File in __getitem__)
    assert rec is not None and rec.action.endswith(
        "the workers open /d/rows.db 6 times per iteration, for each item: open it once in each worker, on first use, "
        "and keep it open)."
    )
    with _reader_loop(tmp_path / "shards.duckdb", shards=True) as store:
        r = _one(store, "io.input_bound")
        rec = _fired(store, "input_bound")
    f = r.facts
    assert (f["worker_data_reads_per_iteration"], f["worker_data_opens_per_iteration"]) == (4.0, 4.0)
    assert (f["worker_data_files"], f["worker_data_read_bytes_per_iteration"]) == (12, 4 * 65536)
    assert rec is not None and rec.action.endswith(
        "(decode and augment less, or on the GPU; read fewer, larger files: the workers open data files 4 times per "
        "iteration)."
    )


def test_a_loop_loading_its_batches_itself_is_said_to_and_its_io_in_the_waits_is_per_iteration(tmp_path: Path) -> None:
    """num_workers=0: the evidence read "0 worker processes, 0 ns of their file I/O per iteration", and the main
    process's I/O in the waits was the run's total (56.2 ms) beside per-iteration figures (1.90 ms of waiting)."""
    loader = {"index": 0, "dataset": "D", "batch_size": 32, "num_workers": 0, "persistent_workers": False,
              "pin_memory": False, "prefetch_factor": None, "iterated": 1, "cuda": False}  # fmt: skip
    for name, loaders in (("a", [loader]), ("b", None)):
        config = {"pid": MAIN, A.CONFIG_CPU_COUNT: 2} | ({A.CONFIG_DATALOADERS: loaders} if loaders else {})
        with Store.create(tmp_path / f"{name}.duckdb") as store:
            store.add_run(RunInfo(1, "loop", levels=["model", "io"], config=config))
            sink = Sink(store, 1)
            for k in range(4):
                step = {A.MODEL_KIND: "step", A.MODEL_STEP: k}
                sink.span(1 + k, None, "model", f"step#{k}", 1000 * k, 1000, MAIN, 1, step)
                sink.span(
                    10 + k, 1 + k, "model", "dataloader.next", 1000 * k, 600, MAIN, 1, {A.MODEL_KIND: "dataloader"}
                )
                io_span(sink, 100 + k, 10 + k, "read", 1000 * k + 100, 300, MAIN, f"/d/{k}.npy", 4096, offset=0, tid=1)
            sink.close()
        with Store.open(tmp_path / f"{name}.duckdb") as store:
            rec = _fired(store, "input_bound")
        assert rec is not None
        line = next(e for e in rec.evidence if e.endswith("(io.input_bound)"))
        # without the DataLoader's settings (an imported trace), the io level saw no worker process, which is all
        # it can say: workers that read nothing from files make no io spans
        who = "no worker processes: the main process loads the batches itself" if loaders else (
            "no worker process did file I/O")  # fmt: skip
        assert line.endswith(f"over 4 iterations (median 600 ns); {who}; the main process spent 300 ns per iteration "
                             "(1.20 us in all) in file I/O while waiting (io.input_bound)"), line  # fmt: skip


def test_a_tensor_dataset_is_told_to_index_its_tensors_once_per_batch(tmp_path: Path) -> None:
    """A TensorDataset batched by the DataLoader is indexed item by item and collated again: 1.56 ms a batch of 256
    rows, against 154 us indexed once per batch through a BatchSampler (and 1.51 ms with 2 workers on 2 CPUs). It
    was only told to load in worker processes; with the BatchSampler its step went from 1.56 ms to 993 us."""
    loader = {"index": 0, "dataset": "TensorDataset", "batch_size": 256, "num_workers": 0, "persistent_workers": False,
              "pin_memory": False, "prefetch_factor": None, "iterated": 1, "cuda": False}  # fmt: skip
    rec = _loader_advice(tmp_path / "a.duckdb", loader, cpus=2)
    assert rec is not None and rec.action.startswith(
        "DataLoader(TensorDataset, batch_size=256, num_workers=0, persistent_workers=False, pin_memory=False, "
        "prefetch_factor=None): its TensorDataset is indexed item by item, 256 times a batch, and the items stacked "
        "again: index its tensors once per batch instead, DataLoader(dataset, sampler=BatchSampler(RandomSampler("
        "dataset), batch_size=256, drop_last=False), batch_size=None) (SequentialSampler without shuffling); load in "
        "worker processes"
    )
    # another dataset; batches a BatchSampler yields whole, as advised
    for k, other in enumerate(({"dataset": "Files"}, {"sampler_batches": True})):
        rec = _loader_advice(tmp_path / f"b{k}.duckdb", loader | other, cpus=2)
        assert rec is not None and "BatchSampler" not in rec.action


def _loader_advice(path: Path, loader: dict[str, Any], *, cpus: int, **loop: Any) -> Recommendation | None:
    """The input-bound rule on ``loop_store``'s loop (``loop``: its options) waiting on ``loader``, ``cpus`` usable."""
    config = {"pid": MAIN, A.CONFIG_CPU_COUNT: cpus, A.CONFIG_DATALOADERS: [loader]}
    with loop_store(path, config=config, **loop) as store:
        return _fired(store, "input_bound")


def _decoding_loop(path: Path, read_ns: int) -> Store:
    """Four 1 ms steps, each waiting 900 us for a DataLoader of 2 workers that fill the 2 CPUs and read 25 small
    images a step, each in an open, a read of ``read_ns`` and a close."""
    loader = {"index": 0, "dataset": "Images", "batch_size": 25, "num_workers": 2, "persistent_workers": True,
              "pin_memory": False, "prefetch_factor": 2, "iterated": 1, "cuda": False}  # fmt: skip
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "loop", levels=["model", "io"],
                              config={"pid": MAIN, A.CONFIG_CPU_COUNT: 2, A.CONFIG_DATALOADERS: [loader]}))  # fmt: skip
        sink = Sink(store, 1)
        for k in range(4):
            sink.span(1 + k, None, "model", f"step#{k}", 1_000_000 * k, 1_000_000, MAIN, MAIN,
                      {A.MODEL_KIND: "step", A.MODEL_STEP: k})  # fmt: skip
            sink.span(10 + k, 1 + k, "model", "dataloader.next", 1_000_000 * k, 900_000, MAIN, MAIN,
                      {A.MODEL_KIND: "dataloader"})  # fmt: skip
        for k in range(100):
            pid, name, t = W1 + k % 2, f"/d/{k}.jpg", 1_000_000 * (k // 25) + 30_000 * (k % 25)
            io_span(sink, 100 + 3 * k, None, "open", t, 500, pid, name)
            io_span(sink, 101 + 3 * k, None, "read", t + 500, read_ns, pid, name, 4096, offset=0)
            io_span(sink, 102 + 3 * k, None, "close", t + 500 + read_ns, 500, pid, name)
        sink.close()
        add_files(store, [data_file(W1 + k % 2, f"/d/{k}.jpg", 4096, 1, read_ns=read_ns) for k in range(100)])
    return Store.open(path)


def test_findings_on_reading_are_low_where_building_the_items_is_what_the_loop_waits_for(tmp_path: Path) -> None:
    """2,000 JPEG files decoded by PIL in 2 workers: the loop waited 2.75 ms an iteration, the workers' file I/O
    386 us of it. The input-bound advice said building the items was what it waited for, then took in the advice
    to stage the small files on a faster tier, as if reading them were."""
    with _decoding_loop(tmp_path / "decode.duckdb", 5_000) as store:  # 150 us of I/O a step: 17% of the wait
        bound, staging = _fired(store, "input_bound"), _fired(store, "small_files")
        said = [rec.rule for rec in analyze(store).recommendations]
    assert said == ["input_bound", "small_files"]
    assert bound is not None and "is not what the loop waits for, building the items is" in bound.action
    assert "Stage the files" not in bound.action and "io.small_files" not in bound.sources
    assert staging is not None and staging.severity == "low" and staging.action.startswith("Stage the files")
    assert staging.evidence[-1] == (
        "but the loop's file I/O while it waits for its data (its workers', and its own in the waits) is 150 us per "
        "iteration, 17% of its 900 us of waiting: building the items, not reading them, is what it waits for, and "
        "cheaper reads would shorten its steps by that share of the wait at most (io.input_bound)"
    )
    with _decoding_loop(tmp_path / "read.duckdb", 20_000) as store:  # 525 us of I/O a step: 58% of the wait
        bound = _fired(store, "input_bound")
        said = [rec.rule for rec in analyze(store).recommendations]
    assert bound is not None and "Stage the files of at most 2 MiB" in bound.action
    assert said == ["input_bound"]  # the staging finding taken in whole


def test_a_loop_waiting_on_workers_that_read_little_is_not_told_to_read_fewer_files(tmp_path: Path) -> None:
    loader = {"index": 0, "dataset": "Rand", "batch_size": 32, "num_workers": 16, "persistent_workers": True,
              "pin_memory": True, "prefetch_factor": 4, "iterated": 1, "cuda": True}  # fmt: skip
    config = {"pid": MAIN, A.CONFIG_CPU_COUNT: 16, A.CONFIG_DATALOADERS: [loader]}
    # the workers' reads, 200 ns per iteration, against waits of 990 ns: under a quarter of them
    rec = _loader_advice(tmp_path / "a.duckdb", loader, cpus=16, waits=(990, 990, 990))
    assert rec is not None and rec.action.endswith(
        "its 16 workers already match the 16 usable CPUs: make each batch cheaper to build: the workers' file I/O "
        "(200 ns per iteration, against 990 ns of waiting) is not what the loop waits for, building the items is "
        "(the dataset's __getitem__, its transforms, the collation): decode and augment less, or on the GPU, or cache "
        "prepared items."
    )
    assert any("; 2 worker processes, 200 ns of their file I/O per iteration;" in e for e in rec.evidence)
    # an IterableDataset builds its items in __iter__
    streamed = config | {A.CONFIG_DATALOADERS: [loader | {"iterable": True}]}
    with loop_store(tmp_path / "c.duckdb", config=streamed, waits=(990, 990, 990)) as store:
        rec = _fired(store, "input_bound")
    assert rec is not None and "building the items is (the dataset's __iter__, its transforms" in rec.action
    # whose items the DataLoader collates 32 at a time: a Parquet reader's step went from 2.41 ms to 1.14 ms
    # yielding each row group's rows in slices, batch_size=None
    assert rec.action.endswith(
        "(the dataset's __iter__, its transforms, the collation): decode and augment less, or on the GPU, or cache "
        "prepared items; and yield whole batches from __iter__, slices of what it reads at once (a row group, a "
        "shard's arrays), with DataLoader(batch_size=None), rather than items one by one for the DataLoader to "
        "collate 32 at a time."
    ), rec.action
    # yielding batches already: no collation, nothing more to say
    streamed = config | {A.CONFIG_DATALOADERS: [loader | {"iterable": True, "batch_size": None}]}
    with loop_store(tmp_path / "c1.duckdb", config=streamed, waits=(990, 990, 990)) as store:
        rec = _fired(store, "input_bound")
    assert rec is not None and rec.action.endswith(
        "building the items is (the dataset's __iter__, its transforms): decode and augment less, or on the GPU, "
        "or cache prepared items."
    ), rec.action
    # a dataset with __getitems__ (Hugging Face datasets' has one) builds a batch's items there
    batched = config | {A.CONFIG_DATALOADERS: [loader | {"batched": True}]}
    with loop_store(tmp_path / "d.duckdb", config=batched, waits=(990, 990, 990)) as store:
        rec = _fired(store, "input_bound")
    assert rec is not None and "building the items is (the dataset's __getitems__, its transforms" in rec.action
    # workers reading an array mapped into memory: their reads are page faults, in none of the file I/O
    mapped = [(200, None, "mmap", -900, 5, W1, "/d/x.npy", {A.IO_REQUESTED_BYTES: 245_760_128}),
              (201, None, "mmap", -800, 5, W2, "/d/x.npy", {A.IO_REQUESTED_BYTES: 245_760_128}),
              (202, None, "mmap", -800, 5, W2, "/d/y.npy", {A.IO_REQUESTED_BYTES: 160_128}),
              (203, None, "mmap", -700, 5, W2, "/d/z.npy", {A.IO_REQUESTED_BYTES: 4096, A.IO_ERRNO: 12}),
              (204, None, "mmap", -700, 5, MAIN, "/d/w.npy", {A.IO_REQUESTED_BYTES: 999_999_999})]  # fmt: skip
    for name, maps, files, batched_ in (("m", mapped, 2, False), ("m1", mapped[:1], 1, True)):
        loaders = [loader | {"batched": batched_}]
        with loop_store(tmp_path / f"{name}.duckdb", config=config | {A.CONFIG_DATALOADERS: loaders},
                        waits=(990, 990, 990), more_io=maps) as store:  # fmt: skip
            r = _one(store, "io.input_bound")
            rec = _fired(store, "input_bound")
        assert (r.facts["worker_mapped_files"], r.facts["worker_mapped_path"]) == (files, "/d/x.npy")
        assert r.facts["worker_mapped_bytes"] == 245_760_128
        named = "2 files, /d/x.npy (234 MiB) the largest," if files == 2 else "/d/x.npy (234 MiB)"
        where = "in the dataset's __getitems__" if batched_ else (
            "by a __getitems__ on the dataset, called with a batch's indices")  # fmt: skip
        assert rec is not None and rec.action.endswith(
            "make each batch cheaper to build: the workers' file calls (200 ns per iteration, against 990 ns of "
            f"waiting) are not what the loop waits for, and they read {named} through a memory mapping (numpy.memmap, "
            "np.load(mmap_mode='r')), by page faults that no call times: where the files are larger than the free "
            "memory, those are reads from disk, page by page as the items touch them (store a batch's items together "
            f"and take them in one slice, {where}); otherwise building the items is what it waits for (the dataset's "
            f"{'__getitems__' if batched_ else '__getitem__'}, its transforms, the collation): decode and augment "
            "less, or on the GPU, or cache prepared items."
        ), rec.action
    # a Hugging Face dataset, its Arrow file mapped by the main process before the workers forked: they read it
    # through the mapping they inherited, and were said to do next to no file I/O (0 ns per iteration)
    arrow = [(210, None, "mmap", 5, 3, MAIN, "/d/data-00000-of-00001.arrow", {A.IO_REQUESTED_BYTES: 10_485_392}),
             (211, None, "mmap", 500, 3, MAIN, "/d/later.arrow", {A.IO_REQUESTED_BYTES: 99_999_999})]  # fmt: skip
    for method, files in (("fork", 1), ("spawn", 0)):
        loaders = [loader | {"batched": True, "start_method": method}]
        with loop_store(tmp_path / f"hf-{method}.duckdb", config=config | {A.CONFIG_DATALOADERS: loaders},
                        waits=(990, 990, 990), more_io=arrow) as store:  # fmt: skip
            r = _one(store, "io.input_bound")
            rec = _fired(store, "input_bound")
        assert r.facts["worker_mapped_files"] == files, method
        assert rec is not None
        if files:  # the one mapped after they started is the main process's own
            assert (r.facts["worker_mapped_path"], r.facts["worker_mapped_inherited"]) == (arrow[0][6], True)
            assert (
                "they read /d/data-00000-of-00001.arrow (10.0 MiB) through a memory mapping (Arrow: Hugging Face "
                "datasets) that the main process made before they forked, by page faults that no call times"
            ) in rec.action
        else:  # spawned workers map what they read themselves
            assert "memory mapping" not in rec.action
    # the main process unmapped it before the workers started (the dataset's __init__ read its length through it):
    # not theirs; a failed unmap leaves it mapped
    unmap = (212, None, "munmap", 7, 1, MAIN, arrow[0][6], {A.IO_REQUESTED_BYTES: 10_485_392})
    failed = (*unmap[:7], {A.IO_REQUESTED_BYTES: 0, A.IO_ERRNO: 22})
    for name, extra, files in (("unmapped", unmap, 0), ("failed", failed, 1)):
        loaders = [loader | {"batched": True, "start_method": "fork"}]
        with loop_store(tmp_path / f"hf-{name}.duckdb", config=config | {A.CONFIG_DATALOADERS: loaders},
                        waits=(990, 990, 990), more_io=[*arrow, extra]) as store:  # fmt: skip
            assert _one(store, "io.input_bound").facts["worker_mapped_files"] == files, name
    # an LMDB environment, mapped by the lmdb module: not numpy's to slice
    lmdb = [(200, None, "mmap", -900, 5, W1, "/d/data.mdb", {A.IO_REQUESTED_BYTES: 131_072_000})]
    with loop_store(tmp_path / "l.duckdb", config=config, waits=(990, 990, 990), more_io=lmdb) as store:
        rec = _fired(store, "input_bound")
    assert rec is not None and "read /d/data.mdb (125 MiB) through a memory mapping (LMDB), by page faults" in (
        rec.action
    )
    assert "(store a batch's items together and read them together, by a __getitems__ on the dataset" in rec.action
    # workers that list a folder for each item (sorted(os.listdir(root))[i] in __getitem__): 38.4 ms a step, 947 us
    # with the names listed once; they were told to read fewer, larger files
    listings = []
    for k in range(3):
        for i, pid in enumerate((W1, W2)):
            at = 1000 * k + 100 + 10 * i
            listings += [(300 + 10 * k + 2 * i, None, "opendir", at, 5, pid, "/d/train", {A.IO_FD_KIND: "dir"}),
                         (301 + 10 * k + 2 * i, None, "readdir", at + 5, 400, pid, "/d/train",
                          {A.IO_DIR_ENTRIES: 5002, A.IO_FD_KIND: "dir"})]  # fmt: skip
    with loop_store(tmp_path / "ls.duckdb", config=config, waits=(990, 990, 990), more_io=listings) as store:
        r = _one(store, "io.input_bound")
        rec = _fired(store, "input_bound")
    f = r.facts
    assert (f["worker_listings_per_iteration"], f["worker_listing_ns_per_iteration"]) == (2.0, 800.0)
    assert (f["worker_listing_entries"], f["worker_listing_path"]) == (5002.0, "/d/train")
    assert rec is not None and rec.action.endswith(
        "make each batch cheaper to build: the workers list /d/train 2 times per iteration, 5,002 entries each, and "
        "reading its entries takes them 800 ns per iteration, against 990 ns of waiting (os.listdir or glob in the "
        "dataset's __getitem__): list it once, in the dataset's __init__, and keep the names (sorted once)."
    ), rec.action
    # a profile attached at run time does not see the workers a spawn start method execs: their I/O is unknown
    with loop_store(tmp_path / "s.duckdb", config=config, waits=(990, 990, 990)) as store:
        pass
    with Store.open(tmp_path / "s.duckdb", read_only=False) as store:
        store.add_health(1, [("io_not_covered", 1, f"pid {k} exec'd /usr/bin/python3: attach; its I/O is not seen")
                             for k in (301, 302)])  # fmt: skip
    with Store.open(tmp_path / "s.duckdb") as store:
        r = _one(store, "io.input_bound")
        rec = _fired(store, "input_bound")
    assert r.facts["not_covered"] == 2 and rec is not None
    assert rec.action.endswith("its 16 workers already match the 16 usable CPUs: make each batch cheaper to load "
                               "(decode and augment less, or on the GPU; read fewer, larger files).")  # fmt: skip
    assert any(
        "; the io level did not cover 2 processes that the program started by exec (spawned DataLoader "
        "workers among them; health io_not_covered): their file I/O is unknown;" in e
        for e in rec.evidence
    )
    with loop_store(tmp_path / "b.duckdb", config={"pid": MAIN, A.CONFIG_CPU_COUNT: 2}, waits=(990,) * 3) as store:
        rec = _fired(store, "input_bound")  # no DataLoader settings recorded: from the workers the io level saw
    assert rec is not None and rec.action.startswith("The 2 workers already match the 2 cores: make each batch "
                                                     "cheaper to build: the workers' file I/O")  # fmt: skip
    # settings unknown: each said with when it helps, and no more prefetching for workers that fill the cores; it
    # told a CPU-only run, salvaged after a kill, to pin memory
    assert rec.action.endswith(
        " Unless it does already, set persistent_workers=True where it is iterated over several epochs (workers "
        "kept across them), and pin_memory=True where its batches go to a GPU."
    ), rec.action
    assert "prefetch_factor" not in rec.action
    with loop_store(tmp_path / "c8.duckdb", config={"pid": MAIN, A.CONFIG_CPU_COUNT: 8}, waits=(990,) * 3) as store:
        rec = _fired(store, "input_bound")
    assert rec is not None and rec.action.startswith("Raise DataLoader(num_workers=...) from 2 towards the 8 cores. ")
    assert "(workers kept across them) and a higher prefetch_factor (batches each worker loads ahead), and" in (
        rec.action
    )


# -- terminal summary ---------------------------------------------------------------------------------------
def test_summary_has_one_io_line(darshan_like: Store) -> None:
    s = summarize(darshan_like)
    # the data files' figures (os.py twice and /etc/hosts are not data), then every file's operations
    assert s.io == {"ops": 29, "bytes_read": 5_246_880, "bytes_written": 8_388_608, "time_ns": 3740, "files": 5,
                    "processes": 3, "all_ops": 37, "all_files": 7, "streams": 1, "mapped_files": 0,
                    "mapped_bytes": None}  # fmt: skip
    assert io_line(s.io) == (
        "29 operations by 3 processes on 5 data files: 5.00 MiB read, 8.00 MiB written, 3.74 us in I/O; "
        "37 operations on 7 files in all (Python, system and other files; 1 stream (standard streams, pipes, "
        "sockets) left out)"
    )
    # the report's run table has the same line, in markdown and in the HTML page
    analysis = analyze(darshan_like)
    assert f"| file I/O | {io_line(s.io)} |" in render_markdown(analysis)
    assert f'<p class="meta">file I/O: {io_line(s.io)}</p>' in render_html(analysis)
    # a program that only listed folders and read Python's files: no data file, said so, not "0 operations by 0"
    listing = {"ops": 0, "bytes_read": 0, "bytes_written": 0, "time_ns": 0, "files": 0, "processes": 0,
               "all_ops": 12, "all_files": 3, "streams": 0}  # fmt: skip
    assert io_line(listing) == (
        "no operation on a data file; 12 operations on 3 files in all (Python, system and other files)"
    )
    # data files mapped into memory (a Darshan log counts the mmaps, not their sizes): their reads are in no count
    assert io_line({**listing, "mapped_files": 2, "mapped_bytes": None}).endswith(
        "; 2 data files mapped into memory: what the program reads through a mapping is page faults, not calls, "
        "and is in none of the bytes read or I/O times"
    )


# -- a real Darshan log -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["dlio_python3_a.darshan", "nonmpi_dxt_anonymized.darshan"])
def test_a_real_darshan_log(tmp_path: Path, name: str) -> None:
    darshan = pytest.importorskip("xstack.importers.darshan", reason="the Darshan importer is not there yet")
    log = FIXTURES / name
    if not log.exists():
        pytest.skip(f"{log} is not present")
    importer = getattr(darshan, "import_darshan", None)
    if importer is None:
        pytest.skip("xstack.importers.darshan has no import_darshan")
    with Store.create(tmp_path / "d.duckdb") as store:
        importer(store, log)
    with Store.open(tmp_path / "d.duckdb") as store:
        results = {r.id: r for r in run_analyses(store, ids=IO_IDS)}
        counted = store.query(
            "SELECT sum(reads), sum(bytes_read), "
            "count(DISTINCT path) FILTER (WHERE attrs->>'$.path_class' <> 'stream') FROM io_files"
        )[0]
    assert all(r.available for r in results.values())
    pattern = results["io.pattern"].facts
    if pattern["small_reads_exact"]:  # DXT traced the POSIX reads only, not the STDIO ones: its share is of those
        assert pattern["small_reads_source"] == "DXT" and pattern["sized_reads"] < pattern["reads"]
        assert pattern["small_read_pct"] == pytest.approx(100 * pattern["small_reads"] / pattern["sized_reads"])
    files = results["io.files"].facts
    assert (files["reads"], files["bytes_read"], files["files"]) == tuple(int(v or 0) for v in counted)
    assert results["io.input_bound"].facts["lacking"] == "model"
    assert results["io.bandwidth"].rows  # estimated without DXT, measured with it


def test_a_real_dxt_log_s_recommendations_are_per_run_and_say_what_dxt_traced(tmp_path: Path) -> None:
    darshan = pytest.importorskip("xstack.importers.darshan", reason="the Darshan importer is not there")
    log = FIXTURES / "nonmpi_dxt_anonymized.darshan"
    if not log.exists():
        pytest.skip(f"{log} is not present")
    with Store.create(tmp_path / "d.duckdb") as store:
        darshan.import_darshan(store, log)
    with Store.open(tmp_path / "d.duckdb") as store:
        analysis = analyze(store)
        dxt_reads = store.query("SELECT count(*) FROM spans WHERE level = 'io' AND name = 'read'")[0][0]
    recs = {r.rule: r for r in analysis.recommendations}
    # a log has no iterations: the small files' I/O time is at stake over the run (the job)
    staged, small = recs["small_files"], analysis.result("io.small_files").facts
    assert (staged.impact_ns, staged.impact_per) == (small["small_time_ns"], "run")
    assert "at stake: about 626 ms per run" in render_markdown(analysis)
    # DXT traced the 7,822 POSIX reads; the counters also hold 26,246 STDIO reads, of no known size
    (line,) = recs["small_reads"].evidence
    assert dxt_reads == 7822 and f"66% of the {dxt_reads:,} reads traced by DXT are 1-4095 bytes" in line
    assert "(34,068 data-file reads in all, the others of unknown size)" in line


def test_io_module_exports_every_registered_analysis() -> None:
    for id in IO_IDS:
        assert getattr(io, ANALYSES[id].split(":")[1]).__doc__


def test_a_merged_run_s_stage_evidence_is_of_its_median_step(tmp_path: Path) -> None:
    """A merged run's one iteration stands for the passes' measured ones: the DataLoader wait of its steps is that
    of its median step, not of '1 measured step'."""
    with _merged_loop(tmp_path / "m.duckdb", (300, 300, 300, 300), median_wait=300) as store:
        merged = RULES["input_bound"]({r.id: r for r in run_analyses(store, 2)})
        alone = RULES["input_bound"]({r.id: r for r in run_analyses(store, 1)})
    assert merged is not None and alone is not None
    line = next(e for e in merged.evidence if e.endswith("(model.stages)"))
    assert line.startswith("the loop waited 300 ns for DataLoader batches within its median step (a merged profile")
    assert "30.0% of its time" in line and "measured step" not in line
    line = next(e for e in alone.evidence if e.endswith("(model.stages)"))
    assert "within its 4 measured steps, 30.0% of their time" in line


RECORDS_LOOP = """
import os, random, xstack
path = "records.bin"
with open(path, "wb") as f:
    f.write(os.urandom(4096 * 200))
order = list(range(200))
if ORDER == "shuffled":
    random.Random(0).shuffle(order)
for step in range(4):
    for i in order[step * 50 : (step + 1) * 50]:
        with open(path, "rb") as f:  # a map-style dataset's __getitem__: open, seek to the record, read it
            f.seek(i * 4096)
            f.read(4096)
    xstack.step()
"""


@pytest.mark.parametrize("order", ["shuffled", "in order"])
def test_records_read_in_shuffled_order_one_open_each_are_said_to_be(tmp_path: Path, order: str) -> None:
    """A dataset reads its records from one file in shuffled order, opening it for each: Darshan's counters start
    over at each open, so every read is sequential there and the table shows no random reads; the io spans, across
    opens, show that each read started elsewhere than the one before it ended. Read in order, they do not."""
    results = _run_io_loop(tmp_path, RECORDS_LOOP.replace("ORDER", repr(order)))
    r = results["io.pattern"]
    assert r.facts["random_pct"] == 0 and r.facts["sequential_pct"] > 99  # Darshan's per-open view
    # the first read follows no earlier one, and record 0's starts at the file's start: in order those are one
    after = r.facts["reads_after_earlier"]
    assert after == (198 if order == "shuffled" else 199)
    labels = [label for label in r.labels if "shuffled order" in label]
    if order == "shuffled":
        jumped = r.facts["jumped_reads"]
        assert jumped > 190 and labels == [
            f"data files: {jumped:,} of the {after} reads inside a file that followed an earlier read of it "
            f"({100 * jumped / after:.0f}%) started elsewhere than that read ended, each in an open of its own: "
            "records read in shuffled order, which Darshan's counters, starting over at each open, count as "
            "sequential"
        ]
    else:
        assert r.facts["jumped_reads"] == 0 and not labels


def test_a_file_read_again_within_one_open_is_no_shuffled_read(tmp_path: Path) -> None:
    """np.load reads a .npy's first page, header and array, then the array again from past its header: the second
    read starts before the first ended, in the same open. 512 small .npy files were said to be records read in
    shuffled order."""
    with Store.create(tmp_path / "a.duckdb") as store:
        store.add_run(RunInfo(1, "npy", levels=["model", "io"], config={"pid": MAIN}))
        sink = Sink(store, 1)
        for k in range(200):
            name, t = f"/d/{k}.npy", 10_000 * k
            io_span(sink, 3 * k + 1, None, "open", t, 100, W1, name)
            io_span(sink, 3 * k + 2, None, "read", t + 200, 100, W1, name, 384, offset=0)
            io_span(sink, 3 * k + 3, None, "read", t + 400, 100, W1, name, 256, offset=128)
        sink.close()
        add_files(store, [data_file(W1, f"/d/{k}.npy", 384, 2) for k in range(200)])
    with Store.open(tmp_path / "a.duckdb") as store:
        r = run_analyses(store, None, ["io.pattern"])[0]
    assert (r.facts["reads_after_earlier"], r.facts["jumped_reads"]) == (0, 0)
    assert not [label for label in r.labels if "shuffled order" in label]


def test_dataloaders_made_anew_with_the_same_settings_share_a_line() -> None:
    """A Hugging Face Trainer makes a new evaluation DataLoader at each evaluation: six lines of the same
    settings followed the training one's, each with its three waits."""
    from xstack.analyze._loaders import labels

    def entry(index: int, waits: int, wait_ns: int, warm: int = 0) -> dict[str, Any]:
        return {"index": index, "dataset": "DS", "batch_size": 16, "num_workers": 0, "persistent_workers": False,
                "pin_memory": False, "prefetch_factor": None, "waits": waits, "wait_ns": wait_ns,
                "warmup_waits": warm, "warmup_wait_ns": 2_130_000 if warm else 0}  # fmt: skip

    shown = (
        "DataLoader(DS, batch_size=16, num_workers=0, persistent_workers=False, pin_memory=False, prefetch_factor=None)"
    )
    entries = [entry(0, 30, 5_460_000, warm=3) | {"iterated": 1}]
    entries += [entry(i, 3, 290_000) | {"iterated": 1} for i in range(1, 7)]
    assert labels(entries, 2) == [
        f"{shown}: waited 5.46 ms in 30 waits, and 2.13 ms in the warm-up",
        "6 more DataLoaders of these settings, each iterated once (a new one each time, as a Hugging Face Trainer "
        "makes one per evaluation, or a loop for each epoch): waited 1.74 ms in 18 waits",
        "2 usable CPUs",
    ]
    other = entry(1, 3, 290_000) | {"batch_size": 64}
    assert len(labels([entry(0, 30, 5_460_000), other], None)) == 2  # other settings: a line of their own
    # a training and a validation DataLoader of the same settings, or those iterated for several epochs: theirs
    assert len(labels(entries[:2], None)) == 2
    assert len(labels([e | {"iterated": 3} for e in entries], None)) == 7
    # a DataLoader made anew for the second epoch, over a dataset of the same recorded length: one line for both;
    # a validation one of those settings over a shorter dataset: a line of its own
    epochs = [e | {"items": 480} for e in entries[:2]]
    assert labels(epochs, None)[1].startswith("1 more DataLoader of these settings, iterated once (a new one each ")
    assert len(labels([epochs[0], epochs[1] | {"items": 96}], None)) == 2


def test_the_io_spans_typed_once_per_run_hold_the_attributes_of_their_json(tmp_path: Path) -> None:
    """The io analyses read the io spans' attributes from a temp table filled once per store and run (one parse of
    each span's JSON instead of one per attribute in every query). Each column must be what the JSON says, a span
    without an attribute NULL there (a class-less span ``unknown``), and a run analysed again, or beside another
    run, must not be counted twice."""
    from xstack.analyze._io_common import IO_SPANS, typed_io_spans

    with Store.create(tmp_path / "t.duckdb") as store:
        for run in (1, 2):
            store.add_run(RunInfo(run, "typed", levels=["io"]))
            sink = Sink(store, run)
            io_span(sink, 1, None, "openat", 10, 5, MAIN, "/d/a.bin", **{A.IO_REQUESTED_BYTES: 0, A.IO_FD: 3})
            io_span(sink, 2, None, "pread", 20, 5, MAIN, "/d/a.bin", 4096 * run, offset=8192, **{A.IO_FD: 3})
            io_span(sink, 3, None, "readdir", 30, 5, MAIN, "/d", cls="directory", **{A.IO_DIR_ENTRIES: 7})
            io_span(sink, 4, None, "openat", 40, 5, MAIN, "/d/gone", **{A.IO_ERRNO: 2})
            sink.span(5, None, "io", "read", 50, 5, W1, W1, {A.IO_BYTES: 3})  # no path, no class
            sink.close()
    with Store.open(tmp_path / "t.duckdb") as store:
        for _ in range(2):
            for run in (2, 1):
                run_analyses(store, run, [i for i in ANALYSES if i.startswith("io.")])
                assert typed_io_spans(store, run) == IO_SPANS
        columns = "run_id, span_id, pid, name, start_ns, dur_ns, path, cls, nbytes, off, fd, requested, failed, entries"
        got = store.query(f"SELECT {columns} FROM {IO_SPANS} ORDER BY run_id, span_id")
    assert got == [
        row
        for run in (1, 2)
        for row in [
            (run, 1, MAIN, "openat", 10, 5, "/d/a.bin", "data", None, None, 3, 0, False, None),
            (run, 2, MAIN, "pread", 20, 5, "/d/a.bin", "data", 4096 * run, 8192, 3, None, False, None),
            (run, 3, MAIN, "readdir", 30, 5, "/d", "directory", None, None, None, None, False, 7),
            (run, 4, MAIN, "openat", 40, 5, "/d/gone", "data", None, None, None, None, True, None),
            (run, 5, W1, "read", 50, 5, None, "unknown", 3, None, None, None, False, None),
        ]
    ]
