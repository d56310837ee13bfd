"""The syscall pass: strace's output parsed form by form, ingested into a run, and end to end under real strace
(``xstack run --syscalls``) on programs that sleep, read files, wait on a lock and fork in known stages."""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from xstack.collect import syscalls
from xstack.collect._perf_trace import PerfParser
from xstack.collect._strace import Call, StraceParser
from xstack.collect.syscalls import ingest
from xstack.trace import attrs as A
from xstack.trace.sink import Sink
from xstack.trace.store import RunInfo, Store

T0 = 1_700_000_000_000_000_000  # ns; the traces below start at 1700000000.000000


def _parse(text: str) -> tuple[list[Call], StraceParser]:
    parser = StraceParser()
    return list(parser.calls(textwrap.dedent(text).strip("\n").splitlines(keepends=True))), parser


# -- the parser -------------------------------------------------------------------------------------------------
def test_complete_calls_keep_times_results_errors_and_glosses() -> None:
    calls, parser = _parse(r"""
        100 1700000000.000010 read(3, "abc", 64) = 3 <0.000020>
        100 1700000000.000100 openat(AT_FDCWD, "/nope", O_RDONLY|O_CLOEXEC) = -1 ENOENT (No such file or directory) <0.000012>
        100 1700000000.000200 poll([{fd=3, events=POLLIN}], 1, 100) = 0 (Timeout) <0.100100>
        100 1700000000.100400 mmap(NULL, 8192, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) = 0x7f275648d000 <0.000011>
        100 1700000000.100500 poll([{fd=4, events=POLLIN}], 1, -1) = 1 ([{fd=4, revents=POLLIN}]) <0.000009>
        100 1700000000.100600 restart_syscall(<... resuming interrupted clock_nanosleep ...>) = 0 <0.099000>
        100 1700000000.200000 wait4(-1, [{WIFEXITED(s) && WEXITSTATUS(s) == 0}], 0, NULL) = 101 <0.000030>
    """)  # noqa: E501
    assert parser.skipped == 0
    read, missing, timeout, mmap, ready, restart, wait = calls
    assert (read.tid, read.name, read.start_ns, read.dur_ns, read.args, read.ret) == (
        100, "read", T0 + 10_000, 20_000, '3, "abc", 64', "3")  # fmt: skip
    assert (missing.ret, missing.errno, missing.dur_ns) == ("-1", "ENOENT", 12_000)
    assert (timeout.ret, timeout.errno, timeout.dur_ns) == ("0", None, 100_100_000)
    assert mmap.ret == "0x7f275648d000"
    assert (ready.ret, ready.args) == ("1", "[{fd=4, events=POLLIN}], 1, -1")
    assert (restart.name, restart.dur_ns) == ("restart_syscall", 99_000_000)
    assert (wait.ret, wait.args) == ("101", "-1, [{WIFEXITED(s) && WEXITSTATUS(s) == 0}], 0, NULL")
    assert not any(c.unfinished for c in calls)


def test_quotes_and_escapes_in_arguments_do_not_end_them() -> None:
    calls, parser = _parse(r"""
        7 1700000000.000001 read(3, "a\"b)", 64) = 4 <0.000002>
        7 1700000000.000010 write(1, "x) = 5 <0.1>\\", 9) = 9 <0.000003>
        7 1700000000.000020 write(1, "\\\"", 2) = 2 <0.000004>
        7 1700000000.000030 read(3, "0123456789012345678901234567890123456789012345678901234567890123"..., 4096) = 4096 <0.000005>
    """)  # noqa: E501
    assert parser.skipped == 0
    assert [c.args for c in calls] == [r'3, "a\"b)", 64', r'1, "x) = 5 <0.1>\\", 9', r'1, "\\\"", 2',
                                       '3, "' + "0123456789" * 6 + '0123"..., 4096']  # fmt: skip
    assert [c.ret for c in calls] == ["4", "9", "2", "4096"]
    assert [c.dur_ns for c in calls] == [2_000, 3_000, 4_000, 5_000]


