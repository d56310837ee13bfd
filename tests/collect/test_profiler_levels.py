"""Live op, runtime and kernel levels through torch.profiler, merged with the live model and layer spans."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
nn = torch.nn

import xstack  # noqa: E402
from xstack.errors import UsageError  # noqa: E402
from xstack.profile import parse_levels  # noqa: E402

CUDA = torch.cuda.is_available()


class Small(nn.Module):
    """Convolutions, a container, a module called twice and a plain tensor op between modules."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(8 * 4 * 4, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: Any) -> Any:
        x = self.features(x).flatten(1)
        x = torch.tanh(self.fc(x))
        return self.head(x)


def _train(device: str, steps: int, prof: Any = None, *, fail_at: int | None = None) -> list[Any]:
    torch.manual_seed(0)
    model = Small().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(steps, 4, 3, 8, 8)
    losses = []
    for i in range(steps):
        if i == fail_at:
            raise RuntimeError("injected failure")
        loss = model(data[i].to(device)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().cpu().clone())
        if prof is not None:
            prof.step()
    return losses


def _rows(path: Path, sql: str) -> list[dict[str, Any]]:
    with xstack.open_store(path) as store:
        cur = store.con.execute(sql)
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    for row in rows:
        if "attrs" in row:
            row["attrs"] = orjson.loads(row["attrs"] or "{}")
    return rows


def _spans(path: Path) -> dict[int, dict[str, Any]]:
    rows = _rows(path, "SELECT * FROM spans")
    return {r["span_id"]: r for r in rows}


def _ancestors(spans: dict[int, dict[str, Any]], span: dict[str, Any]) -> list[dict[str, Any]]:
    chain = []
    while span["parent_id"] is not None:
        span = spans[span["parent_id"]]
        chain.append(span)
    return chain


def _end(s: dict[str, Any]) -> int:
    return int(s["start_ns"] + s["dur_ns"])


def _profiled(tmp_path: Path, levels: str, device: str) -> tuple[Path, dict[int, dict[str, Any]]]:
    """Train three steps at ``levels``; the store's path and its spans by id."""
    path = tmp_path / "p.duckdb"
    with xstack.profile(levels=levels, path=path) as prof:
        _train(device, 3, prof)
    return path, _spans(path)


def test_ops_nest_in_their_layers_and_model_spans_on_one_clock(tmp_path: Path) -> None:
    path, spans = _profiled(tmp_path, "model,layer,op", "cpu")
    ops = [s for s in spans.values() if s["level"] == "op"]
    layers = [s for s in spans.values() if s["level"] == "layer"]
    assert len(ops) > 100 and len(layers) == 3 * 7

    # every op has a parent, and lies inside it
    for op in ops:
        assert op["parent_id"] is not None, op["name"]
        parent = spans[op["parent_id"]]
        assert parent["start_ns"] <= op["start_ns"] and _end(op) <= _end(parent), (op["name"], parent["name"])

    # one clock: an op overlapping a layer on its thread lies wholly inside it, and the layer is its ancestor
    for layer in layers:
        inside = [
            o for o in ops if o["tid"] == layer["tid"] and o["start_ns"] < _end(layer) and _end(o) > layer["start_ns"]
        ]
        assert inside, layer["name"]
        for op in inside:
            assert layer["start_ns"] <= op["start_ns"] and _end(op) <= _end(layer), (op["name"], layer["name"])
            assert layer["span_id"] in {a["span_id"] for a in _ancestors(spans, op)}

    # the module's own op is its direct child
    children = {(spans[o["parent_id"]]["name"], o["name"]) for o in ops}
    assert {("features.0", "aten::conv2d"), ("fc", "aten::linear"), ("head", "aten::linear")} <= children
    assert ("features.1", "aten::relu") in children
    # an op between modules hangs from the model's forward span; optimizer ops from the optimizer span
    tanh = next(o for o in ops if o["name"] == "aten::tanh")
    assert spans[tanh["parent_id"]]["name"] == "Small"
    optimizer = [s for s in spans.values() if s["attrs"].get("model.kind") == "optimizer"]
    assert len(optimizer) == 3
    assert any(o["parent_id"] == optimizer[0]["span_id"] for o in ops)

    # layers in the model span of their forward, forwards in their step
    for layer in layers:
        model = [a for a in _ancestors(spans, layer) if a["level"] == "model"]
        assert model[0]["attrs"]["model.kind"] == "forward" and model[-1]["attrs"]["model.kind"] == "step"

    health = {r["check"]: r["count"] for r in _rows(path, "SELECT * FROM health")}
    assert "nesting_conflicts" not in health and "unattributed_ops" not in health, health


