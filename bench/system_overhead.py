"""Sampler overhead benchmark: what the system level's sampler costs the demo training loop, at 10 ms and 1 ms.

The workload is the loop of ``xstack demo`` (``src/xstack/demo.py``), built with its own code: a DataLoader
with 2 worker processes reading synthetic ``.npy`` images (batch 16 of 3x32x32), and per iteration the
demo's stages: ``load`` (the next batch), ``preprocess`` (normalise), ``step`` (forward, backward and SGD step
of the small CNN and the small vision transformer), ``predict`` (both models in eval mode, no grad) and
``postprocess`` (accuracy, ``.item()``).

Configurations, timed per iteration in one process:

* ``none``: no profiling; ``none again``: the same, an A/A control (its "overhead" is what noise looks like);
* ``model``: ``xstack.profile(levels="model")`` around the block, ``prof.step()`` after each iteration;
* ``model+system 10ms`` and ``model+system 1ms``: the same with the ``system`` level, its sampler at
  ``XSTACK_SYSTEM_INTERVAL_MS`` = 10 and 1;
* ``model+system 10ms py``: at 10 ms with the Python sampler (``XSTACK_SYSTEM_SAMPLER=python``), side by side.

The sampler's overhead is ``median_cfg / median_model - 1``, against the ``model`` configuration, so that the
model level's own cost is not counted; the target is under 1 % at 10 ms.

Method, as ``bench/overhead.py``: ``--warmup`` untimed iterations first; then ``--rounds`` rounds, each running
every configuration once as a block of ``--block-warmup`` (dropped) + ``--iters`` timed iterations, the
order rotating by one each round; ``gc.collect()`` before each block. Each block gets a fresh iterator over
the DataLoader (its workers start and prefetch before the block, untimed) and its own store. A block during
which other processes (not this one nor its workers) kept more than ``--max-others`` cores busy is redone (up
to ``--retries`` times).

Then the interpreter lock's worst case: ``--python-rounds`` runs of a pure-Python loop that holds the lock
throughout and allocates nothing, under ``none``, ``model`` and the two sampler intervals, order rotating;
its time against ``model`` (pooled medians and paired) and the share of the sampler's samples that came late.

Reported per configuration: ``median ms`` (all kept iterations of all rounds), ``vs none %`` and ``vs model %``
(pooled medians), ``paired %`` (per round against that round's ``model`` block, median over rounds) and its
interquartile range; for the sampler, from each run's ``config.system``: samples per second, the share of
due samples skipped as late, the sampler thread's CPU time as % of one core and of the whole machine (the
direct cost: CPU the program's threads and workers could have used), and the mean wall time of a sample.

    python bench/system_overhead.py                   # about 3 min on 2 cores
    python bench/system_overhead.py --quick           # a smoke run, seconds
    python bench/system_overhead.py --rounds 20 --json bench/out/system_overhead.json
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from overhead import CLK_TCK, _cpu_now, _loadavg, _others, _pct, machine  # noqa: E402

import xstack  # noqa: E402
from xstack import demo  # noqa: E402
from xstack.collect._system_native import BACKEND_ENV  # noqa: E402
from xstack.collect.system import INTERVAL_ENV  # noqa: E402
from xstack.trace import attrs as A  # noqa: E402

TARGET_PCT = 1.0
"""The issue's target for the sampler at 10 ms, in % of the ``model`` configuration's iteration time."""


@dataclass(frozen=True)
class Config:
    name: str
    levels: str | None = None
    interval_ms: float | None = None
    sampler: str = "native"
    """``XSTACK_SYSTEM_SAMPLER``: the C sampler thread (the default) or the Python one."""


CONFIGS = (
    Config("none"),
    Config("none again"),
    Config("model", "model"),
    Config("model+system 10ms", "model,system", 10.0),
    Config("model+system 1ms", "model,system", 1.0),
    Config("model+system 10ms py", "model,system", 10.0, "python"),
)


@dataclass
class Block:
    times_ns: list[int]
    others: float | None
    wall_s: float = 0.0
    system: dict[str, Any] = field(default_factory=dict)
    attempts: int = 1


class Loop:
    """The demo's models, optimizer and data, with one iteration as ``step(batches)``."""

    def __init__(self, files: list[Path]) -> None:
        torch.manual_seed(0)
        self.cnn, self.vit = demo._cnn(torch), demo._vit(torch)
        params = [*self.cnn.parameters(), *self.vit.parameters()]
        self.optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9)
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.loader = torch.utils.data.DataLoader(demo._ImageFiles(files), batch_size=demo.BATCH,
                                                  num_workers=demo.WORKERS)  # fmt: skip

    def step(self, batches: Any) -> None:
        """One iteration of the demo's loop."""
        with xstack.span("load"):
            images, labels = next(batches)
        with xstack.span("preprocess"):
            images = (images - images.mean(dim=(0, 2, 3), keepdim=True)) / images.std()
        with xstack.span("step"):
            self.optimizer.zero_grad()
            loss = self.loss_fn(self.cnn(images), labels) + self.loss_fn(self.vit(images), labels)
            loss.backward()
            self.optimizer.step()
        with xstack.span("predict"), torch.no_grad():
            logits = self.cnn.eval()(images) + self.vit.eval()(images)
            self.cnn.train(), self.vit.train()
        with xstack.span("postprocess"):
            (logits.argmax(dim=1) == labels).float().mean().item()


