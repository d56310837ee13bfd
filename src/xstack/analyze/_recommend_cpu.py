"""The recommendation rules over CPU saturation (``system.cpu``): more worker processes than usable CPUs,
threads oversubscribing them, and other processes taking them; and over the process's CPU time and page faults
(``model.process``): memory taken from the system afresh in every iteration.

The first two fire only on the program's own figures (its processes' CPU busy and the main process's
involuntary context switches), never on the machine's alone, which counts every other process too; and they
advise only what the run did not already do (``config.system.torch_threads``, ``config.dataloaders``,
``config.cpu_count``). All three stay silent on counters sampled while the syscall tracer ran: its own load, and
the program's under it, would be taken for the program's.
"""

from __future__ import annotations

from typing import Any

from xstack.analyze._recommend_common import INPUT_WAIT_PCT, Results, loop_waits_for_data
from xstack.analyze._recommend_common import get as _get
from xstack.analyze._recommend_common import num as _num
from xstack.analyze._recommend_system import _severity
from xstack.analyze.pipeline import Recommendation, Severity
from xstack.analyze.result import Result, counted, format_ns, format_value

SATURATED_PCT = 20.0
"""Share of samples with more runnable threads than cores above which the CPU counts as saturated."""
INVOLUNTARY_PER_STEP = 100.0
"""Involuntary context switches of the main process per step above which its threads fight for the CPUs."""
OWN_BUSY_PCT = 80.0
"""Share of the usable CPUs the program's own processes (main and workers) keep busy above which they fill them."""
SHARED_OWN_PCT = 40.0
"""Share of the usable CPUs the program's own processes keep busy above which, on a machine that other processes
fill the rest of (saturated, ``OWN_BUSY_PCT`` busy in all), its workers are part of what fills the CPUs."""
OTHERS_BUSY_PCT = 50.0
"""Share of the machine's cores that processes outside the program keep busy above which they took the CPUs."""
WORKERS_FREED_PCT = 25.0
"""Share of one core below which the workers beyond the advised count take no CPU worth giving back (the workers'
CPU busy in proportion to how many of them would go): the CPUs are full of the main process's threads or of other
processes, and fewer workers would free nothing for the training loop, only load its data more slowly."""
THREADS_PER_CORE = 4
"""Threads of the main process per usable CPU above which it has far more threads than it can run."""
WORKER_THREADS = 4
"""Threads of a DataLoader worker above which a library runs a thread pool in it (a worker's own are its loop
and its queues' threads; PyTorch gives its torch ops one thread)."""


def _cpu(results: Results) -> Result | None:
    """``system.cpu`` where its counters were sampled without the syscall tracer."""
    c = _get(results, "system.cpu")
    return None if c is None or c.facts.get("counters_traced") else c


def _usable(c: Result) -> float | None:
    return _num(c.facts, "usable_cpus") or _num(c.facts, "cores")


def _own_pct(c: Result, usable: float) -> float | None:
    """The program's processes' CPU busy as a share of the usable CPUs (%)."""
    own = _num(c.facts, "own_cpu_pct")
    return None if own is None else own / usable


def workers_exceed_cores(results: Results) -> Recommendation | None:
    """More worker processes (plus the main process) than usable CPUs, and the CPUs are full: the program's own
    processes keep them busy, or they keep a good part of them busy (``SHARED_OWN_PCT``) on a machine that other
    processes fill the rest of (saturated and ``OWN_BUSY_PCT`` busy in all; only where the program could use
    every core, as the machine's figures count them all); and only where the workers to go keep
    ``WORKERS_FREED_PCT`` of a core busy, else fewer of them would give the training loop nothing. Silent where the
    loop waits for its batches (``INPUT_WAIT_PCT`` of the steps, the input-bound rule's threshold): the workers
    are then what it waits on, and fewer of them would load its data more slowly, not give it CPU it lacks."""
    c = _cpu(results)
    if c is None or not (usable := _usable(c)) or not (workers := _num(c.facts, "workers")):
        return None
    if loop_waits_for_data(results) is not None:
        return None
    own = _own_pct(c, usable)
    freed = (_num(c.facts, "workers_cpu_pct") or 0.0) * max(workers - max(usable - 1, 0), 0) / workers
    if freed < WORKERS_FREED_PCT:
        return None
    if workers + 1 > usable and own is not None and own >= OWN_BUSY_PCT:
        shared = None
    elif workers + 1 > usable and own is not None and own >= SHARED_OWN_PCT:
        if (shared := _shared(c, usable)) is None:
            return None
    else:
        return None
    main, theirs = _num(c.facts, "main_cpu_pct") or 0.0, _num(c.facts, "workers_cpu_pct") or 0.0
    threshold = f"threshold {OWN_BUSY_PCT:g}%" if shared is None else f"threshold {SHARED_OWN_PCT:g}% on a full machine"
    evidence = [
        f"{_procs(int(workers))} and the main process ran on "
        f"{counted(int(usable), 'usable CPU')} and kept them "
        f"{own:.0f}% busy ({threshold}): the main process {main:.0f}%, the workers {theirs:.0f}% of "
        "one core (system.cpu)"
    ]
    if shared is not None:
        evidence.append(shared)
    invol = _num(c.facts, "main_involuntary_per_step")
    if invol is not None:
        evidence.append(f"the scheduler took the CPU from the main process {invol:,.0f} times per step (system.cpu)")
    severity: Severity = "high" if invol is not None and invol >= INVOLUNTARY_PER_STEP else "medium"
    title, action = _workers_action(c.facts.get("dataloaders") or [], int(workers), int(usable))
    return Recommendation("workers_exceed_cores", title, severity, evidence, [c.id], action)


