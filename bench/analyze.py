"""Time to run every analysis and write the report for a large profile (target: under 10 s for ~10^6 spans).

The profile is synthetic but shaped like a GPU training run imported from a trace, written straight into a
store with SQL (no importer in the timed part): ``--steps`` iterations, each a ``step`` model span and a
DataLoader wait, a root layer holding ``--layers`` leaf layers (Linear, LayerNorm, GELU in turn, with
shapes), each calling ``--ops`` ops (aten::linear, aten::layer_norm, aten::gelu, with recorded shapes and
dtypes), each op one ``cudaLaunchKernel`` runtime call and one kernel on ``cuda:0`` (30 kernel names, grid,
block, estimated occupancy), plus per step a host-to-device copy, a ``cudaStreamSynchronize`` and an
allocated-memory counter sample per layer. Defaults give 1,000 steps x 1,003 spans = ~10^6 spans, of which
300,000 kernels.

Timed, in one process, each phase after a fresh open of the store (so no cache carries over):
``analyze`` (every registered analysis and the recommendation rules), ``html`` (``xstack report`` HTML,
Perfetto trace included or written beside it), ``md``, ``json`` and ``csv``. ``total`` is analyze + html.

    python bench/analyze.py                    # ~10^6 spans; prints a table, --json FILE to keep it
    python bench/analyze.py --quick            # a smoke run (2,000 spans)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from xstack.trace.store import RunInfo, Store

TYPES = ("Linear", "LayerNorm", "GELU")
OPS = ("aten::linear", "aten::layer_norm", "aten::gelu")
SHAPES = ("[[32, 128, 1024], [1024, 1024], [1024]]", "[[32, 128, 1024], [1024], [1024], [1024]]", "[[32, 128, 1024]]")


def build(path: Path, steps: int, layers: int, ops: int) -> int:
    """Write the synthetic profile; returns its span count."""
    per_step = 3 + layers * (1 + 3 * ops)
    with Store.create(path, overwrite=True) as store:
        store.add_run(RunInfo(1, "synthetic", framework="pytorch", device="cuda:0",
                              levels=["model", "layer", "op", "runtime", "kernel"],
                              config={"devices": [{"id": 0, "name": "synthetic GPU", "numSms": 132}]}))  # fmt: skip
        con = store.con
        step_ns, layer_ns, op_ns = 10_000 * layers, 10_000, 10_000 // ops
        # ids: step s -> base s * per_step; 0 step span, 1 dataloader, 2 root layer, then per layer blocks
        con.execute(
            f"""INSERT INTO _spans
            SELECT 1, s * {per_step}, NULL, 'model', 'step', s * {step_ns + 50_000} + 40_000, {step_ns}, 1, 1, 'cpu',
                   NULL, NULL, '{{"model.kind": "step"}}' FROM range({steps}) t(s)
            UNION ALL
            SELECT 1, s * {per_step} + 1, NULL, 'model', 'enumerate(DataLoader)#_next', s * {step_ns + 50_000},
                   30_000, 1, 1, 'cpu', NULL, NULL, '{{"model.kind": "dataloader"}}' FROM range({steps}) t(s)
            UNION ALL
            SELECT 1, s * {per_step} + 2, s * {per_step}, 'layer', 'model', s * {step_ns + 50_000} + 40_000,
                   {step_ns}, 1, 1, 'cpu', NULL, NULL, '{{"layer.path": "model", "layer.type": "Net"}}'
            FROM range({steps}) t(s)"""
        )
        layer_base = f"s * {per_step} + 3 + l * {1 + 3 * ops}"
        layer_start = f"s * {step_ns + 50_000} + 40_000 + l * {layer_ns}"
        con.execute(
            f"""INSERT INTO _spans
            SELECT 1, {layer_base}, s * {per_step} + 2, 'layer', 'blocks.' || l, {layer_start}, {layer_ns - 100},
                   1, 1, 'cpu', NULL, NULL,
                   json_object('layer.path', 'model.blocks.' || l,
                               'layer.type', ['Linear', 'LayerNorm', 'GELU'][l % 3 + 1])
            FROM range({steps}) t(s), range({layers}) u(l)"""
        )
        for j, (name, shapes) in enumerate(zip(OPS, SHAPES, strict=True)):
            _ops(con, j, name, shapes, steps, layers, ops, per_step, layer_base, layer_start, op_ns)
        con.execute(
            f"""INSERT INTO _counters SELECT 1, 'memory.allocated_bytes', {layer_start}, 1e9 + (l % 7) * 1e7, 1,
                'cuda:0' FROM range({steps}) t(s), range({layers}) u(l)"""
        )
        n = int(con.execute("SELECT count(*) FROM _spans").fetchone()[0])  # type: ignore[index]
    return n


def _ops(con: Any, j: int, name: str, shapes: str, steps: int, layers: int, ops: int, per_step: int,
         layer_base: str, layer_start: str, op_ns: int) -> None:  # fmt: skip
    """Ops of kind ``j`` (layer l calls op kind l % 3 for each of its ``ops`` calls), with launch and kernel."""
    op_id = f"{layer_base} + 1 + o * 3"
    start = f"{layer_start} + o * {op_ns}"
    dtypes = '["float", "float", "float", "float"]'
    kernel = f"'void kernel_' || ((l * {ops} + o) % 30) || '<float, 128>(float const*, float*)'"
    con.execute(
        f"""INSERT INTO _spans
        SELECT 1, {op_id}, {layer_base}, 'op', '{name}', {start}, {op_ns - 200}, 1, 1, 'cpu', NULL, NULL,
               json_object('op.shapes', '{shapes}'::JSON, 'op.dtypes', '{dtypes}'::JSON)
        FROM range({steps}) t(s), range({layers}) u(l), range({ops}) v(o) WHERE l % 3 = {j}
        UNION ALL
        SELECT 1, {op_id} + 1, {op_id}, 'runtime', 'cudaLaunchKernel', {start} + 100, 2_000, 1, 1, 'cpu', NULL,
               {op_id}, NULL
        FROM range({steps}) t(s), range({layers}) u(l), range({ops}) v(o) WHERE l % 3 = {j}
        UNION ALL
        SELECT 1, {op_id} + 2, {op_id} + 1, 'kernel', {kernel}, {start} + 5_000,
               1_000 + (o * 997 + l * 13) % 4_000,
               1, 7, 'cuda:0', 7, {op_id},
               json_object('kernel.grid', [128, 1, 1], 'kernel.block', [256, 1, 1], 'kernel.est_occupancy_pct', 50)
        FROM range({steps}) t(s), range({layers}) u(l), range({ops}) v(o) WHERE l % 3 = {j}"""
    )


def timed(label: str, fn: Any, results: dict[str, float]) -> Any:
    t0 = time.perf_counter()
    out = fn()
    results[label] = time.perf_counter() - t0
    return out


def run(store_path: Path, out_dir: Path) -> dict[str, float]:
    """Time every phase; each opens the store afresh."""
    from xstack.analyze.pipeline import analyze
    from xstack.report.formats import write_format
    from xstack.report.html import write_report

    times: dict[str, float] = {}
    with Store.open(store_path) as store:
        analysis = timed("analyze", lambda: analyze(store), times)
        timed("html", lambda: write_report(analysis, out_dir / "report.html", store=store), times)
    for fmt in ("md", "json", "csv"):
        with Store.open(store_path) as store:
            timed(fmt, lambda fmt=fmt: write_format(analyze(store), out_dir / f"report.{fmt}", fmt), times)  # type: ignore[misc]
    times["total"] = times["analyze"] + times["html"]
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--layers", type=int, default=100)
    p.add_argument("--ops", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="2 steps x 100 layers: a smoke run")
    p.add_argument("--json", type=Path, help="write the figures to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.steps = 2
    with tempfile.TemporaryDirectory(prefix="xstack-bench-") as tmp:
        store_path = Path(tmp) / "big.duckdb"
        t0 = time.perf_counter()
        spans = build(store_path, args.steps, args.layers, args.ops)
        build_s = time.perf_counter() - t0
        times = run(store_path, Path(tmp))
        sizes = {f.name: f.stat().st_size for f in Path(tmp).iterdir() if f.name.startswith("report")}
    machine = f"{platform.machine()} {platform.python_version()}"
    kernels = args.steps * args.layers * args.ops
    row = {"spans": spans, "kernels": kernels, "build_s": build_s, **times, "report_bytes": sizes, "target_s": 10.0,
           "machine": machine}  # fmt: skip
    print(f"{spans:,} spans ({row['kernels']:,} kernels), store built in {build_s:.1f} s")
    for k in ("analyze", "html", "total", "md", "json", "csv"):
        print(f"  {k:8s} {times[k]:6.2f} s")
    verdict = "PASS" if times["total"] < 10.0 else "FAIL"
    print(f"analyses + HTML report: {times['total']:.2f} s (target < 10 s): {verdict}")
    if args.json:
        args.json.write_text(json.dumps({"summary": [row]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
