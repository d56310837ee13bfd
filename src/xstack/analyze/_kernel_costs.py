"""Per-kernel and per-op costs (FLOPs, DRAM bytes, occupancy) shared by the kernel analyses A8-A15.

Hardware counters (``metrics.*`` attrs on kernel spans) win where present. Otherwise each op with an analytic
formula (``_costs``) gets its FLOPs and bytes, and those are split over the kernels it launched (directly or
through nested ops) in proportion to their durations: labelled "analytic" wherever shown. A kernel whose op
has no formula has unknown cost (NULL), never zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from xstack.analyze._costs import op_cost
from xstack.analyze.context import RunContext, launched
from xstack.trace import attrs as A
from xstack.trace.devices import gpus, run_device

HARDWARE_FLOPS = (A.METRICS_FLOPS_FP64, A.METRICS_FLOPS_FP32, A.METRICS_FLOPS_FP16, A.METRICS_FLOPS_TENSOR)
"""The hardware FLOP counts a kernel's FLOPs add up: SASS add + mul + 2 * fma per precision, and tensor-core ops."""
ANALYTIC_LABEL = "FLOPs and bytes: analytic (per-op count from shapes, split over the op's kernels by time)"
ESTIMATED_OCCUPANCY_LABEL = "occupancy: theoretical, estimated by the profiler from the launch configuration"


def _num(key: str, alias: str = "s") -> str:
    return f"({alias}.attrs->>'$.\"{key}\"')::DOUBLE"


def hardware_label(ctx: RunContext, table: str) -> str:
    """Which hardware FLOP counts the kernels of ``table`` had (XSP counted FP32 only; say what is counted)."""
    present = [
        key.removeprefix("metrics.flops_")
        for key in HARDWARE_FLOPS
        if ctx.store.query(
            f"SELECT count(*) FROM spans s JOIN {table} k USING (span_id) "
            f"WHERE s.run_id = ? AND json_exists(s.attrs, '$.\"{key}\"')",
            [ctx.run_id],
        )[0][0]
    ]
    counted = ", ".join(present) or "none"
    return f"FLOPs: hardware counters ({counted}; add + mul + 2 x fma per precision, tensor-core ops as counted)"


def op_costs(ctx: RunContext) -> str:
    """Temp table ``(span_id, layer_id, flops, read_bytes, write_bytes, precision)`` of every costed op."""
    name = f"_ax_opcost_{ctx.run_id}"
    if name in ctx._tables:
        return name
    owners = ctx.owners()
    con = ctx.store.con
    sigs = con.execute(
        f"""SELECT s.name, s.attrs->>'$."{A.OP_SHAPES}"', s.attrs->>'$."{A.OP_DTYPES}"',
                   s.attrs->>'$."{A.OP_CONCRETE_INPUTS}"', s.attrs->>'$."{A.OP_FLOPS}"'
            FROM spans s JOIN {owners} o ON o.span_id = s.span_id AND o.cost_op_id = s.span_id
            WHERE s.run_id = ? GROUP BY ALL""",
        [ctx.run_id],
    ).fetchall()
    costed = []
    for sig in sigs:
        cost = op_cost(sig[0], *(orjson.loads(v) if v else None for v in sig[1:]))
        if cost is not None:
            costed.append((*sig, cost.flops, cost.read_bytes, cost.write_bytes, cost.precision))
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE {name}_sig (name VARCHAR, shapes VARCHAR, dtypes VARCHAR,
            concrete VARCHAR, pflops VARCHAR, flops DOUBLE, read_bytes DOUBLE, write_bytes DOUBLE, precision VARCHAR)"""
    )
    if costed:
        con.executemany(f"INSERT INTO {name}_sig VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", costed)
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE {name} AS
            SELECT s.span_id, o.layer_id, g.flops, g.read_bytes, g.write_bytes, g.precision
            FROM spans s JOIN {owners} o ON o.span_id = s.span_id AND o.cost_op_id = s.span_id
            JOIN {name}_sig g ON g.name = s.name
                AND g.shapes IS NOT DISTINCT FROM s.attrs->>'$."{A.OP_SHAPES}"'
                AND g.dtypes IS NOT DISTINCT FROM s.attrs->>'$."{A.OP_DTYPES}"'
                AND g.concrete IS NOT DISTINCT FROM s.attrs->>'$."{A.OP_CONCRETE_INPUTS}"'
                AND g.pflops IS NOT DISTINCT FROM s.attrs->>'$."{A.OP_FLOPS}"'
            WHERE s.run_id = ?""",
        [ctx.run_id],
    )
    ctx._tables[name] = name
    return name


