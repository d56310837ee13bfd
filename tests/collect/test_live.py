"""Live model and layer collection on real PyTorch models: paths, nesting, one clock, results unchanged."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
nn = torch.nn

import xstack  # noqa: E402
from xstack.errors import UsageError  # noqa: E402


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x: Any) -> Any:
        return self.act(self.fc(x))


class Net(nn.Module):
    """Containers, a module list called in a loop and one module shared (called twice per forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.blocks = nn.ModuleList([Block(), Block()])
        self.shared = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: Any) -> Any:
        x = self.stem(x)
        for block in self.blocks:
            x = self.shared(block(x))
        return self.head(x)


def _train(steps: int, prof: Any = None, hold: float = 0.0) -> list[Any]:
    """``steps`` iterations of two batches, each in a stage "step" (``hold``: seconds it sleeps there too)."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
    losses = []
    for _ in range(steps):
        for (x,) in data:
            with xstack.span("step"):
                loss = model(x).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                time.sleep(hold)
            losses.append(loss.detach().clone())
        if prof is not None:
            prof.step()
    return losses


def _spans(prof: Any) -> list[dict[str, Any]]:
    with prof.open() as store:
        rows = store.query("SELECT span_id, parent_id, level, name, start_ns, dur_ns, attrs FROM spans")
    keys = ("span_id", "parent_id", "level", "name", "start_ns", "dur_ns", "attrs")
    return [dict(zip(keys, r[:6], strict=False)) | {"attrs": orjson.loads(r[6] or "{}")} for r in rows]


def test_layers_have_paths_call_indices_and_nest_in_time(tmp_path: Path) -> None:
    with xstack.profile(levels="model,layer", path=tmp_path / "p.duckdb") as prof:
        _train(2, prof)
    spans = _spans(prof)
    by_id = {s["span_id"]: s for s in spans}
    layers = [s for s in spans if s["level"] == "layer"]
    paths = {s["name"] for s in layers}
    assert {"Net", "stem", "stem.0", "stem.1", "blocks.0", "blocks.0.fc", "blocks.1.act", "shared", "head"} <= paths
    # the shared module is called twice per forward, two forwards (batches) per step
    shared = [s for s in layers if s["name"] == "shared"]
    assert len(shared) == 2 * 2 * 2
    assert sorted(s["attrs"]["layer.call_index"] for s in shared) == [0, 0, 1, 1, 2, 2, 3, 3]
    fc = next(s for s in layers if s["name"] == "blocks.0.fc")
    assert fc["attrs"]["layer.type"] == "Linear" and fc["attrs"]["layer.params"] == 72
    assert fc["attrs"]["layer.input_shapes"] == [[4, 8]] and fc["attrs"]["layer.output_shapes"] == [[4, 8]]
    # one clock: every span lies inside its parent, layers inside their model span
    for s in spans:
        parent = by_id.get(s["parent_id"])
        if parent is not None:
            assert parent["start_ns"] <= s["start_ns"]
            assert s["start_ns"] + s["dur_ns"] <= parent["start_ns"] + parent["dur_ns"]
    root_layers = [s for s in layers if s["name"] == "Net"]
    assert all(by_id[s["parent_id"]]["level"] == "model" for s in root_layers)


def test_model_spans_marked_and_automatic(tmp_path: Path) -> None:
    with xstack.profile(levels="model", path=tmp_path / "p.duckdb") as prof:
        _train(1, prof)
        model = nn.Linear(4, 4)
        model(torch.randn(1, 4))  # an unmarked top-level call
    spans = _spans(prof)
    kinds = {(s["name"], s["attrs"].get("model.kind")) for s in spans if s["level"] == "model"}
    assert ("step", "user") in kinds and ("step#0", "step") in kinds
    assert ("dataloader.next", "dataloader") in kinds and ("Linear", "forward") in kinds
    # inside the user's "step" stage no automatic forward or optimizer spans are added
    assert ("Net", "forward") not in kinds and ("SGD.step", "optimizer") not in kinds
    assert not [s for s in spans if s["level"] == "layer"]


def test_prof_summary_prints_the_stages_and_the_recommendations(tmp_path: Path, capsys: Any) -> None:
    with xstack.profile(levels="model", path=tmp_path / "p.duckdb") as prof:
        _train(3, prof, hold=0.005)  # the user's stage far longer than a wait for a batch, even on a busy machine
    summary = prof.summary(top=4)
    out = capsys.readouterr().out
    assert summary.run_id == 1 and "Run 1: " in out
    stages = out[out.index("Model stages") : out.index("Top layers")]
    # the user's stage twice per measured iteration, after the warm-up one; the loader's waits three times (the
    # third finds the epoch's end); the iterations, and the time after the last one
    assert re.search(r"│ step +│ user +│ +4 │", stages), stages
    assert re.search(r"│ dataloader\.next +│ dataloader +│ +6 │", stages), stages
    caption = " ".join(stages.split())  # wrapped to the table's width
    assert "iteration 1 left out as warm-up" in caption and "more stage" not in caption
    assert re.search(r"\nRecommendations(: no rule fired on this run)?\n", out)
    prof.summary(top=2)  # the iterations and the user's stage, which holds nearly all of each: the rest is counted
    out = capsys.readouterr().out
    stages = out[out.index("Model stages") : out.index("Top layers")]
    assert "2 more stages in xstack report" in " ".join(stages.split()) and "dataloader.next" not in stages


def test_a_user_stage_named_step_is_not_counted_with_the_warm_up_iteration(tmp_path: Path) -> None:
    """README's loop: xstack.span("step") inside each iteration. In the warm-up, the iteration and the user's
    stage of the same name made one row of 2 calls whose mean was half the iteration's."""
    from xstack.analyze.health import stage_breakdown

    with xstack.profile(levels="model", path=tmp_path / "p.duckdb") as prof:
        _train(3, prof)
    spans = [s for s in _spans(prof) if s["level"] == "model"]
    with prof.open() as store:
        rows = stage_breakdown(store, 1).rows
    first = next(s for s in spans if s["name"] == "step#0")
    inside = [s for s in spans if s["name"] == "step" and s["start_ns"] < first["start_ns"] + first["dur_ns"]]
    warm = {r[1]: r[2:4] for r in rows if r[0] == "step" and r[1].startswith("warm-up")}
    assert warm == {"warm-up step": (1, first["dur_ns"]), "warm-up": (len(inside), sum(s["dur_ns"] for s in inside))}
    measured = {r[1]: r[2] for r in rows if r[0] == "step"}
    assert (measured["step"], measured["user"]) == (2, 4)  # iterations 2 and 3, with 2 batches each


