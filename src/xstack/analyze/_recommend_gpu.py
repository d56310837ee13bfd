"""The recommendation rules over the device timeline and the kernels: launch-bound, host-bound, memory-bound
kernels.

The GPU that waits for the host is launch-bound when many short kernels are launched one after another faster
than the GPU runs them, and host-bound otherwise (the host is busy with other work between launches); the two
rules never both fire. Faster kernels only shorten a step that keeps the GPU busy, so the memory-bound rule stays
silent while the GPU is mostly idle. Thresholds are module constants, quoted in the evidence where they decide.
"""

from __future__ import annotations

from typing import Any

from xstack.analyze._kernel_precision import kernel_precision
from xstack.analyze._recommend_common import Results, at_stake, get, gpu_runtime, num, severity
from xstack.analyze._timeline_launches import FEW_INTERVALS
from xstack.analyze.pipeline import Recommendation
from xstack.analyze.result import Result, format_ns
from xstack.text import format_ns_setting

HOST_WAIT_PCT = 30.0
"""Share of the step the device idles waiting for the host to launch work above which it is host-bound (or
launch-bound)."""
SHORT_KERNELS_PCT = 50.0
"""Share of kernels shorter than the launch threshold above which the host's launch rate is what limits..."""
MIN_LAUNCHES_PER_STEP = 20
"""...provided a step launches at least this many kernels: a handful of launches cost the host tens of us, too
little to keep the GPU waiting for a third of the step (a single slow first launch, say); the host-bound rule
speaks instead."""
GPU_BUSY_PCT = 50.0
"""Share of the measured window the GPU must be busy for faster kernels to shorten the step: below it the GPU
mostly waits for the host, and the memory-bound rule stays silent."""
MEMORY_BOUND_SHARE_PCT = 25.0
"""Share of kernel time in memory-bound kernels above which fusion is recommended."""
LOW_INTENSITY = 1.0
"""FLOP/byte below which a kernel is memory-bound on any current GPU (every ridge point is far above it)."""
FP32_SHARE_PCT = 50.0
"""Share of the memory-bound kernels' time in fp32 kernels (by their names) from which bf16 is advised: kernels
that already move 16-bit data would gain nothing."""
OUTSIDE_OPS_PCT = 50.0
"""Share of the host wait with no operator running above which the host-bound advice starts from Python code."""
HOST_CALL_PCT = 30.0
"""Share of the host wait spent inside one runtime API call name above which the host-bound advice starts from
that call: a cudaMalloc or a first launch, not the operator around it, is what to shorten."""
COMPILED_OPS = ("Torch-Compiled Region", "TorchDynamo Cache Lookup", "CompiledFunction", "## Call CompiledFxGraph")
"""Beginnings of the names of the host ranges torch.compile records (dynamo's frame and guards, AOTAutograd's
function, Inductor's graph call): a step that runs them already runs compiled."""


def launch_bound(results: Results) -> Recommendation | None:
    """The device idles waiting for the host, and many short kernels are launched in each step, each shorter
    than the host takes to issue the next."""
    b, launches = get(results, "timeline.breakdown"), get(results, "timeline.launches")
    if b is None or launches is None or (wait := num(b.facts, "host_wait_pct")) is None or wait < HOST_WAIT_PCT:
        return None
    line = _launch_evidence(launches.facts)
    if line is None:
        return None
    ops = b.facts.get("host_wait_ops")
    graph = (
        f"capture the step in a {gpu_runtime(results)} graph (torch.compile(mode='reduce-overhead') or "
        "torch.cuda.graphs)"
    )
    action = (
        f"Cut launches per step: the step already runs compiled code, so {graph}, or raise the batch size so each "
        "kernel does more."
        if isinstance(ops, list) and _compiled(ops)
        else f"Cut launches per step: {graph}, fuse small ops with torch.compile, or raise the batch size so each "
        "kernel does more."
    )
    return Recommendation(
        "launch_bound",
        "The GPU waits for the host: launch overhead dominates",
        severity(wait),
        [_wait_line(b.facts, wait), line],
        [b.id, launches.id],
        action,
    )


