"""Read every form of CSV that ``ncu --csv`` writes into one list of profiled kernels.

Accepted: program output and ``==PROF==``/``==WARNING==`` lines before (and after) the table; the details page
(one row per kernel and metric: ``Section Name``, ``Metric Name``, ``Metric Unit``, ``Metric Value``), with the
old identity columns (``Kernel Time``) or the new ones (``Block Size``, ``Grid Size``, ``Device``, ``CC``), rule
columns and estimated speed-ups, and rule rows that carry no metric value; ``--page raw`` (one column per
metric, then a row of units); NVTX columns (``--nvtx``); values with thousands separators, ``n/a``; auto-scaled
or base units (converted, see ``_units``); kernel names with commas, templates and lambdas (CSV quoting).
A file with no table says why: no permission to the GPU counters (``ERR_NVGPUCTRPERM``, with the fix), no kernel
profiled, or not an ``ncu`` CSV at all.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from xstack.errors import BadInputError
from xstack.importers.ncu._units import parse_number, to_base

ID_COLUMNS: Final = (
    "ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time", "Context", "Stream",
    "Block Size", "Grid Size", "Device", "CC",
)  # fmt: skip
NVTX_THREAD: Final = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
NVTX_START_END: Final = "Id:Domain:Start/Stop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
REQUIRED_COLUMNS: Final = ("ID", "Kernel Name")
"""Without them no kernel can be told apart or named: a table cut or edited by hand."""
DETAIL_COLUMNS: Final = ("Section Name", "Metric Name", "Metric Unit", "Metric Value")
RULE_COLUMNS: Final = ("Rule Name", "Rule Type", "Rule Description", "Estimated Speedup Type", "Estimated Speedup")
_TOOL_LINE = re.compile(r"^==(PROF|WARNING|ERROR|INFO)==")
_KERNEL_ROW = re.compile(r'^"\d+",')
"""A row of the kernel table (it starts with the kernel's ID)."""
_NVTX_RANGE = re.compile(r'"([^"]*)"')
_DECIMAL_COMMA = re.compile(r"^[-+]?\d{1,3}(\.\d{3})*,\d+$|^[-+]?\d+,\d+$")
"""``6,53`` or ``1.234,5``: what ``parse_number`` refuses and a decimal-comma locale writes."""

PERMISSION_FIX: Final = (
    "ncu has no permission to read the GPU performance counters (ERR_NVGPUCTRPERM). Fix: run it as root "
    "(sudo), or allow all users: add 'options nvidia NVreg_RestrictProfilingToAdminUsers=0' to a file in "
    "/etc/modprobe.d/, rebuild the initramfs and reboot; in a container, start it with --cap-add=SYS_ADMIN. "
    "See https://developer.nvidia.com/ERR_NVGPUCTRPERM"
)


@dataclass
class Rule:
    """One rule result of a details page: name, type (``OPT``, ``WRN``, ...), text, estimated speed-up."""

    section: str
    name: str
    kind: str
    description: str
    speedup_type: str | None = None
    speedup: float | None = None


@dataclass
class Kernel:
    """One profiled kernel launch, its metrics in base units (see ``units``)."""

    id: int
    name: str
    pid: int | None = None
    process: str | None = None
    host: str | None = None
    context: int | None = None
    stream: int | None = None
    block: tuple[int, ...] | None = None
    grid: tuple[int, ...] | None = None
    device: int | None = None
    cc: str | None = None
    nvtx: list[str] = field(default_factory=list)
    """Names of the push/pop ranges open on the launching thread, outermost first."""
    metrics: dict[str, float | None] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)
    rules: list[Rule] = field(default_factory=list)


@dataclass
class NcuCsv:
    """A parsed file: its kernels in launch order, which page and header it had, and what was odd in it."""

    path: Path
    kernels: list[Kernel]
    page: str
    """``details`` or ``raw``."""
    header: str
    """``new`` (Block Size, Grid Size, Device, CC) or ``old`` (Kernel Time)."""
    preamble: list[str]
    """Lines before the table: the program's output and the tool's own messages."""
    unknown_units: dict[str, str] = field(default_factory=dict)
    cut_short: str | None = None
    """Where the file ended inside a kernel's rows and that kernel was left out (read with ``allow_cut``)."""
    not_available: int = 0
    """Metric values given as ``n/a``."""


