"""The system level's sampler against /proc: a real workload with known CPU burn, allocation, sleeps, file reads
and a child process, profiled at ``model,system``; its counters are checked against what /proc says."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

import xstack
from xstack.cli.main import main
from xstack.collect import _system_native, _system_nvml, _system_sampler, system
from xstack.errors import UsageError
from xstack.export.perfetto import export_perfetto
from xstack.trace import attrs as A
from xstack.trace.store import Store

TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
INTERVAL_NS = int(system.DEFAULT_INTERVAL_MS * 1e6)
BURN_S = 0.3
BLOB_BYTES = 200 << 20
READ_BYTES = 4 << 20
SLEEPS = 50


def _unavailable() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed (the model level needs it)"
    return system.SystemCollector().unavailable_reason()


pytestmark = pytest.mark.skipif(_unavailable() is not None, reason=f"system level unavailable: {_unavailable()}")


def _burn(seconds: float) -> int:
    """Spin until this thread has used ``seconds`` of CPU (so that a busy machine only stretches the wall time);
    returns the CPU time used, in ns."""
    start = time.thread_time_ns()
    end = start + seconds * 1e9
    while time.thread_time_ns() < end:
        pass
    return time.thread_time_ns() - start


def _child(seconds: float) -> None:
    _burn(seconds)
    time.sleep(0.15)  # alive past a full sample after the burn, so that its whole CPU time is seen


def _threaded_child(threads: int, sleeps: int) -> None:
    """A process whose ``threads`` threads each sleep ``sleeps`` times 5 ms, then some more so the last full
    sample sees it whole."""

    def sleeper() -> None:
        for _ in range(sleeps):
            time.sleep(0.005)

    workers = [threading.Thread(target=sleeper) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    time.sleep(0.15)


def _stat_cpu_ns() -> int:
    """utime + stime of this process from /proc/self/stat, in ns."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_NS


def _vm_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


