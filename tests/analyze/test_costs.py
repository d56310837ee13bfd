"""Analytic FLOPs and bytes against PyTorch's own FLOP counter, on shapes recorded by a real profile."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

torch = pytest.importorskip("torch")

import xstack  # noqa: E402
from xstack.analyze._costs import op_cost  # noqa: E402
from xstack.analyze.pipeline import run_analyses  # noqa: E402
from xstack.trace.store import Store  # noqa: E402


class Net(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(8 * 8 * 8, 64)
        self.attn = torch.nn.MultiheadAttention(64, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x)).flatten(1)
        h = self.fc(h).reshape(8, 4, 16).repeat(1, 1, 4)
        return self.attn(h, h, h, need_weights=False)[0]


def test_layer_flops_equal_pytorchs_flop_counter(tmp_path: Path) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    model, x = Net().eval(), torch.randn(8, 3, 16, 16)
    with torch.no_grad():
        counter = FlopCounterMode(display=False)
        with counter:
            model(x)
        expected = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
        with xstack.profile(levels="model,layer,op", path=tmp_path / "p.duckdb") as prof:
            model(x)
    with prof.open() as store:
        (a12,) = run_analyses(store, None, ["A12"])
    assert a12.available and any("analytic" in label for label in a12.labels)
    got = {path: flops for path, flops in zip(a12.column("layer"), a12.column("FLOPs"), strict=True)}
    conv = next(v for k, v in got.items() if k.endswith("conv"))
    fc = next(v for k, v in got.items() if k.endswith("fc"))
    assert conv == expected["Net.conv"] == 2 * 8 * (8 * 3 * 3 * 3) * 8 * 8
    assert fc == expected["Net.fc"]


@pytest.mark.parametrize(
    ("name", "shapes", "dtypes", "concrete", "flops"),
    [
        ("aten::mm", [[32, 64], [64, 16]], ["float", "float"], None, 2 * 32 * 64 * 16),
        ("aten::addmm", [[16], [32, 64], [64, 16], [], []], ["float"] * 3 + ["Scalar"] * 2, None, 2 * 32 * 64 * 16),
        ("aten::bmm", [[4, 32, 64], [4, 64, 16]], ["c10::Half"] * 2, None, 2 * 4 * 32 * 64 * 16),
        ("aten::linear", [[2, 10, 64], [16, 64], [16]], ["float"] * 3, None, 2 * 20 * 64 * 16),
        ("aten::linear", [[64], [16, 64], [16]], ["float"] * 3, None, 2 * 64 * 16),  # one vector
        (
            "aten::conv2d",
            [[4, 3, 224, 224], [768, 3, 16, 16], [768], [], [], [], []],
            ["c10::BFloat16"] * 3,
            ["", "", "", "[16, 16]", "[0, 0]", "[1, 1]", "1"],
            2 * 4 * 768 * 3 * 16 * 16 * 14 * 14,
        ),
        (
            "aten::scaled_dot_product_attention",
            [[2, 8, 128, 64]] * 3,
            ["c10::BFloat16"] * 3,
            None,
            4 * 2 * 8 * 128 * 128 * 64,
        ),
    ],
)
def test_flop_formulas_match_pytorchs_counter(
    name: str, shapes: list, dtypes: list, concrete: list | None, flops: int
) -> None:  # type: ignore[type-arg]
    cost = op_cost(name, shapes, dtypes, concrete)
    assert cost is not None and cost.flops == flops


def test_bytes_are_inputs_read_and_output_written() -> None:
    cost = op_cost("aten::mm", [[32, 64], [64, 16]], ["float", "float"])
    assert cost is not None and (cost.read_bytes, cost.write_bytes, cost.precision) == (
        4 * (32 * 64 + 64 * 16),
        4 * 32 * 16,
        "fp32",
    )
    gather = op_cost("aten::embedding", [[30522, 512], [1, 141], [], [], []], ["c10::BFloat16", "long int"])
    assert gather is not None and gather.flops == 0 and gather.read_bytes == 141 * 8 + 141 * 512 * 2
    assert op_cost("aten::view", [[2, 3], []], ["float", "ScalarList"]) is not None  # bytes only, FLOPs unknown
    assert op_cost("aten::add", "not a list", []) is None


def test_per_layer_call_tables_say_which_iteration_holds_each_call(tmp_path: Path) -> None:
    """Three iterations of the same model make A12 and A14 list each layer three times: the rows say which
    iteration each call ran in, and mark the warm-up's as A2 does."""
    model, x = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval(), torch.randn(2, 16)
    with torch.no_grad(), xstack.profile(levels="model,layer,op", path=tmp_path / "p.duckdb") as prof:
        for _ in range(3):
            model(x)
            prof.step()
    with prof.open() as store:
        a2, a12, a14 = run_analyses(store, None, ["A2", "A12", "A14"])
    for r in (a12, a14):
        names = [c.name for c in r.columns]
        assert names[0] == "iteration" and names[-1] == "warm-up", r.id
        assert r.column("iteration") == [1, 1, 2, 2, 3, 3], r.id
        assert r.column("warm-up") == ["yes", "yes", "", "", "", ""], r.id
        assert r.column("layer") == ["0", "1"] * 3, r.id
    # the same calls A2 marks (A2 also lists the Sequential, which does no work of its own)
    assert [w for w, t in zip(a2.column("warm-up"), a2.column("type"), strict=True) if t != "Sequential"] == (
        a12.column("warm-up")
    )
    assert [i for i, t in zip(a2.column("iteration"), a2.column("type"), strict=True) if t != "Sequential"] == (
        a12.column("iteration")
    )
    assert a12.chart is not None and a12.chart.extra["mark"] == "warm-up"