def test_unmarked_training_gets_forward_backward_and_optimizer_stages(tmp_path: Path) -> None:
    """Where a training step goes, unmarked: its forward, its backward (``loss.backward()``,
    ``torch.autograd.backward`` or ``torch.autograd.grad``) and the optimizer's step, each a stage of its own; a
    backward inside a marked stage is part of it, as a forward is."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(3, 4, requires_grad=True)
    with xstack.profile(levels="model", path=tmp_path / "p.duckdb") as prof:
        model(x).sum().backward()
        opt.step()
        prof.step()
        torch.autograd.backward(model(x).sum())
        (penalty,) = torch.autograd.grad(model(x).sum(), x)  # a gradient penalty's
        prof.step()
        with xstack.span("train"):
            model(x).sum().backward()
        grad = model.weight.grad.clone()
    spans = _spans(prof)
    by_id = {s["span_id"]: s for s in spans}
    stages = [(s["name"], s["attrs"].get("model.kind"), by_id[s["parent_id"]]["name"]) for s in spans
              if s["level"] == "model" and s["parent_id"] is not None]  # fmt: skip
    assert stages == [
        ("Linear", "forward", "step#0"), ("backward", "backward", "step#0"), ("Adam.step", "optimizer", "step#0"),
        ("Linear", "forward", "step#1"), ("backward", "backward", "step#1"),
        ("Linear", "forward", "step#1"), ("autograd.grad", "backward", "step#1"),
        ("train", "user", "after-last-step"),
    ]  # fmt: skip
    backward = next(s for s in spans if s["name"] == "backward")
    forward = next(s for s in spans if s["name"] == "Linear")
    assert backward["start_ns"] >= forward["start_ns"] + forward["dur_ns"]
    # PyTorch's own functions again, and the same gradients as without the profiler
    assert not hasattr(torch.autograd.backward, "__wrapped__") and not hasattr(torch.autograd.grad, "__wrapped__")
    torch.manual_seed(0)
    plain = nn.Linear(4, 2)
    plain_opt = torch.optim.Adam(plain.parameters())
    plain(x).sum().backward()
    plain_opt.step()
    torch.autograd.backward(plain(x).sum())
    assert torch.equal(torch.autograd.grad(plain(x).sum(), x)[0], penalty)
    plain(x).sum().backward()
    assert torch.equal(plain.weight.grad, grad)


def test_gradient_clipping_is_a_stage_and_returns_what_it_returns_unprofiled(tmp_path: Path) -> None:
    """``clip_grad_norm_`` and ``clip_grad_value_`` between the backward and the optimizer's step: training work,
    which ran in no stage and read as the loop's own; by either module's name, once each, the same norm and
    gradients as without the profiler, and PyTorch's own functions again after it."""
    import torch.nn.utils.clip_grad as clip_grad

    def train() -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        model(torch.randn(3, 4)).pow(2).sum().backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        clip_grad.clip_grad_value_(model.parameters(), 0.01)
        return norm, model.weight.grad.clone()

    plain, own = train(), (torch.nn.utils.clip_grad_norm_, clip_grad.clip_grad_value_, clip_grad.clip_grad_norm_)
    with xstack.profile(levels="model", path=tmp_path / "p.duckdb") as prof:
        profiled = train()
        prof.step()
    stages = [(s["name"], s["attrs"].get("model.kind")) for s in _spans(prof) if s["level"] == "model"]
    assert ("clip_grad_norm_", "clip") in stages and ("clip_grad_value_", "clip") in stages
    assert [n for n, _ in stages].count("clip_grad_norm_") == 1
    assert torch.equal(plain[0], profiled[0]) and torch.equal(plain[1], profiled[1])
    assert (torch.nn.utils.clip_grad_norm_, clip_grad.clip_grad_value_, clip_grad.clip_grad_norm_) == own


