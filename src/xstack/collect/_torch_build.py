"""What the installed PyTorch can do, found without importing it where its files already say.

Importing ``torch`` takes seconds. The commands that plan passes (``xstack profile``, ``sweep``) ask whether the
runtime and kernel levels can run before any pass starts, and a CPU-only build of PyTorch (the wheel CI and
laptops install) can answer that from its ``torch/version.py``: it was built with neither CUDA nor HIP.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

NOT_INSTALLED = "PyTorch is not installed (pip install 'torch==2.13.0')"


def torch_reason() -> str | None:
    """Why PyTorch cannot be used here (it is not installed), or None; does not import it."""
    return NOT_INSTALLED if importlib.util.find_spec("torch") is None else None


def cuda_reason() -> str | None:
    """Why CUDA cannot be used here, or None. Imports torch only where its build may have a device to ask."""
    spec = importlib.util.find_spec("torch")
    if spec is None:
        return NOT_INSTALLED
    if _cpu_only(spec.submodule_search_locations or []):
        return "no CUDA device (this PyTorch is a CPU-only build: torch.version.cuda and torch.version.hip are None)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


_BUILT_WITH = re.compile(r"^(cuda|hip)\s*(?::[^=]*)?=\s*(.+?)\s*$", re.MULTILINE)


def _cpu_only(folders: list[str]) -> bool:
    """Whether ``torch/version.py`` says the build has neither CUDA nor HIP; False when it cannot be read."""
    for folder in folders:
        try:
            text = (Path(folder) / "version.py").read_text()
        except OSError:
            continue
        built = dict(_BUILT_WITH.findall(text))
        return built.get("cuda") == "None" and built.get("hip") == "None"
    return False
