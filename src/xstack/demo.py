"""``xstack demo``: profile a small image pipeline, built here from code, with the live collectors.

It writes a synthetic image dataset (one ``.npy`` file per image) to a temporary folder, reads it back through
a DataLoader with worker processes, and trains and runs a small CNN and a small vision transformer for a few
steps, with its stages marked by ``xstack.span``: ``load``, ``preprocess``, ``step`` (training),
``predict`` (inference) and ``postprocess``. Levels model, layer and op on the CPU; runtime and kernel too
on CUDA, which is used when present. Nothing is downloaded.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from xstack.errors import UsageError, XstackError
from xstack.outfile import os_reason
from xstack.text import counted

TORCH_HINT = "install it with: pip install 'torch==2.13.0' (the CPU build here; CUDA builds on GPU machines)"

IMAGE_SHAPE = (3, 32, 32)
CLASSES = 10
BATCH = 16
WORKERS = 2


def run_demo(out_dir: Path, *, steps: int = 4, console: Console | None = None) -> Path:
    """Profile the demo pipeline for ``steps`` iterations; returns the store's path."""
    from xstack.analyze.pipeline import analyze
    from xstack.analyze.recommend import RULE_ANALYSES
    from xstack.export.perfetto import export_perfetto
    from xstack.report.terminal import print_analysis
    from xstack.trace.store import Store

    if steps < 1:
        raise UsageError(f"xstack demo: --steps must be at least 1 (got {steps})")
    _make_folder(out_dir)  # before PyTorch loads, which takes seconds
    torch = _import_torch()
    console = console or Console(highlight=False)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    levels = "model,layer,op" + (",runtime,kernel" if device == "cuda" else "")
    store_path = out_dir / "demo.duckdb"
    replaced = " (replaced the one that was there)" if store_path.exists() else ""
    what = f"a small CNN and vision transformer on {device} for {counted(steps, 'step')} ({levels})"
    console.print(f"profiling {what} ...", soft_wrap=True)
    with tempfile.TemporaryDirectory(prefix="xstack-demo-data-") as data_dir:
        files = write_dataset(Path(data_dir), images=steps * BATCH)
        console.print(escape(f"wrote {len(files)} synthetic images to {data_dir}"), soft_wrap=True)
        _profile(torch, device, steps, files, levels, store_path)
    timeline = out_dir / "demo.perfetto.json"
    with Store.open(store_path) as store:
        export_perfetto(store, timeline)
        analysis = analyze(store, ids=RULE_ANALYSES)
    print_analysis(analysis, str(store_path), console)
    console.print(escape(f"store: {store_path}{replaced}"), soft_wrap=True)
    console.print(escape(f"timeline: {timeline} (open it in https://ui.perfetto.dev)"), soft_wrap=True)
    return store_path


def _make_folder(out_dir: Path) -> None:
    """Create the output folder; an ``XstackError`` naming it where it is a file or cannot be made."""
    if out_dir.exists() and not out_dir.is_dir():
        raise XstackError(f"{out_dir}: is a file, not a folder (xstack demo -o DIR writes demo.duckdb and "
                          "demo.perfetto.json into DIR)")  # fmt: skip
    if not (parent := next(p for p in out_dir.parents if p.exists())).is_dir():
        raise XstackError(f"{out_dir}: cannot make the folder ({parent} is a file, not a folder)")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise XstackError(f"{out_dir}: cannot make the folder ({os_reason(out_dir, exc)})") from exc


def write_dataset(folder: Path, *, images: int, seed: int = 0) -> list[Path]:
    """Write ``images`` random images (``.npy``, float32, CHW) whose class is in their name; returns the files."""
    import numpy as np

    rng = np.random.default_rng(seed)
    files = []
    for i in range(images):
        label = int(rng.integers(CLASSES))
        image = rng.random(IMAGE_SHAPE, dtype=np.float32) + label / CLASSES  # a learnable signal
        path = folder / f"img{i:05d}_c{label}.npy"
        np.save(path, image)
        files.append(path)
    return files


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise XstackError(f"demo: PyTorch is not installed; {TORCH_HINT}") from exc
    return torch


def _profile(torch: Any, device: str, steps: int, files: list[Path], levels: str, store_path: Path) -> None:
    import xstack

    torch.manual_seed(0)
    cnn, vit = _cnn(torch).to(device), _vit(torch).to(device)
    params = [*cnn.parameters(), *vit.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    loader = torch.utils.data.DataLoader(_ImageFiles(files), batch_size=BATCH, num_workers=WORKERS)
    with xstack.profile(levels=levels, path=store_path, name="demo") as prof:
        batches = iter(loader)
        for _ in range(steps):
            with xstack.span("load"):
                images, labels = next(batches)
            with xstack.span("preprocess"):
                images = (images - images.mean(dim=(0, 2, 3), keepdim=True)) / images.std()
                images, labels = images.to(device), labels.to(device)
            with xstack.span("step"):
                optimizer.zero_grad()
                loss = loss_fn(cnn(images), labels) + loss_fn(vit(images), labels)
                loss.backward()
                optimizer.step()
            with xstack.span("predict"), torch.no_grad():
                logits = cnn.eval()(images) + vit.eval()(images)
                cnn.train(), vit.train()
            with xstack.span("postprocess"):
                (logits.argmax(dim=1) == labels).float().mean().item()
            prof.step()


class _ImageFiles:
    """A map-style dataset over the ``.npy`` images of ``write_dataset``: reads one file per item."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        import numpy as np
        import torch

        path = self.files[index]
        label = int(path.stem.rsplit("_c", 1)[1])
        return torch.from_numpy(np.load(path)), label


def _cnn(torch: Any) -> Any:
    """A small CNN: two convolution blocks and a linear classifier."""
    nn: Any = torch.nn

    def block(c_in: int, c_out: int) -> Any:
        return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(), nn.MaxPool2d(2))

    class SmallCNN(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(block(3, 16), block(16, 32))
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Linear(32, CLASSES)

        def forward(self, x: Any) -> Any:
            return self.classifier(self.pool(self.features(x)).flatten(1))

    return SmallCNN()


def _vit(torch: Any) -> Any:
    """A small vision transformer: 8x8 patches, two encoder layers, mean-pooled tokens, a linear head."""
    nn: Any = torch.nn

    class PatchEmbedding(nn.Module):  # type: ignore[misc]
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.proj = nn.Conv2d(3, dim, kernel_size=8, stride=8)
            self.position = nn.Parameter(torch.zeros(1, (IMAGE_SHAPE[1] // 8) ** 2, dim))

        def forward(self, x: Any) -> Any:
            return self.proj(x).flatten(2).transpose(1, 2) + self.position

    class VisionTransformer(nn.Module):  # type: ignore[misc]
        def __init__(self, dim: int = 64) -> None:
            super().__init__()
            self.embed = PatchEmbedding(dim)
            layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=2 * dim, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, CLASSES)

        def forward(self, x: Any) -> Any:
            return self.head(self.norm(self.encoder(self.embed(x)).mean(dim=1)))

    return VisionTransformer()
