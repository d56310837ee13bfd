"""The ``system`` level's sampler (``collect.system`` is the level's collector): CPU, memory, context switches and
I/O of the profiled process tree, the machine's cores and memory, and the GPUs, as counters on the run's clock.

**Two samplers.** By default the process tree and the machine are sampled by a thread in C
(``collect._system_native``, ``collect/_sampler/sampler.c``) that does what is described below with raw system
calls and never takes the interpreter lock, and a Python thread samples only the GPUs (it opens NVML, and
ends at once where there is none). ``XSTACK_SYSTEM_SAMPLER=python``, or a package built without a C compiler,
uses the Python thread below for everything. Both write the same rows and are tested alike. Why: a Python
sampler must take the lock for every sample; a program whose thread holds it must then hand it over and wait
to get it back, and the sampler's samples come late (``bench/system_overhead.py``, pure-Python loop).

A daemon thread samples every ``interval`` (``XSTACK_SYSTEM_INTERVAL_MS``, default 10 ms), once when the level
starts and once when it stops (``start`` waits for the first), so that the region's both ends are covered.
Samples come at two depths:

- every sample: the profiled process's CPU time user/system and its voluntary/involuntary context switches
  (``getrusage``: two system calls, no file read);
- a full sample, every ``FULL_PERIOD_NS`` (50 ms) or every sample when the interval is longer, adds the
  profiled process's RSS, threads and I/O counters, the same for each of its descendants (DataLoader workers
  included), and the machine: busy % of each core and of all cores, runnable and blocked threads, memory used
  and available (``collect._system_proc``);
- each GPU through NVML, at most every 20 ms (``collect._system_nvml``).

Why two depths: on the 2-core VM this was built on, a full sample of a process with two workers took 190-330 us
of CPU (a dozen /proc reads, each several times slower than in a tight loop, as the program has the caches)
against 25-45 us for a quick one, and every /proc read lets go of the interpreter lock, which the program may
then take and the sampler must wait to get back. Reading everything every 10 ms cost 2.3 % of a core, two
depths 1.0-1.2 % (``bench/system_overhead.py``): the quick samples keep CPU time and contention at 10 ms, where
steps are resolved, and the rest comes every 50 ms, still 5 clock ticks (``/proc/stat`` and the children's CPU
times count in 10 ms ticks anyway).

**Schedule.** Sample ``k`` is due at ``start + k * interval`` on the monotonic clock, and the thread sleeps until
then in a timed ``Lock.acquire`` on a lock that ``stop`` releases: sampling times do not drift with the time
each sample takes, and ``stop`` wakes the thread at once. (``threading.Event.wait`` does the same through a
``Condition``, which builds a new waiter lock on each call: 69 against 47 us of CPU per wake-up, measured.) A
sample that comes too late to keep the next due time (the program held the interpreter lock, the machine was
busy) makes the sampler skip the ticks it missed and count them (``late_samples``) rather than catch up in a
burst, which would cost the program most when it is busiest. Timestamps are ``time.time_ns()``, the run's
clock.

**Cost.** The thread shares the interpreter lock with the program, so a sample does as little Python as it can:
/proc files are kept open and re-read with ``pread``, and values are appended as raw integers to flat arrays
(no objects for the garbage collector to walk). Counters are computed and written to the store only in
``finish``, after the program's region. The buffer is bounded: when it reaches ``BUFFER_CAP_BYTES`` every other
sample is dropped and the interval doubles (said in health), so a long run keeps its whole length at a coarser
step.

**A program killed outright.** In a profile with a journal (``xstack.salvage``), the C thread also appends the
rows it took to files in the journal folder, at most every 0.25 s (one ``writev``, on its own thread), and
``salvage`` writes their counters into the run a killed program leaves: the memory of its processes and of the
machine up to the kill. The GPU samples and the Python sampler's rows stay in memory until the run ends.

Errors inside the thread never reach the program: they are counted and the first is kept for health; after
``MAX_ERRORS`` in a row the sampler stops.
"""

