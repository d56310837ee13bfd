"""``xstack profile --system``: a sampler pass and a pass tracing system calls, which the merge never takes
timings from and whose counters and calls stay in their own runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import orjson
import pytest

from tests.conftest import needs_torch
from xstack.collect.syscalls import unavailable_reason
from xstack.trace.store import Store

pytestmark = needs_torch


def _health(store: Store, run_id: int) -> dict[str, tuple[int, str]]:
    rows = store.query('SELECT "check", count, detail FROM health WHERE run_id = ?', [run_id])
    return {check: (int(count), detail) for check, count, detail in rows}


def test_system_passes_are_counter_passes_that_stay_in_their_runs(tmp_path: Path) -> None:
    import xstack
    from xstack.leveled.merge import merge_passes

    path = xstack.measure(lambda: sum(range(1000)), passes=["model", "model,layer"], warmup=1, iters=3,
                          path=tmp_path / "m.duckdb", progress=False)  # fmt: skip
    with Store.open(path, read_only=False) as store:
        store.con.execute("DELETE FROM _runs WHERE pass = 'merged'")
        store.con.execute("DELETE FROM _spans WHERE run_id = 3")
        store.con.execute("DELETE FROM _health WHERE run_id = 3")
        # a system pass as the syscall pass records it: model and layer spans, and a system span per call
        store.con.execute("INSERT INTO _runs SELECT 3, name, started_at, command, host, framework, device, "
                          "['model', 'layer', 'system'], 'model+layer+system+syscalls', config FROM _runs "
                          "WHERE run_id = 2")  # fmt: skip
        store.con.execute("INSERT INTO _spans SELECT 3, span_id, parent_id, level, name, start_ns, dur_ns * 50, pid, "
                          "tid, device, stream, correlation_id, attrs FROM _spans WHERE run_id = 2")  # fmt: skip
        store.con.execute(
            "INSERT INTO _spans SELECT 3, 100000 + span_id, span_id, 'system', 'futex', start_ns, 1, "
            "pid, tid, device, NULL, NULL, NULL FROM _spans WHERE run_id = 2 AND level = 'model'"
        )
        result = merge_passes(store)
        merged = result.run_id
        levels, config = store.query("SELECT levels, config FROM runs WHERE run_id = ?", [merged])[0]
        health = _health(store, merged)
        slowest = store.query("SELECT max(dur_ns) FROM spans WHERE run_id = ?", [merged])[0][0]
        deepest = store.query("SELECT max(dur_ns) FROM spans WHERE run_id = 2")[0][0]
        system_spans = store.query("SELECT count(*) FROM spans WHERE run_id = ? AND level = 'system'", [merged])
    assert [p.name for p in result.passes] == ["model", "model+layer"]  # the system pass is never timed
    assert slowest <= deepest  # its 50x slower spans are nowhere in the merged run
    assert "system" in levels
    assert orjson.loads(config)["merge"]["counter_passes"] == [{"pass": "model+layer+system+syscalls", "run_id": 3}]
    count, detail = health["system_passes"]
    assert count == 1 and "model+layer+system+syscalls (run 3)" in detail
    assert system_spans == [(0,)]  # the calls stay in their own run


@pytest.mark.skipif(importlib.util.find_spec("xstack.collect.system") is None or unavailable_reason() is not None,
                    reason="the system level or strace is not available here")  # fmt: skip
def test_system_adds_two_passes_unless_one_records_system() -> None:
    from xstack.leveled.script import _passes

    sets, names = _passes(["model", "model,layer"], metrics=False, io=False, system=True)
    assert names == ["model", "model+layer", "model+system", "model+layer+system+syscalls"]
    assert sets[-1] == ("model", "layer", "system")
    sets, names = _passes(["model", "model,system"], metrics=False, io=False, system=True)
    assert names == ["model", "model+system"]  # the user's own system pass: nothing added, nothing traced


def test_profile_system_adds_a_sampler_pass_and_a_syscall_pass(system_profile: Path) -> None:
    store_path = system_profile  # --pass model --pass model,layer --system, of a loop whose "wait" stage sleeps
    with Store.open(store_path) as store:
        runs = {r[1]: (int(r[0]), list(r[2]), orjson.loads(r[3])) for r in store.query(
            "SELECT run_id, pass, levels, config FROM runs ORDER BY run_id")}  # fmt: skip
        assert list(runs) == ["model", "model+layer", "model+system", "model+layer+system+syscalls", "merged"]
        sampler, traced, merged = (runs[p][0] for p in ("model+system", "model+layer+system+syscalls", "merged"))
        calls = store.query(
            "SELECT s.name, p.name, s.dur_ns FROM spans s JOIN spans p ON p.run_id = s.run_id "
            "AND p.span_id = s.parent_id WHERE s.run_id = ? AND s.level = 'system'",
            [traced],
        )
        untraced = store.query("SELECT count(*) FROM spans WHERE run_id IN (?, ?) AND level = 'system'",
                               [sampler, merged])[0][0]  # fmt: skip
        health = _health(store, merged)
    assert any(name in ("clock_nanosleep", "nanosleep", "select") and stage == "wait" for name, stage, _ in calls)
    assert untraced == 0
    assert runs["model+layer+system+syscalls"][2]["system"]["syscalls"] is True
    assert not runs["model+system"][2].get("system", {}).get("syscalls")
    assert "system" in runs["merged"][1]
    assert [p["pass"] for p in runs["merged"][2]["merge"]["passes"]] == ["model", "model+layer"]
    counter_passes = [p["pass"] for p in runs["merged"][2]["merge"]["counter_passes"]]
    assert counter_passes == ["model+system", "model+layer+system+syscalls"]
    count, detail = health["system_passes"]
    assert count == 2 and "model+system (run 3)" in detail and "model+layer+system+syscalls (run 4)" in detail


@pytest.mark.skipif(importlib.util.find_spec("xstack.collect.system") is None or unavailable_reason() is not None,
                    reason="the system level or strace is not available here")  # fmt: skip
def test_the_sampler_pass_measures_long_enough_for_the_system_figures(system_profile: Path) -> None:
    from xstack.analyze._system_common import STEP_SPAN
    from xstack.analyze.pipeline import analyze
    from xstack.collect.system import MEASURED_FULL_SAMPLES, measured_s

    # three measured steps of ~10 ms asked: the sampler pass goes on to half a second, 10 full samples at 50 ms
    with Store.open(system_profile) as store:
        runs = {r[0]: (int(r[1]), orjson.loads(r[2])) for r in store.query("SELECT pass, run_id, config FROM runs")}
        sampler, config = runs["model+system"]
        steps = store.query(f"SELECT dur_ns FROM spans WHERE run_id = ? AND {STEP_SPAN} ORDER BY start_ns", [sampler])
        health = _health(store, sampler)
        a = analyze(store)
    measured = config["measure"]["iterations"]
    assert measured_s() == MEASURED_FULL_SAMPLES * 0.05 and config["measure"]["min_measured_s"] == measured_s()
    assert 3 < measured < 99 and config["steps_completed"] == 1 + measured  # stopped once long enough
    # the time from the warm-up's end to the last step's, less the gaps between steps
    assert sum(d for (d,) in steps[1 : 1 + measured]) >= 0.95 * measured_s() * 1e9
    assert sum(d for (d,) in steps[1:measured]) < measured_s() * 1e9  # one step fewer was not long enough
    assert "iterations_short" not in health
    said = (system_profile.parent / "stderr.txt").read_text()
    assert "xstack: pass 3/4: model+system (measuring at least 0.5 s of steps for the sampler, past --iters if " in said
    assert "xstack: pass 4/4: model+layer+system+syscalls\n" in said  # traced: timed by its tracer, not sampled
    for name in ("model", "model+layer", "model+layer+system+syscalls"):  # the others: the iterations asked
        assert runs[name][1]["measure"]["iterations"] == 3 and "min_measured_s" not in runs[name][1]["measure"]
    overhead = {o["pass"]: o for o in runs["merged"][1]["overhead"]}
    assert overhead["model+system"]["iterations"] == measured
    cpu = a.result("system.cpu")
    assert cpu.facts["full_samples"] >= 5 and cpu.facts["busy_mean_pct"] is not None
    assert a.summary.system is not None and not a.summary.system.get("cpu_too_few")


@pytest.mark.skipif(importlib.util.find_spec("xstack.collect.system") is None, reason="the system level is not here")
def test_a_measured_function_s_sampler_pass_lasts_long_enough_too(tmp_path: Path) -> None:
    import time

    import xstack
    from xstack.collect.system import measured_s

    path = xstack.measure(lambda: time.sleep(0.005), passes=["model", "model,system"], warmup=1, iters=3,
                          path=tmp_path / "m.duckdb", progress=False)  # fmt: skip
    with Store.open(path) as store:
        measures = dict(store.query("SELECT pass, config->'measure' FROM runs WHERE pass != 'merged'"))
        (durations,) = store.query(
            "SELECT sum(dur_ns) FROM spans WHERE run_id = 2 AND level = 'model' AND name != 'step#0' "
            "AND attrs->>'$.\"model.kind\"' = 'step'"
        )[0]
    model, sampled = orjson.loads(measures["model"]), orjson.loads(measures["model+system"])
    assert model["iterations"] == 3 and "min_measured_s" not in model
    assert sampled["min_measured_s"] == measured_s() and sampled["iterations"] > 3
    assert durations >= 0.95 * measured_s() * 1e9
