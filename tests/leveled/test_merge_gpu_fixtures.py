"""The kernel pass of a leveled measurement, on real GPU traces (H100, recorded with torch.profiler).

No GPU is needed. Each trace is imported twice into one store: once with its device activity taken out (what
an op pass records: the same program's ops, layers and step, with no CUDA tracing) and once whole (the kernel
pass). The merge must hang every kernel of the step from its launch and its op, time the ops from the op
pass and the kernels from the kernel pass; and, when an op of the kernel pass is changed (as autotuning or
another dispatch would change it), report the divergence and leave that op's kernels out.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import kineto_fixture
from xstack.importers.kineto import import_kineto
from xstack.leveled.merge import merge_passes
from xstack.trace.store import Store

DEVICE_CATEGORIES = {"cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset", "ac2g",
                     "gpu_user_annotation", "cuda_sync"}  # fmt: skip
TRACES = ["h100_bert_small_infer_full.json.gz", "h100_vit_image_cls_infer_full.json.gz"]


def _load(name: str) -> dict[str, Any]:
    with gzip.open(kineto_fixture(name), "rt") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def _passes(tmp_path: Path, doc: dict[str, Any], kernel_doc: dict[str, Any]) -> Path:
    op_pass = dict(doc, traceEvents=[e for e in doc["traceEvents"] if str(e.get("cat", "")).lower()
                                     not in DEVICE_CATEGORIES])  # fmt: skip
    (tmp_path / "op_pass.json").write_text(json.dumps(op_pass))
    (tmp_path / "kernel_pass.json").write_text(json.dumps(kernel_doc))
    out = tmp_path / "passes.duckdb"
    with Store.create(out) as store:
        import_kineto(store, tmp_path / "op_pass.json")
        import_kineto(store, tmp_path / "kernel_pass.json")
    return out


def _step_kernels(doc: dict[str, Any]) -> list[tuple[str, int]]:
    """(name, duration in ns) of the kernels launched inside the trace's ProfilerStep, in start order."""
    events = doc["traceEvents"]
    step = next(e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    launches = {
        e["args"]["correlation"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]
    }
    kernels = [e for e in events if e.get("cat") == "kernel" and e["args"].get("correlation") in launches]
    return [(e["name"], round(e["dur"] * 1000)) for e in sorted(kernels, key=lambda e: e["ts"])]


@pytest.mark.parametrize("name", TRACES)
def test_kernels_are_timed_by_the_kernel_pass_under_ops_timed_by_the_op_pass(tmp_path: Path, name: str) -> None:
    doc = _load(name)
    path = _passes(tmp_path, doc, doc)
    with Store.open(path, read_only=False) as store:
        result = merge_passes(store, [1, 2])
        kernels = store.query(
            """SELECT k.name, k.dur_ns, k.attrs, r.level, o.level, o.attrs FROM spans k
               JOIN spans r ON r.run_id = k.run_id AND r.span_id = k.parent_id
               JOIN spans o ON o.run_id = k.run_id AND o.span_id = r.parent_id
               WHERE k.run_id = ? AND k.level = 'kernel' ORDER BY k.start_ns""",
            [result.run_id],
        )
        ops = store.query(
            "SELECT count(*), count(DISTINCT attrs->>'$.\"merge.pass\"') FROM spans WHERE run_id = ? AND level = 'op'",
            [result.run_id],
        )[0]
        step_ops = store.query(
            """SELECT count(*) FROM spans o JOIN spans s ON s.run_id = o.run_id AND s.name LIKE 'ProfilerStep#%'
               WHERE o.run_id = 1 AND o.level = 'op' AND o.start_ns >= s.start_ns
                   AND o.start_ns + o.dur_ns <= s.start_ns + s.dur_ns""",
        )[0][0]
    assert [h for h in result.health if h[0].endswith("mismatch")] == []
    expected = _step_kernels(doc)
    assert sorted((k[0], k[1]) for k in kernels) == sorted(expected)
    assert all(k[3] == "runtime" and k[4] == "op" for k in kernels)
    assert {orjson.loads(k[2])["merge.pass"] for k in kernels} == {"import (run 2)"}
    assert {orjson.loads(k[5])["merge.pass"] for k in kernels} == {"import (run 1)"}
    assert ops == (step_ops, 1)


def test_an_op_changed_in_the_kernel_pass_is_reported_and_its_kernels_left_out(tmp_path: Path) -> None:
    doc = _load("h100_bert_small_infer_full.json.gz")
    changed = json.loads(json.dumps(doc))
    linears = [e for e in changed["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == "aten::linear"]
    linears[5]["name"] = "aten::linear_autotuned"
    path = _passes(tmp_path, doc, changed)
    with Store.open(path, read_only=False) as store:
        result = merge_passes(store, [1, 2])
        kernels = store.query("SELECT count(*) FROM spans WHERE run_id = ? AND level = 'kernel'", [result.run_id])
        renamed = store.query(
            "SELECT count(*) FROM spans WHERE run_id = ? AND name = 'aten::linear_autotuned'", [result.run_id]
        )
    mismatches = [h for h in result.health if h[0].endswith("mismatch")]
    assert [h[:2] for h in mismatches] == [("pass_mismatch", 1)]
    detail = mismatches[0][2]
    # the trace's one step, ProfilerStep#6, is its iteration 1, as the reports number it
    assert detail.startswith("import (run 2) iteration 1: under layer ") and "Linear_5 (Linear)'" in detail
    assert "op 1 is 'aten::linear_autotuned', where import (run 1) iteration 1 has 'aten::linear'" in detail
    assert kernels[0][0] == len(_step_kernels(doc)) - 1  # the changed op's GEMM is not merged
    assert renamed[0][0] == 0  # the op pass times the ops: its name stands
