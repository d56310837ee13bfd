"""The programs a profiled program starts by exec (``subprocess.run``, ``os.system``), as the io level records them:
``runs.config.io_programs``, their names in ``io.processes`` and on the timeline, and the advice on a loop that
starts one in every iteration."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import skip_without_torch
from xstack.analyze._io_loop import _covered
from xstack.analyze._recommend_input import cheaper
from xstack.analyze.pipeline import run_analyses
from xstack.analyze.recommend import RULES
from xstack.analyze.result import Result
from xstack.collect._io_records import IoProcess
from xstack.collect.io import IoCollector, programs
from xstack.trace import attrs as A
from xstack.trace.store import Store

LOOP = """
import os, subprocess, sys, time, xstack

for i in range(12):
    with xstack.span("compute"):
        time.sleep(0.002)
    for _ in range(2):  # what the loop reads, by a program each time
        subprocess.run(["cat", sys.argv[1]], check=True, stdout=subprocess.DEVNULL)
    if i % 4 == 3:
        os.system(f"ls {os.path.dirname(sys.argv[1])} > /dev/null")
    xstack.step()
"""


def _run(tmp_path: Path, source: str, *args: str) -> tuple[dict[str, Any], dict[str, Result]]:
    """``source`` run as loop.py ``args`` under ``xstack run --levels model,io``: its run's config and analyses."""
    if (why := IoCollector().unavailable_reason()) is not None:
        pytest.skip(f"io level unavailable: {why}")
    skip_without_torch(source)
    (tmp_path / "loop.py").write_text(source)
    done = subprocess.run([sys.executable, "-m", "xstack", "run", "--levels", "model,io", "-o", "p.duckdb", "--",
                           "python", "loop.py", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Store.open(tmp_path / "p.duckdb") as store:
        config = orjson.loads(store.query("SELECT config FROM runs")[0][0])
        return config, {r.id: r for r in run_analyses(store)}


def test_a_loop_that_starts_programs_in_every_iteration_is_told_which_and_what_they_cost(tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text("hello\n" * 100)
    config, results = _run(tmp_path, LOOP, str(data))
    main = config["pid"]
    listed = config[A.CONFIG_IO_PROGRAMS]
    # 24 cats and 3 shells, each with its ls: in the order they started, each within its lifetime
    assert [e["program"] for e in listed if e["ppid"] == main] == (["cat"] * 8 + ["sh"]) * 3
    cats = [e for e in listed if e["program"] == "cat"]
    assert {e["command"] for e in cats} == {f"cat {data}"} and all(e["start_ns"] < e["end_ns"] for e in listed)
    shells = {e["pid"] for e in listed if e["program"] == "sh"}
    lists = [e for e in listed if e["program"] == "ls"]
    assert len(lists) == 3 and {e["ppid"] for e in lists} == shells
    assert [e["start_ns"] for e in listed] == sorted(e["start_ns"] for e in listed)

    processes = results["io.processes"]
    names = set(processes.column("process"))
    assert {f"subprocess cat (pid {e['pid']})" for e in cats} <= names, names
    assert processes.facts["programs"] == 30 and processes.facts["program_names"] == {"cat": 24, "ls": 3, "sh": 3}
    assert processes.labels[0].startswith("30 programs started by exec during the run (cat 24 times, ls 3, sh 3): ")

    # the measured iterations are the 11 past the warm-up: 22 cats, and the shells of iterations 4, 8 and 12
    facts = results["io.input_bound"].facts
    assert facts["iterations"] == 11 and facts["loop_programs"] == 25
    assert facts["loop_program_names"] == {"cat": 22, "sh": 3} and facts["loop_program_iterations"] == 11
    assert (
        0 < facts["loop_program_ns"] <= facts["loop_program_lived_ns"] and facts["loop_program_ns"] <= facts["loop_ns"]
    )

    rec = RULES["work_outside_stages"](results)
    assert rec is not None and "io.input_bound" in rec.sources
    line = next(e for e in rec.evidence if e.startswith("the main process started "))
    assert line.startswith("the main process started 25 programs by exec in 11 of the 11 measured iterations (cat "
                           "22 times, sh 3 times), which ran at least ")  # fmt: skip
    assert "Starting a program such as cat in the loop costs a fork, an exec and the program's start-up" in rec.action


def test_a_merged_profile_names_the_programs_its_io_pass_started(tmp_path: Path) -> None:
    if (why := IoCollector().unavailable_reason()) is not None:
        pytest.skip(f"io level unavailable: {why}")
    data = tmp_path / "data.txt"
    data.write_text("hello\n")
    (tmp_path / "loop.py").write_text(LOOP)
    done = subprocess.run([sys.executable, "-m", "xstack", "profile", "--pass", "model", "--io", "--warmup", "1",
                           "--iters", "4", "-o", "p.duckdb", "--", "python", "loop.py", str(data)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Store.open(tmp_path / "p.duckdb") as store:
        (merged, config), (io_run, io_config) = store.query(
            "SELECT run_id, config FROM runs WHERE pass IN ('merged', 'model+io') ORDER BY pass = 'model+io'"
        )
        results = {r.id: r for r in run_analyses(store, merged)}
    merged_main, io_main = orjson.loads(config)["pid"], orjson.loads(io_config)["pid"]
    listed, started = orjson.loads(config)[A.CONFIG_IO_PROGRAMS], orjson.loads(io_config)[A.CONFIG_IO_PROGRAMS]
    # the io pass's programs, those of its main process now the merged main process's
    assert [e | {"ppid": io_main} if e["ppid"] == merged_main else e for e in listed] == started
    assert [e["program"] for e in started if e["ppid"] == io_main][:3] == ["cat", "cat", "cat"]
    names = set(results["io.processes"].column("process"))
    assert {f"subprocess cat (pid {e['pid']})" for e in started if e["program"] == "cat"} <= names, names
    assert results["io.input_bound"].facts["source_run"] == io_run
    # what its processes did with the CPUs, the io pass's main process's figures now the merged main process's
    cpu, timed = orjson.loads(config)[A.CONFIG_IO_PROCESS_CPU], orjson.loads(io_config)[A.CONFIG_IO_PROCESS_CPU]
    assert [e | {"pid": io_main} if e["pid"] == merged_main else e for e in cpu] == timed
    assert timed[0]["pid"] == io_main and timed[0]["cpu_ns"] > 0 and "run_delay_ns" in timed[0]
    assert all(0 < e["recording_ns"] < e["cpu_ns"] for e in timed)  # what recording cost each, part of its CPU time
    main = next(r for r in results["io.processes"].to_records() if r["pid"] == merged_main)
    assert main["cpu time"] == timed[0]["cpu_ns"]


BUILDS = """
import subprocess, time, xstack

for i in range(6):
    with xstack.span("compute"):
        time.sleep(0.002)
    subprocess.run(["gcc", "-E", "-x", "c", "/dev/null"], check=True, stdout=subprocess.DEVNULL)
    xstack.step()
"""


def test_a_loop_that_runs_a_compiler_in_every_iteration_is_told_of_code_built_in_the_loop(tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    config, results = _run(tmp_path, BUILDS)
    # gcc, and the preprocessor it runs (cc1), are builds
    started = [e for e in config[A.CONFIG_IO_PROGRAMS] if e["ppid"] == config["pid"]]
    assert [e["program"] for e in started] == ["gcc"] * 6 and all(e.get("build") for e in started)
    facts = results["io.input_bound"].facts
    assert facts["loop_programs"] == facts["loop_program_builds"] == 5
    rec = RULES["work_outside_stages"](results)
    # most of the time in no stage: the advice leads with it
    assert rec is not None and rec.action.startswith(
        "The programs are mostly compilers and linkers (gcc): code is "
        "built in the measured iterations, as torch.compile does "
    )
    assert "Starting a program such as" not in rec.action


PER_ITEM = """
import subprocess, sys, torch, xstack
from torch.utils.data import DataLoader, Dataset

class Decoded(Dataset):  # a program per item, as a dataset that decodes each clip with ffmpeg does
    def __len__(self):
        return 256
    def __getitem__(self, i):
        out = subprocess.run(["cat", sys.argv[1]], capture_output=True, check=True).stdout
        return torch.frombuffer(bytearray(out[:64]), dtype=torch.uint8).float()

if __name__ == "__main__":
    for x in DataLoader(Decoded(), batch_size=8, num_workers=2, multiprocessing_context="fork"):
        xstack.step()
"""


def test_workers_that_start_a_program_per_item_are_told_to_do_its_work_in_the_process(tmp_path: Path) -> None:
    data = tmp_path / "clip.raw"
    data.write_bytes(bytes(range(256)) * 16)
    config, results = _run(tmp_path, PER_ITEM, str(data))
    listed = config[A.CONFIG_IO_PROGRAMS]
    assert len(listed) == 256 and {e["program"] for e in listed} == {"cat"}
    assert config["pid"] not in {e["ppid"] for e in listed}  # the workers started them, not the loop
    facts = results["io.input_bound"].facts
    # the items built in the measured iterations: all but the first batch's and those the workers built ahead of
    # the loop while it was in its warm-up (2 workers, 2 batches each)
    assert facts["iterations"] == 31 and facts["loop_programs"] == 0
    n = facts["worker_programs"]
    assert 256 - 6 * 8 <= n <= 256 - 8 and set(facts["worker_program_names"]) == {"cat"}
    assert facts["worker_program_ns"] > 0
    advice = cheaper(results)
    assert advice.startswith(f"make each batch cheaper to build: the workers start {n / 31:,.1f} programs per "
                             f"iteration (cat {n} times in the measured iterations), which run at least ")  # fmt: skip
    assert "(subprocess.run or os.system in the dataset's __getitem__): a fork, an exec" in advice


def _image(pid: int, ppid: int, argv: list[str], start: int, end: int, *, forked: bool) -> IoProcess:
    return IoProcess(pid=pid, ppid=ppid, exe=f"/usr/bin/{argv[0]}" if argv else "/usr/bin/x", argv=argv,
                     start_ns=start, end_ns=end, mode="preload", forked=forked, clean_exit=True, records=0, dropped={},
                     dropped_bytes_read=0, dropped_bytes_written=0, reentrant_skipped=0, paths_dropped=0,
                     files=[])  # fmt: skip


def test_programs_are_one_entry_per_process_named_by_what_it_ran_first() -> None:
    images = [
        _image(10, 1, ["python", "train.py"], 0, 1000, forked=False),  # the program itself: not a subprocess
        _image(11, 10, ["python", "train.py"], 100, 110, forked=True),  # forked, then exec'd sh: from the fork
        _image(11, 10, ["/bin/sh", "-c", "ls /data"], 110, 150, forked=False),
        _image(12, 11, ["ls", "/data"], 120, 140, forked=False),  # below the shell
        _image(13, 10, ["cat", "x" * 300], 200, 210, forked=False),  # a vfork: its exec'd image only
        _image(14, 10, ["cat", "y"], 2000, 2100, forked=False),  # after the region
        _image(15, 10, ["x86_64-linux-gnu-gcc-12", "-c", "k.cpp"], 300, 400, forked=False),  # a build
    ]
    roles = {11: "subprocess", 12: "subprocess", 13: "subprocess", 14: "subprocess", 15: "subprocess"}
    found = programs(images, roles, 50, 1500)
    assert [(e["pid"], e["ppid"], e["program"], e["start_ns"], e["end_ns"]) for e in found] == [
        (11, 10, "sh", 100, 150), (12, 11, "ls", 120, 140), (13, 10, "cat", 200, 210),
        (15, 10, "x86_64-linux-gnu-gcc-12", 300, 400),
    ]  # fmt: skip
    assert [e.get("build") for e in found] == [None, None, None, True]
    assert found[0]["command"] == "/bin/sh -c ls /data" and len(found[2]["command"]) == A.IO_PROGRAM_COMMAND_CHARS


def test_programs_run_side_by_side_count_once_in_the_time_they_ran() -> None:
    # g++ run from several threads at once by torch.compile: their lifetimes overlap
    assert _covered([(0, 10), (5, 15), (20, 30), (22, 25), (30, 31)]) == 26
    assert _covered([]) == 0