def test_profiling_does_not_change_results(tmp_path: Path) -> None:
    plain = _train(2)
    with xstack.profile(levels="model,layer", path=tmp_path / "p.duckdb") as prof:
        profiled = _train(2, prof)
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled, strict=True))


def test_a_crash_keeps_what_was_traced_and_says_so(tmp_path: Path) -> None:
    class Broken(nn.Module):
        def forward(self, x: Any) -> Any:
            raise ValueError("boom")

    model = nn.Sequential(nn.Linear(2, 2), Broken())
    with pytest.raises(ValueError, match="boom"), xstack.profile(path=tmp_path / "p.duckdb") as prof:
        model(torch.randn(1, 2))
    spans = _spans(prof)
    assert {"0", "1"} <= {s["name"] for s in spans if s["level"] == "layer"}
    with prof.open() as store:
        config = orjson.loads(store.query("SELECT config FROM runs")[0][0])
    assert config["status"] == "cut_short" and config["error"] == "ValueError: boom"


def test_bad_levels_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unknown level 'bogus'"):
        xstack.profile(levels="model,bogus", path=tmp_path / "p.duckdb")
    assert not (tmp_path / "p.duckdb").exists()


def test_span_outside_a_profile_does_nothing() -> None:
    @xstack.span("work")
    def work(x: int) -> int:
        return x + 1

    with xstack.span("outside"):
        assert work(1) == 2


def test_a_stage_named_from_a_file_name_that_is_not_utf8_is_kept_escaped(tmp_path: Path) -> None:
    """A stage named after a file (``os.fsdecode`` of Latin-1's ``café``: a lone surrogate) raised JSON's error
    into the program at the span's end."""
    name = os.fsdecode(b"load caf\xe9.bin")
    with xstack.profile(levels="model", path=tmp_path / "p.duckdb") as prof, xstack.span(name):
        total = sum(range(100))
    assert total == 4950
    assert [s["name"] for s in _spans(prof) if s["attrs"].get("model.kind") == "user"] == ["load caf\\xe9.bin"]


