"""Overhead benchmark: what each xstack level costs the program it profiles, against no profiling at all.

Three models, each timed per iteration under every configuration, all in one process:

* ``cnn``: a small CNN (five Conv2d/BatchNorm2d/ReLU blocks, two max-pools, a Linear head), batch 16 of
  3x32x32 images;
* ``transformer``: ``nn.TransformerEncoder``, 4 layers, d_model 256, 4 heads, feed-forward 512, batch_first,
  batch 8 x sequence 64 (built with ``enable_nested_tensor=False``);
* ``tiny``: 200 ``Linear(16, 16)`` in an ``nn.Sequential`` at batch 1. Its kernels take a few microseconds, so it
  is bound by dispatch: the worst case for anything that runs per module call.

An iteration is one inference forward under ``torch.no_grad()`` (the models in ``eval()`` mode), or with
``--train`` a forward, a backward and an SGD step (``zero_grad``, ``backward``, ``step``; models in
``train()`` mode).

The configurations are:

* ``none``: no profiling;
* ``none again``: no profiling either, an A/A control: its "overhead" is what noise alone looks like;
* ``model``, ``model+layer``, ``model+layer+op`` (and ``model+layer+op+kernel`` when CUDA is available):
  ``with xstack.profile(levels=...) as prof:`` around the block, ``prof.step()`` after every iteration;
* ``torch.profiler``: ``torch.profiler.profile(activities=[CPU] (+ CUDA when available), record_shapes=True)``
  alone, the settings xstack's op level uses. Its ``step()`` is not called (xstack does not call it either)
  and no trace is exported.

Method. Every model is first warmed up (``--warmup`` iterations, untimed). Then ``--rounds`` rounds run; in
each round every model runs every configuration once, back to back, as a block of ``--block-warmup`` +
``--iters`` iterations inside one profile. The order of the configurations rotates by one from round to
round, so that none always goes first. Each iteration is timed on its own with ``time.perf_counter_ns()``
inside the with-block, around the step and ``prof.step()`` (after ``torch.cuda.synchronize()`` on CUDA). The
first ``--block-warmup`` iterations (10) of each block are dropped: the first calls after a profile starts
are slower, by a decaying amount, for about 10 iterations of the CNN (measured; their extra time is reported
as ``start-up ms``). Nor is the with-block's exit, where xstack completes its DuckDB store (timed on its own
as ``exit s``). A ``gc.collect()`` runs before each block, outside the timing.
Many short blocks rather than a few long ones: on a shared virtual machine the speed of the same code
drifts by several % from one second to the next, and short interleaved blocks spread that evenly.

Other processes. Around each block the script reads ``/proc/stat`` and its own CPU time; what the machine
was busy with beyond this process (other processes and the hypervisor's steal) is the block's ``others``,
in cores. A block during which others exceeded ``--max-others`` (0.25 cores) is run again, up to
``--retries`` times, ``--retry-wait`` seconds apart; the last attempt is kept. The summary says how many
blocks were redone and how many kept a busy machine anyway.

Reported per model and configuration:

* ``median ms``: the median latency over all kept iterations of all rounds;
* ``overhead %``: ``(median_cfg / median_none - 1) * 100``, from those pooled medians;
* ``paired %``: the same overhead computed per round, from the medians of the round's two blocks, then the
  median over rounds: a cross-check that cancels drift slower than a round;
* ``per-round IQR %``: the interquartile range of those per-round overheads, the spread;
* ``start-up ms``: what the dropped first iterations of a block took beyond the configuration's median,
  median over rounds (``none`` has some too: it follows a ``gc.collect()`` and another block);
* ``exit s``: leaving the with-block (xstack completing the store, merging the op trace), median.

The targets are from the spec: the ``model`` level within 1 % of no profiling and ``model+layer`` within
10 %, on the CNN and the transformer; the tiny model is reported with no target. A target is met (PASS)
when the pooled overhead is at or under it; the paired verdict and the A/A control are printed beside it.

    python bench/overhead.py                      # about 2.5 min on 2 cores
    python bench/overhead.py --quick              # a smoke run, seconds
    python bench/overhead.py --train --json bench/out/overhead-train.json
    python bench/overhead.py --models cnn --configs model --rounds 40   # one comparison, more rounds
    python bench/overhead.py --direct             # only the direct per-iteration / per-call costs, ~30 s

The table goes to stdout (``--markdown`` also prints it as a Markdown table); ``--json PATH`` writes every
raw per-iteration time, the per-block exit times and others, the summary and the machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
sys.path.insert(0, str(SRC))  # the working tree's xstack, installed or not

import torch  # noqa: E402
from torch import nn  # noqa: E402

import xstack  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MODELS = ("cnn", "transformer", "tiny")
TARGETS: dict[tuple[str, str], float] = {
    ("cnn", "model"): 1.0,
    ("transformer", "model"): 1.0,
    ("cnn", "model+layer"): 10.0,
    ("transformer", "model+layer"): 10.0,
}
"""(model, configuration) -> the spec's largest overhead in %."""


