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
