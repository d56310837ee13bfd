"""What reading the io level's records back costs, once the profiled program has ended: wall time and memory.

``xstack run --levels io`` reads every record file its program tree wrote into the store after the program ends
(``collect.io.ingest``): the calls become io spans, and each (process, file) its Darshan counters in
``io_files``. That work grows with the calls recorded, and its memory is the profiler's peak on a long run.

The workload is ``io_overhead.py``'s: a DataLoader with ``--workers`` workers reads ``--files`` files of 4 KiB
(``open(path, 'rb').read()`` each), ``--epochs`` times over, with the io level's library preloaded (every call
recorded, as ``xstack run`` records it). It is recorded once; then its records are read into a new store of one
run, ``--repeat`` times, each in a fresh process, which reports its wall time and its peak resident memory
(``ru_maxrss``) above what it held before reading (the interpreter and xstack's imports).

``--analyze`` then runs the io analyses (``io.*`` of ``xstack.analyze.pipeline``) over each store read back, in
another fresh process, and reports their time and the peak memory they added.

``--other-src DIR`` reads (and analyses) the same records with the package under ``DIR`` too (the ``src`` folder
of another checkout, for example one made with ``git worktree add /tmp/before HEAD~1``), the two alternating, so
that two versions are compared side by side on one machine.

Reproduce: ``python bench/io_readback.py`` (about 2 minutes on 2 cores: 50,000 files, 2 epochs, some 900,000
calls; ``--files 5000 --repeat 1`` for a smoke run; ``--analyze`` adds about 10 s a read-back).
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from io_overhead import WORKLOAD, make_files  # noqa: E402

READ_BACK = r"""
import json, resource, sys, time
from pathlib import Path
from xstack.collect.io import ingest
from xstack.trace.store import RunInfo, Store

store, records = Path(sys.argv[1]), Path(sys.argv[2])
with Store.create(store) as s:
    s.add_run(RunInfo(1, "readback", levels=["io"]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
ingest(store, records)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with Store.open(store) as s:
    spans = s.query("SELECT count(*) FROM spans WHERE level = 'io'")[0][0]
    files = s.query("SELECT count(*) FROM io_files")[0][0]
print(json.dumps({"seconds": seconds, "peak_mb": peak / 1024, "added_mb": (peak - before) / 1024,
                  "spans": spans, "io_files": files}))
"""

ANALYZE = r"""
import json, resource, sys, time
from xstack.analyze.pipeline import ANALYSES, load
from xstack.trace.store import Store

with Store.open(sys.argv[1]) as s:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    each = {}
    for id in [i for i in ANALYSES if i.startswith("io.")]:
        start = time.perf_counter()
        load(id)(s, 1)
        each[id] = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": sum(each.values()), "each": each, "added_mb": (peak - before) / 1024}))
"""


def record(scratch: Path, files: int, epochs: int, workers: int) -> Path:
    """The records of one run of the workload, with the io level's library preloaded."""
    from xstack.collect import _io_native

    data = scratch / "data"
    make_files(data, files, 4096)
    script = scratch / "workload.py"
    script.write_text(WORKLOAD.replace("num_workers=2", f"num_workers={workers}"))
    out = scratch / "records"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = _io_native.preload_env(out)
    subprocess.run([sys.executable, str(script), str(data), str(epochs)], env=env, check=True, capture_output=True)
    return out


def read_back(scratch: Path, records: Path, src: Path | None, analyze: bool) -> dict[str, Any]:
    """One read-back of ``records`` into a new store, in a fresh process (``src``: the package under it); with
    ``analyze``, the io analyses of that store in another (``analysis``: their figures)."""
    store = scratch / "readback.duckdb"
    store.unlink(missing_ok=True)
    figures = _child(READ_BACK, [store, records], src)
    if analyze:
        figures["analysis"] = _child(ANALYZE, [store], src)
    return figures


def _child(script: str, args: list[Path], src: Path | None) -> dict[str, Any]:
    """The figures ``script`` prints as its last line, run in a fresh interpreter (``src``: the package under it)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, check=True, capture_output=True,
                          text=True)  # fmt: skip
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=50_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--other-src", type=Path, help="also read back with the package under this folder")
    parser.add_argument("--analyze", action="store_true", help="also time the io analyses of each store read back")
    parser.add_argument("--workdir", type=Path, help="keep the files and records here (default: a temp folder)")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    args = parser.parse_args(argv)
    scratch = args.workdir or Path(tempfile.mkdtemp(prefix="xstack-readback-"))
    try:
        records = record(scratch, args.files, args.epochs, args.workers)
        configs: list[tuple[str, Path | None]] = [("this build", None)]
        if args.other_src is not None:
            configs.append((f"other ({args.other_src})", args.other_src.resolve()))
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in configs}
        for i in range(args.repeat):
            for name, src in configs[i % len(configs) :] + configs[: i % len(configs)]:  # each leads in turn
                runs[name].append(read_back(scratch, records, src, args.analyze))
        print(f"{args.files:,} files x {args.epochs} epochs, {args.workers} workers; {args.repeat} read-backs each")
        print(f"{'build':<40} {'calls':>10} {'io_files':>9} {'wall (median)':>14} {'peak MB':>8} {'added MB':>9}")
        for name, got in runs.items():
            print(f"{name:<40} {int(got[0]['spans']):>10,} {int(got[0]['io_files']):>9,} "
                  f"{statistics.median(r['seconds'] for r in got):>12.2f} s "
                  f"{statistics.median(r['peak_mb'] for r in got):>8.0f} "
                  f"{statistics.median(r['added_mb'] for r in got):>9.0f}")  # fmt: skip
        if args.analyze:
            print(f"\n{'io analyses':<40} {'wall (median)':>14} {'added MB':>9}   slowest (median s)")
            for name, got in runs.items():
                ids = got[0]["analysis"]["each"]
                each = {id: statistics.median(r["analysis"]["each"][id] for r in got) for id in ids}
                slow = ", ".join(f"{id} {t:.2f}" for id, t in sorted(each.items(), key=lambda x: -x[1])[:3])
                print(f"{name:<40} {statistics.median(r['analysis']['seconds'] for r in got):>12.2f} s "
                      f"{statistics.median(r['analysis']['added_mb'] for r in got):>9.0f}   {slow}")  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps(runs, indent=1))
    finally:
        if args.workdir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
