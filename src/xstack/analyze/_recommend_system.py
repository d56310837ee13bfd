"""The recommendation rules over the system analyses and the CUDA/HIP API analysis: GPU clock throttling, host memory
growth, stages blocked in wait syscalls, and host time lost to runtime syncs and allocations inside layers (the CPU
rules are in ``_recommend_cpu``).

Each rule reads the ``facts`` and rows of the results it names and stays silent when they are missing or do
not show the problem; its thresholds are module constants, quoted in the evidence where they decide.
"""

from __future__ import annotations

from typing import Any

from xstack.analyze._recommend_common import Results, loop_waits_for_data
from xstack.analyze._recommend_common import get as _get
from xstack.analyze._recommend_common import num as _num
from xstack.analyze._system_syscalls import WAIT_MEANING
from xstack.analyze.pipeline import Recommendation, Severity
from xstack.analyze.result import format_ns, format_value
from xstack.text import counted

GPU_THROTTLE_PCT = 10.0
"""Share of samples with a thermal or power throttle reason above which throttling costs throughput."""
WAIT_SHARE_PCT = 30.0
"""Share of a stage's time blocked in wait syscalls above which it is worth a look..."""
LOADER_STAGES = ("dataloader.next", "dataloader.iter")
"""The model stages in which the loop waits for a DataLoader's batches, or starts its workers."""
WAIT_MIN_STEP_PCT = 5.0
"""...provided those waits make at least this share of the step (a stage of 40 us in a 2 ms step is not)."""
SYNC_ALLOC_LAYER_PCT = 20.0
"""Share of a layer's time in CUDA sync and allocation calls above which they are worth removing..."""
SYNC_ALLOC_MIN_NS = 10_000
"""...provided they add up to at least this much host time (10 us)."""


def _severity(pct: float) -> Severity:
    return "high" if pct >= 50 else "medium" if pct >= 25 else "low"


def gpu_throttling(results: Results) -> Recommendation | None:
    """A GPU ran with thermal or power throttle reasons set in many samples."""
    g = _get(results, "system.gpu")
    if g is None or not g.rows:
        return None
    thermal, power = _num(g.facts, "thermal_pct") or 0.0, _num(g.facts, "power_pct") or 0.0
    if max(thermal, power) < GPU_THROTTLE_PCT:
        return None
    line = (
        f"{g.facts.get('worst_gpu')}: clocks slowed for heat in {thermal:.0f}% and for power in {power:.0f}% of the "
        f"samples (threshold {GPU_THROTTLE_PCT:g}%); reasons: {g.facts.get('worst_reasons')}"
    )
    if (low := _num(g.facts, "sm_clock_min_vs_max_pct")) is not None:
        line += f"; the SM clock fell to {low:.0f}% of its highest"
    if (temp := _num(g.facts, "temp_max_c")) is not None:
        line += f"; up to {temp:.0f} C"
    if thermal >= power:
        action = ("Cool the GPU: check its fans and airflow and the inlet temperature (nvidia-smi -q -d "
                  "TEMPERATURE,PERFORMANCE); a GPU that throttles for heat runs every kernel slower.")  # fmt: skip
    else:
        action = ("The board reaches its power limit: check that the limit was not lowered (nvidia-smi -q -d "
                  "POWER; raise it with nvidia-smi -pl where allowed), and expect the clocks to settle under "
                  "sustained heavy kernels: compare step latency with an unthrottled GPU.")  # fmt: skip
    return Recommendation("gpu_throttling", "GPU clocks throttled", _severity(max(thermal, power)),
                          [line + " (system.gpu)"], [g.id], action)  # fmt: skip


def host_memory_growth(results: Results) -> Recommendation | None:
    """The resident memory of the main process or its workers keeps growing across the measured steps."""
    m = _get(results, "system.memory")
    if m is None:
        return None
    evidence = [_growth_line(m.facts, who) for who in ("main", "workers") if m.facts.get(f"{who}_suspect")]
    if not evidence:
        return None
    grown = max(_num(m.facts, f"{who}_growth_pct") or 0.0 for who in ("main", "workers"))
    return Recommendation(
        "host_memory_growth", "Host memory grows step after step (leak suspected)", _severity(grown), evidence,
        [m.id],
        GLIBC_HEAP + LEAK_HUNT[0].lower() + LEAK_HUNT[1:] if _glibc_heap(results) else LEAK_HUNT,
    )  # fmt: skip


LEAK_HUNT = (
    "Find what the loop keeps from step to step: losses or outputs accumulated with their autograd graph (total += "
    "loss instead of loss.item() or loss.detach()), lists and dicts that grow every step (metrics, caches, logged "
    "tensors), tensors captured by hooks or closures. tracemalloc snapshots taken a few steps apart "
    "(snapshot.compare_to(...)) show the lines that allocate; in DataLoader workers, Python lists of objects in the "
    "dataset grow each worker's memory as they are read (use numpy arrays or tensors)."
)


