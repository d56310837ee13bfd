"""``xstack diff`` of merged runs whose steps leave out work only some iterations run (a save every N steps):
no row compares it, so the summary says what each run left out."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import periodic_save
from xstack.analyze.diff import diff_profiles


def test_the_work_each_merged_step_leaves_out_is_said_of_both_runs(tmp_path: Path) -> None:
    a, b = periodic_save(tmp_path / "a.duckdb", 4), periodic_save(tmp_path / "b.duckdb", None)
    diff = diff_profiles(a, b)
    facts = diff.summary.facts
    assert facts["occasional_a_ns"] >= 2 * 3_000_000 / 8 and facts["occasional_b_ns"] == 0  # two saves over 8 steps
    [label] = [lb for lb in diff.summary.labels if lb.startswith("work that only some iterations run")]
    assert "; A: " in label and "every 4th iteration (2 of 8): model 'save' (" in label
    assert label.endswith("; B: none")
    assert not any(lb.startswith("work that only some") for lb in diff_profiles(b, b).summary.labels)


def _steps_store(path: Path, steps_ms: list[float]) -> Path:
    """A live run of the steps ``steps_ms`` (ms), the first a warm-up (config.warmup_steps = 1)."""
    from xstack.trace import attrs as A
    from xstack.trace.sink import Sink
    from xstack.trace.store import RunInfo, Store

    with Store.create(path) as store:
        store.add_run(RunInfo(1, "live", levels=["model"], config={A.CONFIG_WARMUP_STEPS: 1}))
        sink = Sink(store, 1)
        start = 0
        for k, ms in enumerate(steps_ms):
            dur = round(ms * 1e6)
            sink.span(1 + k, None, "model", f"step#{k}", start, dur, 1, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: k})
            start += dur
        sink.close()
    return path


def test_live_runs_compare_the_mean_of_their_steps_which_occasional_work_moves(tmp_path: Path) -> None:
    """Validation DataLoader workers kept across epochs took the iterations that hold the validation pass from
    91 ms to 38 ms, in 2 of 187: the median step did not move, and the diff said nothing of it. Live runs now
    compare the mean of their measured steps too, judged against the spread their median is judged against."""
    usual = [3.0 + 0.01 * (k % 7) for k in range(60)]  # 3.00 to 3.06 ms
    a = _steps_store(tmp_path / "a.duckdb", [50.0, *usual[:30], 90.0, *usual[30:], 91.0])
    b = _steps_store(tmp_path / "b.duckdb", [50.0, *usual[:30], 38.0, *usual[30:], 37.0])
    facts = diff_profiles(a, b).summary.facts
    assert facts["step_status"] == "unchanged" and facts["mean_step_status"] == "faster", facts
    assert abs(facts["mean_step_a_ns"] - (sum(usual) + 181.0) / 62 * 1e6) < 1e3  # the outliers counted
    # and what the two long iterations add per iteration beyond each run's median step, said of both runs
    assert abs(facts["long_a_ns"] - (90.0 + 91.0 - 2 * 3.03) / 62 * 1e6) < 1e4, facts
    assert abs(facts["long_b_ns"] - (38.0 + 37.0 - 2 * 3.03) / 62 * 1e6) < 1e4, facts
    [label] = [lb for lb in diff_profiles(a, b).summary.labels if lb.startswith("iterations far longer")]
    assert ": A: 32 and 63, 2 of 62, 2.82 ms per iteration beyond the median step (" in label, label
    assert "; B: 32 and 63, 2 of 62, 1.11 ms per iteration beyond the median step (" in label, label
    # the same steps on both sides: unchanged; a merged run has one step and no mean row
    same = diff_profiles(a, a).summary
    assert same.facts["mean_step_status"] == "unchanged"
    assert [r[0] for r in same.rows][:2] == ["step latency", "step mean (every measured step)"]
    merged = periodic_save(tmp_path / "m.duckdb", 4)
    assert "step mean (every measured step)" not in [r[0] for r in diff_profiles(merged, merged).summary.rows]
    even = _steps_store(tmp_path / "even.duckdb", [50.0, *usual])  # no long iteration on either side: no label
    assert not any(lb.startswith("iterations far longer") for lb in diff_profiles(even, even).summary.labels)
    assert diff_profiles(even, merged).summary.facts["long_b_ns"] is None  # a merged run: not looked for


def test_a_mean_step_whose_change_the_spread_of_alternating_steps_hides_is_judged_by_its_interval(
    tmp_path: Path,
) -> None:
    """A DataLoader whose steps alternate between a long wait for a batch and short ones spreads below its median by
    nearly all of it: its mean step went from 9.6 ms to 3.3 ms over 100 steps each, and the mean row said
    "unchanged" against that spread. The means' 95% intervals (1.96 standard errors each) tell it; two runs of the
    same alternating steps stay unchanged."""
    import random

    def alternating(seed: int) -> list[float]:
        jitter = random.Random(seed)
        return [(15.0 if k % 2 else 0.2) + jitter.uniform(0.0, 0.4) for k in range(100)]

    waits = _steps_store(tmp_path / "a.duckdb", [50.0, *alternating(1)])
    even = _steps_store(tmp_path / "b.duckdb", [50.0, *(3.3 + 0.01 * (k % 5) for k in range(100))])
    diff = diff_profiles(waits, even).summary
    row = next(r for r in diff.rows if r[0] == "step mean (every measured step)")
    assert row[7] > abs(row[5]), row  # the change is within the spread of the medians: the interval tells it
    assert diff.facts["mean_step_status"] == "faster", diff.facts
    again = _steps_store(tmp_path / "again.duckdb", [50.0, *alternating(2)])
    assert diff_profiles(waits, again).summary.facts["mean_step_status"] == "unchanged"
