"""``xstack demo``: profile a small CNN and a small transformer, built here from code, and show the result.

Until the live collectors land, the demo records with the PyTorch profiler, imports its trace like any
other, writes the store and a Perfetto timeline, and prints the summary. CPU by default, CUDA when present.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from xstack.errors import XstackError

TORCH_HINT = "install it with: pip install 'torch==2.13.0' (the CPU build here; CUDA builds on GPU machines)"


def run_demo(out_dir: Path, *, steps: int = 4, console: Console | None = None) -> Path:
    """Profile the demo models for ``steps`` training steps; returns the store's path."""
    from xstack.analyze.summary import summarize
    from xstack.export.perfetto import export_perfetto
    from xstack.importers.api import import_files
    from xstack.report.terminal import print_summary
    from xstack.trace.store import Store

    if steps < 1:
        raise XstackError("demo: --steps must be at least 1")
    torch = _import_torch()
    console = console or Console(highlight=False)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    console.print(f"profiling a small CNN and transformer on {device} for {steps} steps ...", soft_wrap=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    store_path = out_dir / "demo.duckdb"
    trace = out_dir / "demo.pt.trace.json"  # the PyTorch profiler's own trace, kept beside the store
    _record(torch, device, steps, trace)
    import_files([trace], store_path, force=True)
    timeline = out_dir / "demo.perfetto.json"
    with Store.open(store_path) as store:
        export_perfetto(store, timeline)
        print_summary(summarize(store), console)
    console.print(f"store: {store_path}\nPyTorch trace: {trace}", soft_wrap=True)
    console.print(f"timeline: {timeline} (open it in https://ui.perfetto.dev)", soft_wrap=True)
    return store_path


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise XstackError(f"demo: PyTorch is not installed; {TORCH_HINT}") from exc
    return torch


def _record(torch: Any, device: str, steps: int, trace: Path) -> None:
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    cnn = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    ).to(device)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).to(device)
    optimizer = torch.optim.SGD(cnn.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, record_shapes=True, profile_memory=True, with_stack=True) as prof:
        for _ in range(steps):
            with record_function("load"):
                images = torch.randn(16, 3, 32, 32)
                labels = torch.randint(0, 10, (16,))
                tokens = torch.randn(8, 32, 64)
            with record_function("preprocess"):
                images = ((images - images.mean()) / images.std()).to(device)
                labels, tokens = labels.to(device), tokens.to(device)
            with record_function("step"):
                optimizer.zero_grad()
                loss = loss_fn(cnn(images), labels)
                loss.backward()
                optimizer.step()
            with record_function("predict"), torch.no_grad():
                encoder(tokens)
            prof.step()
    prof.export_chrome_trace(str(trace))
