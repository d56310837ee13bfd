"""Models compiled with ``torch.compile`` under the model and layer levels: the program runs and computes as it
does without the profiler, and the layer level says what it sees of a compiled model.

The ``eager`` backend keeps the tests fast: the profiler's hooks meet torch's tracer (dynamo), which every
backend shares; only the code generated from the traced graph differs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
nn = torch.nn

import xstack  # noqa: E402


class Breaking(nn.Module):
    """A module whose forward cannot be traced whole: dynamo splits the graph there and runs it eagerly."""

    def forward(self, x: Any) -> Any:
        torch._dynamo.graph_break()
        return x * 2


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model(breaking: bool = False) -> Any:
    torch.manual_seed(0)
    layers = [nn.Linear(4, 8), nn.ReLU(), *([Breaking()] if breaking else []), nn.Linear(8, 2)]
    return nn.Sequential(*layers)


def _run(compiled: Any, model: Any, prof: Any = None, *, compile_step: bool = False) -> list[Any]:
    """Three training steps of ``compiled`` (``model``, or what torch.compile made of it); the losses.
    ``compile_step``: the optimizer's step compiled too."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = torch.compile(opt.step, backend="eager") if compile_step else opt.step
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(3):
        loss = compiled(x).pow(2).mean()
        loss.backward()
        step()
        opt.zero_grad()
        losses.append(loss.detach().clone())
        if prof is not None:
            prof.step()
    return losses


def _spans(prof: Any, level: str) -> list[tuple[str, dict[str, Any]]]:
    with prof.open() as store:
        rows = store.query(f"SELECT name, attrs FROM spans WHERE level = '{level}' ORDER BY start_ns")
    return [(name, orjson.loads(attrs or "{}")) for name, attrs in rows]


def _health(prof: Any) -> dict[str, tuple[int, str]]:
    with prof.open() as store:
        return {c: (n, d) for c, n, d in store.query('SELECT "check", count, detail FROM health')}


def _compiled_as_without_profiler(tmp_path: Path, backend: str, levels: str) -> Any:
    """Three training steps of the model compiled with ``backend``, without the profiler and profiled at
    ``levels``: the profile, the losses checked equal."""
    model = _model()
    plain = _run(torch.compile(model, backend=backend), model)
    torch._dynamo.reset()
    model = _model()
    with xstack.profile(levels=levels, path=tmp_path / "p.duckdb") as prof:
        profiled = _run(torch.compile(model, backend=backend), model, prof)
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled, strict=True))
    return prof


def test_a_compiled_model_runs_and_computes_as_without_the_profiler(tmp_path: Path) -> None:
    """The layer hooks ran inside torch's tracer, which failed on them: the program died with an
    AssertionError from dynamo ("already tracked for mutation")."""
    prof = _compiled_as_without_profiler(tmp_path, "eager", "model,layer")
    layers = _spans(prof, "layer")
    # one span per call of the compiled model, named as the model is without torch.compile; no module inside it
    assert [name for name, _ in layers] == ["Sequential"] * 3
    assert {a["layer.type"] for _, a in layers} == {"Sequential (compiled)"}
    assert layers[0][1]["layer.params"] == 4 * 8 + 8 + 8 * 2 + 2
    assert [name for name, a in _spans(prof, "model") if a.get("model.kind") == "forward"] == ["Sequential"] * 3
    assert not _health(prof)


def test_a_graph_break_inside_a_compiled_model(tmp_path: Path) -> None:
    """Dynamo splits the model at the break and traces each part, hooks included: still one span per call of
    the compiled model, and no path names torch.compile's wrapper (``_orig_mod``)."""
    model = _model(breaking=True)
    plain = _run(torch.compile(model, backend="eager"), model)
    torch._dynamo.reset()
    model = _model(breaking=True)
    with xstack.profile(levels="model,layer", path=tmp_path / "p.duckdb") as prof:
        profiled = _run(torch.compile(model, backend="eager"), model, prof)
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled, strict=True))
    names = [name for name, _ in _spans(prof, "layer")]
    assert names.count("Sequential") == 3 and not [n for n in names if "_orig_mod" in n]


