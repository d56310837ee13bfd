"""Leveled passes: ``xstack.measure`` runs a step function once per level set, each pass a run of one store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
nn = torch.nn

import xstack  # noqa: E402
from xstack.analyze._system_common import STEP_SPAN  # noqa: E402
from xstack.errors import UsageError  # noqa: E402
from xstack.leveled.passes import default_passes  # noqa: E402


def _model() -> tuple[Any, Any]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)), torch.randn(4, 8)


def _runs(path: Path) -> list[tuple[int, str, list[str], dict[str, Any]]]:
    with xstack.open_store(path) as store:
        rows = store.query("SELECT run_id, pass, levels, config FROM runs ORDER BY run_id")
    return [(r[0], r[1], r[2], orjson.loads(r[3])) for r in rows]


def test_one_run_per_pass_with_warmup_and_measured_steps(tmp_path: Path) -> None:
    model, x = _model()
    path = xstack.measure(lambda: model(x), warmup=2, iters=3, path=tmp_path / "m.duckdb", progress=False)
    runs = _runs(path)
    expected = ["model", "model+layer", "model+layer+op"] + (
        ["model+layer+op+runtime+kernel"] * torch.cuda.is_available()
    )
    assert [r[1] for r in runs] == [*expected, "merged"]
    runs, merged = runs[:-1], runs[-1]
    assert [r[2] for r in runs][:3] == [["model"], ["model", "layer"], ["model", "layer", "op"]]
    for _, _, _, config in runs:
        assert config["status"] == "complete" and config["steps"] == config["steps_completed"] == 5
        assert config["measure"] == {"warmup": 2, "iterations": 3, "passes": expected}
    assert [p["run_id"] for p in merged[3]["merge"]["passes"]] == [r[0] for r in runs]
    with xstack.open_store(path) as store:
        steps = store.query(
            "SELECT run_id, count(*) FROM spans WHERE attrs->>'$.\"model.kind\"' = 'step' GROUP BY 1 ORDER BY 1"
        )
        layers = store.query("SELECT run_id, count(*) FROM spans WHERE level = 'layer' GROUP BY 1 ORDER BY 1")
        ops = store.query("SELECT DISTINCT run_id FROM spans WHERE level = 'op'")
    assert steps[:-1] == [(r[0], 5) for r in runs] and steps[-1] == (merged[0], 1)
    assert layers[:2] == [(2, 5 * 4), (3, 5 * 4)]  # Sequential + 3 children, 5 iterations, not in the model pass
    assert [r[0] for r in ops][:1] == [3]


def test_the_ops_of_a_thread_pool_stay_in_their_pass_and_the_merged_run_says_so(tmp_path: Path) -> None:
    """The op level records every thread's operators; a thread pool's hold no span of the steps, so the merge,
    which places spans by the steps' structure, leaves them in the op pass and its health says where."""
    from concurrent.futures import ThreadPoolExecutor

    model, x = _model()
    with ThreadPoolExecutor(1) as pool:
        path = xstack.measure(lambda: model(pool.submit(torch.randn, 4, 8).result()), warmup=1, iters=3,
                              passes=["model", "model,layer", "model,layer,op"], path=tmp_path / "m.duckdb",
                              progress=False)  # fmt: skip
    with xstack.open_store(path) as store:
        rows = store.query("SELECT run_id, count, detail FROM health WHERE \"check\" = 'ops_other_threads' ORDER BY 1")
        pooled = store.query("SELECT count(*) FROM spans WHERE run_id = 3 AND name = 'aten::randn'")[0][0]
    assert pooled >= 4 and [r[:2] for r in rows] == [(3, pooled), (4, pooled)], rows
    assert "kept in the pass that recorded them (run 3) only" in rows[1][2] and "aten::randn (" in rows[1][2], rows


def test_a_step_that_raises_keeps_the_passes_so_far(tmp_path: Path) -> None:
    model, x = _model()
    calls = 0

    def step() -> None:
        nonlocal calls
        calls += 1
        if calls == 4 + 2:  # second pass, second iteration
            raise RuntimeError("injected")
        model(x)

    with pytest.raises(RuntimeError, match="injected"):
        xstack.measure(step, passes=["model", "model,layer", "model,layer,op"], warmup=1, iters=3,
                       path=tmp_path / "m.duckdb", progress=False)  # fmt: skip
    runs = _runs(tmp_path / "m.duckdb")
    assert [(r[1], r[3]["status"]) for r in runs] == [("model", "complete"), ("model+layer", "cut_short")]  # no merge


def test_bad_arguments_are_usage_errors_and_leave_no_store(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="iters >= 1"):
        xstack.measure(lambda: None, iters=0, path=tmp_path / "m.duckdb", progress=False)
    with pytest.raises(UsageError, match="unknown level 'warp'"):
        xstack.measure(lambda: None, passes=["model,warp"], path=tmp_path / "m.duckdb", progress=False)
    assert not list(tmp_path.iterdir())


def test_default_passes_leave_out_what_cannot_run_here() -> None:
    names = ["+".join(p) for p in default_passes()]
    assert names[:3] == ["model", "model+layer", "model+layer+op"]
    assert ("model+layer+op+runtime+kernel" in names) == torch.cuda.is_available()


