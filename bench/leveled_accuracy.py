"""Accuracy of leveled measurement: does the merged profile give the latencies of the un-profiled model?

For each model of ``bench/overhead.py`` (``cnn``, ``transformer``, ``tiny``; inference under
``torch.no_grad()``, or ``--train``), all in one process, ``--runs`` times:

* ``unprofiled``: ``--warmup`` untimed then ``--iters`` timed iterations with no profiler at all, just
  before the measurement, whose first pass is the ``model`` pass (the reference is the block next to it in
  time: on a shared virtual machine the speed of the same code drifts by several % within seconds); a second
  block just after the measurement gives that drift (``drift``, after vs before);
* ``xstack.measure(step, warmup=--warmup, iters=--iters)`` with the default passes (``model``,
  ``model+layer``, ``model+layer+op``, and ``model+layer+op+kernel`` on CUDA): each pass's median step
  latency, and the merged profile's model latency (its step span: the median of the ``model`` pass);
* ``torch.profiler``: ``torch.profiler.profile(activities=[CPU] (+ CUDA), record_shapes=True,
  schedule=schedule(wait=0, warmup=--warmup, active=--iters))`` around the iterations with ``prof.step()``
  after each, and the median of its own ``ProfilerStep#N`` durations: the step time a torch.profiler user
  reads;
* the merged per-layer latencies: the merged durations of the model's top-level layers (the children of the
  module called) summed, against the merged forward latency (the ``model`` pass's forward span).

Each iteration is timed with ``time.perf_counter_ns()`` (after ``torch.cuda.synchronize()`` on CUDA).
Errors are ``(x / reference - 1) * 100``; the table gives the median over the runs, and the spread (min to
max) beside it. Targets (PASS/FAIL): merged model latency within 2% of un-profiled, and merged top-level
layers summing to within 5% of the forward latency, on the CNN and the transformer; the tiny model (200
``Linear(16, 16)``, bound by per-call costs) is reported without targets.

    python bench/leveled_accuracy.py                   # about 3 min on 2 cores
    python bench/leveled_accuracy.py --quick           # a smoke run
"""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from overhead import MODELS, Workload, build, machine  # noqa: E402

import xstack  # noqa: E402

TARGETS = {"merged_err_pct": 2.0, "layer_sum_err_pct": 5.0}
"""Largest error in % (absolute) for the CNN and the transformer."""
TARGET_MODELS = ("cnn", "transformer")


def _timed(wl: Workload, warmup: int, iters: int) -> list[int]:
    for _ in range(warmup):
        wl.step()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        wl.step()
        if wl.sync is not None:
            wl.sync()
        out.append(time.perf_counter_ns() - t0)
    return out


def _torch_profiler_steps(wl: Workload, warmup: int, iters: int) -> list[float]:
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if wl.sync is not None else [])
    # the schedule is what makes torch.profiler record its ProfilerStep#N spans; its warm-up steps run the
    # profiler and discard what it records
    plan = schedule(wait=0, warmup=warmup, active=iters, repeat=1)
    with profile(activities=activities, record_shapes=True, schedule=plan) as prof:
        for _ in range(warmup + iters):
            wl.step()
            if wl.sync is not None:
                wl.sync()
            prof.step()
    # events() names them "ProfilerStep*"; one per active step
    steps = sorted((e for e in prof.events() if e.name.startswith("ProfilerStep")), key=lambda e: e.time_range.start)
    return [e.time_range.elapsed_us() * 1e3 for e in steps]


def _measured(wl: Workload, warmup: int, iters: int, workdir: Path) -> dict[str, Any]:
    def step() -> None:
        wl.step()
        if wl.sync is not None:
            wl.sync()

    path = xstack.measure(step, warmup=warmup, iters=iters, path=workdir / f"{wl.name}.duckdb", progress=False)
    with xstack.open_store(path) as store:
        run_id, config = store.query("SELECT run_id, config FROM runs WHERE pass = 'merged'")[0]
        overhead = orjson.loads(config)["overhead"]
        step_ns, forward_ns, forward_id = store.query(
            """SELECT s.dur_ns, f.dur_ns, f.span_id FROM spans s JOIN spans f ON f.run_id = s.run_id
                   AND f.parent_id = s.span_id AND f.level = 'model'
               WHERE s.run_id = ? AND s.parent_id IS NULL ORDER BY f.dur_ns DESC LIMIT 1""",
            [run_id],
        )[0]
        top = store.query(
            """SELECT count(*), sum(c.dur_ns) FROM spans r JOIN spans c ON c.run_id = r.run_id
                   AND c.parent_id = r.span_id AND c.level = 'layer'
               WHERE r.run_id = ? AND r.parent_id = ? AND r.level = 'layer'""",
            [run_id, forward_id],
        )[0]
        health = store.query('SELECT "check", count FROM health WHERE run_id = ?', [run_id])
    for leftover in workdir.glob(f"{wl.name}.duckdb*"):
        leftover.unlink()
    return {
        "passes_ms": {o["pass"]: o["step_median_ns"] / 1e6 for o in overhead},
        "merged_ms": step_ns / 1e6,
        "forward_ms": forward_ns / 1e6,
        "top_layers": int(top[0]),
        "layer_sum_ms": (top[1] or 0) / 1e6,
        "health": {c: int(n) for c, n in health},
    }