def _shared(c: Result, usable: float) -> str | None:
    """The evidence that other processes filled the rest of the machine the program could wholly use, or None."""
    cores, busy, sat = _num(c.facts, "cores"), _num(c.facts, "busy_mean_pct"), _num(c.facts, "saturated_pct")
    if cores != usable or busy is None or sat is None or busy < OWN_BUSY_PCT or sat < SATURATED_PCT:
        return None
    return (
        f"with other processes the machine's {counted(int(cores), 'core')} were {busy:.0f}% busy (threshold "
        f"{OWN_BUSY_PCT:g}%) and more threads than cores were runnable at {sat:.0f}% of the samples (threshold "
        f"{SATURATED_PCT:g}%): no CPU was free for the workers beyond the program's share (system.cpu)"
    )


def _workers_action(loaders: list[dict[str, Any]], workers: int, usable: int) -> tuple[str, str]:
    """The title and action: lower the recorded DataLoaders' num_workers where above the usable CPUs less one;
    where none is, the other child processes are the cause."""
    target = max(usable - 1, 0)
    why = ("(the usable CPUs less one for the main process): extra workers only take turns on the same CPUs and "
           "take CPU from the training loop; if loading is then too slow, make each batch cheaper (decode and "
           "augment less, or on the GPU) or use a machine with more CPUs.")  # fmt: skip
    if not loaders:
        return "More DataLoader workers than usable CPUs", f"Lower DataLoader(num_workers=...) to {target} {why}"
    above = [e for e in loaders if int(e.get("num_workers") or 0) > target]
    if above:
        named = " and ".join(_loader(e) for e in above)
        return "More DataLoader workers than usable CPUs", f"Lower num_workers to {target} in {named} {why}"
    named = ", ".join(_loader(e) for e in loaders)
    asks = "asks" if len(loaders) == 1 else "ask"
    return "More child processes than usable CPUs", (
        f"{named} {asks} for no more workers than the usable CPUs less one for the main process ({target}), yet "
        f"{workers} child processes ran at once: the workers of several DataLoaders iterated together, or "
        "processes the program or its libraries start (system.cpu lists them by pid). Keep the processes alive at "
        f"once within the {usable} usable CPUs: let one DataLoader's workers end before another's start "
        "(persistent_workers=False on the one iterated less often)."
    )


def _loader(entry: dict[str, Any]) -> str:
    return f"DataLoader({entry.get('dataset') or '?'}, num_workers={int(entry.get('num_workers') or 0)})"