def test_the_ops_of_a_model_run_by_another_thread_nest_in_its_layers_there(tmp_path: Path) -> None:
    """A server runs its model in a worker thread: PyTorch's profiler recorded no operator of that thread (only
    those of the thread that started it), so its layers had no ops under them."""
    import threading

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with xstack.profile(levels="model,layer,op", path=tmp_path / "p.duckdb") as prof:
        worker = threading.Thread(target=lambda: [model(torch.randn(4, 8)) for _ in range(3)], name="server")
        worker.start()
        worker.join()
    with prof.open() as store:
        rows = store.query(
            "SELECT p.name, count(*) FROM spans o JOIN spans p ON p.span_id = o.parent_id "
            "WHERE o.level = 'op' AND p.level = 'layer' AND o.name IN ('aten::linear', 'aten::relu') GROUP BY 1"
        )
        health = {c: (n, d) for c, n, d in store.query('SELECT "check", count, detail FROM health')}
    assert dict(rows) == {"0": 3, "1": 3, "2": 3}, rows
    # the inputs made between the forwards, on a thread that runs no iteration: charged to it, not a gap
    assert health["ops_other_threads"][0] == 3 and health["ops_other_threads"][1].endswith(": aten::randn (3)")
    assert not set(health) & {"unattributed_ops", "nesting_conflicts"}, health


def test_a_pytorch_without_the_all_threads_setting_records_as_its_profiler_does(monkeypatch: Any) -> None:
    """PyTorch before 2.7 has no ``profile_all_threads``: the op level starts its profiler as before."""
    from xstack.collect.torch_profiler import _new_profile

    assert _new_profile([torch.profiler.ProfilerActivity.CPU]).experimental_config is not None

    class Older:
        def __init__(self, **settings: Any) -> None:
            if "profile_all_threads" in settings:
                raise TypeError("__init__() got an unexpected keyword argument 'profile_all_threads'")

    monkeypatch.setattr(torch.profiler, "_ExperimentalConfig", Older)
    assert _new_profile([torch.profiler.ProfilerActivity.CPU]).experimental_config is None


def test_ops_carry_the_importers_attributes(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    with xstack.profile(levels="model,layer,op", path=path) as prof:
        _train("cpu", 1, prof)
    conv = _rows(path, "SELECT * FROM spans WHERE name = 'aten::conv2d'")[0]
    assert conv["attrs"]["op.shapes"][0] == [4, 3, 8, 8]
    assert conv["device"] == "cpu" and conv["pid"] is not None
    run = _rows(path, "SELECT levels, pass, config FROM runs")[0]
    assert run["levels"] == ["model", "layer", "op"] and run["pass"] == "live"
    # PyTorch's own optimizer marks are not model spans a second time
    names = {r["name"] for r in _rows(path, "SELECT name FROM spans WHERE level = 'model'")}
    assert not any(n.startswith("Optimizer.") for n in names), names


def test_op_level_does_not_change_results(tmp_path: Path) -> None:
    plain = _train("cpu", 3)
    with xstack.profile(levels="model,layer,op", path=tmp_path / "p.duckdb") as prof:
        profiled = _train("cpu", 3, prof)
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled, strict=True))


