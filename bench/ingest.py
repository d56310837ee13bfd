"""Ingest benchmark: xstack's Kineto import against plain ``json.load`` of the same file, in the same run.

For each real fixture (``--fixtures``, default ``../shared/fixtures/kineto``) and for synthetic traces built by
replicating a real one to ``--size-mb`` MB, this measures, side by side:

* ``json.load``: ``json.load`` of the file (through ``gzip.open`` when it is gzipped, as the importer must
  decompress it too): the floor any importer that parses the whole document would start from;
* ``import``: ``xstack.importers.kineto.import_kineto`` into a fresh store (``Store.create``, so the time
  includes creating, checkpointing and closing the store).

Each measurement runs in its own subprocess, so its peak RSS (``ru_maxrss`` of that child, from ``wait4``) is
its own; times are taken inside the child around the work itself (interpreter start-up and imports are
not counted; they are the same for every file). Small files are measured ``--repeat`` times, alternating
which task goes first, and the medians are reported; large files (over 100 MB of JSON) ``--repeat-large``
times. With ``--phases`` the import also reports where its time goes: ``reader_python`` (reading, cutting
and writing chunks, and decompressing), ``duckdb_read_json`` (DuckDB parsing chunks into the staging
table), and each SQL step.

The synthetic trace repeats the events of a real trace (default the NCCL one, the largest) as consecutive
copies: timestamps shifted past the end of the previous copy, and correlation ids, External ids, flow ids,
record-function / Python / sequence ids moved to a fresh range per copy, so each copy links within itself
exactly as the original does (no duplicate ids). Metadata events (``ph: M``) are written once. It is
streamed to a plain ``.json`` file in a temporary directory (deleted afterwards unless ``--keep``).

    python bench/ingest.py                        # fixtures + 1 GB synthetic
    python bench/ingest.py --size-mb 250 1000     # two synthetic sizes (does RSS grow with size?)
    python bench/ingest.py --size-mb 0 --phases   # fixtures only, with the import's phase breakdown

Results are printed as a table and written as JSON to ``bench/out/ingest-<timestamp>.json`` (``--no-json``
to skip).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
DEFAULT_FIXTURES = ROOT.parent / "shared" / "fixtures" / "kineto"
DEFAULT_BASE = "a100x8_nccl_allreduce_train.json.gz"
LARGE_BYTES = 100 * 10**6
MB = 10**6

# Integer fields (in ``args``) that identify something within one trace; offset per synthetic copy.
ID_ARGS = (
    "correlation",
    "External id",
    "Record function id",
    "Python id",
    "Python parent id",
    "Sequence number",
    "wait_on_cuda_event_record_corr_id",
)


# -- synthetic trace ------------------------------------------------------------------------------------
def _open_json(path: Path) -> Any:
    with open(path, "rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")  # noqa: SIM115


def build_synthetic(base: Path, out: Path, target_bytes: int) -> dict[str, Any]:
    """Write ``out``: ``base``'s events repeated (shifted in time, fresh ids) until ``target_bytes``.

    Memory stays at about the size of the base trace: one copy is serialised at a time.
    """
    import orjson

    with _open_json(base) as fh:
        doc = json.load(fh)
    events: list[dict[str, Any]] = doc["traceEvents"]
    meta_events = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]

    # Time shift per copy: whole microseconds (an integer added to a float ts keeps its 3 decimals exact
    # while the result stays in the same binade), past the end of the copy plus a 1 ms gap.
    ts = [e["ts"] for e in body if isinstance(e.get("ts"), (int, float))]
    ends = [
        e["ts"] + e.get("dur", 0)
        for e in body
        if isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur", 0), (int, float))
    ]
    shift = math.ceil(max(ends) - min(ts)) + 1000

    # Id offset per copy: a power of ten above every id in the trace, so copies never share an id.
    top = 0
    for e in body:
        if isinstance(e.get("id"), int):
            top = max(top, e["id"])
        args = e.get("args")
        if isinstance(args, dict):
            for k in ID_ARGS:
                v = args.get(k)
                if isinstance(v, int) and not isinstance(v, bool):
                    top = max(top, v)
    id_step = 10 ** (len(str(top + 1)))

    # Per event: a text template in Kineto's own layout, with %s where the moving fields go, and the base
    # values of those fields. Built once; each copy is then one string formatting per event.
    plan = [_template(e) for e in body]

    written = 0
    copies = 0
    n_events = 0
    with open(out, "wb") as f:
        keys = list(doc)
        f.write(b"{\n")
        for i, key in enumerate(keys):
            last = i == len(keys) - 1
            f.write(orjson.dumps(key) + b": ")
            if key != "traceEvents":
                f.write(orjson.dumps(doc[key]))
            else:
                f.write(b"[\n")
                first = True
                for e in meta_events:
                    f.write((b"" if first else b",\n") + (_template(e, moving=False)[0] % ()).encode())
                    first = False
                    n_events += 1
                while written < target_bytes or copies == 0:
                    dt = shift * copies
                    di = id_step * copies
                    lines = [
                        tmpl % tuple(v + (dt if is_ts else di) for v, is_ts in zip(vals, kinds, strict=True))
                        for tmpl, vals, kinds in plan
                    ]
                    text = ",\n".join(lines).encode()
                    chunk = (b"" if first else b",\n") + text
                    first = False
                    f.write(chunk)
                    written += len(chunk)
                    copies += 1
                    n_events += len(lines)
                f.write(b"\n]")
            f.write(b"\n" if last else b",\n")
        f.write(b"}\n")
    return {"copies": copies, "events": n_events, "ts_shift_us": shift, "id_step": id_step, "bytes": out.stat().st_size}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _template(e: dict[str, Any], moving: bool = True) -> tuple[str, tuple[Any, ...], tuple[bool, ...]]:
    """One event as Kineto lays it out (top-level fields on one line, ``args`` on their own lines), with
    ``%s`` for each moving field: ``ts`` (shifted in time), ``id`` and the ``ID_ARGS`` (moved to a fresh id
    range). Returns (template, base values of the slots in text order, whether each slot is a timestamp)."""
    import orjson

    def val(v: Any) -> str:
        return orjson.dumps(v).decode().replace("%", "%%")

    vals: list[Any] = []
    kinds: list[bool] = []

    def field(k: str, v: Any, moves: bool, is_ts: bool = False) -> str:
        if moving and moves:
            vals.append(v)
            kinds.append(is_ts)
            return f"{val(k)}: %s"
        return f"{val(k)}: {val(v)}"

    top = []
    for k, v in e.items():
        if k == "ts":
            top.append(field(k, v, isinstance(v, (int, float)) and not isinstance(v, bool), is_ts=True))
        elif k == "id":
            top.append(field(k, v, _is_int(v) and v >= 0))
        elif k != "args":
            top.append(field(k, v, False))
    text = "  {\n    " + ", ".join(top)
    if "args" in e:
        args = e["args"]
        if isinstance(args, dict) and args:
            inner = [field(k, v, k in ID_ARGS and _is_int(v) and v >= 0) for k, v in args.items()]
            text += ',\n    "args": {\n      ' + ", ".join(inner) + "\n    }"
        else:
            text += f',\n    "args": {val(args)}'
    return text + "\n  }", tuple(vals), tuple(kinds)


# -- child tasks ------------------------------------------------------------------------------------------
def child_json(path: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    with _open_json(path) as fh:
        doc = json.load(fh)
    seconds = time.perf_counter() - t0
    events = doc.get("traceEvents", doc) if isinstance(doc, dict) else doc
    return {"seconds": seconds, "events": len(events)}


class _TimedCon:
    """Wraps a DuckDB connection, adding up ``execute`` time per import phase (for ``--phases``)."""

    def __init__(self, con: Any, phases: dict[str, float]) -> None:
        self._con = con
        self._phases = phases
        from xstack.importers.kineto import _sql

        self._names = {
            _sql.LOAD_CHUNK: "duckdb_read_json",
            _sql.HOST_PARENTS: "sql_host_parents",
            _sql.OTHER_PARENTS: "sql_other_parents",
            _sql.SKIPPED: "sql_health",
        }

    def _phase(self, sql: str) -> str:
        name = self._names.get(sql)
        if name:
            return name
        head = " ".join(sql.split())[:40]
        if head.startswith("CREATE OR REPLACE TEMP TABLE x"):
            return "sql_stage_spans"
        if head.startswith("INSERT INTO _spans"):
            return "sql_insert_spans"
        if head.startswith("INSERT INTO _counters"):
            return "sql_insert_counters"
        if head.startswith("SELECT count(*) FROM raw"):
            return "sql_checks"
        return "sql_other"

    def execute(self, sql: str, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._con.execute(sql, *args)
        except Exception:
            print(f"ingest.py: import failed in phase {self._phase(sql)}", file=sys.stderr)
            raise
        finally:
            name = self._phase(sql)
            self._phases[name] = self._phases.get(name, 0.0) + time.perf_counter() - t0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


def child_import(path: Path, workdir: Path, phases: bool) -> dict[str, Any]:
    from xstack.importers import kineto
    from xstack.trace.store import Store

    store_path = workdir / "bench.duckdb"
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    with Store.create(store_path) as store:
        if phases:
            store._con = _TimedCon(store.con, timings)  # type: ignore[assignment]  # the property reads it
            stage = kineto._stage

            def timed_stage(*a: Any, **k: Any) -> Any:
                s0 = time.perf_counter()
                try:
                    return stage(*a, **k)
                finally:
                    timings["stage_total"] = time.perf_counter() - s0

            kineto._stage = timed_stage  # type: ignore[assignment]
        run = kineto.import_kineto(store, path)
        if phases:
            store._con = store.con._con  # type: ignore[attr-defined]
            t1 = time.perf_counter()
    seconds = time.perf_counter() - t0
    out: dict[str, Any] = {
        "seconds": seconds,
        "spans": run.spans,
        "counters": run.counters,
        "store_bytes": store_path.stat().st_size,
    }
    if phases:
        timings["reader_python"] = timings.pop("stage_total") - timings.get("duckdb_read_json", 0.0)
        timings["checkpoint_close"] = seconds - (t1 - t0)
        out["phases"] = {k: round(v, 3) for k, v in sorted(timings.items())}
    return out


def child_baseline() -> dict[str, Any]:
    import duckdb  # noqa: F401

    import xstack.importers.kineto  # noqa: F401

    return {"seconds": 0.0}


def run_child(task: str, path: Path | None, workdir: Path, phases: bool = False) -> dict[str, Any]:
    """Run one task in a fresh interpreter; return its result plus its own peak RSS (bytes)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", task, "--workdir", str(workdir)]
    if path is not None:
        cmd += ["--child-path", str(path)]
    if phases:
        cmd.append("--phases")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{task} of {path} failed with exit code {proc.returncode}")
    result: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    result["peak_rss_bytes"] = usage.ru_maxrss * 1024  # Linux: kilobytes
    result["wall_seconds"] = wall
    return result


