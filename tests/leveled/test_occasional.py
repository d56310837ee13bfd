"""Work in no span (``occasional._unmarked``), on step trees built by hand: the iterations of one period and
phase are such work only where each of them takes longer than the others by a clear margin."""

from __future__ import annotations

from typing import Any

import duckdb

from xstack.leveled.occasional import _WRITES, _every, _unmarked, _work, add_writes, the_others, work_text

MS = 1_000_000


def _con(steps: dict[int, int], inside: int) -> Any:
    """A ``_lm_tree`` of run 1: one step per iteration of ``steps`` (its duration) holding one span of
    ``inside`` ns, so that any time a step takes beyond ``inside`` lies outside every span under it."""
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE _lm_tree (run_id INT, iter INT, span_id BIGINT, parent_id BIGINT, parent_key INT, dur_ns BIGINT)"
    )
    for it, dur in steps.items():
        con.execute("INSERT INTO _lm_tree VALUES (1, ?, ?, NULL, NULL, ?)", [it, 2 * it, dur])
        con.execute("INSERT INTO _lm_tree VALUES (1, ?, ?, ?, 0, ?)", [it, 2 * it + 1, 2 * it, inside])
    return con


def _steps(extra: int, every: int = 5, n: int = 20) -> dict[int, int]:
    """``n`` iterations of 10 ms, give or take 20 us, every ``every``th (the 3rd phase) ``extra`` ns longer."""
    return {i: 10 * MS + (i * 7919 % 41 - 20) * 1000 + (extra if i % every == 2 else 0) for i in range(n)}


def test_iterations_clearly_longer_one_period_apart_are_work_in_no_span() -> None:
    steps = _steps(3 * MS)
    work = _unmarked(_con(steps, 8 * MS), 1, steps, [])
    assert work is not None and work["unmarked"] is True
    assert (work["every"], work["steps"], work["iterations_with"]) == (5, [2, 7, 12, 17], 4)
    assert 2_900_000 < work["longer_ns"] < 3_100_000 and work["per_iteration_ns"] == round(work["longer_ns"] * 4 / 20)


