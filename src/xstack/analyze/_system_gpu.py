"""GPU utilisation and clock throttling over the run, from the system level's NVML samples."""

from __future__ import annotations

from typing import Any, Final

from xstack.analyze._system_common import (
    GPU_PERIOD_MS,
    MIN_SAMPLES,
    RunFacts,
    Sampling,
    SystemRuns,
    data_note,
    periods_ms,
    region,
    shortfall,
    system_runs,
    time_bins,
)
from xstack.analyze._timeline_common import notes_of, rows
from xstack.analyze.result import Chart, Column, Result, bin_column, bin_label
from xstack.errors import UsageError
from xstack.trace import attrs as A
from xstack.trace.store import Store

ID = "system.gpu"
TITLE = "GPU utilisation and clock throttling"
TIME_ID = "system.gpu_time"
TIME_TITLE = "GPU utilisation and SM clock over time"
BINS = 100
MAX_GPUS = 8
"""GPUs drawn over time (the first by device number)."""

THERMAL_BITS: Final = (0x20, 0x40)
"""Throttle reasons that mean heat: software and hardware thermal slowdown."""
POWER_BITS: Final = (0x4, 0x80)
"""Throttle reasons that mean power: the software power cap and the hardware power brake."""
PROBLEM_BITS: Final = (*POWER_BITS, 0x8, *THERMAL_BITS)
"""Reasons that slow a busy GPU (``hw_slowdown``, 0x8, is heat or power); idle, application clocks, sync boost
and display clocks are not problems."""

_STATS = f"""
SELECT device, count(*) FILTER (WHERE name = '{A.GPU_UTIL_PCT}'),
    avg(value) FILTER (WHERE name = '{A.GPU_UTIL_PCT}'), min(value) FILTER (WHERE name = '{A.GPU_UTIL_PCT}'),
    max(value) FILTER (WHERE name = '{A.GPU_UTIL_PCT}'), avg(value) FILTER (WHERE name = '{A.GPU_MEM_UTIL_PCT}'),
    max(value) FILTER (WHERE name = '{A.GPU_MEM_USED_BYTES}'), avg(value) FILTER (WHERE name = '{A.GPU_POWER_W}'),
    max(value) FILTER (WHERE name = '{A.GPU_POWER_W}'), min(value) FILTER (WHERE name = '{A.GPU_SM_CLOCK_MHZ}'),
    max(value) FILTER (WHERE name = '{A.GPU_SM_CLOCK_MHZ}'), max(value) FILTER (WHERE name = '{A.GPU_TEMP_C}'),
    count(*) FILTER (WHERE name = '{A.GPU_THROTTLE_REASONS}'),
    list(CAST(value AS BIGINT)) FILTER (WHERE name = '{A.GPU_THROTTLE_REASONS}')
FROM counters WHERE run_id = $run AND starts_with(device, 'cuda') AND starts_with(name, 'gpu.')
    AND ts_ns > $r0 AND ts_ns <= $r1
GROUP BY device
"""

_DEVICES = """
SELECT DISTINCT device FROM counters WHERE run_id = $run AND starts_with(device, 'cuda') AND starts_with(name, 'gpu.')
"""

COLUMNS = [
    Column("device"),
    Column("samples", "count"),
    Column("utilisation", "pct", "mean share of time a kernel ran (NVML's sample period)"),
    Column("utilisation min", "pct"),
    Column("utilisation max", "pct"),
    Column("memory busy", "pct", "mean share of time device memory was read or written"),
    Column("memory used peak", "bytes", "device memory in use, all processes"),
    Column("power mean (W)", ""),
    Column("power max (W)", ""),
    Column("SM clock min (MHz)", ""),
    Column("SM clock max (MHz)", ""),
    Column("SM clock min vs max", "pct", "lowest SM clock as a share of the highest seen"),
    Column("temperature max (C)", ""),
    Column("throttled", "pct", "samples with a slowing reason set: power cap, thermal or hardware slowdown"),
    Column("reasons", help="share of samples with each throttle reason set (gpu_idle included, not a problem)"),
]


