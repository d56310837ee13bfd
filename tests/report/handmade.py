"""A hand-made analysis with every chart kind, a missing result, labels, facts and hostile names everywhere."""

from __future__ import annotations

from xstack.analyze.pipeline import Analysis, Recommendation
from xstack.analyze.result import Chart, Column, Result
from xstack.analyze.summary import RunSummary, TopRow

HOSTILE = "<script>alert(1)</script></script><img src=x onerror=alert(2)>&amp;\"q\"'s'|*_[x]"
"""Markup, an entity, quotes and markdown characters: must be shown as this exact text and never run."""


def summary(name: str = "handmade " + HOSTILE) -> RunSummary:
    return RunSummary(
        run_id=7,
        name=name,
        started_at=None,
        framework="pytorch",
        device="cuda:0",
        levels=["model", "layer", "kernel"],
        pass_name="merged",
        source="/data/" + HOSTILE + ".json",
        status="complete",
        wall_ns=4_500_000,
        span_counts={"model": 1, "layer": 3, "kernel": 3},
        counter_samples=0,
        devices=[{"id": 0, "name": "GPU " + HOSTILE}],
        distributed=None,
        top={"kernel": [TopRow(HOSTILE, 3, 3000, 1000.0, 100.0)], "layer": [], "op": []},
        health=[("orphans " + HOSTILE, 2, "detail " + HOSTILE)],
        overhead=[
            {
                "pass": "model",
                "levels_added": ["model"],
                "iterations": 20,
                "step_median_ns": 4_000_000,
                "added_ns": None,
                "added_pct": None,
            },
            {
                "pass": "model+layer",
                "levels_added": ["layer"],
                "iterations": 20,
                "step_median_ns": 4_400_000,
                "added_ns": 400_000,
                "added_pct": 10.0,
            },
        ],  # fmt: skip
        noisy_spans={"layer": (1, 3)},
    )


def results() -> list[Result]:
    named = [Column("name"), Column("total", "ns"), Column("share", "pct")]
    rows = [(HOSTILE, 3000, 60.0), ("void k<float>()", 2000, 40.0)]
    xy = [Column("kernel"), Column("AI", "flop/byte"), Column("FLOP/s", "flop/s"), Column("bound")]
    points = [(HOSTILE, 2.0, 1e12, "memory"), ("b", 300.0, 5e13, "compute")]
    return [
        Result("H.bar", "Bars " + HOSTILE, named, rows, notes="notes " + HOSTILE, labels=["label " + HOSTILE],
               facts={"total_ns": 5000, "busy_pct": 42.5, "top": HOSTILE, "nested": {"a": 1}},
               chart=Chart("bar", "name", ("total",), title="chart " + HOSTILE)),
        Result("H.hbar", "Horizontal", named, rows, chart=Chart("hbar", "name", ("total",))),
        Result("H.stacked", "Stacked", named, rows, chart=Chart("stacked", "name", ("total", "share"))),
        Result("H.scatter", "Scatter", xy, points, chart=Chart("scatter", "AI", ("FLOP/s",), series="bound")),
        Result("H.roofline", "Roofline", xy, points,
               chart=Chart("roofline", "AI", ("FLOP/s",), extra={"peak_flops_per_s": {"fp32": 6e13},
                                                                 "peak_dram_bytes_per_s": 3e12})),
        Result("H.line", "Line", [Column("t", "ns"), Column("bytes", "bytes")], [(i, i * 10) for i in range(5)],
               chart=Chart("line", "t", ("bytes",))),
        Result("H.box", "Box", [Column("path"), Column("median", "ns"), Column("p5", "ns"), Column("p95", "ns")],
               [(HOSTILE, 100, 90, 120)], chart=Chart("box", "path", ("median",), extra={"low": "p5", "high": "p95"})),
        Result("H.table", "Table only", [Column("path"), Column("shape")], [(HOSTILE, (1, 2)), ("x", None)]),
        Result("H.missing", "Missing " + HOSTILE, missing=["metrics", HOSTILE], hint="run with " + HOSTILE),
        Result("H.empty", "Empty", named, []),
    ]  # fmt: skip


def analysis() -> Analysis:
    rec = Recommendation(
        rule="rule_" + HOSTILE,
        title="Title " + HOSTILE,
        severity="high",
        evidence=["evidence " + HOSTILE + " (H.bar)"],
        sources=["H.bar", HOSTILE],
        action="action " + HOSTILE,
        impact_ns=1_200_000,
    )
    return Analysis(summary(), results(), [rec])
