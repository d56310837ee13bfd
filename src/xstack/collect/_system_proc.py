"""``/proc`` readers of the system level's sampler: the profiled process tree and the machine.

Why they look like this (each tick competes with the program for the interpreter lock and, on a small
machine, for its cores):

- **Open once, re-read with ``os.pread(fd, n, 0)``.** /proc produces a file's text afresh on every read from
  offset 0, so a descriptor kept open gives new numbers for one system call instead of three (open, read,
  close). A descriptor also stays tied to its process: once that process is gone, reading it fails (ESRCH)
  instead of quietly reading a new process that reused the pid.
- **Raw numbers, plain splitting.** Values are cut out of the bytes with ``split`` (no decoding, no regular
  expressions) and kept as integers in flat ``array('q')`` rows of a fixed layout; turning them into
  counters (rates, percentages) waits until the run is written (``write_machine``, ``write_processes``).
- **Children every ~100 ms.** Descendants (DataLoader workers) are found through ``/proc/PID/task/TID/children``
  of every thread, recursively, every ``REDISCOVER_NS``: workers do not come and go every few milliseconds.
  The ``children`` files stay open too, and ``/proc/PID/task`` is listed again only when the process's thread
  count (read from its ``stat``) changed: listing the threads of a PyTorch process and opening a file per
  thread cost about 200 us a time.

The profiled process itself is read partly through ``getrusage``: its CPU times to the microsecond (``/proc``
gives clock ticks, 10 ms) and its context switches summed over all its threads, dead ones included
(``/proc/PID/status`` counts only the thread-group leader). That is all a quick sample reads (two system calls,
no file, the interpreter lock never let go); a full one adds the root's RSS, threads and I/O, and every
descendant. The sampler thread's own switches are taken out, and so are the bytes it read from /proc out of
``rchar``: they are the profiler's, not the program's. Child processes' switches are summed over their
threads' ``/proc/PID/task/TID/status`` (a thread that starts and ends between two listings of the tree, at
most ``REDISCOVER_NS`` apart, is not seen).
"""

from __future__ import annotations

import contextlib
import os
import resource
from array import array
from collections.abc import Sequence

from xstack.trace import attrs as A
from xstack.trace.sink import Sink

CLK_TCK = os.sysconf("SC_CLK_TCK")
NS_PER_TICK = 1_000_000_000 // CLK_TCK
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
REDISCOVER_NS = 100_000_000
"""How often the tree of child processes is listed again, in ns."""
STACK_START = 25
"""``startstack`` (field 28 of ``/proc/PID/stat``) among the fields after the name, which ``_stat`` splits."""
MISSING = -1
"""A value not read (an unreadable ``/proc/PID/io``; what only a full sample reads) in a row."""
_NO_IO = (MISSING, MISSING, MISSING, MISSING)

PROC_FIELDS = (
    A.PROC_CPU_USER_NS, A.PROC_CPU_SYSTEM_NS, A.PROC_RSS_BYTES, A.PROC_THREADS, A.PROC_CTX_VOLUNTARY,
    A.PROC_CTX_INVOLUNTARY, A.PROC_IO_READ_BYTES, A.PROC_IO_WRITE_BYTES, A.PROC_IO_RCHAR, A.PROC_IO_WCHAR,
)  # fmt: skip
"""Counter names of a process row's values, in row order."""
PROC_STRIDE = 3 + len(PROC_FIELDS)
"""A process row: sample number, ts_ns, pid, then ``PROC_FIELDS``."""
MACHINE_HEAD = 6
"""A machine row: sample number, ts_ns, procs_running, procs_blocked, mem used, mem available (bytes), then
(total, idle) clock ticks of each ``/proc/stat`` cpu line."""


class ProcFile:
    """One /proc file kept open and re-read from offset 0."""

    __slots__ = ("fd", "size")

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.size = 4096

    def read(self) -> bytes:
        """The file's current text (grows the read size until the whole file fits)."""
        while True:
            data = os.pread(self.fd, self.size, 0)
            if len(data) < self.size:
                return data
            self.size *= 2

    def close(self) -> None:
        """Close the descriptor."""
        os.close(self.fd)


def _open(path: str) -> ProcFile | None:
    try:
        return ProcFile(path)
    except OSError:
        return None