@pytest.mark.parametrize("levels", ["model", "model,layer"])
@pytest.mark.parametrize("when", ["before", "while"])
def test_a_model_compiled_in_place_is_one_call(tmp_path: Path, levels: str, when: str) -> None:
    """``Module.compile()`` compiles the call itself, hooks included: no level saw any call of the model, compiled
    while profiled or before (then health named it, and the layer table was empty)."""
    model = _model()
    plain = _run(model, model)
    model = _model()
    if when == "before":
        model.compile(backend="eager")
    with xstack.profile(levels=levels, path=tmp_path / "p.duckdb") as prof:
        if when == "while":
            model.compile(backend="eager")
        profiled = _run(model, model, prof)
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled, strict=True))
    assert [name for name, a in _spans(prof, "model") if a.get("model.kind") == "forward"] == ["Sequential"] * 3
    if "layer" in levels:
        layers = _spans(prof, "layer")
        assert [name for name, _ in layers] == ["Sequential"] * 3
        assert {a["layer.type"] for _, a in layers} == {"Sequential (compiled)"}
        assert not _health(prof)
    assert not hasattr(torch.nn.Module.compile, "__wrapped__") and torch.nn.Module.compile.__module__.startswith(
        "torch")  # fmt: skip  # put back


def _compiled_program(prof: Any = None) -> tuple[list[Any], dict[str, Any]]:
    """A model compiled in place and a compiled optimizer step: the losses, and what torch compiled (graphs,
    graph breaks and their reasons)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = _model()
    model.compile(backend="eager")
    losses = _run(model, model, prof, compile_step=True)
    return losses, {k: dict(counters[k]) for k in ("graph_break", "stats", "recompiles")}


@pytest.mark.parametrize("levels", ["model", "model,layer"])
def test_torch_compiles_the_same_program_under_the_profiler(tmp_path: Path, levels: str) -> None:
    """The model level's hooks (on top-level calls and optimizer steps) and the layer level's ran inside torch's
    tracer: every one was a graph break (``time.time_ns``), the model level's one on a lock made torch give up
    and run the model eagerly, and the graphs were split and compiled again at each step."""
    plain, compiled = _compiled_program()
    with xstack.profile(levels=levels, path=tmp_path / "p.duckdb") as prof:
        profiled, under_profiler = _compiled_program(prof)
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled, strict=True))
    assert under_profiler == compiled
    assert compiled["stats"]["unique_graphs"] >= 1


def _compiled_training_step(prof: Any = None) -> tuple[list[Any], dict[str, Any]]:
    """A compiled function that runs the forward and the backward: the losses and gradients of three calls,
    and what torch compiled."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model, x = _model(), torch.randn(3, 4, generator=torch.Generator().manual_seed(1))

    @torch.compile(backend="eager")
    def step() -> Any:
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    out = []
    for _ in range(3):
        out += [step().detach().clone(), model[0].weight.grad.clone()]
        if prof is not None:
            prof.step()
    return out, {k: dict(counters[k]) for k in ("graph_break", "stats", "recompiles")}


@pytest.mark.parametrize("levels", ["model", "model,layer"])
def test_a_backward_inside_compiled_code_compiles_and_computes_as_without_the_profiler(
    tmp_path: Path, levels: str
) -> None:
    """The model level's backward stage wraps ``torch.autograd.backward``: torch's tracer must meet it as it
    meets PyTorch's own (it compiled the wrapper's frame, past its graph break at the backward, and broke there
    once more). The backward, which it cannot compile, runs outside the graphs: a stage each time."""
    plain, compiled = _compiled_training_step()
    with xstack.profile(levels=levels, path=tmp_path / "p.duckdb") as prof:
        profiled, under_profiler = _compiled_training_step(prof)
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled, strict=True))
    assert under_profiler == compiled
    assert [name for name, a in _spans(prof, "model") if a.get("model.kind") == "backward"] == ["backward"] * 3


def test_torch_compile_s_own_marks_are_ops(tmp_path: Path) -> None:
    """The op level records torch.compile's marks (the phases of the compilation here) as operators: as model
    spans they made the op pass of a leveled measurement disagree with its model pass."""
    model = _model()
    with xstack.profile(levels="model,layer,op", path=tmp_path / "p.duckdb") as prof:
        _run(torch.compile(model, backend="eager"), model, prof)
    assert not [name for name, _ in _spans(prof, "model") if "compile_id=" in name]
    assert [name for name, _ in _spans(prof, "op") if name.startswith("dynamo_data: compile_id=")]