def cpus_taken_by_others(results: Results) -> Recommendation | None:
    """The machine was saturated while the program's own processes used little of it: other processes took the
    CPUs. Only where the program could use every core (else the others may have run on cores it could not)."""
    c = _cpu(results)
    if c is None or not (cores := _num(c.facts, "cores")) or _usable(c) != cores:
        return None
    busy, own, sat = _num(c.facts, "busy_mean_pct"), _num(c.facts, "own_cpu_pct"), _num(c.facts, "saturated_pct")
    if busy is None or own is None or sat is None or sat < SATURATED_PCT:
        return None
    others = busy * cores / 100 - own / 100
    if 100 * others / cores < OTHERS_BUSY_PCT:
        return None
    main, theirs = _num(c.facts, "main_cpu_pct") or 0.0, _num(c.facts, "workers_cpu_pct") or 0.0
    workers = int(_num(c.facts, "workers") or 0)
    evidence = [
        f"the machine's {int(cores)} cores were {busy:.0f}% busy ({busy * cores / 100:.2f} cores) while the program's "
        f"processes used {own / 100:.2f} of a core (the main process {main:.0f}%"
        + (f", its {_procs(workers)} {theirs:.0f}% of one core" if workers else " of one core, no workers")
        + f"): other processes took about {others:.2f} cores, {100 * others / cores:.0f}% of "
        f"the machine (threshold {OTHERS_BUSY_PCT:g}%) (system.cpu)",
        f"more threads than cores were runnable at {sat:.0f}% of the samples (threshold {SATURATED_PCT:g}%) "
        "(system.cpu)",
    ]
    return Recommendation(
        "cpus_taken_by_others", "Other processes kept the CPUs busy", _severity(sat), evidence, [c.id],
        "Other processes competed with the program for the CPUs while it ran, so its times carry their load and "
        "the CPU figures are not the program's alone: profile again on an idle machine, or on CPUs kept for it "
        "(taskset -c, a cgroup cpuset, fewer jobs per node); ps -eo pid,pcpu,comm --sort=-pcpu during the run "
        "names the others.",
    )  # fmt: skip


def thread_oversubscription(results: Results) -> Recommendation | None:
    """The program's processes contend for the usable CPUs (they fill them, or the main process is switched out
    often) and run more threads than they can: torch's intra-op pool beyond the CPUs the workers leave it, far
    more threads than CPUs in the main process, or a library's thread pool in a worker. Medium where the main process
    is switched out often, or where torch's pool is beyond its share while the loop waits for the workers' batches:
    the workers then keep the CPUs busy, and each operator split across the pool waits for a thread they hold the
    CPU from (a 256 x 10 cross-entropy took 2.4 ms with 2 threads beside 2 busy workers on 2 CPUs, 67 us with one,
    and the step went from 6.6 ms to 3.9 ms, with 13 involuntary switches of the main process per step)."""
    c = _cpu(results)
    if c is None or not (usable := _usable(c)):
        return None
    invol, own = _num(c.facts, "main_involuntary_per_step"), _own_pct(c, usable)
    switched = invol is not None and invol >= INVOLUNTARY_PER_STEP
    if not switched and (own is None or own < OWN_BUSY_PCT):
        return None
    waiting = loop_waits_for_data(results)
    share = _share(c.facts, usable, waiting=waiting is not None)
    evidence, actions = _intra_op(c.facts, usable, share)
    stalled = bool(evidence) and waiting is not None
    if stalled:
        evidence.append(f"the loop waits for the workers' batches ({waiting:.0f}% of its steps): they keep the CPUs "
                        "busy, so each operator torch splits across its intra-op threads in the main process waits "
                        f"for a thread of its own that they hold the CPU from ({_waits_source(results)})")  # fmt: skip
    if switched:
        more, todo = _main_threads(c.facts, usable, share)
        evidence += more
        actions += todo
    more, todo = _worker_pools(c.facts)
    evidence += more
    actions += todo
    if not evidence:
        return None
    evidence.append(_contention(own, usable, invol))
    severity: Severity = "medium" if switched or stalled else "low"
    return Recommendation(
        "thread_oversubscription", "Threads oversubscribe the CPUs", severity, evidence,
        [c.id, _waits_source(results)] if stalled else [c.id],
        "Give each process its share of the CPUs: " + "; ".join(dict.fromkeys(actions)) + ".",
    )  # fmt: skip


def _waits_source(results: Results) -> str:
    """The analysis that found the loop waiting for its data (``loop_waits_for_data``): ``model.stages``, else the io
    level's own steps (a merged run's median step smooths the waits)."""
    s = _get(results, "model.stages")
    pct = _num(s.facts, "dataloader_pct_of_steps") if s is not None else None
    return "model.stages" if pct is not None and pct >= INPUT_WAIT_PCT else "io.input_bound"


def _procs(n: int) -> str:
    """``1 worker process``, ``2 worker processes``."""
    return counted(n, "worker process", "worker processes")