def _launch_evidence(f: dict[str, Any]) -> str | None:
    """The launch statistics line when they show a launch-bound step, else None. Medians, over the launches in
    the measured window with each kernel name's first launch left out (``timeline.launches``), so that one slow
    launch (a module loaded at its first launch) cannot make a step look launch-bound."""
    short, per_step = num(f, "short_pct"), _launches_per_step(f)
    kernel, interval = num(f, "median_kernel_ns"), num(f, "launch_interval_ns")
    if short is None or short < SHORT_KERNELS_PCT or per_step is None or per_step < MIN_LAUNCHES_PER_STEP:
        return None
    if kernel is None or interval is None or kernel >= interval:
        return None
    threshold = format_ns_setting(num(f, "short_threshold_ns") or 0)
    call = f", each launch call {format_ns(v)}" if (v := num(f, "steady_launch_ns")) is not None else ""
    return (
        f"{short:.0f}% of {int(num(f, 'launches') or 0):,} kernels run under {threshold}; the median kernel runs "
        f"{format_ns(kernel)} while the host issues a launch every {format_ns(interval)}{call} ({_pace_basis(f)}); "
        f"{_launch_count(f, per_step)} (threshold {MIN_LAUNCHES_PER_STEP} per step) (timeline.launches)"
    )


def _pace_basis(f: dict[str, Any]) -> str:
    """What the launch pace is the median of (``timeline.launches``' ``launch_intervals``): said in numbers when
    they are few (under ``timeline.launches``' ``FEW_INTERVALS``), where a median of a handful of gaps is no pace;
    the first launches left out said only where the window holds some (a warm-up before it made them all)."""
    n = num(f, "launch_intervals")
    # no first launch in the window (a trace whose warm-up made them all): nothing was left out of it
    steady, attributed = num(f, "steady_launches"), num(f, "attributed_launches")
    left_out = steady is None or attributed is None or steady < attributed
    if n is None or n >= FEW_INTERVALS:
        return "medians, the first launch of each kernel left out" if left_out else "medians"
    of = "a single time" if n == 1 else f"the median of {int(n):,} times"
    return f"{of} between launches" + (", each kernel's first launch left out" if left_out else "")


def _launch_count(f: dict[str, Any], per_step: float) -> str:
    where = "per step" if num(f, "kernels_per_step") is not None else "in the whole trace"
    return f"{per_step:,.0f} kernel launch{'' if per_step == 1 else 'es'} {where}"


def _launches_per_step(f: dict[str, Any]) -> float | None:
    """Kernel launches per measured step; a run without steps counts as one step over its whole window."""
    per_step = num(f, "kernels_per_step")
    return per_step if per_step is not None else num(f, "window_launches")


def _wait_line(f: dict[str, Any], wait: float) -> str:
    busy, steps, wait_ns = num(f, "busy_pct"), num(f, "steps"), num(f, "host_wait_ns")
    per_step = f", {format_ns(wait_ns / steps)} per step" if steps and wait_ns is not None else ""
    return (
        f"the GPU idles waiting for the host {wait:.1f}% of the measured window{per_step}"
        + (f" and is busy only {busy:.1f}%" if busy is not None else "")
        + " (timeline.breakdown)"
    )


