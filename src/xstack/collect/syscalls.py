"""The system level's syscall pass: every system call of the profiled process tree, with its duration.

Tracing system calls slows a program far more than any other level (each call stops the process twice), so it
runs only when asked (``xstack run --syscalls``, ``XSTACK_SYSCALLS=1``) and gets a pass of its own in a leveled
measurement (``xstack profile --system``). ``xstack run`` then restarts its child under ``strace -f``, as the
io level restarts it preloaded, and once the whole tree has ended reads strace's output (``collect._strace``)
into ``system`` spans of the run the child recorded: one per call that started inside the profiled region,
under the model or layer span open on its thread at the time (``design.md`` §2), with the call's result,
error, arguments (cut to ``A.SYS_ARGS_MAX``) and the tool (``A.SYS_*``). Calls outside the region (start-up,
imports, the store being written) are counted in health, not kept; a call still running when the region ended
(an idle thread blocked until the process exits) is cut at its end (``A.SYS_PAST_REGION_NS``), so that the run's
spans, and its wall time, end where its model spans do.

strace prints wall-clock times (CLOCK_REALTIME) to the microsecond: the clock of the run's live spans.

``XSTACK_SYSCALL_TOOL=perf`` traces with ``perf record`` on the kernel's ``raw_syscalls`` tracepoints instead
(``collect._perf_trace``): the program is not stopped at each call, so the pass costs far less, but arguments
are six raw integers (no strings), events may be lost when the buffer fills (said in health), and perf's clock
agrees with the run's to within a couple of microseconds only (measured), so a call made in the first
microseconds of a span can be placed under its parent. Without the variable, strace is used where it can
trace, else perf.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from xstack import salvage
from xstack.collect import _child, _perf_trace
from xstack.collect._ingest import last_span_id, measured_region
from xstack.collect._perf_trace import PerfParser
from xstack.collect._strace import Call, StraceParser
from xstack.errors import UsageError
from xstack.text import counted
from xstack.trace import attrs as A
from xstack.trace.sink import Sink
from xstack.trace.store import Store

SYSCALLS_ENV = "XSTACK_SYSCALLS"
"""``1``: a program run with the ``system`` level has its system calls traced (``xstack run --syscalls``)."""
CHILD_ENV = "XSTACK_SYSCALLS_CHILD"
"""Set in the program ``xstack run`` restarted under the tracer: the parent reads the trace once it has ended."""
TOOL = "strace"
TOOL_ENV = "XSTACK_SYSCALL_TOOL"
"""``strace`` or ``perf``: what traces the system calls (default: strace where it can trace, else perf)."""
TOOLS = ("strace", "perf")

STRACE_OPTIONS = ("-f", "-ttt", "-T", "-qq", "-s", "64")
"""Follow forks and threads; wall-clock times to the microsecond; time in each call; no attach or exit
messages; strings cut to 64 characters (arguments are kept cut shorter still)."""


def requested() -> bool:
    """Whether this process was asked to trace system calls and is not already the traced child."""
    return os.environ.get(SYSCALLS_ENV, "") not in ("", "0") and not os.environ.get(CHILD_ENV)


def tool() -> str:
    """The tracer this run uses (``TOOL_ENV``, else strace where it can trace, else perf where it can)."""
    chosen = os.environ.get(TOOL_ENV, "").strip().lower()
    if chosen:
        if chosen not in TOOLS:
            raise UsageError(f"{TOOL_ENV}={chosen!r}: must be one of {', '.join(TOOLS)}")
        return chosen
    if _reason("strace") is None or _reason("perf") is not None:
        return "strace"
    return "perf"


def unavailable_reason() -> str | None:
    """Why system calls cannot be traced here with ``tool()`` (and how to fix it), or None."""
    return _reason(tool())


@functools.cache
def _reason(name: str) -> str | None:
    """Why ``name`` cannot trace here, or None; checked once by tracing ``true``."""
    if not sys.platform.startswith("linux"):
        return f"tracing system calls needs Linux and strace or perf (this is {sys.platform})"
    path = shutil.which(name)
    if path is None:
        return f"{name} is not on PATH: install it (apt-get install {'strace' if name == 'strace' else 'linux-perf'})"
    with tempfile.TemporaryDirectory(prefix="xstack-syscalls-") as tmp:
        command = [path, "-f", "-qq", "-o", os.devnull, "true"] if name == "strace" else [
            path, *_perf_trace.RECORD_OPTIONS, "-o", str(Path(tmp) / "probe.data"), "--", "true"]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{path} could not be run: {exc}"
    if done.returncode == 0:
        return None
    said = (done.stderr.strip().splitlines() or ["no message"])[-1]
    if name == "strace":
        return (f"{path} cannot trace here ({said}): ptrace is not permitted; allow it (in a container: "
                "docker run --cap-add=SYS_PTRACE; else sysctl kernel.yama.ptrace_scope=0 or 1)")  # fmt: skip
    return (f"{path} cannot record the raw_syscalls tracepoints here ({said}): run as root or allow it (sysctl "
            "kernel.perf_event_paranoid=-1), with tracefs mounted")  # fmt: skip


@functools.cache
def tool_version(name: str = TOOL) -> str:
    """``strace 6.1`` or ``perf 6.1.187``: the tracer and its version, for ``config.system.syscall_tool``."""
    try:
        out = subprocess.run([name, "-V" if name == "strace" else "version"], capture_output=True, text=True,
                             timeout=30).stdout.splitlines()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return name
    version = out[0].rsplit(" ", 1)[-1] if out else ""
    return f"{name} {version}".strip()


def trace_path(store: Path, name: str = TOOL) -> Path:
    """Where the tracer writes its output for ``store`` (beside it; removed once read)."""
    return store.with_name(store.name.removesuffix(".duckdb") + (".strace" if name == "strace" else ".perf.data"))


def run_traced(child: list[str], store: Path) -> int:
    """Run ``child`` (an ``xstack run`` command line writing ``store``) under ``tool()``, then read the calls into
    the run it recorded; returns the program's exit code (128 + N when signal N killed it)."""
    name = tool()
    reason = _reason(name)
    if reason:
        raise UsageError(f"system calls cannot be traced here: {reason}")
    trace = trace_path(store, name)
    trace.parent.mkdir(parents=True, exist_ok=True)  # the tracer opens its output before the program makes the store
    trace.unlink(missing_ok=True)
    if name == "strace":
        command = ["strace", *STRACE_OPTIONS, "-o", str(trace), *child]
    else:
        command = ["perf", *_perf_trace.RECORD_OPTIONS, "-o", str(trace), "--", *child]
    offset_ns = _realtime_offset_ns()  # perf's CLOCK_MONOTONIC to the run's clock
    process = subprocess.Popen(command, env=os.environ | {CHILD_ENV: "1"})
    # the program gets a Ctrl-C too (the tracer ignores it): it writes its store
    code = _child.wait(process, forward_sigterm=False)
    try:
        salvage.after_child(store, code, process.returncode)  # killed outright: keep what it wrote
        if store.exists() and trace.exists():
            ingest(store, trace, name, offset_ns)
    finally:
        trace.unlink(missing_ok=True)
    return 128 - code if code < 0 else code