def read_ncu_csv(path: str | Path, *, allow_cut: bool = False) -> NcuCsv:
    """Parse ``path``; ``BadInputError`` naming the file when it holds no kernel table, or ends inside a kernel's
    row unless ``allow_cut`` (that kernel is then left out, and ``cut_short`` says so)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig", errors="replace")
    except OSError as exc:
        raise BadInputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_ncu_csv(text, path, allow_cut=allow_cut)


def parse_ncu_csv(text: str, path: Path, *, allow_cut: bool = False) -> NcuCsv:
    """Parse the text of an ``ncu --csv`` output (``path`` names it in errors; ``allow_cut``: see
    ``read_ncu_csv``)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _is_header(line)), None)
    if start is None:
        raise BadInputError(_why_no_table(path, lines))
    body = [line for line in lines[start:] if line.strip() and not _TOOL_LINE.match(line)]
    header = [c.strip() for c in next(csv.reader(body[:1]))]
    if missing := [name for name in REQUIRED_COLUMNS if name not in header]:
        raise BadInputError(f"{path}: the ncu table has no {' or '.join(repr(m) for m in missing)} column (its "
                            f"header: {', '.join(header[:8])}{', ...' if len(header) > 8 else ''})")  # fmt: skip
    cut = _cut_short(text, body, len(header))
    if cut is not None and not allow_cut:
        raise BadInputError(f"{path}: {cut}")
    kid = body[-1].split(",", 1)[0]
    while cut is not None and len(body) > 1 and body[-1].startswith(f"{kid},"):  # that kernel left out whole
        body.pop()
    rows = list(csv.reader(io.StringIO("\n".join(body))))
    out = NcuCsv(path, [], "details", "old" if "Kernel Time" in header else "new", lines[:start])
    if cut is not None:
        out.cut_short = f"{cut}: kernel {kid.strip(chr(34))} left out"
    if all(c in header for c in ("Metric Name", "Metric Value")):
        _read_details(out, header, rows[1:])
    else:
        out.page = "raw"
        _read_raw(out, header, rows[1:])
    if not out.kernels:
        raise BadInputError(f"{path}: the ncu table has no kernel rows{_tool_messages(lines)}")
    return out


def _cut_short(text: str, body: list[str], columns: int) -> str | None:
    """Why the file ends inside its last kernel row (cut short: ncu still writing or killed, a copy interrupted),
    which would be read as a kernel with what it lacks missing; None where it does not. ncu ends every row with
    a newline; a file cut at a row's end is a whole table of fewer kernels, which nothing can tell."""
    last = body[-1] if len(body) > 1 else ""
    if text.endswith(("\n", "\r")) or not _KERNEL_ROW.match(last):
        return None
    fields = next(csv.reader([last]), [])
    if last.count('"') % 2 == 0 and len(fields) >= columns:
        return None
    return (f"cut short: the file ends inside a kernel row, after {len(fields)} of its {columns} columns (ncu "
            "still writing or killed, or a copy interrupted?)")  # fmt: skip


def _is_header(line: str) -> bool:
    return line.lstrip("\ufeff").startswith('"ID","Process ID"')


def _why_no_table(path: Path, lines: list[str]) -> str:
    text = "\n".join(lines)
    if "ERR_NVGPUCTRPERM" in text:
        return f"{path}: no kernel was profiled: {PERMISSION_FIX}"
    if "No kernels were profiled" in text:
        return (
            f"{path}: ncu profiled no kernel: none ran inside the filters given (--nvtx-include, -k, "
            f"--launch-skip/--launch-count), or the program ended first{_tool_messages(lines)}"
        )
    return f'{path}: not an Nsight Compute CSV (no \'"ID","Process ID",...\' header line; made with ncu --csv?)'


def _tool_messages(lines: list[str]) -> str:
    errors = [line.strip() for line in lines if line.startswith(("==ERROR==", "==WARNING=="))]
    return f" (ncu said: {' | '.join(errors[:3])})" if errors else ""


def _identity(out: NcuCsv, header: list[str], row: list[str]) -> Kernel:
    cell = dict(zip(header, row, strict=False))
    try:
        kid = int(cell["ID"])
    except (KeyError, ValueError):
        raise BadInputError(f"{out.path}: a row of the ncu table has no kernel ID: {row[:5]}") from None
    return Kernel(
        id=kid,
        name=cell.get("Kernel Name", ""),
        pid=_int(cell.get("Process ID")),
        process=cell.get("Process Name") or None,
        host=cell.get("Host Name") or None,
        context=_int(cell.get("Context")),
        stream=_int(cell.get("Stream")),
        block=_dims(cell.get("Block Size")),
        grid=_dims(cell.get("Grid Size")),
        device=_int(cell.get("Device")),
        cc=cell.get("CC") or None,
        nvtx=_nvtx(cell.get(NVTX_THREAD)),
    )