def test_unfinished_calls_of_many_threads_pair_with_their_resumptions() -> None:
    calls, parser = _parse("""
        10 1700000000.000000 futex(0x55, FUTEX_WAIT_PRIVATE, 2, NULL <unfinished ...>
        11 1700000000.000100 read(5,  <unfinished ...>
        12 1700000000.000200 clock_nanosleep(CLOCK_REALTIME, 0, {tv_sec=0, tv_nsec=200000000},  <unfinished ...>
        11 1700000000.000300 <... read resumed>"hello", 4096) = 5 <0.000200>
        13 1700000000.000350 getpid() = 13 <0.000001>
        12 1700000000.200300 <... clock_nanosleep resumed>0x7ffd) = 0 <0.200100>
        10 1700000000.250000 <... futex resumed>) = 0 <0.250000>
    """)
    assert parser.skipped == 0 and parser.unfinished == 0
    by_name = {c.name: c for c in calls}
    assert [c.name for c in calls] == ["read", "getpid", "clock_nanosleep", "futex"]  # the order they end in
    assert (by_name["read"].tid, by_name["read"].start_ns, by_name["read"].args) == (
        11, T0 + 100_000, '5, "hello", 4096')  # fmt: skip
    assert by_name["clock_nanosleep"].args == "CLOCK_REALTIME, 0, {tv_sec=0, tv_nsec=200000000}, 0x7ffd"
    assert (by_name["clock_nanosleep"].start_ns, by_name["clock_nanosleep"].dur_ns) == (T0 + 200_000, 200_100_000)
    assert (by_name["futex"].tid, by_name["futex"].start_ns, by_name["futex"].dur_ns) == (10, T0, 250_000_000)


def test_signals_exits_and_calls_that_never_return() -> None:
    calls, parser = _parse("""
        20 1700000000.000000 --- SIGCHLD {si_signo=SIGCHLD, si_code=CLD_EXITED, si_pid=21, si_status=0} ---
        21 1700000000.000100 futex(0x60, FUTEX_WAIT_PRIVATE, 2, NULL <unfinished ...>
        22 1700000000.000200 futex(0x61, FUTEX_WAIT_PRIVATE, 2, NULL <unfinished ...>
        23 1700000000.000300 read(0,  <unfinished ...>
        20 1700000000.000400 exit_group(0)            = ?
        21 1700000000.000500 <... futex resumed>)     = ?
        22 1700000000.000600 +++ exited with 0 +++
        24 1700000000.000700 nanosleep({tv_sec=1, tv_nsec=0},  <unfinished ...>
        24 1700000000.000800 +++ killed by SIGKILL +++
        25 1700000000.000900 exit(0 <unfinished ...>
        25 1700000000.001000 <... exit resumed>)      = ?
        26 1700000000.001100 rt_sigsuspend([], 8) = ? ERESTARTNOHAND (To be restarted if no handler) <0.000400>
    """)
    assert parser.skipped == 0
    by_tid = {c.tid: c for c in calls}
    assert by_tid[20].name == "exit_group" and by_tid[20].ret is None and not by_tid[20].unfinished
    assert by_tid[21].unfinished and by_tid[21].ret is None and by_tid[21].dur_ns == 400_000  # killed in futex
    assert by_tid[22].unfinished and by_tid[22].dur_ns == 400_000  # closed by its exit
    assert by_tid[24].unfinished and by_tid[24].name == "nanosleep" and by_tid[24].dur_ns == 100_000
    assert by_tid[25].name == "exit" and not by_tid[25].unfinished
    assert (by_tid[26].ret, by_tid[26].errno, by_tid[26].unfinished) == (None, "ERESTARTNOHAND", False)
    # tid 23's read was still open when the file ended: it runs to the last time in the file
    assert by_tid[23].unfinished and by_tid[23].start_ns == T0 + 300_000 and by_tid[23].dur_ns == 800_000
    assert parser.unfinished == 4
    assert sum(1 for c in calls if c.name == "rt_sigsuspend") == 1  # the signal line is not a call


