"""The io level's overhead on an input-bound DataLoader, beside ``strace -f``, in one run.

The workload: a DataLoader with 2 workers reading 20,000 files of 4 KiB (``open(path, 'rb').read()`` each,
as an image folder dataset does), batch 64, ``--epochs`` times over. It times itself from the first
``iter(loader)`` to the last batch, so interpreter start-up and imports are left out, and prints the time as
JSON.

Configurations, run in turns (``none``, ``io``, ``strace``, then again) so that drift in the machine's state
hits them alike; the files are read once before timing so every configuration reads from the page cache:
- ``none``: the workload alone;
- ``io``: the workload with the io level's interposition library preloaded into it and its workers
  (``collect._io_native.preload_env``), recording every call to files as ``xstack run --levels ...,io`` does;
- ``strace``: the workload under ``strace -f -qq -e trace=%file,%desc -o FILE``, tracing the same calls.
Overhead is the median time of a configuration over the median time of ``none``, minus one.
Also reported: the records written and the time ``collect._io_records.read_trace`` takes to read them back
(the work done after the program ends, not inside it).

Reproduce: ``python bench/io_overhead.py`` (about 5 minutes on 2 cores, strace most of it; ``--files 2000
--repeat 1 --epochs 1`` for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOAD = r"""
import json, os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Files(Dataset):
    def __init__(self, root):
        self.paths = sorted(os.path.join(root, n) for n in os.listdir(root))
    def __len__(self):
        return len(self.paths)
    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            data = f.read()
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

loader = DataLoader(Files(sys.argv[1]), batch_size=64, num_workers=2)
start = time.perf_counter()
total = 0
for epoch in range(int(sys.argv[2])):
    for batch in loader:
        total += batch.numel()
print(json.dumps({"seconds": time.perf_counter() - start, "bytes": total}))
"""


def make_files(root: Path, count: int, size: int) -> None:
    """``count`` files of ``size`` random bytes under ``root`` (kept between runs)."""
    root.mkdir(parents=True, exist_ok=True)
    have = len(os.listdir(root))
    for i in range(have, count):
        (root / f"{i:06d}.bin").write_bytes(os.urandom(size))


def run_once(config: str, script: Path, data: Path, scratch: Path, epochs: int) -> dict[str, float]:
    """One timed run of the workload under ``config``; returns its figures."""
    from xstack.collect import _io_native
    from xstack.collect._io_records import read_trace

    command = [sys.executable, str(script), str(data), str(epochs)]
    env = dict(os.environ)
    out = scratch / config
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if config == "io":
        env = _io_native.preload_env(out)
    elif config == "strace":
        command = ["strace", "-f", "-qq", "-e", "trace=%file,%desc", "-o", str(out / "strace.txt"), *command]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    if config == "io":
        t0 = time.perf_counter()
        trace = read_trace(out)
        figures["read_back_s"] = time.perf_counter() - t0
        figures["records"] = len(trace.ops)
        figures["processes"] = len(trace.processes)
    shutil.rmtree(out, ignore_errors=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=4096, help="bytes per file (default 4096)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per configuration (default 5)")
    parser.add_argument("--epochs", type=int, default=3,
                        help="passes over the files per run (default 3: a region of about a second, long enough "
                        "that process start-up jitter does not swamp a few %%)")  # fmt: skip
    parser.add_argument("--data", type=Path, help="folder of the files (default: a temp folder, removed)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    configs = ["none", "io"] + (["strace"] if shutil.which("strace") else [])
    with tempfile.TemporaryDirectory(prefix="xstack-io-bench-") as tmp:
        data = args.data or Path(tmp) / "files"
        make_files(data, args.files, args.size)
        script = Path(tmp) / "workload.py"
        script.write_text(WORKLOAD)
        run_once("none", script, data, Path(tmp), 1)  # warm the page cache and the imports
        runs: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
        for _ in range(args.repeat):
            for config in configs:
                runs[config].append(run_once(config, script, data, Path(tmp), args.epochs))
    base = statistics.median(r["seconds"] for r in runs["none"])
    summary = []
    for config in configs:
        median = statistics.median(r["seconds"] for r in runs[config])
        row = {"config": config, "median_s": round(median, 4), "overhead_pct": round(100 * (median / base - 1), 2),
               "runs_s": [round(r["seconds"], 4) for r in runs[config]]}  # fmt: skip
        if config == "io":
            row["records"] = int(statistics.median(r["records"] for r in runs[config]))
            row["processes"] = int(statistics.median(r["processes"] for r in runs[config]))
            row["read_back_s"] = round(statistics.median(r["read_back_s"] for r in runs[config]), 3)
        summary.append(row)
    print(
        f"{args.files} files of {args.size} B x {args.epochs} epochs, DataLoader with 2 workers, {args.repeat} runs "
        "each (median)"
    )
    for row in summary:
        extra = f"  records {row['records']}, read back in {row['read_back_s']} s" if "records" in row else ""
        print(f"  {row['config']:<7} {row['median_s']:8.3f} s  {row['overhead_pct']:+7.2f} %{extra}")
    if args.json:
        args.json.write_text(json.dumps({"files": args.files, "size": args.size, "epochs": args.epochs,
                                         "summary": summary}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
