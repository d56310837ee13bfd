"""Lint and strict typing of the package, as part of the suite so that CI enforces them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


CHECKS = {
    "ruff check": ["ruff", "check", "src", "tests", "bench"],
    "ruff format": ["ruff", "format", "--check", "src", "tests", "bench"],
    "mypy --strict": ["mypy"],
}


@pytest.mark.parametrize("check", list(CHECKS))
def test_code_quality(check: str) -> None:
    tool = CHECKS[check][0]
    if importlib.util.find_spec(tool) is None:
        pytest.skip(f"{tool} is not installed (pip install -e '.[test]')")
    args = [sys.executable, "-m", *CHECKS[check]]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