def test_threads_belong_to_the_process_that_cloned_them() -> None:
    _, parser = _parse("""
        30 1700000000.000000 clone3({flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD|CLONE_SYSVSEM, child_tid=0x7f, exit_signal=0} <unfinished ...>
        31 1700000000.000010 set_robust_list(0x7f, 24) = 0 <0.000001>
        30 1700000000.000020 <... clone3 resumed> => {parent_tid=[31]}, 88) = 31 <0.000030>
        30 1700000000.000100 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, child_tidptr=0x7f) = 40 <0.000100>
        40 1700000000.000200 clone3({flags=CLONE_VM|CLONE_THREAD|CLONE_SIGHAND, exit_signal=0}, 88) = 41 <0.000010>
        41 1700000000.000300 clone3({flags=CLONE_VM|CLONE_THREAD|CLONE_SIGHAND, exit_signal=0}, 88) = 42 <0.000010>
        30 1700000000.000400 vfork() = 50 <0.000900>
    """)  # noqa: E501
    assert parser.skipped == 0
    assert parser.first_tid == 30
    assert {tid: parser.pid_of(tid) for tid in sorted(parser.tids)} == {30: 30, 31: 30, 40: 40, 41: 40}
    assert (parser.pid_of(42), parser.pid_of(50)) == (40, 50)


def test_malformed_and_truncated_lines_are_counted_not_fatal() -> None:
    calls, parser = _parse("""
        strace: Process 12 attached
        60 1700000000.000000 read(3, "ok", 2) = 2 <0.000001>
        60 garbage
        60 1700000000.000100 <... write resumed>) = 1
        60 1700000000.000200 read(3, "trunc
    """)
    assert [c.name for c in calls] == ["read"]
    assert parser.skipped == 4
    assert parser.first_skipped == "strace: Process 12 attached"


def test_lines_without_a_thread_and_very_long_lines() -> None:
    long_args = "[" + ", ".join(f'"{i:05d}"' for i in range(100_000)) + "]"
    calls, parser = _parse(f"""
        1700000000.000000 getpid() = 9 <0.000001>
        77 1700000000.000100 execve("/usr/bin/python3", {long_args}, 0x7ffd /* 3 vars */) = 0 <0.000500>
    """)
    assert parser.skipped == 0
    assert calls[0].tid == 0 and calls[1].tid == 77
    assert calls[1].args.endswith("0x7ffd /* 3 vars */") and calls[1].ret == "0"


def test_parsing_streams() -> None:
    def endless() -> Iterator[str]:
        for i in itertools.count():
            yield f"1 1700000000.{i % 1_000_000:06d} getpid() = 1 <0.000001>\n"

    first = list(itertools.islice(StraceParser().calls(endless()), 5))
    assert [c.name for c in first] == ["getpid"] * 5


# -- ingest into a run ------------------------------------------------------------------------------------------
def _run_with_stages(path: Path) -> None:
    """A store whose run 1 has two steps (pid 500, tid 500) 0.5 ms apart, the first holding stage ``load`` with
    a layer inside."""
    with Store.create(path) as store:
        sink = Sink(store, 1)
        sink.span(1, None, "model", "step", T0, 1_000_000, 500, 500, {A.MODEL_KIND: "step"})
        sink.span(2, 1, "model", "load", T0 + 100_000, 400_000, 500, 500, {A.MODEL_KIND: "user"})
        sink.span(3, 2, "layer", "encoder", T0 + 200_000, 100_000, 500, 500)
        sink.span(4, None, "model", "step", T0 + 1_500_000, 1_000_000, 500, 500, {A.MODEL_KIND: "step"})
        sink.close()
        store.add_run(RunInfo(run_id=1, name="p", levels=["model", "layer"], pass_name="live",
                              config={"status": "complete", A.CONFIG_SYSTEM: {"interval_ms": 10.0}}))  # fmt: skip


INGESTED = """\
        500 1699999999.999000 openat(AT_FDCWD, "/usr/lib/python3", O_RDONLY) = 3 <0.000010>
        500 1700000000.000050 getpid() = 500 <0.000001>
        500 1700000000.000150 read(3, "abc", 3) = 3 <0.000010>
        500 1700000000.000250 clone3({flags=CLONE_VM|CLONE_THREAD, exit_signal=0}, 88) = 501 <0.000010>
        501 1700000000.000260 futex(0x1, FUTEX_WAIT_PRIVATE, 2, NULL) = -1 EAGAIN (Resource temporarily unavailable) <0.000002>
        500 1700000000.000300 clone(child_stack=NULL, flags=SIGCHLD) = 600 <0.000020>
        600 1700000000.000400 write(1, "x", 1) = 1 <0.000003>
        500 1700000000.000700 poll([{polled}], 20, -1) = 1 ([{fd=3, revents=POLLIN}]) <0.000010>
        600 1700000000.000800 exit_group(0) = ?
        500 1700000000.001200 sched_yield() = 0 <0.000001>
        500 1700000000.002000 close(3) = 0 <0.000001>
        500 1700000000.002100 bad line
        500 1700000000.003000 exit_group(0) = ?
"""  # noqa: E501