class _Process:
    """The open files of one process of the tree."""

    __slots__ = ("pid", "stat", "io", "nthreads", "listed", "kids", "status", "last_ctx", "dead_ctx")

    def __init__(self, pid: int, stat: ProcFile, io: ProcFile | None) -> None:
        self.pid = pid
        self.stat = stat
        self.io = io
        self.nthreads = 0
        """Threads, as the last read of ``stat`` said."""
        self.listed = -1
        """Threads found when ``/proc/PID/task`` was last listed (-1: to list again)."""
        self.kids: dict[int, ProcFile] = {}
        """Each thread's ``children`` (the processes it started)."""
        self.status: dict[int, ProcFile] = {}
        """Child processes: each thread's ``status``, for its context switches."""
        self.last_ctx: dict[int, tuple[int, int]] = {}
        self.dead_ctx = [0, 0]
        """Switches of the threads that ended, as last read: keeps the sum from going back."""

    def close(self) -> None:
        for f in (self.stat, self.io, *self.kids.values(), *self.status.values()):
            if f is not None:
                f.close()


class ProcessTree:
    """The profiled process (``root``) and its descendants, sampled into process rows."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.procs: dict[int, _Process] = {}
        self.seen: set[int] = set()
        """Every pid sampled at least once."""
        self.max_children = 0
        """The most descendants alive at one time."""
        self.io_unreadable: dict[int, str] = {}
        """pid -> why its ``/proc/PID/io`` could not be read (its I/O counters are left out)."""
        self.bytes_read = 0
        """Bytes this sampler read from /proc: the root's ``rchar`` is reported without them."""
        self.children_listed = os.path.exists(f"/proc/{root}/task/{root}/children")
        """False on kernels without ``CONFIG_PROC_CHILDREN``: only the root is sampled."""
        self.command_lines: dict[int, tuple[int, list[str], bool]] = {}
        """pid -> a descendant's parent pid and command line when first seen, and whether it was forked from that
        parent (``inherited``: see ``_note_cmdline``): what ``process_roles`` tells the helpers of
        ``multiprocessing`` and the subprocesses by, read while they run."""
        self._recheck: set[int] = set()
        """Descendants forked from their parent: read again at the next listing, once (one seen between its fork
        and its exec had not taken its own command line yet)."""
        self._next_listing = 0
        stat = ProcFile(f"/proc/{root}/stat")
        self.procs[root] = _Process(root, stat, self._open_io(root))

    def sample(self, k: int, ts_ns: int, now_ns: int, own_ctx: tuple[int, int], out: array[int], full: bool) -> None:
        """Append rows for sample ``k`` taken at ``ts_ns`` (run clock): the root's CPU times and context
        switches always; with ``full``, its RSS, threads and I/O too, and a row per descendant. ``now_ns``
        (monotonic) paces the listing of children; ``own_ctx``: the sampler thread's own (voluntary,
        involuntary) switches, left out of the root's."""
        if full and self.children_listed and now_ns >= self._next_listing:
            self._next_listing = now_ns + REDISCOVER_NS
            self._relist()
        out.extend((k, ts_ns, self.root, *self._read_root(own_ctx, full)))
        self.seen.add(self.root)
        if not full:
            return
        for pid, proc in list(self.procs.items()):
            if pid == self.root:
                continue
            try:
                row = self._read_child(proc)
            except OSError:  # the process ended between two reads
                self._drop(pid)
                continue
            out.extend((k, ts_ns, pid, *row))  # one call: a row is never left half written
            self.seen.add(pid)

    @property
    def io_unreadable_count(self) -> int:
        """Processes whose ``/proc/PID/io`` could not be read."""
        return len(self.io_unreadable)

    def close(self) -> None:
        """Close every descriptor."""
        for pid in list(self.procs):
            self._drop(pid)

    # -- reading --------------------------------------------------------------------------------------------
    def _read(self, f: ProcFile) -> bytes:
        data = f.read()
        self.bytes_read += len(data)
        return data

    def _stat(self, proc: _Process) -> list[bytes]:
        data = self._read(proc.stat)
        f = data[data.rindex(b")") + 2 :].split()  # the name in parentheses may hold spaces
        proc.nthreads = int(f[17])
        return f

    def _io(self, proc: _Process, own_bytes: bool) -> tuple[int, int, int, int]:
        if proc.io is None:
            return _NO_IO
        own = self.bytes_read if own_bytes else 0  # before this read: the kernel counts a read once it returns
        try:
            data = self._read(proc.io)
        except PermissionError as exc:
            self.io_unreadable[proc.pid] = str(exc)
            proc.io.close()
            proc.io = None
            return _NO_IO
        f = data.split()  # rchar: N wchar: N syscr: N syscw: N read_bytes: N write_bytes: N ...
        return int(f[9]), int(f[11]), int(f[1]) - own, int(f[3])

    def _read_root(self, own_ctx: tuple[int, int], full: bool) -> list[int]:
        use = resource.getrusage(resource.RUSAGE_SELF)
        rss = threads = MISSING
        io = _NO_IO
        if full:
            proc = self.procs[self.root]
            f = self._stat(proc)
            rss, threads, io = int(f[21]) * PAGE_BYTES, proc.nthreads, self._io(proc, True)
        return [
            int(use.ru_utime * 1e9),
            int(use.ru_stime * 1e9),
            rss,
            threads,
            use.ru_nvcsw - own_ctx[0],
            use.ru_nivcsw - own_ctx[1],
            *io,
        ]

    def _read_child(self, proc: _Process) -> list[int]:
        f = self._stat(proc)
        voluntary, involuntary = self._thread_ctx(proc)
        rss = int(f[21])
        exited = rss == 0 or f[0] == b"Z"  # exiting or not yet reaped: final CPU times, no memory or threads
        return [
            int(f[11]) * NS_PER_TICK,
            int(f[12]) * NS_PER_TICK,
            MISSING if exited else rss * PAGE_BYTES,
            MISSING if exited else proc.nthreads,
            voluntary,
            involuntary,
            *self._io(proc, False),
        ]

    def _thread_ctx(self, proc: _Process) -> tuple[int, int]:
        for tid, status in list(proc.status.items()):
            try:
                proc.last_ctx[tid] = parse_ctx(self._read(status))
            except OSError:  # the thread ended: what it had done stays in dead_ctx
                self._end_thread(proc, tid)
        live = proc.last_ctx.values()
        return proc.dead_ctx[0] + sum(c[0] for c in live), proc.dead_ctx[1] + sum(c[1] for c in live)

    # -- the tree -------------------------------------------------------------------------------------------
    def _relist(self) -> None:
        """Find the descendants through each thread's ``children``, recursively; open the new ones' files and
        close those of the processes gone."""
        alive = {self.root}
        todo = [self.root]
        while todo:
            pid = todo.pop()
            proc = self.procs.get(pid)
            if proc is not None and pid in self._recheck:
                self._recheck.discard(pid)
                self._note_cmdline(proc)
            elif proc is None and (proc := self._add(pid)) is not None and pid != self.root:
                self._note_cmdline(proc)
                if self.command_lines[pid][2]:
                    self._recheck.add(pid)
            for child in self._children(proc) if proc is not None else ():
                if child not in alive:
                    alive.add(child)
                    todo.append(child)
        for pid in self.procs.keys() - alive:
            self._drop(pid)
        self.max_children = max(self.max_children, len(self.procs) - 1)

    def _children(self, proc: _Process) -> list[int]:
        if proc.listed != proc.nthreads:  # threads came or went since the last listing
            self._list_threads(proc)
        children: list[int] = []
        for tid, kids in list(proc.kids.items()):
            try:
                children += map(int, self._read(kids).split())
            except OSError:  # the thread ended
                proc.kids.pop(tid).close()
                proc.listed = -1
        return children

    def _list_threads(self, proc: _Process) -> None:
        """Open the ``children`` (and, for a descendant, ``status``) file of each new thread; close the files of
        the threads gone."""
        try:
            tids = {int(t) for t in os.listdir(f"/proc/{proc.pid}/task")}
        except OSError:
            return
        proc.listed = len(tids)
        for tid in tids - proc.kids.keys():
            kids = _open(f"/proc/{proc.pid}/task/{tid}/children")
            if kids is not None:
                proc.kids[tid] = kids
            status = _open(f"/proc/{proc.pid}/task/{tid}/status") if proc.pid != self.root else None
            if status is not None:
                proc.status[tid] = status
        for tid in proc.kids.keys() - tids:
            proc.kids.pop(tid).close()
        for tid in proc.status.keys() - tids:
            self._end_thread(proc, tid)

    def _add(self, pid: int) -> _Process | None:
        stat = _open(f"/proc/{pid}/stat")
        if stat is None:
            return None
        proc = self.procs[pid] = _Process(pid, stat, self._open_io(pid))
        return proc

    def _note_cmdline(self, proc: _Process) -> None:
        """Read the parent pid (``/proc/PID/stat``, kept from the first sight: a parent that ends hands its
        children to another) and the command line of ``proc`` into ``command_lines``, with whether it was forked
        from that parent and has not exec'd since: its parent's command line, and its parent's stack.
        ``exec`` places the stack anew, at a random address (ASLR), and a fork keeps it where its parent's is,
        so a copy of its parent started by exec with the very same command line is not taken for a fork."""
        argv = self._cmdline(proc.pid)
        ppid = self.command_lines[proc.pid][0] if proc.pid in self.command_lines else 0
        inherited = False
        with contextlib.suppress(OSError, ValueError, IndexError):  # the process ended
            f = self._stat(proc)
            ppid = ppid or int(f[1])
            if argv and argv == self._cmdline(ppid):
                inherited = same_stack(int(f[STACK_START]) if len(f) > STACK_START else 0, self._stack_start(ppid))
        self.command_lines[proc.pid] = (ppid, argv, inherited)

    def _stack_start(self, pid: int) -> int:
        """Where the stack of process ``pid`` starts (0 where unreadable)."""
        data = self._read_once(f"/proc/{pid}/stat")
        try:
            return int(data[data.rindex(b")") + 2 :].split()[STACK_START])
        except (ValueError, IndexError):
            return 0

    def _cmdline(self, pid: int) -> list[str]:
        return self._read_once(f"/proc/{pid}/cmdline").decode(errors="replace").split("\0")[:-1]

    def _read_once(self, path: str) -> bytes:
        """The text of a /proc file opened for one read (empty where the process is gone)."""
        f = _open(path)
        if f is None:
            return b""
        try:
            return self._read(f)
        except OSError:
            return b""
        finally:
            f.close()

    def _open_io(self, pid: int) -> ProcFile | None:
        try:
            return ProcFile(f"/proc/{pid}/io")
        except PermissionError as exc:
            self.io_unreadable[pid] = str(exc)
        except OSError:
            pass
        return None

    def _drop(self, pid: int) -> None:
        proc = self.procs.pop(pid, None)
        if proc is not None:
            proc.close()

    @staticmethod
    def _end_thread(proc: _Process, tid: int) -> None:
        proc.status.pop(tid).close()
        voluntary, involuntary = proc.last_ctx.pop(tid, (0, 0))
        proc.dead_ctx[0] += voluntary
        proc.dead_ctx[1] += involuntary


