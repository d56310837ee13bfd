"""The summary's devices and ranks on real imported traces: the GPUs a run used (the others counted), an AMD GPU
described without NVIDIA's compute capability, a rank without a question mark, and the markdown report's line."""

from __future__ import annotations

import io
import re
from typing import Any

from rich.console import Console

from tests.conftest import kineto_fixture
from xstack.analyze.summary import RunSummary, summarize
from xstack.report.terminal import device_line, devices_line, distributed_line, print_summary


def summary_of(import_store: Any, name: str) -> tuple[RunSummary, str]:
    summary = summarize(import_store(kineto_fixture(name)))
    console = Console(width=120, file=io.StringIO(), record=True)
    print_summary(summary, console)
    return summary, console.export_text()


def test_only_the_gpus_with_device_activity_are_listed(import_store: Any) -> None:
    # the MI250 host lists four GPUs; the run's kernels and copies are all on the third
    summary, text = summary_of(import_store, "mi250_toy_train_rocm.json.gz")
    assert [d["id"] for d in summary.devices] == [2] and summary.devices_unused == 3
    assert "device 2 " in text and "device 0 " not in text and "device 3 " not in text
    assert "other devices    3 more GPUs on the host, not used by this run" in text
    # the 8-GPU A100 host: rank 0 of a 2-process NCCL job ran on GPU 0 only
    summary, text = summary_of(import_store, "a100x8_nccl_allreduce_train.json.gz")
    assert [d["id"] for d in summary.devices] == [0] and summary.devices_unused == 7
    assert "device 0 " in text and "device 1 " not in text
    assert devices_line(summary) == "NVIDIA A100-PG509-200 (+7 more GPUs on the host, not used by this run)"


def test_counter_ranges_count_as_device_activity(import_store: Any) -> None:
    summary, _ = summary_of(import_store, "a100_alexnet_cupti_counters.json.gz")
    assert [d["id"] for d in summary.devices] == [0] and summary.devices_unused == 7


def test_an_amd_gpu_has_compute_units_and_no_compute_capability(import_store: Any) -> None:
    _, text = summary_of(import_store, "mi250_toy_train_rocm.json.gz")
    assert "AMD Radeon Graphics, 64 GiB, 104 CUs" in text
    assert "cc 9.0" not in text and "SMs" not in text
    # where the properties name the gfx architecture (hipDeviceProp_t.gcnArchName), it is shown instead
    mi250x = {"name": "AMD Instinct MI250X", "gcnArchName": "gfx90a:sramecc+:xnack-", "numSms": 110,
              "computeMajor": 9, "computeMinor": 0, "totalGlobalMem": 68702699520}  # fmt: skip
    assert device_line(mi250x) == "AMD Instinct MI250X, 64 GiB, 110 CUs, gfx90a"
    _, text = summary_of(import_store, "h100_bert_small_infer_full.json.gz")
    assert "NVIDIA H100 80GB HBM3, 79 GiB, 132 SMs, cc 9.0" in text


def test_a_rank_without_a_world_size_has_no_question_mark(import_store: Any) -> None:
    _, text = summary_of(import_store, "a100_alexnet_cupti_counters.json.gz")  # distributedInfo: {"rank": 0}
    assert re.search(r"^ distributed +rank 0 *$", text, re.M) and "of ?" not in text
    _, text = summary_of(import_store, "cpu_only_gloo_rank34.json.gz")
    assert "rank 34 of 300, gloo" in text
    assert distributed_line({"rank": 0, "world_size": 1, "backend": "nccl"}) is None  # one process: nothing to say
    assert distributed_line({"backend": "nccl"}) is None