def test_spans_around_and_across_iterations_are_written_once(tmp_path: Path) -> None:
    # an "epoch" span around three steps, and a "train" span around a step() call: each crosses an iteration's
    # boundary; each is written once, with its real extent, and the iterations stay top-level and counted right
    with xstack.profile(levels="model", path=tmp_path / "p.duckdb") as prof:
        for _ in range(2):
            with xstack.span("epoch"):
                for _ in range(3):
                    with xstack.span("work"):
                        sum(range(1000))
                    prof.step()
        with xstack.span("train"):
            sum(range(1000))
            prof.step()
    spans = _spans(prof)
    ids = [s["span_id"] for s in spans]
    assert len(ids) == len(set(ids))
    by_name: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_name.setdefault(s["name"], []).append(s)
    assert [s["name"] for s in spans if s["attrs"].get("model.kind") == "step"] == [f"step#{k}" for k in range(7)]
    assert all(s["parent_id"] is None for s in spans if s["attrs"].get("model.kind") == "step")
    assert len(by_name["epoch"]) == 2 and len(by_name["work"]) == 6 and len(by_name["train"]) == 1
    for epoch in by_name["epoch"]:  # it holds its three work spans
        inside = [
            w for w in by_name["work"] if epoch["start_ns"] <= w["start_ns"] <= epoch["start_ns"] + epoch["dur_ns"]
        ]
        assert len(inside) == 3
    with xstack.open_store(tmp_path / "p.duckdb") as store:
        assert dict(store.query('SELECT "check", count FROM health')).get("unclosed_spans", 0) == 0


def test_iterations_marked_on_another_thread_end_where_it_marks_them(tmp_path: Path) -> None:
    """A server runs its model on a worker thread and marks a step per request there: the first iteration, open
    on the thread the profile began on, was never ended (it lasted the whole run, an unclosed span), and the
    last, open on the worker, was lost with what followed it. Each ends at the worker's step(); the requests'
    inputs, made on the main thread outside any span of it, are that thread's, not a gap."""
    import queue
    import threading

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    requests: queue.Queue[Any] = queue.Queue()
    replies: queue.Queue[Any] = queue.Queue()
    with xstack.profile(levels="model,layer,op", path=tmp_path / "p.duckdb") as prof:

        def serve() -> None:
            while (x := requests.get()) is not None:
                with torch.no_grad():
                    y = model(x)
                prof.step()
                replies.put(y)  # after the step: the client's next request is made after it

        worker = threading.Thread(target=serve, name="server")
        worker.start()
        with xstack.span("client"):  # open on the main thread across the worker's first step()
            for _ in range(5):  # a request at a time, as a client waiting for each reply
                requests.put(torch.randn(4, 8))
                replies.get()
        requests.put(None)
        worker.join()
        sum(range(1000))
    with prof.open() as store:
        steps = store.query(
            "SELECT name, tid, start_ns, dur_ns FROM spans WHERE level = 'model' AND parent_id IS NULL "
            "AND attrs->>'$.\"model.kind\"' IN ('step', 'tail') ORDER BY start_ns"
        )
        health = {c: (n, d) for c, n, d in store.query('SELECT "check", count, detail FROM health')}
        client = store.query("SELECT parent_id, tid FROM spans WHERE name = 'client'")
        randn_parents = {
            name
            for (name,) in store.query(
                "SELECT p.name FROM spans o JOIN spans p ON p.span_id = o.parent_id WHERE o.name = 'aten::randn'"
            )
        }
    assert [name for name, *_ in steps] == [f"step#{k}" for k in range(5)] + ["after-last-step"], steps
    main, server = steps[0][1], steps[1][1]
    assert main != server and {tid for _, tid, *_ in steps[1:]} == {server}
    for (_, _, start, dur), (_, _, after, _) in zip(steps, steps[1:], strict=False):
        assert start + dur <= after, steps  # the first ends at the worker's first step(), not with the profile
    assert "unclosed_spans" not in health and "unattributed_ops" not in health, health
    # opened in the first iteration, the client's span outlasts it: moved up, written once, holding every input
    assert client == [(None, main)] and "ops_other_threads" not in health, (client, health)
    assert randn_parents == {"client"}, randn_parents