def same_stack(own: int, parent: int) -> bool:
    """Whether a process whose command line is its parent's has its parent's stack too (``startstack``), so was
    forked and has not exec'd since. 0 is an address not shown (``/proc`` hides it from a reader not allowed
    to trace the process, and a process that is ending has none): the command line alone tells then."""
    return own == parent or not own or not parent


def parse_ctx(status: bytes) -> tuple[int, int]:
    """(voluntary, involuntary) context switches from the text of a ``/proc/.../status`` file."""
    at = status.rindex(b"\nvoluntary_ctxt_switches:")
    f = status[at:].split(None, 4)  # voluntary_ctxt_switches: N nonvoluntary_ctxt_switches: N [...]
    return int(f[1]), int(f[3])


class Machine:
    """Machine-wide CPU (``/proc/stat``) and memory (``/proc/meminfo``), sampled into machine rows."""

    def __init__(self) -> None:
        self.stat = ProcFile("/proc/stat")
        self.meminfo = ProcFile("/proc/meminfo")
        self.cpus = [line.split(None, 1)[0].decode() for line in self._cpu_lines(self.stat.read())]
        """The ``/proc/stat`` cpu line names, ``cpu`` (all cores) first, then ``cpu0``, ``cpu1``, ..."""
        self.stride = MACHINE_HEAD + 2 * len(self.cpus)

    def sample(self, k: int, ts_ns: int, out: array[int]) -> int:
        """Append one machine row for sample ``k`` at ``ts_ns``; returns the bytes read."""
        stat, mem = self.stat.read(), self.meminfo.read()
        lines = self._cpu_lines(stat)
        tail = stat[stat.index(b"\nprocs_running") :].split(None, 4)  # procs_running N procs_blocked N ...
        m = mem.split(None, 9)  # MemTotal: N kB MemFree: N kB MemAvailable: N kB ...
        total_kb, available_kb = int(m[1]), int(m[7])
        row = [k, ts_ns, int(tail[1]), int(tail[3]), (total_kb - available_kb) * 1024, available_kb * 1024]
        if len(lines) != len(self.cpus):  # a core went on or off line: place the lines by name
            by_name = {line.split(None, 1)[0].decode(): line for line in lines}
            lines = [by_name.get(name, b"") for name in self.cpus]
        for line in lines:
            f = line.split()
            if len(f) < 9:
                row += (MISSING, MISSING)
                continue
            idle = int(f[4]) + int(f[5])  # idle + iowait: waiting for I/O is not being busy
            row += (idle + int(f[1]) + int(f[2]) + int(f[3]) + int(f[6]) + int(f[7]) + int(f[8]), idle)
        out.extend(row)  # one call: a row is never left half written
        return len(stat) + len(mem)

    @staticmethod
    def _cpu_lines(stat: bytes) -> list[bytes]:
        end = stat.find(b"\nintr")  # the cpu lines come first; the long interrupt counts need no splitting
        return [line for line in stat[: end if end >= 0 else None].split(b"\n") if line.startswith(b"cpu")]

    def close(self) -> None:
        """Close the descriptors."""
        self.stat.close()
        self.meminfo.close()