from __future__ import annotations

import bisect
import os
import resource
import sys
import threading
import time
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

from xstack import salvage
from xstack.collect._process_roles import Record, process_roles
from xstack.collect._system_native import (
    JOURNAL_META,
    NativeSampler,
    open_journal,
    use_native,
)
from xstack.collect._system_nvml import GPU_PERIOD_NS, GPU_STRIDE, Gpus, gpus_expected, write_gpus
from xstack.collect._system_proc import (
    MACHINE_HEAD,
    PROC_FIELDS,
    PROC_STRIDE,
    REDISCOVER_NS,
    Machine,
    ProcessTree,
    own_command_line,
    write_machine,
    write_processes,
)
from xstack.errors import XstackError
from xstack.trace import attrs as A
from xstack.trace.sink import Sink

FULL_PERIOD_NS = 50_000_000
"""The shortest time between two full samples (the machine, the child processes, the profiled process's I/O
and threads), in ns."""
BUFFER_CAP_BYTES = 64 << 20
"""Samples kept in memory before the sampler halves them and doubles its interval."""
MAX_ERRORS = 100
"""Failed samples in a row after which the sampler gives up."""
JOIN_TIMEOUT_S = 5.0
PROC_STRIDE_CTX = (3 + PROC_FIELDS.index(A.PROC_CTX_VOLUNTARY), 3 + PROC_FIELDS.index(A.PROC_CTX_INVOLUNTARY))
"""Where a process row holds its voluntary and involuntary context switches."""