def test_a_thread_per_request_keeps_the_recorders_memory_bounded(tmp_path: Path) -> None:
    """Each thread's stack is kept so that an iteration may end on another thread; a server starting a thread
    per request would keep one per thread it ever ran, the ended ones' included."""
    import threading

    with xstack.profile(levels="model", path=tmp_path / "p.duckdb") as prof:
        for i in range(600):
            worker = threading.Thread(target=lambda: xstack.span("request")(sum)(range(100)), name=f"request-{i}")
            worker.start()
            worker.join()
        assert prof._recorder is not None and len(prof._recorder._stacks) <= 300
    with prof.open() as store:
        assert store.query("SELECT count(*) FROM spans WHERE name = 'request'") == [(600,)]


def test_nested_tensors_of_the_transformer_fast_path(tmp_path: Path) -> None:
    """A TransformerEncoder in eval with a padding mask runs its layers on a nested tensor, which has no shape:
    reading it raised inside the layer hook and the program died."""

    def infer() -> Any:
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
        encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
        x, mask = torch.randn(3, 6, 16), torch.zeros(3, 6, dtype=torch.bool)
        mask[:, 4:] = True
        with torch.inference_mode():
            return encoder(x, src_key_padding_mask=mask)

    plain = infer()
    with xstack.profile(levels="model,layer", path=tmp_path / "p.duckdb") as prof:
        profiled = infer()
    assert torch.equal(plain, profiled)
    shapes = [s["attrs"]["layer.input_shapes"] for s in _spans(prof) if s["name"] == "layers.0"]
    assert shapes == [[[3, -1, -1]]]  # the batch, then the ragged dimensions


class _Keyed(nn.Module):
    """A model whose callers pass its tensors by keyword, as Hugging Face's do (``model(input_ids=x)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Any, mask: Any = None, *, scale: float = 1.0) -> Any:
        return self.fc(x * mask) * scale


def test_tensors_passed_by_keyword_are_inputs_too(tmp_path: Path) -> None:
    """A global pre-hook sees the positional arguments only: a model called by keyword had no input shapes."""
    model, x, mask = _Keyed(), torch.randn(3, 4), torch.ones(3, 4)
    with xstack.profile(levels="model,layer", path=tmp_path / "p.duckdb") as prof:
        model(x=x, mask=mask, scale=2.0)
        model(x, mask=mask)
        model(x[:1], mask[:1])
    calls = sorted((s for s in _spans(prof) if s["level"] == "layer" and s["name"] == "_Keyed"),
                   key=lambda s: s["start_ns"])  # fmt: skip
    assert [s["attrs"]["layer.input_shapes"] for s in calls] == [[[3, 4], [3, 4]], [[3, 4], [3, 4]], [[1, 4], [1, 4]]]


class _NoShape(torch.Tensor):
    """A tensor subclass whose shape cannot be read, as some wrappers' cannot."""

    @property
    def shape(self) -> Any:  # type: ignore[override]
        raise RuntimeError("this tensor has no shape")


def test_a_hook_failing_on_a_call_is_counted_and_the_program_runs_on(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Identity(), nn.Linear(4, 2))
    x = torch.randn(3, 4).as_subclass(_NoShape)
    with xstack.profile(levels="model,layer", path=tmp_path / "p.duckdb") as prof:
        out = model(x)
    assert torch.equal(torch.Tensor(out), torch.Tensor(model(torch.Tensor(x))))
    with prof.open() as store:
        count, detail = store.query("SELECT count, detail FROM health WHERE \"check\" = 'layer_hook_failed'")[0]
    assert count >= 1 and "RuntimeError: this tensor has no shape" in detail


