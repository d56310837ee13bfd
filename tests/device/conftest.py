"""Every device test calibrates into a temporary cache: none writes to the real one in the home directory."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def calibration_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The calibration file of this test (``$XSTACK_CALIBRATION``), not created yet."""
    path = tmp_path / "calibration" / "calibration.json"
    monkeypatch.setenv("XSTACK_CALIBRATION", str(path))
    return path