GLIBC_HEAP = (
    "Rule out glibc's heap first, with one run under MALLOC_MMAP_THRESHOLD_=131072: glibc's malloc raises its mmap "
    "threshold to the size of each block of up to 32 MiB it frees, and blocks of that size (a batch's tensors) then "
    "come from its heap, which fragments and can grow over many steps, and fall back between epochs, with nothing "
    "kept; that setting holds the threshold at its default of 128 KiB (each larger block then maps its pages afresh, "
    "page faults included). If the growth stops, it was the heap, not a leak: nothing to find, and jemalloc "
    "(LD_PRELOAD=libjemalloc.so.2) keeps it smaller. If it goes on, "
)
"""What the memory growth rule says first where the process ran with glibc's malloc and its dynamic mmap threshold
(a DataLoader loop over a torch.load per item grew by 95 MiB over its second epoch and fell back in the next; with
that setting, it stayed at 312 MiB over 6 epochs, and at 316 MiB with jemalloc)."""


def _glibc_heap(results: Results) -> bool:
    """Whether the run's process used glibc's malloc (or the run does not say) without a setting that fixes its
    thresholds (``model.process``' ``allocator`` and ``malloc_fixed``): the growth may then be its heap's."""
    p = _get(results, "model.process")
    facts = p.facts if p is not None else {}
    return facts.get("allocator") in (None, "glibc") and not facts.get("malloc_fixed")


OWNER = {"main": "the main process's", "workers": "the workers'"}


def _growth_line(facts: dict[str, Any], who: str) -> str:
    growth, steps = _num(facts, f"{who}_growth_bytes") or 0.0, int(_num(facts, "steps") or 0)
    start, end = _num(facts, f"{who}_start_bytes") or 0.0, _num(facts, f"{who}_end_bytes") or 0.0
    if steps:
        over = f"over {steps} measured steps"
    elif facts.get("loop_stage"):
        over = f"from the second call of {facts['loop_stage']} to the run's end (no measured steps)"
    else:
        over = "over the run (no measured steps)"
    line = (
        f"{OWNER[who]} resident memory grew by {format_value(growth, 'bytes')} {over} "
        f"({format_value(start, 'bytes')} to {format_value(end, 'bytes')})"
    )
    if who == "workers" and (restarts := int(_num(facts, "workers_restarts") or 0)):
        line = (f"{line[:-1]}; what they grew while alive: new workers replaced them {counted(restarts, 'time')}, "
                "and a new worker starts with the pages it shares with the process it is forked from)")  # fmt: skip
    if (slope := _num(facts, f"{who}_slope_per_step_bytes")) is not None:
        line += f", {format_value(slope, 'bytes')} per step"
    if (rising := _num(facts, f"{who}_rising_pct")) is not None:
        line += f", rising in {rising:.0f}% of the {'steps' if steps else 'points'}"
    return line + " (system.memory)"


def stage_blocked_in_waits(results: Results) -> Recommendation | None:
    """A stage spends a large share of its time in the measured steps blocked in wait syscalls, and those waits,
    weighed by the stage's duration without the tracer, are a noticeable part of the step (layers are left out:
    their waits are mostly the framework's own thread pools joining, which strace slows further). Silent where
    no profile without the tracer gives those durations (a run traced throughout): the tracer slows the threads
    and processes waited on, so the waits it measures are longer than the program's. The DataLoader's stages
    (``dataloader.next``, ``dataloader.iter``) are left out where the loop is input-bound (``loop_waits_for_data``):
    the input-bound finding weighs those waits against what the workers do, and this rule's generic advice on them
    (raise num_workers) contradicted its own where the workers already matched the CPUs."""
    s = _get(results, "system.syscalls")
    if s is None or not s.rows:
        return None
    records = s.to_records()
    step = next((r for r in records if r["kind"] == "stage" and r["where"] == "step"), None)
    if step is None or not step["span per step"]:
        return None
    rows = [r for r in records if r["kind"] == "stage" and (r["wait share"] or 0) > WAIT_SHARE_PCT and _felt(r, step)]
    if loop_waits_for_data(results) is not None:  # the input-bound finding says what the loop waits for, and why
        rows = [r for r in rows if not str(r["where"]).startswith(LOADER_STAGES)]
    if not rows:
        return None
    worst = max(rows, key=lambda r: (r["est. wait per step"], r["wait"]))
    tracer = str(s.facts.get("tracer") or "strace")
    evidence = [_wait_line(worst, tracer)]
    others = [r for r in rows if r is not worst][:3]
    evidence += [f"also stage {r['where']}: {r['wait share']:.0f}% (system.syscalls)" for r in others]
    return Recommendation(
        "stage_blocked_in_waits", f"{worst['where']} waits in the kernel", _severity(worst["wait share"]), evidence,
        [s.id], _wait_action(str(worst["top wait"]), str(worst["where"])), impact_ns=round(worst["est. wait per step"]),
    )  # fmt: skip


