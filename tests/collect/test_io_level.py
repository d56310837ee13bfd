"""The io level end to end: ``xstack run``/``xstack profile`` preload the interposer into a real program and its
workers, and the store holds every file operation (io spans) and Darshan-style per-file counters (io_files)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest

from xstack.analyze._system_common import STEP_SPAN
from xstack.analyze.pipeline import analyze
from xstack.trace import attrs as A
from xstack.trace.store import Store

PROGRAMS = Path(__file__).parent / "io_programs"

SIZES = {"full.bin": 10_000, "partial.bin": 50_000, "twice.bin": 3_000, "seeks.bin": 10_000, "array.bin": 16_384,
         "chunked.bin": 20_000, "child.bin": 7_777, **{f"thread{i}.bin": 2_048 for i in range(4)}}  # fmt: skip
READ = {"full.bin": 10_000, "partial.bin": 1_000, "twice.bin": 6_000, "seeks.bin": 250, "chunked.bin": 20_000,
        "child.bin": 7_777, **{f"thread{i}.bin": 2_048 for i in range(4)}}  # fmt: skip


def _unavailable() -> str | None:
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("numpy") is None:
        return "PyTorch and NumPy are not installed"
    from xstack.collect.io import IoCollector

    return IoCollector().unavailable_reason()


pytestmark = pytest.mark.skipif(_unavailable() is not None, reason=f"io level unavailable: {_unavailable()}")


def _xstack(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "xstack", *args], capture_output=True, text=True, timeout=240,
                          cwd=cwd)  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("io-data")
    for name, size in SIZES.items():
        (root / name).write_bytes(os.urandom(size))
    return root


def _files(store: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """(file name, module) -> counters summed over processes, for the files of ``data``."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    with Store.open(store) as s:
        for path, module, opens, reads, writes, seeks, br, bw, pid, attrs in s.query(
            "SELECT path, module, opens, reads, writes, seeks, bytes_read, bytes_written, pid, attrs FROM io_files "
            "WHERE path LIKE '%.bin'"
        ):
            row = out.setdefault((Path(path).name, module), {"opens": 0, "reads": 0, "writes": 0, "seeks": 0,
                                                             "bytes_read": 0, "bytes_written": 0, "pids": set(),
                                                             "attrs": []})  # fmt: skip
            for key, value in zip(("opens", "reads", "writes", "seeks", "bytes_read", "bytes_written"),
                                  (opens, reads, writes, seeks, br, bw), strict=True):  # fmt: skip
                row[key] += value
            row["pids"].add(pid)
            row["attrs"].append(orjson.loads(attrs))
    return out


@pytest.fixture(scope="module")
def known(tmp_path_factory: pytest.TempPathFactory, data: Path) -> Path:
    store = tmp_path_factory.mktemp("io-run") / "known.duckdb"
    done = _xstack("run", "--levels", "model,io", "-o", str(store), "--", "python",
                   str(PROGRAMS / "known_reads.py"), str(data))  # fmt: skip
    assert done.returncode == 0, done.stderr
    return store


def test_byte_counts_per_file_are_exact(known: Path) -> None:
    files = _files(known)
    for name, expected in READ.items():
        assert files[(name, "POSIX")]["bytes_read"] == expected, name
    assert files[("array.bin", "STDIO")]["bytes_read"] == 16_384  # numpy.fromfile reads through stdio
    assert files[("out.bin", "POSIX")]["bytes_written"] == 12_345
    assert files[("twice.bin", "POSIX")]["opens"] == 2
    assert files[("seeks.bin", "POSIX")]["seeks"] == 2
    chunked = files[("chunked.bin", "POSIX")]
    assert chunked["reads"] == 6 and chunked["attrs"][0]["zero_reads"] == 1  # 4 x 4096, 3616, then EOF
    assert chunked["attrs"][0]["consec_reads"] == 5
    seeks = files[("seeks.bin", "POSIX")]["attrs"][0]
    assert seeks["max_byte_read"] == 9_999 and seeks["seq_reads"] == 2 and seeks["consec_reads"] == 0