def host_bound(results: Results) -> Recommendation | None:
    """The device idles waiting for the host for a large share of the step, and launch overhead does not
    explain it (few launches, or kernels long enough to cover them): the host is busy with other work."""
    b = get(results, "timeline.breakdown")
    if b is None or (wait := num(b.facts, "host_wait_pct")) is None or wait < HOST_WAIT_PCT:
        return None
    launches = get(results, "timeline.launches")
    if launches is not None and _launch_evidence(launches.facts) is not None:
        return None  # launch_bound speaks
    evidence, sources = [_wait_line(b.facts, wait)], [b.id]
    held = _held_call(b.facts)
    slow_launch = held is not None and held["class"] == "launch"
    if launches is not None and (line := _few_launches_line(launches.facts, slow_launch)) is not None:
        evidence.append(line)
        sources.append(launches.id)
    if (doing := _host_work_line(b.facts)) is not None:
        evidence.append(doing)
    if held is not None:
        evidence.append(
            f"for {held['pct']:.0f}% of the wait the host was inside {held['call']} ({held['calls']:,} "
            f"call{'s' if held['calls'] != 1 else ''}, the longest {format_ns(held['longest_ns'])}) "
            "(timeline.breakdown)"
        )
    if (other := _other_waits_line(b.facts)) is not None:
        evidence.append(other)
    whole_run = b.facts.get("window") != "steps"
    runtime = gpu_runtime(results)
    if whole_run:
        evidence.append(
            f"no step spans: the window is the whole trace, start-up included ({runtime} context creation, "
            f"{'MIOpen' if runtime == 'HIP' else 'cuDNN'} autotuning, compilation) (timeline.breakdown)"
        )
    impact, per = at_stake(results, num(b.facts, "host_wait_ns"))
    return Recommendation(
        "host_bound", "The GPU waits for the host: host work between launches dominates",
        "medium" if whole_run else severity(wait), evidence, sources, _host_action(b.facts, whole_run, runtime, held),
        impact_ns=impact, impact_per=per,
    )  # fmt: skip


def _few_launches_line(f: dict[str, Any], slow_launch: bool = False) -> str | None:
    """Why the launch statistics do not make the wait launch-bound; where a slow launch call holds the wait
    (``slow_launch``), it is their count and pace that do not explain it."""
    per_step, short = _launches_per_step(f), num(f, "short_pct")
    if per_step is None or short is None:
        return None
    launches = _launch_count(f, per_step)
    subject = "the launch count and pace do" if slow_launch else "launches do"
    kernel, interval = num(f, "median_kernel_ns"), num(f, "launch_interval_ns")
    pace = (f"; the median kernel runs {format_ns(kernel)}, the host issues a launch every {format_ns(interval)} "
            f"({_pace_basis(f)})" if kernel is not None and interval is not None else "")  # fmt: skip
    return (
        f"{subject} not explain it: {launches}, {short:.0f}% of the kernels under "
        f"{format_ns_setting(num(f, 'short_threshold_ns') or 0)}{pace} (launch-bound: {MIN_LAUNCHES_PER_STEP} or more "
        f"per step, over {SHORT_KERNELS_PCT:g}% of them short, the median kernel shorter than the time between "
        "launches) (timeline.launches)"
    )


def _host_work_line(f: dict[str, Any]) -> str | None:
    """What the host ran while the GPU waited for it (``timeline.breakdown``), where the trace has operators."""
    ops = f.get("host_wait_ops")
    if not isinstance(ops, list):
        return None
    named = [f"{_short(str(o['op']))} ({o['pct']:.0f}%)" for o in ops[:3] if (o.get("pct") or 0) >= 1]
    outside = num(f, "host_wait_outside_ops_pct")
    parts = [f"while the GPU waited, the host ran {', '.join(named)} of the wait"] if named else []
    if outside is not None and outside >= 1:
        of = "of it" if parts else "of the wait"
        parts.append(f"no operator ran for {outside:.0f}% {of} (Python code, or work the trace does not record)")
    return "; ".join(parts) + " (timeline.breakdown)" if parts else None


def _held_call(f: dict[str, Any]) -> dict[str, Any] | None:
    """The runtime API call the host was inside for at least ``HOST_CALL_PCT`` of the device's wait for it."""
    calls = f.get("host_wait_calls")
    if not isinstance(calls, list) or not calls or (calls[0].get("pct") or 0) < HOST_CALL_PCT:
        return None
    return dict(calls[0])