def _felt(row: dict[str, Any], step: dict[str, Any]) -> bool:
    """Whether a stage's waits, weighed by its duration per measured step without the tracer, are at least
    ``WAIT_MIN_STEP_PCT`` of the step without it."""
    wait = row["est. wait per step"]
    return wait is not None and 100.0 * wait / step["span per step"] >= WAIT_MIN_STEP_PCT


def _wait_line(row: dict[str, Any], tracer: str) -> str:
    top = row["top wait"]
    on = WAIT_MEANING.get(str(top), "another thread or process")
    return (
        f"stage {row['where']} spends {row['wait share']:.0f}% of its time in the measured steps blocked in wait "
        f"calls under {tracer} (threshold {WAIT_SHARE_PCT:g}%), mostly {top}: waiting on {on}; that share of its "
        f"{format_ns(row['span per step'])} per step without {tracer}, about {format_ns(row['est. wait per step'])} "
        "of waiting per step (system.syscalls)"
    )


def _wait_action(call: str, where: str) -> str:
    if call in ("nanosleep", "clock_nanosleep"):
        return f"Remove the sleeps in {where} (time.sleep in the loop, polling with a sleep): wait on the event."
    if call in ("wait4", "waitid"):
        return f"{where} waits for child processes to exit: start them once (persistent workers, a pool), reuse them."
    if "dataloader" in where.lower() or call in ("poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait"):
        return (f"{where} waits for batches from the DataLoader workers: raise num_workers (up to the free cores) "
                "and prefetch_factor, use persistent_workers=True, or make each batch cheaper to produce.")  # fmt: skip
    return (f"{where} waits on locks or queues shared with other threads: find the thread it waits for (a "
            "py-spy dump during the stage shows it) and overlap or remove the hand-off.")  # fmt: skip


def cuda_sync_alloc_in_layers(results: Results) -> Recommendation | None:
    """A layer spends much of its time in CUDA (or HIP) synchronisation or allocation calls."""
    r = _get(results, "runtime.api")
    if r is None or not r.rows:
        return None
    runtime = str(r.facts.get("runtime") or "CUDA")
    prefix = runtime.lower()
    found = [
        row for row in r.to_records()
        if (row["sync+alloc share"] or 0) >= SYNC_ALLOC_LAYER_PCT and row["sync"] + row["alloc"] >= SYNC_ALLOC_MIN_NS
    ]  # fmt: skip
    if not found:
        return None
    worst = max(found, key=lambda row: row["sync"] + row["alloc"])
    evidence = [
        f"layer {worst['layer']} spends {worst['sync+alloc share']:.0f}% of its time in {runtime} sync and allocation "
        f"calls (threshold {SYNC_ALLOC_LAYER_PCT:g}%): {format_ns(worst['sync'])} in {worst['sync calls']:,} "
        f"syncs, {format_ns(worst['alloc'])} in {worst['alloc calls']:,} allocations (runtime.api)"
    ]
    others = [row for row in found if row is not worst][:3]
    evidence += [f"also layer {row['layer']}: {row['sync+alloc share']:.0f}% (runtime.api)" for row in others]
    return Recommendation(
        "cuda_sync_alloc_in_layers", f"{runtime} syncs and allocations inside {worst['layer']}",
        _severity(worst["sync+alloc share"]), evidence, [r.id],
        "Syncs inside a layer come from reading device values on the host: .item(), .cpu(), .tolist(), print, "
        "if tensor:, and ops with data-dependent shapes (nonzero, masked_select, unique); keep them on the "
        f"device or move them out of the step. {prefix}Malloc/{prefix}Free calls mean PyTorch's caching allocator "
        "missed: shapes that change every step, torch.cuda.empty_cache() in the loop, or fragmentation "
        f"(PYTORCH_{runtime}_ALLOC_CONF=expandable_segments:True).",
    )  # fmt: skip


RULES = {
    "gpu_throttling": gpu_throttling,
    "host_memory_growth": host_memory_growth,
    "stage_blocked_in_waits": stage_blocked_in_waits,
    "cuda_sync_alloc_in_layers": cuda_sync_alloc_in_layers,
}
"""The rules of this module, by id (``recommend.RULES`` includes them)."""