@dataclass
class Run:
    """What the workload did (marks on the run's clock) and what the store holds."""

    marks: dict[str, int] = field(default_factory=dict)
    burned_ns: int = 0
    pid: int = 0
    child_pid: int = 0
    stat_end_ns: int = 0
    vm_rss: int = 0
    counters: list[tuple[str, int, float, int | None, str]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    health: dict[str, tuple[int, str]] = field(default_factory=dict)

    def series(self, name: str, pid: int | None = None, device: str = "cpu") -> list[tuple[int, float]]:
        """(ts_ns, value) of one counter, in time order."""
        return sorted((t, v) for n, t, v, p, d in self.counters if n == name and p == pid and d == device)

    def cpu(self, pid: int) -> list[tuple[int, float]]:
        """(ts_ns, user + system ns) of a process at each sample."""
        system_ns = dict(self.series(A.PROC_CPU_SYSTEM_NS, pid))
        return [(t, v + system_ns[t]) for t, v in self.series(A.PROC_CPU_USER_NS, pid)]


def _load(path: Path, run: Run | None = None) -> Run:
    """The run's counters, config and health, into ``run`` (a new one by default)."""
    run = run or Run()
    with Store.open(path) as store:
        run.counters = store.query("SELECT name, ts_ns, value, pid, device FROM counters")
        run.config = orjson.loads(store.query("SELECT config FROM runs")[0][0])
        run.health = {c: (n, d) for c, n, d in store.query('SELECT "check", count, detail FROM health')}
    return run


def _before(series: list[tuple[int, float]], ts: int) -> float:
    return [v for t, v in series if t <= ts][-1]


def _after(series: list[tuple[int, float]], ts: int) -> float:
    return next(v for t, v in series if t >= ts)


NATIVE_MISSING = None if _system_native.library_path() is not None else "the C sampler library was not built"
BACKENDS = [pytest.param("native", marks=pytest.mark.skipif(NATIVE_MISSING is not None, reason=str(NATIVE_MISSING))),
            "python"]  # fmt: skip
"""The two samplers, which must give the same counters: the C thread (the default) and the Python one."""


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(_system_native.BACKEND_ENV, request.param)
    return str(request.param)


@pytest.fixture(scope="module", params=BACKENDS)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """One profile of the whole workload at the default interval, with each sampler."""
    saved = os.environ.pop(system.INTERVAL_ENV, None)
    saved_backend = os.environ.get(_system_native.BACKEND_ENV)
    os.environ[_system_native.BACKEND_ENV] = request.param
    tmp = tmp_path_factory.mktemp("system")
    data = tmp / "data.bin"
    data.write_bytes(os.urandom(READ_BYTES))
    out = Run(pid=os.getpid())
    marks = out.marks
    try:
        with xstack.profile(levels=["model", "system"], path=tmp / "p.duckdb"):
            time.sleep(0.06)
            marks["burn0"] = time.time_ns()
            out.burned_ns = _burn(BURN_S)
            marks["burn1"] = time.time_ns()
            child = multiprocessing.get_context("fork").Process(target=_child, args=(BURN_S,))
            child.start()
            child.join()
            out.child_pid = child.pid or 0
            time.sleep(0.06)
            marks["alloc0"] = time.time_ns()
            blob = b"\x01" * BLOB_BYTES  # written, so every page is resident
            time.sleep(0.12)
            out.vm_rss, marks["rss"] = _vm_rss_bytes(), time.time_ns()
            time.sleep(0.06)
            marks["alloc1"] = time.time_ns()
            del blob
            time.sleep(0.06)
            marks["read0"] = time.time_ns()
            with open(data, "rb", buffering=0) as f:
                assert len(f.read()) == READ_BYTES
            time.sleep(0.06)
            marks["read1"] = marks["sleep0"] = time.time_ns()
            for _ in range(SLEEPS):
                time.sleep(0.002)
            marks["sleep1"] = time.time_ns()
            out.stat_end_ns = _stat_cpu_ns()
    finally:
        if saved is not None:
            os.environ[system.INTERVAL_ENV] = saved
        if saved_backend is None:
            os.environ.pop(_system_native.BACKEND_ENV, None)
        else:
            os.environ[_system_native.BACKEND_ENV] = saved_backend
    yield _load(tmp / "p.duckdb", out)


def test_last_cpu_sample_matches_proc_stat(run: Run) -> None:
    # the last sample is taken as the region ends, just after the workload read /proc/self/stat; stat truncates
    # user and system time to clock ticks each
    last = run.cpu(run.pid)[-1][1]
    assert -1e6 <= last - run.stat_end_ns <= INTERVAL_NS + 2 * TICK_NS


def test_cpu_time_covers_a_known_burn(run: Run) -> None:
    cpu = run.cpu(run.pid)
    used = _after(cpu, run.marks["burn1"]) - _before(cpu, run.marks["burn0"])
    assert used >= 0.8 * run.burned_ns, (used, run.burned_ns)
    # the burning thread, plus what the idle others and the edges add: the samples around the burn may come late
    # on a loaded machine (CI), and the workload goes on between the burn's end and the next sample, on one core
    start = max(t for t, _ in cpu if t <= run.marks["burn0"])
    end = min(t for t, _ in cpu if t >= run.marks["burn1"])
    edges = (run.marks["burn0"] - start) + (end - run.marks["burn1"])
    # and the sampler's own CPU, a thread of this process: with the Python one about 1 ms a sample, which adds
    # up where a stalled machine stretches the burn (0.3 s of CPU over 2.9 s once on CI: 290 samples)
    cfg = run.config[A.CONFIG_SYSTEM]
    sampler_ns = cfg["sampler_cpu_ns"] / cfg["samples"] * sum(1 for t, _ in cpu if start <= t <= end)
    assert used <= run.burned_ns + edges + sampler_ns + 50e6, (used, run.burned_ns, edges, sampler_ns)


def test_rss_follows_a_known_allocation(run: Run) -> None:
    rss = run.series(A.PROC_RSS_BYTES, run.pid)
    # the sample closest to the moment the workload read its VmRSS, while the blob was alive (about 24 samples;
    # none where the machine stalled the whole sampler for those 0.24 s, as a CI VM once did for seconds)
    alive = [(abs(t - run.marks["rss"]), v) for t, v in rss if run.marks["alloc0"] < t < run.marks["alloc1"]]
    if not alive:
        pytest.skip("no sample while the allocation was alive: the machine stalled the sampler")
    rise = _before(rss, run.marks["alloc1"]) - _before(rss, run.marks["alloc0"])
    assert abs(rise - BLOB_BYTES) <= 24 << 20, rise
    assert abs(min(alive)[1] - run.vm_rss) <= 16 << 20


def test_a_child_process_is_sampled_with_its_own_cpu_time(run: Run) -> None:
    assert run.child_pid and run.child_pid != run.pid
    cpu = run.cpu(run.child_pid)
    assert cpu, "no samples of the child process"
    assert cpu[-1][1] >= 0.8 * BURN_S * 1e9
    assert run.series(A.PROC_RSS_BYTES, run.child_pid)[-1][1] > 0
    assert run.config[A.CONFIG_SYSTEM]["workers"] >= 1
    assert run.health["system_processes"][0] >= 2
    assert "system_sampler_errors" not in run.health  # the child ended between two reads without an error


def test_context_switches_count_the_sleeps(run: Run) -> None:
    voluntary = run.series(A.PROC_CTX_VOLUNTARY, run.pid)
    slept = _after(voluntary, run.marks["sleep1"]) - _before(voluntary, run.marks["sleep0"])
    # each sleep blocks once; the sampler thread's own switches (one per sample at least) are left out
    assert SLEEPS * 0.8 <= slept <= SLEEPS * 2, slept
    assert run.series(A.PROC_CTX_INVOLUNTARY, run.pid)


def test_io_counters_see_a_read_and_not_the_sampler(run: Run) -> None:
    rchar = run.series(A.PROC_IO_RCHAR, run.pid)
    read = _after(rchar, run.marks["read1"]) - _before(rchar, run.marks["read0"])
    assert READ_BYTES <= read <= READ_BYTES + (64 << 10), read
    quiet = _before(rchar, run.marks["sleep1"]) - _after(rchar, run.marks["sleep0"])
    assert quiet < 4096, "the sampler's own /proc reads were counted"


def test_every_core_and_the_machine_have_counters(run: Run) -> None:
    cores = {d for n, _t, _v, _p, d in run.counters if n == A.CPU_BUSY_PCT}
    assert cores == {"cpu"} | {f"cpu:{i}" for i in range(os.cpu_count() or 1)}
    busy = [v for n, _t, v, _p, _d in run.counters if n == A.CPU_BUSY_PCT]
    assert all(0 <= v <= 100 for v in busy)
    assert max(v for _t, v in run.series(A.CPU_PROCS_RUNNING)) >= 1
    used, available = run.series(A.MEM_USED_BYTES)[-1][1], run.series(A.MEM_AVAILABLE_BYTES)[-1][1]
    with open("/proc/meminfo") as f:
        total = int(f.readline().split()[1]) * 1024
    assert used > 0 and available > 0 and abs(used + available - total) < 1024
    assert all(p is None for n, _t, _v, p, _d in run.counters if not n.startswith("proc."))


def test_config_and_health_say_how_the_sampler_ran(run: Run) -> None:
    cfg = run.config[A.CONFIG_SYSTEM]
    assert cfg["interval_ms"] == system.DEFAULT_INTERVAL_MS and cfg["cores"] == os.cpu_count()
    assert cfg["samples"] == run.health["system_samples"][0] > 0
    assert cfg["late_samples"] == run.health.get("system_late_samples", (0, ""))[0]
    torch = sys.modules.get("torch")  # never imported for the program: none where it did not import it
    assert cfg["torch_threads"] == (torch.get_num_threads() if torch is not None else None)
    assert cfg["syscalls"] is False and cfg["syscall_tool"] is None
    assert cfg["sampler_cpu_ns"] > 0 and cfg["sample_us"] > 0
    assert cfg["sampler"] in ("native", "python") and cfg["sampler_tid"] in cfg["sampler_tids"]
    assert cfg["sampler_tid"] != threading.get_native_id()
    if cfg["nvml"] is not None:  # no GPU telemetry here: no counters, the reason kept
        assert cfg["gpus"] == [] and not any(d.startswith("cuda") for *_, d in run.counters)
        expected = _system_nvml.gpus_expected()
        assert ("system_no_gpu_telemetry" in run.health) == expected


def _profile_sleeping(path: Path, seconds: float) -> Run:
    with xstack.profile(levels=["model", "system"], path=path):
        time.sleep(seconds)
    return _load(path)


@pytest.mark.parametrize(("interval_ms", "low"), [(1.0, 150), (50.0, 6)])
def test_the_interval_is_configurable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interval_ms: float, low: int, backend: str
) -> None:
    """Half a second asleep: at least ``low`` samples due (taken or, on a busy machine, late), and no more
    than one per interval of the whole profile, its start and end included (which take a tenth of a second or
    more on a loaded machine)."""
    monkeypatch.setenv(system.INTERVAL_ENV, str(interval_ms))
    began = time.monotonic()
    run = _profile_sleeping(tmp_path / "p.duckdb", 0.5)
    high = (time.monotonic() - began) * 1000 / interval_ms + 2
    cfg = run.config[A.CONFIG_SYSTEM]
    assert cfg["interval_ms"] == interval_ms and cfg["sampler"] == backend
    assert low <= cfg["samples"] + cfg["late_samples"] and cfg["samples"] <= high, (cfg, high)
    assert len(run.series(A.PROC_CPU_USER_NS, os.getpid())) == cfg["samples"]