def one_run(wl: Workload, warmup: int, iters: int, workdir: Path) -> dict[str, Any]:
    """One measurement of ``wl`` with un-profiled blocks just before and after it, and torch.profiler."""
    gc.collect()
    before = _timed(wl, warmup, iters)
    measured = _measured(wl, warmup, iters, workdir)
    gc.collect()
    after = _timed(wl, warmup, iters)
    tp = _torch_profiler_steps(wl, warmup, iters)
    unprofiled = statistics.median(before) / 1e6
    row = {"unprofiled_ms": unprofiled, "drift_pct": _err(statistics.median(after), statistics.median(before))}
    row |= measured
    row["torch_profiler_ms"] = statistics.median(tp) / 1e6
    row["merged_err_pct"] = _err(row["merged_ms"], unprofiled)
    row["torch_profiler_err_pct"] = _err(row["torch_profiler_ms"], unprofiled)
    row["deepest_pass_err_pct"] = _err(list(row["passes_ms"].values())[-1], unprofiled)
    row["layer_sum_err_pct"] = _err(row["layer_sum_ms"], row["forward_ms"])
    return row


def _err(x: float, reference: float) -> float:
    return (x / reference - 1.0) * 100.0 if reference else float("nan")


def summarize(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per model: medians over the runs, with min and max of the errors."""
    rows = []
    for model, rs in runs.items():
        row: dict[str, Any] = {"model": model, "runs": len(rs)}
        for key in ("unprofiled_ms", "merged_ms", "torch_profiler_ms", "forward_ms", "layer_sum_ms"):
            row[key] = statistics.median(r[key] for r in rs)
        for key in ("merged_err_pct", "torch_profiler_err_pct", "deepest_pass_err_pct", "layer_sum_err_pct",
                    "drift_pct"):  # fmt: skip
            values = [r[key] for r in rs]
            row[key] = statistics.median(values)
            row[key + "_range"] = (min(values), max(values))
        row["passes_ms"] = {p: statistics.median(r["passes_ms"][p] for r in rs) for p in rs[0]["passes_ms"]}
        row["top_layers"] = rs[0]["top_layers"]
        for key, limit in TARGETS.items():
            row[key + "_verdict"] = (
                ("PASS" if abs(row[key]) <= limit else "FAIL") if model in TARGET_MODELS else "no target"
            )
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    def rng(r: dict[str, Any], key: str) -> str:
        lo, hi = r[key + "_range"]
        return f"{r[key]:+.1f} ({lo:+.1f}..{hi:+.1f})"

    print("\nlatency (median over runs; errors in %, median (min..max) over runs)")
    for r in rows:
        passes = ", ".join(f"{p} {ms:.3f}" for p, ms in r["passes_ms"].items())
        print(f"\n{r['model']} ({r['runs']} runs)")
        print(f"  un-profiled           {r['unprofiled_ms']:.3f} ms  (drift after vs before {rng(r, 'drift_pct')})")
        print(f"  passes (step median)  {passes} ms")
        print(f"  merged model latency  {r['merged_ms']:.3f} ms  error {rng(r, 'merged_err_pct')}  "
              f"[{r['merged_err_pct_verdict']}]")  # fmt: skip
        print(f"  deepest pass          error {rng(r, 'deepest_pass_err_pct')}")
        print(f"  torch.profiler step   {r['torch_profiler_ms']:.3f} ms  error {rng(r, 'torch_profiler_err_pct')}")
        layers = f"{r['top_layers']} summing to {r['layer_sum_ms']:.3f} ms vs forward {r['forward_ms']:.3f} ms"
        print(f"  top-level layers      {layers}: {rng(r, 'layer_sum_err_pct')}  [{r['layer_sum_err_pct_verdict']}]")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=9, help="measurements per model (default 9)")
    ap.add_argument("--warmup", type=int, default=5, help="warm-up iterations per pass and block (default 5)")
    ap.add_argument("--iters", type=int, default=20, help="measured iterations per pass and block (default 20)")
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), help="models to run (all)")
    ap.add_argument("--train", action="store_true", help="forward + backward + SGD step, not inference")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: PyTorch's default)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 run of 2 + 3 iterations")
    ap.add_argument("--json", type=Path, metavar="PATH", help="write every run, the summary and the machine to PATH")
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.warmup, args.iters = 1, 2, 3
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    info = machine()
    cmd = shlex.join(["python", *sys.argv] if argv is None else ["python", "bench/leveled_accuracy.py", *argv])
    print(f"command: {cmd}")
    print(f"machine: {info.get('cpu')}, {info['cpu_count']} cores; torch {info['torch']}, threads "
          f"{info['torch_threads']}; device {device}; xstack {info['xstack_commit']}")  # fmt: skip
    started = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="xstack-leveled-") as tmp:
        for name in args.models:
            wl = build(name, device, args.train)
            _timed(wl, 20, 1)  # first calls: allocations, kernel selection
            runs[name] = []
            for i in range(args.runs):
                runs[name].append(one_run(wl, args.warmup, args.iters, Path(tmp)))
                r = runs[name][-1]
                print(f"{name} run {i + 1}/{args.runs}: un-profiled {r['unprofiled_ms']:.3f} ms, merged "
                      f"{r['merged_err_pct']:+.2f}%, torch.profiler {r['torch_profiler_err_pct']:+.1f}%, layers "
                      f"{r['layer_sum_err_pct']:+.1f}%", flush=True)  # fmt: skip
    rows = summarize(runs)
    print_table(rows)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "command": cmd, "runs": runs, "summary": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
