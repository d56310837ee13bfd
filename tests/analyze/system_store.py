"""Built stores with system data, numbers chosen so that every system analysis can be checked by hand.

``sampler_run``: the sampler's counters for a loop of four 100 ms steps (the first a warm-up) on a 2-core
machine, sampled every 10 ms from 0 to 400 ms (samples 0..40). The main process (pid 100) burns 0.5 core in
user mode and 0.1 in the kernel, has 10 threads, 5 voluntary and 2 involuntary switches per sample, and an RSS
of 100 MiB growing 2 MiB per step. One worker (pid 201) appears at 150 ms and burns one core, 1 involuntary
switch per sample, 50 MiB. The machine is 70% busy (core 0 60%, core 1 80%); 3 threads are runnable at every
fifth sample (more than the cores), 1 otherwise; ``Load`` changes these figures. With ``gpu``: one GPU at 90%
utilisation on even samples and 50% on odd ones, its SM clock at 1400 MHz except every fourth sample, when it
runs at 1000 MHz with the software thermal slowdown bit set; the idle bit is set at samples 11, 21, 31...

``syscall_run``: the syscall pass of three 1 ms steps (the first a warm-up), each with a ``dataloader.next``
stage (a 200 us futex wait, a 50 us poll, a 10 us read), a ``Net`` forward stage (a 20 us mmap) holding the
layer ``fc`` (a 30 us write, a 5 us openat), and a 50 us clock_nanosleep in the step itself; plus an openat
outside any stage, reads of a second thread of the main process and of the worker.

``merged_store``: a leveled measurement whose merged run finds the counters in the ``model+system`` pass and
the syscalls in the ``model+layer+system+syscalls`` pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xstack.trace import attrs as A
from xstack.trace.sink import Sink
from xstack.trace.store import RunInfo, Store

MAIN, WORKER, SAMPLER_TID = 100, 201, 102
CORES = 2
INTERVAL_NS = 10_000_000
STEP_NS = 100_000_000
STEPS, WARMUP = 4, 1
SAMPLES = 41
MIB = 2**20
WORKER_FROM = 15
"""The sample at which the worker appears."""


def system_config(*, syscalls: bool = False, gpus: list[str] | None = None, workers: int = 1,
                  torch_threads: int | None = 2) -> dict[str, Any]:  # fmt: skip
    """A run's ``config.system`` as the contract describes it."""
    return {
        "interval_ms": INTERVAL_NS / 1e6, "cores": CORES, "samples": SAMPLES, "late_samples": 0,
        "torch_threads": torch_threads, "gpus": gpus or [], "nvml": None if gpus else "no NVIDIA driver",
        "syscalls": syscalls, "syscall_tool": "strace 6.1" if syscalls else None, "workers": workers,
    }  # fmt: skip


def run_config(**system: Any) -> dict[str, Any]:
    """A pass's ``runs.config``: its pid, warm-up and system settings."""
    measure = {"warmup": WARMUP, "iterations": STEPS - WARMUP}
    return {"pid": MAIN, "measure": measure, A.CONFIG_SYSTEM: system_config(**system)}


def steps(sink: Sink, n: int, step_ns: int, first_id: int = 1) -> None:
    """``n`` step spans of ``step_ns`` each, back to back from 0, on the main thread."""
    for k in range(n):
        sink.span(first_id + k, None, "model", f"step#{k}", k * step_ns, step_ns, MAIN, MAIN,
                  {A.MODEL_KIND: "step", A.MODEL_STEP: k})  # fmt: skip


@dataclass(frozen=True)
class Load:
    """What the sampled processes and the machine do; the defaults are the module docstring's figures."""

    main_cpu: float = 0.6
    """Cores the main process keeps busy (five sixths in user mode, one sixth in the kernel)."""
    worker_cpu: float = 1.0
    """Cores the worker keeps busy once it appears (in user mode)."""
    machine_pct: float = 70.0
    """The machine's CPU busy (%): core 0 ten points below, core 1 ten above."""
    runnable_every: int = 5
    """Every so many samples, 3 threads are runnable (more than the cores); 1 at the others."""
    main_threads: int = 10
    main_involuntary: int = 2
    """Involuntary context switches of the main process per sample."""
    worker_threads: int = 3
    worker: bool = True
    """Whether the worker process is sampled at all (False: a loop without DataLoader workers)."""