def test_a_bad_interval_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("fast", "0", "-5"):
        monkeypatch.setenv(system.INTERVAL_ENV, bad)
        with pytest.raises(UsageError, match=system.INTERVAL_ENV), xstack.profile("model,system", tmp_path / "p"):
            pass
    assert not list(tmp_path.iterdir())


def test_a_full_buffer_halves_the_samples_and_keeps_the_whole_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    monkeypatch.setenv(system.INTERVAL_ENV, "1")
    # room for 16 samples: two halvings take some 24 of the 400 due, however busy the machine
    monkeypatch.setattr(_system_sampler, "BUFFER_CAP_BYTES", 8 * _system_sampler.PROC_STRIDE * 16)
    with xstack.profile(levels=["model", "system"], path=tmp_path / "p.duckdb"):
        start = time.time_ns()
        time.sleep(0.4)
        end = time.time_ns()
    run = _load(tmp_path / "p.duckdb")
    assert run.health["system_interval_doubled"][0] >= 2
    cpu = run.series(A.PROC_CPU_USER_NS, os.getpid())
    assert cpu[0][0] <= start and cpu[-1][0] >= end  # the first and the last sample are always kept


@pytest.mark.gpu
def test_gpu_counters_through_nvml(tmp_path: Path) -> None:
    gpus = _system_nvml.Gpus()
    reason = gpus.open()
    gpus.close()
    if reason is not None:
        pytest.skip(f"no GPU telemetry here: {reason}")
    run = _profile_sleeping(tmp_path / "p.duckdb", 0.3)
    cfg = run.config[A.CONFIG_SYSTEM]
    assert cfg["nvml"] is None and cfg["gpus"][0] == "cuda:0" and cfg["gpu_names"]["cuda:0"]

    def last(name: str) -> float:
        return run.series(name, None, "cuda:0")[-1][1]

    assert 0 <= last(A.GPU_UTIL_PCT) <= 100 and 0 <= last(A.GPU_MEM_UTIL_PCT) <= 100
    assert last(A.GPU_MEM_USED_BYTES) > 0
    assert 5 < last(A.GPU_POWER_W) < 2000
    assert 0 < last(A.GPU_SM_CLOCK_MHZ) < 5000 and 0 < last(A.GPU_MEM_CLOCK_MHZ) < 20000
    assert 5 < last(A.GPU_TEMP_C) < 120
    assert last(A.GPU_THROTTLE_REASONS) >= 0
    unsupported = run.health.get("system_gpu_unsupported", (0, ""))[1]
    if "pcie" not in unsupported:
        assert last(A.GPU_PCIE_TX_BYTES_PER_S) >= 0 and last(A.GPU_PCIE_RX_BYTES_PER_S) >= 0


