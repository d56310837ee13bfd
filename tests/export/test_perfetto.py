"""The Perfetto (Chrome-trace JSON) exporter on every real trace: counts, flows, tracks, nesting and runs.

Each export is parsed back with ``json`` and checked against the store and, independently, against the
trace file the store was imported from.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import subprocess
import sys
import textwrap
import tracemalloc
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import all_kineto_fixtures, kineto_fixture, needs_torch
from xstack.errors import UsageError, XstackError
from xstack.export.perfetto import PerfettoStats, export_perfetto
from xstack.importers.kineto import import_kineto
from xstack.importers.ncu import import_ncu
from xstack.trace import attrs as A
from xstack.trace.schema import DEVICE_LEVELS
from xstack.trace.store import RunInfo, Store

FIXTURES = all_kineto_fixtures()
IDS = [p.name.removesuffix(".json.gz") for p in FIXTURES]
Event = dict[str, Any]
Track = tuple[int, int]


@dataclass
class Exported:
    trace: Path
    store: Store
    stats: PerfettoStats
    doc: dict[str, Any]

    @property
    def events(self) -> list[Event]:
        return list(self.doc["traceEvents"])

    def of(self, ph: str) -> list[Event]:
        return [e for e in self.events if e["ph"] == ph]


@pytest.fixture(scope="module", params=FIXTURES, ids=IDS)
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exported]:
    """Each real trace imported into its own store and exported once, shared by the tests of this module."""
    trace: Path = request.param
    tmp = tmp_path_factory.mktemp(trace.name.removesuffix(".json.gz"))
    with Store.create(tmp / "trace.duckdb") as store:
        import_kineto(store, trace)
    with Store.open(tmp / "trace.duckdb") as store:
        stats = export_perfetto(store, tmp / "trace.json")
        yield Exported(trace, store, stats, json.loads((tmp / "trace.json").read_bytes()))


# -- helpers ------------------------------------------------------------------------------------------------
def _ns(us: float) -> int:
    return round(us * 1000)


def _source_events(trace: Path) -> list[Event]:
    with gzip.open(trace, "rb") if trace.suffix == ".gz" else open(trace, "rb") as fh:
        return list(json.load(fh)["traceEvents"])


def _names(events: list[Event], kind: str) -> dict[Any, str]:
    """process_name by pid, or thread_name by (pid, tid)."""
    key = (lambda e: e["pid"]) if kind == "process_name" else (lambda e: (e["pid"], e["tid"]))
    return {key(e): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == kind}


def _location(e: Event) -> tuple[int, int, int]:
    return e["pid"], e["tid"], _ns(e["ts"])


def _assert_properly_nested(events: list[Event]) -> None:
    tracks: dict[Track, list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            tracks[(e["pid"], e["tid"])].append((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])))
    for track, spans in tracks.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        open_ends: list[int] = []
        for start, end in spans:
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], f"partial overlap on track {track} at {start} ns"
            open_ends.append(end)


def _level_counts(store: Store, run_id: int | None = None) -> dict[str, int]:
    where = "" if run_id is None else f"WHERE run_id = {run_id}"
    return dict(store.query(f"SELECT level, count(*) FROM spans {where} GROUP BY level"))


# -- every real trace -----------------------------------------------------------------------------------------
def test_slices_per_level_match_the_store_and_the_trace_file(exported: Exported) -> None:
    got = Counter(e["cat"] for e in exported.of("X"))
    assert got == _level_counts(exported.store)
    assert exported.stats.spans == dict(got)
    source = _source_events(exported.trace)
    assert got["kernel"] == sum(1 for e in source if e.get("ph") == "X" and e.get("cat") == "kernel")
    assert got["op"] == sum(1 for e in source if e.get("ph") == "X" and e.get("cat") == "cpu_op")


def test_counter_samples_match_the_store_and_the_memory_events(exported: Exported) -> None:
    counters = exported.of("C")
    rows = exported.store.query("SELECT count(*) FROM counters")[0][0]
    memory = sum(1 for e in _source_events(exported.trace) if e.get("ph") == "i" and e.get("name") == "[memory]")
    assert len(counters) == exported.stats.counter_samples == rows == 2 * memory
    assert all(set(e["args"]) == {"value"} and math.isfinite(e["args"]["value"]) for e in counters)


def test_every_device_span_with_a_host_parent_gets_exactly_one_flow_from_it(exported: Exported) -> None:
    starts, finishes = exported.of("s"), exported.of("f")
    assert len({e["id"] for e in starts}) == len(starts) == len(finishes) == exported.stats.flows
    assert {e["id"] for e in starts} == {e["id"] for e in finishes}
    assert all(e["cat"] == "ac2g" for e in starts + finishes) and all(e["bp"] == "e" for e in finishes)
    slices = {e["args"]["span_id"]: e for e in exported.of("X")}
    device_pids = {pid for pid, name in _names(exported.events, "process_name").items() if name.startswith("GPU")}
    expected = Counter(
        (_location(slices[e["args"]["parent_id"]]), _location(e))
        for e in slices.values()
        if e["pid"] in device_pids
        and "parent_id" in e["args"]
        and slices[e["args"]["parent_id"]]["pid"] not in device_pids
    )
    start_at = {e["id"]: _location(e) for e in starts}
    assert Counter((start_at[e["id"]], _location(e)) for e in finishes) == expected
    launched = exported.store.query(
        f"""SELECT count(*) FROM spans c JOIN spans p ON p.run_id = c.run_id AND p.span_id = c.parent_id
            WHERE c.level IN ({", ".join(repr(lv) for lv in DEVICE_LEVELS)}) AND p.level = 'runtime'"""
    )[0][0]
    assert sum(1 for e in finishes if e["name"] == "launch") == launched


def test_events_have_the_fields_perfetto_needs_and_exact_times(exported: Exported) -> None:
    for e in exported.events:
        assert {"ph", "ts", "pid", "tid", "name"} <= e.keys(), e
        assert all(isinstance(e[k], int) and 0 <= e[k] < 2**32 for k in ("pid", "tid")), e
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
    base = exported.doc["otherData"]["xstack"]["runs"][0]["time_base_ns"]
    rows = {r[0]: r[1:] for r in exported.store.query("SELECT span_id, start_ns, dur_ns FROM spans")}
    for e in exported.of("X"):
        start_ns, dur_ns = rows[e["args"]["span_id"]]
        assert isinstance(e["dur"], float) and e["dur"] >= 0
        assert (_ns(e["ts"]) + base, _ns(e["dur"])) == (start_ns, dur_ns)
        assert int(e["dur"] * 1000) == dur_ns  # what Perfetto computes from the double
    assert exported.doc["displayTimeUnit"] == "ns"


def test_host_tracks_nest_without_partial_overlaps(exported: Exported) -> None:
    _assert_properly_nested(exported.events)
    names = _names(exported.events, "thread_name")
    overlap_tracks = {t for t, name in names.items() if re.search(r" \(overlap \d+\)$", name)}
    moved = sum(1 for e in exported.of("X") if (e["pid"], e["tid"]) in overlap_tracks)
    assert moved == exported.stats.overlap_spans


def test_device_spans_sit_on_a_process_per_device_and_a_track_per_stream(exported: Exported) -> None:
    processes = _names(exported.events, "process_name")
    threads = _names(exported.events, "thread_name")
    config = json.loads(exported.store.query("SELECT config FROM runs")[0][0])["processes"]
    rows = {r[0]: r[1:] for r in exported.store.query("SELECT span_id, device, stream, pid, tid FROM spans")}
    for e in exported.of("X"):
        device, stream, pid, tid = rows[e["args"]["span_id"]]
        thread = re.sub(r" \(overlap \d+\)$", "", threads[(e["pid"], e["tid"])])
        if device == "cpu":
            assert not processes[e["pid"]].startswith("GPU")
            assert f"(pid {pid})" in processes[e["pid"]]
            assert thread == config.get(str(pid), {}).get("threads", {}).get(str(tid), f"thread {tid}")
        else:
            assert processes[e["pid"]].startswith(f"GPU {device.split(':')[1]} ({device})")
            if e["cat"] == "metrics":  # counter ranges are not timed: never on a stream's timeline
                assert thread.startswith("counter ranges, not timed (")
            else:
                assert thread == (f"stream {stream}" if stream is not None else "no stream")
    device_levels = {e["cat"] for e in exported.of("X") if processes[e["pid"]].startswith("GPU")}
    assert device_levels <= {*DEVICE_LEVELS, "model", "metrics"}


def test_cupti_counter_ranges_sit_on_an_untimed_track_with_their_counters(tmp_path: Path) -> None:
    # Kineto spreads the range profiler's ranges evenly over the session: their times are not the kernels'
    trace = kineto_fixture("a100_alexnet_cupti_counters.json.gz")
    ranges = {_ns(e["ts"]): e for e in _source_events(trace) if e.get("cat") == "cuda_profiler_range"}
    with Store.create(tmp_path / "c.duckdb") as store:
        import_kineto(store, trace)
    with Store.open(tmp_path / "c.duckdb") as store:
        export_perfetto(store, tmp_path / "c.json")
    doc = json.loads((tmp_path / "c.json").read_bytes())
    events, base_ns = doc["traceEvents"], doc["otherData"]["xstack"]["runs"][0]["time_base_ns"]
    threads = _names(events, "thread_name")
    metrics = [e for e in events if e["ph"] == "X" and e["cat"] == "metrics"]
    assert len(metrics) == len(ranges) == 77
    assert {threads[(e["pid"], e["tid"])] for e in metrics} == {
        "counter ranges, not timed (CUPTI range profiler: spaced evenly by Kineto, in launch order)"
    }
    untimed = {(e["pid"], e["tid"]) for e in metrics}
    assert not any(e["ph"] == "X" and e["cat"] != "metrics" and (e["pid"], e["tid"]) in untimed for e in events)
    for e in metrics:  # the counters travel as args, with how the range was placed
        counters = ranges[base_ns + _ns(e["ts"])]["args"]
        assert (
            e["args"]["kineto.args"]["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"]
            == (counters["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"])
        )
        assert "metrics.flops_fp32" in e["args"]
        assert e["args"]["xstack.timing"].startswith("not timed: Kineto lays the CUPTI range profiler's ranges")


def test_nsight_compute_kernels_sit_on_an_untimed_track_not_their_stream(tmp_path: Path) -> None:
    csv = Path(__file__).resolve().parents[1] / "data" / "ncu" / "raw_new_base.csv"
    with Store.create(tmp_path / "n.duckdb") as store:
        import_ncu(store, csv)
    with Store.open(tmp_path / "n.duckdb") as store:
        export_perfetto(store, tmp_path / "n.json")
        n = store.query("SELECT count(*) FROM spans WHERE level = 'metrics'")[0][0]
    events = json.loads((tmp_path / "n.json").read_bytes())["traceEvents"]
    threads = _names(events, "thread_name")
    metrics = [e for e in events if e["ph"] == "X" and e["cat"] == "metrics"]
    assert len(metrics) == n == 4
    assert {threads[(e["pid"], e["tid"])] for e in metrics} == {
        "counter ranges, not timed (Nsight Compute: replayed one kernel at a time, in order)"
    }
    assert all(e["args"]["xstack.timing"].startswith("not timed: Nsight Compute replays") for e in metrics)
    assert not any(name.startswith("stream") for name in threads.values())


# -- several runs in one store ------------------------------------------------------------------------------
def _two_run_store(tmp_path: Path) -> Path:
    path = tmp_path / "two.duckdb"
    with Store.create(path) as store:
        import_kineto(store, kineto_fixture("h100_bert_small_infer_full.json.gz"))
        import_kineto(store, kineto_fixture("a100_alexnet_train_sync.json.gz"))
    return path


def _run_of_pid(events: list[Event]) -> dict[int, int]:
    return {
        pid: int(re.search(r"\[run (\d+): ", name)[1])  # type: ignore[index]
        for pid, name in _names(events, "process_name").items()
    }


def test_runs_of_one_store_keep_their_tracks_apart(tmp_path: Path) -> None:
    with Store.open(_two_run_store(tmp_path)) as store:
        stats = export_perfetto(store, tmp_path / "all.json")
        events = json.loads((tmp_path / "all.json").read_bytes())["traceEvents"]
        run_of = _run_of_pid(events)
        assert set(run_of.values()) == {1, 2} and stats.runs == 2
        for run_id in (1, 2):
            got = Counter(e["cat"] for e in events if e["ph"] == "X" and run_of[e["pid"]] == run_id)
            assert got == _level_counts(store, run_id)
        names = _names(events, "process_name")
        assert any("h100_bert_small_infer_full" in n for n in names.values())
        assert any("a100_alexnet_train_sync" in n for n in names.values())
        flows = {e["id"]: e for e in events if e["ph"] == "s"}
        assert all(run_of[flows[e["id"]]["pid"]] == run_of[e["pid"]] for e in events if e["ph"] == "f")
        _assert_properly_nested(events)


def test_one_run_is_exported_alone_and_an_unknown_run_is_an_error(tmp_path: Path) -> None:
    with Store.open(_two_run_store(tmp_path)) as store:
        stats = export_perfetto(store, tmp_path / "two.json", run_id=2)
        doc = json.loads((tmp_path / "two.json").read_bytes())
        assert set(_run_of_pid(doc["traceEvents"]).values()) == {2} and stats.runs == 1
        assert Counter(e["cat"] for e in doc["traceEvents"] if e["ph"] == "X") == _level_counts(store, 2)
        assert [r["run_id"] for r in doc["otherData"]["xstack"]["runs"]] == [2]
        with pytest.raises(UsageError, match=r"no run 7 .*its runs: 1, 2") as caught:
            export_perfetto(store, tmp_path / "seven.json", run_id=7)
        assert isinstance(caught.value, XstackError)
        assert not (tmp_path / "seven.json").exists() and not (tmp_path / "seven.json.partial").exists()


# -- built stores: awkward names, overlaps, memory ----------------------------------------------------------
ODD_NAMES = ['say "hi"', "back\\slash", "new\nline\ttab", "ctrl\x01\x1f", "émoji 🚀 \u2028", '},{"ph":"X"']


def _insert(store: Store, rows: list[tuple[Any, ...]]) -> None:
    store.con.executemany("INSERT INTO _spans VALUES (1, ?, ?, ?, ?, ?, ?, 10, 11, ?, ?, ?, NULL)", rows)


def test_odd_names_stay_valid_json_and_partial_overlaps_get_their_own_track(tmp_path: Path) -> None:
    with Store.create(tmp_path / "odd.duckdb") as store:
        store.add_run(RunInfo(run_id=1, name='odd "run"', config={"processes": {"10": {"threads": {"11": "main"}}}}))
        _insert(
            store,
            [
                (1, None, "op", ODD_NAMES[0], 1000, 100_000, "cpu", None, None),  # [1, 101] us
                (2, None, "runtime", ODD_NAMES[1], 51_000, 100_000, "cpu", None, 5),  # [51, 151]: partial overlap
                (3, 2, "kernel", ODD_NAMES[2], 160_000, 1_234, "cuda:0", 7, 5),
                (4, 3, "metrics", "counters of the kernel", 160_000, 1_234, "cuda:0", None, None),  # no arrow
            ],
        )
        store.con.execute("UPDATE _spans SET pid = NULL, tid = NULL WHERE device <> 'cpu'")
        for i, name in enumerate(ODD_NAMES[3:], start=5):
            _insert(store, [(i, None, "op", name, 200_000 + i, 1, "cpu", None, None)])
        store.con.execute(
            "INSERT INTO _counters VALUES (1, 'x', 1000, 'NaN'::DOUBLE, 10, 'cpu'), (1, 'x', 2000, 3.5, 10, 'cpu')"
        )
    with Store.open(tmp_path / "odd.duckdb") as store:
        stats = export_perfetto(store, tmp_path / "odd.json")
    events = json.loads((tmp_path / "odd.json").read_bytes())["traceEvents"]
    assert {e["name"] for e in events if e["ph"] == "X"} == {*ODD_NAMES, "counters of the kernel"}
    assert (stats.overlap_spans, stats.counter_samples, stats.counters_skipped, stats.flows) == (1, 1, 1, 1)
    _assert_properly_nested(events)
    threads = _names(events, "thread_name")
    runtime = next(e for e in events if e["ph"] == "X" and e["cat"] == "runtime")
    assert threads[(runtime["pid"], runtime["tid"])] == "main (overlap 1)"
    metrics = next(e for e in events if e["ph"] == "X" and e["cat"] == "metrics")
    assert threads[(metrics["pid"], metrics["tid"])] == "counter ranges, not timed (hardware counters)"
    start = next(e for e in events if e["ph"] == "s")
    assert _location(start) == _location(runtime)  # the arrow leaves the launch on its overlap track
    assert any('odd "run"' in n for n in _names(events, "process_name").values())


def test_memory_stays_flat_while_spans_stream(tmp_path: Path) -> None:
    launches = 20_000
    with Store.create(tmp_path / "big.duckdb") as store:
        store.add_run(RunInfo(run_id=1, name="big"))
        store.con.execute(f"""INSERT INTO _spans
            SELECT 1, 2 * i + 1, NULL, 'runtime', 'cudaLaunchKernel', i * 3000, 1000, 1, 1, 'cpu', NULL, i,
                   '{{"runtime.cbid": 211}}' FROM range({launches}) t(i)
            UNION ALL
            SELECT 1, 2 * i + 2, 2 * i + 1, 'kernel', 'gemm_' || i, i * 3000 + 1500, 1200, NULL, NULL, 'cuda:0',
                   7, i, '{{"kernel.grid": [1, 2, 3]}}' FROM range({launches}) t(i)""")
    with Store.open(tmp_path / "big.duckdb") as store:
        tracemalloc.start()
        try:
            stats = export_perfetto(store, tmp_path / "big.json")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert stats.spans == {"runtime": launches, "kernel": launches} and stats.flows == launches
    # Holding every event would take far more than the output itself (about 10 MB here).
    assert peak < 30 * 2**20, f"export peaked at {peak / 2**20:.1f} MiB of Python memory"


# -- the io level: a track per worker process, attributes as args ---------------------------------------------
def test_io_spans_sit_in_named_worker_processes_with_their_attributes(tmp_path: Path) -> None:
    from tests.analyze.io_store import MAIN, W1, W2, loop_store

    with loop_store(tmp_path / "io.duckdb", config={}) as store:  # no config pid: the model spans' process is main
        stats = export_perfetto(store, tmp_path / "io.json")
        attrs = {int(i): json.loads(a) for i, a in store.query("SELECT span_id, attrs FROM spans WHERE level = 'io'")}
    events = json.loads((tmp_path / "io.json").read_bytes())["traceEvents"]
    processes = _names(events, "process_name")
    by_pid = {re.search(r"\(pid (\d+)\)", n)[1]: n.split(" [run")[0] for n in processes.values()}  # type: ignore[index]
    assert by_pid == {str(MAIN): f"main process (pid {MAIN})", str(W1): f"dataloader worker (pid {W1})",
                      str(W2): f"dataloader worker (pid {W2})"}  # fmt: skip
    io = [e for e in events if e["ph"] == "X" and e["cat"] == "io"]
    assert len(io) == len(attrs) == stats.spans["io"]
    for e in io:
        assert {k: e["args"][k] for k in attrs[e["args"]["span_id"]]} == attrs[e["args"]["span_id"]]
    threads = _names(events, "thread_name")
    for worker in (W1, W2):
        tracks = {(e["pid"], e["tid"]) for e in io if f"(pid {worker})" in processes[e["pid"]]}
        assert len(tracks) == 1 and threads[tracks.pop()] == f"thread {worker}"  # one track per worker process
    main_io = [e for e in io if processes[e["pid"]].startswith("main process")]
    assert {e["args"]["io.path"] for e in main_io} == {"/d/a.bin", "<pipe>"}
    # the read built to straddle the end of a DataLoader wait cannot nest: it alone goes to an overlap track
    assert stats.overlap_spans == 1
    _assert_properly_nested(events)


def test_io_workers_of_a_run_without_a_dataloader_are_worker_processes(tmp_path: Path) -> None:
    with Store.create(tmp_path / "w.duckdb") as store:
        store.add_run(RunInfo(run_id=1, name="w", levels=["model", "io"], config={"pid": 5}))
        _insert(store, [(1, None, "model", "step#0", 0, 1000, "cpu", None, None)])
        store.con.execute("""INSERT INTO _spans VALUES (1, 2, NULL, 'io', 'read', 10, 5, 6, 6, 'cpu', NULL, NULL,
            '{"io.path": "/d/x", "io.bytes": 7}')""")
        store.con.execute("UPDATE _spans SET pid = 5 WHERE span_id = 1")
    with Store.open(tmp_path / "w.duckdb") as store:
        export_perfetto(store, tmp_path / "w.json")
    names = sorted(n.split(" [run")[0] for n in _names(json.loads((tmp_path / "w.json").read_bytes())["traceEvents"],
                                                         "process_name").values())  # fmt: skip
    assert names == ["main process (pid 5)", "worker process (pid 6)"]


@needs_torch
def test_a_program_started_by_exec_is_a_subprocess_not_a_dataloader_worker(tmp_path: Path) -> None:
    """A program with a DataLoader worker that also runs ``cat``: cat's track is a subprocess's, as the io level
    recorded its role, and the worker's stays a DataLoader worker's."""
    from xstack.collect.io import IoCollector

    if (why := IoCollector().unavailable_reason()) is not None:
        pytest.skip(f"io level unavailable: {why}")
    data = tmp_path / "data.txt"
    data.write_text("hello")
    program = tmp_path / "prog.py"
    program.write_text(
        textwrap.dedent("""
        import subprocess, sys
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Files(Dataset):
            def __len__(self):
                return 4

            def __getitem__(self, i):
                with open(sys.argv[1], "rb") as f:
                    return torch.tensor(len(f.read()))

        subprocess.run(["cat", sys.argv[1]], check=True, stdout=subprocess.DEVNULL)
        for batch in DataLoader(Files(), batch_size=2, num_workers=1):
            pass
    """)
    )
    store, out = tmp_path / "p.duckdb", tmp_path / "p.json"
    run = [sys.executable, "-m", "xstack", "run", "--levels", "model,io", "-o", str(store), "--", "python",
           str(program), str(data)]  # fmt: skip
    done = subprocess.run(run, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([sys.executable, "-m", "xstack", "export", str(store), "-o", str(out)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Store.open(store) as s:
        (cat,) = s.query("SELECT DISTINCT pid FROM io_files WHERE path = ? AND bytes_read > 0 AND "
                         f"attrs->>'$.{A.IO_FILE_PROCESS_ROLE}' = 'subprocess'", [str(data)])[0]  # fmt: skip
    names = sorted(n.split(" [run")[0] for n in _names(json.loads(out.read_bytes())["traceEvents"], "process_name")
                   .values())  # fmt: skip
    assert f"subprocess cat (pid {cat})" in names  # named by the program it ran (runs.config.io_programs)
    assert [n.split(" (pid")[0] for n in names].count("dataloader worker") == 1, names


def test_an_output_ending_in_gz_is_gzipped_and_holds_the_same_trace(exported: Exported, tmp_path: Path) -> None:
    # a file named .gz that is plain JSON fails zcat and any reader that trusts the name
    out = tmp_path / "trace.json.gz"
    stats = export_perfetto(exported.store, out)
    assert out.read_bytes()[:2] == b"\x1f\x8b" and not Path(f"{out}.partial").exists()
    with gzip.open(out, "rb") as fh:
        assert json.load(fh) == exported.doc
    assert stats.describe() == exported.stats.describe()
    # the JSON bytes are counted as they are written, gzipped or not (the report says how large the trace is)
    plain = export_perfetto(exported.store, tmp_path / "trace.json")
    assert stats.json_bytes == plain.json_bytes == (tmp_path / "trace.json").stat().st_size
    assert stats.json_bytes == len(gzip.decompress(out.read_bytes()))
    # the header names the trace, not the .partial it was written as, and holds no time (RFC 1952: MTIME 0), so
    # that the same store exported twice gives the same bytes
    header = out.read_bytes()
    assert header[3] & 0x08 and header[4:8] == b"\0\0\0\0"
    assert header[10:].split(b"\0", 1)[0] == b"trace.json"