def kernel_costs(ctx: RunContext) -> str:
    """Temp table of kernels: ``(span_id, name, start_ns, dur_ns, device, layer_id, flops, dram_read, dram_write,
    occupancy, cost_source, occupancy_source, precision, launch_ns, counted)``; the cost columns NULL where
    unknown. ``launch_ns`` is the start of the runtime call that launched the kernel (its own start where none is
    known, ``context.launched``), ``counted`` whether per-iteration statistics count it (``RunContext.counted``:
    launched in a measured step, in a run with them). Without kernel spans the rows are the run's counter ranges
    (``metrics`` spans), timed by ``metrics.duration_ns`` (NULL where the counters did not measure it), all
    counted: their profiler lays them out over the session, not at their kernels' times."""
    name = f"_ax_kcost_{ctx.run_id}"
    if name in ctx._tables:
        return name
    owners, ops = ctx.owners(), op_costs(ctx)
    level = "kernel" if "kernel" in ctx.levels else "metrics"
    # a counter range is timed by the duration its profiler measured, where it has one (Kineto lays the CUPTI
    # range profiler's ranges out evenly over the session: their span times are not the kernels')
    dur = "s.dur_ns" if level == "kernel" else f"({_num(A.METRICS_DURATION_NS)})::BIGINT"
    hw_flops = " + ".join(f"coalesce({_num(k)}, 0)" for k in HARDWARE_FLOPS)
    join, counted = ctx.counted("k.launch_ns") if level == "kernel" else ("", "TRUE")
    has_hw = " OR ".join(
        f"json_exists(s.attrs, '$.\"{k}\"')" for k in (A.METRICS_FLOPS_FP32, A.METRICS_DRAM_BYTES_READ)
    )
    ctx.store.con.execute(
        f"""CREATE OR REPLACE TEMP TABLE {name} AS
        WITH k AS (
            SELECT s.span_id, s.name, s.start_ns, {dur} AS dur_ns, s.device, o.layer_id, o.cost_op_id, s.launch_ns,
                   CASE WHEN {has_hw} THEN {hw_flops} END AS hw_flops,
                   {_num(A.METRICS_DRAM_BYTES_READ)} AS hw_read, {_num(A.METRICS_DRAM_BYTES_WRITE)} AS hw_write,
                   {_num(A.METRICS_ACHIEVED_OCCUPANCY_PCT)} AS hw_occ,
                   nullif({_num(A.KERNEL_EST_OCCUPANCY_PCT)}, 0) AS est_occ,
                   {dur} / nullif(sum({dur}) OVER (PARTITION BY o.cost_op_id), 0) AS share
            FROM {launched(level)} s LEFT JOIN {owners} o ON o.span_id = s.span_id
        )
        SELECT k.span_id, k.name, k.start_ns, k.dur_ns, k.device, k.layer_id,
               coalesce(k.hw_flops, c.flops * k.share) AS flops,
               coalesce(k.hw_read, c.read_bytes * k.share) AS dram_read,
               coalesce(k.hw_write, c.write_bytes * k.share) AS dram_write,
               coalesce(k.hw_occ, k.est_occ) AS occupancy,
               CASE WHEN k.hw_flops IS NOT NULL OR k.hw_read IS NOT NULL THEN 'hardware'
                    WHEN c.span_id IS NOT NULL THEN 'analytic' END AS cost_source,
               CASE WHEN k.hw_occ IS NOT NULL THEN 'achieved' WHEN k.est_occ IS NOT NULL THEN 'estimated' END
                   AS occupancy_source,
               c.precision, k.launch_ns, {counted} AS counted
        FROM k LEFT JOIN {ops} c ON c.span_id = k.cost_op_id {join}""",
        {"run": ctx.run_id},
    )
    ctx._tables[name] = name
    return name


GAP_EFFECTS = {
    "kernel durations": "latency and FLOP/s unknown",
    "FLOPs": "AI and FLOP/s unknown",
    "DRAM bytes": "AI and bound unknown",
}
"""Inputs a kernel table can lack altogether, and the columns each leaves empty (``context.HINTS`` says how to
get each)."""


def cost_gaps(ctx: RunContext, table: str) -> list[str]:
    """What none of the kernels of ``table`` has (``kernel durations``, ``FLOPs``, ``DRAM bytes``): the inputs
    whose absence leaves columns empty, named so that a result can say how to get them."""
    n, timed, flops, nbytes = ctx.store.query(
        f"SELECT count(*), count(dur_ns), count(flops), count(dram_read + dram_write) FROM {table}"
    )[0]
    if not n:
        return []
    return [gap for gap, have in zip(GAP_EFFECTS, (timed, flops, nbytes), strict=True) if not have]


ABOVE_PEAK = "above peak"
"""The bound of a row whose achieved FLOP/s exceeds the peak of its precision: a point above the roof, which says
that the peak or the FLOP count is wrong (``_peak_checks.above_peak_labels`` names the rows and why)."""


