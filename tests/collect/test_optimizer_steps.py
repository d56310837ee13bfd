"""Iterations of a measured run whose program never calls ``xstack.step()``: an optimizer's ``step()`` ends each
(``profile._OptimizerSteps``, on for ``xstack run --iters`` and ``xstack profile``). Without it, such a program
ran every pass to its end for nothing: no iteration, nothing measured, no merged profile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
nn = torch.nn

from xstack.profile import PassComplete, Profile  # noqa: E402


def _gan(prof: Profile | None, loops: int, *, mark_from: int | None = None) -> list[int]:
    """A loop of ``loops`` iterations stepping two optimizers (SGD, then Adam), as a GAN's discriminator and
    generator; with ``mark_from``, the program calls ``prof.step()`` itself from that iteration on. Returns the
    loop iterations that ran to their end."""
    torch.manual_seed(0)
    d, g = nn.Linear(4, 1), nn.Linear(4, 4)
    opt_d, opt_g = torch.optim.SGD(d.parameters(), lr=0.1), torch.optim.Adam(g.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    ran = []
    for i in range(loops):
        d(g(x).detach()).mean().backward()
        opt_d.step()
        opt_d.zero_grad()
        d(g(x)).mean().backward()
        opt_g.step()
        opt_g.zero_grad()
        if prof is not None and mark_from is not None and i >= mark_from:
            prof.step()
        ran.append(i)
    return ran


def _profile(tmp: Path, steps: int, **kwargs: Any) -> Profile:
    return Profile("model", tmp / "p.duckdb", "gan", steps=steps, optimizer_steps=True, **kwargs)


def _iterations(prof: Profile) -> tuple[list[list[str]], dict[str, Any], dict[str, tuple[int, str]]]:
    """The optimizer spans inside each step span, in order; the run's config; its health."""
    with prof.open() as store:
        steps = store.query(
            "SELECT s.span_id, (SELECT list(o.name ORDER BY o.start_ns) FROM spans o WHERE o.parent_id = s.span_id "
            "AND o.attrs->>'$.\"model.kind\"' = 'optimizer') FROM spans s "
            "WHERE s.attrs->>'$.\"model.kind\"' = 'step' ORDER BY s.start_ns"
        )
        (config,) = store.query("SELECT config FROM runs")[0]
        health = {c: (n, d) for c, n, d in store.query('SELECT "check", count, detail FROM health')}
    return [list(names or []) for _, names in steps], orjson.loads(config), health


def test_the_first_optimizer_stepped_twice_ends_each_iteration_and_stops_the_program(tmp_path: Path) -> None:
    prof = _profile(tmp_path, steps=3, warmup=1)
    with prof, pytest.raises(PassComplete):  # as xstack run's program ends: inside the profile
        ran = _gan(prof, 10)
    assert prof.done
    steps, config, health = _iterations(prof)
    # the SGD step of loop iteration 1 ends the first iteration (the start-up and two of the loop's), each later
    # one an iteration of its own; the third stops the program inside that step, before Adam's
    assert steps == [["SGD.step", "Adam.step", "SGD.step"], ["Adam.step", "SGD.step"], ["Adam.step", "SGD.step"]]
    assert config["steps_completed"] == 3 and config["status"] == "complete"
    count, detail = health["steps_from_optimizer"]
    assert count == 3 and "ended by SGD.step()" in detail and "then the program" not in detail
    assert "ran" not in locals()  # the loop never returned


def test_a_program_that_marks_its_iterations_keeps_them(tmp_path: Path) -> None:
    """Every optimizer has stepped before the program's first ``step()``, which comes before any steps twice."""
    prof = _profile(tmp_path, steps=20)
    with prof:
        ran = _gan(prof, 4, mark_from=0)
    steps, config, health = _iterations(prof)
    assert ran == [0, 1, 2, 3] and steps == [["SGD.step", "Adam.step"]] * 4 and config["steps_completed"] == 4
    assert "steps_from_optimizer" not in health