TRAIN = """
import torch, xstack
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randn(32, 10)
for _ in range(3):
    loss = torch.nn.functional.mse_loss(torch.relu(model(x)), y)  # the relu and the loss: outside any layer
    opt.zero_grad()
    loss.backward()
    opt.step()
    xstack.step()
print(float((x @ x.T).sum()))  # after the last step
"""


def test_ops_outside_any_layer_are_split_by_iteration(tmp_path: Path) -> None:
    """A training loop run by ``xstack run``: the ops outside any layer (the loss, the backward pass, the
    optimizer) get a row per iteration in A12 and A14, as the layer calls do, the warm-up's marked, and the ops
    after the last step one of their own; one row summed them over the whole run, three iterations and the
    tail, beside layer rows of one call each."""
    (tmp_path / "train.py").write_text(TRAIN)
    command = [sys.executable, "-m", "xstack", "run", "--levels", "model,layer,op", "-o", "p.duckdb", "--", "python",
               "train.py"]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with Store.open(tmp_path / "p.duckdb") as store:
        a12, a14 = run_analyses(store, None, ["A12", "A14"])
    for r in (a12, a14):
        outside = [(row[0], row[1], row[-1]) for row in r.rows if row[1].startswith("(outside")]
        assert outside == [
            (1, "(outside any layer)", "yes"),
            (2, "(outside any layer)", ""),
            (3, "(outside any layer)", ""),
            (None, "(outside any layer and step)", ""),
        ], r.id
        assert r.column("layer") == ["0", "1", "2", "(outside any layer)"] * 3 + ["(outside any layer and step)"]
        flops = [f for f, layer in zip(r.column("FLOPs"), r.column("layer"), strict=True) if layer.startswith("(o")]
        # every iteration does the same work; the tail does the matmul, then sums its 32 x 32 elements
        assert flops[0] == flops[1] == flops[2] > 0 and flops[3] == 2 * 32 * 64 * 32 + 32 * 32, r.id


class Residual(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x)


def test_cpu_layer_roofline_times_a_layer_by_its_self_time(tmp_path: Path) -> None:
    """A14 on a CPU run counts a layer's own ops (the residual add, not its Linear's matmul), so its FLOP/s are
    over the time it ran outside its sub-layers, not over a latency that holds the Linear's time too."""
    model, x = Residual().eval(), torch.randn(16, 64)
    with torch.no_grad(), xstack.profile(levels="model,layer,op", path=tmp_path / "p.duckdb") as prof:
        model(x)
    with prof.open() as store:
        a2, a14 = run_analyses(store, None, ["A2", "A14"])
    a2_rows = {
        p: (lat, own) for p, lat, own in zip(a2.column("path"), a2.column("latency"), a2.column("self"), strict=True)
    }
    a14_rows = {p: (t, f, r) for p, t, f, r in zip(a14.column("layer"), a14.column("time"), a14.column("FLOPs"),
                                                    a14.column("FLOP/s"), strict=True)}  # fmt: skip
    latency, own = a2_rows["Residual"]
    time_ns, flops, flops_per_s = a14_rows["Residual"]
    assert flops == 16 * 64  # the add alone
    assert own < latency and time_ns == own
    assert flops_per_s == pytest.approx(flops * 1e9 / own)
    assert a14_rows["fc"][0] == a2_rows["fc"][0]  # a leaf's self time is its latency
    assert any("self time" in label for label in a14.labels)