def sampler_run(sink: Sink, *, gpu: bool = False, load: Load = Load(), rss_step: float = 2 * MIB) -> None:
    """The counters described in the module docstring, with the figures of ``load``."""
    for i in range(SAMPLES):
        ts = i * INTERVAL_NS
        c = sink.counter
        c(A.PROC_CPU_USER_NS, ts, load.main_cpu * 5 / 6 * ts, pid=MAIN)
        c(A.PROC_CPU_SYSTEM_NS, ts, load.main_cpu / 6 * ts, pid=MAIN)
        c(A.PROC_THREADS, ts, load.main_threads, pid=MAIN)
        c(A.PROC_CTX_VOLUNTARY, ts, 5 * i, pid=MAIN)
        c(A.PROC_CTX_INVOLUNTARY, ts, load.main_involuntary * i, pid=MAIN)
        c(A.PROC_RSS_BYTES, ts, 100 * MIB + rss_step * ts / STEP_NS, pid=MAIN)
        if load.worker and i >= WORKER_FROM:
            c(A.PROC_CPU_USER_NS, ts, load.worker_cpu * (ts - WORKER_FROM * INTERVAL_NS), pid=WORKER)
            c(A.PROC_CPU_SYSTEM_NS, ts, 0, pid=WORKER)
            c(A.PROC_THREADS, ts, load.worker_threads, pid=WORKER)
            c(A.PROC_CTX_VOLUNTARY, ts, 0, pid=WORKER)
            c(A.PROC_CTX_INVOLUNTARY, ts, i - WORKER_FROM, pid=WORKER)
            c(A.PROC_RSS_BYTES, ts, 50 * MIB, pid=WORKER)
        c(A.CPU_BUSY_PCT, ts, load.machine_pct)
        c(A.CPU_BUSY_PCT, ts, load.machine_pct - 10, device="cpu:0")
        c(A.CPU_BUSY_PCT, ts, load.machine_pct + 10, device="cpu:1")
        c(A.CPU_PROCS_RUNNING, ts, 3 if i % load.runnable_every == 0 else 1)
        c(A.MEM_USED_BYTES, ts, 4 * 2**30)
        c(A.MEM_AVAILABLE_BYTES, ts, 12 * 2**30)
        if gpu:
            _gpu_sample(sink, i, ts)


def _gpu_sample(sink: Sink, i: int, ts: int) -> None:
    throttled = i % 4 == 0
    c = sink.counter
    c(A.GPU_UTIL_PCT, ts, 90.0 if i % 2 == 0 else 50.0, device="cuda:0")
    c(A.GPU_MEM_UTIL_PCT, ts, 20.0, device="cuda:0")
    c(A.GPU_MEM_USED_BYTES, ts, 8 * 2**30, device="cuda:0")
    c(A.GPU_POWER_W, ts, 350.0 if throttled else 300.0, device="cuda:0")
    c(A.GPU_SM_CLOCK_MHZ, ts, 1000.0 if throttled else 1400.0, device="cuda:0")
    c(A.GPU_TEMP_C, ts, 85.0 if throttled else 80.0, device="cuda:0")
    c(A.GPU_THROTTLE_REASONS, ts, (0x20 if throttled else 0) | (0x1 if i % 10 == 1 else 0), device="cuda:0")


SYS_STEP_NS = 1_000_000
SYS_STEPS = 3


IDLE_TIDS = (110, 111, 112, 113)
"""Idle helper threads of the main process (an intra-op pool, the pin-memory thread)."""
WORKER_THREAD = 211


def syscall_run(sink: Sink, first_id: int = 1, *, idle: bool = False, measured_waits: float = 1.0) -> None:
    """The syscall pass described in the module docstring: model and layer spans, and ``system`` spans.
    ``idle``: four more threads of the main process (``IDLE_TIDS``) and a second thread of the worker sit in one
    wait each (futex, poll) across the whole pass, as a thread pool's idle threads do. ``measured_waits``: the
    ``dataloader.next`` futex and poll of the measured steps last this share of the warm-up's (a loader that
    waited for its workers to start in the warm-up only)."""
    ids = iter(range(first_id + SYS_STEPS, first_id + 10_000))
    steps(sink, SYS_STEPS, SYS_STEP_NS, first_id)

    def call(parent: int | None, name: str, start: int, dur: int, pid: int = MAIN, tid: int = MAIN,
             attrs: dict[str, Any] | None = None) -> None:  # fmt: skip
        sink.span(next(ids), parent, "system", name, start, dur, pid, tid,
                  {A.SYS_RET: "0", A.SYS_TOOL: "strace", **(attrs or {})})  # fmt: skip

    for k in range(SYS_STEPS):
        s, step = k * SYS_STEP_NS, first_id + k
        loader, forward, fc = next(ids), next(ids), next(ids)
        sink.span(loader, step, "model", "dataloader.next", s, 300_000, MAIN, MAIN, {A.MODEL_KIND: "dataloader"})
        sink.span(forward, step, "model", "Net", s + 300_000, 600_000, MAIN, MAIN, {A.MODEL_KIND: "forward"})
        sink.span(fc, forward, "layer", "fc", s + 400_000, 400_000, MAIN, MAIN, {A.LAYER_PATH: "fc"})
        extra = {A.SYS_ERRNO: "ETIMEDOUT", A.SYS_RET: "-1"} if k == 1 else {}
        scale = 1.0 if k < WARMUP else measured_waits
        call(loader, "futex", s + 10_000, round(200_000 * scale), attrs=extra)
        call(loader, "poll", s + 220_000, round(50_000 * scale))
        call(loader, "read", s + 280_000, 10_000)
        call(forward, "mmap", s + 310_000, 20_000)
        call(fc, "write", s + 410_000, 30_000)
        call(fc, "openat", s + 450_000, 5_000)
        call(step, "clock_nanosleep", s + 920_000, 50_000)
        call(None, "read", s + 100_000, 2_000, tid=SAMPLER_TID)
        call(None, "read", s + 100_000, 100_000, pid=WORKER, tid=WORKER)
    call(None, "openat", SYS_STEPS * SYS_STEP_NS + 10_000, 1_000)
    if idle:
        for tid in IDLE_TIDS:
            call(None, "futex", 0, SYS_STEPS * SYS_STEP_NS, tid=tid)
        call(None, "poll", 0, SYS_STEPS * SYS_STEP_NS, pid=WORKER, tid=WORKER_THREAD)