def test_ingest_keeps_calls_of_the_region_under_their_stage(tmp_path: Path) -> None:
    store_path = tmp_path / "p.duckdb"
    _run_with_stages(store_path)
    trace = tmp_path / "p.strace"
    polled = ", ".join(f"{{fd={fd}, events=POLLIN}}" for fd in range(20))
    trace.write_text(textwrap.dedent(INGESTED).replace("{polled}", polled))
    health = {check: (count, detail) for check, count, detail in ingest(store_path, trace)}
    with Store.open(store_path) as store:
        rows = store.query(
            "SELECT s.name, s.pid, s.tid, p.name, s.attrs FROM spans s LEFT JOIN spans p ON p.run_id = s.run_id "
            "AND p.span_id = s.parent_id WHERE s.run_id = 1 AND s.level = 'system' ORDER BY s.start_ns"
        )
        run = store.query("SELECT levels, config FROM runs WHERE run_id = 1")[0]
        stored_health = {r[0]: r[1] for r in store.query('SELECT "check", count FROM health WHERE run_id = 1')}
    got = [(name, pid, tid, parent) for name, pid, tid, parent, _ in rows]
    assert got == [("getpid", 500, 500, "step"), ("read", 500, 500, "load"), ("clone3", 500, 500, "encoder"),
                   ("futex", 500, 501, None), ("clone", 500, 500, "load"), ("write", 600, 600, None),
                   ("poll", 500, 500, "step"), ("exit_group", 600, 600, None), ("sched_yield", 500, 500, None),
                   ("close", 500, 500, "step")]  # fmt: skip
    attrs = [orjson.loads(r[4]) for r in rows]
    assert attrs[1] == {A.SYS_ARGS: '3, "abc", 3', A.SYS_RET: "3", A.SYS_TOOL: "strace"}
    assert attrs[3][A.SYS_ERRNO] == "EAGAIN"
    assert len(attrs[6][A.SYS_ARGS]) == A.SYS_ARGS_MAX
    assert A.SYS_RET not in attrs[7]
    outside, detail = health["syscalls_outside_region"]
    assert outside == 2 and detail.endswith("not kept; the 10 in it, from 2 processes, are kept")
    assert health["syscall_lines_skipped"][0] == 1 and "bad line" in health["syscall_lines_skipped"][1]
    assert stored_health["syscalls_outside_region"] == 2
    assert run[0] == ["model", "layer", "system"]
    system = orjson.loads(run[1])[A.CONFIG_SYSTEM]
    assert system["interval_ms"] == 10.0 and system["syscalls"] is True and system["syscall_tool"].startswith("strace")


# -- perf's lines -----------------------------------------------------------------------------------------------
def _perf(text: str, offset_ns: int = 0) -> tuple[list[Call], PerfParser]:
    parser = PerfParser(offset_ns)
    parser.names = {0: "read", 59: "execve", 60: "exit", 202: "futex", 257: "openat", 435: "clone3"}
    return list(parser.calls(textwrap.dedent(text).strip("\n").splitlines(keepends=True))), parser


def test_calls_running_past_the_region_end_with_it(tmp_path: Path) -> None:
    """An idle thread blocked in a futex from the last step until the process exits (the trace's end, after the
    store was written) is cut at the region's end: the run's wall time is its model spans', not the trace's."""
    from xstack.analyze.summary import host_wall

    store_path = tmp_path / "p.duckdb"
    _run_with_stages(store_path)  # the region: T0 to T0 + 2.5 ms
    trace = tmp_path / "p.strace"
    trace.write_text(
        textwrap.dedent("""\
        501 1700000000.002000 futex(0x1, FUTEX_WAIT_PRIVATE, 0, NULL) = 0 <1.300000>
        500 1700000000.002100 read(3, "abc", 3) = 3 <0.000010>
    """)
    )
    health = {check: (count, detail) for check, count, detail in ingest(store_path, trace)}
    with Store.open(store_path) as store:
        spans = store.query("SELECT name, dur_ns, attrs FROM spans WHERE run_id = 1 AND level = 'system' "
                            "ORDER BY start_ns")  # fmt: skip
        wall, _ = host_wall(store, 1, {})
    assert wall == 2_500_000
    (futex, futex_ns, futex_attrs), (read, read_ns, read_attrs) = spans
    assert (futex, futex_ns, orjson.loads(futex_attrs)[A.SYS_PAST_REGION_NS]) == ("futex", 500_000, 1_299_500_000)
    assert (read, read_ns) == ("read", 10_000) and A.SYS_PAST_REGION_NS not in orjson.loads(read_attrs)
    assert health["syscalls_past_region"][0] == 1


