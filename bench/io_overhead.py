"""The io level's overhead on an input-bound DataLoader, beside ``strace -f``, in one run.

The workload: a DataLoader with 2 workers reading 20,000 files of 4 KiB (``open(path, 'rb').read()`` each,
as an image folder dataset does), batch 64, ``--epochs`` times over. It times itself from the first
``iter(loader)`` to the last batch, so interpreter start-up and imports are left out, and prints that time and
the CPU time of its main process and of its workers over the same region as JSON.

Configurations (the files are read once before timing, so every configuration reads from the page cache):
- ``none``: the workload alone;
- ``io``: the workload with the io level's interposition library preloaded into it and its workers
  (``collect._io_native.preload_env``), recording every call to files as ``xstack run --levels ...,io`` does;
- ``strace``: the workload under ``strace -f -qq -e trace=%file,%desc -o FILE``, tracing the same calls;
- ``perf``: the workload under ``perf record`` on the ``raw_syscalls`` tracepoints, as the system level's
  syscall pass runs it with ``XSTACK_SYSCALL_TOOL=perf`` (every system call, no arguments decoded).
- ``none again``: the workload alone once more, the A/A control: its "overhead" is the machine's noise.
``none``, ``none again`` and ``io`` rotate (each leads every third round), ``--repeat`` runs each; ``strace``
and ``perf`` (``--strace-repeat`` runs each)
runs last. Overhead is the median time of a configuration over the median time of ``none``, minus one;
"paired" is the median of the overheads of runs taken side by side, which machine-wide drift disturbs less.
The same two figures are given for the CPU time of the main process and its workers together, which other
load on the machine disturbs far less than the wall time. Also reported:
the quartiles and minimum of the times, the CPU time of the main process and of the workers over the region
(``os.times``; the workers' counts once they are joined), the records written and the time
``collect._io_records.read_trace`` takes to read them back (the work done after the program ends), and what the
library measured of its own cost in the processes (``IoProcess.recording_ns``, the ``recording`` column of
``io.processes``; over their whole lives, start-up included), to set beside the CPU time the io level added here.

Per call: a C program doing what Python's ``open(path, 'rb').read()`` does (open, fstat, lseek twice, fstat,
read twice, close) once on each file, in a fresh process (every path new to it, as in a DataLoader worker),
with and without the library preloaded; CPU time per call, the best of 5 runs each, alternating (skipped
without gcc). It isolates the library's cost per call from the DataLoader's scheduling noise.

Reproduce: ``python bench/io_overhead.py`` (3 to 5 minutes on 2 cores; ``--files 2000 --repeat 1 --epochs 1
--strace-repeat 1`` for a smoke run).
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

def cpu_s():
    t = os.times()  # the workers' CPU time counts once they are joined, at the end of each epoch
    return t.user + t.system, t.children_user + t.children_system

loader = DataLoader(Files(sys.argv[1]), batch_size=64, num_workers=2)
start, (main0, workers0) = time.perf_counter(), cpu_s()
total = 0
for epoch in range(int(sys.argv[2])):
    for batch in loader:
        total += batch.numel()
seconds, (main1, workers1) = time.perf_counter() - start, cpu_s()
print(json.dumps({"seconds": seconds, "main_cpu_s": main1 - main0, "workers_cpu_s": workers1 - workers0,
                  "bytes": total}))
"""


