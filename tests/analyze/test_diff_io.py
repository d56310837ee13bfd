"""``diff.io``: the file I/O of two real runs compared, a program profiled twice through the CLI with the io level
(the second reads its data twice and one more file), and two real Darshan logs imported with ``xstack import``."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.conftest import FIXTURES, pydarshan
from xstack.analyze._io_common import DATA_CLASSES
from xstack.analyze.diff import ProfileDiff, diff_profiles
from xstack.analyze.io import file_table
from xstack.trace.store import Store

PROGRAM = Path(__file__).parent / "io_programs" / "epochs.py"
FILES, FILE_BYTES, LABEL_BYTES, OUT_BYTES = 4, 4096, 1000, 512
"""The data files, each of FILE_BYTES; the labels file B reads once more; OUT_BYTES written per epoch."""


def _xstack(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "xstack", *args], capture_output=True, text=True, env=env,
                          timeout=240)  # fmt: skip


def _profile(store: Path, levels: str, *args: str) -> Path:
    done = _xstack("run", "--levels", levels, "-o", str(store), "--", "python", str(PROGRAM), *args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("done\n"), done.stdout
    return store


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A: one epoch over the data files; B: two epochs, and a labels file read once; C: as A, without the io
    level."""
    pytest.importorskip("torch", reason="PyTorch is not installed")
    from xstack.collect.io import IoCollector

    if (reason := IoCollector().unavailable_reason()) is not None:
        pytest.skip(f"io level unavailable: {reason}")
    root = tmp_path_factory.mktemp("diff_io")
    data = root / "data"
    data.mkdir()
    for i in range(FILES):
        (data / f"{i}.bin").write_bytes(os.urandom(FILE_BYTES))
    (root / "labels.bin").write_bytes(os.urandom(LABEL_BYTES))
    out = str(root / "out.bin")
    return {
        "root": root,
        "a": _profile(root / "a.duckdb", "model,io", str(data), "1", out),
        "b": _profile(root / "b.duckdb", "model,io", str(data), "2", out, str(root / "labels.bin")),
        "c": _profile(root / "c.duckdb", "model", str(data), "1", out),
    }


def _rows(d: ProfileDiff) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["item"], r["measure"]): r for r in d.io.to_records()}


def _data_totals(store: Path) -> dict[str, int]:
    """The data files' totals as io.files lists them (every path, no class folded)."""
    with Store.open(store) as s:
        files = [r for r in file_table(s, 1, all_paths=True, limit=None).to_records() if r["class"] in DATA_CLASSES]
    keys = ("opens", "reads", "writes", "bytes read", "bytes written", "time")
    return {k: sum(r[k] for r in files) for k in keys} | {"files": len({r["path"] for r in files})}