def _closure_training(prof: Any = None) -> list[float]:
    """Three LBFGS steps (which call the closure several times each), then one SGD step given its closure by
    position, as Lightning's automatic optimisation does by keyword; the losses the steps return."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    lbfgs = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure() -> Any:
        lbfgs.zero_grad()
        sgd.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    losses = [float(lbfgs.step(closure=closure).detach()) for _ in range(3)]
    return [*losses, float(sgd.step(closure).detach())]


def test_an_optimizer_closure_is_a_stage_of_its_own_inside_the_step(tmp_path: Path) -> None:
    """The forward and backward run inside the optimizer's step: the step's stage held them, unseparated."""
    plain = _closure_training()
    with xstack.profile(levels="model", path=tmp_path / "p.duckdb") as prof:
        profiled = _closure_training(prof)
    assert profiled == plain
    spans = _spans(prof)
    by_id = {s["span_id"]: s for s in spans}
    closures = [s for s in spans if s["attrs"].get("model.kind") == "closure"]
    assert {s["name"] for s in closures} == {"LBFGS.step closure", "SGD.step closure"}
    assert all(by_id[s["parent_id"]]["name"] == s["name"].removesuffix(" closure") for s in closures)
    forwards = [s for s in spans if s["attrs"].get("model.kind") == "forward"]
    assert len(forwards) == len(closures) > 4 and all(by_id[f["parent_id"]] in closures for f in forwards)


class _Checkpointed(nn.Module):
    """Activation checkpointing: each block's activations are recomputed in the backward, which stops each
    recomputation early by raising inside it once it has what it needs (``use_reentrant=False``)."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8), nn.LayerNorm(8))
                                    for _ in range(2))  # fmt: skip
        self.head = nn.Linear(8, 2)
        self.reentrant = reentrant

    def forward(self, x: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(x)


def _checkpointed_training(reentrant: bool, prof: Any = None) -> list[Any]:
    torch.manual_seed(0)
    model = _Checkpointed(reentrant)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for _ in range(3):
        model(torch.randn(4, 8, requires_grad=reentrant)).pow(2).mean().backward()
        grads.append(model.blocks[0][0].weight.grad.clone())
        opt.step()
        opt.zero_grad()
        if prof is not None:
            prof.step()
    return grads


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_recomputes_layers_in_the_backward(tmp_path: Path, reentrant: bool) -> None:
    """The recomputation that the backward runs was a top-level call of each block, with paths relative to
    it ('0', '2'), and, without reentrancy, stopped by an exception PyTorch passes to the profiler's hook
    without the keyword arguments it was registered with: the hook failed with a warning to the program, and
    every later layer span nested under the call it never ended."""
    import warnings

    plain = _checkpointed_training(reentrant)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with xstack.profile(levels="model,layer", path=tmp_path / "p.duckdb") as prof:
            profiled = _checkpointed_training(reentrant, prof)
    assert [str(w.message) for w in caught if "hook" in str(w.message)] == []
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled, strict=True))
    spans = _spans(prof)
    by_id = {s["span_id"]: s for s in spans}
    layers = [s for s in spans if s["level"] == "layer"]
    forward = {s["name"] for s in layers if "layer.recomputed" not in s["attrs"]}
    recomputed = [s for s in layers if s["attrs"].get("layer.recomputed") is True]
    blocks = {f"blocks.{i}{p}" for i in (0, 1) for p in ("", ".0", ".1", ".2", ".3")}
    assert forward == {"_Checkpointed", "head"} | blocks
    assert {s["name"] for s in recomputed} <= blocks and {"blocks.0", "blocks.1", "blocks.0.0"} <= {
        s["name"] for s in recomputed
    }
    for s in recomputed:  # in the step's backward stage, outside the model's forward: under no layer of it
        parent = by_id[s["parent_id"]]
        assert (
            parent["level"] == "model"
            and parent["attrs"].get("model.kind") == "backward"
            and by_id[parent["parent_id"]]["attrs"].get("model.kind") == "step"
            or (parent["level"] == "layer" and "layer.recomputed" in parent["attrs"])
        ), (s["name"], parent["name"])
    top = [s for s in recomputed if by_id[s["parent_id"]]["level"] == "model"]
    assert sorted(s["name"] for s in top) == ["blocks.0"] * 3 + ["blocks.1"] * 3
    assert [s["attrs"]["layer.call_index"] for s in top if s["name"] == "blocks.0"] == [1, 1, 1]
    stages = [s["name"] for s in spans if s["level"] == "model" and s["attrs"].get("model.kind") == "forward"]
    assert stages == ["_Checkpointed"] * 3  # the recomputations are no forward of the model
    # one backward a step: the reentrant checkpoint's own backward of each block is part of it
    assert [s["name"] for s in spans if s["attrs"].get("model.kind") == "backward"] == ["backward"] * 3
    # the summary counts those of the measured steps (the first step is the warm-up) and says so under its layers
    from xstack.analyze._diff_read import read_side
    from xstack.analyze.summary import summarize
    from xstack.report.terminal import top_caption

    with prof.open() as store:
        summary = summarize(store)
        layers = read_side(store, 1).layers  # xstack diff's: a recomputation is a call of its own, typed so
    assert (layers[("blocks.0", 0)].info, layers[("blocks.0", 1)].info) == ("Sequential", "Sequential (recomputed)")
    measured = [s for s in top if by_id[by_id[s["parent_id"]]["parent_id"]]["name"] != "step#0"]
    assert summary.recomputed == (4, sum(s["dur_ns"] for s in measured))
    caption = top_caption(summary, "layer")
    assert caption is not None and caption.startswith("4 calls (") and "recomputed in the backward" in caption