def write_machine(sink: Sink, rows: Sequence[int], cpus: list[str]) -> int:
    """Queue the counters of machine ``rows`` (see ``MACHINE_HEAD``) on ``sink``; returns rows written.

    Busy % of a core is computed over the time since its counters last moved: ``/proc/stat`` counts in clock
    ticks (10 ms), so at shorter intervals most samples see no change and give no value."""
    stride = MACHINE_HEAD + 2 * len(cpus)
    devices = ["cpu" if name == "cpu" else f"cpu:{name[3:]}" for name in cpus]
    last: list[tuple[int, int] | None] = [None] * len(cpus)
    written = 0
    for i in range(0, len(rows), stride):
        ts = rows[i + 1]
        for name, at in ((A.CPU_PROCS_RUNNING, 2), (A.CPU_PROCS_BLOCKED, 3), (A.MEM_USED_BYTES, 4),
                         (A.MEM_AVAILABLE_BYTES, 5)):  # fmt: skip
            sink.counter(name, ts, rows[i + at], device="cpu")
        written += 4
        for c, device in enumerate(devices):
            total, idle = rows[i + MACHINE_HEAD + 2 * c], rows[i + MACHINE_HEAD + 2 * c + 1]
            if total == MISSING:
                continue
            before = last[c]
            if before is None or total > before[0]:
                if before is not None:
                    span = total - before[0]
                    sink.counter(A.CPU_BUSY_PCT, ts, 100.0 * (span - (idle - before[1])) / span, device=device)
                    written += 1
                last[c] = (total, idle)
    return written


def write_processes(sink: Sink, rows: Sequence[int]) -> int:
    """Queue the counters of process ``rows`` (see ``PROC_STRIDE``) on ``sink``; returns rows written."""
    written = 0
    for i in range(0, len(rows), PROC_STRIDE):
        ts, pid = rows[i + 1], rows[i + 2]
        for j, name in enumerate(PROC_FIELDS):
            value = rows[i + 3 + j]
            if value != MISSING:
                sink.counter(name, ts, value, pid=pid, device="cpu")
                written += 1
    return written


def own_command_line() -> list[str]:
    """This process's command line, as ``/proc/self/cmdline`` holds it (empty where unreadable)."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []
