"""Shared test fixtures: the real traces in ../shared/fixtures and fresh stores built from them."""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from xstack.importers.kineto import import_kineto
from xstack.trace.store import Store

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("XSTACK_FIXTURES", ROOT.parent / "shared" / "fixtures"))
KINETO_DIR = FIXTURES / "kineto"
KINETO_TRACES = sorted(KINETO_DIR.glob("*.json.gz")) if KINETO_DIR.is_dir() else []


def kineto_fixture(name: str) -> Path:
    """Path of one real Kineto trace; skips the test, with the reason, when the fixtures are absent."""
    path = KINETO_DIR / name
    if not path.exists():
        pytest.skip(f"real-trace fixture {path} is not present (expected ../shared/fixtures beside the repo)")
    return path


def alexnet_without_param_calls(out: Path) -> Path:
    """The real AlexNet trace (PARAM's discrete mode) written to ``out`` without the spans PARAM opens around
    each call, as its continuous modes record it: one span per phase, so no iterations, the whole run the
    latency's span. Returns ``out``."""
    with gzip.open(kineto_fixture("a100_alexnet_train_sync.json.gz")) as f:
        data = json.load(f)
    phases = [e for e in data["traceEvents"] if re.search(r"\|(warmup|measure)\|forward\]$", e.get("name", ""))]
    calls = {id(e) for e in phases if any(o is not e and o["name"] == e["name"] and o["ts"] <= e["ts"] for o in phases)}
    assert len(calls) == 2
    data["traceEvents"] = [e for e in data["traceEvents"] if id(e) not in calls]
    out.write_text(json.dumps(data))
    return out


def all_kineto_fixtures() -> list[Path]:
    """Every real Kineto trace, for parametrised tests (an empty list makes pytest skip them)."""
    return KINETO_TRACES


@pytest.fixture
def import_store(tmp_path: Path) -> Iterator[object]:
    """Import one trace into a fresh store and open it read-only: ``store = import_store(path)``."""
    opened: list[Store] = []

    def make(trace: Path) -> Store:
        out = tmp_path / f"{trace.name}.duckdb"
        with Store.create(out) as store:
            import_kineto(store, trace)
        opened.append(Store.open(out))
        return opened[-1]

    yield make
    for store in opened:
        store.close()


@pytest.fixture(autouse=True)
def _no_leftover_hooks() -> Iterator[None]:
    """Fail a test that leaves a global hook installed (profilers, module hooks, preload variables)."""
    preload = os.environ.get("LD_PRELOAD")
    yield
    assert os.environ.get("LD_PRELOAD") == preload, "test left LD_PRELOAD changed"
    assert sys.getprofile() is None, "test left a Python profile hook installed"
    torch = sys.modules.get("torch")
    if torch is not None:
        hooks = getattr(torch.nn.modules.module, "_global_forward_hooks", {})
        assert not hooks, "test left global nn.Module forward hooks installed"
        pre = getattr(torch.nn.modules.module, "_global_forward_pre_hooks", {})
        assert not pre, "test left global nn.Module forward pre-hooks installed"
        assert not torch.autograd.profiler._is_profiler_enabled, "test left torch.profiler running"
        data = torch.utils.data.dataloader
        for method in (data.DataLoader.__iter__, data._BaseDataLoaderIter.__next__):
            assert "<locals>" not in method.__qualname__, f"test left {method.__qualname__} in place of PyTorch's"


@pytest.fixture(autouse=True, scope="session")
def _own_calibration_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every test, and every program it profiles, reads and writes a calibration cache of the session's own
    (``$XSTACK_CALIBRATION``), empty at first: never the user's, whose measured peaks would change what the
    roofline analyses say, and which a test must not overwrite. A test may still point it elsewhere."""
    before = os.environ.get("XSTACK_CALIBRATION")
    os.environ["XSTACK_CALIBRATION"] = str(tmp_path_factory.mktemp("calibration") / "calibration.json")
    yield
    if before is None:
        os.environ.pop("XSTACK_CALIBRATION", None)
    else:
        os.environ["XSTACK_CALIBRATION"] = before