def gpu_utilisation(store: Store, run_id: int) -> Result:
    """Per GPU over the measured steps: utilisation (%, mean, min, max), memory busy (%), peak memory used
    (bytes), power (W), SM clock range (MHz), peak temperature (C) and the share of samples with each throttle
    reason set (%).

    Notes: from NVML, sampled by the system level's sampler (utilisation is NVML's own average over its last
    sample period, about 1/6 s to 1 s depending on the GPU, so short idle gaps are smoothed out). Throttled
    counts the samples with a reason that slows a busy GPU: the software power cap, the hardware power brake,
    thermal slowdown (software or hardware) and hardware slowdown; ``gpu_idle`` (no work, clocks lowered on
    purpose), application clock settings, sync boost and display clocks are listed but not counted. The SM
    clock's lowest value against its highest shows how far the clocks fell. NVML sees the whole device: other
    processes' work counts too. A GPU sampled fewer than five times inside the measured steps shows only its
    sample count, and the result says what would give enough.
    """
    runs = system_runs(store, run_id)
    run = runs.counters
    if run is None:
        return runs.missing(ID, TITLE)
    where = region(store, run)
    devices = sorted((str(d) for (d,) in rows(store, _DEVICES, run.run_id)), key=_gpu_number)
    notes = f"{notes_of(gpu_utilisation)} {data_note(runs, run, 'counters')}"
    if not devices:
        reason = runs.config.get("nvml") or "no GPU samples in the run"
        return Result(ID, TITLE, COLUMNS, [], notes=f"No GPU telemetry: {reason}. {notes}", run_id=runs.run_id,
                      facts={"gpus": 0, "nvml": reason}, labels=[f"no GPU telemetry: {reason}"])  # fmt: skip
    stats = {str(r[0]): r for r in rows(store, _STATS, run.run_id, r0=where.start_ns, r1=where.end_ns)}
    gpu_ms = periods_ms(run.system)[2]
    sampled = [Sampling(d, int(stats[d][1]) if d in stats else 0, gpu_ms, GPU_PERIOD_MS) for d in devices]
    short = shortfall(where, sampled)
    found = [stats[s.who] for s in sampled if s.enough]
    table = [_row(stats[s.who]) if s.enough else (s.who, s.samples, *[None] * (len(COLUMNS) - 2)) for s in sampled]
    facts = _facts(run, where.kind, found, [_row(r) for r in found]) if found else {
        "source_run": run.run_id, "region": where.kind, "gpus": len(devices), "util_mean_pct": None,
        "throttled_pct": None, "thermal_pct": None, "power_pct": None}  # fmt: skip
    return Result(
        ID,
        TITLE,
        COLUMNS,
        table,
        notes=notes,
        run_id=runs.run_id,
        chart=Chart("hbar", x="device", y=("utilisation",), title="Mean GPU utilisation"),
        facts=facts | {"gpus": len(devices), "min_samples": MIN_SAMPLES, "too_few_samples": short},
        labels=([] if where.steps else ["no measured steps: the whole run"]) + ([short] if short else []),
    )


def _gpu_number(device: str) -> int:
    tail = device.partition(":")[2]
    return int(tail) if tail.isdigit() else 1 << 30


def _share(masks: list[int], bits: tuple[int, ...]) -> float | None:
    if not masks:
        return None
    either = sum(bits)
    return 100.0 * sum(1 for m in masks if m & either) / len(masks)


def _row(r: tuple[Any, ...]) -> tuple[Any, ...]:
    masks = [int(m) for m in r[13] or []]
    reasons = []
    for bit, name in A.GPU_THROTTLE_BITS.items():
        share = _share(masks, (bit,))
        if share:
            reasons.append(f"{name} {share:.0f}%")
    lo, hi = r[9], r[10]
    return (
        str(r[0]), int(r[1]), *(None if v is None else float(v) for v in r[2:6]), None if r[6] is None else int(r[6]),
        *(None if v is None else float(v) for v in r[7:11]), 100.0 * lo / hi if lo is not None and hi else None,
        None if r[11] is None else float(r[11]), _share(masks, PROBLEM_BITS), ", ".join(reasons) or "none",
    )  # fmt: skip