def _call_action(held: dict[str, Any], runtime: str) -> str:
    """What to do first about a runtime call that holds the host while the device waits."""
    call, share = held["call"], f"{held['pct']:.0f}% of the wait"
    if held["class"] == "alloc":
        alloc_conf = "PYTORCH_HIP_ALLOC_CONF" if runtime == "HIP" else "PYTORCH_CUDA_ALLOC_CONF"
        return (
            f"Stop the device allocations in the step ({call}, {share}): the caching allocator asks the driver for "
            "memory when its cache cannot serve a request, so keep the cache across steps (no "
            "torch.cuda.empty_cache() in the loop), let warm-up steps reach the peak before measuring, or set "
            f"{alloc_conf}=expandable_segments:True; then "
        )
    if held["class"] == "launch" and held["longest_ns"] * 2 >= held["ns"]:
        eager = " or load kernels eagerly (CUDA_MODULE_LOADING=EAGER)" if runtime == "CUDA" else ""
        return (
            f"Measure past the first launches: one {call} call took {format_ns(held['longest_ns'])}, and a launch "
            "that slow is the runtime loading the kernel's code at its first launch (lazy loading), paid in the "
            f"first steps only: profile after warm-up steps (torch.profiler.schedule(wait=1, warmup=1, active=3))"
            f"{eager}; then "
        )
    return f"Find what makes {call} slow ({share}; runtime.api_calls lists the calls) and shorten it first; then "


def _other_waits_line(f: dict[str, Any]) -> str | None:
    """The GPU's other waits on the host, which the sync and input rules weigh: syncs, data loading."""
    waits = [(num(f, "sync_wait_pct"), "on host syncs"), (num(f, "input_wait_pct"), "for input data")]
    named = [f"{what} {pct:.1f}%" for pct, what in waits if pct is not None and pct >= 1]
    if not named:
        return None
    return f"besides, the GPU waits {' and '.join(named)} of the measured window (timeline.breakdown)"


def _host_action(f: dict[str, Any], whole_run: bool, runtime: str, held: dict[str, Any] | None) -> str:
    ops = f.get("host_wait_ops") if isinstance(f.get("host_wait_ops"), list) else None
    outside = num(f, "host_wait_outside_ops_pct")
    if held is not None:  # the runtime call that holds the wait (_held_call)
        first = _call_action(held, runtime)
    elif ops is None:
        first = "Record the op level (--levels model,layer,op) to see what the host runs while the GPU waits; then "
    elif outside is not None and outside >= OUTSIDE_OPS_PCT:
        first = ("Most of the wait is outside any operator: profile the step's Python code (with_stack=True, or a "
                 "sampling profiler such as py-spy) and move what it does off the step; then ")  # fmt: skip
    elif ops:
        first = f"Shorten what the host runs between launches, {_short(str(ops[0]['op']))} first; then "
    else:
        first = ""
    graph = f"the step in a {runtime} graph (torch.compile(mode='reduce-overhead'))"
    overhead = (
        f"cut the host's cost of each call of the compiled code (its guards and Python wrapper) by capturing {graph}"
        if _compiled(ops or [])
        else f"cut the framework's per-op overhead with torch.compile or by capturing {graph}"
    )
    steps = (
        "move work that needs no GPU (data preparation, logging, metrics, checkpoints, .cpu()/.item()) out of the "
        f"step or into DataLoader workers, {overhead}, or raise the batch size so the host's cost per step covers "
        "more samples."
    )
    action = first + steps if first else steps[0].upper() + steps[1:]
    if whole_run:
        action = ("Profile a few steps past start-up (torch.profiler.schedule(wait=1, warmup=1, active=3) with "
                  "prof.step(), or xstack.step()) to see the steady state. " + action)  # fmt: skip
    return action


def _short(name: str, limit: int = 80) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."


