"""Lint and strict typing of the package, as part of the suite so that CI enforces them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("tool", ["ruff", "mypy"])
def test_code_quality(tool: str) -> None:
    if importlib.util.find_spec(tool) is None:
        pytest.skip(f"{tool} is not installed (pip install -e '.[test]')")
    args = [sys.executable, "-m", tool] + (["check", "src", "tests"] if tool == "ruff" else [])
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