def test_perf_lines_pair_entries_and_exits_per_thread() -> None:
    calls, parser = _perf(
        """
         10/10  100.000000100: raw_syscalls:sys_exit: NR 59 = 0
         10/11  100.000000200: raw_syscalls:sys_exit: NR 435 = 0
         10/10  100.000001000: raw_syscalls:sys_enter: NR 257 (ffffff9c, 7f00, 80000, 0, 0, 0)
         10/11  100.000001500: raw_syscalls:sys_enter: NR 202 (7f10, 80, 2, 0, 0, 0)
         10/10  100.000003000: raw_syscalls:sys_exit: NR 257 = 3
         10/10  100.000004000: raw_syscalls:sys_enter: NR 0 (3, 7f20, 1000, 0, 0, 0)
         10/10  100.000006500: raw_syscalls:sys_exit: NR 0 = -2
         10/11  100.200001500: raw_syscalls:sys_exit: NR 202 = 0
    """,
        offset_ns=1_000,
    )
    got = [(c.tid, c.name, c.start_ns, c.dur_ns, c.ret, c.errno) for c in calls]
    assert got == [
        (10, "openat", 100_000_002_000, 2_000, "3", None),
        (10, "read", 100_000_005_000, 2_500, "-1", "ENOENT"),
        (11, "futex", 100_000_002_500, 200_000_000, "0", None),
    ]
    assert calls[0].args == "(ffffff9c, 7f00, 80000, 0, 0, 0)"
    assert parser.pid_of(11) == 10 and set(parser.tids) == {10, 11}
    assert parser.skipped == 0  # exits whose entries were the caller's (exec, a new thread's clone3): expected


def test_perf_lost_events_unfinished_calls_and_unknown_numbers() -> None:
    calls, parser = _perf("""
         5/5  1.000000000: raw_syscalls:sys_enter: NR 0 (3, 7f20, 1000, 0, 0, 0)
         5/5  1.000000500: raw_syscalls:sys_enter: NR 999 (0, 0, 0, 0, 0, 0)
        LOST 17 events!
         5/5  1.000000900: raw_syscalls:sys_exit: NR 999 = 0
         5/6  1.000001000: raw_syscalls:sys_exit: NR 0 = 4
         5/5  1.000002000: raw_syscalls:sys_enter: NR 60 (0, 0, 0, 0, 0, 0)
         5/7  1.000003000: raw_syscalls:sys_enter: NR 0 (3, 7f20, 1000, 0, 0, 0)
    """)
    got = [(c.tid, c.name, c.dur_ns, c.unfinished) for c in calls]
    # the read's exit was lost: it ends where the next call begins; exit never returns; thread 7 was cut off
    assert got == [(5, "read", 500, True), (5, "syscall_999", 400, False), (5, "exit", 0, False), (7, "read", 0, True)]
    assert parser.lost == 17 and parser.skipped == 1 and parser.unfinished == 2


# -- end to end under strace and perf ----------------------------------------------------------------------------
def _live_unavailable(tool: str = "strace") -> str | None:
    reason = syscalls._reason(tool)
    if reason:
        return reason
    if importlib.util.find_spec("xstack.collect.system") is None:
        return "the system level's sampler (xstack.collect.system) is not installed"
    return None


TOOLS = [pytest.param(t, marks=pytest.mark.skipif(_live_unavailable(t) is not None,
                                                   reason=f"cannot trace with {t} here: {_live_unavailable(t)}"))
         for t in ("strace", "perf")]  # fmt: skip
"""Both tracers, each where it can trace."""
sampler = pytest.mark.skipif(importlib.util.find_spec("xstack.collect.system") is None,
                             reason="the system level's sampler (xstack.collect.system) is not installed")  # fmt: skip