def test_a_pooling_layer_reads_its_whole_input(tmp_path: Path) -> None:
    """AdaptiveAvgPool2d reduces its input by a mean: without a formula for it, the division the mean ends with
    was costed instead, 128 FLOPs and 512 B read for a pool over 512 KiB."""
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()).eval()
    x = torch.randn(4, 32, 32, 32)
    with torch.no_grad(), xstack.profile(levels="model,layer,op", path=tmp_path / "p.duckdb") as prof:
        model(x)
        x.mean(dim=(-1, -2)).sum(1, keepdim=True)
    with prof.open() as store:
        (a12,) = run_analyses(store, None, ["A12"])
    rows = {r[0]: r for r in zip(*(a12.column(c) for c in ("layer", "FLOPs", "DRAM read", "DRAM write")), strict=True)}
    assert rows["0"][1:] == (x.numel(), x.numel() * 4, 4 * 32 * 4)
    outside = rows["(outside any layer)"]  # the mean over the last two dims, then a sum of its 128 values
    assert outside[1:] == (x.numel() + 4 * 32, x.numel() * 4 + 4 * 32 * 4, 4 * 32 * 4 + 4 * 4)


@pytest.mark.parametrize(
    ("name", "shapes", "concrete", "write"),
    [
        ("aten::adaptive_max_pool1d", [[2, 3, 10], []], ["", "[5]"], 2 * 3 * 5),
        ("aten::adaptive_avg_pool3d", [[2, 3, 4, 4, 4], []], ["", "[2]"], 2 * 3 * 8),
        ("aten::sum", [[6, 7], [], [], []], ["", "[]", "False", ""], 1),
        ("aten::amax", [[6, 7, 8], [], []], ["", "[0, 2]", "True"], 7),
    ],
)
def test_reductions_write_what_they_keep(name: str, shapes: list, concrete: list, write: int) -> None:  # type: ignore[type-arg]
    cost = op_cost(name, shapes, ["float"], concrete)
    assert cost is not None and cost.flops == math.prod(shapes[0]) and cost.write_bytes == 4 * write
    assert op_cost("aten::amax", [[6, 7], []], ["float", ""], ["", ""]) is None  # dims not recorded


@pytest.mark.parametrize("name", ["aten::sum", "aten::mean"])
@pytest.mark.parametrize("dtype", ["", "6"])  # x.sum(), x.sum(dtype=torch.float32): every element, no dims
def test_a_reduction_over_every_element_is_costed(name: str, dtype: str) -> None:
    cost = op_cost(name, [[6, 7], []], ["float", "ScalarType" if dtype else ""], ["", dtype])
    assert cost is not None and (cost.flops, cost.read_bytes, cost.write_bytes) == (42, 42 * 4, 4)