def test_a_crash_keeps_the_ops_traced_so_far(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    with pytest.raises(RuntimeError, match="injected"), xstack.profile(levels="model,layer,op", path=path) as prof:
        _train("cpu", 3, prof, fail_at=2)
    steps = _rows(path, "SELECT span_id FROM spans WHERE name IN ('step#0', 'step#1')")
    assert len(steps) == 2
    ops = _rows(path, "SELECT count(*) AS n FROM spans WHERE level = 'op'")[0]["n"]
    assert ops > 50
    config = orjson.loads(_rows(path, "SELECT config FROM runs")[0]["config"])
    assert config["status"] == "cut_short"


def test_kernel_and_io_bring_the_levels_they_hang_from() -> None:
    assert parse_levels("kernel") == ("op", "runtime", "kernel")
    assert parse_levels("layer,model,runtime") == ("model", "layer", "op", "runtime")
    # without the model level's DataLoader waits, whether the loop waits for the workers' reads is unknown
    assert parse_levels("io") == ("model", "io")
    assert parse_levels("system,io,layer") == ("model", "layer", "io", "system")


@pytest.mark.skipif(CUDA, reason="checks the message given on a machine without CUDA")
def test_kernel_level_without_cuda_says_why(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="level 'runtime' cannot run here: no CUDA device"):
        xstack.profile(levels="model,kernel", path=tmp_path / "p.duckdb").__enter__()
    assert not (tmp_path / "p.duckdb").exists()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (torch.cuda.is_available() is False)")
def test_kernels_hang_from_their_launch_and_ops_from_layers_on_cuda(tmp_path: Path) -> None:
    path, spans = _profiled(tmp_path, "model,layer,kernel", "cuda")
    kernels = [s for s in spans.values() if s["level"] == "kernel"]
    assert kernels
    for kernel in kernels:
        launch = spans[kernel["parent_id"]]
        assert launch["level"] == "runtime" and launch["correlation_id"] == kernel["correlation_id"]
        assert kernel["device"].startswith("cuda:") and kernel["stream"] is not None
        assert spans[launch["parent_id"]]["level"] == "op"
    conv_kernels = [k for k in kernels if "features.0" in {a["name"] for a in _ancestors(spans, k)}]
    assert conv_kernels, "no kernel traced back to the convolution layer"
    health = {r["check"]: r["count"] for r in _rows(path, "SELECT * FROM health")}
    assert "device_events_without_launch" not in health, health
    run = _rows(path, "SELECT device FROM runs")[0]
    assert run["device"].startswith("cuda:")


def test_a_collector_failing_to_stop_is_reported_and_the_others_still_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xstack.collect import torch_profiler

    def failing_stop(session: Any) -> None:
        session.profiler.stop()
        raise OSError("disk full writing the trace")

    monkeypatch.setattr(torch_profiler._Session, "stop", failing_stop)
    path = tmp_path / "p.duckdb"
    with xstack.profile(levels="model,layer,op", path=path) as prof:
        _train("cpu", 1, prof)
    health = {r["check"]: r["detail"] for r in _rows(path, 'SELECT "check", detail FROM health')}
    assert "disk full" in health["collector_failed"]
    layers = _rows(path, "SELECT count(*) AS n FROM spans WHERE level = 'layer'")[0]["n"]
    assert layers == 7  # the live spans are kept; the autouse check sees no hook left behind


def test_the_time_after_the_last_step_ends_with_the_program_not_with_the_profilers_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from xstack.collect import torch_profiler

    stop = torch_profiler._Session.stop

    def slow_stop(session: Any) -> None:  # a slower machine's profiler: stopping and writing its trace
        stop(session)
        time.sleep(0.3)

    monkeypatch.setattr(torch_profiler._Session, "stop", slow_stop)
    path = tmp_path / "p.duckdb"
    with xstack.profile(levels="model,layer,op", path=path) as prof:
        _train("cpu", 2, prof)
        left_ns = time.time_ns()  # the program's last moment in the region
    tail = _rows(path, "SELECT start_ns, dur_ns FROM spans WHERE name = 'after-last-step'")[0]
    assert left_ns - tail["start_ns"] <= tail["dur_ns"] < left_ns - tail["start_ns"] + 100_000_000
    # every span of the run lies within the region the program spent: the profiler's stop is not the run's
    extent = _rows(path, "SELECT max(start_ns + dur_ns) AS last FROM spans")[0]["last"]
    assert extent == _end(tail)


def _own_profile(model: Any, x: Any) -> set[str]:
    """The program profiles one forward with its own torch.profiler: the op names it got."""
    with torch.profiler.profile() as own:
        model(x)
    return {e.name for e in own.events()}


def test_a_program_starting_its_own_profiler_keeps_it_and_the_ops_before(tmp_path: Path) -> None:
    """PyTorch runs one profiler at a time: the program's ended the op level's session, whose stop then crashed
    the process (a segfault in export_chrome_trace)."""
    from torch.autograd import profiler as autograd_profiler

    original = autograd_profiler.profile._prepare_trace
    model, x = nn.Linear(4, 4), torch.randn(2, 4)
    alone = _own_profile(model, x)
    with xstack.profile(levels="model,op", path=tmp_path / "p.duckdb") as prof:
        torch.tanh(x)  # before the program's profiler: recorded
        seen = _own_profile(model, x)
        torch.sigmoid(x)  # after it: not
    assert seen == alone and "aten::linear" in seen
    with prof.open() as store:
        ops = {name for (name,) in store.query("SELECT DISTINCT name FROM spans WHERE level = 'op'")}
        health = dict(store.query('SELECT "check", detail FROM health'))
    assert "aten::tanh" in ops and "aten::sigmoid" not in ops and "aten::linear" not in ops
    assert "started a torch.profiler session of its own" in health["op_level_yielded"]
    assert autograd_profiler.profile._prepare_trace is original


def test_a_profile_started_inside_the_program_s_profiler_leaves_it_alone(tmp_path: Path) -> None:
    model, x = nn.Linear(4, 4), torch.randn(2, 4)
    with torch.profiler.profile() as own, xstack.profile(levels="model,op", path=tmp_path / "p.duckdb") as prof:
        model(x)
    assert "aten::linear" in {e.name for e in own.events()}
    with prof.open() as store:
        assert store.query("SELECT count(*) FROM spans WHERE level = 'op'") == [(0,)]
        assert (
            "was running when the profile started"
            in dict(store.query('SELECT "check", detail FROM health'))["op_level_yielded"]
        )


COMPILER_UNUSED = """
import os, sys, torch, xstack
with xstack.profile(levels=["op"], path=sys.argv[1]):
    torch.randn(4, 4).matmul(torch.randn(4, 4))
print("torch._inductor" in sys.modules)
from xstack.collect.torch_profiler import _start_without_compiler
ours, theirs = (torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) for _ in range(2))
_start_without_compiler(ours, torch)
ours.stop()
print("torch._inductor" in sys.modules, ours.has_cudagraphs)
theirs.start()  # torch's own start imports the compiler to read the setting
theirs.stop()
print("torch._inductor" in sys.modules, theirs.has_cudagraphs)
"""


def test_the_op_level_starts_without_importing_torch_s_compiler(tmp_path: Path) -> None:
    """Starting torch.profiler imported ``torch._inductor`` (``hasattr(torch, "_inductor")``): two seconds of the
    first step, and its files in the io level, for a program that never compiles. The one setting torch reads
    from it is its default then, which comes from the environment: the same answer as torch's own start."""
    (tmp_path / "prog.py").write_text(COMPILER_UNUSED)
    env = {**os.environ, "TORCHINDUCTOR_CUDAGRAPHS": "1"}  # not the default, to tell them apart
    done = subprocess.run([sys.executable, "prog.py", "s.duckdb"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "True", "True", "True"]
    ops = _rows(tmp_path / "s.duckdb", "SELECT name FROM spans WHERE level = 'op'")
    assert "aten::matmul" in {row["name"] for row in ops}


KINETO_LINES = """
import os, sys, torch, xstack
with xstack.profile(levels="model,op", path=sys.argv[1]):
    torch.ones(4).sum()
    print(os.environ.get("KINETO_LOG_LEVEL"))  # the program's own environment, as it was
print(os.environ.get("KINETO_LOG_LEVEL"))
"""


@pytest.mark.skipif(CUDA, reason="the op level leaves Kineto's messages alone where it records CUDA activity")
@pytest.mark.parametrize("level", [None, "0"])
def test_kineto_s_start_and_stop_lines_are_not_the_program_s_unless_it_asks(tmp_path: Path, level: str | None) -> None:
    """Kineto prints ``USDT: ... profiler_start`` and ``profiler_stop`` lines to the program's stderr as the op
    level starts and stops: silenced, unless the program sets Kineto's log level itself."""
    (tmp_path / "prog.py").write_text(KINETO_LINES)
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"} | (
        {"KINETO_LOG_LEVEL": level} if level else {}
    )
    done = subprocess.run([sys.executable, "prog.py", "s.duckdb"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(level)] * 2
    shown = [line for line in done.stderr.splitlines() if "profiler_st" in line]
    assert len(shown) == (0 if level is None else 2), done.stderr  # level 0: every message, as the program asked
    assert _rows(tmp_path / "s.duckdb", "SELECT count(*) AS n FROM spans WHERE level = 'op'")[0]["n"] > 0