def test_a_program_that_marks_iterations_later_ends_the_optimizers_part(tmp_path: Path) -> None:
    prof = _profile(tmp_path, steps=20)
    with prof:
        _gan(prof, 6, mark_from=3)
    steps, config, health = _iterations(prof)
    # SGD's steps end the iterations until the program's own step(), at the end of loop iteration 3: from then
    # on only the program's step() does, and the optimizers' steps stay inside its iterations
    assert steps == [["SGD.step", "Adam.step", "SGD.step"], ["Adam.step", "SGD.step"], ["Adam.step", "SGD.step"],
                     ["Adam.step"], ["SGD.step", "Adam.step"], ["SGD.step", "Adam.step"]]  # fmt: skip
    count, detail = health["steps_from_optimizer"]
    assert count == 3 and "then the program called xstack.step()" in detail and config["steps_completed"] == 6


def test_a_profile_that_is_no_measured_run_never_ends_iterations_itself(tmp_path: Path) -> None:
    with Profile("model", tmp_path / "p.duckdb", "gan") as prof:  # xstack run without --iters: one region
        _gan(prof, 3)
    steps, config, health = _iterations(prof)
    assert steps == [] and config["steps_completed"] == 0 and "steps_from_optimizer" not in health
    with Profile("model", tmp_path / "q.duckdb", "gan", steps=5) as prof:  # the API's own: its caller marks them
        _gan(prof, 3)
    assert _iterations(prof)[1]["steps_completed"] == 0


def _compiled_steps(prof: Profile | None) -> tuple[list[Any], dict[str, Any]]:
    """Four steps of a compiled optimizer step: the weights after them, and what torch compiled."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = torch.compile(opt.step, backend="eager")
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(4):
        model(x).sum().backward()
        step()
        opt.zero_grad()
    compiled = {k: dict(counters[k]) for k in ("graph_break", "stats", "recompiles")}
    torch._dynamo.reset()
    return [p.detach().clone() for p in model.parameters()], compiled


def test_a_compiled_optimizer_step_ends_no_iteration_and_compiles_as_without_the_profiler(tmp_path: Path) -> None:
    """With no level that hooks modules (the op level alone), the hook ran inside torch's tracer, which ran it
    and ended iterations from inside a compiled step."""
    plain = _compiled_steps(None)
    with Profile("op", tmp_path / "p.duckdb", "compiled", steps=20, optimizer_steps=True) as prof:
        profiled = _compiled_steps(prof)
    assert all(torch.equal(a, b) for a, b in zip(plain[0], profiled[0], strict=True))
    assert profiled[1] == plain[1]
    with prof.open() as store:
        ((completed,),) = store.query("SELECT (config->>'$.steps_completed')::INT FROM runs")
    assert completed == 0 and prof.ended_by is None


def test_the_summary_says_which_step_the_time_after_the_last_iteration_follows(tmp_path: Path) -> None:
    """Where SGD's steps ended the iterations, the stretch after the last one follows an ``SGD.step()``, not a
    ``step()`` the program never called; where the program's own ``step()`` ended the last, it follows that."""
    from xstack.analyze.summary import summarize
    from xstack.report.terminal import iterations_line

    lines = []
    for name, mark_from in (("p", None), ("q", 3)):
        prof = Profile("model", tmp_path / f"{name}.duckdb", "gan", steps=20, optimizer_steps=True)
        with prof:
            _gan(prof, 6, mark_from=mark_from)
        with prof.open() as store:
            iterations = summarize(store).iterations
        assert iterations is not None and iterations["tail_ns"] > 0
        lines.append(iterations_line(iterations))
    # SGD's 6 steps end 5 iterations (the first ends at its second); the program's step() ends 3 + 3 from then on
    assert lines[0].startswith("4 measured, after 1 warm-up") and " after the last SGD.step() (not an" in lines[0]
    assert lines[1].startswith("5 measured, after 1 warm-up") and " after the last step() (not an" in lines[1]