def test_counter_passes_added_by_flags_join_the_timing_passes_and_alone_are_refused() -> None:
    from xstack.leveled.script import _passes

    # --io and --system add their passes to the timing ones: accepted, whatever the order they are resolved in
    level_sets, names = _passes(None, metrics=False, io=True, system=False)
    assert ("model", "io") in level_sets and any("io" not in levels for levels in level_sets)
    level_sets, _ = _passes(["model"], metrics=False, io=True, system=False)
    assert level_sets == [("model",), ("model", "io")]
    # only counter passes: nothing would time the merged profile
    with pytest.raises(UsageError, match="pass model\\+io records a level that adds counters"):
        _passes(["model,io"], metrics=False, io=False, system=False)
    with pytest.raises(UsageError, match="measure: passes model\\+io, model\\+system each record"):
        xstack.measure(lambda: None, passes=["model,io", "model,system"], warmup=0, iters=1)


def _timed_pass(tmp: Path, loops: int) -> tuple[int, dict[str, Any], list[str]]:
    """A model pass of 1 warm-up + 2 iterations asked, that must measure at least 60 ms, over a loop of
    ``loops`` steps of 5 ms: the iterations ended, the run's config and its health checks."""
    import time

    from xstack.leveled.passes import pass_config
    from xstack.profile import Profile

    prof = Profile("model", tmp / "p.duckdb", config=pass_config(1, 2, ["model"], 0.06), steps=3)
    with prof:
        for _ in range(loops):
            time.sleep(0.005)
            prof.step()
            if prof.done:
                break
    with prof.open() as store:
        (config,) = store.query("SELECT config FROM runs")[0]
        health = [c for (c,) in store.query('SELECT "check" FROM health WHERE count > 0')]
    return prof.completed, orjson.loads(config), health


def test_a_pass_that_must_last_goes_on_past_its_iterations_as_long_as_its_loop_does(tmp_path: Path) -> None:
    completed, config, health = _timed_pass(tmp_path, 1000)
    assert 1 + 2 < completed <= 1 + 12  # past the 2 asked, to 60 ms of steps of 5 ms or more, and then it stopped
    assert config["measure"]["iterations"] == completed - 1 and config["steps_completed"] == completed
    with xstack.open_store(tmp_path / "p.duckdb") as store:
        steps = [d for (d,) in store.query(f"SELECT dur_ns FROM spans WHERE {STEP_SPAN} ORDER BY start_ns")][1:]
    assert sum(steps) >= 0.95 * 60e6 and sum(steps[:-1]) < 60e6  # one step fewer was not long enough
    assert "iterations_short" not in health
    completed, config, health = _timed_pass(tmp_path, 5)  # a loop that ends first: nothing is short
    assert completed == 5 and config["measure"]["iterations"] == 4 and "iterations_short" not in health
    completed, config, health = _timed_pass(tmp_path, 2)  # short of the iterations asked, as ever
    assert completed == 2 and config["measure"]["iterations"] == 2 and "iterations_short" in health


def test_the_progress_bar_grows_with_a_pass_that_goes_on_past_its_iterations() -> None:
    from xstack.leveled.progress import PassProgress

    bar = PassProgress(["model+system"], 1, 2)
    bar._enabled = True  # as on a terminal
    with bar:
        for done in range(1, 7):
            bar.advance(0, done)
            task = bar._progress.tasks[0]
            assert task.completed == done and task.total == max(3, done)  # never past its end
        assert task.description == "pass 1/1 model+system (measured, until enough samples)"


def test_a_pass_slowed_by_the_machine_is_said_to_be_unsteady_in_the_merged_health(tmp_path: Path) -> None:
    import time

    calls = []

    def step() -> None:  # the second pass's last 7 measured steps meet a busy machine (10x slower)
        calls.append(1)
        # 3 fast steps, not 2: the 5th percentile of 10 steps is read between the two fastest, and a real hiccup
        # on one of only two would put it halfway to the slow ones
        time.sleep(0.02 if len(calls) > 1 + 10 + 1 + 3 else 0.002)

    path = xstack.measure(step, passes=["model", "model,layer"], warmup=1, iters=10, path=tmp_path / "m.duckdb",
                          progress=False)  # fmt: skip
    with xstack.open_store(path) as store:
        rows = store.query("SELECT count, detail FROM health WHERE \"check\" = 'pass_unsteady' AND run_id = 3")
        (config,) = store.query("SELECT config FROM runs WHERE run_id = 3")[0]
        # the model pass's measured steps (its 2 ms sleeps): the quiet reference the test needs
        median, p5 = store.query(
            f"""SELECT median(dur_ns), quantile_cont(dur_ns, 0.05) FROM spans
                WHERE run_id = 1 AND {STEP_SPAN} AND (attrs->>'$."model.step"')::INT >= 1"""
        )[0]
    if median > 2 * p5:
        pytest.skip(f"the machine slowed the model pass too (median step {median / 1e6:.1f} ms, 5th percentile "
                    f"{p5 / 1e6:.1f} ms): no quiet pass to compare the slowed one with")  # fmt: skip
    assert len(rows) == 1 and rows[0][0] == 1 and rows[0][1].startswith("pass model+layer's median step"), rows
    assert [o.get("unsteady", False) for o in orjson.loads(config)["overhead"]] == [False, True]  # xstack diff reads it