def test_bytes_and_operations_change_exactly(runs: dict[str, Path]) -> None:
    d = diff_profiles(runs["a"], runs["b"])
    rows = _rows(d)

    def check(measure: str, a: int, b: int, status: str) -> None:
        row = rows[("data files", measure)]
        assert (row["A"], row["B"], row["delta"], row["status"], row["floor"]) == (a, b, b - a, status, "exact"), row

    read_a, read_b = FILES * FILE_BYTES, 2 * FILES * FILE_BYTES + LABEL_BYTES
    check("bytes read", read_a, read_b, "more")
    check("bytes written", OUT_BYTES, 2 * OUT_BYTES, "more")
    check("files", FILES + 1, FILES + 2, "more")  # the output file is data too; B also reads the labels
    check("opens", FILES + 1, 2 * FILES + 2, "more")
    check("writes", 1, 1, "unchanged")
    reads_a = rows[("data files", "reads")]["A"]  # each file is read whole, the same calls in both runs
    check("reads", reads_a, reads_a // FILES * (2 * FILES + 1), "more")
    check("zero-length reads", FILES, 2 * FILES + 1, "more")  # each whole read ends with one at the end of file
    assert d.io.facts["bytes_read"] == {"a": read_a, "b": read_b, "delta": read_b - read_a, "status": "more"}
    for measure in ("read time", "write time", "metadata time"):
        row = rows[("data files", measure)]
        delta, floor = row["B"] - row["A"], max(0.05 * row["A"], 1_000)
        expected = "unchanged" if abs(delta) < floor else "more" if delta > 0 else "less"
        assert (row["floor"], row["status"], row["delta"]) == ("5% and 1 us", expected, delta), row
    # the totals are those io.files gives for the data files of each run
    for side, store in (("A", runs["a"]), ("B", runs["b"])):
        totals = _data_totals(store)
        for measure, key in (("bytes read", "bytes read"), ("opens", "opens"), ("files", "files")):
            assert rows[("data files", measure)][side] == totals[key], (side, measure)
    assert rows[("other files", "files")]["A"] > 100  # the interpreter's imports: counted apart, not as data


def test_the_loop_s_wait_for_data_is_compared(runs: dict[str, Path]) -> None:
    rows = _rows(diff_profiles(runs["a"], runs["b"]))
    # 2 batches an epoch, one step each; the first step is the warm-up
    it = rows[("the loop", "iterations")]
    assert (it["A"], it["B"], it["status"]) == (2 - 1, 4 - 1, "more")
    wait = rows[("the loop", "waited for data")]
    assert wait["A"] > 0 and wait["B"] > 0 and wait["unit"] == "ns" and wait["floor"] == "5% and 1 us"


def test_a_loop_without_dataloader_spans_has_its_zero_waits_not_compared(tmp_path: Path) -> None:
    from tests.analyze.io_store import loop_store

    with loop_store(tmp_path / "a.duckdb"):
        pass
    with loop_store(tmp_path / "b.duckdb", dataloader=False):  # loads its data itself: every wait is 0
        pass
    d = diff_profiles(tmp_path / "a.duckdb", tmp_path / "b.duckdb")
    rows = _rows(d)
    assert rows[("the loop", "iterations")]["status"] == "unchanged"
    for measure in ("waited for data", "mean wait per iteration"):
        assert rows[("the loop", measure)]["status"] == "not compared", measure
    assert any(lb.startswith("not compared: the loop's wait for data (B without DataLoader spans: every wait is 0")
               for lb in d.io.labels), d.io.labels  # fmt: skip


def test_files_that_changed_most_are_listed_by_path(runs: dict[str, Path]) -> None:
    root = runs["root"]
    d = diff_profiles(runs["a"], runs["b"])
    rows = _rows(d)
    labels = rows[(str(root / "labels.bin"), "bytes read")]
    assert (labels["A"], labels["B"], labels["delta"], labels["status"]) == (None, LABEL_BYTES, LABEL_BYTES, "added")
    assert rows[(str(root / "labels.bin"), "read time")]["status"] == "added"
    for i in range(FILES):
        row = rows[(str(root / "data" / f"{i}.bin"), "bytes read")]
        assert (row["A"], row["B"], row["status"]) == (FILE_BYTES, 2 * FILE_BYTES, "more")
    out = rows[(str(root / "out.bin"), "bytes written")]
    assert (out["A"], out["B"], out["status"]) == (OUT_BYTES, 2 * OUT_BYTES, "more")
    assert (str(root / "out.bin"), "bytes read") not in rows  # it is only written: no row of reads
    assert d.io.facts["files_changed"] == d.io.facts["files_listed"] == FILES + 2 and d.io.truncated == 0

    top = diff_profiles(runs["a"], runs["b"], top=2)
    paths = {r["item"] for r in top.io.to_records() if r["item"].startswith("/")}
    assert len(paths) == 2 and top.io.facts["files_listed"] == 2 and top.io.truncated > 0
    assert f"2 of {FILES + 2} changed data files listed (those that changed most), {FILES} left out: a larger " \
           "--top lists more" in top.io.labels  # fmt: skip
    # the totals do not depend on the files listed
    assert [r for r in top.io.rows if not r[0].startswith("/")] == [r for r in d.io.rows if not r[0].startswith("/")]


def test_a_run_without_the_io_level_is_not_compared(runs: dict[str, Path]) -> None:
    for a, b, side in ((runs["c"], runs["a"], "A"), (runs["a"], runs["c"], "B")):
        r = diff_profiles(a, b).io
        assert r.missing == ["io"] and not r.rows, r
        assert r.hint.startswith(f"Not compared: {side} ({runs['c']} run 1) has no I/O level"), r.hint


def test_diff_io_renders_in_the_terminal_markdown_json_csv_and_html(runs: dict[str, Path]) -> None:
    from xstack.report._html_table import table_payload
    from xstack.report.html import _comparison

    a, b = str(runs["a"]), str(runs["b"])
    proc = _xstack("diff", a, b)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if "bytes read" in ln and "data files" in ln)
    assert "16.0 KiB" in line and "33.0 KiB" in line and "more" in line and "exact" in line, line

    proc = _xstack("diff", a, b, "--format", "md")
    assert proc.returncode == 0, proc.stderr
    assert "## diff.io: I/O: B against A" in proc.stdout
    assert "| data files | bytes read | bytes | 16.0 KiB | 33.0 KiB | 17.0 KiB | 106.1 | more | exact |" in proc.stdout

    proc = _xstack("diff", a, b, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    result = next(r for r in json.loads(proc.stdout)["results"] if r["id"] == "diff.io")
    names = [c["name"] for c in result["columns"]]
    row = next(r for r in result["rows"] if r[:2] == ["data files", "bytes read"])
    assert dict(zip(names, row, strict=True))["delta"] == FILES * FILE_BYTES + LABEL_BYTES
    assert result["columns"][names.index("A")]["unit_from"] == "unit"

    proc = _xstack("diff", a, b, "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    records = list(csv.DictReader(io.StringIO(proc.stdout)))
    opens = next(r for r in records if r["table"] == "diff.io" and r["measure"] == "opens")
    assert (opens["A"], opens["B"], opens["A [ns]"]) == (str(FILES + 1), str(2 * FILES + 2), "")  # not under ns

    d = diff_profiles(runs["a"], runs["b"])
    payload = table_payload(d.io.columns, d.io.rows)
    shown = [c["name"] for c in payload["cols"] if c["fmt"]]
    disp = dict(zip(shown, payload["disp"][[r[:2] for r in d.io.rows].index(("data files", "bytes read"))],
                    strict=True))  # fmt: skip
    assert (disp["A"], disp["B"], disp["delta"]) == ("16.0 KiB", "33.0 KiB", "17.0 KiB")
    assert 'data-result="diff.io"' in _comparison(d)
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(d)
    assert "diff.io" in console.export_text()


@pytest.fixture(scope="module")
def darshan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The two DLIO logs, each imported into a store of its own with ``xstack import``."""
    pydarshan()
    root = tmp_path_factory.mktemp("diff_io_darshan")
    stores = []
    for name in ("dlio_python3_a", "dlio_python3_b"):
        log = FIXTURES / "darshan" / f"{name}.darshan"
        if not log.exists():
            pytest.skip(f"real-log fixture {log} is not present (expected ../shared/fixtures beside the repo)")
        done = _xstack("import", str(log), "-o", str(root / f"{name}.duckdb"))
        assert done.returncode == 0, done.stderr
        stores.append(root / f"{name}.duckdb")
    return stores[0], stores[1]


def test_darshan_logs_compare_their_data_files_totals(darshan: tuple[Path, Path]) -> None:
    a, b = darshan
    d = diff_profiles(a, b)
    rows = _rows(d)
    for side, store in (("A", a), ("B", b)):
        totals = _data_totals(store)
        for measure, key in (("files", "files"), ("opens", "opens"), ("reads", "reads"), ("writes", "writes"),
                             ("bytes read", "bytes read"), ("bytes written", "bytes written")):  # fmt: skip
            assert rows[("data files", measure)][side] == totals[key], (side, measure)
        times = sum(rows[("data files", m)][side] for m in ("read time", "write time", "metadata time"))
        assert times == totals["time"], side
    assert rows[("data files", "bytes read")]["status"] == "less"  # B is the checkpoint: it writes, reads nothing
    assert rows[("data files", "bytes written")]["status"] == "more"
    zero = rows[("data files", "zero-length reads")]
    assert (zero["status"], zero["A"], zero["B"]) == ("not compared", None, None)
    assert not any(item == "the loop" for item, _ in rows)
    assert "not compared: zero-length reads (A and B from a Darshan log without DXT tracing, which does not count " \
           "them)" in d.io.labels  # fmt: skip
    assert any(
        lb.startswith("not compared: the loop's wait for data (A and B without iterations") for lb in d.io.labels
    )
    changed = d.io.facts["files_changed"]
    assert d.io.facts["files_listed"] == 10 < changed and d.io.truncated > 0


def test_a_live_run_and_a_darshan_log_compare_what_both_have(runs: dict[str, Path], darshan: tuple[Path, Path]) -> None:
    d = diff_profiles(runs["a"], darshan[0])
    rows = _rows(d)
    assert rows[("data files", "bytes read")]["status"] == "more"
    assert rows[("data files", "zero-length reads")]["A"] == FILES  # A counts them, B does not: not compared
    assert rows[("data files", "zero-length reads")]["status"] == "not compared"
    assert rows[("other files", "files")]["status"] == "not compared"  # Darshan leaves system directories out
    assert not any(item == "the loop" for item, _ in rows)
    assert any(lb.startswith("not compared: the loop's wait for data (B without iterations") for lb in d.io.labels)
    assert any(lb.startswith("A's I/O from the io level, B's from an imported Darshan log") for lb in d.io.labels)


def test_the_note_on_files_left_out_names_top_in_every_format(tmp_path: Path) -> None:
    from tests.analyze.io_store import data_file, files_store

    # 15 data files, each read twice as much in B: all change, the default --top lists 10 (20 in text and md)
    for name, scale in (("a", 1), ("b", 2)):
        files_store(tmp_path / f"{name}.duckdb", [data_file(5, f"/d/{i:02d}.bin", 1000 * scale * (i + 1), 2)
                                                   for i in range(15)]).close()  # fmt: skip
    a, b = str(tmp_path / "a.duckdb"), str(tmp_path / "b.duckdb")
    d = diff_profiles(a, b, top=4)
    assert d.io.facts["files_listed"] == 4 and d.io.truncated == 22  # two rows a file: bytes read, read time
    more = "22 more rows (the rows of the data files that changed less: a larger --top lists more, in every format)"
    assert more in d.to_markdown()
    console = Console(width=300, record=True, file=io.StringIO())
    console.print(d)
    assert more in " ".join(console.export_text().split())  # the caption wraps at the table's width
    proc = _xstack("diff", a, b, "--format", "csv")  # --top bounds the files in csv too: the note's "every format"
    assert proc.returncode == 0, proc.stderr
    files = {r["item"] for r in csv.DictReader(io.StringIO(proc.stdout)) if r["table"] == "diff.io"}
    assert len(files - {"data files", "other files"}) == 10


def test_one_file_s_read_time_counts_past_10_us_the_totals_past_1_us(tmp_path: Path) -> None:
    from tests.analyze.io_store import data_file, files_store

    # small: read in 3 us, then 6 us (noise at that size); big: 40 us, then 80 us; both read twice the bytes in B
    for name, scale in (("a", 1), ("b", 2)):
        rows = [data_file(5, "/d/small.bin", 1000 * scale, 1, read_ns=3_000 * scale),
                data_file(5, "/d/big.bin", 9000 * scale, 1, read_ns=40_000 * scale)]  # fmt: skip
        files_store(tmp_path / f"{name}.duckdb", rows).close()
    d = diff_profiles(tmp_path / "a.duckdb", tmp_path / "b.duckdb")
    rows = _rows(d)
    small, big = rows[("/d/small.bin", "read time")], rows[("/d/big.bin", "read time")]
    assert (small["delta"], small["status"], small["floor"]) == (3_000, "unchanged", "5% and 10 us")
    assert (big["delta"], big["status"], big["floor"]) == (40_000, "more", "5% and 10 us")
    assert rows[("/d/small.bin", "bytes read")]["status"] == "more"
    total = rows[("data files", "read time")]  # the totals keep the diff's floors
    assert (total["delta"], total["status"], total["floor"]) == (43_000, "more", "5% and 1 us")
    assert "at least 10 us" in d.io.notes


def test_a_read_time_moved_by_a_few_long_reads_is_said_to_be(tmp_path: Path) -> None:
    """A DataLoader's workers on 2 CPUs, the same 6,000 page-cached images read in both runs: B's read time was 27
    times A's (1.32 s against 48.6 ms), from reads descheduled for a scheduler tick (4 ms) each, while its median
    read took 3.65 us. The diff said "more" and nothing else."""
    from tests.analyze.io_store import MAIN, io_span
    from xstack.trace.sink import Sink
    from xstack.trace.store import RunInfo

    for name, slow in (("a", 0), ("b", 30), ("c", 0)):
        with Store.create(tmp_path / f"{name}.duckdb") as store:
            store.add_run(RunInfo(1, "reads", levels=["io"], config={"pid": MAIN}))
            sink = Sink(store, 1)
            for k in range(200):  # 200 reads of 2 us (c: 3 us), the last `slow` of them 4 ms
                dur = 4_000_000 if k >= 200 - slow else 3_000 if name == "c" else 2_000
                io_span(sink, k + 1, None, "read", 10_000 * k, dur, MAIN, f"/d/{k}.jpg", 4096, offset=0)
            sink.close()
    d = diff_profiles(tmp_path / "a.duckdb", tmp_path / "b.duckdb")
    assert _rows(d)[("data files", "read time")]["status"] == "more"
    assert (
        "read time: B's is 300.9 times its calls times their median (200 x 2.00 us = 400 us), A's 1.0 times (200 x "
        "2.00 us = 400 us): the change is in a few long calls, as a process descheduled inside a call (more runnable "
        "threads than CPUs) or a read from disk makes them; the longest 10% of B's reads (20, 4.00 ms or more each) "
        "took 66% of its read time"
    ) in d.io.labels
    d = diff_profiles(tmp_path / "a.duckdb", tmp_path / "c.duckdb")  # every read slower: no such label
    assert _rows(d)[("data files", "read time")]["status"] == "more"
    assert not any("times their median" in label for label in d.io.labels)


def test_files_in_each_run_s_temporary_folder_are_matched_past_its_random_name(tmp_path: Path) -> None:
    from tests.analyze.io_store import data_file, files_store
    from xstack.analyze._diff_io import run_key

    # each run wrote its data into a folder of its own from tempfile.mkdtemp(), and read it four times less in B
    for name, folder, scale in (("a", "/tmp/tmp86c2rbay", 4), ("b", "/tmp/tmpu6aspcqs", 1)):
        rows = [
            data_file(5, f"{folder}/data.h5", 2**20 * scale, 10, read_ns=10**6 * scale),
            data_file(5, f"/tmp/ds{name}x3vq9k2/log.txt", 100, 1),  # a name in each run, one file: paired
            data_file(5, f"/tmp/work/{name}.bin", 100, 1),
        ]  # not a tempfile folder: added and removed
        files_store(tmp_path / f"{name}.duckdb", rows).close()
    rows = _rows(diff_profiles(tmp_path / "a.duckdb", tmp_path / "b.duckdb"))
    read = rows[("/tmp/tmp*/data.h5", "bytes read")]
    assert (read["delta"], read["status"]) == (-3 * 2**20, "less")
    assert ("/tmp/ds*/log.txt", "bytes read") not in rows  # unchanged: matched, not listed
    assert rows[("/tmp/work/a.bin", "bytes read")]["status"] == "removed"
    assert rows[("/tmp/work/b.bin", "bytes read")]["status"] == "added"
    assert [run_key(p) for p in ("/tmp/datasets/x", "/tmp/tmpabcdefgh.pt", "/home/tmp86c2rbay/x")] == [
        None, "/tmp/tmp*.pt", None
    ]  # fmt: skip


def test_logs_are_matched_past_the_names_each_run_gives_them(tmp_path: Path) -> None:
    """A SummaryWriter names its file after the time, host and pid of the run: two runs of one program showed
    their event files as one removed and one added."""
    from tests.analyze.io_store import files_store
    from xstack.analyze._diff_io import run_key
    from xstack.trace import attrs as A

    for name, stamp, scale in (("a", "1795485348.vm.local.11803.0", 2), ("b", "1795485450.vm.local.12417.0", 1)):
        attrs = {A.IO_FILE_PATH_CLASS: "data", A.IO_FILE_MAX_BYTE_WRITTEN: 1000 * scale - 1}
        row = (5, f"/w/runs/events.out.tfevents.{stamp}", "POSIX", 1, 0, 10 * scale, 0, 0, 1000 * scale, 0, 50, 10,
               attrs)  # fmt: skip
        files_store(tmp_path / f"{name}.duckdb", [row]).close()
    rows = _rows(diff_profiles(tmp_path / "a.duckdb", tmp_path / "b.duckdb"))
    written = rows[("/w/runs/events.out.tfevents.*", "bytes written")]
    assert (written["delta"], written["status"]) == (-1000, "less")
    assert run_key("/tmp/tmpab12cd34/events.out.tfevents.1.h.2.0") == "/tmp/tmp*/events.out.tfevents.*"
    # the folders loggers and launchers name anew for each run
    assert [run_key(p) for p in (
        "/w/runs/Nov24_01-59-01_vm.local/events.out.tfevents.1.vm.local.2.0",  # SummaryWriter(), HF Trainer
        "/w/lightning_logs/version_3/metrics.csv",
        "/w/wandb/run-20261124_015901-3xk2a9/files/output.log",
        "/w/outputs/2026-11-24/01-59-01/train.log",  # Hydra
        "/data/2026-11-24.csv",  # a file's own name is the data's
        "/data/imgs/version_2",
    )] == ["/w/runs/*/events.out.tfevents.*", "/w/lightning_logs/version_*/metrics.csv",
           "/w/wandb/run-*/files/output.log", "/w/outputs/*/*/train.log", None, None]  # fmt: skip
    assert run_key("/w/events.out.tfevents.") is None  # nothing of a run's after the prefix
    # the inode the kernel names an unnamed temporary file by (O_TMPFILE: tempfile.TemporaryFile)
    assert [run_key(p) for p in ("/tmp/#2146589 (deleted)", "/data/#3 notes")] == ["/tmp/#* (deleted)", None]


def test_a_run_whose_workers_were_short_of_cpus_is_said_to_hold_their_waits_in_its_call_times(tmp_path: Path) -> None:
    """8 DataLoader workers on 2 CPUs against 2: the same 13,500 reads of the same page-cached images took 523 ms
    against 24.1 ms. The workers waited for a CPU 61% of the time they were ready to run, against 43%: a call that
    returns while they are short of CPUs lasts until one is free."""
    from tests.analyze.io_store import MAIN, W1, W2, loop_store
    from xstack.trace import attrs as A

    def cpu(pid: int, delay: int) -> dict[str, int]:
        return {"pid": pid, "start_ns": 0, "end_ns": 10**10, "cpu_ns": 6 * 10**8, "run_delay_ns": delay, "preempted": 5}

    for name, delay in (("a", 6 * 10**7), ("b", 9 * 10**8)):
        config = {"pid": MAIN, A.CONFIG_IO_PROCESS_CPU: [cpu(MAIN, 10**7), cpu(W1, delay), cpu(W2, delay)]}
        loop_store(tmp_path / f"{name}.duckdb", config=config).close()
    d = diff_profiles(tmp_path / "a.duckdb", tmp_path / "b.duckdb")
    assert d.io.facts["ready_wait_a_pct"] == pytest.approx(100 / 11)
    assert d.io.facts["ready_wait_b_pct"] == pytest.approx(60.0)
    assert (
        "B's workers waited for a CPU 60% of the time they were ready to run: a call that returns while they are "
        "short of CPUs lasts until one is free, so their read, write and metadata times hold waits for a CPU, not "
        "the storage's time alone"
    ) in d.io.labels
    d = diff_profiles(tmp_path / "a.duckdb", tmp_path / "a.duckdb")
    assert not any("waited for a CPU" in label for label in d.io.labels)
