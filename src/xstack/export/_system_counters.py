"""How the system level's counters become Perfetto counter tracks: where each goes and what it is called.

A track shows a value over time, so the sampler's cumulative counters (CPU time, context switches, I/O bytes:
``attrs`` says which) are drawn as their rate between two samples, renamed with the rate's unit
(``proc.cpu_user_ns`` -> ``proc.cpu_user_pct``, % of one core); each series' first sample only sets the base.
Per-process counters stay on their process; machine-wide ones (``pid`` NULL, ``device`` ``cpu`` or ``cpu:N``)
go to one "machine" process, a core's under its own name (``cpu.busy_pct core 3``); GPU counters stay on
their GPU's process.
"""

from __future__ import annotations

from typing import Any, Final

from xstack.trace import attrs as A
from xstack.trace.store import Store

MACHINE: Final = "machine"
"""Process key (and ``_Run.process_name`` kind) of the machine-wide counters."""

RATES: Final = {
    A.PROC_CPU_USER_NS: ("proc.cpu_user_pct", 100.0),
    A.PROC_CPU_SYSTEM_NS: ("proc.cpu_system_pct", 100.0),
    A.PROC_CTX_VOLUNTARY: ("proc.ctx_voluntary_per_s", 1e9),
    A.PROC_CTX_INVOLUNTARY: ("proc.ctx_involuntary_per_s", 1e9),
    A.PROC_IO_READ_BYTES: ("proc.io_read_bytes_per_s", 1e9),
    A.PROC_IO_WRITE_BYTES: ("proc.io_write_bytes_per_s", 1e9),
    A.PROC_IO_RCHAR: ("proc.io_rchar_bytes_per_s", 1e9),
    A.PROC_IO_WCHAR: ("proc.io_wchar_bytes_per_s", 1e9),
}
"""Cumulative counters drawn as rates: the track's name and the factor turning (increase / ns) into its unit
(% of one core, or per second)."""

_PREFIXES: Final = ("proc.", "cpu.", "mem.", "gpu.")


def is_system(name: str) -> bool:
    """True for a counter the system level's sampler writes."""
    return name.startswith(_PREFIXES)


def machine_wide(name: str, pid: Any, device: Any) -> bool:
    """True for a machine-wide system counter (all cores, one core, or memory)."""
    return pid is None and is_system(name) and (device == "cpu" or str(device).startswith("cpu:"))


def track_name(name: str, device: Any) -> str:
    """The track's name: a core's counters carry the core (``cpu.busy_pct core 3``), rates their new name."""
    if name in RATES:
        return RATES[name][0]
    if str(device).startswith("cpu:"):
        return f"{name} core {str(device).partition(':')[2]}"
    return name


def roles(store: Store, run_id: int, main_pid: Any, process_roles: Any = None) -> dict[Any, str]:
    """Names of the processes the run's sampler saw: the main process (``main_pid``) and its children, named by
    the role the sampler gave them (``config.system.process_roles``: "subprocess", "resource tracker",
    "forkserver"), else "child process"."""
    named = process_roles if isinstance(process_roles, dict) else {}
    pids = store.query(
        "SELECT DISTINCT pid FROM counters WHERE run_id = ? AND pid IS NOT NULL AND starts_with(name, 'proc.')",
        [run_id],
    )
    return {pid: "main process" if pid == main_pid else _role_name(named.get(str(pid))) for (pid,) in pids}


def _role_name(role: Any) -> str:
    return str(role).replace("_", " ") if isinstance(role, str) and role else "child process"


class Rates:
    """Turns the samples of cumulative counters into rates, one series (pid, device, name) at a time."""

    def __init__(self) -> None:
        self._last: dict[tuple[Any, Any, str], tuple[int, float]] = {}

    def value(self, name: str, pid: Any, device: Any, ts_ns: int, value: float) -> float | None:
        """The value to draw at ``ts_ns``: the sample itself, or for a cumulative counter its rate since the
        series' previous sample (None for the first sample, or one at the same time)."""
        if name not in RATES:
            return value
        key = (pid, device, name)
        last = self._last.get(key)
        self._last[key] = (ts_ns, value)
        if last is None or ts_ns <= last[0]:
            return None
        return (value - last[1]) / (ts_ns - last[0]) * RATES[name][1]