def test_xstack_collectors_lists_the_system_level_as_ready(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["collectors"]) == 0  # in-process: tests/cli runs the command in a subprocess
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.strip("│ ").startswith("system ")]
    assert "xstack.collect.system:" in line and "ready: " in line
    sampler = "sampler thread in C" if NATIVE_MISSING is None else "Python sampler thread"
    assert sampler in line and "(--syscalls)" in line


def test_a_sampler_that_cannot_open_proc_fails_its_start_on_the_programs_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """/proc is opened on the sampler's thread (the syscall pass leaves that thread out); what goes wrong there
    is raised by ``start``, where the program called it, and the thread is gone."""

    def unreadable() -> None:
        raise PermissionError(13, "Permission denied", "/proc/stat")

    monkeypatch.setattr(_system_sampler, "Machine", unreadable)
    monkeypatch.setenv(_system_native.BACKEND_ENV, "python")
    sampler = _system_sampler.Sampler(10_000_000)
    with pytest.raises(PermissionError, match="/proc/stat"):
        sampler.start()
    assert sampler._thread is not None and not sampler._thread.is_alive()


@pytest.mark.skipif(NATIVE_MISSING is not None, reason=str(NATIVE_MISSING))
def test_the_c_sampler_names_the_file_it_cannot_open() -> None:
    gone = multiprocessing.get_context("fork").Process(target=time.sleep, args=(0,))
    gone.start()
    gone.join()
    sampler = _system_native.NativeSampler(gone.pid or 0, 10_000_000, 50_000_000, 100_000_000, 1 << 20, 100)
    with pytest.raises(FileNotFoundError, match=f"/proc/{gone.pid}/stat"):
        sampler.start()
    assert not sampler.running


def test_a_sampler_choice_that_is_not_one_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_system_native.BACKEND_ENV, "rust")
    with pytest.raises(UsageError, match=_system_native.BACKEND_ENV):
        _system_sampler.Sampler(10_000_000)


def _hold_the_lock(seconds: float) -> None:
    """About ``seconds`` inside one C call (``sum`` over a range) that never lets the interpreter lock go, not
    even when another thread asks for it."""
    n = 200_000
    began = time.perf_counter()
    sum(range(n))
    sum(range(int(n * seconds / max(time.perf_counter() - began, 1e-6))))