def test_a_sum_after_the_loop_adds_its_flops_to_the_matmul_it_reduces(tmp_path: Path) -> None:
    """``(x @ w).sum()`` after the last step(), profiled by ``xstack run``: the sum reads the product's 32 x 64
    elements, one add each; it was recorded as ``aten::sum(self, dtype)``, without dims, and costed nothing."""
    (tmp_path / "prog.py").write_text(
        "import torch, xstack\n"
        "m = torch.nn.Linear(8, 8)\n"
        "for _ in range(3):\n"
        "    m(torch.randn(4, 8))\n"
        "    xstack.step()\n"
        "x, w = torch.randn(32, 32), torch.randn(32, 64)\n"
        "(x @ w).sum()\n"
    )
    argv = ["run", "--levels", "model,layer,op", "-o", "s.duckdb", "--", sys.executable, "prog.py"]
    done = subprocess.run([sys.executable, "-m", "xstack", *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Store.open(tmp_path / "s.duckdb") as store:
        (a12,) = run_analyses(store, None, ["A12"])
    rows = dict(zip(a12.column("layer"), zip(a12.column("FLOPs"), a12.column("DRAM read"), strict=True), strict=True))
    matmul, total = 2 * 32 * 32 * 64, 32 * 64
    assert rows["(outside any layer and step)"] == (matmul + total, (32 * 32 + 32 * 64) * 4 + total * 4)


@pytest.mark.parametrize(
    ("name", "shapes", "concrete", "write"),
    [
        ("aten::max", [[6, 7]], [""], 1),  # x.max()
        ("aten::min", [[6, 7], [], []], ["", "1", "False"], 6),  # x.min(dim=1): values (and indices)
        ("aten::argmax", [[6, 7], [], []], ["", "", "False"], 1),  # x.argmax(): dim None
        ("aten::argmin", [[6, 7], [], []], ["", "-2", "False"], 7),
        ("aten::prod", [[6, 7], []], ["", ""], 1),  # x.prod()
        ("aten::prod", [[6, 7], [], [], []], ["", "0", "False", ""], 7),
    ],
)
def test_reductions_over_one_dim_or_every_element(name: str, shapes: list, concrete: list, write: int) -> None:  # type: ignore[type-arg]
    cost = op_cost(name, shapes, ["float"], concrete)
    assert cost is not None and (cost.flops, cost.read_bytes, cost.write_bytes) == (42, 42 * 4, 4 * write)


def test_max_of_two_tensors_is_elementwise() -> None:
    for name in ("aten::max", "aten::maximum", "aten::minimum"):
        cost = op_cost(name, [[6, 7], [6, 7]], ["float", "float"], ["", ""])
        assert cost is not None and (cost.flops, cost.read_bytes, cost.write_bytes) == (42, 2 * 42 * 4, 42 * 4)
    assert op_cost("aten::max", [[6, 7], [], []], ["float"], ["", "9", "False"]) is None  # no such dim


def test_max_argmax_and_prod_of_a_live_run_are_costed(tmp_path: Path) -> None:
    x, y, layer = torch.randn(32, 64), torch.randn(32, 64), torch.nn.Identity()
    with torch.no_grad(), xstack.profile(levels="model,layer,op", path=tmp_path / "p.duckdb") as prof:
        layer(x)
        x.max(), x.argmax(dim=1), torch.max(x, y), x.prod()
    with prof.open() as store:
        (a12,) = run_analyses(store, None, ["A12"])
    (outside,) = [f for layer, f in zip(a12.column("layer"), a12.column("FLOPs"), strict=True) if "outside" in layer]
    assert outside == 4 * x.numel()  # one compare (or multiply) per element each


def _weights(module: torch.nn.Module) -> int:
    """The elements of a recurrent module's weight matrices (its biases left out)."""
    return sum(p.numel() for p in module.parameters() if p.dim() == 2)


@pytest.mark.parametrize(
    ("module", "x", "tokens"),
    [
        (torch.nn.LSTM(16, 32, num_layers=2, batch_first=True), (3, 5, 16), 15),  # oneDNN's layers on a CPU
        (torch.nn.LSTM(16, 32, num_layers=2, bidirectional=True, proj_size=8), (5, 3, 16), 15),
        (torch.nn.GRU(16, 32, batch_first=True), (3, 5, 16), 15),
        (torch.nn.RNN(16, 32, nonlinearity="relu"), (5, 3, 16), 15),
        (torch.nn.RNN(16, 32), (5, 16), 5),  # unbatched
        (torch.nn.LSTMCell(16, 32), (3, 16), 3),
        (torch.nn.GRUCell(16, 32), (3, 16), 3),
        (torch.nn.RNNCell(16, 32), (3, 16), 3),
    ],
    ids=["lstm", "lstm-bidirectional-proj", "gru", "rnn-relu", "rnn-unbatched", "lstm-cell", "gru-cell", "rnn-cell"],
)
def test_a_recurrent_layer_counts_its_weight_products(
    tmp_path: Path, module: torch.nn.Module, x: tuple[int, ...], tokens: int
) -> None:
    """An LSTM's ``aten::lstm`` had no formula: its layer showed the 2 KFLOP of a few element-wise ops inside it,
    and the roofline put it at 0.0002 FLOP/byte. Each token goes through every layer's and direction's weight
    matrices once: 2 FLOPs per weight element and token."""
    with torch.no_grad(), xstack.profile(levels="model,layer,op", path=tmp_path / "p.duckdb") as prof:
        module(torch.randn(*x))
    with prof.open() as store:
        a12, a14 = run_analyses(store, None, ["A12", "A14"])
    assert a12.column("FLOPs") == [2 * tokens * _weights(module)]
    assert a14.column("FLOPs") == a12.column("FLOPs") and a14.column("AI")[0] > 1
    assert all("unknown" not in label for label in a12.labels)


def test_a_packed_sequence_counts_its_rows_and_the_backward_twice_the_products(tmp_path: Path) -> None:
    """A packed sequence's tokens are its rows (11 here, not 5 x 3); the backward of a CPU LSTM layer (oneDNN)
    computes the input's and the weights' gradients: twice the forward's products."""
    from torch.nn.utils.rnn import pack_padded_sequence

    lstm = torch.nn.LSTM(16, 32)
    with xstack.profile(levels="model,layer,op", path=tmp_path / "p.duckdb") as prof:
        out, _ = lstm(pack_padded_sequence(torch.randn(5, 3, 16), [5, 4, 2]))
        out.data.sum().backward()
    with prof.open() as store:
        (a12,) = run_analyses(store, None, ["A12"])
        names = {n for (n,) in store.query("SELECT DISTINCT name FROM spans WHERE level = 'op'")}
    got = dict(zip(a12.column("layer"), a12.column("FLOPs"), strict=True))
    assert got["LSTM"] == 2 * 11 * _weights(lstm)
    backward = op_cost(
        "aten::mkldnn_rnn_layer_backward",
        [[64, 32, 256], [1024, 256], [1024, 256], [1024], [1024], [32, 256], [32, 256], [64, 32, 256]],
        ["c10::BFloat16"] * 8,
    )  # shapes as a bf16 training step of a 256-wide LSTM recorded them
    assert backward is not None and backward.flops == 4 * 64 * 32 * (2 * 1024 * 256)
    if "aten::mkldnn_rnn_layer_backward" in names:  # this build ran the layer on oneDNN
        assert got["(outside any layer)"] >= 2 * got["LSTM"]


class SlowTail(torch.nn.Module):  # type: ignore[misc]
    """A layer whose work is an op with no formula (a cumulative sum over 4 M elements) beside a costed one on
    four elements."""

    def forward(self, x: torch.Tensor, big: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + torch.cumsum(big, 0)[:4]


class TailThenLinear(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.tail, self.fc = SlowTail(), torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, big: torch.Tensor) -> torch.Tensor:
        return self.fc(self.tail(x, big))


def test_a_layer_whose_work_has_no_formula_has_unknown_flops(tmp_path: Path) -> None:
    """Counting a layer's costed ops alone would show the relu's 4 FLOPs as the layer's work: its FLOPs and
    bytes are unknown, said in a label that names the op, and it is left off the roofline; a layer beside it
    whose ops all have a formula keeps its counts."""
    model, x, big = TailThenLinear(), torch.randn(4), torch.randn(4_000_000)
    with torch.no_grad(), xstack.profile(levels="model,layer,op", path=tmp_path / "p.duckdb") as prof:
        model(x, big)
    with prof.open() as store:
        a12, a14 = run_analyses(store, None, ["A12", "A14"])
    got = dict(zip(a12.column("layer"), a12.column("FLOPs"), strict=True))
    assert got == {"tail": None, "fc": 2 * 4 * 4}, got
    assert a14.column("layer") == ["fc"]
    for r in (a12, a14):
        (label,) = [lb for lb in r.labels if "unknown for" in lb]
        assert "1 layer call (tail)" in label and "aten::cumsum" in label, label


@pytest.mark.parametrize(
    ("conv", "x"),
    [
        (torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), (2, 3, 16, 16)),
        (torch.nn.Conv1d(4, 6, 5, padding="same"), (2, 4, 32)),
        (torch.nn.Conv2d(8, 8, 3, padding="valid", bias=False), (1, 8, 12, 12)),
        (torch.nn.ConvTranspose2d(8, 3, 4, stride=2, padding=1), (2, 8, 8, 8)),
    ],
    ids=["strided", "same", "valid-no-bias", "transposed"],
)
def test_convolutions_and_their_backward_match_pytorchs_counter(
    tmp_path: Path, conv: torch.nn.Module, x: tuple[int, ...]
) -> None:
    """A CNN's training step spends most of its FLOPs in ``aten::convolution_backward``, which had no formula: the
    backward pass outside the layers counted none of them. A transposed convolution's FLOPs were counted over the
    positions of an output it does not have, and padding="same" as no padding."""
    from torch.utils.flop_counter import FlopCounterMode

    inputs = torch.randn(*x, requires_grad=True)
    counter = FlopCounterMode(display=False)
    with counter:
        conv(inputs).sum().backward()
    expected = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    with xstack.profile(levels="model,layer,op", path=tmp_path / "p.duckdb") as prof:
        conv(inputs).sum().backward()
    with prof.open() as store:
        recorded = store.query(
            "SELECT name, attrs->>'$.\"op.shapes\"', attrs->>'$.\"op.dtypes\"', attrs->>'$.\"op.concrete_inputs\"' "
            "FROM spans WHERE level = 'op' AND name IN ('aten::convolution', 'aten::convolution_backward')"
        )
    got: dict[str, int] = {}
    for name, *sig in recorded:
        cost = op_cost(name, *(orjson.loads(v) for v in sig))
        assert cost is not None and cost.flops is not None, (name, sig)
        got[name.replace("::", ".")] = got.get(name.replace("::", "."), 0) + cost.flops
    assert got == {k: v for k, v in expected.items() if k in got} and set(got) == {
        "aten.convolution",
        "aten.convolution_backward",
    }


def test_the_backward_of_activations_and_norms_counts_as_their_forward() -> None:
    """The backward pass outside the layers counted its matrix products only: a ReLU's, GELU's or norm's
    gradient (which PyTorch's counter leaves out, as it does their forward) now counts as its forward does."""
    relu = op_cost("aten::threshold_backward", [[4, 8], [4, 8], []], ["float", "float", "Scalar"])
    gelu = op_cost("aten::gelu_backward", [[4, 8], [4, 8], []], ["c10::BFloat16", "c10::BFloat16", ""])
    norm = op_cost(
        "aten::native_layer_norm_backward",
        [[4, 8], [4, 8], [], [4, 1], [4, 1], [8], [8], []],
        ["float", "float", "", "float", "float", "float", "float", ""],
    )
    assert relu is not None and (relu.flops, relu.read_bytes, relu.write_bytes) == (32, 2 * 32 * 4, 32 * 4)
    assert gelu is not None and (gelu.flops, gelu.precision) == (32, "bf16")
    assert norm is not None and norm.flops == 5 * 32


@pytest.mark.parametrize(
    ("pool", "x", "window"),
    [
        (torch.nn.MaxPool2d(2), (2, 16, 64, 64), 4),
        (torch.nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True), (2, 3, 9, 9), 9),
        (torch.nn.MaxPool1d(2), (2, 3, 9), 2),
        (torch.nn.MaxPool3d(2, ceil_mode=True), (1, 2, 5, 4, 4), 8),
        (torch.nn.MaxPool2d(3, stride=2, padding=1, dilation=2), (2, 3, 10, 10), 9),
    ],
    ids=["max2d", "avg2d-ceil", "max1d", "max3d-ceil", "max2d-dilated"],
)
def test_a_pooling_layer_counts_its_windows(
    tmp_path: Path, pool: torch.nn.Module, x: tuple[int, ...], window: int
) -> None:
    """A CNN's MaxPool2d had no formula, so its layer was missing from A12 and the roofline: a windowed pool
    compares (or adds) each element of each window once, and writes what PyTorch's output has."""
    with torch.no_grad(), xstack.profile(levels="model,layer,op", path=tmp_path / "p.duckdb") as prof:
        out = pool(torch.randn(*x))
    with prof.open() as store:
        (a12,) = run_analyses(store, None, ["A12"])
    assert a12.column("FLOPs") == [out.numel() * window]
    assert a12.column("DRAM write") == [out.numel() * 4]


def test_an_embedding_layer_does_no_arithmetic_and_moves_its_rows(tmp_path: Path) -> None:
    """A language model's embedding showed unknown FLOPs and was left off the roofline: its lookup reads the
    indices and the rows they pick and writes them, with no arithmetic (as ``FlopCounterMode`` counts it)."""
    emb, idx = torch.nn.Embedding(1000, 64), torch.randint(0, 1000, (8, 32))
    with torch.no_grad(), xstack.profile(levels="model,layer,op", path=tmp_path / "p.duckdb") as prof:
        out = emb(idx)
    with prof.open() as store:
        a12, a14 = run_analyses(store, None, ["A12", "A14"])
    assert a12.column("FLOPs") == [0]
    assert a12.column("DRAM read") == [idx.numel() * 8 + out.numel() * 4]
    assert a12.column("DRAM write") == [out.numel() * 4]
    assert (a14.column("layer"), a14.column("AI")) == (a12.column("layer"), [0.0])  # on the roofline, at 0
