"""Fixtures of the report tests: the real BERT trace imported and analysed once for the whole package, and a real
leveled measurement of a small model."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import kineto_fixture
from xstack.analyze.pipeline import Analysis, analyze
from xstack.importers.kineto import import_kineto
from xstack.trace.store import Store

BERT = "h100_bert_small_infer_full.json.gz"


@pytest.fixture(scope="package")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, Analysis]]:
    """The real H100 BERT inference trace as a store (open read-only) and its full analysis."""
    trace = kineto_fixture(BERT)
    path = tmp_path_factory.mktemp("bert") / "bert.duckdb"
    with Store.create(path) as store:
        import_kineto(store, trace)
    store = Store.open(path)
    yield store, analyze(store)
    store.close()


@pytest.fixture(scope="package")
def bert_path(bert: tuple[Store, Analysis]) -> Path:
    return bert[0].path


_LEVELED = """
import sys, torch, xstack
data = sys.argv[2]
with open(data, "wb") as f:
    f.write(bytes(range(256)) * 16)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
x = torch.randn(2, 8)

def step():
    with open(data, "rb") as f:
        f.read()
    model(x).sum()  # the sum runs outside every layer

xstack.measure(step, passes=["model", "model,layer,op", "model,io"], warmup=1, iters=3, path=sys.argv[1],
               name="leveled", progress=False)
"""


@pytest.fixture(scope="package")
def leveled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real leveled measurement of a small PyTorch model that reads a file each step: three passes (the last
    one with the io level) and the merged run, four runs in one store. Measured in a child process, which the
    io level attaches to."""
    pytest.importorskip("torch", reason="PyTorch is not installed")
    tmp = tmp_path_factory.mktemp("leveled")
    path = tmp / "leveled.duckdb"
    done = subprocess.run([sys.executable, "-c", _LEVELED, str(path), str(tmp / "data.bin")], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return path