@pytest.mark.skipif(NATIVE_MISSING is not None, reason=str(NATIVE_MISSING))
def test_the_c_sampler_never_takes_the_interpreter_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the C sampler the only Python thread the system level starts opens NVML and, with no GPU, ends:
    samples go on while the program holds the interpreter lock in one long C call."""
    monkeypatch.setenv(system.INTERVAL_ENV, "5")
    monkeypatch.setenv(_system_native.BACKEND_ENV, "native")
    with xstack.profile(levels=["model", "system"], path=tmp_path / "p.duckdb"):
        start = time.time_ns()
        _hold_the_lock(0.4)
        end = time.time_ns()
        python_threads = [t.name for t in threading.enumerate() if t.name == "xstack-system-sampler"]
    run = _load(tmp_path / "p.duckdb")
    if run.config[A.CONFIG_SYSTEM]["gpus"]:
        pytest.skip("GPUs here: a Python thread samples them")
    assert python_threads == []
    # a sampler that needed the lock would take none while it is held (the Python one takes one at most, when
    # the call ends); a busy machine makes some late (29 of 89 with three busy processes on two cores)
    during = [ts for ts, _ in run.series(A.PROC_CPU_USER_NS, os.getpid()) if start < ts < end]
    assert len(during) >= 0.25 * (end - start) / 5e6, (len(during), (end - start) / 1e6)


@pytest.mark.skipif(NATIVE_MISSING is not None, reason=str(NATIVE_MISSING))
def test_the_c_sampler_thread_blocks_signals_so_the_programs_threads_get_them() -> None:
    sampler = _system_native.NativeSampler(os.getpid(), 10_000_000, 50_000_000, 100_000_000, 1 << 20, 100)
    sampler.start()
    try:
        with open(f"/proc/{os.getpid()}/task/{sampler.stats['tid']}/status") as f:
            blocked = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
    finally:
        sampler.stop()
        sampler.close()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGALRM, signal.SIGUSR1):
        assert blocked >> (signum - 1) & 1, signum


def test_a_threaded_child_counts_its_threads_and_their_switches(tmp_path: Path, backend: str) -> None:
    """A worker process with 3 threads that each sleep 30 times: its thread count and its voluntary context
    switches summed over the threads the sampler listed (every 100 ms at most), those that ended included. A
    thread that starts and ends between two listings is not seen, so the sum may fall short of all 90."""
    with xstack.profile(levels=["model", "system"], path=tmp_path / "p.duckdb"):
        child = multiprocessing.get_context("fork").Process(target=_threaded_child, args=(3, 30))
        child.start()
        child.join()
    run = _load(tmp_path / "p.duckdb")
    assert run.config[A.CONFIG_SYSTEM]["sampler"] == backend
    threads = [v for _, v in run.series(A.PROC_THREADS, child.pid)]
    assert threads and max(threads) == 4, threads  # the main thread and its 3
    voluntary = [v for _, v in run.series(A.PROC_CTX_VOLUNTARY, child.pid)]
    assert voluntary == sorted(voluntary), voluntary  # ended threads keep their count
    assert voluntary[-1] >= 30, voluntary


def test_the_gpu_threads_own_switches_are_taken_out_of_the_programs() -> None:
    """With the C sampler, the GPU thread's switches (read at each of its samples) leave the root's rows: each
    row loses the last counts read at or before its time; other processes' rows are left alone."""
    root, child = 100, 200
    stride = _system_sampler.PROC_STRIDE
    vol, invol = _system_sampler.PROC_STRIDE_CTX

    def row(k: int, ts: int, pid: int, v: int, iv: int) -> list[int]:
        out = [k, ts, pid] + [0] * (stride - 3)
        out[vol], out[invol] = v, iv
        return out

    rows = array(
        "q", row(0, 5, root, 10, 1) + row(1, 15, root, 20, 2) + row(1, 15, child, 7, 7) + row(2, 30, root, 40, 3)
    )
    _system_sampler._without_own_switches(rows, root, [(10, 3, 1), (20, 6, 1)])
    got = [(rows[i + 2], rows[i + vol], rows[i + invol]) for i in range(0, len(rows), stride)]
    assert got == [(root, 10, 1), (root, 17, 1), (child, 7, 7), (root, 34, 2)]


SPAWNED = """
import multiprocessing, time

def work():
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")  # starts the resource tracker, as a spawn DataLoader does
    for _ in range(2):
        p = ctx.Process(target=work)
        p.start()
        p.join()
"""