@dataclass(frozen=True)
class Config:
    name: str
    levels: str | None = None
    """xstack levels (``model,layer``); None for ``none`` and ``torch.profiler``."""
    torch_profiler: bool = False


@dataclass
class Workload:
    name: str
    description: str
    step: Callable[[], None]
    sync: Callable[[], None] | None
    module_calls: int = 0
    """``nn.Module`` calls in one iteration, counted after warm-up."""


# -- models ---------------------------------------------------------------------------------------------
def _cnn(width: int = 32) -> nn.Module:
    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    w = width
    return nn.Sequential(
        block(3, w),
        block(w, w),
        nn.MaxPool2d(2),
        block(w, 2 * w),
        block(2 * w, 2 * w),
        nn.MaxPool2d(2),
        block(2 * w, 4 * w),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * w, 10),
    )


def _transformer(d_model: int = 256, layers: int = 4) -> nn.Module:
    layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=2 * d_model, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)


def _tiny(n: int = 200, width: int = 16) -> nn.Module:
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(n)])
    for m in model:
        assert isinstance(m, nn.Linear)
        nn.init.orthogonal_(m.weight)  # keeps activations and gradients away from denormals over 200 layers
    return model


def build(name: str, device: torch.device, train: bool) -> Workload:
    """The model ``name`` with its input, as a step function doing one iteration."""
    torch.manual_seed(0)
    if name == "cnn":
        model, x, desc = _cnn(), torch.randn(16, 3, 32, 32), "5x Conv2d/BN/ReLU, 2 max-pools, Linear; batch 16x3x32x32"
    elif name == "transformer":
        model, x = _transformer(), torch.randn(8, 64, 256)
        desc = "TransformerEncoder 4 layers, d_model 256, 4 heads, ff 512; batch 8x64"
    elif name == "tiny":
        model, x, desc = _tiny(), torch.randn(1, 16), "200x Linear(16,16) in nn.Sequential; batch 1"
    else:
        raise ValueError(name)
    model, x = model.to(device), x.to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else None

    if not train:
        model.eval()

        def step() -> None:
            with torch.no_grad():
                model(x)

        return Workload(name, desc, step, sync)

    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def train_step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()

    return Workload(name, desc, train_step, sync)


# -- one block ------------------------------------------------------------------------------------------
def _cpu_now() -> tuple[float, float, float] | None:
    """(wall s, CPU s busy on the whole machine, CPU s of this process) for ``_others``; None off Linux."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    busy = (sum(ticks) - ticks[3] - ticks[4]) / CLK_TCK  # all but idle and iowait
    own = os.times()
    return time.perf_counter(), busy, own.user + own.system


def _others(before: tuple[float, float, float] | None, after: tuple[float, float, float] | None) -> float | None:
    """Cores kept busy by other processes between two ``_cpu_now`` readings."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return max(0.0, ((after[1] - before[1]) - (after[2] - before[2])) / (after[0] - before[0]))


def _timed(
    step: Callable[[], None], n: int, tick: Callable[[], None] | None, sync: Callable[[], None] | None
) -> tuple[list[int], float | None]:
    clock = time.perf_counter_ns
    out = [0] * n
    before = _cpu_now()
    for i in range(n):
        t0 = clock()
        step()
        if sync is not None:
            sync()
        if tick is not None:
            tick()
        out[i] = clock() - t0
    return out, _others(before, _cpu_now())


