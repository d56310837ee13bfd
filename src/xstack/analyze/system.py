"""The system analyses: CPU saturation and contention, time blocked in system calls per stage and layer, GPU
utilisation and clock throttling, and host memory growth.

Each is a function ``(store, run_id, **options) -> Result`` (see ``xstack.analyze.pipeline``). They read what
the system level stored (``design.md`` §2): the sampler's counters (``proc.*`` per process, ``cpu.*`` and
``mem.*`` for the machine, ``gpu.*`` per GPU) and the syscall pass's ``system`` spans. For a merged run they
read the passes that recorded them (``_system_common.system_runs``); a run without them says that it lacks the
system level and how to record it.
"""

from __future__ import annotations

from typing import Any

from xstack.analyze._system_common import system_runs
from xstack.analyze._system_cpu import cpu_over_time, cpu_saturation
from xstack.analyze._system_gpu import gpu_over_time, gpu_utilisation
from xstack.analyze._system_memory import memory_growth
from xstack.analyze._system_syscalls import syscall_time, syscalls_by_name
from xstack.analyze._timeline_common import pct
from xstack.trace.store import Store

__all__ = [
    "cpu_over_time",
    "cpu_saturation",
    "gpu_over_time",
    "gpu_utilisation",
    "memory_growth",
    "overview",
    "syscall_time",
    "syscalls_by_name",
]


def overview(store: Store, run_id: int) -> dict[str, Any] | None:
    """The run's system figures in brief, for summaries: machine CPU busy (%), cores, saturated samples (%),
    the main process's RSS growth (bytes) over the measured steps, GPU utilisation (%) and throttled samples
    (%) or why there is no GPU telemetry, whether each had too few samples inside the measured steps (with
    the full samples there, the number needed and the steps' length, ns), and the syscalls traced; None when
    the run has no system data. Syscalls: the calls, the main thread's share of the measured steps in them
    (%) and its time per step under the tracer (ns), that share of the step without the tracer (ns, with
    the step's length, in a merged profile), and the other threads with the share of their syscall time
    spent in wait calls (%): never their sum, which counts each idle thread's wait in full."""
    runs = system_runs(store, run_id)
    if runs.counters is None and runs.syscalls is None:
        return None
    out: dict[str, Any] = {"counters_run": None, "syscalls_run": None}
    if runs.counters is not None:
        cpu, memory, gpu = (fn(store, run_id).facts for fn in (cpu_saturation, memory_growth, gpu_utilisation))
        out |= {k: cpu.get(k) for k in ("cores", "busy_mean_pct", "saturated_pct", "workers")}
        out |= {
            k: memory.get(k)
            for k in ("steps", "main_growth_bytes", "main_suspect", "loop_stage", "main_profiler_events")
        }
        out |= {"gpus": gpu.get("gpus"), "gpu_util_mean_pct": gpu.get("util_mean_pct"),
                "gpu_throttled_pct": gpu.get("throttled_pct"), "nvml": gpu.get("nvml"),
                "counters_run": runs.counters.run_id}  # fmt: skip
        out |= {"cpu_too_few": cpu.get("too_few_samples") is not None, "full_samples": cpu.get("full_samples"),
                "min_samples": cpu.get("min_samples"), "region_ns": cpu.get("region_ns"),
                "memory_too_few": memory.get("too_few_samples") is not None,
                "gpu_too_few": gpu.get("too_few_samples") is not None}  # fmt: skip
    if runs.syscalls is not None:
        calls = syscall_time(store, run_id).facts
        other_ns, other_wait = calls.get("other_threads_ns"), calls.get("other_threads_wait_ns")
        out |= {"syscalls": calls.get("calls"), "syscall_main_share_pct": calls.get("main_share_pct"),
                "syscall_main_share_of": calls.get("main_share_of"),
                "syscall_main_per_step_ns": calls.get("main_per_step_traced_ns"),
                "syscall_main_per_step_est_ns": calls.get("main_per_step_est_ns"),
                "syscall_step_ns": calls.get("step_unslowed_ns"), "syscall_tracer": calls.get("tracer"),
                "syscall_other_threads": calls.get("other_threads"),
                "syscall_other_wait_pct": pct(other_wait, other_ns),
                "syscalls_run": runs.syscalls.run_id}  # fmt: skip
    return out