def _sampled(tmp_path: Path, program: str) -> Path:
    """``program`` profiled by ``xstack run --levels system`` into ``tmp_path/p.duckdb`` (the sampler: the one the
    ``backend`` fixture set in the environment). The paths are relative to ``tmp_path``, the working directory:
    a program that runs its own command line again in another folder finds its own copy and store there."""
    (tmp_path / "prog.py").write_text(program)
    done = subprocess.run(
        [sys.executable, "-m", "xstack", "run", "--levels", "system", "-o", "p.duckdb", "--", "python", "prog.py"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return tmp_path / "p.duckdb"


@pytest.mark.skipif(_unavailable() is not None, reason=f"cannot sample here: {_unavailable()}")
def test_the_resource_tracker_is_named_and_not_a_worker(backend: str, tmp_path: Path) -> None:
    """A spawn context starts multiprocessing's resource tracker beside its workers: the sampler tells it by its
    command line, and system.cpu shows it named, out of the worker count and the workers' CPU."""
    from xstack.analyze._system_cpu import cpu_saturation

    with Store.open(_sampled(tmp_path, SPAWNED)) as store:
        config = orjson.loads(store.query("SELECT config FROM runs")[0][0])
        result = cpu_saturation(store, 1)
    roles = config[A.CONFIG_SYSTEM]["process_roles"]
    assert list(roles.values()) == ["resource_tracker"], roles
    tracker = int(next(iter(roles)))
    named = {r[1]: r[0] for r in result.rows if r[1] is not None}
    assert named[tracker] == f"resource tracker {tracker}"
    workers = [pid for pid, name in named.items() if name.startswith("worker ")]
    assert len(workers) == 2  # one after the other
    assert result.facts["workers"] == 1
    assert config[A.CONFIG_SYSTEM]["workers"] == 1
    assert list(result.facts["helpers"]) == [f"resource tracker {tracker}"]
    busy = {r[1]: r[2] for r in result.rows if r[1] is not None}
    assert result.facts["workers_cpu_pct"] == pytest.approx(sum(busy[p] or 0.0 for p in workers))


EXECS = """
import multiprocessing, os, subprocess, sys, time

def work():
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        pass

if __name__ == "__main__":
    worker = multiprocessing.get_context("fork").Process(target=work)
    worker.start()
    subprocess.run([sys.executable, "-c", "import time; time.sleep(0.5)"], check=True)
    worker.join()
"""


@pytest.mark.skipif(_unavailable() is not None, reason=f"cannot sample here: {_unavailable()}")
def test_a_program_started_by_exec_is_a_subprocess_not_a_worker(backend: str, tmp_path: Path) -> None:
    """Another Python run by subprocess.run beside a forked worker: the sampler gives it the role the io level
    gives it, and system.cpu and system.memory count the worker alone."""
    from xstack.analyze._system_cpu import cpu_saturation
    from xstack.analyze._system_memory import memory_growth

    with Store.open(_sampled(tmp_path, EXECS)) as store:
        config = orjson.loads(store.query("SELECT config FROM runs")[0][0])[A.CONFIG_SYSTEM]
        cpu, memory = cpu_saturation(store, 1), memory_growth(store, 1)
        export_perfetto(store, tmp_path / "p.json")
    assert config["sampler"] == backend
    roles = config["process_roles"]
    assert list(roles.values()) == ["subprocess"], roles
    child = int(next(iter(roles)))
    named = {r[1]: r[0] for r in cpu.rows if r[1] is not None}
    assert named[child] == f"subprocess {child}"
    assert [name for name in named.values() if name.startswith("worker ")] != []
    assert config["workers"] == cpu.facts["workers"] == 1
    assert list(cpu.facts["subprocesses"]) == [f"subprocess {child}"] and cpu.facts["helpers"] == {}
    assert max(memory.column("workers")) == 1 and any(memory.column("others RSS"))
    tracks = {e["args"]["name"].split(" [run")[0] for e in orjson.loads((tmp_path / "p.json").read_bytes())
              ["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}  # fmt: skip
    assert f"subprocess (pid {child})" in tracks


RERUN = """
import json, os, shutil, subprocess, time

COPY = "XSTACK_TEST_COPY"  # the copy's mark: an argument would change its command line


def fork_worker():
    pid = os.fork()
    if pid == 0:
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass
        time.sleep(0.4)  # alive for a few listings of the tree after the burn
        os._exit(0)
    return pid


if __name__ == "__main__":
    if os.environ.get(COPY):  # the copy: two forked children
        children = [fork_worker() for _ in range(2)]
        for pid in children:
            os.waitpid(pid, 0)
        with open("pids.json", "w") as f:  # the copy is an xstack run: its program runs in a child of it
            json.dump({"children": children, "program": os.getpid()}, f)
    else:  # the program: a worker of its own, and a copy of itself run with its very command line
        own = fork_worker()
        with open("/proc/self/cmdline", "rb") as f:
            argv = f.read().decode().split("\\0")[:-1]
        os.mkdir("copy")  # where the copy's relative paths (its store, this file) lead to its own files
        shutil.copy(__file__, "copy")
        copy = subprocess.Popen(argv, cwd="copy", env=os.environ | {COPY: "1"})
        if copy.wait():
            raise SystemExit("the copy failed")
        os.waitpid(own, 0)
        with open("pids.json", "w") as f:
            json.dump({"own": own, "copy": copy.pid, "argv": argv}, f)
"""


@pytest.mark.skipif(_unavailable() is not None, reason=f"cannot sample here: {_unavailable()}")
def test_a_copy_of_the_program_and_the_processes_it_forked_are_subprocesses(backend: str, tmp_path: Path) -> None:
    """The program runs its own command line again (``xstack run`` and all, in another folder): the copy has the
    command line of the program, and its forked children have it too, as the program's own forked worker does.
    The copy is told by its stack (exec placed it anew), its children by their parent (the copy's ``xstack run``
    runs the program in a child of its own, which waits on it); the worker stays one."""
    with Store.open(_sampled(tmp_path, RERUN)) as store:
        config = orjson.loads(store.query("SELECT config FROM runs")[0][0])[A.CONFIG_SYSTEM]
        sampled = {int(r[0]) for r in store.query("SELECT DISTINCT pid FROM counters WHERE starts_with(name, 'proc.')")}
    pids = orjson.loads((tmp_path / "pids.json").read_bytes())
    copied = orjson.loads((tmp_path / "copy" / "pids.json").read_bytes())
    children = copied["children"]
    assert pids["argv"][-2:] == ["python", "prog.py"] and "xstack" in pids["argv"]  # the copy's command line
    assert config["sampler"] == backend
    assert {pids["own"], pids["copy"], *children} <= sampled
    roles = {int(pid): role for pid, role in config["process_roles"].items()}
    assert roles == {pid: "subprocess" for pid in (pids["copy"], copied["program"], *children)}, roles
    assert config["workers"] == 1


SHORT_LIVED_HELPER = """
import multiprocessing, time
from multiprocessing import resource_tracker, shared_memory

def work():
    end = time.monotonic() + 0.4
    while time.monotonic() < end:
        pass

if __name__ == "__main__":
    shm = shared_memory.SharedMemory(create=True, size=64)  # registered with the resource tracker, which starts
    shm.close()
    shm.unlink()
    time.sleep(0.4)
    resource_tracker._resource_tracker._stop()  # the tracker ends long before the program does
    ctx = multiprocessing.get_context("fork")  # then two workers at once, with the program's command line
    workers = [ctx.Process(target=work) for _ in range(2)]
    for p in workers:
        p.start()
    for p in workers:
        p.join()
    time.sleep(0.2)
"""


@pytest.mark.skipif(_unavailable() is not None, reason=f"cannot sample here: {_unavailable()}")
def test_a_helper_that_ends_before_the_sampler_is_told_by_its_command_line_at_first_sight(
    backend: str, tmp_path: Path
) -> None:
    """The resource tracker is gone by the time the sampler stops: its role comes from the command line read
    when it was first seen, so it is no worker, and does not take the place of one in the count either."""
    with Store.open(_sampled(tmp_path, SHORT_LIVED_HELPER)) as store:
        config = orjson.loads(store.query("SELECT config FROM runs")[0][0])[A.CONFIG_SYSTEM]
        sampled = {int(r[0]) for r in store.query("SELECT DISTINCT pid FROM counters WHERE starts_with(name, 'proc.')")}
    assert config["sampler"] == backend
    roles = config["process_roles"]
    assert list(roles.values()) == ["resource_tracker"], roles
    assert int(next(iter(roles))) in sampled and len(sampled) == 4  # the program, the tracker, two workers
    assert config["workers"] == 2


def test_a_process_with_its_parents_command_line_is_no_helper() -> None:
    """A worker the forkserver forked has the forkserver's command line: inherited, it is not a helper."""
    code = "from multiprocessing.forkserver import main; main(8, 9, ['__main__'])"
    tracker = "from multiprocessing.resource_tracker import main;main(5)"
    lines = [(11, 10, ["python", "-c", code], False), (12, 11, ["python", "-c", code], True), (14, 10, [], False),
             (15, 10, ["python", "-c", tracker], False)]  # fmt: skip
    assert _system_sampler.process_roles(lines, ["python", "train.py"]) == {11: "forkserver", 15: "resource_tracker"}


ROOT = ["python", "train.py"]
"""The profiled program's command line (pid 10) in the records of the tests below."""
SPAWNED_ARGV = ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=7, "
                "pipe_handle=9)", "--multiprocessing-fork"]  # fmt: skip


def test_programs_started_by_exec_are_subprocesses_as_the_io_level_tells_them() -> None:
    """A command line of its own is a program started by exec (cat, another Python), and a process forked from
    one is too; a DataLoader worker (the program's command line, inherited) and a worker multiprocessing
    spawned (exec'd, with --multiprocessing-fork) are workers."""
    forks = ["python", "-c", "import os; os.fork()"]
    lines = [(11, 10, ROOT, True), (12, 10, SPAWNED_ARGV, False), (13, 10, ["cat", "x.bin"], False),
             (14, 10, ["sh", "-c", "cat x"], False), (15, 10, forks, False), (16, 15, forks, True),
             (17, 10, ROOT, False)]  # fmt: skip
    assert _system_sampler.process_roles(lines, ROOT) == {13: "subprocess", 14: "subprocess", 15: "subprocess",
                                                 16: "subprocess", 17: "subprocess"}  # fmt: skip


def test_the_processes_a_subprocess_started_are_subprocesses_whatever_their_command_line() -> None:
    """A copy of the program started by exec with its very command line (a stack of its own: not inherited) is
    a subprocess, and so is every process under it, by its parent: forked with that same command line (which a
    worker of the program has too), a grandchild, a worker it spawned, its resource tracker, one whose command
    line could not be read. The program's own forked worker is still a worker."""
    tracker = ["python", "-c", "from multiprocessing.resource_tracker import main;main(5)"]
    lines = [(20, 10, ROOT, False), (21, 20, ROOT, True), (22, 20, ROOT, True), (23, 21, ROOT, True),
             (24, 20, SPAWNED_ARGV, False), (25, 20, tracker, False), (26, 20, [], False), (27, 10, ROOT, True),
             (28, 27, ROOT, True), (29, 10, tracker, False), (30, 29, tracker, True)]  # fmt: skip
    assert _system_sampler.process_roles(lines, ROOT) == {
        20: "subprocess", 21: "subprocess", 22: "subprocess", 23: "subprocess", 24: "subprocess",
        25: "subprocess", 26: "subprocess", 29: "resource_tracker",
    }  # fmt: skip
    assert _system_sampler.process_roles(reversed(lines), ROOT) == _system_sampler.process_roles(
        lines, ROOT
    )  # children seen first


def test_a_process_whose_parent_was_not_seen_is_told_by_its_command_line() -> None:
    """The parent ended before the sampler saw its child (which went to pid 1): the command line alone tells.
    A subprocess's command line, inherited, is a subprocess, and so are the processes forked from it; the
    program's command line is a worker's. A pid reused into a loop of parents ends the walk."""
    forks = ["python", "-c", "import os; os.fork()"]
    lines = [(15, 10, forks, False), (31, 1, forks, True), (32, 31, forks, True), (33, 1, ROOT, True),
             (34, 35, ROOT, True), (35, 34, ROOT, True)]  # fmt: skip
    assert _system_sampler.process_roles(lines, ROOT) == {15: "subprocess", 31: "subprocess", 32: "subprocess"}


@pytest.mark.skipif(_unavailable() is not None, reason=f"cannot sample here: {_unavailable()}")
def test_the_sampler_starts_before_the_other_levels(tmp_path: Path) -> None:
    """The op level's start is seconds of the warm-up step in a fresh interpreter (torch's profiler imports
    torch._inductor as it starts): the sampler, started first, covers it, where it used to begin after it."""
    (tmp_path / "prog.py").write_text(
        "import torch\nm = torch.nn.Linear(8, 8)\nfor _ in range(3):\n    m(torch.ones(2, 8))\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "xstack", "run", "--levels", "model,op,system", "-o", "p.duckdb", "--", "python",
         "prog.py"], capture_output=True, text=True, cwd=tmp_path, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Store.open(tmp_path / "p.duckdb") as store:
        start, first_op = store.query(
            "SELECT min(start_ns), min(start_ns) FILTER (WHERE level = 'op') FROM spans WHERE device = 'cpu'"
        )[0]
        first_sample = store.query("SELECT min(ts_ns) FROM counters")[0][0]
    assert first_sample < first_op and first_sample - start < 200_000_000, (first_sample - start, first_op - start)


@pytest.mark.skipif(NATIVE_MISSING is not None, reason=str(NATIVE_MISSING))
def test_the_c_sampler_appends_its_rows_to_a_journal_as_it_goes(tmp_path: Path) -> None:
    """With journal files the thread appends every row it takes, once each, at most every 0.25 s: while it
    runs the files hold the rows up to the last append, also across halvings of its buffer (which drop rows
    from memory, not from the journal), and the reader ignores a last block the kill cut."""
    fds = _system_native.open_journal(tmp_path)
    # a buffer of a few samples: halved many times while it runs
    sampler = _system_native.NativeSampler(os.getpid(), 2_000_000, 10_000_000, 100_000_000,
                                           8 * _system_sampler.PROC_STRIDE * 60, 100, fds)  # fmt: skip
    try:
        t0 = time.monotonic()
        sampler.start()
        stride = _system_sampler.MACHINE_HEAD + 2 * len(sampler.cpus())
        time.sleep(0.9)
        procs, machine = _system_native.read_journal_rows(tmp_path, stride)  # as a kill would leave them
        sampler.stop()
        elapsed = time.monotonic() - t0
        assert sampler.stats["halvings"] >= 2 and not sampler.stats["journal_failed"]
        assert 2 <= sampler.stats["journal_appends"] <= elapsed / _system_native.JOURNAL_PERIOD_S + 1
        kept = sampler.proc_rows()
    finally:
        sampler.close()
        for fd in fds:
            os.close(fd)
    samples = list(procs[0 :: _system_sampler.PROC_STRIDE])
    assert samples == sorted(set(samples)) and samples[0] == 0  # each row once, in order, from the first
    step = sampler.stats["step"]
    assert any(k % step for k in samples)  # rows the halvings dropped from memory stay in the journal
    assert len(machine) % stride == 0 and set(machine[0::stride]) <= set(samples)
    ts = list(procs[1 :: _system_sampler.PROC_STRIDE])
    assert ts == sorted(ts) and ts[-1] <= kept[-_system_sampler.PROC_STRIDE + 1]
    # the rows the memory kept after halving are among the journal's
    journal_rows = {tuple(procs[i : i + 3]) for i in range(0, len(procs), _system_sampler.PROC_STRIDE)}
    memory_rows = [
        tuple(kept[i : i + 3]) for i in range(0, len(kept), _system_sampler.PROC_STRIDE) if kept[i + 1] <= ts[-1]
    ]
    assert memory_rows and all(row in journal_rows for row in memory_rows)
    # a kill in the middle of an append: the cut block is left out, the whole ones before it kept
    rows_file = tmp_path / _system_native.JOURNAL_ROWS[0]
    whole = rows_file.read_bytes()
    rows_file.write_bytes(whole[:-20])
    cut_procs, cut_machine = _system_native.read_journal_rows(tmp_path, stride)
    assert len(cut_procs) % _system_sampler.PROC_STRIDE == 0 and len(cut_machine) % stride == 0
    assert 0 < len(cut_procs) + len(cut_machine) < len(procs) + len(machine)
    assert cut_procs == procs[: len(cut_procs)] and cut_machine == machine[: len(cut_machine)]
    rows_file.write_bytes(whole + b"\x07" * 40)  # garbage after the last block: ignored too
    assert _system_native.read_journal_rows(tmp_path, stride) == (procs, machine)


def test_the_journal_reader_puts_the_newer_file_last(tmp_path: Path) -> None:
    """Past its size the thread goes on in the other file, emptied first: the file whose rows start later holds
    the newer ones, whichever its name."""
    stride = _system_sampler.PROC_STRIDE

    def block(k: int, ts: int) -> bytes:
        return array("q", [1, stride, k, ts, 7, *range(stride - 3)]).tobytes()

    (tmp_path / _system_native.JOURNAL_ROWS[0]).write_bytes(block(5, 500) + block(6, 600))
    (tmp_path / _system_native.JOURNAL_ROWS[1]).write_bytes(block(3, 300) + block(4, 400))
    procs, machine = _system_native.read_journal_rows(tmp_path, _system_sampler.MACHINE_HEAD + 4)
    assert list(procs[0::stride]) == [3, 4, 5, 6] and not machine