def _tree_cpu_now() -> tuple[float, float, float] | None:
    """``overhead._cpu_now`` with this process's CPU time counting its DataLoader workers' too, so that their
    work is not taken for other processes' load."""
    now = _cpu_now()
    if now is None:
        return None
    workers = 0.0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids = f.read().split()
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            workers += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return now[0], now[1], now[2] + workers


def _timed(step: Callable[[], None], n: int, tick: Callable[[], None] | None) -> tuple[list[int], float | None]:
    clock = time.perf_counter_ns
    out = [0] * n
    before = _tree_cpu_now()
    for i in range(n):
        t0 = clock()
        step()
        if tick is not None:
            tick()
        out[i] = clock() - t0
    return out, _others(before, _tree_cpu_now())


def run_block(cfg: Config, loop: Loop, n: int, workdir: Path) -> Block:
    """``n`` iterations of the loop under ``cfg``, on a fresh iterator over the data (its workers stop when it
    is dropped, on return: outside the timing)."""
    batches = iter(loop.loader)
    if cfg.levels is None:
        times, others = _timed(lambda: loop.step(batches), n, None)
        return Block(times, others)
    path = workdir / "block.duckdb"
    with _sampler_env(cfg), xstack.profile(levels=cfg.levels, path=path, name="system-overhead") as prof:
        t0 = time.perf_counter()
        times, others = _timed(lambda: loop.step(batches), n, prof.step)
        wall = time.perf_counter() - t0
    with prof.open() as store:
        config = orjson.loads(store.query("SELECT config FROM runs")[0][0])
    for leftover in workdir.glob("block.duckdb*"):
        leftover.unlink()
    return Block(times, others, wall, config.get(A.CONFIG_SYSTEM) or {})


@contextlib.contextmanager
def _sampler_env(cfg: Config) -> Iterator[None]:
    """``cfg``'s interval and sampler in the environment, where the system level reads them; restored after."""
    saved = {name: os.environ.get(name) for name in (INTERVAL_ENV, BACKEND_ENV)}
    os.environ[INTERVAL_ENV] = str(cfg.interval_ms or 10.0)
    os.environ[BACKEND_ENV] = cfg.sampler
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _python_loop(n: int) -> None:
    """Pure Python that holds the interpreter lock throughout and allocates nothing (``itertools.repeat``
    and small ints), so that the heap's state left by earlier runs does not change its speed."""
    s = 0
    for _ in itertools.repeat(None, n):
        s = (s * 31 + 7) & 255


def python_rounds(rounds: int, n: int, workdir: Path) -> list[dict[str, Any]]:
    """The interpreter lock's worst case: the sampler's thread must take the lock from a program that never
    lets it go (the program's thread gives it up only when the sampler asks, after the switch interval).
    ``rounds`` rounds of every configuration but ``none again`` on ``_python_loop(n)``, order rotating."""
    configs = [c for c in CONFIGS if c.name != "none again"]
    times: dict[str, list[float]] = {c.name: [] for c in configs}
    system: dict[str, list[dict[str, Any]]] = {c.name: [] for c in configs}
    for rnd in range(rounds):
        k = rnd % len(configs)
        for cfg in configs[k:] + configs[:k]:
            gc.collect()
            if cfg.levels is None:
                t0 = time.perf_counter()
                _python_loop(n)
                times[cfg.name].append(time.perf_counter() - t0)
                continue
            path = workdir / "python.duckdb"
            with _sampler_env(cfg), xstack.profile(levels=cfg.levels, path=path, name="system-overhead-py") as prof:
                t0 = time.perf_counter()
                _python_loop(n)
                times[cfg.name].append(time.perf_counter() - t0)
            with prof.open() as store:
                sampled = orjson.loads(store.query("SELECT config FROM runs")[0][0]).get(A.CONFIG_SYSTEM)
            if sampled:
                system[cfg.name].append(sampled)
            for leftover in workdir.glob("python.duckdb*"):
                leftover.unlink()
    rows = []
    for cfg in configs:
        row: dict[str, Any] = {
            "config": cfg.name,
            "median_ms": 1e3 * statistics.median(times[cfg.name]),
            "vs_model_pct": _pct(statistics.median(times[cfg.name]), statistics.median(times["model"])),
            "paired_vs_model_pct": statistics.median(
                _pct(t, m) for t, m in zip(times[cfg.name], times["model"], strict=True)
            ),
        }
        if system[cfg.name]:
            samples = sum(x["samples"] for x in system[cfg.name])
            late = sum(x["late_samples"] for x in system[cfg.name])
            row["late_pct"] = 100.0 * late / (samples + late)
        rows.append(row)
    return rows


