"""The per-level overhead rows of a leveled merge, judged against the passes' own iteration noise, on synthetic
step durations."""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import pytest

from xstack.leveled._overhead import StepTimes, counter_overhead, noise_ns, overhead, unsteady
from xstack.report.terminal import overhead_adds, overhead_note

MS = 1_000_000


@dataclass
class _Pass:
    name: str
    run_id: int
    levels: list[str] = field(default_factory=list)


PASSES = [_Pass("model", 1, ["model"]), _Pass("model+layer", 2, ["model", "layer"])]


def test_percentiles_interpolate_as_duckdb_quantile_cont() -> None:
    durations = [7 * MS, 1 * MS, 30 * MS, 2 * MS, 2 * MS, 11 * MS, 5 * MS]
    times = StepTimes.of(durations)
    want = duckdb.sql(
        "SELECT quantile_cont(d, 0.5), quantile_cont(d, 0.05), quantile_cont(d, 0.95) FROM "
        f"(SELECT unnest({durations}) AS d)"
    ).fetchall()[0]
    assert (times.median_ns, times.p5_ns, times.p95_ns) == pytest.approx(want)
    assert times.n == 7


def test_a_negative_difference_between_noisy_input_bound_passes_is_within_noise() -> None:
    # every other step waits for its batch: the medians sit between the two modes and move with them
    rows = overhead(PASSES, {1: [2 * MS, 8 * MS] * 10, 2: [1 * MS, 6 * MS] * 10})
    assert rows[0]["added_ns"] is None and rows[0]["within_noise"] is None and overhead_note(rows[0]) == ""
    row = rows[1]
    assert row["step_median_ns"] == 3_500_000 and row["step_p5_ns"] == 1 * MS and row["step_p95_ns"] == 6 * MS
    assert row["added_ns"] == -1_500_000 and row["added_pct"] == pytest.approx(-30.0)
    assert row["noise_ns"] == 3 * MS + 2_500_000 and row["noise_pct"] == pytest.approx(110.0)
    assert row["within_noise"] is True
    assert overhead_note(row) == "within noise (±110.0%)"


def test_a_level_that_costs_more_than_the_spread_is_beyond_noise() -> None:
    steady = [10 * MS + i * 10_000 for i in range(20)]  # 10.0 .. 10.19 ms
    slower = [d + 3 * MS for d in steady]
    row = overhead(PASSES, {1: steady, 2: slower})[1]
    assert row["added_ns"] == 3 * MS and row["within_noise"] is False
    assert overhead_note(row).startswith("beyond noise (±1.")
    faster = overhead(PASSES, {1: slower, 2: steady})[1]
    assert faster["added_ns"] == -3 * MS and faster["within_noise"] is False
    assert overhead_note(faster).startswith("negative beyond noise (±")
    assert overhead_note(faster).endswith("the passes ran under different conditions")


def test_a_few_descheduled_steps_do_not_hide_a_level_cost() -> None:
    # slow outliers inflate p95, not the low side the rule reads
    before = [10 * MS] * 18 + [60 * MS, 80 * MS]
    after = [12 * MS] * 18 + [70 * MS, 90 * MS]
    assert noise_ns(StepTimes.of(before), StepTimes.of(after)) == 0
    assert overhead(PASSES, {1: before, 2: after})[1]["within_noise"] is False


def test_passes_with_under_three_steps_are_not_judged() -> None:
    row = overhead(PASSES, {1: [2 * MS, 8 * MS], 2: [1 * MS, 6 * MS, 3 * MS]})[1]
    assert row["added_ns"] == -2 * MS and row["noise_ns"] is None and row["within_noise"] is None
    assert overhead_note(row) == "not judged: under 3 measured steps in a pass"
    assert overhead_note({"pass": "model+layer", "added_ns": 5}) == ""  # a row stored before the judgement


