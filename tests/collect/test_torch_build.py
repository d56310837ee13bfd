"""Whether PyTorch can reach a GPU, answered from its build files where they suffice (no seconds of import)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import needs_torch
from xstack.collect._torch_build import _cpu_only

VERSION = """__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']
__version__ = '2.13.0{suffix}'
debug = False
cuda: Optional[str] = {cuda}
git_version = '0123456789abcdef'
hip: Optional[str] = {hip}
"""


@pytest.mark.parametrize(
    ("suffix", "cuda", "hip", "cpu_only"),
    [("+cpu", "None", "None", True), ("+cu128", "'12.8'", "None", False), ("+rocm6.4", "None", "'6.4.43482'", False)],
)
def test_a_build_is_cpu_only_when_it_has_neither_cuda_nor_hip(tmp_path: Path, suffix: str, cuda: str, hip: str,
                                                              cpu_only: bool) -> None:  # fmt: skip
    (tmp_path / "version.py").write_text(VERSION.format(suffix=suffix, cuda=cuda, hip=hip))
    assert _cpu_only([str(tmp_path)]) is cpu_only
    (tmp_path / "version.py").write_text(f"cuda = {cuda}\nhip = {hip}\n")  # older builds: no annotations
    assert _cpu_only([str(tmp_path)]) is cpu_only


def test_an_unreadable_or_odd_version_file_means_torch_is_asked(tmp_path: Path) -> None:
    assert _cpu_only([str(tmp_path / "missing")]) is False
    (tmp_path / "version.py").write_text("__version__ = '2.13.0'\n")
    assert _cpu_only([str(tmp_path)]) is False


@needs_torch
def test_the_answer_is_torch_s_own_and_a_cpu_build_is_not_imported() -> None:
    code = (
        "import sys\n"
        "from xstack.collect._torch_build import cuda_reason\n"
        "reason = cuda_reason()\n"
        "print(repr(reason))\n"
        "print('torch' in sys.modules)\n"
        "import torch\n"
        "print(reason is None, torch.cuda.is_available(), torch.version.cuda is None and torch.version.hip is None)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    reason, imported, ready, available, cpu_build = done.stdout.splitlines()[0], *done.stdout.split()[-4:]
    assert ready == available, reason  # the same answer as torch's
    assert imported == str(cpu_build != "True")  # a CPU build is answered from its files alone
    assert available == "True" or reason.startswith("'no CUDA device ("), reason
