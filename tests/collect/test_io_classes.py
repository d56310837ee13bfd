"""The io level's path classes from what the calls say (a directory, the standard output's file), on hand-made
call sequences, and end to end: a program profiled with its output redirected to files."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import xstack
from xstack.collect._io_classes import PathClasses, build_processes, process_roles
from xstack.collect._io_counters import file_counters
from xstack.collect._process_roles import process_roles as system_roles
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


def test_a_path_that_holds_another_is_a_directory() -> None:
    """os.open(folder) without O_DIRECTORY, then the files opened with it as their dir_fd (os.fwalk does): the
    folder was a data file, one more in the counts of the program's data."""
    ops = [
        Op("open", "/data/train", fd=3),
        Op("openat", "/data/train/0.bin", fd=4),
        Op("read", "/data/train/0.bin", fd=4, bytes=100),
        Op("open", "/data/val", fd=5),  # nothing opened inside it: nothing says it is a folder
        Op("stat", "/data/train/sub/x/1.bin", fd=-1),
        Op("open", "/data/train/sub", fd=6),
        Op("stat", "/data/gone/a.bin", fd=-1, errno=2),  # a failed call says nothing of its folder
        Op("open", "/data/gone", fd=7),
    ]
    classes = PathClasses(ops)
    assert [classes.of(p, "file") for p in ("/data/train", "/data/train/sub", "/data/val", "/data/gone")] == [
        "directory", "directory", "data", "data"]  # fmt: skip
    assert classes.of("/data/train/0.bin", "file") == "data"


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
    exe: str = "/venv/bin/python"


def test_the_files_a_compiler_opens_are_the_build_s_not_data() -> None:
    """torch.compile on the CPU: gcc preprocessed its precompiled header into /tmp/tmpXXXXXXXX/header.i in
    1,034,694 stdio writes (cc1), and the summary read "1,035,460 operations by 3 processes on 36 data files" for a
    program that read no data."""
    exes = {10: "/venv/bin/python", 11: "/usr/bin/x86_64-linux-gnu-g++-12",
            12: "/usr/lib/gcc/x86_64-linux-gnu/12/cc1plus", 13: "/usr/bin/as",
            14: "/usr/lib/gcc/x86_64-linux-gnu/12/collect2", 15: "/usr/bin/ld.gold", 16: "/usr/local/cuda/bin/ptxas",
            17: "/usr/bin/ffmpeg", 18: "/usr/bin/cat"}  # fmt: skip
    processes = [Process(pid, [exe], exe=exe) for pid, exe in exes.items()]
    builders = build_processes(processes)  # type: ignore[arg-type]
    assert builders == {11, 12, 13, 14, 15, 16}
    ops = [
        Op("open", "/tmp/tmpxrlk0bc7/header.hpp", pid=10), Op("write", "/tmp/tmpxrlk0bc7/header.hpp", pid=10, bytes=9),
        Op("fopen", "/tmp/tmpxrlk0bc7/header.hpp", pid=12), Op("fwrite", "/tmp/tmpxrlk0bc7/header.i", pid=12, bytes=5),
        Op("open", "/usr/include/stdio.h", pid=12),  # a system header stays the system's
        Op("open", "/data/video.mp4", pid=17),  # a tool that is no compiler reads data
        Op("open", "/data/train.bin", pid=10),
    ]  # fmt: skip
    classes = PathClasses(ops, builders)
    paths = ("/tmp/tmpxrlk0bc7/header.hpp", "/tmp/tmpxrlk0bc7/header.i", "/usr/include/stdio.h", "/data/video.mp4",
             "/data/train.bin")  # fmt: skip
    assert [classes.of(p, "file") for p in paths] == ["python", "python", "system", "data", "data"]


def test_the_helpers_of_multiprocessing_are_told_by_their_command_lines() -> None:
    python = "/venv/bin/python"
    processes = [
        Process(10, [python, "train.py"]),
        Process(11, [python, "-B", "-c", "from multiprocessing.resource_tracker import main;main(6)"], ppid=10),
        Process(12, [python, "-c", "from multiprocessing.forkserver import main; main(9, 10, ['__main__'], **{})"],
                ppid=10),
        Process(13, [python, "-c", "from multiprocessing.forkserver import main; main(9, 10, ['__main__'], **{})"],
                forked=True, ppid=12),  # a worker the forkserver forked
        Process(14, [python, "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=7, "
                     "pipe_handle=13)", "--multiprocessing-fork"], ppid=10),  # a spawned worker
        Process(15, [python, "-c", "print('from multiprocessing.resource_tracker import mainly')"], ppid=10),
    ]  # fmt: skip
    assert process_roles(processes) == {  # type: ignore[arg-type]
        11: "resource_tracker", 12: "forkserver", 15: "subprocess"
    }  # fmt: skip


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