def test_longer_beyond_the_spread_but_by_less_than_a_tenth_of_a_step_is_not_work() -> None:
    """0.5 ms on a 10 ms step is far beyond the others' 20 us of spread, yet a loaded pass slows a few iterations
    by as much: a tenth of the step is the least that counts."""
    steps = _steps(MS // 2)
    assert _unmarked(_con(steps, 8 * MS), 1, steps, []) is None
    steps = _steps(MS + MS // 10)
    assert _unmarked(_con(steps, 8 * MS), 1, steps, []) is not None


def test_longer_by_a_tenth_but_within_three_spreads_is_not_work() -> None:
    """Others spread over 0.9 ms (every 3rd of them 1 ms faster): 1.5 ms more is beyond it, not beyond 3 times it."""
    steps = {i: d - (MS if i % 3 == 0 else 0) for i, d in _steps(MS + MS // 2, n=30).items()}
    steps = {i: d + (MS if i % 5 == 2 and i % 3 == 0 else 0) for i, d in steps.items()}
    assert _unmarked(_con(steps, 5 * MS), 1, steps, []) is None


def test_one_slow_iteration_in_the_period_is_not_work() -> None:
    steps = _steps(3 * MS)
    steps[7] -= 3 * MS  # one of the four as fast as the others
    assert _unmarked(_con(steps, 8 * MS), 1, steps, []) is None


def test_longer_inside_the_spans_the_others_have_is_not_work_in_no_span() -> None:
    steps = _steps(3 * MS)
    con = _con(steps, 8 * MS)
    con.execute("UPDATE _lm_tree SET dur_ns = dur_ns + 3000000 WHERE parent_id IS NOT NULL AND iter % 5 = 2")
    assert _unmarked(con, 1, steps, []) is None


def _op(steps: list[int], iterations: int) -> dict[str, Any]:
    return {"name": "aten::set_", "level": "op", "kind": None, "run_id": 1, "steps": steps, "median_ns": 7_000,
            "count": 2 * len(steps), "iterations": iterations, "per_iteration_ns": 700}  # fmt: skip


def test_iterations_as_long_as_a_slowed_stretch_of_the_others_are_not_work_beyond_noise() -> None:
    """A pass that a busy machine slowed for ten of its twenty iterations (5 to 24, as ``step#N`` numbers them):
    the two holding an op the others lack (18 and 20) are among the slow ones and no longer than them. Their
    median is far above the others' median, yet they do not stand out: the op's own cost, not 110 ms per two
    iterations, and no period for two iterations that close the pass."""
    steps = {i: (150 if 14 <= i <= 23 else 45) * MS + (i * 7919 % 41) * 10_000 for i in range(5, 25)}
    longest = max(d for i, d in steps.items() if i not in (18, 20))
    steps |= {18: longest + 50_000, 20: longest + 20_000}  # the longest, by less than the others' spread
    [w] = _work([_op([18, 20], 20)], {1: steps}, {1: "model+layer+op"})
    assert (w["longer_beyond_noise"], w["per_iteration_ns"], w["every"]) == (False, 700, None)
    # the same two iterations slower than every other one: work beyond noise
    steps |= {18: 190 * MS, 20: 200 * MS}
    [w] = _work([_op([18, 20], 20)], {1: steps}, {1: "model+layer+op"})
    assert w["longer_beyond_noise"] is True and w["per_iteration_ns"] > 5 * MS


def test_ops_inside_the_dataloader_s_wait_are_not_charged_the_wait() -> None:
    """Two workers, each taking two steps' time to build a batch: every 2nd iteration waits for data, and there
    the main process unpickles the batch (aten::set_, aten::empty under dataloader.next). Those iterations were
    said to cost 10.2 ms per iteration of occasional work, 109% on top of the step: the wait, not the ops."""
    steps = {i: (25 if i % 2 else 5) * MS + (i * 7919 % 41) * 10_000 for i in range(3, 18)}
    iters = [i for i in steps if i % 2]
    op = _op(iters, 15) | {"parent": "dataloader.next", "parent_level": "model", "parent_kind": "dataloader"}
    [w] = _work([op], {1: steps}, {1: "model+layer+op"})
    assert w["in_dataloader_wait"] is True and w["longer_beyond_noise"] is False
    assert w["per_iteration_ns"] == 700 and w["longer_ns"] > 15 * MS
    assert "waiting for data (io.input_bound weighs it), not for this work, which runs inside the wait" in (
        work_text(w | {"step_pct": 0.1})
    )
    # the same ops under a stage of the loop's own: the longer iterations are theirs
    [w] = _work([op | {"parent": "step", "parent_kind": "step"}], {1: steps}, {1: "model+layer+op"})
    assert "in_dataloader_wait" not in w and w["longer_beyond_noise"] is True and w["per_iteration_ns"] > 5 * MS


def test_a_period_runs_through_the_measured_iterations() -> None:
    measured = range(5, 25)
    assert _every([5, 10, 15, 20], measured) == 5
    assert _every([9, 14, 19, 24], measured) == 5
    assert _every([14, 24], measured) == 10  # every 10th of 20: twice
    assert _every([18, 20], measured) is None  # every 2nd would have held 10 of them
    assert _every([5, 7], measured) is None
    assert _every([5, 10, 20], measured) is None  # one missing between
    assert _every([12], measured) is None


def _group(name: str, steps: list[int], iterations: int) -> dict[str, Any]:
    return {"name": name, "level": "model", "kind": None, "run_id": 1, "steps": steps, "median_ns": 1_000,
            "count": len(steps), "iterations": iterations, "per_iteration_ns": 100}  # fmt: skip


def test_work_nested_in_other_occasional_work_is_timed_against_that_works_other_iterations() -> None:
    """A validation every 3rd iteration (15 ms) and a checkpoint in every 2nd of those (6th iteration: 10 ms).
    Against every other iteration, the checkpoint's iterations were also charged the validation: each work is
    now timed against the iterations that differ from its own by it alone."""
    validation, checkpoint = list(range(2, 24, 3)), list(range(5, 24, 6))
    steps = {i: 12 * MS + (i * 7919 % 41) * 10_000 + (15 * MS if i in validation else 0)
             + (10 * MS if i in checkpoint else 0) for i in range(24)}  # fmt: skip
    spans = [_group("evaluate", validation, 24), _group("save", checkpoint, 24)]
    work = {w["spans"][0]["name"]: w for w in _work(spans, {1: steps}, {1: "model"})}
    assert 9.5 * MS < work["save"]["longer_ns"] < 10.5 * MS and work["save"]["longer_beyond_noise"] is True
    assert 14.5 * MS < work["evaluate"]["longer_ns"] < 15.5 * MS
    assert work["evaluate"]["per_iteration_ns"] == round(work["evaluate"]["longer_ns"] * 8 / 24)
    # a checkpoint that costs nothing: its iterations are no longer than the validation's others
    steps = {i: d - (10 * MS if i in checkpoint else 0) for i, d in steps.items()}
    work = {w["spans"][0]["name"]: w for w in _work(spans, {1: steps}, {1: "model"})}
    assert work["save"]["longer_beyond_noise"] is False and work["save"]["per_iteration_ns"] == 100


def test_checkpoint_writes_are_the_nested_works_not_the_validation_around_it() -> None:
    class Con:
        def execute(self, sql: str, params: Any) -> Any:
            return self

        def fetchall(self) -> list[tuple[int, int, str | None]]:
            # a checkpoint of 1.4 MB in every 2nd validation iteration (every 10th), else a log line
            return [
                (i, 1_400_000 if i % 10 == 9 else 100, "/r/ckpt.pt" if i % 10 == 9 else "/r/log") for i in range(20)
            ]

    validation, checkpoint = {"steps": [4, 9, 14, 19]}, {"steps": [9, 19]}
    add_writes(Con(), [validation, checkpoint], 1, 0, 20)
    assert "writes_bytes" not in validation
    assert checkpoint["writes_bytes"] == 1_400_000 - 100 and checkpoint["writes_path"] == "/r/ckpt.pt"


def test_a_checkpoint_written_under_a_temporary_name_is_named_by_the_name_it_was_renamed_to() -> None:
    """torch.save to ``.ckpt.tmp``, then os.replace into ``ckpt-N.pt``; or files written into a temporary folder
    renamed once complete (a Trainer's ``tmp-checkpoint-N``): the file the user looks for is the final one."""
    con = duckdb.connect()
    con.execute("CREATE TABLE _spans (run_id INT, level VARCHAR, name VARCHAR, parent_id BIGINT, pid INT, "
                "start_ns BIGINT, dur_ns BIGINT, attrs JSON)")  # fmt: skip
    rows = []
    for i in range(12):
        t = i * 10 * MS
        rows.append(("model", "step", None, t, 10 * MS, {"model.step": i}))
        if i % 4 == 3:  # a checkpoint every 4th iteration: a file, then a folder
            tmp, final = f"/r/.ckpt{i}.tmp", f"/r/ckpt-{i}.pt"
            if i == 7:
                tmp, final = "/r/tmp-checkpoint/model.bin", "/r/checkpoint-7/model.bin"
            rows.append(("io", "write", 1, t + MS, MS, {"io.path": tmp, "io.bytes": 1_000_000}))
            src = tmp if i != 7 else "/r/tmp-checkpoint"
            dst = final if i != 7 else "/r/checkpoint-7"
            rows.append(("io", "rename", 1, t + 3 * MS, 10, {"io.path": src, "io.target": dst}))
        rows.append(("io", "write", 1, t + 5 * MS, 10, {"io.path": "/r/log.txt", "io.bytes": 100}))
    rows.append(("io", "rename", 1, 200 * MS, 10, {"io.path": "/r/ckpt-3.pt", "io.target": "/r/x", "io.errno": 2}))
    for level, name, parent, start, dur, attrs in rows:
        con.execute("INSERT INTO _spans VALUES (1, ?, ?, ?, 7, ?, ?, ?)", [level, name, parent, start, dur, attrs])
    group = {"steps": [3, 7, 11]}
    add_writes(con, [group], 1, 0, 12)
    assert group["writes_bytes"] == 1_000_000 and group["writes_files"] == 3
    assert group["writes_path"] in ("/r/ckpt-3.pt", "/r/checkpoint-7/model.bin", "/r/ckpt-11.pt")
    names = {path for _step, _bytes, path in con.execute(_WRITES, {"run": 1, "first": 0, "end": 12}).fetchall()}
    assert names == {"/r/log.txt", "/r/ckpt-3.pt", "/r/checkpoint-7/model.bin", "/r/ckpt-11.pt"}


def test_writes_in_some_of_a_group_s_iterations_are_said_with_their_period_not_halved() -> None:
    """A Trainer evaluates every 5th iteration and saves a checkpoint (5.5 MiB, no span of its own) in every 2nd
    of those: the group's median write was half the checkpoint, said to be written "each time"."""

    class Con:
        def execute(self, sql: str, params: Any) -> Any:
            return self

        def fetchall(self) -> list[tuple[int, int, str | None]]:
            return [(i, 5_770_000 if i % 10 == 9 else 0, f"/r/checkpoint-{i}/model" if i % 10 == 9 else None)
                    for i in range(3, 33)]  # fmt: skip

    evaluation = {"steps": [4, 9, 14, 19, 24, 29], "iterations_with": 6, "iterations": 30, "every": 5, "spans": [],
                  "span_count": 1, "per_iteration_ns": 3_900_000, "longer_ns": 19_500_000,
                  "longer_beyond_noise": True, "pass": "model"}  # fmt: skip
    add_writes(Con(), [evaluation], 1, 3, 33)
    assert (evaluation["writes_bytes"], evaluation["writes_steps"], evaluation["writes_every"]) == (
        5_770_000, [9, 19, 29], 10)  # fmt: skip
    assert "; 5.50 MiB more written to files in 3 of them, every 10th iteration (3 files, such as " in work_text(
        evaluation)  # fmt: skip


def test_work_in_no_span_inside_some_of_a_group_s_iterations_is_found_and_the_group_costed_without_it() -> None:
    """A Hugging Face Trainer evaluates every 5th iteration (11 ms, in spans) and saves a checkpoint in every 2nd
    of those (8.6 ms, in no span). The save's iterations are all the evaluation's, so no work in no span was
    looked for there, and the evaluation was charged the save's time too."""
    evaluation, save = list(range(4, 30, 5)), list(range(9, 30, 10))
    steps = {i: 10 * MS + (i * 7919 % 41) * 10_000 + (11 * MS if i in evaluation else 0)
             + (8_600_000 if i in save else 0) for i in range(30)}  # fmt: skip
    con = _con(steps, 8 * MS)  # every step's span 8 ms: the evaluation's time there too, the save's not
    con.execute("UPDATE _lm_tree SET dur_ns = dur_ns + 11000000 WHERE parent_id IS NOT NULL AND iter % 5 = 4")
    group = {"steps": evaluation}
    found = _unmarked(con, 1, steps, [group])
    assert found is not None and (found["steps"], found["every"], found["within"]) == (save, 10, True)
    assert 8_000_000 < found["longer_ns"] < 9_200_000
    said = work_text(found | {"pass": "model"})
    assert "those iterations take 8." in said and "than the other iterations of the work they run inside in" in said
    # the evaluation, costed apart from the save's iterations: its own 11 ms, not the median of both
    spans = [_group("evaluate", evaluation, 30)]
    alone, apart = _work(spans, {1: steps}, {1: "model"}), _work(spans, {1: steps}, {1: "model"}, extra=[tuple(save)])
    assert alone[0]["longer_ns"] > 14 * MS and 10.5 * MS < apart[0]["longer_ns"] < 11.5 * MS


def test_work_too_cheap_to_name_still_says_the_files_it_writes() -> None:
    """An LSTM's checkpoint every 10th iteration, inside its validation's every 5th, with two other validation
    iterations to tell it from: its cost is within the noise, and it was "1 more, 1.37 us per iteration together",
    its 2.67 MiB written every 10th iteration unsaid."""
    checkpoint = _group("aten::detach", [9, 19], 20) | {
        "every": 10,
        "writes_bytes": 2_796_687,
        "writes_path": "/r/ckpt.pt",
        "writes_files": 1,
        "per_iteration_ns": 1371,
        "longer_beyond_noise": False,
    }
    assert the_others([checkpoint]) == (
        "1 more, 1.37 us per iteration together, writing 2.67 MiB to files every 10th iteration (/r/ckpt.pt), its "
        "iterations no longer than the others beyond their spread"
    )
    other = _group("aten::set_", [7], 20)
    assert the_others([other, checkpoint]).startswith("2 more, 1.47 us per iteration together, one of them writing")
    assert the_others([other]) == "1 more, 100 ns per iteration together"