def memory_bound_kernels(results: Results) -> Recommendation | None:
    """Memory-bound kernels (against the device's ridge, or below 1 FLOP/byte) take a large share of GPU time,
    and the GPU is busy enough for faster kernels to shorten the step."""
    a10 = get(results, "A10")
    if a10 is None or not a10.rows:
        return None
    b = get(results, "timeline.breakdown")
    busy = num(b.facts, "busy_pct") if b is not None else None
    if busy is not None and busy < GPU_BUSY_PCT:
        return None  # the GPU mostly waits: faster kernels would only wait longer (the host-bound rules speak)
    found = _memory_bound(a10)
    if found is None:
        return None
    pct, bound_ns, bound = found
    rule = "below the ridge point of the device" if _has_peaks(a10) else f"below {LOW_INTENSITY:g} FLOP/byte"
    evidence = [
        f"{len(bound)} memory-bound kernel names ({rule}) take {pct:.1f}% of kernel time, {format_ns(bound_ns)} (A10)",
        f"the largest: {bound[0][0][:120]}",
    ]
    if any("analytic" in label for label in a10.labels):
        evidence.append("FLOPs and bytes are analytic estimates from op shapes (A10 labels)")
    sources = ["A10"]
    if busy is not None and b is not None:
        evidence.append(f"the GPU is busy {busy:.1f}% of the measured window (timeline.breakdown)")
        sources.append(b.id)
    precision_line, fp32 = _precision(bound, bound_ns)
    if precision_line is not None:
        evidence.append(precision_line)
    action = (
        "Fuse the element-wise and normalisation ops around them (torch.compile, fused LayerNorm/optimizer "
        "kernels) so tensors make fewer round trips through DRAM"
    )
    action += (
        "; run them in bf16 (torch.autocast(device_type='cuda', dtype=torch.bfloat16)) to halve the bytes they move."
        if fp32
        else "."
    )
    impact, per = at_stake(results, bound_ns)
    return Recommendation(
        "memory_bound_kernels", "Memory-bound kernels dominate GPU time", severity(pct), evidence, sources, action,
        impact_ns=impact, impact_per=per,
    )  # fmt: skip


def _has_peaks(a10: Result) -> bool:
    return any(v is not None for v in a10.column("bound"))


def _memory_bound(a10: Result) -> tuple[float, int, list[tuple[str, int]]] | None:
    """(share of kernel time, ns, [(kernel name, ns)]) of the memory-bound kernel names, when over the
    threshold; the names by time as A10 orders them."""
    total, bound_ns, bound = 0, 0, []
    has_peaks = _has_peaks(a10)
    for name, t, ai, b in zip(
        a10.column("kernel"), a10.column("total"), a10.column("AI"), a10.column("bound"), strict=True
    ):
        if t is None:  # a counter range without a measured duration: no share of time to weigh
            continue
        total += t
        if (b == "memory") if has_peaks else (ai is not None and ai < LOW_INTENSITY):
            bound_ns += t
            bound.append((str(name), int(t)))
    pct = 100.0 * bound_ns / total if total else 0.0
    return (pct, bound_ns, bound) if pct >= MEMORY_BOUND_SHARE_PCT else None


def _precision(bound: list[tuple[str, int]], bound_ns: int) -> tuple[str | None, bool]:
    """The evidence line on the memory-bound kernels' data type (from their names), and whether the fp32 ones
    hold enough of their time for bf16 to be worth advising."""
    by: dict[str, int] = {}
    for name, t in bound:
        precision = kernel_precision(name)
        by[precision or "unknown"] = by.get(precision or "unknown", 0) + t
    fp32 = 100.0 * by.get("fp32", 0) / bound_ns if bound_ns else 0.0
    narrow = 100.0 * (by.get("16-bit", 0) + by.get("8-bit", 0)) / bound_ns if bound_ns else 0.0
    if fp32 >= FP32_SHARE_PCT:
        return (
            f"{fp32:.0f}% of that time is in fp32 kernels (float, sgemm or tf32 in their names; threshold "
            f"{FP32_SHARE_PCT:g}%): 16-bit data would halve their bytes (A10)"
        ), True
    if narrow:
        return f"{narrow:.0f}% of that time is in kernels that already move 16-bit or narrower data (A10)", False
    return None, False


def _compiled(ops: list[dict[str, Any]]) -> bool:
    """Whether the host ran torch.compile's code while the GPU waited: advice to compile would be moot."""
    return any(str(o.get("op", "")).startswith(COMPILED_OPS) for o in ops)