def test_the_model_level_alone_sees_no_forward_in_a_checkpointed_backward(tmp_path: Path) -> None:
    with xstack.profile(levels="model", path=tmp_path / "p.duckdb") as prof:
        _checkpointed_training(False, prof)
    stages = [s["name"] for s in _spans(prof) if s["attrs"].get("model.kind") == "forward"]
    assert stages == ["_Checkpointed"] * 3


def test_a_forward_that_raises_and_is_caught_ends_its_layer_span(tmp_path: Path) -> None:
    """A model called by keyword raises; the program catches it and goes on: the next call is no child of it."""

    class Picky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, *, x: Any) -> Any:
            y = self.fc(x)
            if y.shape[0] > 2:
                raise ValueError("too many rows")
            return y

    model = Picky()
    with xstack.profile(levels="model,layer", path=tmp_path / "p.duckdb") as prof:
        with pytest.raises(ValueError, match="too many rows"):
            model(x=torch.randn(3, 4))
        model(x=torch.randn(2, 4))
    spans = sorted((s for s in _spans(prof) if s["level"] == "layer"), key=lambda s: s["start_ns"])
    by_id = {s["span_id"]: s for s in spans}
    assert [(s["name"], by_id.get(s["parent_id"], {}).get("name")) for s in spans] == [
        ("Picky", None), ("fc", "Picky"), ("Picky", None), ("fc", "Picky"),
    ]  # fmt: skip
    assert spans[1]["start_ns"] + spans[1]["dur_ns"] <= spans[2]["start_ns"]


def test_processes_started_with_torch_multiprocessing_are_said_not_profiled(tmp_path: Path) -> None:
    """The DDP tutorial's mp.spawn: the training runs in the processes it starts, which no level follows; the
    run, with nothing in it, said only that the program made no nn.Module call."""
    import torch.multiprocessing as tmp

    original = tmp.start_processes
    with xstack.profile(levels="model,layer", path=tmp_path / "p.duckdb") as prof:
        tmp.start_processes(abs, nprocs=2, start_method="fork")
    assert tmp.start_processes is original and tmp.spawn.__module__ == "torch.multiprocessing.spawn"
    with prof.open() as store:
        [(count, detail)] = store.query("SELECT count, detail FROM health WHERE \"check\" = 'processes_not_profiled'")
        from xstack.analyze.summary import summarize
        from xstack.report.terminal import none_line

        line = none_line(summarize(store), "layer")
    assert count == 2 and "2 processes running abs (fork)" in detail and "torchrun" in detail
    assert line.endswith("no nn.Module call in this process; the processes it started are not profiled: see health)")


def test_spawned_processes_write_beside_the_store_a_scratch_store_is_appended_to(tmp_path: Path) -> None:
    """``xstack run --append`` records into ``STORE.append`` first: the stores of the processes it spawns were
    named ``p.duckdb.rank1.append``, and the io level did not leave them out of the program's I/O."""
    from xstack.collect.io import exclusions
    from xstack.profile import for_ranks

    with xstack.profile("model,layer,io", tmp_path / "p.duckdb.append"):
        ranks = for_ranks(abs, 2, "spawn")
        forked = for_ranks(abs, 2, "fork")
    assert ranks is not None and forked is None
    assert (ranks.store(1), ranks.levels, ranks.world) == (tmp_path / "p.rank1.duckdb", ("model", "layer"), 2)
    assert str((tmp_path / "p.rank1").resolve()) in exclusions(tmp_path / "p.duckdb.append")
    assert ranks.append  # the processes' runs are added to their stores too


