"""The metrics level: unavailable here with its reason (no ncu, no GPU) while everything else works; on a GPU
machine with Nsight Compute, a real metrics pass whose counters are checked against known work."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from tests.conftest import NO_TORCH
from xstack import collect
from xstack.cli.main import main
from xstack.collect.metrics import NCU_ENV, cuda_reason, find_ncu
from xstack.errors import UsageError
from xstack.leveled.passes import measure
from xstack.trace import attrs as A
from xstack.trace.store import Store


@pytest.fixture
def no_ncu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: no ncu
    monkeypatch.delenv(NCU_ENV, raising=False)
    if find_ncu() is not None:
        pytest.skip("ncu is installed in a standard CUDA location here")


def test_without_ncu_the_collector_says_why(no_ncu: None) -> None:
    reason = collect.load("metrics").unavailable_reason()
    assert reason is not None and "ncu" in reason and NCU_ENV in reason
    status = {level: why for level, _, why in collect.status()}
    assert status["metrics"] == reason and status["model"] is None
    assert status["layer"] is None if not NO_TORCH else "PyTorch is not installed" in status["layer"]


def test_xstack_run_with_metrics_is_a_usage_error_naming_the_reason(
    no_ncu: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "p.py"
    script.write_text("print('ran')\n")
    out = tmp_path / "s.duckdb"
    assert main(["run", "--levels", "model,metrics", "-o", str(out), "--", "python", str(script)]) == 2
    captured = capsys.readouterr()
    assert "level 'metrics' cannot run here" in captured.err and "ncu" in captured.err
    assert "ran" not in captured.out and not out.exists()  # refused before the program started


def test_xstack_profile_with_metrics_refuses_before_any_pass(
    no_ncu: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "p.py"
    script.write_text("print('ran')\n")
    code = main(["profile", "--metrics", "-o", str(tmp_path / "s.duckdb"), "--", "python", str(script)])
    assert code == 2
    assert "pass model+metrics: level 'metrics' cannot run here" in capsys.readouterr().err


def test_measure_in_process_cannot_take_a_metrics_pass(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="metrics|cannot run here"):
        measure(lambda: None, passes=["model", "model,metrics"], path=tmp_path / "m.duckdb", progress=False)


GPU_PROGRAM = textwrap.dedent(
    """
    import torch, xstack
    torch.backends.cuda.matmul.allow_tf32 = False  # FP32 FMA pipe: FLOPs = 2*M*N*K in the SASS counters
    M, N, K = 1024, 2048, 512
    a = torch.randn(M, K, device="cuda"); b = torch.randn(K, N, device="cuda")
    src = torch.randn(64 * 2**20, device="cuda")  # 256 MiB
    dst = torch.empty_like(src)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.LazyLinear(10)).cuda()
    x = torch.randn(8, 3, 32, 32, device="cuda")
    model(x)
    while True:
        with xstack.span("gemm"):
            torch.mm(a, b)
        with xstack.span("copy"):
            dst.copy_(src)
        model(x)
        xstack.step()
    """
)


@pytest.mark.skipif(cuda_reason() is not None, reason=f"needs a CUDA GPU: {cuda_reason()}")
@pytest.mark.skipif(find_ncu() is None, reason="needs Nsight Compute (ncu on PATH or XSTACK_NCU)")
def test_metrics_pass_on_a_gpu_counts_a_known_gemm_and_copy(tmp_path: Path) -> None:
    script = tmp_path / "work.py"
    script.write_text(GPU_PROGRAM)
    out = tmp_path / "gpu.duckdb"
    done = subprocess.run(
        [sys.executable, "-m", "xstack", "profile", "--metrics", "--warmup", "2", "--iters", "3",
         "--pass", "model", "--pass", "model,layer,op,kernel", "-o", str(out), "--", "python", str(script)],
        capture_output=True, text=True, timeout=900, env=os.environ.copy(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.with_name("gpu.ncu.csv").exists()
    with Store.open(out) as store:
        run = store.query("SELECT max(run_id) FROM runs WHERE pass = 'merged'")[0][0]
        health = dict(store.query('SELECT "check", count FROM health WHERE run_id = ?', [run]))
        assert not health.get("metrics_mismatch"), store.query("SELECT detail FROM health WHERE run_id = ?", [run])
        kernels = [(n, orjson.loads(a)) for n, a in store.query(
            "SELECT name, attrs FROM spans WHERE run_id = ? AND level = 'kernel'", [run])]  # fmt: skip
    gemm = [a for n, a in kernels if "gemm" in n.lower() and a.get(A.METRICS_FLOPS_FP32)]
    assert gemm, [n for n, _ in kernels]
    assert sum(a[A.METRICS_FLOPS_FP32] for a in gemm) == pytest.approx(2 * 1024 * 2048 * 512, rel=0.01)
    size = 64 * 2**20 * 4
    copy = max((a for _, a in kernels), key=lambda a: a.get(A.METRICS_DRAM_BYTES_WRITE) or 0)
    assert copy[A.METRICS_DRAM_BYTES_READ] == pytest.approx(size, rel=0.05)
    assert copy[A.METRICS_DRAM_BYTES_WRITE] == pytest.approx(size, rel=0.05)