def test_the_processes_a_subprocess_started_are_subprocesses_as_the_system_level_tells_them() -> None:
    """Under a program started by exec (a child Python, a copy of the program with its very command line) every
    process is a subprocess, whatever its command line: its forks, a worker it spawned, its own resource tracker
    and the worker's fork. The program's own spawned worker and resource tracker keep their roles, and the
    system level, given what it would read of the same processes, tells every one the same."""
    python = "/venv/bin/python"
    root = [python, "train.py"]
    spawned = [python, "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=7, "
               "pipe_handle=13)", "--multiprocessing-fork"]  # fmt: skip
    tracker = [python, "-B", "-c", "from multiprocessing.resource_tracker import main;main(6)"]
    child = [python, "child.py"]
    processes = [
        Process(10, root, ppid=9),
        Process(11, root, forked=True, ppid=10, start_ns=1),  # the program's resource tracker: forked, then exec'd
        Process(11, tracker, ppid=10, start_ns=2),
        Process(12, spawned, ppid=10, start_ns=3),  # the program's spawned worker
        Process(13, root, forked=True, ppid=10, start_ns=4),  # subprocess.run(child.py) forks, then execs
        Process(13, child, ppid=10, start_ns=5),
        Process(14, child, forked=True, ppid=13, start_ns=6),  # the child's resource tracker
        Process(14, tracker, ppid=13, start_ns=7),
        Process(15, spawned, ppid=13, start_ns=8),  # the child's spawned worker
        Process(16, spawned, forked=True, ppid=15, start_ns=9),  # and the worker's fork
        Process(17, root, ppid=10, start_ns=10),  # a copy of the program, with its very command line
        Process(18, root, forked=True, ppid=17, start_ns=11),  # the copy's fork
        Process(19, root, forked=True, ppid=10, start_ns=12),  # the program's forked worker
    ]  # fmt: skip
    roles = process_roles(processes)  # type: ignore[arg-type]
    below = {pid: "subprocess" for pid in (13, 14, 15, 16, 17, 18)}
    assert roles == {11: "resource_tracker", **below}
    seen = [(11, 10, tracker, False), (12, 10, spawned, False), (13, 10, child, False), (14, 13, tracker, False),
            (15, 13, spawned, False), (16, 15, spawned, True), (17, 10, root, False), (18, 17, root, True),
            (19, 10, root, True)]  # fmt: skip
    assert system_roles(seen, root) == roles


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
    listed = tmp_path / "listed"  # listed through a descriptor: only its readdir says it is a directory
    listed.mkdir()
    (listed / "a.bin").write_bytes(b"x")
    store, out, err = tmp_path / "c.duckdb", tmp_path / "out.txt", tmp_path / "err.txt"
    script = PROGRAMS / "path_classes.py"
    # a file staged on a fast tier, as the small-files advice says: data, where /dev/shm held every file as ipc
    shm = Path(tempfile.mkdtemp(prefix="xstack-staged-", dir="/dev/shm")) if Path("/dev/shm").is_dir() else None
    staged = [shm / "00586.npy"] if shm is not None else []
    for path in staged:
        path.write_bytes(b"x" * 1152)
    with out.open("wb") as stdout, err.open("wb") as stderr:  # xstack run ... > out.txt 2> err.txt
        command = [sys.executable, "-m", "xstack", "run", "--levels", "model,io", "-o", str(store), "--", "python",
                   str(script), str(data), str(src), str(listed), *map(str, staged)]  # fmt: skip
        try:
            done = subprocess.run(command, stdout=stdout, stderr=stderr, timeout=240)
        finally:
            if shm is not None:
                shutil.rmtree(shm)
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
        **{str(path): "data" for path in staged},
        str(data): "directory",
        str(listed): "directory",
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
    assert data_paths == {str(data / f"{i}.bin") for i in range(3)} | set(map(str, staged)), data_paths


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