def _three_optimizer_steps(rank: int) -> None:
    import torch

    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(3):
        net(torch.ones(1, 2)).sum().backward()
        opt.step()


def test_spawned_processes_of_xstack_run_have_their_optimizer_steps_end_iterations_as_it_does(
    tmp_path: Path,
) -> None:
    """Under ``xstack run`` an optimizer's steps end the iterations of a program that never calls xstack.step();
    the processes it spawns (the DDP tutorial's, which never do) are profiled alike, ``xstack.profile``'s not."""
    from xstack.profile import Profile, RankProfile, for_ranks
    from xstack.trace.store import Store

    with Profile("model", tmp_path / "run.duckdb", optimizer_steps=True):  # as xstack run profiles
        run = for_ranks(_three_optimizer_steps, 2, "spawn")
    with xstack.profile("model", tmp_path / "api.duckdb"):
        api = for_ranks(_three_optimizer_steps, 2, "spawn")
    assert run is not None and api is not None and run.optimizer_steps and not api.optimizer_steps
    for ranks, steps in ((run, 2), (api, 0)):  # the second call of SGD.step() ends the first iteration
        RankProfile(_three_optimizer_steps, ("model",), ranks.path, "t", 1, 2, optimizer_steps=ranks.optimizer_steps)(0)
        with Store.open(ranks.store(0)) as store:
            kinds = store.query("SELECT count(*) FROM spans WHERE attrs->>'$.\"model.kind\"' = 'step'")
        assert kinds == [(steps,)]


def test_spawned_processes_add_their_runs_to_their_stores_when_the_run_appends_or_spawns_again(
    tmp_path: Path,
) -> None:
    """The processes of a second ``mp.spawn`` in one run, or of a run appended to its store, replaced the runs
    their stores held (the first spawn's, the earlier runs')."""
    from xstack.profile import RankProfile, for_ranks
    from xstack.trace.store import Store

    with xstack.profile("model", tmp_path / "p.duckdb"):
        first, again = for_ranks(abs, 2, "spawn"), for_ranks(abs, 2, "spawn", again=True)
    assert first is not None and again is not None and not first.append and again.append

    def runs() -> list[int]:
        with Store.open(tmp_path / "p.rank1.duckdb") as store:
            return [r for (r,) in store.query("SELECT run_id FROM runs ORDER BY 1")]

    for append, expected in ((False, [1]), (True, [1, 2]), (True, [1, 2, 3]), (False, [1])):
        assert RankProfile(abs, ("model",), str(tmp_path / "p.duckdb"), "t", 1, 2, append=append)(1) == 1
        assert runs() == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.duckdb", "p.rank1.duckdb"]  # no scratch store left


def test_layer_shares_past_the_step_from_concurrent_threads_are_said_to_be_so(tmp_path: Path) -> None:
    """A server's two threads run the model at once in each step: the model's calls add up to more than the
    steps' time, a share over 100% that the summary showed unexplained. One thread's stay within the steps."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from xstack.analyze.summary import summarize
    from xstack.report.terminal import top_caption

    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).eval()

    def captioned(threads: int) -> tuple[Any, str]:
        ready = threading.Barrier(threads)

        def serve(_: int) -> None:
            ready.wait()  # every thread in the model at once
            with torch.inference_mode():
                for _ in range(20):
                    model(torch.randn(64, 256))

        path = tmp_path / f"t{threads}.duckdb"
        with ThreadPoolExecutor(threads) as pool, xstack.profile(levels="model,layer", path=path) as prof:
            for _ in range(4):
                list(pool.map(serve, range(threads)))
                prof.step()
        with prof.open() as store:
            summary = summarize(store)
        return next(r for r in summary.top["layer"] if r.name == "Sequential"), top_caption(summary, "layer") or ""

    root, caption = captioned(2)
    assert (root.pct or 0) > 100, root
    assert (
        caption.startswith(f"Sequential {root.pct:.0f}%") and ": calls that ran on several threads at once" in caption
    )
    root, caption = captioned(1)
    assert (root.pct or 0) <= 100 and "several threads" not in caption