def _realtime_offset_ns() -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC, from the tightest of a few bracketed readings (to about 0.1 us)."""
    best = (1 << 62, 0)
    for _ in range(5):
        m0, real, m1 = time.monotonic_ns(), time.time_ns(), time.monotonic_ns()
        best = min(best, (m1 - m0, real - (m0 + m1) // 2))
    return best[1]


def ingest(store_path: Path, trace_file: Path, name: str = TOOL, offset_ns: int = 0) -> list[tuple[str, int, str]]:
    """Read the tracer's output ``trace_file`` into the last run of the complete store at ``store_path`` (the run
    the traced program recorded), in one transaction; returns the health rows written. ``offset_ns``: perf's
    CLOCK_MONOTONIC to CLOCK_REALTIME."""
    from xstack.collect._ingest import into_run

    return into_run(store_path, lambda store, run_id: ingest_run(store, run_id, trace_file, name, offset_ns))


@contextlib.contextmanager
def _lines(path: Path, name: str) -> Iterator[Iterable[str]]:
    """The lines of strace's output file, or of ``perf script`` reading perf's."""
    if name == "strace":
        with path.open(encoding="utf-8", errors="replace", newline="\n") as lines:
            yield lines
        return
    script = subprocess.Popen(["perf", *_perf_trace.SCRIPT_OPTIONS, "-i", str(path)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, errors="replace")  # fmt: skip
    try:
        assert script.stdout is not None
        yield script.stdout
    finally:
        if script.poll() is None:  # the reader stopped early (an error): perf script need not finish
            script.kill()
        script.wait()


def ingest_run(
    store: Store, run_id: int, path: Path, name: str = TOOL, offset_ns: int = 0
) -> list[tuple[str, int, str]]:
    """Write the calls of the tracer's output ``path`` that started inside run ``run_id``'s region (its model
    spans' first start to last end, ns) as ``system`` spans of the run, whose model and layer spans are already
    in the store; list ``system`` among its levels and record the tool in ``config.system``; returns health."""
    lo, hi = measured_region(store, run_id)
    first_id = last_span_id(store, run_id)
    parser: StraceParser | PerfParser = StraceParser() if name == "strace" else PerfParser(offset_ns)
    outside = kept = own = cut = 0
    sampler = _sampler_tids(store, run_id)
    sink = Sink(store, run_id)
    try:
        with _lines(path, name) as lines:
            for call in parser.calls(lines):
                if not lo <= call.start_ns <= hi:
                    outside += 1
                    continue
                if call.tid in sampler:  # the system level's sampler reading /proc: the profiler's own calls
                    own += 1
                    continue
                kept += 1
                attrs = _attrs(call, name)
                dur_ns = call.dur_ns
                if call.start_ns + dur_ns > hi:  # still blocked when the region ended: the rest is not the run's
                    cut += 1
                    dur_ns = hi - call.start_ns
                    attrs[A.SYS_PAST_REGION_NS] = call.dur_ns - dur_ns
                sink.span(first_id + kept, None, "system", call.name, call.start_ns, dur_ns, call.tid, call.tid, attrs)
    finally:
        sink.close()
    _set_pids(store.con, run_id, first_id, parser)
    set_system_parents(store.con, run_id)
    _record(store, run_id, name)
    health = _health(parser, kept, outside)
    if cut:
        health.append(("syscalls_past_region", cut, "calls still running when the profiled region ended (threads "
                       "blocked as the loop finished, idle pools): cut at its end, the rest in "
                       f"{A.SYS_PAST_REGION_NS}"))  # fmt: skip
    if own:
        health.append(("syscalls_sampler", own, "calls of the system level's sampler thread (its /proc reads): "
                       "the profiler's own, not kept"))  # fmt: skip
    return health


def _sampler_tids(store: Store, run_id: int) -> set[int]:
    """The Linux tids of the run's sampler threads (``config.system.sampler_tids``, or ``sampler_tid``)."""
    found = store.query(f"SELECT config->'$.{A.CONFIG_SYSTEM}' FROM _runs WHERE run_id = ?", [run_id])
    system = orjson.loads(found[0][0]) if found and found[0][0] else {}
    tids = system.get("sampler_tids") or [system.get("sampler_tid")]
    return {int(t) for t in tids if t is not None}


def set_system_parents(con: Any, run_id: int) -> None:
    """Hang each system span of run ``run_id`` from the innermost model or layer span open on its thread when
    the call started (as the io level's spans); a call on a thread with none open keeps no parent."""
    from xstack.collect._ingest import set_parents

    set_parents(con, run_id, "system")


def _set_pids(con: Any, run_id: int, first_id: int, parser: StraceParser | PerfParser) -> None:
    """Spans were written with ``pid = tid``: true of each process's first thread; correct the other threads
    now that every clone's result has been read."""
    moved = {tid: pid for tid in parser.tids if (pid := parser.pid_of(tid)) != tid}
    if not moved:
        return
    con.execute(
        "UPDATE _spans SET pid = m.pid FROM (SELECT unnest(?::BIGINT[]) AS tid, unnest(?::BIGINT[]) AS pid) m "
        "WHERE _spans.run_id = ? AND _spans.span_id > ? AND _spans.level = 'system' AND _spans.tid = m.tid",
        [list(moved), list(moved.values()), run_id, first_id],
    )


def _attrs(call: Call, name: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {A.SYS_ARGS: call.args[: A.SYS_ARGS_MAX], A.SYS_TOOL: name}
    if call.ret is not None:
        attrs[A.SYS_RET] = call.ret
    if call.errno:
        attrs[A.SYS_ERRNO] = call.errno
    if call.unfinished:
        attrs[A.SYS_UNFINISHED] = True
    return attrs


def _record(store: Store, run_id: int, name: str) -> None:
    """List ``system`` among the run's levels and say in ``config.system`` that its calls were traced, and by
    what (a run still being recorded has no row yet)."""
    import orjson

    from xstack.trace.schema import LEVELS

    found = store.query("SELECT coalesce(levels, []), config FROM _runs WHERE run_id = ?", [run_id])
    if not found:
        return
    levels, config = found[0][0], orjson.loads(found[0][1]) if found[0][1] else {}
    ordered = [lv for lv in LEVELS if lv in {*levels, "system"}]
    store.con.execute("UPDATE _runs SET levels = ? WHERE run_id = ?", [ordered, run_id])
    system = config.get(A.CONFIG_SYSTEM)
    system = system if isinstance(system, dict) else {}
    store.set_run_config(run_id, A.CONFIG_SYSTEM, system | {"syscalls": True, "syscall_tool": tool_version(name)})


def _health(parser: StraceParser | PerfParser, kept: int, outside: int) -> list[tuple[str, int, str]]:
    processes = len({parser.pid_of(tid) for tid in parser.tids})
    health = [
        ("syscalls_outside_region", outside, f"system calls before or after the profiled region (start-up, "
         f"imports, the store being written), not kept; the {kept:,} in it, from "
         f"{counted(processes, 'process', 'processes')}, are kept"),
    ]  # fmt: skip
    if parser.skipped:
        health.append(("syscall_lines_skipped", parser.skipped, f"lines of the tracer's output that are not a "
                       f"call, a signal or an exit, left out (the first: {parser.first_skipped!r})"))  # fmt: skip
    if isinstance(parser, PerfParser) and parser.lost:
        health.append(("syscalls_lost", parser.lost, "events perf lost (its buffer filled faster than it was "
                       "emptied): those calls are missing, or cut short"))  # fmt: skip
    if parser.unfinished:
        health.append(("syscalls_unfinished", parser.unfinished, "calls that had not returned when their process "
                       "ended or the trace did (killed?): their spans run to that point"))  # fmt: skip
    return health