def _share(facts: dict[str, Any], usable: float, *, waiting: bool) -> int:
    """The CPUs left to the main process's intra-op pool beside the workers (at least one): the usable CPUs less
    what the workers used (a core each where not known), or less one per worker where the loop waits for their
    batches (``waiting``: they would use more if they got it). Workers that read a few files per batch and then
    sleep leave the main process the CPUs they do not use: shrinking its pool for them would slow its steps and
    give them nothing they lack."""
    workers = _num(facts, "workers") or 0.0
    used = _num(facts, "workers_cpu_pct")
    taken = workers if waiting or used is None else min(used / 100, workers)
    return max(round(usable - taken), 1)


def _intra_op(facts: dict[str, Any], usable: float, share: int) -> tuple[list[str], list[str]]:
    """torch's intra-op pool in the main process above its ``share`` of the CPUs: each worker runs one thread
    (PyTorch's DataLoader sets it), so the pool is what to shrink."""
    threads, workers = _num(facts, "torch_threads"), int(_num(facts, "workers") or 0)
    if not threads or threads <= share:
        return [], []
    line = (f"torch runs {int(threads)} intra-op threads in the main process beside {_procs(workers)} of "
            f"one thread each (PyTorch's DataLoader sets it): up to {int(threads) + workers} busy threads for "
            f"{int(usable)} usable CPUs (system.cpu)")  # fmt: skip
    return [line], [f"torch.set_num_threads({share}) in the main process (or OMP_NUM_THREADS={share} in its "
                    f"environment), its share of the {int(usable)} usable CPUs beside "
                    f"{counted(workers, 'worker')}"]  # fmt: skip


def _main_threads(facts: dict[str, Any], usable: float, share: int) -> tuple[list[str], list[str]]:
    """Far more threads than CPUs in the main process; where torch's intra-op pool is within its ``share``, the
    other pools are what to cap."""
    found = _num(facts, "main_threads_max")
    if not found or found < THREADS_PER_CORE * usable:
        return [], []
    evidence = [f"the main process has up to {int(found)} threads for {int(usable)} usable CPUs (system.cpu)"]
    threads = _num(facts, "torch_threads")
    if threads and threads > share:
        return evidence, []  # the intra-op pool's advice covers it
    if threads:
        workers = int(_num(facts, "workers") or 0)
        evidence.append(
            f"torch's intra-op pool has {counted(int(threads), 'thread')}, within the "
            f"{counted(share, 'usable CPU')} its {_procs(workers)} leave{'s' if workers == 1 else ''} it: the other "
            "threads belong to other pools (system.cpu)"
        )
    return evidence, [
        "cap the main process's other thread pools: torch.set_num_interop_threads(...) for PyTorch's inter-op pool, "
        "threadpoolctl.threadpool_limits(...) for numpy's BLAS and OpenMP, cv2.setNumThreads(...) for OpenCV, and "
        "the program's own thread pools (py-spy dump --pid PID lists every thread)"
    ]


def _worker_pools(facts: dict[str, Any]) -> tuple[list[str], list[str]]:
    """A worker with more threads than a DataLoader worker's own: a library's pool, which PyTorch does not limit."""
    found = _num(facts, "workers_threads_max")
    if found is None or found <= WORKER_THREADS:
        return [], []
    line = (f"a worker process has up to {int(found)} threads, more than the {WORKER_THREADS} of a DataLoader "
            "worker's own: a library runs a thread pool in it (system.cpu)")  # fmt: skip
    return [line], ["one thread per library in each worker: DataLoader(worker_init_fn=...) calling "
                    "threadpoolctl.threadpool_limits(1) (numpy's BLAS, OpenMP) and cv2.setNumThreads(0) (OpenCV); "
                    "PyTorch already runs each worker's torch ops on one thread"]  # fmt: skip


def _contention(own: float | None, usable: float, invol: float | None) -> str:
    parts = []
    if own is not None:
        parts.append(f"the program's processes kept {own:.0f}% of the {int(usable)} usable CPUs busy (threshold "
                     f"{OWN_BUSY_PCT:g}%)")  # fmt: skip
    if invol is not None:
        parts.append(f"the main process was switched out involuntarily {invol:,.0f} times per step "
                     f"(threshold {INVOLUNTARY_PER_STEP:g})")  # fmt: skip
    return "; ".join(parts) + " (system.cpu)"