class Sampler:
    """The sampling thread and its buffers; ``start``, ``stop``, then ``write`` once."""

    def __init__(self, interval_ns: int, *, journal: Path | None = None) -> None:
        """``journal``: a folder where the C sampler appends its rows as it goes (``keep_journal``)."""
        self.interval_ns = interval_ns
        self._journal = journal
        self._journal_fds: tuple[int, int] | None = None
        self.journal_error: str | None = None
        """Why the journal could not be kept (``system_journal_failed``), or None."""
        self.step = 1
        """Intervals between two samples: doubles each time the buffer is halved."""
        self.tree: ProcessTree | _TreeSummary
        self.machine: Machine | _CpuNames
        self._ptree: ProcessTree  # the same objects, for the Python sampler's own use
        self._pmachine: Machine
        self.native = (
            NativeSampler(os.getpid(), interval_ns, FULL_PERIOD_NS, REDISCOVER_NS, BUFFER_CAP_BYTES, MAX_ERRORS)
            if use_native()
            else None
        )
        """The C sampler thread for the process tree and the machine (``_system_native``), or None: this
        Python thread samples them. GPUs are sampled by a Python thread either way."""
        self.gpu_tid: int | None = None
        self._gpu_ctx: list[tuple[int, int, int]] = []
        """(ts_ns, voluntary, involuntary) switches of the GPU thread at each of its samples (C sampler)."""
        self.gpus = Gpus()
        self.nvml_reason: str | None = None
        self._open_error: BaseException | None = None
        self.machine_rows: array[int] = array("q")
        self.proc_rows: array[int] = array("q")
        self.gpu_rows: array[int] = array("q")
        self.samples = self.late = self.halvings = 0
        self.errors = 0
        self.first_error: str | None = None
        self.busy_ns = self.gpu_ns = self.gpu_samples = 0
        """Wall time spent taking samples (all; those that read the GPUs), and how many read the GPUs."""
        self.thread_cpu_ns = 0
        self.thread_tid: int | None = None
        """The sampler thread's Linux tid: the syscall pass leaves its calls out (they are the profiler's own)."""
        self.stuck = False
        self.counters_written = 0
        self._failing = 0
        self._last_full = self._last_gpu = -(1 << 62)
        self._start = 0
        self._stop = threading.Lock()
        """Held while the sampler runs; ``stop`` releases it, which wakes the thread."""
        self._stop.acquire()
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self.roles: dict[int, str] = {}
        """The child processes that are not workers (``process_roles``: the helpers of ``multiprocessing``, the
        programs started by exec and the processes they started), by pid, with their role: told by the parent
        and command line read when each was first seen, so that one that ended before the sampler stops is told
        too."""
        self.command_lines: list[Record] = []
        """Each child process's ``(pid, parent pid, command line, inherited)`` as first seen
        (``ProcessTree.command_lines``)."""
        self.workers = 0
        """The most child processes other than those with a role sampled at once (``config.system.workers``)."""

    def start(self) -> None:
        """Start the thread and wait until it has opened its /proc files (and NVML) and taken the first
        sample: all of the sampler's system calls are made on its own thread, which the syscall pass leaves
        out. Raises what opening raised (``/proc`` unreadable)."""
        self._start = time.monotonic_ns()
        target = self._run
        if self.native is not None:
            self._open_journal(self.native)
            try:
                self.native.start()  # raises OSError naming the file it could not open
            except BaseException:
                self._close_journal()
                raise
            self.machine = _CpuNames(self.native.cpus())
            self.thread_tid = self.native.stats["tid"]
            target = self._run_gpus
            self._journal_meta()
        elif self._journal is not None:  # the reader then says why there is nothing to read
            self._journal_meta()
        self._thread = threading.Thread(target=target, name="xstack-system-sampler", daemon=True)
        self._thread.start()
        if not self._started.wait(JOIN_TIMEOUT_S):
            self.stuck = True
            if self._stop.locked():
                self._stop.release()  # the thread ends as soon as it gets past what hung
            if self.native is not None:
                self.native.stop()
                if not self.native.stats.get("stuck"):
                    self._close_journal()
                self.native.close()
            raise XstackError(f"the system level's sampler took no first sample within {JOIN_TIMEOUT_S:g} s "
                              "(reading /proc or NVML hung)")  # fmt: skip
        if self._open_error is not None:
            self._thread.join(JOIN_TIMEOUT_S)
            raise self._open_error
        if self.native is not None and not self.gpus.handles:
            # no GPU: the thread only opened NVML for its reason; it must be gone before the region runs, or
            # its last steps would take the interpreter lock from the program's thread
            self._thread.join(JOIN_TIMEOUT_S)

    def _open_journal(self, native: NativeSampler) -> None:
        """Give the C thread its journal files (a journal that cannot be made is said in health, never raised)."""
        if self._journal is None:
            return
        try:
            self._journal_fds = open_journal(self._journal)
        except OSError as exc:
            self.journal_error = str(exc)
            return
        native.set_journal(self._journal_fds)

    def _journal_meta(self) -> None:
        """Beside the rows: what reading them back needs (``salvage.salvage_system``)."""
        if self._journal is None:
            return
        meta: dict[str, Any] = {"sampler": "python"}
        if self.native is not None and self._journal_fds is not None:
            meta = {"sampler": "native", "pid": os.getpid(), "cpus": self.machine.cpus,
                    "interval_ms": self.interval_ns / 1e6,
                    "full_interval_ms": max(FULL_PERIOD_NS, self.interval_ns) / 1e6, "cores": os.cpu_count(),
                    "proc_stride": PROC_STRIDE, "machine_stride": self.machine.stride}  # fmt: skip
        try:
            salvage.write_json(self._journal, JOURNAL_META, meta)
        except OSError as exc:
            self.journal_error = self.journal_error or str(exc)

    def _close_journal(self) -> None:
        """Once the C thread has ended (never while it may still append)."""
        fds, self._journal_fds = self._journal_fds, None
        for fd in fds or ():
            os.close(fd)

    def _open(self) -> None:
        tree = ProcessTree(os.getpid())
        try:
            machine = Machine()
        except BaseException:
            tree.close()
            raise
        self.tree, self.machine = self._ptree, self._pmachine = tree, machine
        self.nvml_reason = self.gpus.open()

    def stop(self) -> None:
        """Wake the thread, which takes the last sample and ends; wait for it."""
        if self._stop.locked():
            self._stop.release()
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT_S)
            self.stuck = self._thread.is_alive()
        if self.native is not None:
            self._collect_native(self.native)
        tree = getattr(self, "tree", None)  # none where the thread failed to open its files
        if isinstance(tree, ProcessTree):
            self.command_lines = [(pid, *seen) for pid, seen in tree.command_lines.items()]
        self.roles = process_roles(self.command_lines, own_command_line())
        self.workers = _most_workers(_whole(self.proc_rows, PROC_STRIDE), os.getpid(), self.roles)

    def _collect_native(self, native: NativeSampler) -> None:
        """Stop the C thread and take its rows and counts (the GPU thread's are already here)."""
        if not native.running:
            return
        native.stop()
        st = native.stats
        self.proc_rows, self.machine_rows = native.proc_rows(), native.machine_rows()
        _without_own_switches(self.proc_rows, os.getpid(), self._gpu_ctx)
        self.tree = _TreeSummary(native.seen(), st["max_children"], native.io_unreadable(), st["io_unreadable"],
                                 bool(st["children_listed"]))  # fmt: skip
        self.samples, self.late, self.halvings = st["samples"], st["late"], self.halvings + st["halvings"]
        self.errors += st["errors"]
        self.first_error = self.first_error or native.first_error()
        self.busy_ns, self.step = st["busy_ns"], st["step"]
        self.thread_cpu_ns += st["thread_cpu_ns"]
        self.stuck = self.stuck or bool(st["stuck"])
        self.command_lines = native.command_lines()
        if st["journal_failed"]:
            self.journal_error = self.journal_error or "a write failed (a full disk?)"
        if not st["stuck"]:
            self._close_journal()
        native.close()

    def _run_gpus(self) -> None:
        """With the C sampler: the GPUs only, every ``max(GPU_PERIOD_NS, interval)``, until ``stop``."""
        self.gpu_tid = threading.get_native_id()
        try:
            self.nvml_reason = self.gpus.open()
        finally:
            self._started.set()
        period = max(GPU_PERIOD_NS, self.interval_ns)
        j = 0
        try:
            while self.gpus.handles and self._failing < MAX_ERRORS:
                j = max(j + 1, (time.monotonic_ns() - self._start) // period + 1)
                if self._stop.acquire(timeout=max(self._start + j * period - time.monotonic_ns(), 0) / 1e9):
                    break
                self._take_gpus(j * period // self.interval_ns)
            if self.gpus.handles:
                self._take_gpus((time.monotonic_ns() - self._start) // self.interval_ns)
        finally:
            use = resource.getrusage(resource.RUSAGE_THREAD)
            self.thread_cpu_ns += int((use.ru_utime + use.ru_stime) * 1e9)
            self.gpus.close()

    def _take_gpus(self, k: int) -> None:
        g0 = time.monotonic_ns()
        own = resource.getrusage(resource.RUSAGE_THREAD)  # this thread's switches are the profiler's
        self._gpu_ctx.append((time.time_ns(), own.ru_nvcsw, own.ru_nivcsw))
        try:
            self.gpus.sample(k, time.time_ns(), self.gpu_rows)
            self.gpu_samples += 1
            self._failing = 0
        except Exception as exc:  # never into the program: counted, the first kept for health
            self._failed(exc)
        self.gpu_ns += time.monotonic_ns() - g0
        if 8 * len(self.gpu_rows) >= BUFFER_CAP_BYTES // 4:  # keep every other GPU sample
            self.halvings += 1
            self.gpu_rows = _every_other(self.gpu_rows, GPU_STRIDE)
            self._gpu_ctx = self._gpu_ctx[::2]  # bounded too: the counts subtracted are then a little older

    def _run(self) -> None:
        self.thread_tid = threading.get_native_id()
        try:
            self._open()
        except BaseException as exc:  # handed to start(), on the program's thread
            self._open_error = exc
            self._started.set()
            return
        k = 0
        try:
            self._take(0, full=True)
            self._started.set()
            while self._failing < MAX_ERRORS:
                k = self._next(k)
                delay_ns = self._start + k * self.interval_ns - time.monotonic_ns()
                if self._stop.acquire(timeout=max(delay_ns, 0) / 1e9):
                    break
                self._take(k, full=False)
                if self._nbytes() >= BUFFER_CAP_BYTES:
                    self._halve()
        finally:  # the region's end, whatever happened
            self._take(k + 1, full=True)
            use = resource.getrusage(resource.RUSAGE_THREAD)
            self.thread_cpu_ns = int((use.ru_utime + use.ru_stime) * 1e9)
            self._close()

    def _next(self, k: int) -> int:
        """The next sample due after sample ``k``: the next multiple of ``step``, or a later one if that is
        already past (the skipped ones are counted late)."""
        due = (k // self.step + 1) * self.step
        now = (time.monotonic_ns() - self._start) // self.interval_ns
        if now >= due:
            later = (now // self.step + 1) * self.step
            self.late += (later - due) // self.step
            due = later
        return due

    def _take(self, k: int, *, full: bool) -> None:
        t0 = time.monotonic_ns()
        try:
            ts = time.time_ns()
            full = full or t0 - self._last_full >= FULL_PERIOD_NS
            own = resource.getrusage(resource.RUSAGE_THREAD)
            own_ctx = (own.ru_nvcsw, own.ru_nivcsw)
            self._ptree.sample(k, ts, t0, own_ctx, self.proc_rows, full)
            if full:
                self._ptree.bytes_read += self._pmachine.sample(k, ts, self.machine_rows)
                self._last_full = t0
            if self.gpus.handles and (full or t0 - self._last_gpu >= GPU_PERIOD_NS):
                g0 = self._last_gpu = time.monotonic_ns()
                self.gpus.sample(k, ts, self.gpu_rows)
                self.gpu_ns += time.monotonic_ns() - g0  # NVML calls can be slow: measured, for config
                self.gpu_samples += 1
            self.samples += 1
            self._failing = 0
        except Exception as exc:  # never into the program: counted, the first kept for health
            self._failed(exc)
        self.busy_ns += time.monotonic_ns() - t0

    def _failed(self, exc: Exception) -> None:
        """A sample that failed: counted (``MAX_ERRORS`` in a row stop the thread), the first error kept."""
        self.errors += 1
        self._failing += 1
        if self.first_error is None:
            self.first_error = f"{type(exc).__name__}: {exc}"

    def _nbytes(self) -> int:
        return 8 * (len(self.machine_rows) + len(self.proc_rows) + len(self.gpu_rows))

    def _halve(self) -> None:
        """Keep every other sample and double the interval: bounded memory over the whole run."""
        self.step *= 2
        self.halvings += 1
        self.machine_rows = _every(self.machine_rows, self.machine.stride, self.step)
        self.proc_rows = _every(self.proc_rows, PROC_STRIDE, self.step)
        self.gpu_rows = _every(self.gpu_rows, GPU_STRIDE, self.step)

    def _close(self) -> None:
        if isinstance(self.tree, ProcessTree):
            self.tree.close()
        if isinstance(self.machine, Machine):
            self.machine.close()
        self.gpus.close()

    # -- after the run --------------------------------------------------------------------------------------
    def write(self, sink: Sink) -> None:
        """Queue every sample's counters on ``sink``."""
        machine, procs, gpus = (_whole(r, s) for r, s in ((self.machine_rows, self.machine.stride),
                                (self.proc_rows, PROC_STRIDE), (self.gpu_rows, GPU_STRIDE)))  # fmt: skip
        self.counters_written = (
            write_machine(sink, machine, self.machine.cpus) + write_processes(sink, procs) + write_gpus(sink, gpus)
        )
        self.machine_rows, self.proc_rows, self.gpu_rows = array("q"), array("q"), array("q")

    def config(self) -> dict[str, Any]:
        """The run's ``config.system`` entries (``A.CONFIG_SYSTEM``) this sampler knows."""
        torch = sys.modules.get("torch")
        gpu_ns = max(GPU_PERIOD_NS, self.interval_ns)
        return {
            "interval_ms": self.interval_ns / 1e6,
            "cores": os.cpu_count(),
            "samples": self.samples,
            "late_samples": self.late,
            "torch_threads": int(torch.get_num_threads()) if torch is not None else None,
            "gpus": self.gpus.devices,
            "gpu_names": dict(zip(self.gpus.devices, self.gpus.names, strict=True)),
            "full_interval_ms": max(FULL_PERIOD_NS, self.interval_ns) / 1e6,
            "gpu_interval_ms": gpu_ns / 1e6 if self.gpus.handles else None,
            "nvml": self.nvml_reason,
            "workers": self.workers,
            "process_roles": {str(pid): role for pid, role in sorted(self.roles.items())},
            "sampler_cpu_ns": self.thread_cpu_ns,
            "sampler": "native" if self.native is not None else "python",
            "sampler_tid": self.thread_tid,
            "sampler_tids": [t for t in (self.thread_tid, self.gpu_tid) if t is not None],
            "sample_us": round(self.busy_ns / self.samples / 1e3, 1) if self.samples else None,
            "gpu_sample_us": round(self.gpu_ns / self.gpu_samples / 1e3, 1) if self.gpu_samples else None,
        }

    def health(self) -> list[tuple[str, int, str]]:
        """Health rows: what was sampled, and anything missed or left out."""
        ms = self.interval_ns / 1e6
        tree = self.tree
        pids = ", ".join(map(str, sorted(tree.seen)[:20])) + (", ..." if len(tree.seen) > 20 else "")
        rows = [
            ("system_samples", self.samples, f"samples every {ms:g} ms, full ones every "
             f"{max(FULL_PERIOD_NS, self.interval_ns) / 1e6:g} ms ({self.counters_written:,} counters); the sampler "
             f"thread used {self.thread_cpu_ns / 1e6:.1f} ms of CPU"),
            ("system_late_samples", self.late, "samples skipped because the one before came too late (the program "
             "held the interpreter lock or the machine was busy)"),
            ("system_processes", len(tree.seen), f"processes sampled (pids {pids}); at most {tree.max_children} "
             "child processes at once"),
        ]  # fmt: skip
        if tree.io_unreadable:
            pid, why = next(iter(tree.io_unreadable.items()))
            rows.append(("system_io_unreadable", tree.io_unreadable_count, f"processes whose /proc/PID/io could not "
                         f"be read: their I/O counters are left out (pid {pid}: {why})"))  # fmt: skip
        if not tree.children_listed:
            rows.append(("system_children_unlisted", 1, "this kernel has no /proc/PID/task/TID/children "
                         "(CONFIG_PROC_CHILDREN): child processes were not sampled"))  # fmt: skip
        if self.errors:
            rows.append(("system_sampler_errors", self.errors, f"samples that failed; the first: {self.first_error}"))
        if self.halvings:
            rows.append(("system_interval_doubled", self.halvings, f"the samples reached {BUFFER_CAP_BYTES >> 20} "
                         f"MiB: every other one was dropped, and the run ends at {ms * self.step:g} ms"))  # fmt: skip
        if self.journal_error is not None:
            rows.append(("system_journal_failed", 1, f"the system samples could not be kept beside the store as "
                         f"the run went ({self.journal_error}): had the program been killed outright, they would "
                         "have been lost (the profile itself is complete)"))  # fmt: skip
        if self.stuck:
            rows.append(("system_sampler_stuck", 1, f"the sampler thread did not end within {JOIN_TIMEOUT_S:g} s"))
        return rows + self._gpu_health()

    def _gpu_health(self) -> list[tuple[str, int, str]]:
        rows = []
        if self.nvml_reason is not None:
            # a finding only where GPUs exist; elsewhere the row just says why there are no GPU counters
            rows.append(("system_no_gpu_telemetry", int(gpus_expected()), self.nvml_reason))
        if self.gpus.unsupported:
            detail = "; ".join(f"{k} ({why})" for k, why in sorted(self.gpus.unsupported.items()))
            rows.append(("system_gpu_unsupported", len(self.gpus.unsupported), f"GPU metrics left out: {detail}"))
        if self.gpus.errors:
            rows.append(("system_gpu_errors", self.gpus.errors, f"NVML calls that failed: {self.gpus.first_error}"))
        return rows


def _every(rows: array[int], stride: int, step: int) -> array[int]:
    """The rows of ``rows`` whose sample number is a multiple of ``step``."""
    kept: array[int] = array("q")
    for i in range(0, len(rows), stride):
        if rows[i] % step == 0:
            kept.extend(rows[i : i + stride])
    return kept


def _most_workers(rows: array[int], root: int, helpers: dict[int, str]) -> int:
    """The most processes other than ``root`` and ``helpers`` in one sample of the process ``rows``: a helper that
    ended before the workers started does not take a worker's place in the count."""
    per = Counter(k for k, pid in zip(rows[0::PROC_STRIDE], rows[2::PROC_STRIDE], strict=True)
                  if pid != root and pid not in helpers)  # fmt: skip
    return max(per.values(), default=0)


def _whole(rows: array[int], stride: int) -> array[int]:
    """``rows`` without a trailing partial row (a thread that did not stop may still be appending)."""
    return rows[: len(rows) - len(rows) % stride]


def _every_other(rows: array[int], stride: int) -> array[int]:
    """Every other row of ``rows`` (``stride`` values each), the first kept."""
    out = array("q")
    for at in range(0, len(rows) - stride + 1, 2 * stride):
        out.extend(rows[at : at + stride])
    return out


class _TreeSummary:
    """What ``health`` and ``config`` read of a process tree, from the C sampler's counts."""

    def __init__(self, seen: set[int], max_children: int, io_unreadable: dict[int, str], io_unreadable_count: int,
                 children_listed: bool) -> None:  # fmt: skip
        self.seen, self.max_children, self.children_listed = seen, max_children, children_listed
        self.io_unreadable, self.io_unreadable_count = io_unreadable, io_unreadable_count


class _CpuNames:
    """The machine's cpu line names and its rows' stride, as the C sampler read them."""

    def __init__(self, cpus: list[str]) -> None:
        self.cpus = cpus
        self.stride = MACHINE_HEAD + 2 * len(cpus)


def _without_own_switches(rows: array[int], root: int, own: list[tuple[int, int, int]]) -> None:
    """Take the GPU thread's context switches out of the profiled process's rows, in place: ``own`` holds its
    cumulative (ts_ns, voluntary, involuntary) counts in time order; each row of ``root`` loses the last
    counts read at or before its time (the C thread takes out only its own)."""
    if not own:
        return
    times = [t for t, _, _ in own]
    vol, invol = PROC_STRIDE_CTX
    for at in range(0, len(rows), PROC_STRIDE):
        if rows[at + 2] != root:
            continue
        i = bisect.bisect_right(times, rows[at + 1]) - 1
        if i >= 0:
            rows[at + vol] -= own[i][1]
            rows[at + invol] -= own[i][2]