@dataclass
class Block:
    times_ns: list[int]
    """Every iteration of the block, the first ``--block-warmup`` included."""
    exit_ns: int
    """Leaving the with-block: xstack completing its store, torch.profiler stopping; 0 for ``none``."""
    others: float | None
    """Cores other processes kept busy during the iterations (None where unknown)."""
    attempts: int = 1


def run_block(cfg: Config, wl: Workload, n: int, workdir: Path) -> Block:
    """``n`` iterations of ``wl`` under ``cfg``."""
    clock = time.perf_counter_ns
    if cfg.levels is not None:
        path = workdir / f"{wl.name}.duckdb"
        with xstack.profile(levels=cfg.levels, path=path, name=f"overhead-{wl.name}") as prof:
            times, others = _timed(wl.step, n, prof.step, wl.sync)
            t_exit = clock()
        exit_ns = clock() - t_exit
        for leftover in workdir.glob(f"{wl.name}.duckdb*"):
            leftover.unlink()
        return Block(times, exit_ns, others)
    if cfg.torch_profiler:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if wl.sync is not None:  # the model runs on CUDA
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities, record_shapes=True):
            times, others = _timed(wl.step, n, None, wl.sync)
            t_exit = clock()
        return Block(times, clock() - t_exit, others)
    times, others = _timed(wl.step, n, None, wl.sync)
    return Block(times, 0, others)


# -- statistics -----------------------------------------------------------------------------------------
def _pct(a: float, b: float) -> float:
    return (a / b - 1.0) * 100.0


def summarize(raw: dict[str, dict[str, list[list[int]]]], configs: list[Config], discard: int) -> list[dict[str, Any]]:
    """One row per (model, configuration): medians, overhead (pooled and paired by round), spread, target."""
    rows = []
    for model, by_cfg in raw.items():
        base_rounds = [statistics.median(r[discard:]) for r in by_cfg["none"]]
        base = statistics.median(t for r in by_cfg["none"] for t in r[discard:])
        for cfg in configs:
            rounds = by_cfg[cfg.name]
            kept = [t for r in rounds for t in r[discard:]]
            med = statistics.median(kept)
            per_round = [_pct(statistics.median(r[discard:]), b) for r, b in zip(rounds, base_rounds, strict=True)]
            target = TARGETS.get((model, cfg.name))
            overhead = _pct(med, base)
            paired = statistics.median(per_round)
            q = statistics.quantiles(kept, n=4)
            # the dropped first iterations' time over this configuration's steady median, per block
            startup = statistics.median(sum(t - med for t in r[:discard]) for r in rounds) if discard else 0.0
            rq = statistics.quantiles(per_round, n=4) if len(per_round) > 1 else [per_round[0]] * 3
            rows.append(
                {
                    "model": model,
                    "config": cfg.name,
                    "iterations": len(kept),
                    "median_ms": med / 1e6,
                    "p25_ms": q[0] / 1e6,
                    "p75_ms": q[2] / 1e6,
                    "startup_extra_ms": startup / 1e6,
                    "overhead_pct": overhead,
                    "paired_overhead_pct": paired,
                    "round_overhead_pct": per_round,
                    "round_overhead_iqr_pct": [rq[0], rq[2]],
                    "target_pct": target,
                    "met": None if target is None else overhead <= target,
                    "met_paired": None if target is None else paired <= target,
                }
            )
    return rows


HEADER = [
    "model",
    "config",
    "median ms",
    "overhead %",
    "paired %",
    "per-round IQR %",
    "target",
    "result",
    "start-up ms",
    "exit s",
]
RIGHT = {2, 3, 4, 5, 8, 9}


def _fmt_row(r: dict[str, Any], exit_s: float) -> list[str]:
    none = r["config"] == "none"
    lo, hi = r["round_overhead_iqr_pct"]
    target = "—" if r["target_pct"] is None else f"≤ {r['target_pct']:g} %"
    result = "—" if r["met"] is None else ("PASS" if r["met"] else "MISS")
    return [
        r["model"],
        r["config"],
        f"{r['median_ms']:.3f}",
        "—" if none else f"{r['overhead_pct']:+.1f}",
        "—" if none else f"{r['paired_overhead_pct']:+.1f}",
        "—" if none else f"{lo:+.1f} .. {hi:+.1f}",
        target,
        result,
        f"{r['startup_extra_ms']:+.1f}",
        "—" if r["config"].startswith("none") else f"{exit_s:.2f}",
    ]