@dataclass(frozen=True)
class Peaks:
    """Device peaks: FLOP/s per precision and DRAM bandwidth (bytes/s), and where they came from."""

    flops_per_s: dict[str, float]
    dram_bytes_per_s: float
    source: str
    threads: int | None = None
    """The intra-op threads a CPU's measured GEMM peaks ran on (``config.peaks.details.threads``); None for a
    GPU's peaks, those read off the device, and calibrations that did not record it."""

    def flops_for(self, precision: str | None) -> float | None:
        """Peak FLOP/s for a precision (``fp32`` when unknown), or the highest known when it has none."""
        if precision and precision in self.flops_per_s:
            return self.flops_per_s[precision]
        return self.flops_per_s.get("fp32") or max(self.flops_per_s.values(), default=None)

    def ridge(self, precision: str | None = None) -> float | None:
        """Arithmetic intensity (FLOP/byte) where the roofline turns from memory- to compute-bound."""
        peak = self.flops_for(precision)
        return peak / self.dram_bytes_per_s if peak and self.dram_bytes_per_s else None


def peaks(ctx: RunContext) -> Peaks | None:
    """The run's device peaks from ``config.peaks`` (measured by calibration or read off the device), if any and
    if they are of the GPU its kernels ran on (``peaks_mismatch``)."""
    p: Any = ctx.config.get("peaks")
    if not isinstance(p, dict):
        return None
    flops = {str(k): float(v) for k, v in (p.get("flops_per_s") or {}).items() if isinstance(v, (int, float)) and v}
    bw = p.get("dram_bytes_per_s")
    if not flops or not isinstance(bw, (int, float)) or bw <= 0 or peaks_mismatch(ctx):
        return None
    return Peaks(flops, float(bw), str(p.get("source") or "unknown"), _threads(p.get("details")))


def _threads(details: Any) -> int | None:
    """The intra-op threads in ``config.peaks.details``: its own (measured peaks alone) or its measured part's
    (measured and derived peaks combined)."""
    if not isinstance(details, dict):
        return None
    for d in (details, details.get("measured")):
        if isinstance(d, dict) and isinstance(d.get("threads"), int) and d["threads"] > 0:
            return int(d["threads"])
    return None


def peaks_mismatch(ctx: RunContext) -> str | None:
    """Why ``config.peaks`` cannot place the run's kernels, or None: they name another GPU than the one the
    kernels ran on (a store imported when a trace's device was the first GPU of its host), or the kernels ran on
    GPUs of different models, which one set of peaks cannot all fit."""
    if "peaks_mismatch" not in ctx._tables:
        ctx._tables["peaks_mismatch"] = _peaks_mismatch(ctx) or ""
    return ctx._tables["peaks_mismatch"] or None


def _peaks_mismatch(ctx: RunContext) -> str | None:
    p: Any = ctx.config.get("peaks")
    if not isinstance(p, dict):
        return None
    device = run_device(ctx.store.con, ctx.run_id)
    used = gpus(device)
    if len(used) > 1 and len({name for _, name in used}) > 1:
        return f"the kernels ran on GPUs of different models ({device}) and config.peaks holds one set of peaks"
    named = str(p.get("device") or "")
    if used and used[0][1] and named and named != used[0][1]:
        return f"config.peaks are of {named}, but the kernels ran on {device}"
    return None


def missing_peaks(ctx: RunContext) -> str:
    """Why the bound of the run's kernels is unknown, and how to get their device's peaks."""
    why = peaks_mismatch(ctx) or "no device peaks"
    return f"bound unknown: {why}; {ctx.hint('device peaks')}"


def bound(
    ai: float | None, pk: Peaks | None, precision: str | None = None, achieved: float | None = None
) -> str | None:
    """``memory`` or ``compute`` against the ridge point; ``above peak`` (``ABOVE_PEAK``) where the ``achieved``
    FLOP/s exceed the peak of the precision, which no work can; None when intensity or peaks are unknown."""
    peak = pk.flops_for(precision) if pk else None
    if achieved is not None and peak and achieved > peak:
        return ABOVE_PEAK
    ridge = pk.ridge(precision) if pk else None
    if ai is None or ridge is None:
        return None
    return "memory" if ai < ridge else "compute"


def intensity(flops: float | None, read: float | None, write: float | None) -> float | None:
    """Arithmetic intensity in FLOP/byte: FLOPs over DRAM bytes read plus written."""
    if flops is None or read is None or write is None or read + write <= 0:
        return None
    return flops / (read + write)


def rate(amount: float | None, dur_ns: float | None) -> float | None:
    """Amount per second from an amount over ``dur_ns`` nanoseconds."""
    if amount is None or not dur_ns:
        return None
    return amount * 1e9 / dur_ns