def summarize(blocks: dict[str, list[Block]], discard: int) -> list[dict[str, Any]]:
    """One row per configuration: medians, overhead against none and against model (pooled and paired)."""

    def med(b: Block) -> float:
        return statistics.median(b.times_ns[discard:])

    pooled = {name: statistics.median(t for b in bs for t in b.times_ns[discard:]) for name, bs in blocks.items()}
    rows = []
    for name, bs in blocks.items():
        paired = [_pct(med(b), med(m)) for b, m in zip(bs, blocks["model"], strict=True)]
        q = statistics.quantiles(paired, n=4) if len(paired) > 1 else [paired[0]] * 3
        sampled = [b for b in bs if b.system]
        row: dict[str, Any] = {
            "config": name,
            "iterations": sum(len(b.times_ns) - discard for b in bs),
            "median_ms": pooled[name] / 1e6,
            "vs_none_pct": _pct(pooled[name], pooled["none"]),
            "vs_model_pct": _pct(pooled[name], pooled["model"]),
            "paired_vs_model_pct": statistics.median(paired),
            "paired_iqr_pct": [q[0], q[2]],
        }
        if sampled:
            wall = sum(b.wall_s for b in sampled)
            samples = sum(b.system["samples"] for b in sampled)
            late = sum(b.system["late_samples"] for b in sampled)
            cpu_pct = 100.0 * sum(b.system["sampler_cpu_ns"] for b in sampled) / 1e9 / wall
            row |= {
                "samples_per_s": samples / wall,
                "late_pct": 100.0 * late / (samples + late),
                "sampler_cpu_pct": cpu_pct,
                "sampler_machine_pct": cpu_pct / (os.cpu_count() or 1),
                "sample_us": statistics.median(b.system["sample_us"] for b in sampled),
                "workers": max(b.system.get("workers", 0) for b in sampled),
            }
        rows.append(row)
    return rows


HEADER = ["config", "median ms", "vs none %", "vs model %", "paired %", "paired IQR %", "samples/s", "late %",
          "sampler CPU % of a core", "% of the machine", "sample us"]  # fmt: skip


def _cells(r: dict[str, Any]) -> list[str]:
    lo, hi = r["paired_iqr_pct"]
    base = r["config"] in ("none", "model")
    sampler = (
        [
            f"{r['samples_per_s']:.0f}",
            f"{r['late_pct']:.1f}",
            f"{r['sampler_cpu_pct']:.2f}",
            f"{r['sampler_machine_pct']:.2f}",
            f"{r['sample_us']:.0f}",
        ]
        if "samples_per_s" in r
        else ["—"] * 5
    )
    return [
        r["config"],
        f"{r['median_ms']:.2f}",
        "—" if r["config"] == "none" else f"{r['vs_none_pct']:+.1f}",
        "—" if base or r["config"] == "none again" else f"{r['vs_model_pct']:+.2f}",
        "—" if base or r["config"] == "none again" else f"{r['paired_vs_model_pct']:+.2f}",
        "—" if base or r["config"] == "none again" else f"{lo:+.1f} .. {hi:+.1f}",
        *sampler,
    ]