def test_torch_compile_s_marks_of_its_autograd_tracing_nest_in_the_compilation(tmp_path: Path) -> None:
    """AOT autograd, which every backend but ``eager`` runs, enters its marks (``aot_collect_metadata_data:
    compile_id=0/0``) within the call of its dispatch mode and leaves them after it: each was left without a
    parent, an unattributed op and a nesting conflict, health findings on every compiled run that lost nothing.
    They nest in the compilation's phase that encloses them, and health counts them for information only."""
    prof = _compiled_as_without_profiler(tmp_path, "aot_eager", "model,layer,op")
    health = _health(prof)
    assert not {"nesting_conflicts", "unattributed_ops"} & set(health), health
    count, detail = health["outlasting_spans"]
    assert count >= 1 and "aot_collect_metadata_data: compile_id=" in detail, detail
    with prof.open() as store:
        parents = store.query(
            "SELECT p.name FROM spans s JOIN spans p ON p.span_id = s.parent_id "
            "WHERE s.name LIKE 'aot_collect_metadata_data: compile_id=%'"
        )
    assert parents and all(name.startswith("aot_collect_metadata") for (name,) in parents), parents


def test_torch_jit_trace_traces_the_same_model_under_the_profiler(tmp_path: Path) -> None:
    """``torch.jit.trace`` runs the model twice and checks that the two graphs agree. The layer hooks, which
    read a model's parameters at its first call, were recorded into the first one: the trace failed ("Graphs
    differed across invocations") and the program with it."""
    model, x = _model().eval(), torch.randn(3, 4)
    plain = torch.jit.trace(model, x)
    model = _model().eval()
    with xstack.profile(levels="model,layer", path=tmp_path / "p.duckdb") as prof:
        traced = torch.jit.trace(model, x)
        out = traced(x)

    def graph(module: Any) -> str:  # each trace names its classes apart (``___torch_mangle_N``)
        return re.sub(r"___torch_mangle_\d+\.", "", str(module.graph))

    assert graph(traced) == graph(plain) and torch.equal(out, plain(x))
    # nothing of the tracer's own calls, at most the one eager call with which it checks the traced model's
    # outputs (the model and its 3 modules); then the traced model's call, one span, named as the model
    *checked, (name, attrs) = _spans(prof, "layer")
    assert len(checked) in (0, 4) and name == "Sequential" and attrs["layer.type"] == "Sequential (TorchScript)"
    assert attrs["layer.params"] == 4 * 8 + 8 + 8 * 2 + 2


def _marked(x: Any) -> Any:
    y = x * 2
    with xstack.span("inside"):
        y = y + 1
    return y.sum()


@pytest.mark.parametrize("levels", ["model", "model,layer"])
def test_a_stage_marked_inside_compiled_code_leaves_the_graph_whole(tmp_path: Path, levels: str) -> None:
    """``xstack.span`` inside a function torch.compile traces read the clock there: torch gave up on the whole
    function and ran it eagerly under the profiler (compiled without it). It now does nothing while traced."""
    from torch._dynamo.utils import counters

    def run() -> tuple[list[Any], dict[str, Any]]:
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(_marked, backend="eager")
        with xstack.span("outside"):
            out = [compiled(torch.full((4,), float(i))) for i in range(3)]
        return out, {k: dict(counters[k]) for k in ("graph_break", "stats", "recompiles")}

    plain, plain_counters = run()
    with xstack.profile(levels=levels, path=tmp_path / "p.duckdb") as prof:
        profiled, profiled_counters = run()
    assert profiled_counters == plain_counters and plain_counters["stats"]["unique_graphs"] == 1
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled, strict=True))
    assert [name for name, _ in _spans(prof, "model") if name in ("inside", "outside")] == ["outside"]


def test_a_compiled_program_run_by_xstack_run_ends_without_the_stores_bindings_warnings(tmp_path: Path) -> None:
    """The profile's store, closed, kept its DuckDB connection to the end of the program; with a compiled model
    alive to the end too, DuckDB's bindings printed a page of "nanobind: leaked instance" warnings on the
    program's standard error as the interpreter shut down. A closed store lets go of its connection."""
    import subprocess
    import sys

    (tmp_path / "p.py").write_text(
        "import torch\n"
        "model = torch.compile(torch.nn.Linear(4, 4), backend='eager')\n"
        "print(model(torch.ones(2, 4)).shape)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "xstack", "run", "--levels", "model,layer", "-o", "p.duckdb", "--", "python", "p.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("torch.Size([2, 4])\n")
    assert "leaked" not in done.stderr, done.stderr


def test_a_closed_store_lets_go_of_its_connection(tmp_path: Path) -> None:
    from xstack.errors import StoreError
    from xstack.trace.store import Store

    with Store.create(tmp_path / "s.duckdb") as store:
        pass
    with pytest.raises(StoreError, match="s.duckdb: the store is closed"):
        store.con.execute("SELECT 1")
    store.close()  # again: nothing to close