def test_a_program_that_never_imports_torch_is_not_made_to(tmp_path: Path) -> None:
    # the model level hooks PyTorch when the program imports it: importing it first read thousands of files in
    # the region, which the io level kept as the program's own
    script = tmp_path / "plain.py"
    script.write_text("import sys, xstack\nwith xstack.span('load'):\n    open(sys.argv[0], 'rb').read()\n"
                      "print('torch' in sys.modules)\n")  # fmt: skip
    store = tmp_path / "plain.duckdb"
    done = _xstack("run", "--levels", "model,io", "-o", str(store), "--", "python", str(script))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "False"
    with Store.open(store) as s:
        torch_files, reads = s.query(
            f"SELECT count(*) FILTER (WHERE attrs->>'$.\"{A.IO_PATH}\"' LIKE '%/torch/%'), "
            f"count(*) FILTER (WHERE name = 'read' AND attrs->>'$.\"{A.IO_PATH}\"' = ?) FROM spans "
            "WHERE level = 'io'",
            [str(script)],
        )[0]
        stages = s.query("SELECT name FROM spans WHERE level = 'model'")
    assert torch_files == 0 and reads >= 1 and ("load",) in stages


def test_a_file_read_through_a_memory_mapping_is_said_to_be_left_out(tmp_path: Path) -> None:
    """``numpy.memmap`` (nanoGPT's loader) reads through page faults, which no call records: the file showed 0 B
    read, as if the program had not read it."""
    data = tmp_path / "train.bin"
    data.write_bytes(os.urandom(1 << 20))
    script = tmp_path / "mapped.py"
    script.write_text(textwrap.dedent(f"""
        import numpy as np, xstack
        for _ in range(3):
            with xstack.span("load"):
                tokens = np.memmap({str(data)!r}, dtype=np.uint16, mode="r")
                print(int(tokens[1000:1256].astype(np.int64).sum()) >= 0)
            xstack.step()
    """))  # fmt: skip
    store = tmp_path / "mapped.duckdb"
    done = _xstack("run", "--levels", "model,io", "-o", str(store), "--", "python", str(script))
    assert done.returncode == 0, done.stderr
    summary = _xstack("summary", str(store))
    said = "1 data file mapped into memory (1.00 MiB): what the program reads through a mapping is page faults"
    assert said in " ".join(summary.stdout.split()), summary.stdout
    with Store.open(store) as s:
        results = {r.id: r for r in analyze(s, None, ["io.files", "io.input_bound"]).results}
    for id in ("io.files", "io.input_bound"):
        assert any(label.startswith(said) for label in results[id].labels), results[id].labels
    assert (results["io.files"].facts["mapped_files"], results["io.files"].facts["mapped_bytes"]) == (1, 1 << 20)


NOT_UTF8 = textwrap.dedent(
    """
    import os, subprocess, sys
    import xstack
    name = os.fsencode(sys.argv[1]) + b"/caf\\xe9.bin"  # Latin-1's café.bin
    with xstack.span("load"):
        with open(name, "wb") as f:
            f.write(b"x" * 123)
        with open(name, "rb") as f:
            f.read()
        subprocess.run([b"/bin/cat", name], check=True, stdout=subprocess.DEVNULL)
    """
)