# -- measuring ------------------------------------------------------------------------------------------
def json_size(path: Path) -> int:
    with open(path, "rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"
    if not gz:
        return path.stat().st_size
    n = 0
    with gzip.open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            n += len(chunk)
    return n


def measure(path: Path, repeat: int, workdir: Path, phases: bool, label: str | None = None) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"json": [], "import": []}
    for i in range(repeat):
        order = ("json", "import") if i % 2 == 0 else ("import", "json")
        for task in order:
            d = Path(tempfile.mkdtemp(prefix=f"{task}-", dir=workdir))
            try:
                runs[task].append(run_child(task, path, d, phases and task == "import"))
            finally:
                shutil.rmtree(d, ignore_errors=True)
    jb = json_size(path)
    js, im = runs["json"], runs["import"]
    events = js[0]["events"]

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return float(statistics.median(r[key] for r in rows))

    row = {
        "file": label or path.name,
        "file_bytes": path.stat().st_size,
        "json_bytes": jb,
        "events": events,
        "repeat": repeat,
        "json_load": {
            "seconds": med(js, "seconds"),
            "peak_rss_bytes": med(js, "peak_rss_bytes"),
            "events_per_s": events / med(js, "seconds"),
            "runs": js,
        },
        "import": {
            "seconds": med(im, "seconds"),
            "peak_rss_bytes": med(im, "peak_rss_bytes"),
            "events_per_s": events / med(im, "seconds"),
            "spans": im[0]["spans"],
            "counters": im[0]["counters"],
            "store_bytes": im[0]["store_bytes"],
            "runs": im,
        },
    }
    row["time_ratio"] = row["import"]["seconds"] / row["json_load"]["seconds"]
    row["import_rss_over_json"] = row["import"]["peak_rss_bytes"] / jb
    row["json_load_rss_over_json"] = row["json_load"]["peak_rss_bytes"] / jb
    if phases:
        keys = sorted({k for r in im for k in r.get("phases", {})})
        row["import"]["phases"] = {k: float(statistics.median(r["phases"].get(k, 0.0) for r in im)) for k in keys}
    return row


