"""The io level's path classes from what the calls say (a directory, the standard output's file), on hand-made
call sequences, and end to end: a program profiled with its output redirected to files."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import xstack
from xstack.collect._io_classes import PathClasses, process_roles
from xstack.collect._io_counters import file_counters
from xstack.trace import attrs as A
from xstack.trace.store import Store

PROGRAMS = Path(__file__).parent / "io_programs"


@dataclass
class Op:
    op: str
    path: str | None
    fd: int = 3
    fd_kind: str = "file"
    pid: int = 100
    errno: int = 0
    offset: int = -1
    bytes: int = -1
    start_ns: int = 0
    dur_ns: int = 10
    module: str = "POSIX"
    tid: int = 100
    requested: int = -1


def test_a_path_the_calls_found_to_be_a_directory_is_a_directory_wherever_it_is() -> None:
    ops = [
        Op("openat", "/data/train", fd_kind="dir"),
        Op("close", "/data/train", fd_kind="dir"),
        Op("stat", "/usr/lib/python3.11/json", fd=-1, fd_kind="dir"),
        Op("stat", "/data/gone", fd=-1, errno=2),
    ]
    classes = PathClasses(ops)
    assert classes.of("/data/train", "unknown") == "directory"  # a later failed call on it too
    assert classes.of("/usr/lib/python3.11/json", "dir") == "directory"
    assert classes.of("/data/gone", "unknown") == "data"  # nothing said it was a directory


def test_the_files_standard_output_and_error_went_to_are_streams() -> None:
    ops = [
        Op("write", "/home/u/out.txt", fd=1, bytes=5),  # inherited from the shell: `> out.txt`
        Op("write", "/home/u/err.txt", fd=2, pid=101, bytes=5),  # a worker, inherited from its parent
        Op("open", "/home/u/log.txt", fd=7),
        Op("dup", "/home/u/log.txt", fd=1, requested=7),  # dup2(log, 1): still the standard output
        Op("write", "/home/u/log.txt", fd=1, bytes=5),
        Op("open", "/data/a.bin", fd=2, pid=102),  # a process that closed 2 and opened a file on it
        Op("read", "/data/a.bin", fd=2, pid=102, bytes=5),
        Op("write", "/data/b.bin", fd=5, bytes=5),
        Op("write", None, fd=1, fd_kind="pipe", bytes=5),
    ]
    classes = PathClasses(ops)
    assert classes.outputs == {"/home/u/out.txt", "/home/u/err.txt", "/home/u/log.txt"}
    found = {c.path: c.attrs()[A.IO_FILE_PATH_CLASS] for c in file_counters(ops)}
    assert found == {"/home/u/out.txt": "stream", "/home/u/err.txt": "stream", "/home/u/log.txt": "stream",
                     "/data/a.bin": "data", "/data/b.bin": "data", "<pipe>": "stream"}  # fmt: skip


def test_tempfile_s_probe_of_a_temporary_folder_is_python() -> None:
    name = "/tmp/v52ns_va"
    probe = [Op("open", name, fd=9), Op("write", name, fd=9, bytes=4), Op("close", name)]
    lookalikes = [
        Op("open", "/tmp/labels01", fd=9), Op("write", "/tmp/labels01", fd=9, bytes=4),  # then read back: data
        Op("read", "/tmp/labels01", fd=9, bytes=4), Op("close", "/tmp/labels01"),
        Op("open", "/tmp/abcd1234", fd=9), Op("write", "/tmp/abcd1234", fd=9, bytes=400), Op("close", "/tmp/abcd1234"),
        Op("open", "/data/v52ns_vb", fd=9), Op("write", "/data/v52ns_vb", fd=9, bytes=4), Op("close", "/data/v52ns_vb"),
    ]  # fmt: skip
    classes = PathClasses(probe + lookalikes)
    assert classes.probes == {"/tmp/v52ns_va"}
    assert [classes.of(p, "file") for p in ("/tmp/v52ns_va", "/tmp/labels01", "/tmp/abcd1234", "/data/v52ns_vb")] == [
        "python", "data", "data", "data"
    ]  # fmt: skip


@dataclass
class Process:
    pid: int
    argv: list[str]
    forked: bool = False
    ppid: int = 1
    start_ns: int = 0


def test_the_helpers_of_multiprocessing_are_told_by_their_command_lines() -> None:
    python = "/venv/bin/python"
    processes = [
        Process(10, [python, "train.py"]),
        Process(11, [python, "-B", "-c", "from multiprocessing.resource_tracker import main;main(6)"]),
        Process(12, [python, "-c", "from multiprocessing.forkserver import main; main(9, 10, ['__main__'], **{})"]),
        Process(13, [python, "-c", "from multiprocessing.forkserver import main; main(9)"], forked=True),  # a worker
        Process(14, [python, "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=7, "
                     "pipe_handle=13)", "--multiprocessing-fork"]),  # a spawned worker
        Process(15, [python, "-c", "print('from multiprocessing.resource_tracker import mainly')"]),
    ]  # fmt: skip
    assert process_roles(processes) == {11: "resource_tracker", 12: "forkserver"}  # type: ignore[arg-type]


def test_programs_started_by_exec_are_subprocesses_not_workers() -> None:
    python = "/venv/bin/python"
    processes = [
        Process(10, [python, "-m", "xstack", "run", "--", "train.py"], ppid=9),  # the root: its parent is not traced
        Process(11, [python, "train.py"], forked=True, ppid=10, start_ns=1),  # a forked DataLoader worker
        Process(12, [python, "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=7, "
                     "pipe_handle=13)", "--multiprocessing-fork"], ppid=10, start_ns=2),  # a spawned worker
        Process(13, [python, "train.py"], forked=True, ppid=10, start_ns=3),  # subprocess.run forks, then execs
        Process(13, ["/bin/sh", "-c", "cat x > /dev/null"], ppid=10, start_ns=4),
        Process(14, ["/bin/sh", "-c", "cat x > /dev/null"], forked=True, ppid=13, start_ns=5),  # sh forks cat
        Process(14, ["cat", "x"], ppid=13, start_ns=6),
        Process(15, [python, "-c", "open('x').read()"], ppid=11, start_ns=7),  # run by a worker
        Process(16, [python, "-c", "from multiprocessing.resource_tracker import main;main(6)"], ppid=10,
                start_ns=8),
    ]  # fmt: skip
    assert process_roles(processes) == {  # type: ignore[arg-type]
        13: "subprocess", 14: "subprocess", 15: "subprocess", 16: "resource_tracker"
    }  # fmt: skip


def _unavailable() -> str | None:
    from xstack.collect.io import IoCollector

    return IoCollector().unavailable_reason()


@pytest.mark.skipif(_unavailable() is not None, reason=f"io level unavailable: {_unavailable()}")
def test_a_profiled_program_s_files_are_classed_by_what_they_are(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        (data / f"{i}.bin").write_bytes(b"x" * 100)
    src = tmp_path / "src"  # what `pip install -e` leaves beside the package's source: its metadata
    for name in ("mypkg", "xstack"):
        (src / f"{name}.egg-info").mkdir(parents=True)
        (src / f"{name}.egg-info" / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (src / f"{name}.egg-info" / "entry_points.txt").write_text(f"[console_scripts]\n{name} = {name}:main\n")
    store, out, err = tmp_path / "c.duckdb", tmp_path / "out.txt", tmp_path / "err.txt"
    script = PROGRAMS / "path_classes.py"
    with out.open("wb") as stdout, err.open("wb") as stderr:  # xstack run ... > out.txt 2> err.txt
        command = [sys.executable, "-m", "xstack", "run", "--levels", "model,io", "-o", str(store), "--", "python",
                   str(script), str(data), str(src)]  # fmt: skip
        done = subprocess.run(command, stdout=stdout, stderr=stderr, timeout=240)
    assert done.returncode == 0, err.read_text()
    assert out.read_text() == "read\nchild\n" and "warned" in err.read_text()  # the program's output is intact
    with Store.open(store) as s:
        classes: dict[str, set[str]] = {}
        for path, cls in s.query(f"SELECT path, attrs->>'$.{A.IO_FILE_PATH_CLASS}' FROM io_files"):
            classes.setdefault(path, set()).add(cls)
        spans = dict(s.query(f"""SELECT attrs->>'$."{A.IO_PATH}"', any_value(attrs->>'$."{A.IO_PATH_CLASS}"')
                                 FROM spans WHERE level = 'io' GROUP BY 1"""))  # fmt: skip
    package = Path(xstack.__file__).parent
    expected = {
        **{str(data / f"{i}.bin"): "data" for i in range(3)},
        str(data): "directory",
        str(out): "stream",
        str(err): "stream",
        str(script): "python",
        str(package / "runner.py"): "profiler",
        str(src / "mypkg.egg-info" / "entry_points.txt"): "python",
        str(src / "xstack.egg-info" / "entry_points.txt"): "profiler",
    }
    venv = Path(sys.prefix) / "pyvenv.cfg"
    if venv.exists():  # the second interpreter reads it as it starts
        expected[str(venv)] = "python"
    assert {path: classes.get(path) for path in expected} == {path: {cls} for path, cls in expected.items()}
    assert {path: spans.get(path) for path in expected} == expected
    data_paths = {path for path, cls in classes.items() if "data" in cls}
    assert data_paths == {str(data / f"{i}.bin") for i in range(3)}, data_paths


@pytest.fixture(scope="module")
def spawned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, Path]]:
    """A program that starts a worker as multiprocessing's spawn mode does, profiled with the io level; the store
    (open read-only) and the worker's data file."""
    if _unavailable() is not None:
        pytest.skip(f"io level unavailable: {_unavailable()}")
    tmp = tmp_path_factory.mktemp("spawned")
    data = tmp / "data.txt"
    data.write_text("hello")
    store = tmp / "s.duckdb"
    command = [sys.executable, "-m", "xstack", "run", "--levels", "model,io", "-o", str(store), "--", "python",
               str(PROGRAMS / "spawn_workers.py"), str(data)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and done.stdout == "copied hello\n", done.stderr
    with Store.open(store) as s:
        yield s, data


def test_a_spawned_worker_s_shared_and_temporary_files_are_not_data(spawned: tuple[Store, Path]) -> None:
    store, data = spawned
    classes: dict[str, set[str]] = {}
    for path, cls in store.query(f"""SELECT attrs->>'$."{A.IO_PATH}"', attrs->>'$."{A.IO_PATH_CLASS}"'
                                     FROM spans WHERE level = 'io'"""):  # fmt: skip
        classes.setdefault(str(path), set()).add(str(cls))
    # the worker's interpreter looks for pythonXY.zip and ._pth files as it starts: python, not data
    assert {path for path, cls in classes.items() if "data" in cls} == {str(data)}
    shared = [path for path in classes if path.startswith("/dev/shm/psm_")]  # multiprocessing.shared_memory
    sockets = [path for path in classes if "/pymp-" in path and "/listener-" in path]  # the worker's listener
    assert shared and sockets and all(classes[p] == {"ipc"} for p in shared + sockets)
    probes = [p for p in classes if Path(p).parent == Path(tempfile.gettempdir()) and len(Path(p).name) == 8]
    assert probes and all(classes[p] == {"python"} for p in probes)  # tempfile's, as the worker made its folder


def test_the_resource_tracker_is_not_a_worker(spawned: tuple[Store, Path]) -> None:
    from xstack.analyze.io import input_wait, process_table

    store, _ = spawned
    processes = process_table(store, 1)
    roles = sorted(r["role"] for r in processes.to_records())
    assert roles == ["main", "resource tracker", "worker"]
    assert processes.facts["workers"] == input_wait(store, 1).facts["workers"] == 1


def test_a_subprocess_s_io_is_its_own_not_a_worker_s(tmp_path: Path) -> None:
    """A program that reads a file in a child Python (subprocess.run), has cat read another (os.system) and a
    forked worker read a third: each read is counted in its own process, the children's as subprocesses."""
    if _unavailable() is not None:
        pytest.skip(f"io level unavailable: {_unavailable()}")
    from xstack.analyze.io import input_wait, process_table

    files = {name: tmp_path / f"{name}.bin" for name in ("child", "cat", "worker")}
    for i, path in enumerate(files.values()):
        path.write_bytes(b"x" * (1000 + i))
    program = tmp_path / "children.py"
    program.write_text(
        textwrap.dedent(f"""
        import multiprocessing, os, subprocess, sys
        subprocess.run([sys.executable, "-c", "open({str(files["child"])!r}, 'rb').read()"], check=True)
        os.system("cat {files["cat"]} > /dev/null")
        worker = multiprocessing.get_context("fork").Process(target=lambda: open({str(files["worker"])!r}, "rb").read())
        worker.start()
        worker.join()
    """)
    )
    store = tmp_path / "c.duckdb"
    command = [sys.executable, "-m", "xstack", "run", "--levels", "model,io", "-o", str(store), "--", "python",
               str(program)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    with Store.open(store) as s:
        read = {str(path): (int(pid), int(n)) for path, pid, n in s.query(
            "SELECT path, pid, bytes_read FROM io_files WHERE bytes_read > 0 AND path IN (?, ?, ?)",
            [str(p) for p in files.values()])}  # fmt: skip
        assert {path: n for path, (_, n) in read.items()} == {str(p): p.stat().st_size for p in files.values()}
        table = process_table(s, 1)
        role = {r["pid"]: r["role"] for r in table.to_records()}
        assert [role[read[str(files[name])][0]] for name in ("child", "cat", "worker")] == [
            "subprocess", "subprocess", "worker"
        ]  # fmt: skip
        assert table.facts["workers"] == input_wait(s, 1).facts["workers"] == 1
