"""Shared test fixtures: the real traces in ../shared/fixtures and fresh stores built from them, and one live
profile with the system passes that several test files read."""

from __future__ import annotations

import fcntl
import gzip
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from xstack.importers.kineto import import_kineto
from xstack.trace.store import Store

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("XSTACK_FIXTURES", ROOT.parent / "shared" / "fixtures"))
KINETO_DIR = FIXTURES / "kineto"
KINETO_TRACES = sorted(KINETO_DIR.glob("*.json.gz")) if KINETO_DIR.is_dir() else []

NO_TORCH = importlib.util.find_spec("torch") is None
needs_torch = pytest.mark.skipif(NO_TORCH, reason="PyTorch is not installed")
"""For a test whose program, or whose own code, imports PyTorch (an optional dependency of xstack)."""


def skip_without_torch(source: str) -> None:
    """Skip a test that runs the program ``source`` where it imports PyTorch and PyTorch is not installed."""
    if NO_TORCH and "torch" in source:
        pytest.skip("PyTorch is not installed: the program profiled here imports it")


def pydarshan() -> object:
    """The ``darshan`` module; skips the test, with the reason, where PyDarshan is not installed or does not load
    (a wheel without its C library raises ``RuntimeError`` on import, which ``pytest.importorskip`` lets through)."""
    try:
        import darshan
    except (ImportError, RuntimeError) as exc:
        pytest.skip(
            f"PyDarshan is not installed or does not load (pip install darshan): {exc}", allow_module_level=True
        )
    return darshan


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (the default, ``pyproject.toml``): one worker per CPU this process may run on, at most 4. Many
    tests time real programs, so more workers than CPUs would measure the other workers; past 4, the slowest
    files decide the wall time. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` sets the number; ``-n 0`` runs in one process.
    ``--dist loadfile`` keeps a file's tests in one worker, so its module fixtures (stores, a browser) are built
    once."""
    if (wanted := os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")) is not None:
        return int(wanted)
    return max(1, min(4, len(os.sched_getaffinity(0))))


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


def periodic_save(path: Path, every: int | None, iters: int = 8) -> Path:
    """A real leveled measurement (passes ``model`` and ``model,layer``, 1 + ``iters`` steps) of a linear layer's
    forward with a 3 ms ``save`` span every ``every`` steps (none where None): work only some iterations run.
    Returns the store's path."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import time

    import xstack

    model, x, calls = torch.nn.Linear(8, 8), torch.randn(2, 8), 0

    def step() -> None:
        nonlocal calls
        calls += 1
        model(x)
        if every and calls % every == 0:
            with xstack.span("save"):
                time.sleep(0.003)

    return xstack.measure(step, passes=["model", "model,layer"], warmup=1, iters=iters, path=path, progress=False)


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
        for name in ("backward", "grad"):  # the model level's backward stages: PyTorch's own functions again
            assert not hasattr(getattr(torch.autograd, name), "__wrapped__"), f"test left torch.autograd.{name} patched"
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


LOADER_PROGRAM = """
import os, sys, tempfile, time, torch, xstack
from torch import nn

class Files(torch.utils.data.Dataset):
    def __init__(self, path):
        self.path = path
    def __len__(self):  # 32 steps of over 10 ms (or as many as the argument says): enough 50 ms samples
        return 8 * (int(sys.argv[1]) if len(sys.argv) > 1 else 32)
    def __getitem__(self, i):
        with open(self.path, "rb") as fh:
            return torch.frombuffer(bytearray(fh.read(256)), dtype=torch.uint8).float()

if __name__ == "__main__":
    fd, path = tempfile.mkstemp()
    os.write(fd, os.urandom(4096))
    os.close(fd)
    model = nn.Sequential(nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 2))
    loader = torch.utils.data.DataLoader(Files(path), batch_size=8, num_workers=1)
    kept = []
    for x in loader:
        with xstack.span("wait"):
            time.sleep(0.01)
        model(x).sum().backward()
        kept.append(torch.ones(1 << 16))
        xstack.step()
    os.unlink(path)
"""
"""A tiny training loop: a DataLoader worker reading a file, a ``wait`` stage sleeping 10 ms each step, a
backward pass, memory that grows; 32 steps, or as many as its argument says."""


@pytest.fixture(scope="session")
def system_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``xstack profile --pass model --pass model,layer --system --warmup 1 --iters 3`` of ``LOADER_PROGRAM``,
    of 100 steps, once for the whole test run (every pytest-xdist worker reads the same store): its two timing
    passes, the sampler pass (``model+system``) and the syscall pass (``model+layer+system+syscalls``, under strace
    or perf) are six interpreter starts with PyTorch and a traced one, so the tests that read the store share it.
    Skips, with the reason, where system calls cannot be traced or PyTorch is not installed."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed")
    if importlib.util.find_spec("xstack.collect.system") is None:
        pytest.skip("the system level's sampler (xstack.collect.system) is not installed")
    from xstack.collect.syscalls import unavailable_reason

    if (reason := unavailable_reason()) is not None:
        pytest.skip(f"the syscall pass cannot run here: {reason}")
    shared = tmp_path_factory.getbasetemp()  # a worker's own under pytest-xdist: the run's is its parent
    shared = shared.parent if os.environ.get("PYTEST_XDIST_WORKER") else shared
    tmp = shared / "system-profile"
    with open(shared / "system-profile.lock", "w") as lock:  # the first worker builds it, the others wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (tmp / "done").exists():
            shutil.rmtree(tmp, ignore_errors=True)  # what a worker that failed to build it left
            tmp.mkdir()
            _system_profile(tmp)
            (tmp / "done").touch()
    return tmp / "p.duckdb"


def _system_profile(tmp: Path) -> None:
    script, store = tmp / "train.py", tmp / "p.duckdb"
    script.write_text(textwrap.dedent(LOADER_PROGRAM))
    done = subprocess.run(
        [sys.executable, "-m", "xstack", "profile", "--pass", "model", "--pass", "model,layer", "--system",
         "--warmup", "1", "--iters", "3", "-o", str(store), "--", sys.executable, str(script), "100"],
        capture_output=True, text=True, cwd=tmp, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (tmp / "stderr.txt").write_text(done.stderr)  # beside the store, for the tests of what it said