def _facts(run: RunFacts, kind: str, found: list[tuple[Any, ...]], table: list[tuple[Any, ...]]) -> dict[str, Any]:
    masks = {str(r[0]): [int(m) for m in r[13] or []] for r in found}
    thermal = {d: _share(m, THERMAL_BITS) for d, m in masks.items()}
    power = {d: _share(m, POWER_BITS) for d, m in masks.items()}
    worst = max(table, key=lambda r: r[13] or 0.0)
    utils = [r[2] for r in table if r[2] is not None]
    return {
        "source_run": run.run_id,
        "region": kind,
        "gpus": len(table),
        "util_mean_pct": sum(utils) / len(utils) if utils else None,
        "util_min_pct": min((r[3] for r in table if r[3] is not None), default=None),
        "throttled_pct": worst[13],
        "thermal_pct": max((v for v in thermal.values() if v is not None), default=None),
        "power_pct": max((v for v in power.values() if v is not None), default=None),
        "worst_gpu": worst[0],
        "worst_reasons": worst[14],
        "sm_clock_min_vs_max_pct": worst[11],
        "temp_max_c": max((r[12] for r in table if r[12] is not None), default=None),
    }


_BINNED = f"""
SELECT device, least((ts_ns - $t0) // $bw, $bins - 1) AS b,
    avg(value) FILTER (WHERE name = '{A.GPU_UTIL_PCT}'), avg(value) FILTER (WHERE name = '{A.GPU_SM_CLOCK_MHZ}')
FROM counters WHERE run_id = $run AND starts_with(device, 'cuda')
    AND name IN ('{A.GPU_UTIL_PCT}', '{A.GPU_SM_CLOCK_MHZ}') AND ts_ns >= $t0
GROUP BY ALL
"""


def gpu_over_time(store: Store, run_id: int, *, bins: int = BINS) -> Result:
    """Per GPU and time bin (``time`` in ns from the run's first event): mean utilisation (%) and SM clock
    (MHz), in ``bins`` equal bins over the sampled time.

    Notes: the means of NVML's samples in each bin, warm-up included. A clock that drops while utilisation
    stays high is throttling (``system.gpu`` says why); a clock that drops with utilisation is the GPU idling.
    At most eight GPUs are drawn.
    """
    if bins < 1:
        raise UsageError(f"{TIME_ID}: bins must be >= 1")
    runs = system_runs(store, run_id)
    run = runs.counters
    if run is None:
        return runs.missing(TIME_ID, TIME_TITLE)
    t0, t1 = rows(store, "SELECT min(ts_ns), max(ts_ns) FROM counters WHERE run_id = $run AND "
                  "starts_with(device, 'cuda') AND starts_with(name, 'gpu.')", run.run_id)[0]  # fmt: skip
    if t0 is None:
        reason = runs.config.get("nvml") or "no GPU samples in the run"
        return Result(TIME_ID, TIME_TITLE, [Column("time", "ns")], [], notes=f"No GPU telemetry: {reason}.",
                      run_id=runs.run_id, facts={"gpus": 0, "nvml": reason})  # fmt: skip
    width, bins = time_bins(int(t0), int(t1), bins, runs.config)
    found = rows(store, _BINNED, run.run_id, t0=int(t0), bw=width, bins=bins)
    base = region(store, run).base_ns
    return _wide(runs, run, found, bins, int(t0) - base, width)


def _wide(runs: SystemRuns, run: RunFacts, found: list[tuple[Any, ...]], bins: int, offset: int,
          width: int) -> Result:  # fmt: skip
    devices = sorted({str(r[0]) for r in found}, key=_gpu_number)[:MAX_GPUS]
    values = {(str(r[0]), int(r[1])): (r[2], r[3]) for r in found}
    columns = [bin_column(width)]
    for d in devices:
        columns += [Column(f"{d} utilisation", "pct"), Column(f"{d} SM clock (MHz)", "")]
    table = []
    for b in range(bins):
        cells: list[Any] = [offset + b * width]
        for d in devices:
            util, clock = values.get((d, b), (None, None))
            cells += [None if util is None else float(util), None if clock is None else float(clock)]
        table.append(tuple(cells))
    utils = tuple(f"{d} utilisation" for d in devices)
    clocks = [f"{d} SM clock (MHz)" for d in devices]
    return Result(
        TIME_ID,
        TIME_TITLE,
        columns,
        table,
        notes=f"{notes_of(gpu_over_time)} {data_note(runs, run, 'counters')}",
        run_id=runs.run_id,
        chart=Chart(
            "line",
            x="time",
            y=utils,
            title="GPU utilisation (%) and SM clock (MHz, right axis)",
            extra={"secondary_y": clocks},
        ),  # fmt: skip
        facts={"bins": bins, "bin_ns": width, "gpus": len(devices)},
        labels=[bin_label(width)],
    )