STAGES = """
import os, sys, threading, time
import xstack

files = sys.argv[1:4]
lock = threading.Lock()
held = threading.Event()

def holder():
    with lock:
        held.set()
        time.sleep(0.2)

with xstack.span("sleep"):
    time.sleep(0.2)
with xstack.span("read"):
    for name in files:
        with open(name, "rb") as f:
            while f.read(4096):
                pass
thread = threading.Thread(target=holder)
thread.start()
held.wait()
with xstack.span("lock"):
    with lock:
        pass
thread.join()
with xstack.span("fork"):
    pid = os.fork()
    if pid == 0:  # a DataLoader-like worker: its own process, reading on its own
        with open(files[0], "rb") as f:
            f.read()
        os._exit(0)
    os.waitpid(pid, 0)
if len(sys.argv) > 4:
    with xstack.span("crash"):
        time.sleep(0.05)
        raise SystemExit(int(sys.argv[4]))
"""


def _xstack(*args: str, cwd: Path, tool: str = "strace") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "xstack", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=os.environ | {syscalls.TOOL_ENV: tool})  # fmt: skip


@pytest.fixture(scope="module", params=TOOLS)
def staged(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path], str]:
    tool = str(request.param)
    root = tmp_path_factory.mktemp(f"syscalls-{tool}")
    files = [root / f"data{i}.bin" for i in range(3)]
    for i, f in enumerate(files):
        f.write_bytes(os.urandom(3000 + 5000 * i))
    (root / "stages.py").write_text(STAGES)
    store = root / "stages.duckdb"
    done = _xstack("run", "--syscalls", "--levels", "model,system", "-o", str(store), "--", "python", "stages.py",
                   *map(str, files), cwd=root, tool=tool)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return store, files, tool


def _calls(store: Path) -> list[dict[str, Any]]:
    with Store.open(store) as s:
        rows = s.query(
            "SELECT s.name, s.dur_ns, s.pid, s.tid, p.name, s.attrs, s.start_ns FROM spans s LEFT JOIN spans p "
            "ON p.run_id = s.run_id AND p.span_id = s.parent_id WHERE s.level = 'system' ORDER BY s.start_ns"
        )
    keys = ("name", "dur_ns", "pid", "tid", "stage", "attrs", "start_ns")
    return [dict(zip(keys, (*r[:5], orjson.loads(r[5]), r[6]), strict=True)) for r in rows]


def _span_start(store: Path, name: str) -> int:
    with Store.open(store) as s:
        return int(s.query("SELECT start_ns FROM spans WHERE level = 'model' AND name = ?", [name])[0][0])


