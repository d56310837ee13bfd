"""``layers.backward``: a training step's backward nodes charged to the layers whose forward made them, on real
PyTorch runs, checked against the order in which autograd runs them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import xstack  # noqa: E402
from xstack.analyze.pipeline import run_analyses  # noqa: E402
from xstack.trace.store import Store  # noqa: E402

NODE = "autograd::engine::evaluate_function: "


def _model() -> Any:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))


def _train(path: Path, steps: int = 4) -> Path:
    model, x, y = _model(), torch.randn(32, 64), torch.randn(32, 8)
    with xstack.profile(levels="model,layer,op", path=path) as prof:
        for _ in range(steps):
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            prof.step()
    return path


def _nodes(store: Store, run_id: int) -> list[list[tuple[str, int]]]:
    """The backward nodes of each measured iteration, in the order autograd ran them: (node, duration)."""
    steps = store.query(
        "SELECT start_ns, start_ns + dur_ns FROM spans WHERE run_id = ? AND level = 'model' "
        "AND attrs->>'$.\"model.kind\"' = 'step' ORDER BY 1",
        [run_id],
    )[1:]  # the first is the warm-up
    out = []
    for s, e in steps:
        rows = store.query(
            "SELECT name, dur_ns FROM spans WHERE run_id = ? AND level = 'op' AND starts_with(name, ?) "
            "AND start_ns >= ? AND start_ns < ? ORDER BY start_ns",
            [run_id, NODE, s, e],
        )
        out.append([(str(n)[len(NODE) :], int(d)) for n, d in rows])
    return out


def test_each_linear_gets_the_backward_nodes_its_forward_made(tmp_path: Path) -> None:
    path = _train(tmp_path / "t.duckdb")
    with xstack.open_store(path) as store:
        result = run_analyses(store, 1, ["layers.backward"])[0]
        iterations = _nodes(store, 1)
    assert result.available, result.labels
    # autograd runs the second Linear's nodes (AddmmBackward0, TBackward0) before ReLU's and the first Linear's
    # after it; AccumulateGrad (into the parameters) and the loss's node belong to no layer
    expected: dict[str, int] = {"0": 0, "1": 0, "2": 0}
    other = 0
    for nodes in iterations:
        relu = [i for i, (n, _) in enumerate(nodes) if n == "ReluBackward0"]
        assert len(relu) == 1 and [n for n, _ in nodes].count("AddmmBackward0") == 2, nodes
        for i, (name, dur) in enumerate(nodes):
            if name in ("AddmmBackward0", "TBackward0"):
                expected["2" if i < relu[0] else "0"] += dur
            elif name == "ReluBackward0":
                expected["1"] += dur
            else:
                assert name in ("torch::autograd::AccumulateGrad", "MseLossBackward0"), name
                other += dur
    rows = {r["path"]: r for r in result.to_records()}
    for path_, ns in expected.items():
        assert rows[path_]["backward self"] == rows[path_]["backward"] == ns, path_
        assert rows[path_]["calls"] == len(iterations)
    root = next(r for p, r in rows.items() if p not in expected)
    assert root["backward"] == sum(expected.values()) and root["backward self"] == 0
    assert result.facts["backward_ns"] == sum(expected.values()) + other
    assert result.facts["attributed_ns"] == sum(expected.values())
    assert {u["node"] for u in result.facts["unattributed"]} == {"torch::autograd::AccumulateGrad", "MseLossBackward0"}
    assert result.facts["nodes"] == sum(len(n) for n in iterations)


def test_a_merged_run_charges_every_node_made_in_a_layer(tmp_path: Path) -> None:
    # the merged layout takes the forward from one pass and the backward from another: a node may be laid out
    # before the forward op that made it, and is still that op's. Here the layer pass times the root layer with
    # the hooks of 300 sub-layers the model pass's forward lacks: the last Linear's ops run on past the forward,
    # into the backward laid out after it
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Sequential(*[nn.Identity() for _ in range(300)]),
                          nn.Linear(128, 8))  # fmt: skip
    x, y = torch.randn(32, 64), torch.randn(32, 8)

    def step() -> None:
        nn.functional.mse_loss(model(x), y).backward()

    path = xstack.measure(step, passes=["model", "model,layer", "model,layer,op"], warmup=2, iters=5,
                          path=tmp_path / "m.duckdb", progress=False)  # fmt: skip
    with xstack.open_store(path) as store:
        merged = int(store.query("SELECT run_id FROM runs WHERE pass = 'merged'")[0][0])
        result = run_analyses(store, merged, ["layers.backward"])[0]
    assert {u["node"] for u in result.facts["unattributed"]} == {"torch::autograd::AccumulateGrad", "MseLossBackward0"}
    charged = {r["path"]: r["backward self"] for r in result.to_records()}
    assert charged["0"] > 0 and charged["1"] > 0 and charged["3"] > 0
    assert result.facts["attributed_ns"] == sum(r["backward self"] for r in result.to_records())
    assert any("op pass" in label for label in result.labels)


def test_an_inference_run_has_no_backward_to_charge(tmp_path: Path) -> None:
    model, x = _model(), torch.randn(32, 64)
    with xstack.profile(levels="model,layer,op", path=tmp_path / "i.duckdb") as prof, torch.no_grad():
        for _ in range(3):
            model(x)
            prof.step()
    with xstack.open_store(tmp_path / "i.duckdb") as store:
        result = run_analyses(store, 1, ["layers.backward"])[0]
    assert result.missing == ["backward"] and "training step" in result.hint


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointed_blocks_keep_their_backward_and_their_recomputation_is_no_forward(
    tmp_path: Path, reentrant: bool
) -> None:
    from torch.utils.checkpoint import checkpoint

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(
                [nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)) for _ in range(2)]
            )

        def forward(self, h: Any) -> Any:
            for block in self.blocks:
                h = checkpoint(block, h, use_reentrant=reentrant)
            return h

    torch.manual_seed(0)
    net, x, steps = Net(), torch.randn(16, 64, requires_grad=True), 4
    with xstack.profile(levels="model,layer,op", path=tmp_path / "c.duckdb") as prof:
        for _ in range(steps):
            net(x).sum().backward()
            prof.step()
    with xstack.open_store(tmp_path / "c.duckdb") as store:
        result = run_analyses(store, 1, ["layers.backward"])[0]
        measured = store.query(
            "SELECT start_ns, start_ns + dur_ns FROM spans WHERE run_id = 1 AND level = 'model' "
            "AND attrs->>'$.\"model.kind\"' = 'step' ORDER BY 1"
        )[1:]
        nodes = store.query(
            "SELECT tid, start_ns, start_ns + dur_ns FROM spans WHERE run_id = 1 AND level = 'op' "
            "AND starts_with(name, ?)",
            [NODE],
        )
    # the backward pass's time: its outermost nodes' (those no other node on their thread holds)
    in_steps = [n for n in nodes if any(s <= n[1] < e for s, e in measured)]
    outermost = [
        n for n in in_steps if not any(o is not n and o[0] == n[0] and o[1] <= n[1] and n[2] <= o[2] for o in in_steps)
    ]
    assert result.facts["backward_ns"] == sum(e - s for _, s, e in outermost)
    rows = {r["path"]: r for r in result.to_records()}
    for path_ in ("blocks.0.0", "blocks.0.2", "blocks.1.0", "blocks.1.2"):
        # one forward call per iteration: the recomputation runs in the backward pass, and is no forward call
        assert rows[path_]["calls"] == steps - 1
        assert rows[path_]["backward self"] > 0  # a re-entrant block's nodes run inside its checkpoint's node
    assert any("recomputed" in label for label in result.labels)


def test_the_summary_s_top_layers_show_their_backward(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from xstack.analyze.summary import summarize
    from xstack.report.terminal import print_summary

    path = _train(tmp_path / "t.duckdb")
    model, x = _model(), torch.randn(32, 64)
    with xstack.profile(levels="model,layer,op", path=tmp_path / "i.duckdb") as prof, torch.no_grad():
        for _ in range(3):
            model(x)
            prof.step()
    with xstack.open_store(path) as store:
        summary = summarize(store, 1)
        charged = {r["path"]: r["backward"] for r in run_analyses(store, 1, ["layers.backward"])[0].to_records()}
    with xstack.open_store(tmp_path / "i.duckdb") as store:
        inference = summarize(store, 1)
    assert {r.name: r.backward_ns for r in summary.top["layer"]} == charged
    assert all(r.backward_ns is None for r in inference.top["layer"])
    out = io.StringIO()
    print_summary(summary, Console(file=out, width=200))
    header = next(line for line in out.getvalue().splitlines() if "calls" in line and "total" in line)
    assert "backward" in header and "layers.backward" in out.getvalue()
    out = io.StringIO()
    print_summary(inference, Console(file=out, width=200))
    header = next(line for line in out.getvalue().splitlines() if "calls" in line and "total" in line)
    assert "backward" not in header and "layers.backward" not in out.getvalue()


def test_the_diff_keys_the_backward_s_ops_by_the_layer_they_are_charged_to(tmp_path: Path) -> None:
    from xstack.analyze.diff import diff_profiles

    a, b = _train(tmp_path / "a.duckdb"), _train(tmp_path / "b.duckdb")
    ops = diff_profiles(a, b).result("diff.ops").to_records()
    keyed: dict[str, set[str]] = {}
    for r in ops:
        keyed.setdefault(r["layer"], set()).add(r["op"])
    # one program twice: every key met in both (a tiny op may still come out slower on a loaded machine)
    assert not {r["status"] for r in ops} & {"added", "removed"}
    for path_ in ("0 (backward)", "2 (backward)"):
        assert {NODE + "AddmmBackward0", "AddmmBackward0", NODE + "TBackward0"} <= keyed[path_], keyed[path_]
    assert NODE + "ReluBackward0" in keyed["1 (backward)"]
    # the nodes no layer made, by the model stage they run in; the loss, computed in no stage, by the step
    outside = {n for n in keyed.get("(in backward)", set()) if n.startswith(NODE)}
    assert outside == {NODE + "torch::autograd::AccumulateGrad", NODE + "MseLossBackward0"}
    assert "aten::mse_loss" in keyed["(outside layers)"] and not any(
        n.startswith(NODE) for n in keyed["(outside layers)"]
    )


def test_of_the_forward_ops_that_share_a_node_s_sequence_number_the_one_it_names_made_it(tmp_path: Path) -> None:
    # a merged run lays out each pass on its own: here the root's aten::view, which carries the same sequence
    # number as the loss's aten::_log_softmax (it made no node), lies after it; the node is still the loss's
    from xstack.trace import attrs as A
    from xstack.trace.sink import Sink
    from xstack.trace.store import RunInfo

    path = tmp_path / "s.duckdb"
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "merged", levels=["model", "layer", "op"], pass_name="merged"))
        sink = Sink(store, 1)
        seq = {A.OP_SEQUENCE_NUMBER: 7}
        sink.span(1, None, "model", "step", 0, 10_000_000, 1, 1, {A.MODEL_KIND: "step"})
        sink.span(2, 1, "layer", "Net", 0, 5_000_000, 1, 1, {A.LAYER_PATH: "Net", A.LAYER_TYPE: "Net"})
        sink.span(3, 2, "layer", "loss", 1_000_000, 1_000_000, 1, 1,
                  {A.LAYER_PATH: "loss", A.LAYER_TYPE: "CrossEntropyLoss"})  # fmt: skip
        sink.span(4, 3, "op", "aten::_log_softmax", 1_100_000, 200_000, 1, 1, seq)
        sink.span(5, 2, "op", "aten::view", 3_000_000, 10_000, 1, 1, seq)
        sink.span(6, 1, "model", "backward", 6_000_000, 3_000_000, 1, 1, {A.MODEL_KIND: "backward"})
        sink.span(7, 6, "op", NODE + "LogSoftmaxBackward0", 6_500_000, 100_000, 1, 1, seq)
        sink.close()
    with xstack.open_store(path) as store:
        rows = {r["path"]: r for r in run_analyses(store, 1, ["layers.backward"])[0].to_records()}
    assert (rows["loss"]["backward self"], rows["Net"]["backward self"], rows["Net"]["backward"]) == (
        100_000,
        0,
        100_000,
    )


def test_the_diff_keys_ops_outside_layers_by_the_stage_they_run_in(tmp_path: Path) -> None:
    """B adds an ``aten::add_`` in a stage of its own before the optimizer, whose step adds each parameter's
    update with ``aten::add_`` too. Counted in the step, B's extra one took occurrence 0 and moved every one of the
    optimizer's, the last coming out as added; counted in each stage, the extra one alone is added."""
    from xstack.analyze.diff import diff_profiles

    def train(path: Path, extra: bool) -> Path:
        model, x, y = _model(), torch.randn(32, 64), torch.randn(32, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
        seen = torch.zeros(())
        with xstack.profile(levels="model,layer,op", path=path) as prof:
            for _ in range(4):
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                if extra:
                    with xstack.span("metrics"):
                        seen.add_(loss.detach())
                opt.step()
                opt.zero_grad()
                prof.step()
        return path

    rows = diff_profiles(train(tmp_path / "a.duckdb", False), train(tmp_path / "b.duckdb", True))
    ops = rows.result("diff.ops").to_records()
    changed = {(r["layer"], r["op"], r["occurrence"]) for r in ops if r["status"] in ("added", "removed")}
    assert ("(in metrics)", "aten::add_", 0) in changed and {c[0] for c in changed} == {"(in metrics)"}, changed
    params = len(list(_model().parameters()))
    assert {r["occurrence"] for r in ops if r["layer"] == "(in SGD.step)" and r["op"] == "aten::add_"} == set(
        range(params)
    )