def cpu_store(path: Path, *, gpu: bool = False, rss_step: float = 2 * MIB, load: Load = Load(),
              config: dict[str, Any] | None = None, waits_ns: int = 0, ops: int = 0,
              **system: Any) -> Store:  # fmt: skip
    """One run (``model``, ``system``) with the sampler's counters and its four steps (``system``: keys of
    ``system_config``; ``rss_step``: the main process's RSS growth per step; ``load``: see ``Load``;
    ``config``: more keys of the run's config, such as ``cpu_count`` and ``dataloaders``; ``waits_ns``: a
    ``dataloader.next`` stage that long at the start of each step; ``ops``: that many op spans in the first
    step, as the op level live in the same run records)."""
    with Store.create(path) as store:
        run = run_config(gpus=["cuda:0"] if gpu else None, **system) | (config or {})
        store.add_run(RunInfo(1, "sampled", levels=["model", "system"], config=run))
        sink = Sink(store, 1)
        steps(sink, STEPS, STEP_NS)
        for k in range(STEPS if waits_ns else 0):
            sink.span(STEPS + 1 + k, 1 + k, "model", "dataloader.next", k * STEP_NS, waits_ns, MAIN, MAIN,
                      {A.MODEL_KIND: "dataloader"})  # fmt: skip
        for k in range(ops):
            sink.span(100 + k, 1, "op", "aten::mm", 10 + k, 1, MAIN, MAIN, {})
        sampler_run(sink, gpu=gpu, rss_step=rss_step, load=load)
        sink.close()
    return Store.open(path)


def syscall_store(path: Path, *, idle: bool = False) -> Store:
    """One run (``model``, ``layer``, ``system``) holding the syscall pass's spans and no counters (``idle``:
    see ``syscall_run``)."""
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "traced", levels=["model", "layer", "system"], config=run_config(syscalls=True)))
        sink = Sink(store, 1)
        syscall_run(sink, idle=idle)
        sink.close()
    return Store.open(path)


MERGED = 4


def merged_store(
    path: Path,
    *,
    gpu: bool = False,
    step_ns: int = STEP_NS,
    stages: dict[str, int] | None = None,
    measured_waits: float = 1.0,
) -> Store:
    """A ``model`` pass (run 1), a ``model+system`` pass (run 2: the counters), a syscall pass (run 3: syscall
    spans, and counters of its own with twice the main process's CPU and no memory growth, which the analyses
    must not read) and the merged run (4): one step of ``step_ns`` holding a stage span of each duration in
    ``stages`` (by name; a ``dataloader.*`` stage waits for a batch, the others are forward passes). ``gpu``:
    the ``model+system`` pass samples a GPU too; ``measured_waits``: see ``syscall_run``."""
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "m", levels=["model"], pass_name="model", config={"pid": MAIN}))
        store.add_run(RunInfo(2, "m", levels=["model", "system"], pass_name="model+system",
                              config=run_config(gpus=["cuda:0"] if gpu else None)))  # fmt: skip
        store.add_run(RunInfo(3, "m", levels=["model", "layer", "system"], pass_name="model+layer+system+syscalls",
                              config=run_config(syscalls=True)))  # fmt: skip
        sink = Sink(store, 1)
        steps(sink, STEPS, STEP_NS)
        sink.close()
        sink = Sink(store, 2)
        steps(sink, STEPS, STEP_NS)
        sampler_run(sink, gpu=gpu)
        sink.close()
        sink = Sink(store, 3)
        syscall_run(sink, measured_waits=measured_waits)
        sampler_run(sink, load=Load(main_cpu=1.2), rss_step=0.0)
        sink.close()
        merge = {
            "passes": [{"pass": "model", "run_id": 1, "levels": ["model"]}],
            "counter_passes": [{"pass": "model+layer+system+syscalls", "run_id": 3},
                               {"pass": "model+system", "run_id": 2}],
        }  # fmt: skip
        store.add_run(RunInfo(MERGED, "m", levels=["model"], pass_name="merged", config={"merge": merge}))
        sink = Sink(store, MERGED)
        steps(sink, 1, step_ns)
        at = 0
        for k, (name, dur) in enumerate((stages or {}).items()):
            kind = "dataloader" if name.startswith("dataloader") else "forward"
            sink.span(2 + k, 1, "model", name, at, dur, MAIN, MAIN, {A.MODEL_KIND: kind})
            at += dur
        sink.close()
    return Store.open(path)