def test_a_file_name_that_is_not_utf8_is_kept_with_its_other_bytes_escaped(tmp_path: Path) -> None:
    """A file name is bytes to the kernel: one that is not UTF-8 made every io span and counter of the run unreadable
    into the store (no JSON holds Python's lone surrogates), and the run kept no io level at all."""
    script = tmp_path / "latin1.py"
    script.write_text(NOT_UTF8)
    store = tmp_path / "latin1.duckdb"
    done = _xstack("run", "--levels", "model,io", "-o", str(store), "--", "python", str(script), str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "could not be read" not in done.stderr
    name = f"{tmp_path}/caf\\xe9.bin"
    with Store.open(store) as s:
        files = s.query("SELECT pid, bytes_read, bytes_written FROM io_files WHERE path = ? ORDER BY pid", [name])
        spans = s.query(f"SELECT count(*) FROM spans WHERE level = 'io' AND attrs->>'$.\"{A.IO_PATH}\"' = ?", [name])
        config = orjson.loads(s.query("SELECT config FROM runs")[0][0])
    assert sorted((r, w) for _, r, w in files) == [(123, 0), (123, 123)]  # cat's, then the program's
    assert spans[0][0] >= 6
    (cat,) = [p for p in config[A.CONFIG_IO_PROGRAMS] if p["program"] == "cat"]
    assert cat["command"] == f"/bin/cat {name}"


def test_calls_outside_the_region_are_counted_not_kept(known: Path) -> None:
    # the interpreter's start-up (imports) runs before the profiled region: its file operations are told apart
    with Store.open(known) as s:
        kept = s.query("SELECT count(*) FROM spans WHERE level = 'io'")[0][0]
        count, detail = s.query("SELECT count, detail FROM health WHERE \"check\" = 'io_outside_region'")[0]
    assert count > 0 and detail.startswith("file operations before or after the profiled region (start-up")
    # main, forked child
    assert detail.endswith(f"not kept; the {kept:,} in it, from 2 processes, are kept"), (kept, detail)


def test_threads_and_forked_child_are_seen_with_their_own_ids(known: Path) -> None:
    files = _files(known)
    with Store.open(known) as s:
        main_pid = s.query("SELECT DISTINCT pid FROM spans WHERE level = 'model'")[0][0]
        thread_tids = s.query(
            "SELECT count(DISTINCT tid) FROM spans WHERE level = 'io' AND attrs->>'$.\"io.path\"' LIKE '%thread_.bin'"
        )[0][0]
    assert thread_tids == 4
    assert files[("child.bin", "POSIX")]["pids"] != {main_pid}


def test_io_spans_hang_from_the_stage_open_on_their_thread(known: Path) -> None:
    with Store.open(known) as s:
        rows = s.query(
            "SELECT regexp_extract(io.attrs->>'$.\"io.path\"', '[^/]+$'), p.name FROM spans io "
            "LEFT JOIN spans p ON p.run_id = io.run_id AND p.span_id = io.parent_id "
            "WHERE io.level = 'io' AND io.name IN ('read', 'write') AND io.attrs->>'$.\"io.path\"' LIKE '%.bin'"
        )
        levels = s.query("SELECT levels FROM runs")[0][0]
    parents = {}
    for name, parent in rows:
        parents.setdefault(name, set()).add(parent)
    assert parents["full.bin"] == {"load"}
    assert parents["out.bin"] == {"postprocess"}
    assert parents["child.bin"] == {None}  # another process: no model span of its own
    assert all(parents[f"thread{i}.bin"] == {None} for i in range(4))  # other threads have no open span
    assert "io" in levels


def test_a_crashing_program_keeps_its_io_and_its_exit_code(tmp_path: Path, data: Path) -> None:
    store = tmp_path / "crash.duckdb"
    done = _xstack("run", "--levels", "model,io", "-o", str(store), "--", "python",
                   str(PROGRAMS / "known_reads.py"), str(data), "crash")  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "crashed on purpose" in done.stderr
    files = _files(store)
    assert files[("out.bin", "POSIX")]["bytes_written"] == 12_345
    with Store.open(store) as s:
        config = orjson.loads(s.query("SELECT config FROM runs")[0][0])
    assert config["status"] == "cut_short"


@pytest.mark.parametrize("failure", ["error", "ctrl-c", "ctrl-c in a query"])
def test_records_that_cannot_be_read_back_are_kept_for_recover(
    tmp_path: Path, data: Path, failure: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reading the records back once the program ended fails (an error, or Ctrl-C while a long read-back runs):
    the program's profile and exit code stand, the run says its io was not read and where the records are, and
    ``xstack recover`` reads them in later, as the run would have."""
    from xstack.analyze.health import run_health
    from xstack.cli.main import main
    from xstack.collect import _io_records, io
    from xstack.errors import BadInputError

    store = tmp_path / "unread.duckdb"
    program = f"import sys; open({str(data / 'full.bin')!r}, 'rb').read(); sys.exit(3)"
    read_records = _io_records.read_records

    def fail(directory: Path) -> Any:
        read_records(directory)  # (reads them whole, then fails as a later step would)
        if failure == "ctrl-c":
            raise KeyboardInterrupt
        if failure == "ctrl-c in a query":  # what DuckDB raises where a Ctrl-C stops its query
            raise RuntimeError("Query interrupted")
        raise BadInputError(f"{directory}/x.xio: cut short on purpose")

    monkeypatch.setattr(_io_records, "read_records", fail)
    monkeypatch.setattr(io, "ANNOUNCED_BYTES", 0)  # as for a run of many calls
    assert main(["run", "--levels", "model,io", "-o", str(store), "--", "python", "-c", program]) == 3
    folder = tmp_path / "unread.io"
    err = capsys.readouterr().err
    assert f"kept in {folder}; `xstack recover {store}` reads them in" in err
    assert "reading the io level's records back (0 MiB, about" in err and f"`xstack recover {store}`)" in err
    assert ("cut short on purpose" if failure == "error" else "interrupted by Ctrl-C") in err
    assert any(folder.glob("*.xio"))
    with Store.open(store) as s:
        assert s.query("SELECT count(*) FROM spans WHERE level = 'io'")[0][0] == 0
        assert s.query("""SELECT count(*) FROM health WHERE "check" = 'io_not_read'""")[0][0] == 1
        config = orjson.loads(s.query("SELECT config FROM runs")[0][0])
        assert config[A.CONFIG_IO_UNREAD] == str(folder) and "io" not in s.query("SELECT levels FROM runs")[0][0]
        assert [c for c, _, _ in run_health(s, 1).findings] == ["io_not_read"]  # a finding, in every report

    monkeypatch.setattr(_io_records, "read_records", read_records)
    assert main(["recover", str(store)]) == 0
    assert "run 1's io records read in from" in capsys.readouterr().err
    assert not folder.exists()
    assert _files(store)[("full.bin", "POSIX")]["bytes_read"] == 10_000
    with Store.open(store) as s:
        assert s.query("""SELECT count(*) FROM health WHERE "check" = 'io_not_read'""")[0][0] == 0
        assert A.CONFIG_IO_UNREAD not in orjson.loads(s.query("SELECT config FROM runs")[0][0])
        assert "io" in s.query("SELECT levels FROM runs")[0][0]
    assert main(["recover", str(store)]) == 1  # once read in, the run has nothing left to recover
    assert "and no run whose io records were kept unread" in capsys.readouterr().err


def test_records_kept_unread_go_with_the_store_force_replaces(
    tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run into a store whose earlier run keeps its io records unread records into another folder, and where
    ``--force`` replaced that store, the earlier run's records go too: nothing could read them in any more. Added
    with ``--append``, the earlier run stays, and so do its records."""
    from xstack.cli.main import main
    from xstack.collect import _io_records
    from xstack.collect.io import unread
    from xstack.errors import BadInputError

    def fail(directory: Path) -> Any:
        raise BadInputError(f"{directory}: cut short on purpose")

    monkeypatch.setattr(_io_records, "read_records", fail)
    store, program = tmp_path / "s.duckdb", f"open({str(data / 'full.bin')!r}, 'rb').read()"
    first, second, third = tmp_path / "s.io", tmp_path / "s.io.2", tmp_path / "s.duckdb.append.io"
    assert main(["run", "--levels", "model,io", "-o", str(store), "--", "python", "-c", program]) == 0
    assert main(["run", "--levels", "model,io", "-o", str(store), "--force", "--", "python", "-c", program]) == 0
    assert not first.exists() and any(second.glob("*.xio"))
    assert main(["run", "--levels", "model,io", "-o", str(store), "--append", "--", "python", "-c", program]) == 0
    assert any(second.glob("*.xio")) and any(third.glob("*.xio"))
    assert unread(store) == [(1, second), (2, third)]


_KILLED_READING = """
import os, signal, sys
from xstack.cli.main import main
from xstack.collect import _io_records

_io_records.read_records = lambda directory: os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer
main(["run", "--levels", "model,io", "-o", sys.argv[1], "--", "python", "-c", sys.argv[2]])
"""


def test_records_whose_read_back_was_killed_are_kept_for_recover(tmp_path: Path, data: Path) -> None:
    """The xstack process killed outright as it reads the records back (out of memory on a long run): the run was
    marked before the reading began, so it says where they are, and ``xstack recover`` reads them in."""
    store = tmp_path / "killed.duckdb"
    program = f"open({str(data / 'full.bin')!r}, 'rb').read()"
    done = subprocess.run([sys.executable, "-c", _KILLED_READING, str(store), program], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == -9, done.stderr
    folder = tmp_path / "killed.io"
    with Store.open(store) as s:
        assert s.query("SELECT count(*) FROM spans WHERE level = 'io'")[0][0] == 0
        (detail,) = s.query("""SELECT detail FROM health WHERE "check" = 'io_not_read'""")[0]
        assert "xstack stopped while it read them" in detail and str(folder) in detail
    # the store and its records copied elsewhere together (another machine): found beside the store
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    store.rename(moved / store.name)
    folder.rename(moved / folder.name)
    recovered = _xstack("recover", str(moved / store.name))
    assert recovered.returncode == 0, recovered.stderr
    assert f"read in from {moved / folder.name}" in recovered.stderr
    assert _files(moved / store.name)[("full.bin", "POSIX")]["bytes_read"] == 10_000
    assert not (moved / folder.name).exists()


DATALOADER = textwrap.dedent(
    """
    import os, sys
    import torch
    from torch.utils.data import DataLoader, Dataset
    import xstack

    class Files(Dataset):
        def __init__(self, root):
            self.paths = sorted(os.path.join(root, n) for n in os.listdir(root))
        def __len__(self):
            return len(self.paths)
        def __getitem__(self, i):
            with open(self.paths[i], "rb") as f:
                return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).float().sum()

    model = torch.nn.Linear(8, 8)
    loader = DataLoader(Files(sys.argv[1]), batch_size=8, num_workers=2)
    for epoch in range(100):
        for batch in loader:
            model(torch.randn(4, 8)).sum().backward()
            xstack.step()
    """
)


def test_profile_io_pass_covers_dataloader_workers(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    for i in range(64):
        (files / f"{i:03d}.bin").write_bytes(os.urandom(1024))
    script = tmp_path / "train.py"
    script.write_text(DATALOADER)
    store = tmp_path / "train.duckdb"
    done = _xstack("profile", "--pass", "model", "--pass", "model,layer", "--io", "--warmup", "1", "--iters", "3",
                   "-o", str(store), "--", "python", str(script), str(files))  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Store.open(store) as s:
        runs = {p: (rid, lv) for rid, p, lv in s.query("SELECT run_id, pass, levels FROM runs")}
        io_run, merged = runs["model+io"][0], runs["merged"][0]
        assert "io" in runs["merged"][1]
        workers = s.query(
            "SELECT count(DISTINCT pid) FROM io_files WHERE run_id = ? AND path LIKE ? AND bytes_read = 1024 * opens",
            [io_run, f"{files}/%"],
        )[0][0]
        main = s.query("SELECT any_value(pid) FROM spans WHERE run_id = ? AND level = 'model'", [io_run])[0][0]
        worker_pids = s.query("SELECT DISTINCT pid FROM io_files WHERE run_id = ? AND path LIKE ?",
                              [io_run, f"{files}/%"])  # fmt: skip
        merged_files = s.query("SELECT count(*) FROM io_files WHERE run_id = ?", [merged])[0][0]
        merged_io = s.query("SELECT count(*) FROM spans WHERE run_id = ? AND level = 'io'", [merged])[0][0]
        # each pass ran in its own process; the merged iteration is one process and thread, the config's pid
        threads = s.query("SELECT DISTINCT pid, tid FROM spans WHERE run_id = ? AND level IN ('model', 'layer')",
                          [merged])  # fmt: skip
        merged_config = orjson.loads(s.query("SELECT config FROM runs WHERE run_id = ?", [merged])[0][0])
        io_steps = s.query(f"SELECT median(dur_ns) FROM spans WHERE run_id = ? AND {STEP_SPAN} AND name <> 'step#0'",
                           [io_run])[0][0]  # fmt: skip
        model_threads = s.query("SELECT config->>'$.torch_threads' FROM runs WHERE pass = 'model'")[0][0]
        config_pid = merged_config["pid"]
        merged_pids = {p for (p,) in s.query("SELECT DISTINCT pid FROM io_files WHERE run_id = ?", [merged])}
        analysis = analyze(s, merged)
    assert workers == 2 and main not in {p for (p,) in worker_pids}
    # the merged run keeps the DataLoader and the CPUs the model pass recorded
    loaders = merged_config["dataloaders"]
    assert [(d["dataset"], d["num_workers"], d["batch_size"]) for d in loaders] == [("Files", 2, 8)]
    assert merged_config["cpu_count"] == len(os.sched_getaffinity(0))
    assert merged_config["torch_threads"] == int(model_threads) > 0  # what a CPU's calibration is compared with
    assert merged_files > 0 and merged_io > 0
    assert len(threads) == 1 and threads[0][0] == config_pid
    assert config_pid in merged_pids and {p for (p,) in worker_pids} <= merged_pids  # main's counters: main's pid
    labels = [str(r[0]) for r in analysis.result("io.processes").rows]
    assert [label for label in labels if label.startswith("main")] == [f"main (pid {config_pid})"], labels
    # the io pass's cost is stated, against the pass that records its other levels
    (io_row,) = [o for o in merged_config["overhead"] if o["pass"] == "model+io"]
    assert (io_row["levels_added"], io_row["against"], io_row["iterations"]) == (["io"], "model", 3)
    assert io_row["step_median_ns"] == round(io_steps)
    assert [o["pass"] for o in merged_config["overhead"]] == ["model", "model+layer", "model+io"]


ATTACH = textwrap.dedent(
    """
    import os, sys, time
    import xstack
    data = sys.argv[1]
    with open(os.path.join(data, "before.bin"), "rb") as f:
        f.read()
    with xstack.profile(levels="model,io", path=sys.argv[2]) as prof:
        for _ in range(3):  # iterations longer than the journal's 0.02 s: each end writes to it
            with xstack.span("load"):
                with open(os.path.join(data, "inside.bin"), "rb") as f:
                    f.read()
            time.sleep(0.05)
            prof.step()
    with open(os.path.join(data, "after.bin"), "rb") as f:
        f.read()
    """
)


def test_in_process_profile_attaches_at_run_time(tmp_path: Path) -> None:
    for name in ("before", "inside", "after"):
        (tmp_path / f"{name}.bin").write_bytes(b"y" * 321)
    script = tmp_path / "attach.py"
    script.write_text(ATTACH)
    store = tmp_path / "attach.duckdb"
    done = subprocess.run([sys.executable, str(script), str(tmp_path), str(store)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Store.open(store) as s:
        paths = {Path(p).name: br for p, br in s.query("SELECT path, bytes_read FROM io_files WHERE path LIKE '%.bin'")}
        health = {c: d for c, n, d in s.query('SELECT "check", count, detail FROM health') if n}
        data = {p for (p,) in s.query("SELECT DISTINCT path FROM io_files WHERE attrs->>'path_class' = 'data'")}
    assert paths == {"inside.bin": 3 * 321}
    assert "io_attached" in health
    # the profile's journal beside its store (attach.duckdb.journal/), written while the store is attach.duckdb.partial,
    # is the profiler's own: it was a data file written at each iteration
    assert data == {str(tmp_path / "inside.bin")}


OPS_AND_IO = textwrap.dedent(
    """
    import sys
    import torch
    import xstack

    model = torch.nn.Linear(8, 8)
    for _ in range(3):
        with open(sys.argv[1], "rb") as f:
            f.read()
        model(torch.randn(4, 8)).sum().backward()
        xstack.step()
    """
)


def test_the_op_levels_scratch_trace_is_not_the_programs_io(tmp_path: Path) -> None:
    (tmp_path / "sample.bin").write_bytes(b"z" * 500)
    script = tmp_path / "ops.py"
    script.write_text(OPS_AND_IO)
    store = tmp_path / "ops.duckdb"
    done = _xstack("run", "--levels", "model,op,io", "-o", str(store), "--", "python", str(script),
                   str(tmp_path / "sample.bin"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Store.open(store) as s:
        data = {p for (p,) in s.query("SELECT DISTINCT path FROM io_files WHERE attrs->>'path_class' = 'data'")}
        ops = s.query("SELECT count(*) FROM spans WHERE level = 'op'")[0][0]
    # torch.profiler's trace, which the op level writes to a scratch folder as the run ends, is xstack's own
    assert ops > 0 and data == {str(tmp_path / "sample.bin")}