def _fmt_bytes(n: float) -> str:
    return f"{n / MB:,.1f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "file",
        "file MB",
        "JSON MB",
        "events",
        "n",
        "json.load s",
        "import s",
        "import/json",
        "json.load ev/s",
        "import ev/s",
        "json.load RSS MB",
        "import RSS MB",
        "import RSS/JSON",
    )
    lines = [head]
    for r in rows:
        lines.append(
            (
                r["file"],
                _fmt_bytes(r["file_bytes"]),
                _fmt_bytes(r["json_bytes"]),
                f"{r['events']:,}",
                str(r["repeat"]),
                f"{r['json_load']['seconds']:.3f}",
                f"{r['import']['seconds']:.3f}",
                f"{r['time_ratio']:.2f}",
                f"{r['json_load']['events_per_s']:,.0f}",
                f"{r['import']['events_per_s']:,.0f}",
                _fmt_bytes(r["json_load"]["peak_rss_bytes"]),
                _fmt_bytes(r["import"]["peak_rss_bytes"]),
                f"{r['import_rss_over_json']:.2f}",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = []
    for n, line in enumerate(lines):
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))]
        out.append("| " + " | ".join(cells) + " |")
        if n == 0:
            out.append(
                "|" + "|".join(("-" * (w + 1) + ":") if i else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|"
            )
    return "\n".join(out)


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        import duckdb

        info["duckdb"] = duckdb.__version__
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            info["mem_total_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    sys.path.insert(0, str(SRC))
    from xstack.trace import store

    info["memory_limit"] = store.DEFAULT_MEMORY_LIMIT
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--size-mb",
        type=float,
        nargs="+",
        default=[1000.0],
        metavar="MB",
        help="synthetic trace size(s) in MB (10^6 bytes) of JSON; 0 for none (default 1000)",
    )
    ap.add_argument(
        "--fixtures",
        type=Path,
        default=DEFAULT_FIXTURES,
        metavar="DIR",
        help=f"directory of real Kineto traces (default {DEFAULT_FIXTURES})",
    )
    ap.add_argument(
        "--base",
        default=DEFAULT_BASE,
        metavar="NAME",
        help=f"fixture the synthetic trace replicates (default {DEFAULT_BASE})",
    )
    ap.add_argument("--keep", action="store_true", help="keep the synthetic trace(s) (path printed)")
    ap.add_argument("--workdir", type=Path, help="where synthetic traces and stores go (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per small file, medians reported (default 5)")
    ap.add_argument("--repeat-large", type=int, default=3, help="runs per file over 100 MB (default 3)")
    ap.add_argument("--no-fixtures", action="store_true", help="only the synthetic trace(s)")
    ap.add_argument("--phases", action="store_true", help="also time the import's phases (reader, load, SQL)")
    ap.add_argument("--no-json", action="store_true", help="do not write bench/out/ingest-*.json")
    ap.add_argument("--child", choices=["json", "import", "baseline"], help=argparse.SUPPRESS)
    ap.add_argument("--child-path", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        if args.child == "json":
            res = child_json(args.child_path)
        elif args.child == "import":
            res = child_import(args.child_path, args.workdir, args.phases)
        else:
            res = child_baseline()
        print(json.dumps(res))
        return 0

    fixtures = [] if args.no_fixtures else sorted(args.fixtures.glob("*.json*"))
    if not args.no_fixtures and not fixtures:
        print(f"no fixtures in {args.fixtures}", file=sys.stderr)
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="xstack-bench-", dir=args.workdir))
    info = machine()
    print(f"machine: {info}", flush=True)
    base_rss = {t: run_child(t, None, workdir)["peak_rss_bytes"] for t in ("baseline",)}
    print(f"child baseline RSS (python + duckdb + xstack imported): {_fmt_bytes(base_rss['baseline'])} MB", flush=True)
    rows = []
    try:
        for path in fixtures:
            size = path.stat().st_size
            rep = args.repeat_large if size > LARGE_BYTES else args.repeat
            rows.append(measure(path, rep, workdir, args.phases))
            print(f"  {path.name}: done", flush=True)
        base = args.fixtures / args.base
        for size_mb in args.size_mb:
            if size_mb <= 0:
                continue
            syn = workdir / f"synthetic_{int(size_mb)}MB.json"
            t0 = time.perf_counter()
            built = build_synthetic(base, syn, int(size_mb * MB))
            print(
                f"  built {syn} ({built['bytes'] / MB:,.0f} MB, {built['events']:,} events, "
                f"{built['copies']} copies of {base.name}) in {time.perf_counter() - t0:.1f}s",
                flush=True,
            )
            rep = args.repeat_large if built["bytes"] > LARGE_BYTES else args.repeat
            row = measure(
                syn, rep, workdir, args.phases, label=f"synthetic {int(size_mb)} MB ({base.name} x{built['copies']})"
            )
            row["synthetic"] = built
            rows.append(row)
            print(f"  {syn.name}: done", flush=True)
            if not args.keep:
                syn.unlink()
    finally:
        if args.keep:
            print(f"kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    print()
    print(table(rows))
    if args.phases:
        print("\nimport phases (seconds, median):")
        for r in rows:
            ph = r["import"].get("phases", {})
            print(f"  {r['file']}: " + ", ".join(f"{k}={v:.3f}" for k, v in ph.items()))
    if not args.no_json:
        outdir = ROOT / "bench" / "out"
        outdir.mkdir(parents=True, exist_ok=True)
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = outdir / f"ingest-{stamp}.json"
        out.write_text(
            json.dumps(
                {
                    "date": stamp,
                    "machine": info,
                    "child_baseline_rss_bytes": base_rss["baseline"],
                    "argv": sys.argv[1:],
                    "results": rows,
                },
                indent=1,
            )
        )
        print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
