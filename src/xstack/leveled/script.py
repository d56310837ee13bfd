"""``xstack profile``: a leveled measurement of a program whose iterations are marked with ``xstack.step()``.

The program runs once per pass, each time in a fresh process (``xstack run`` with the pass's levels), so no
pass inherits another's warm caches, hooks or profiler state; each run records ``warmup`` + ``iters``
iterations and is then stopped. The passes' stores are gathered into one store and merged. A pass whose
program fails ends the measurement: the passes so far are kept (the failed one marked ``cut_short``), the
complete ones merged, and the program's exit code is returned.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from xstack.collect import _child
from xstack.errors import ProgramFailedError, UsageError, XstackError
from xstack.leveled.merge import merge_passes
from xstack.leveled.passes import check_iterations, check_timed, pass_name, resolve_passes, sampled_s
from xstack.runner import Measured, Program, child_command
from xstack.trace.store import Store, append_store, check_new, scratch_path

SYSCALLS_SUFFIX = "+syscalls"
"""Ends the name of a pass whose system calls are traced: ``model+layer+system+syscalls``."""


def profile_program(
    program: Program,
    *,
    passes: Sequence[str] | None = None,
    warmup: int = 5,
    iters: int = 20,
    out: Path | None = None,
    progress: bool = True,
    metrics: bool = False,
    metrics_iters: int = 1,
    io: bool = False,
    system: bool = False,
    force: bool = False,
    append: bool = False,
) -> int:
    """Measure ``program`` once per level set of ``passes`` (default: ``DEFAULT_PASSES`` that can run here)
    into ``out`` and merge the passes; returns the program's exit code (0 when every pass ran).

    An existing store at ``out`` is refused before the first pass runs, unless ``force`` (it is replaced) or
    ``append`` (the passes and their merged run are added to it).

    ``metrics`` adds a ``model,metrics`` pass (hardware counters by Nsight Compute) after the others; a pass
    with the ``metrics`` level records ``metrics_iters`` iterations (each kernel is replayed many times), and
    its counters are joined to the kernels of the merged profile. ``ncu``'s CSV is kept beside the store.
    ``io`` adds a ``model,io`` pass: every file operation of the program and its workers (``leveled._io``).
    ``system`` adds a ``model,system`` pass (the sampler's CPU, memory and GPU counters) and a
    ``model,layer,system`` pass with its system calls traced (named ``model+layer+system+syscalls``), unless a
    pass of ``passes`` records ``system`` already; their runs keep their counters and calls (the merge never
    takes timings from them). A pass sampling the system level whose calls are not traced measures more than
    ``iters`` iterations where those would last less than ``collect.system.measured_s()``."""
    check_iterations(warmup, iters, "xstack profile")
    check_iterations(warmup, metrics_iters, "xstack profile (metrics pass)")
    level_sets, names = _passes(passes, metrics=metrics, io=io, system=system)
    store_path = out or Path("xstack-out") / f"{program.name}.duckdb"
    if append:
        with Store.open(store_path, read_only=False):  # fails now, and clearly, on a missing or foreign store
            pass
    else:
        check_new(store_path, overwrite=force, can_append=True)
    work = store_path.with_name(f".{store_path.name}.passes")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    code = 0
    stores: list[Path] = []
    try:
        for index, levels in enumerate(level_sets):
            sampled = _sampled(levels, names[index])
            longer = (
                f" (measuring at least {sampled:g} s of steps for the sampler, past --iters if need be)"
                if sampled
                else ""
            )
            print(f"xstack: pass {index + 1}/{len(level_sets)}: {names[index]}{longer}", file=sys.stderr, flush=True)
            stores.append(work / f"pass{index + 1}.duckdb")
            n = metrics_iters if "metrics" in levels else iters
            code = _run(pass_command(program, levels, names, index, stores[-1], warmup, n, progress))
            _keep_ncu_csv(stores[-1], store_path)
            if code:
                print(f"xstack: the program exited with {code} in pass {names[index]}: stopping", file=sys.stderr)
                break
            if index == 0 and measured_none(stores[-1], warmup):  # every pass would run the program for nothing
                print(f"xstack: pass {names[index]} measured no iteration, nor would the others: stopping",
                      file=sys.stderr)  # fmt: skip
                break
        kept = [s for s in stores if s.exists()]
        if code and not kept:  # killed in the first pass (SIGKILL, SIGSEGV): its code says how, as a shell's would
            raise ProgramFailedError(f"{store_path}: no profile written: the program exited with {code} in the first "
                                     "pass, before its profile was written", code)  # fmt: skip
        merged = _gather(store_path, kept, append=append)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    written = "added to" if append else "written to"
    if merged:
        print(f"xstack: profile {written} {store_path}", file=sys.stderr)
    else:
        print(f"xstack: the passes' own runs {written} {store_path}, without a merged run", file=sys.stderr)
    return code or (0 if merged else 1)


def _passes(passes: Sequence[str] | None, *, metrics: bool, io: bool, system: bool
            ) -> tuple[list[tuple[str, ...]], list[str]]:  # fmt: skip
    """The level sets of the measurement, the passes asked for by flags after the user's, and their names."""
    level_sets = resolve_passes(passes or None, "xstack profile")
    if metrics and not any("metrics" in levels for levels in level_sets):
        level_sets += resolve_passes(["model,metrics"], "xstack profile")
    if io and not any("io" in levels for levels in level_sets):
        level_sets += resolve_passes(["model,io"], "xstack profile")
    traced = len(level_sets)  # the index of the pass whose system calls are traced, if any
    if system and not any("system" in levels for levels in level_sets):
        from xstack.collect.syscalls import unavailable_reason

        if reason := unavailable_reason():  # before any pass runs, not after the first ones
            raise UsageError(f"xstack profile --system: system calls cannot be traced here: {reason}")
        level_sets += resolve_passes(["model,system", "model,layer,system"], "xstack profile")
        traced = len(level_sets) - 1
    check_timed(level_sets, "xstack profile")
    names = [pass_name(levels) + (SYSCALLS_SUFFIX if i == traced else "") for i, levels in enumerate(level_sets)]
    return level_sets, names


def pass_command(program: Program, levels: Sequence[str], names: Sequence[str], index: int, out: Path,
                 warmup: int, iters: int, progress: bool) -> list[str]:  # fmt: skip
    """The ``xstack run`` child that records pass ``index`` (of ``names``) of ``program`` into ``out``; a pass
    named ``...+syscalls`` traces its system calls."""
    measured = Measured(warmup, iters, names[index], list(names), index + 1, len(names), progress, quiet=True,
                        min_measured_s=_sampled(levels, names[index]))  # fmt: skip
    return child_command(program, levels, out, measured, syscalls=names[index].endswith(SYSCALLS_SUFFIX))


def _sampled(levels: Sequence[str], name: str) -> float | None:
    """How long the measured steps of pass ``name`` last at least (``passes.sampled_s``): a fast step would end a
    sampling pass before the sampler took enough samples for the system analyses; a ``...+syscalls`` pass is
    traced, not sampled."""
    return sampled_s(levels, traced=name.endswith(SYSCALLS_SUFFIX))


def measured_none(pass_store: Path, warmup: int) -> bool:
    """Whether the complete pass in ``pass_store`` ended fewer iterations than its ``warmup``: none measured."""
    if not pass_store.exists():
        return False
    with Store.open(pass_store) as store:
        rows = store.query("SELECT config->>'$.status', (config->>'$.steps_completed')::INT FROM runs")
    return bool(rows) and rows[0][0] == "complete" and (rows[0][1] or 0) <= warmup


def _keep_ncu_csv(pass_store: Path, store_path: Path) -> None:
    """Move a metrics pass's ``ncu`` output beside the final store (the pass's folder is removed)."""
    from xstack.collect.metrics import ncu_csv_path

    csv = ncu_csv_path(pass_store)
    if csv.exists():
        shutil.move(csv, ncu_csv_path(store_path))


def _run(command: list[str]) -> int:
    return _child.wait(subprocess.Popen(command))  # a Ctrl-C reaches it too: it completes its store


def _gather(store_path: Path, stores: list[Path], *, append: bool) -> bool:
    """Copy the passes' runs into one store (a new one, or with ``append`` the existing one, all of them in one
    transaction) and merge them; whether they were merged."""
    if not stores:
        raise XstackError(f"{store_path}: no pass left a profile (the program failed before xstack could start)")
    if not append:
        with Store.create(store_path, overwrite=True) as store:  # checked before the passes ran
            return _merge(store, store_path, _copy_passes(store, stores))
    scratch = scratch_path(store_path)
    with Store.create(scratch, overwrite=True) as store:
        _copy_passes(store, stores)
    ids = append_store(store_path, scratch)
    with Store.open(store_path, read_only=False) as store:
        return _merge(store, store_path, ids)


def _copy_passes(store: Store, stores: list[Path]) -> list[int]:
    """Copy the runs of the passes' complete stores into ``store``; their ids there."""
    ids = []
    for path in stores:
        with Store.open(path):  # checks that the pass's store is complete
            pass
        ids += store.append_runs_from(path)
    return ids


def _merge(store: Store, store_path: Path, ids: list[int]) -> bool:
    """Merge the passes ``ids`` of ``store`` (to be found at ``store_path``); whether they were merged."""
    complete = store.query(
        "SELECT count(*) FROM runs WHERE config->>'$.status' = 'complete' AND list_contains(?, run_id)", [ids]
    )[0][0]
    if not complete:
        return False
    try:
        merge_passes(store, ids)
    except UsageError as exc:  # keep the passes: they are what there is to look at
        why = str(exc).replace(str(store.path), str(store_path))  # the store is named as it will be, not .partial
        print(f"xstack: error: passes not merged: {why}", file=sys.stderr)
        return False
    except Exception as exc:  # the merge is one transaction: the passes stay, whole, whatever failed
        print(f"xstack: error: passes not merged: {type(exc).__name__}: {exc}", file=sys.stderr)
        return False
    return True