def _read_details(out: NcuCsv, header: list[str], rows: list[list[str]]) -> None:
    col = {name: header.index(name) for name in (*DETAIL_COLUMNS, *RULE_COLUMNS) if name in header}
    kernels: dict[int, Kernel] = {}
    for row in rows:
        if len(row) < len(header) - len(RULE_COLUMNS):  # a stray line of program output
            continue
        kid = _int(row[0])
        kernel = kernels.get(kid) if kid is not None else None
        if kernel is None:  # a kernel's identity once, not again for each of its metric rows
            kernel = _identity(out, header, row)
            kernels[kernel.id] = kernel
        get = {name: row[i].strip() if i < len(row) else "" for name, i in col.items()}
        section, metric = get.get("Section Name", ""), get.get("Metric Name", "")
        if metric:
            _put(out, kernel, _detail_key(section, metric), get.get("Metric Value", ""), get.get("Metric Unit", ""))
        if get.get("Rule Name"):
            kernel.rules.append(
                Rule(section, get["Rule Name"], get.get("Rule Type", ""), get.get("Rule Description", ""),
                     get.get("Estimated Speedup Type") or None, _number_or_none(get.get("Estimated Speedup", "")))
            )  # fmt: skip
    out.kernels = [kernels[k] for k in sorted(kernels)]


def _read_raw(out: NcuCsv, header: list[str], rows: list[list[str]]) -> None:
    ident = {*ID_COLUMNS, NVTX_THREAD, NVTX_START_END}
    metric_cols = [(i, name) for i, name in enumerate(header) if name not in ident]
    units = [""] * len(header)
    if rows and not rows[0][0].strip():  # the units row
        units = [*rows[0], *[""] * len(header)][: len(header)]
        rows = rows[1:]
    for row in rows:
        if not row or not row[0].strip().isdigit():
            continue
        kernel = _identity(out, header, row)
        for i, name in metric_cols:
            _put(out, kernel, name, row[i] if i < len(row) else "", units[i])
        out.kernels.append(kernel)
    out.kernels.sort(key=lambda k: k.id)


# The sections' display names of the metrics xstack reads, for details pages made with --section/--set
# rather than --metrics (their metric names are then labels, not metric names).
_DISPLAY: Final = {
    ("GPU Speed Of Light Throughput", "Duration"): "gpu__time_duration.sum",
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"): "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    ("GPU Speed Of Light Throughput", "Memory Throughput"): (
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
    ),
    ("GPU Speed Of Light Throughput", "DRAM Throughput"): "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    ("Occupancy", "Achieved Occupancy"): "sm__warps_active.avg.pct_of_peak_sustained_active",
    ("Launch Statistics", "Registers Per Thread"): "launch__registers_per_thread",
    ("Launch Statistics", "Block Size"): "launch__block_size",
    ("Launch Statistics", "Grid Size"): "launch__grid_size",
}


def _detail_key(section: str, metric: str) -> str:
    """The metric's own name where the row gives one (``--metrics``), else ``Section: Label``."""
    if "__" in metric:
        return metric
    return _DISPLAY.get((section, metric), f"{section}: {metric}" if section else metric)


def _put(out: NcuCsv, kernel: Kernel, name: str, text: str, unit: str) -> None:
    try:
        value = parse_number(text)
    except ValueError:  # a textual metric (a name, an enum): kept out of the numbers
        if _DECIMAL_COMMA.match(text.strip()):  # dropped, it would be reported as a metric the CSV lacks
            raise BadInputError(
                f"{out.path}: kernel {kernel.id}'s {name} reads {text.strip()!r}, a number with a decimal comma, "
                "which would be misread (a comma separates thousands here): convert the file to decimal points"
            ) from None
        return
    if value is None:
        out.not_available += 1
        kernel.metrics[name] = None
        return
    value, base, known = to_base(value, unit)
    if not known:
        out.unknown_units[name] = unit
    kernel.metrics[name] = value
    kernel.units[name] = base


def _int(text: str | None) -> int | None:
    try:
        value = parse_number(text or "")
    except ValueError:
        return None
    return int(value) if value is not None else None


def _number_or_none(text: str) -> float | None:
    try:
        return parse_number(text)
    except ValueError:
        return None


def _dims(text: str | None) -> tuple[int, ...] | None:
    """``(128, 1, 1)`` as a tuple."""
    nums = re.findall(r"\d+", text or "")
    return tuple(int(n) for n in nums) if nums else None


def _nvtx(text: str | None) -> list[str]:
    """Range names of the thread's push/pop stack: ``TID  "<domain>:name:..."  "<domain>:name:..."``."""
    names = []
    for quoted in _NVTX_RANGE.findall(text or ""):
        # Domain:Name:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg, where the name itself may hold colons
        parts = quoted.split(":")
        names.append(":".join(parts[1:-6]) if len(parts) >= 8 else (parts[1] if len(parts) > 1 else parts[0]))
    return names