def print_table(rows: list[dict[str, Any]], exits: dict[str, dict[str, list[int]]], markdown: bool) -> None:
    body = [_fmt_row(r, statistics.median(exits[r["model"]][r["config"]]) / 1e9) for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(HEADER)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in RIGHT else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    print(line(HEADER))
    print("  ".join("-" * w for w in widths))
    last = None
    for b in body:
        if last is not None and b[0] != last:
            print()
        print(line(b))
        last = b[0]
    if markdown:
        print()
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "|".join("--:" if i in RIGHT else "---" for i in range(len(HEADER))) + "|")
        for b in body:
            print("| " + " | ".join(b) + " |")


# -- machine --------------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "xstack": getattr(xstack, "__version__", None),
        "xstack_commit": _git("rev-parse", "--short", "HEAD"),
        "src_modified": (_git("status", "--porcelain", "--", "src") or "").splitlines(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            info["mem_total_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    return info


def _git(*args: str) -> str | None:
    """Output of a read-only git command in the repository, or None."""
    try:
        res = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# -- main -----------------------------------------------------------------------------------------------
def _count_module_calls(wl: Workload) -> int:
    calls = 0

    def count(module: nn.Module, args: Any) -> None:
        nonlocal calls
        calls += 1

    handle = nn.modules.module.register_module_forward_pre_hook(count)
    try:
        wl.step()
    finally:
        handle.remove()
    return calls


def fixed_costs(workdir: Path, rounds: int = 7, calls: int = 4000) -> dict[str, float]:
    """The cost of xstack's per-call work itself, measured on trivial modules where it is all there is.

    ``model_us``: one top-level call of an ``nn.Identity`` plus ``prof.step()`` at the model level, less the
    same call without profiling: what the model level adds to one iteration of any model. ``layer_us``: per
    module call, a 50-``Identity`` ``nn.Sequential`` at ``model,layer`` less without profiling, divided by
    its 51 calls. Thousands of calls per block and the median over alternating blocks make these steady
    where whole-model latencies drift by several %.
    """
    import xstack

    x = torch.zeros(1)
    one, chain = nn.Identity(), nn.Sequential(*[nn.Identity() for _ in range(50)])

    def per_call(module: nn.Module, levels: str | None, n: int) -> float:
        t0 = time.perf_counter_ns()
        if levels is None:
            for _ in range(n):
                module(x)
            return (time.perf_counter_ns() - t0) / n / 1e3
        with xstack.profile(levels=levels, path=workdir / "fixed.duckdb") as prof:
            t0 = time.perf_counter_ns()
            for _ in range(n):
                module(x)
                prof.step()
            return (time.perf_counter_ns() - t0) / n / 1e3

    model, layer = [], []
    for _ in range(rounds):
        model.append(per_call(one, "model", calls) - per_call(one, None, calls))
        layer.append((per_call(chain, "model,layer", calls // 10) - per_call(chain, None, calls // 10)) / 51)
    return {"model_us": statistics.median(model), "layer_us": statistics.median(layer)}


def direct(rounds: int, argv: list[str] | None) -> int:
    """``--direct``: ``fixed_costs`` alone, printed with what was measured."""
    command = shlex.join(["python", *sys.argv]) if argv is None else shlex.join(["python", "bench/overhead.py", *argv])
    info = machine()
    dirty = f" + uncommitted changes: {'; '.join(info['src_modified'])}" if info["src_modified"] else ""
    print(f"command: {command}")
    print(f"xstack: {info['xstack_commit']}{dirty} ({Path(xstack.__file__).parent})")
    with tempfile.TemporaryDirectory(prefix="xstack-overhead-") as tmp:
        fixed = fixed_costs(Path(tmp), rounds=rounds)
    print(
        f"measured directly on trivial modules, median of {rounds} alternating blocks: the model level adds "
        f"{fixed['model_us']:.1f} us to an iteration (one top-level call and prof.step()); the layer level "
        f"{fixed['layer_us']:.1f} us per module call"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=14, help="rounds; each runs every configuration once (default 14)")
    ap.add_argument("--iters", type=int, default=20, help="timed iterations kept per block (default 20)")
    ap.add_argument("--block-warmup", type=int, default=10, help="iterations dropped at the start of a block (10)")
    ap.add_argument("--warmup", type=int, default=20, help="untimed iterations per model before round 1 (20)")
    ap.add_argument(
        "--max-others",
        type=float,
        default=0.25,
        metavar="CORES",
        help="redo a block when other processes kept more than this many cores busy during it (default 0.25)",
    )
    ap.add_argument("--retries", type=int, default=2, help="times a block may be redone for --max-others (2)")
    ap.add_argument("--retry-wait", type=float, default=1.0, help="seconds to wait before redoing a block (1)")
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), help="models to run (all)")
    ap.add_argument("--train", action="store_true", help="time forward + backward + SGD step, not inference")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: leave PyTorch's default)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda when available")
    ap.add_argument("--configs", nargs="+", metavar="NAME", help="run only these configurations (none always runs)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round of 1 + 2 iterations")
    ap.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    ap.add_argument("--json", type=Path, metavar="PATH", help="write raw times, summary and machine to PATH")
    ap.add_argument(
        "--direct",
        action="store_true",
        help="only the direct measurement of the model level per iteration and the layer level per module call, "
        "over --rounds alternating blocks (~15 s with --rounds 7)",
    )
    args = ap.parse_args(argv)
    if args.direct:
        return direct(args.rounds, argv)
    if args.quick:
        args.rounds, args.iters, args.block_warmup, args.warmup, args.retries = 1, 2, 1, 1, 0
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    device = torch.device("cuda" if cuda else "cpu")

    configs = [Config("none"), Config("none again"), Config("model", "model"), Config("model+layer", "model,layer")]
    configs.append(Config("model+layer+op", "model,layer,op"))
    if cuda:
        configs.append(Config("model+layer+op+kernel", "model,layer,op,kernel"))
    configs.append(Config("torch.profiler", torch_profiler=True))
    if args.configs:
        unknown = set(args.configs) - {c.name for c in configs}
        if unknown:
            ap.error(f"unknown configuration(s) {sorted(unknown)}; known: {', '.join(c.name for c in configs)}")
        configs = [c for c in configs if c.name == "none" or c.name in args.configs]

    info = machine()
    command = shlex.join(["python", *sys.argv]) if argv is None else shlex.join(["python", "bench/overhead.py", *argv])
    mode = "train (forward + backward + SGD step)" if args.train else "inference (forward under torch.no_grad())"
    print(f"command: {command}")
    print(
        f"machine: {info.get('cpu')}, {info['cpu_count']} cores ({info['cpus_usable']} usable), "
        f"{info.get('mem_total_gib')} GiB; python {info['python']}, torch {info['torch']}, "
        f"torch threads {info['torch_threads']} (interop {info['torch_interop_threads']}); device {device}"
        + (f" ({info['cuda']})" if info["cuda"] else "")
    )
    dirty = f" + uncommitted changes: {'; '.join(info['src_modified'])}" if info["src_modified"] else ""
    print(f"xstack: {info['xstack_commit']}{dirty}")
    print(f"mode: {mode}; {args.rounds} rounds x {args.block_warmup} + {args.iters} iterations per block")
    print(f"configurations: {', '.join(c.name for c in configs)}")
    load_start = _loadavg()
    print(f"load average at start: {load_start}", flush=True)

    started = time.perf_counter()
    workloads = [build(name, device, args.train) for name in args.models]
    for wl in workloads:
        print(f"  {wl.name}: {wl.description}")
        for _ in range(args.warmup):
            wl.step()
        wl.module_calls = _count_module_calls(wl)
        if wl.sync is not None:
            wl.sync()

    n = args.block_warmup + args.iters
    blocks: dict[str, dict[str, list[Block]]] = {wl.name: {c.name: [] for c in configs} for wl in workloads}
    orders: list[list[str]] = []
    with tempfile.TemporaryDirectory(prefix="xstack-overhead-") as tmp:
        workdir = Path(tmp)
        for rnd in range(args.rounds):
            k = rnd % len(configs)
            order = configs[k:] + configs[:k]
            orders.append([c.name for c in order])
            t_round = time.perf_counter()
            redone = 0
            for wl in workloads:
                for cfg in order:
                    for attempt in range(1, args.retries + 2):
                        if attempt > 1:
                            redone += 1
                            time.sleep(args.retry_wait)
                        gc.collect()
                        block = run_block(cfg, wl, n, workdir)
                        block.attempts = attempt
                        if block.others is None or block.others <= args.max_others:
                            break
                    blocks[wl.name][cfg.name].append(block)
            others = [b[-1].others for m in blocks.values() for b in m.values() if b[-1].others is not None]
            print(
                f"round {rnd + 1}/{args.rounds} ({time.perf_counter() - t_round:.1f} s; other processes "
                f"{max(others, default=0):.2f} cores at most; {redone} blocks redone), order: "
                + ", ".join(c.name for c in order),
                flush=True,
            )
    elapsed = time.perf_counter() - started
    load_end = _loadavg()
    raw = {m: {c: [b.times_ns for b in bs] for c, bs in by.items()} for m, by in blocks.items()}
    exits = {m: {c: [b.exit_ns for b in bs] for c, bs in by.items()} for m, by in blocks.items()}
    every = [b for by in blocks.values() for bs in by.values() for b in bs]
    busy = [b.others for b in every if b.others is not None]
    over = sum(1 for x in busy if x > args.max_others)
    noise = (
        f"other processes kept {statistics.mean(busy):.2f} cores busy on average during the timed iterations "
        f"(max {max(busy):.2f}); {sum(b.attempts - 1 for b in every)} of {len(every)} blocks were redone, "
        f"{over} kept above --max-others {args.max_others}"
        if busy
        else "other processes' CPU use: unknown (no /proc/stat)"
    )

    rows = summarize(raw, configs, args.block_warmup)
    print()
    print_table(rows, exits, args.markdown)
    print()
    control = {r["model"]: r for r in rows if r["config"] == "none again"}
    for r in rows:
        if r["met"] is not None:
            verdict = "PASS" if r["met"] else f"MISS by {r['overhead_pct'] - r['target_pct']:.2f} points"
            aa = control.get(r["model"])
            print(
                f"target {r['model']:<12} {r['config']:<12} ≤ {r['target_pct']:g} %: {r['overhead_pct']:+.2f} % -> "
                f"{verdict}; paired by round {r['paired_overhead_pct']:+.2f} % -> "
                + ("PASS" if r["met_paired"] else "MISS")
                + (f"; A/A control (none again) {aa['overhead_pct']:+.2f} %" if aa else "")
            )
    fixed: dict[str, float] = {}
    if not args.quick:
        with tempfile.TemporaryDirectory(prefix="xstack-overhead-") as tmp:
            fixed = fixed_costs(Path(tmp))
        print(
            f"\nmeasured directly on trivial modules: the model level adds {fixed['model_us']:.1f} us to an "
            "iteration (one top-level call and prof.step()); the layer level "
            f"{fixed['layer_us']:.1f} us per module call"
        )
        for wl in workloads:
            base = next(r["median_ms"] for r in rows if r["model"] == wl.name and r["config"] == "none") * 1e3
            print(
                f"  {wl.name:<12} model level {fixed['model_us'] / base * 100:.2f} % of its {base / 1e3:.3f} ms; "
                f"layer level {fixed['layer_us'] * wl.module_calls / base * 100:.1f} % "
                f"({wl.module_calls} module calls)"
            )
    print(f"\n{noise}")
    print(f"took {elapsed:.1f} s; load average at start {load_start}, at end {load_end}")

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "command": command,
            "machine": info,
            "mode": "train" if args.train else "inference",
            "device": str(device),
            "rounds": args.rounds,
            "iters": args.iters,
            "block_warmup": args.block_warmup,
            "warmup": args.warmup,
            "models": {wl.name: wl.description for wl in workloads},
            "configs": [{"name": c.name, "levels": c.levels, "torch_profiler": c.torch_profiler} for c in configs],
            "orders": orders,
            "elapsed_s": elapsed,
            "loadavg_start": load_start,
            "loadavg_end": load_end,
            "summary": rows,
            "fixed_costs_us": fixed,
            "noise": noise,
            "raw_ns": raw,
            "exit_ns": exits,
            "others_cores": {m: {c: [b.others for b in bs] for c, bs in by.items()} for m, by in blocks.items()},
            "attempts": {m: {c: [b.attempts for b in bs] for c, bs in by.items()} for m, by in blocks.items()},
            "note": "raw_ns[model][config][round] holds every iteration of the block, the first block_warmup included",
        }
        args.json.write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
