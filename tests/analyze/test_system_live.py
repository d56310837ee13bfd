"""Every system analysis on a real profile: a tiny training loop with a DataLoader worker, profiled with
``xstack run --levels model,system`` and with ``xstack profile --system`` (whose syscall pass needs strace;
skipped with the reason when it cannot run). Only sanity is asserted: real numbers depend on the machine."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import LOADER_PROGRAM, needs_torch
from xstack.analyze.pipeline import ANALYSES, analyze
from xstack.export.perfetto import export_perfetto
from xstack.report.html import render_html
from xstack.trace.store import Store

pytestmark = needs_torch

SYSTEM_IDS = [i for i in ANALYSES if i.startswith("system.")]

SHORT_STEPS = """
import time, torch, xstack
from torch import nn

class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 1024
    def __getitem__(self, i):
        return torch.full((32,), float(i)), i % 4

if __name__ == "__main__":
    model = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))
    loss_fn = nn.CrossEntropyLoss()
    loader = torch.utils.data.DataLoader(Rows(), batch_size=8, num_workers=2)
    for i, (x, y) in enumerate(loader):
        if i == 0:
            time.sleep(0.5)  # the sampler finds both workers before the measured steps
        loss_fn(model(x), y).backward()
        xstack.step()
"""
"""Ten measured steps of a few milliseconds each, with two DataLoader workers alive throughout."""


def _xstack(tmp: Path, *argv: str, program: str = LOADER_PROGRAM) -> None:
    script = tmp / "train.py"
    script.write_text(textwrap.dedent(program))
    done = subprocess.run([sys.executable, "-m", "xstack", *argv, "--", sys.executable, str(script)],
                          capture_output=True, text=True, cwd=tmp, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_sampled_run(tmp_path: Path) -> None:
    _xstack(tmp_path, "run", "--levels", "model,system", "-o", str(tmp_path / "run.duckdb"))
    with Store.open(tmp_path / "run.duckdb") as store:
        a = analyze(store)
        export_perfetto(store, tmp_path / "trace.json")
    results = {r.id: r for r in a.results if r.id in SYSTEM_IDS}
    assert {i for i, r in results.items() if r.missing} == {"system.syscalls", "system.syscall_names"}
    cpu = results["system.cpu"]
    main = next(r for r in cpu.to_records() if r["what"] == "main")
    cores = cpu.facts["cores"]
    assert 0 < main["CPU busy"] <= 100 * cores + 5 and main["threads"] >= 1
    assert any(r["what"].startswith("worker") for r in cpu.to_records())  # the DataLoader worker was sampled
    assert 0 <= cpu.facts["busy_mean_pct"] <= 100 and cpu.facts["workers"] >= 1
    assert results["system.cpu_time"].rows and results["system.memory"].rows
    memory = results["system.memory"]
    assert all(r["main RSS"] and r["main RSS"] > 2**20 for r in memory.to_records())
    gpu = results["system.gpu"]
    assert gpu.rows or gpu.facts.get("nvml")  # telemetry, or why there is none
    assert a.summary.system is not None and a.summary.system["cores"] == cores
    page = render_html(a)
    assert '<section id="system">' in page and 'data-result="system.memory"' in page
    names = {e["args"]["name"] for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}  # fmt: skip
    assert any(n.startswith("machine (CPU cores and memory)") for n in names)
    assert any(n.startswith("main process (pid") for n in names)


def test_a_leveled_profile_with_the_syscall_pass(system_profile: Path) -> None:
    with Store.open(system_profile) as store:
        a = analyze(store)
        passes = dict(store.query("SELECT run_id, pass FROM runs"))
    results = {r.id: r for r in a.results if r.id in SYSTEM_IDS}
    assert not [i for i, r in results.items() if r.missing]
    assert passes[results["system.cpu"].facts["source_run"]] == "model+system"
    syscalls = results["system.syscalls"]
    assert passes[syscalls.facts["source_run"]].endswith("+syscalls") and syscalls.facts["calls"] > 0
    wait = next(r for r in syscalls.to_records() if r["where"] == "wait")
    assert wait["kind"] == "stage" and wait["wait"] > 0  # the 10 ms sleeps of the stage
    assert results["system.syscall_names"].rows
    assert a.summary.system is not None and a.summary.system["syscalls"] > 0


def test_short_steps_say_too_few_samples_and_keep_the_workers(tmp_path: Path) -> None:
    # samples every 200 ms: ten steps of a few ms hold fewer than five of any kind, unless the machine is so
    # loaded that they last a second; either way no figure is read between samples outside the steps
    # (xstack run: the sampler pass of xstack profile would go on to two seconds, ten samples)
    _xstack(tmp_path, "run", "--levels", "model,system", "--system-interval", "200", "--warmup", "20", "--iters", "10",
            "-o", str(tmp_path / "p.duckdb"), program=SHORT_STEPS)  # fmt: skip
    with Store.open(tmp_path / "p.duckdb") as store:
        a = analyze(store)
    cpu, memory = a.result("system.cpu"), a.result("system.memory")
    f = cpu.facts
    assert f["workers"] == 2 and memory.column("workers") == [2] * 10  # alive, whether sampled in a step or not
    main = next(r for r in cpu.to_records() if r["what"] == "main")
    workers = [r for r in cpu.to_records() if r["what"].startswith("worker")]
    assert (main["CPU busy"] is None) == (f["main_samples"] < 5) and len(workers) == 2
    assert all((r["CPU busy"] is None) == (f["full_samples"] < 5) for r in workers)
    assert (f["busy_mean_pct"] is None) == (f["full_samples"] < 5)
    if f["full_samples"] < 5:
        assert f["too_few_samples"] in cpu.labels
        # the workers' remedy: more steps, or, where a loaded machine stretched the ten steps past 5 x 50 ms (5
        # samples at the full samples' shortest period), a shorter interval
        length = re.search(r"steps last ([\d.]+) (ms|s) ", f["too_few_samples"])
        assert length is not None, f["too_few_samples"]
        length_ms = float(length[1]) * (1000 if length[2] == "s" else 1)
        if abs(length_ms - 250) > 2:  # the label's 3 digits decide it
            assert ("--iters" in f["too_few_samples"]) == (length_ms < 250), f["too_few_samples"]
        assert memory.facts["too_few_samples"] and "main_growth_bytes" not in memory.facts
        assert a.summary.system is not None and a.summary.system["cpu_too_few"]