PER_CALL = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    char path[4096], buf[8192];
    struct stat st;
    long count = atol(argv[2]);
    struct timespec t0, t1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    for (long i = 0; i < count; i++) {
        snprintf(path, sizeof path, "%s/%06ld.bin", argv[1], i);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        fstat(fd, &st);
        lseek(fd, 0, SEEK_CUR);
        lseek(fd, 0, SEEK_CUR);
        fstat(fd, &st);
        if (read(fd, buf, 4097) < 0 || read(fd, buf, 1) < 0)
            return 1;
        close(fd);
    }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    printf("%.1f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / count / 8);
    return 0;
}
"""


def make_files(root: Path, count: int, size: int) -> None:
    """``count`` files of ``size`` random bytes under ``root`` (kept between runs)."""
    root.mkdir(parents=True, exist_ok=True)
    have = len(os.listdir(root))
    for i in range(have, count):
        (root / f"{i:06d}.bin").write_bytes(os.urandom(size))


def run_once(config: str, script: Path, data: Path, scratch: Path, epochs: int, other: Path | None = None
             ) -> dict[str, float]:  # fmt: skip
    """One timed run of the workload under ``config``; returns its figures. ``io other``: the io level with the
    library file ``other`` preloaded instead of the installed one (an earlier build, to compare two versions
    side by side); its records are not read back, since another version may write another format."""
    from xstack.collect import _io_native
    from xstack.collect._io_records import read_trace

    command = [sys.executable, str(script), str(data), str(epochs)]
    env = dict(os.environ)
    out = scratch / config
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if config in ("io", "io other"):
        env = _io_native.preload_env(out)
        if config == "io other":
            env["LD_PRELOAD"] = ":".join([str(other), *env["LD_PRELOAD"].split(":")[1:]])
    elif config == "strace":
        command = ["strace", "-f", "-qq", "-e", "trace=%file,%desc", "-o", str(out / "strace.txt"), *command]
    elif config == "perf":
        from xstack.collect._perf_trace import RECORD_OPTIONS

        command = ["perf", *RECORD_OPTIONS, "-o", str(out / "perf.data"), "--", *command]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    if config == "io":
        t0 = time.perf_counter()
        trace = read_trace(out)
        figures["read_back_s"] = time.perf_counter() - t0
        figures["records"] = len(trace.ops)
        figures["processes"] = len(trace.processes)
        # what the library measured of its own cost in the processes (their whole lives: start-up included)
        spent = [p.recording_ns for p in trace.processes]
        if spent and all(s is not None for s in spent):
            figures["self_s"] = sum(s or 0 for s in spent) / 1e9
    shutil.rmtree(out, ignore_errors=True)
    return figures


def per_call_ns(data: Path, scratch: Path, count: int) -> dict[str, float] | None:
    """CPU ns per call of the C loop (``PER_CALL``) over ``count`` files, without and with the library; None
    without gcc."""
    from xstack.collect import _io_native

    if shutil.which("gcc") is None:
        return None
    source, program = scratch / "per_call.c", scratch / "per_call"
    source.write_text(PER_CALL)
    subprocess.run(["gcc", "-O2", "-o", str(program), str(source)], check=True)
    best = {"none": float("inf"), "io": float("inf")}
    for _ in range(5):
        for config in best:
            out = scratch / "per-call-io"
            shutil.rmtree(out, ignore_errors=True)
            env = _io_native.preload_env(out) if config == "io" else dict(os.environ)
            done = subprocess.run([str(program), str(data), str(count)], env=env, capture_output=True, text=True,
                                  check=True)  # fmt: skip
            best[config] = min(best[config], float(done.stdout))
    shutil.rmtree(scratch / "per-call-io", ignore_errors=True)
    return {"none_ns": best["none"], "io_ns": best["io"], "added_ns": round(best["io"] - best["none"], 1)}


TIMED = ["none", "none again", "io"]
"""The configurations timed side by side in every round; ``none again`` is the A/A control: the same
unprofiled workload, whose difference from ``none`` is what the machine's noise alone gives."""


def _rounds(configs: list[str], repeat: int, strace_repeat: int, timed: list[str] = TIMED) -> list[str]:
    """Run order: the ``timed`` configurations rotate, each leading in turn, so that drift in the machine's
    state hits all alike; ``strace`` runs (much slower, and measured far less finely) come last."""
    order: list[str] = []
    for i in range(repeat):
        k = i % len(timed)
        order += timed[k:] + timed[:k]
    return order + [c for c in ("strace", "perf") if c in configs for _ in range(strace_repeat)]


def _cpu(run: dict[str, float]) -> float:
    """CPU time of the main process and its workers over the region."""
    return run["main_cpu_s"] + run["workers_cpu_s"]


def _summary(config: str, runs: list[dict[str, float]], base: list[dict[str, float]]) -> dict[str, object]:
    """Median, min and quartiles of the region's time; overhead of the medians, and the median of the
    overheads of runs taken side by side (run i of ``config`` against run i of ``none``)."""
    seconds = sorted(r["seconds"] for r in runs)
    base_median = statistics.median(r["seconds"] for r in base)
    quartiles = statistics.quantiles(seconds, n=4) if len(seconds) > 1 else [seconds[0]] * 3
    paired = [r["seconds"] / b["seconds"] - 1 for r, b in zip(runs, base, strict=False)]
    cpu, base_cpu = [_cpu(r) for r in runs], [_cpu(b) for b in base]
    paired_cpu = [c / b - 1 for c, b in zip(cpu, base_cpu, strict=False)]
    row: dict[str, object] = {
        "config": config, "runs": len(runs), "median_s": round(statistics.median(seconds), 4),
        "min_s": round(seconds[0], 4), "p25_s": round(quartiles[0], 4), "p75_s": round(quartiles[2], 4),
        "overhead_pct": round(100 * (statistics.median(seconds) / base_median - 1), 2),
        "paired_overhead_pct": round(100 * statistics.median(paired), 2),
        "main_cpu_s": round(statistics.median(r["main_cpu_s"] for r in runs), 3),
        "workers_cpu_s": round(statistics.median(r["workers_cpu_s"] for r in runs), 3),
        "cpu_overhead_pct": round(100 * (statistics.median(cpu) / statistics.median(base_cpu) - 1), 2),
        "paired_cpu_overhead_pct": round(100 * statistics.median(paired_cpu), 2),
        "runs_s": [round(r["seconds"], 4) for r in runs],
    }  # fmt: skip
    if config == "io":
        row["records"] = int(statistics.median(r["records"] for r in runs))
        row["processes"] = int(statistics.median(r["processes"] for r in runs))
        row["read_back_s"] = round(statistics.median(r["read_back_s"] for r in runs), 3)
        if all("self_s" in r for r in runs):
            row["self_s"] = round(statistics.median(r["self_s"] for r in runs), 4)
            row["added_cpu_s"] = round(statistics.median(cpu) - statistics.median(base_cpu), 4)
    return row