def _in_stage(calls: list[dict[str, Any]], store: Path, stage: str, names: tuple[str, ...], tool: str,
              tid: int | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """The calls named ``names`` that ``stage`` made: under its span, and with perf, whose clock agrees with the
    run's to a couple of microseconds only, also those on ``tid`` that start up to 5 us before the span does."""
    found = [c for c in calls if c["stage"] == stage and c["name"] in names]
    if tool == "perf" and tid is not None:
        start = _span_start(store, stage)
        found += [c for c in calls if c["stage"] != stage and c["name"] in names and c["tid"] == tid
                  and start - 5_000 <= c["start_ns"] <= start]  # fmt: skip
    return found


def test_syscalls_land_in_the_stage_that_made_them(staged: tuple[Path, list[Path], str]) -> None:
    store, files, tool = staged
    calls = _calls(store)
    main_pid = next(c["pid"] for c in calls if c["stage"] == "read")
    in_sleep = _in_stage(calls, store, "sleep", ("clock_nanosleep", "nanosleep", "select"), tool, main_pid)
    assert len(in_sleep) == 1 and 195e6 <= in_sleep[0]["dur_ns"] < 400e6, in_sleep  # a busy machine wakes it late
    reads = [c for c in calls if c["stage"] == "read" and c["name"] == "read"]
    bytes_read = sum(int(c["attrs"][A.SYS_RET]) for c in reads if c["attrs"].get(A.SYS_RET, "-1") != "-1")
    assert bytes_read == sum(f.stat().st_size for f in files)
    opened = _in_stage(calls, store, "read", ("openat",), tool, main_pid)
    if tool == "strace":  # perf's tracepoints hold the arguments as raw integers: no path
        assert all(any(f.name in c["attrs"][A.SYS_ARGS] for c in opened) for f in files)
    else:
        assert len(opened) == len(files)
    waits = _in_stage(calls, store, "lock", ("futex",), tool, main_pid)
    assert waits and 0.1e9 < sum(c["dur_ns"] for c in waits) < 0.3e9, waits
    forked = [c for c in calls if c["pid"] != main_pid and c["name"] == "read"]
    assert forked and all(c["stage"] is None and c["tid"] == c["pid"] for c in forked)  # the worker's own pid
    assert all(c["attrs"][A.SYS_TOOL] == tool for c in calls)
    # the sampler opens and reads its /proc files on its own thread, whose calls are left out
    own = ('"/proc/stat"', '"/proc/meminfo"', f'"/proc/{main_pid}/')
    assert not [c for c in calls if c["name"] in ("open", "openat") and any(p in c["attrs"][A.SYS_ARGS] for p in own)]
    assert not [c for c in calls if c["name"] == "pread64" and '"cpu ' in c["attrs"][A.SYS_ARGS]]
    assert not [
        c for c in calls if c["name"] == "pread64" and c["stage"] in ("sleep", "lock")
    ]  # the program makes none
    with Store.open(store) as s:
        levels, config = s.query("SELECT levels, config FROM runs")[0]
        health = dict(s.query('SELECT "check", count FROM health'))
    assert "system" in levels
    system = orjson.loads(config)[A.CONFIG_SYSTEM]
    assert system["syscalls"] is True and system["syscall_tool"].startswith(f"{tool} ")
    assert health.get("syscalls_outside_region", 0) > 0  # interpreter start-up
    assert health.get("syscalls_sampler", 0) > 0
    assert "syscalls_lost" not in health
    # perf: a rare exit comes without its entry (about 1 in 100,000 calls on the io benchmark), counted, not kept
    assert health.get("syscall_lines_skipped", 0) <= (len(calls) // 1000 if tool == "perf" else 0)
    assert not list(store.parent.glob("*.strace")) and not list(store.parent.glob("*.perf.data*"))  # removed once read


def test_a_crashing_program_keeps_its_calls_and_exit_code(staged: tuple[Path, list[Path], str]) -> None:
    store, files, tool = staged
    crashed = store.with_name("crash.duckdb")
    done = _xstack("run", "--syscalls", "--levels", "model,system", "-o", str(crashed), "--", "python", "stages.py",
                   *map(str, files), "3", cwd=store.parent, tool=tool)  # fmt: skip
    assert done.returncode == 3, done.stderr
    calls = _calls(crashed)
    main_pid = next(c["pid"] for c in calls if c["stage"] == "read")
    sleeps = ("clock_nanosleep", "nanosleep", "select")
    assert _in_stage(calls, crashed, "crash", sleeps, tool, main_pid)
    assert _in_stage(calls, crashed, "sleep", sleeps, tool, main_pid)
    with Store.open(crashed) as s:
        assert orjson.loads(s.query("SELECT config FROM runs")[0][0])["status"] == "cut_short"


@sampler
def test_syscalls_refuse_another_tracer(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text("print('hi')\n")
    done = _xstack("run", "--syscalls", "--levels", "model,io", "-o", str(tmp_path / "p.duckdb"), "--", "python",
                   "p.py", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2
    assert "one tracer at a time" in done.stderr
    assert not (tmp_path / "p.duckdb").exists()


@pytest.mark.parametrize("interval", ["0", "-5", "nan"])
def test_system_interval_must_be_positive(tmp_path: Path, interval: str) -> None:
    (tmp_path / "p.py").write_text("print('hi')\n")
    done = _xstack("run", "--system-interval", interval, "--levels", "model,system", "--", "python", "p.py",
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and "--system-interval" in done.stderr


@sampler
def test_system_interval_reaches_the_sampler(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text("import time\ntime.sleep(0.05)\n")
    store = tmp_path / "p.duckdb"
    done = _xstack("run", "--system-interval", "5", "--levels", "model,system", "-o", str(store), "--", "python",
                   "p.py", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Store.open(store) as s:
        system = orjson.loads(s.query("SELECT config FROM runs")[0][0])[A.CONFIG_SYSTEM]
    assert system["interval_ms"] == 5.0 and not system["syscalls"]