FRESH_BYTES = 16 * 2**20
"""Memory a process takes from the system afresh per iteration (page faults x page size, median) above which its
allocator gives large blocks back between iterations."""
SYSTEM_SHARE_PCT = 10.0
"""Share of the process's CPU time spent in the kernel above which those page faults cost it."""
KEEP_FREED = {
    "glibc": (
        "it ran with glibc's malloc, which gives a freed block above its mmap threshold (at most 32 MiB) back to the "
        "system and trims the top of its heap, so the next iteration's tensors take their pages afresh",
        "preload jemalloc with purging off, LD_PRELOAD=libjemalloc.so.2 MALLOC_CONF=dirty_decay_ms:-1,"
        "muzzy_decay_ms:-1 (Debian: apt-get install libjemalloc2), as PyTorch's performance tuning guide advises a "
        "caching allocator on CPUs (jemalloc's defaults give blocks above 8 MiB back at once); or, with glibc's "
        "malloc, keep blocks of up to 32 MiB in its heap: MALLOC_MMAP_THRESHOLD_=33554432 "
        "MALLOC_TRIM_THRESHOLD_=17179869184",
    ),
    "jemalloc": (
        "it ran with jemalloc, which by default gives freed blocks above its oversize_threshold (8 MiB) back to the "
        "system at once, and the others after its decay time",
        "turn jemalloc's purging off: MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1",
    ),
    "tcmalloc": (
        "it ran with tcmalloc, which gives freed memory back to the system at its release rate",
        "turn tcmalloc's release off: TCMALLOC_RELEASE_RATE=0 (gperftools)",
    ),
    "mimalloc": (
        "it ran with mimalloc, which gives freed pages back to the system after its purge delay",
        "turn mimalloc's purging off: MIMALLOC_PURGE_DELAY=-1",
    ),
}
"""Per allocator (``config.allocator``): why it takes memory afresh each iteration, and how to keep freed memory
in the process instead."""


def fresh_memory(results: Results) -> Recommendation | None:
    """The process takes ``FRESH_BYTES`` or more from the system afresh in its median iteration (minor page
    faults x page size) and spends ``SYSTEM_SHARE_PCT`` or more of its CPU time in the kernel: its allocator
    gives the memory of large tensors back when they are freed and takes it again in the next iteration, paying a
    page fault (the kernel zeroing the page) for every 4 KiB of it. The time at stake is the median system CPU
    time of an iteration, over the CPUs the process keeps busy where it keeps more than one (its CPU time over the
    iteration's), at most the iteration: an upper bound, as its system calls are in it too. Silent on a run
    that recorded the op level, whose profiler's events take memory of their own in the process."""
    r = _get(results, "model.process")
    if r is None or r.missing or r.facts.get("profiler_in_process"):  # its events' memory would count as the program's
        return None
    f = r.facts
    fresh, share = _num(f, "fresh_memory_bytes"), _num(f, "system_share_pct")
    system, step, faults = _num(f, "system_cpu_ns"), _num(f, "iteration_ns"), _num(f, "page_faults")
    if fresh is None or share is None or faults is None or not system or not step:
        return None
    if fresh < FRESH_BYTES or share < SYSTEM_SHARE_PCT:
        return None
    why, action = KEEP_FREED.get(str(f.get("allocator")), KEEP_FREED["glibc"])
    user = _num(f, "user_cpu_ns") or 0
    # the kernel's time runs on the threads the process keeps busy: an iteration that keeps k CPUs busy would be
    # shorter by its system time over k, not by all of it (a 2-thread LSTM's 1.86 s of system CPU in a 1.82 s
    # step: 1.05 s at stake; jemalloc with purging off took 0.94 s off it)
    at_stake = min(system * min(1.0, step / (system + user)), step)
    evidence = [
        f"the process took {faults:,.0f} page faults in its median iteration: {format_value(fresh, 'bytes')} of "
        f"memory from the system afresh (threshold {format_value(FRESH_BYTES, 'bytes')}), and spent "
        f"{format_ns(system)} of CPU time per iteration in the kernel, {share:.0f}% of its CPU time (threshold "
        f"{SYSTEM_SHARE_PCT:g}%) (model.process)",
    ]
    if f.get("allocator") in KEEP_FREED:
        evidence.append(why)
    return Recommendation(
        rule="fresh_memory",
        title="Memory given back and taken again every iteration: page faults",
        severity=_severity(100.0 * at_stake / step),
        evidence=evidence,
        sources=["model.process"],
        action=f"Keep freed memory in the process for the next iteration: {action}. The process then holds on to "
        "its peak memory.",
        impact_ns=round(at_stake),
    )


RULES = {
    "workers_exceed_cores": workers_exceed_cores,
    "thread_oversubscription": thread_oversubscription,
    "cpus_taken_by_others": cpus_taken_by_others,
    "fresh_memory": fresh_memory,
}
"""The rules of this module, by id (``recommend.RULES`` includes them)."""