def _profiled(tmp_path: Path, program: str) -> Path:
    """``program`` profiled by ``xstack run --levels io`` into ``tmp_path/p.duckdb``, run in ``tmp_path``."""
    if _unavailable() is not None:
        pytest.skip(f"io level unavailable: {_unavailable()}")
    (tmp_path / "prog.py").write_text(textwrap.dedent(program))
    command = [sys.executable, "-m", "xstack", "run", "--levels", "io", "-o", "p.duckdb", "--", "python", "prog.py"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr
    return tmp_path / "p.duckdb"


def _readers(store: Store, *paths: Path) -> dict[str, list[str | None]]:
    """The role of each process that read each of ``paths`` (None: a worker or the program), in pid order."""
    found: dict[str, list[str | None]] = {str(p): [] for p in paths}
    for path, role in store.query(
        f"SELECT path, attrs->>'$.{A.IO_FILE_PROCESS_ROLE}' FROM io_files WHERE bytes_read > 0 AND path IN "
        f"({', '.join('?' * len(paths))}) ORDER BY pid", [str(p) for p in paths]
    ):  # fmt: skip
        found[str(path)].append(role)
    return found


def test_a_worker_a_subprocess_spawned_and_its_resource_tracker_are_subprocesses(tmp_path: Path) -> None:
    """The program spawns a worker, then runs a child Python that spawns one of its own: the child's worker and
    the resource tracker the child started are the child's processes, subprocesses, not the program's worker
    and helper, which keep their roles."""
    from xstack.analyze.io import input_wait, process_table

    own, childs = tmp_path / "own.bin", tmp_path / "child.bin"
    own.write_bytes(b"x" * 1000)
    childs.write_bytes(b"y" * 2000)
    program = f"""
        import multiprocessing, subprocess, sys

        def read(path):
            with open(path, "rb") as f:
                f.read()

        if __name__ == "__main__":
            child = sys.argv[1:] == ["child"]
            worker = multiprocessing.get_context("spawn").Process(target=read, args=({str(childs)!r} if child
                                                                                      else {str(own)!r},))
            worker.start()
            worker.join()
            if not child:
                subprocess.run([sys.executable, __file__, "child"], check=True)
    """
    with Store.open(_profiled(tmp_path, program)) as store:
        assert _readers(store, own, childs) == {str(own): [None], str(childs): ["subprocess"]}
        table = process_table(store, 1)
        roles = sorted(r["role"] for r in table.to_records())
        assert roles == ["main", "resource tracker", "subprocess", "subprocess", "subprocess", "worker"], roles
        assert table.facts["workers"] == input_wait(store, 1).facts["workers"] == 1


def test_a_copy_of_the_program_and_the_processes_it_forked_are_subprocesses(tmp_path: Path) -> None:
    """The program runs its own command line again (``xstack run`` and all, in another folder, told apart by a
    variable): the copy and the children it forks are subprocesses, though they have the command line of the
    program and of its own forked worker, which stays a worker."""
    own, copied = tmp_path / "own.bin", tmp_path / "copy.bin"
    own.write_bytes(b"x" * 1000)
    copied.write_bytes(b"y" * 2000)
    program = f"""
        import os, shutil, subprocess

        def fork_read(path):
            pid = os.fork()
            if pid == 0:
                with open(path, "rb") as f:
                    f.read()
                os._exit(0)
            return pid

        if __name__ == "__main__":
            if os.environ.get("XSTACK_TEST_COPY"):
                for pid in [fork_read({str(copied)!r}) for _ in range(2)]:
                    os.waitpid(pid, 0)
            else:
                os.waitpid(fork_read({str(own)!r}), 0)
                with open("/proc/self/cmdline", "rb") as f:
                    argv = f.read().decode().split("\\0")[:-1]
                os.mkdir("copy")
                shutil.copy(__file__, "copy")
                subprocess.run(argv, cwd="copy", env=os.environ | {{"XSTACK_TEST_COPY": "1"}}, check=True)
    """
    with Store.open(_profiled(tmp_path, program)) as store:
        script = tmp_path / "copy" / "prog.py"  # the copy reads it as it starts
        found = _readers(store, own, copied, script)
        assert found == {str(own): [None], str(copied): ["subprocess", "subprocess"], str(script): ["subprocess"]}
        ((copy,),) = store.query("SELECT pid FROM io_files WHERE bytes_read > 0 AND path = ?", [str(script)])
        roles = store.query(f"""SELECT DISTINCT attrs->>'$."{A.IO_PROCESS_ROLE}"' FROM spans
                                WHERE level = 'io' AND pid = ?""", [copy])  # fmt: skip
        assert roles == [("subprocess",)]