def test_a_counter_pass_is_judged_against_the_timing_pass_of_its_other_levels() -> None:
    io, syscalls = _Pass("model+io", 3, ["model", "io"]), _Pass("model+layer+system", 4, ["model", "layer", "system"])
    steady = [10 * MS, 10 * MS, 10 * MS, 10 * MS, 11 * MS]
    durations = {1: steady, 2: [12 * MS] * 5, 3: [11 * MS] * 5, 4: [30 * MS] * 5}
    rows = counter_overhead([(io, PASSES[0]), (syscalls, PASSES[1])], durations)
    assert [(r["pass"], r["levels_added"], r["against"], r["added_ns"]) for r in rows] == [
        ("model+io", ["io"], "model", 1 * MS), ("model+layer+system", ["system"], "model+layer", 18 * MS),
    ]  # fmt: skip
    assert rows[0]["added_pct"] == pytest.approx(10.0) and rows[0]["within_noise"] is False
    assert overhead_adds(rows[0]) == "io (against model)"
    # a counter pass with no measured step has no row
    assert counter_overhead([(io, PASSES[0])], {1: steady, 3: []}) == []


def test_a_pass_most_of_whose_steps_ran_slowed_is_unsteady() -> None:
    steady = [2 * MS + i * 20_000 for i in range(20)]  # 2.0 .. 2.38 ms
    layered = [d + 3 * MS for d in steady]  # the layer level's cost moves every step alike
    assert unsteady(overhead(PASSES, {1: steady, 2: layered})) == ("pass_unsteady", 0, "")
    # a busy machine during most of the layer pass: 15 of its 20 steps 30 to 170 times its fastest
    busy = layered[:5] + [(150 + 50 * (i % 7)) * MS for i in range(15)]
    check, count, detail = unsteady(overhead(PASSES, {1: steady, 2: busy}))
    assert (check, count) == ("pass_unsteady", 1)
    assert detail.startswith("pass model+layer's median step (225 ms) is 44.8x ")
    assert "its fastest steps' (5.02 ms, the 5th percentile), and the merge times the layer level" in detail
    assert "; against 1.08x in pass model: most of its steps ran slowed" in detail and detail.endswith(
        "profile again on a quiet machine"
    )
    # steps that differ by themselves (inputs of varying size) do so in every pass: not unsteady
    varied = [(2 + 6 * (i % 2)) * MS for i in range(20)]
    assert unsteady(overhead(PASSES, {1: varied, 2: [d + 3 * MS for d in varied]}))[1] == 0
    assert unsteady(overhead(PASSES, {1: steady[:2], 2: busy}))[1] == 0  # too few steps to compare with


def test_a_pass_slowed_for_a_stretch_of_its_steps_is_unsteady_by_its_slowest_quarter() -> None:
    """The op pass of a CNN ran 10 of its 20 steps about 3.5 times slower than the others (the system backing
    the memory of fresh allocations more slowly there): its median stayed between the two, under twice the
    steadiest pass's ratio, and nothing said that the op timings came from slowed steps."""
    from xstack.analyze._diff_read import _uneven_passes

    steady = [22 * MS + i * 400_000 for i in range(20)]  # 22 .. 29.6 ms
    ops = [40 * MS + i * 400_000 for i in range(10)] + [(135 + i) * MS for i in range(10)]
    rows = overhead(PASSES, {1: steady, 2: ops})
    assert rows[1]["step_median_ns"] / rows[1]["step_p5_ns"] < 2 * rows[0]["step_median_ns"] / rows[0]["step_p5_ns"]
    check, count, detail = unsteady(rows)
    assert (check, count) == ("pass_unsteady", 1) and (rows[1]["unsteady"], rows[1]["unsteady_by"]) == (True, "p75")
    assert detail.startswith("pass model+layer's slowest quarter of steps (from ")
    assert "; against 1.24x in pass model: a quarter or more of its steps ran slowed" in detail
    assert (
        _uneven_passes(rows)
        == "pass model+layer's slowest quarter of steps was 3.4x its fastest steps' (pass_unsteady)"
    )
    # a stretch as long in every pass (a validation every 2nd step) is the program's own
    alike = [d + (100 * MS if i % 2 else 0) for i, d in enumerate(steady)]
    assert unsteady(overhead(PASSES, {1: alike, 2: [d + 3 * MS for d in alike]}))[1] == 0