def _print(args: argparse.Namespace, summary: list[dict[str, object]], timed: list[str]) -> None:
    print(f"{args.files} files of {args.size} B x {args.epochs} epochs, DataLoader with 2 workers; "
          f"{', '.join(timed)}: {args.repeat} runs each (rotating), strace and perf {args.strace_repeat}")  # fmt: skip
    if args.other_library:
        print(f"  io other: {args.other_library}")
    print("  config       median      min   p25-p75           overhead   paired  cpu main  workers  "
          "cpu overhead  paired")  # fmt: skip
    for row in summary:
        extra = ""
        if "records" in row:
            extra = f"\n               {row['records']} records, read back in {row['read_back_s']} s"
            if "self_s" in row:
                extra += (f"\n               the io level's own measure of its cost: {row['self_s']:.3f} s of CPU; "
                          f"measured here: {row['added_cpu_s']:+.3f} s")  # fmt: skip
        print(f"  {row['config']:<10} {row['median_s']:7.3f} s {row['min_s']:7.3f} s  {row['p25_s']:.3f}-"
              f"{row['p75_s']:.3f} s  {row['overhead_pct']:+8.2f} % {row['paired_overhead_pct']:+7.2f} %  "
              f"{row['main_cpu_s']:6.2f} s {row['workers_cpu_s']:6.2f} s  {row['cpu_overhead_pct']:+9.2f} % "
              f"{row['paired_cpu_overhead_pct']:+7.2f} %{extra}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=4096, help="bytes per file (default 4096)")
    parser.add_argument("--repeat", type=int, default=15, help="runs of none, none again and io (default 15)")
    parser.add_argument("--strace-repeat", type=int, default=3, help="runs under strace and under perf (default 3)")
    parser.add_argument("--epochs", type=int, default=3,
                        help="passes over the files per run (default 3: a region of about a second, long enough "
                        "that process start-up jitter does not swamp a few %%)")  # fmt: skip
    parser.add_argument("--data", type=Path, help="folder of the files (default: a temp folder, removed)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--other-library", type=Path, metavar="FILE",
                        help="also time `io other`: the io level with this build of libxstack_io.so "
                        "preloaded instead of the installed one (a copy of an earlier build), in the same "
                        "rotation")  # fmt: skip
    args = parser.parse_args(argv)
    timed = TIMED + ["io other"] if args.other_library else TIMED
    from xstack.collect import syscalls

    tracers = [t for t in ("strace", "perf") if args.strace_repeat > 0 and syscalls._reason(t) is None]
    configs = timed + tracers
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="xstack-io-bench-") as tmp:
        data = args.data or Path(tmp) / "files"
        make_files(data, args.files, args.size)
        script = Path(tmp) / "workload.py"
        script.write_text(WORKLOAD)
        run_once("none", script, data, Path(tmp), 1)  # warm the page cache and the imports
        per_call = per_call_ns(data, Path(tmp), args.files)
        for config in _rounds(configs, args.repeat, args.strace_repeat, timed):
            runs[config].append(run_once(config, script, data, Path(tmp), args.epochs, args.other_library))
    summary = [_summary(config, runs[config], runs["none"]) for config in configs]
    _print(args, summary, timed)
    if per_call:
        print(f"  per call (C loop, CPU): {per_call['none_ns']:.0f} ns unprofiled, {per_call['io_ns']:.0f} ns with "
              f"the io level: +{per_call['added_ns']:.0f} ns per recorded call")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"files": args.files, "size": args.size, "epochs": args.epochs,
                                         "per_call": per_call, "summary": summary}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