FULL_NS = 50_000_000
SHORT_STEP_NS = 4_500_000
SHORT_FROM = 300_000_000
WORKERS = (201, 202)


def short_window_store(path: Path, *, steps_measured: int = 10, gpu: bool = False) -> Store:
    """A run whose measured steps are shorter than the sampler's full period, as a short training loop's are:
    one 300 ms warm-up step, then ``steps_measured`` steps of 4.5 ms. The main process's CPU time and switches
    are sampled every 10 ms, its RSS and threads, the two workers (pids 201, 202, alive throughout, each
    burning half a core) and the machine every 50 ms, the GPU (``gpu``) every 20 ms: ten measured steps (300 to
    345 ms) hold four samples of the main process, two of the GPU and no full sample."""
    with Store.create(path) as store:
        config = run_config(workers=2, gpus=["cuda:0"] if gpu else None)
        config["measure"] = {"warmup": 1, "iterations": steps_measured}
        config[A.CONFIG_SYSTEM] |= {"full_interval_ms": FULL_NS / 1e6, "gpu_interval_ms": 20.0 if gpu else None}
        store.add_run(RunInfo(1, "short", levels=["model", "system"], config=config))
        sink = Sink(store, 1)
        sink.span(1, None, "model", "step#0", 0, SHORT_FROM, MAIN, MAIN, {A.MODEL_KIND: "step", A.MODEL_STEP: 0})
        for k in range(1, steps_measured + 1):
            sink.span(1 + k, None, "model", f"step#{k}", SHORT_FROM + (k - 1) * SHORT_STEP_NS, SHORT_STEP_NS, MAIN,
                      MAIN, {A.MODEL_KIND: "step", A.MODEL_STEP: k})  # fmt: skip
        for ts in range(0, 400_000_001, INTERVAL_NS):
            c = sink.counter
            c(A.PROC_CPU_USER_NS, ts, 0.5 * ts, pid=MAIN)
            c(A.PROC_CPU_SYSTEM_NS, ts, 0.1 * ts, pid=MAIN)
            c(A.PROC_CTX_VOLUNTARY, ts, ts // 2_000_000, pid=MAIN)
            c(A.PROC_CTX_INVOLUNTARY, ts, ts // 5_000_000, pid=MAIN)
            if gpu and ts % 20_000_000 == 0:
                c(A.GPU_UTIL_PCT, ts, 80.0, device="cuda:0")
                c(A.GPU_SM_CLOCK_MHZ, ts, 1400.0, device="cuda:0")
                c(A.GPU_THROTTLE_REASONS, ts, 0, device="cuda:0")
            if ts % FULL_NS:
                continue
            c(A.PROC_RSS_BYTES, ts, 100 * MIB + ts / 1000, pid=MAIN)
            c(A.PROC_THREADS, ts, 10, pid=MAIN)
            for pid in WORKERS:
                c(A.PROC_CPU_USER_NS, ts, 0.5 * ts, pid=pid)
                c(A.PROC_CPU_SYSTEM_NS, ts, 0, pid=pid)
                c(A.PROC_CTX_VOLUNTARY, ts, ts // 10_000_000, pid=pid)
                c(A.PROC_CTX_INVOLUNTARY, ts, 0, pid=pid)
                c(A.PROC_RSS_BYTES, ts, 50 * MIB, pid=pid)
                c(A.PROC_THREADS, ts, 3, pid=pid)
            c(A.CPU_BUSY_PCT, ts, 60.0)
            c(A.CPU_BUSY_PCT, ts, 60.0, device="cpu:0")
            c(A.CPU_BUSY_PCT, ts, 60.0, device="cpu:1")
            c(A.CPU_PROCS_RUNNING, ts, 3)
            c(A.MEM_USED_BYTES, ts, 4 * 2**30)
            c(A.MEM_AVAILABLE_BYTES, ts, 12 * 2**30)
        sink.close()
    return Store.open(path)