def print_table(rows: list[dict[str, Any]], markdown: bool) -> None:
    body = [_cells(r) for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(HEADER)]
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(HEADER, widths, strict=True))))
    for b in body:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(b, widths, strict=True))))
    if markdown:
        print()
        print("| " + " | ".join(HEADER) + " |")
        print("|---|" + "--:|" * (len(HEADER) - 1))
        for b in body:
            print("| " + " | ".join(b) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=12, help="rounds; each runs every configuration once (12)")
    ap.add_argument("--iters", type=int, default=30, help="timed iterations kept per block (30)")
    ap.add_argument("--block-warmup", type=int, default=5, help="iterations dropped at the start of a block (5)")
    ap.add_argument("--warmup", type=int, default=20, help="untimed iterations before round 1 (20)")
    ap.add_argument(
        "--max-others",
        type=float,
        default=0.25,
        metavar="CORES",
        help="redo a block when other processes kept more than this many cores busy (0.25)",
    )
    ap.add_argument("--retries", type=int, default=2, help="times a block may be redone for --max-others (2)")
    ap.add_argument("--python-rounds", type=int, default=15,
                    help="rounds of the pure-Python loop, the interpreter lock's worst case (15)")  # fmt: skip
    ap.add_argument("--python-iters", type=int, default=6_000_000,
                    help="iterations of the pure-Python loop per run (6,000,000: about 0.15 s)")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round of 1 + 2 iterations")
    ap.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    ap.add_argument("--json", type=Path, metavar="PATH", help="write raw times, summary and machine to PATH")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.iters, args.block_warmup, args.warmup, args.retries = 1, 2, 1, 1, 0
        args.python_rounds, args.python_iters = 1, 100_000
    info = machine()
    command = shlex.join(["python", "bench/system_overhead.py", *(sys.argv[1:] if argv is None else argv)])
    print(f"command: {command}")
    print(
        f"machine: {info.get('cpu')}, {info['cpu_count']} cores, {info.get('mem_total_gib')} GiB; python "
        f"{info['python']}, torch {info['torch']} ({info['torch_threads']} threads); xstack {info['xstack_commit']}"
        + (f" + uncommitted changes in {len(info['src_modified'])} files" if info["src_modified"] else "")
    )
    print(f"{args.rounds} rounds x {args.block_warmup} + {args.iters} iterations per block; load average "
          f"{_loadavg()}", flush=True)  # fmt: skip
    n = args.block_warmup + args.iters
    started = time.perf_counter()
    blocks: dict[str, list[Block]] = {c.name: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="xstack-system-overhead-") as tmp:
        workdir = Path(tmp)
        files = demo.write_dataset(workdir, images=max(n, args.warmup) * demo.BATCH)
        loop = Loop(files)
        warm = iter(loop.loader)
        for _ in range(args.warmup):
            loop.step(warm)
        del warm
        for rnd in range(args.rounds):
            k = rnd % len(CONFIGS)
            order = CONFIGS[k:] + CONFIGS[:k]
            t_round, redone = time.perf_counter(), 0
            for cfg in order:
                for attempt in range(1, args.retries + 2):
                    redone += attempt > 1
                    gc.collect()
                    block = run_block(cfg, loop, n, workdir)
                    block.attempts = attempt
                    if block.others is None or block.others <= args.max_others:
                        break
                    time.sleep(1.0)
                blocks[cfg.name].append(block)
            print(f"round {rnd + 1}/{args.rounds} ({time.perf_counter() - t_round:.1f} s, {redone} blocks redone), "
                  f"order: {', '.join(c.name for c in order)}", flush=True)  # fmt: skip
        python_rows = python_rounds(args.python_rounds, args.python_iters, workdir)
    elapsed = time.perf_counter() - started
    rows = summarize(blocks, args.block_warmup)
    print()
    print_table(rows, args.markdown)
    print()
    ten = next(r for r in rows if r["config"] == "model+system 10ms")
    aa = next(r for r in rows if r["config"] == "none again")
    verdict = "PASS" if ten["vs_model_pct"] < TARGET_PCT else "MISS"
    print(f"target: sampler at 10 ms under {TARGET_PCT:g} % of the model configuration: "
          f"{ten['vs_model_pct']:+.2f} % -> {verdict} (paired {ten['paired_vs_model_pct']:+.2f} %); "
          f"A/A control {aa['vs_none_pct']:+.2f} %")  # fmt: skip
    print(f"pure-Python loop ({args.python_rounds} rounds of {args.python_iters:,} iterations; the program never "
          "lets the interpreter lock go):")  # fmt: skip
    for r in python_rows:
        late = f", {r['late_pct']:.0f} % of samples late" if "late_pct" in r else ""
        print(f"  {r['config']:<21} {r['median_ms']:8.1f} ms  vs model {r['vs_model_pct']:+6.2f} % "
              f"(paired {r['paired_vs_model_pct']:+6.2f} %){late}")  # fmt: skip
    print(f"took {elapsed:.1f} s; load average at end {_loadavg()}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "command": command,
            "machine": info,
            "rounds": args.rounds,
            "iters": args.iters,
            "block_warmup": args.block_warmup,
            "elapsed_s": elapsed,
            "summary": rows,
            "python_loop": python_rows,
            "raw_ns": {name: [b.times_ns for b in bs] for name, bs in blocks.items()},
            "system": {name: [b.system for b in bs] for name, bs in blocks.items()},
            "others_cores": {name: [b.others for b in bs] for name, bs in blocks.items()},
        }
        args.json.write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
