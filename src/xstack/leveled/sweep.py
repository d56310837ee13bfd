"""Sweeps over batch sizes: one leveled measurement per batch size, all in one store (A1 across batch sizes).

``xstack sweep --batch-sizes 1,2,4 -- python infer.py ARGS`` runs the program's passes once per batch size, each
pass in a fresh process as ``xstack profile`` does. The program learns its batch size either way, or both:

- the environment variable ``XSTACK_BATCH_SIZE`` (``int(os.environ["XSTACK_BATCH_SIZE"])``);
- the placeholder ``{batch_size}`` in its arguments, replaced by the size (``-- python infer.py --batch
  {batch_size}``).

``sweep(make_step, batch_sizes)`` does the same in this process for a step function: ``make_step(bs)`` returns
the callable that runs one iteration at batch size ``bs``, timed as ``xstack.measure`` times a step.

Every pass of a sweep and every merged run carries the batch size in ``runs.config`` (``batch_size``) and the
sweep it belongs to (``sweep``: every size asked for and the latency target); each batch size's passes are
merged into a run of their own. A batch size that fails (out of memory at the largest, typically) ends the
sweep: the sizes before it are kept and merged, so are its passes that completed, and the failure is reported
(the program's exit code is returned; the step's exception is raised again with a note).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Final

import orjson

from xstack.collect import _child
from xstack.errors import ProgramFailedError, StoreError, UsageError, XstackError
from xstack.leveled.merge import merge_passes
from xstack.leveled.passes import (
    check_iterations,
    check_timed,
    pass_config,
    pass_name,
    record,
    resolve_passes,
    sampled_s,
)
from xstack.leveled.progress import PassProgress
from xstack.leveled.script import measured_none, pass_command
from xstack.outfile import os_reason
from xstack.profile import Profile
from xstack.runner import Program
from xstack.text import counted
from xstack.trace import attrs as A
from xstack.trace.store import Store, check_new

BATCH_SIZE_ENV: Final = "XSTACK_BATCH_SIZE"
"""Environment variable that tells a swept program its batch size (a decimal integer)."""
PLACEHOLDER: Final = "{batch_size}"
"""Replaced by the batch size in each argument of a swept program."""


def parse_batch_sizes(text: str, who: str = "xstack sweep") -> list[int]:
    """``"1,2,4,8"`` as ``[1, 2, 4, 8]``; a usage error for anything but distinct positive integers."""
    sizes = []
    for part in text.split(","):
        try:
            sizes.append(int(part.strip()))
        except ValueError:
            raise UsageError(
                f"{who}: --batch-sizes {text!r}: {part.strip()!r} is not an integer (give e.g. --batch-sizes 1,2,4,8)"
            ) from None
    return check_batch_sizes(sizes, who)


def check_batch_sizes(sizes: Sequence[int], who: str) -> list[int]:
    """``sizes`` as a list; a usage error naming ``who`` unless they are distinct positive integers."""
    if not sizes:
        raise UsageError(f"{who}: no batch sizes given (e.g. 1,2,4,8)")
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise UsageError(f"{who}: batch sizes must be positive integers (got {size!r})")
    repeated = sorted({s for s in sizes if list(sizes).count(s) > 1})
    if repeated:
        raise UsageError(f"{who}: batch size {repeated[0]} is given twice")
    return list(sizes)


def sweep_config(batch_size: int, batch_sizes: Sequence[int], latency_target_ms: float | None) -> dict[str, Any]:
    """The ``runs.config`` entries of every run measured at ``batch_size`` in a sweep over ``batch_sizes``."""
    sweep: dict[str, Any] = {"batch_sizes": list(batch_sizes)}
    if latency_target_ms is not None:  # left out, not null: the merged run's config is patched (null deletes)
        sweep["latency_target_ms"] = latency_target_ms
    return {A.CONFIG_BATCH_SIZE: batch_size, A.CONFIG_SWEEP: sweep}


def program_at(program: Program, batch_size: int) -> Program:
    """``program`` with ``{batch_size}`` in its arguments replaced by ``batch_size``."""
    args = [arg.replace(PLACEHOLDER, str(batch_size)) for arg in program.args]
    return Program(program.script, program.module, args, program.code, program.unbuffered)


# -- a program, one process per pass --------------------------------------------------------------------------
def sweep_program(
    program: Program,
    batch_sizes: Sequence[int],
    *,
    passes: Sequence[str] | None = None,
    warmup: int = 5,
    iters: int = 20,
    out: Path | None = None,
    latency_target_ms: float | None = None,
    progress: bool = True,
    force: bool = False,
) -> int:
    """Measure ``program`` at each of ``batch_sizes`` (in order) with the passes of ``xstack profile``, all into
    the store ``out``; returns the program's exit code (0 when every batch size ran and merged, 1 when one did
    not merge). An existing store at ``out`` is refused before anything runs, unless ``force`` (replace it)."""
    check_iterations(warmup, iters, "xstack sweep")
    sizes = check_batch_sizes(batch_sizes, "xstack sweep")
    level_sets = resolve_passes(passes or None, "xstack sweep")
    check_timed(level_sets, "xstack sweep")
    store_path = out or Path("xstack-out") / f"{program.name}-sweep.duckdb"
    check_new(store_path, overwrite=force)
    work = _work_folder(store_path)
    ran: dict[int, list[Path]] = {}
    code = 0
    try:
        for k, size in enumerate(sizes, 1):
            _say(f"batch size {size} ({k}/{len(sizes)})")
            ran[size] = []
            code, failed = _run_passes(program_at(program, size), size, level_sets, warmup, iters, work, progress,
                                       ran[size])  # fmt: skip
            if not code and failed:  # no iteration measured: no other pass or batch size would measure one
                _say(f"batch size {size}, pass {failed} measured no iteration, nor would the others: stopping the "
                     "sweep")  # fmt: skip
                break
            if code:
                kept = ", ".join(map(str, sizes[: k - 1])) or "none"
                ran_here = sum(s.exists() for s in ran[size])  # its passes before the failing one, and that one's
                here = f"; what batch size {size} recorded is kept ({counted(ran_here, 'run')})" if ran_here else ""
                _say(f"the program exited with {code} at batch size {size} (pass {failed}): stopping the sweep; "
                     f"batch sizes measured before it: {kept}{here}")  # fmt: skip
                break
        if code and not any(s.exists() for stores in ran.values() for s in stores):  # killed in the first pass
            raise ProgramFailedError(f"{store_path}: no sweep written: the program exited with {code} in the first "
                                     "pass, before its profile was written", code)  # fmt: skip
        merged = _gather(store_path, ran, sizes, latency_target_ms)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _say(f"sweep written to {store_path}")
    return code or (0 if merged else 1)


def _work_folder(store_path: Path) -> Path:
    """The emptied folder beside the store where each pass writes its own store; a ``StoreError`` naming the
    store (not the folder, which the user never named) where it cannot be made."""
    work = store_path.with_name(f".{store_path.name}.sweep")
    try:
        store_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
    except OSError as exc:
        raise StoreError(f"{store_path}: cannot write the store here ({os_reason(store_path, exc)})") from exc
    return work


def _run_passes(program: Program, size: int, level_sets: list[tuple[str, ...]], warmup: int, iters: int,
                work: Path, progress: bool, stores: list[Path]) -> tuple[int, str]:  # fmt: skip
    """Run each pass of one batch size, appending its store's path to ``stores``; the exit code of the first
    pass that failed and its name; ``(0, name)`` where the first pass measured no iteration (the others are not
    run); else ``(0, "")``."""
    names = [pass_name(levels) for levels in level_sets]
    env = {**os.environ, BATCH_SIZE_ENV: str(size)}
    for index, levels in enumerate(level_sets):
        _say(f"batch size {size}, pass {index + 1}/{len(level_sets)}: {names[index]}")
        stores.append(work / f"bs{size}-pass{index + 1}.duckdb")
        code = _run(pass_command(program, levels, names, index, stores[-1], warmup, iters, progress), env)
        if code:
            return code, names[index]
        if index == 0 and measured_none(stores[-1], warmup):
            return 0, names[index]
    return 0, ""


def _run(command: list[str], env: dict[str, str]) -> int:
    return _child.wait(subprocess.Popen(command, env=env))  # a Ctrl-C reaches it too: it completes its store


def _gather(store_path: Path, ran: dict[int, list[Path]], sizes: list[int], target: float | None) -> bool:
    """Copy every batch size's passes into one store, stamp them with their batch size and merge each size's
    passes; whether every size that ran was merged."""
    if not any(path.exists() for paths in ran.values() for path in paths):
        raise XstackError(f"{store_path}: no pass left a profile (the program failed before xstack could start)")
    all_merged = True
    with Store.create(store_path, overwrite=True) as store:
        for size, paths in ran.items():
            ids: list[int] = []
            for path in (p for p in paths if p.exists()):
                with Store.open(path):  # checks that the pass's store is complete
                    pass
                ids += store.append_runs_from(path)
            config = sweep_config(size, sizes, target)
            stamp(store, ids, config)
            all_merged = _merge_size(store, ids, size, config, strict=False) is not None and all_merged
    return all_merged


# -- a step function, in this process ---------------------------------------------------------------------------
def sweep(
    make_step: Callable[[int], Callable[[], Any]],
    batch_sizes: Sequence[int],
    *,
    passes: Sequence[str | Sequence[str]] | None = None,
    warmup: int = 5,
    iters: int = 20,
    path: str | os.PathLike[str] | None = None,
    name: str = "sweep",
    latency_target_ms: float | None = None,
    progress: bool = True,
) -> Path:
    """Time the step ``make_step(bs)`` at each batch size ``bs`` of ``batch_sizes`` as ``xstack.measure`` does
    (one pass per level set, then the merge), all into one store; returns the store's path.

    When ``make_step`` or a step raises, the sweep stops: the sizes before are kept, merged; the passes of the
    failing size that completed are merged too, and the exception is raised again with a note naming the size.
    """
    check_iterations(warmup, iters, "xstack.sweep")
    sizes = check_batch_sizes(batch_sizes, "xstack.sweep")
    level_sets = resolve_passes(passes, "xstack.sweep")
    check_timed(level_sets, "xstack.sweep")
    out = Path(path) if path is not None else Path("xstack-out") / f"{name}.duckdb"
    with ExitStack() as stack:
        created = Store.create(out, overwrite=True)
        store = created.__enter__()
        # completed whatever happens in the passes: a pass that raised is kept, marked cut_short
        stack.callback(created.__exit__, None, None, None)
        for size in sizes:
            config = sweep_config(size, sizes, latency_target_ms)
            ids: list[int] = []
            try:
                _measure_passes(store, make_step(size), level_sets, warmup, iters, name, config, ids, progress)
            except BaseException as exc:
                _merge_size(store, ids, size, config, strict=False)
                exc.add_note(f"xstack.sweep: batch size {size} failed; the sizes before it are kept in {out}")
                raise
            _merge_size(store, ids, size, config, strict=True)
    return out


def _measure_passes(store: Store, step: Callable[[], Any], level_sets: list[tuple[str, ...]], warmup: int,
                    iters: int, name: str, config: dict[str, Any], ids: list[int], progress: bool) -> None:  # fmt: skip
    """One batch size's passes, as ``xstack.measure`` runs them; each pass's run id is appended to ``ids``."""
    names = [pass_name(levels) for levels in level_sets]
    with PassProgress(names, warmup, iters, enabled=progress) as bar:
        for index, levels in enumerate(level_sets):
            run_config = pass_config(warmup, iters, names, sampled_s(levels)) | config
            with Profile(levels, store.path, name, store=store, pass_name=names[index], config=run_config,
                         steps=warmup + iters) as prof:  # fmt: skip
                ids.append(prof.run_id)
                record(step, prof, bar, index)


# -- both ------------------------------------------------------------------------------------------------------
def stamp(store: Store, run_ids: Sequence[int], config: dict[str, Any]) -> None:
    """Merge ``config`` into the ``runs.config`` of ``run_ids``."""
    if run_ids:
        store.con.execute(
            "UPDATE _runs SET config = json_merge_patch(coalesce(config, '{}'), ?::JSON) "
            "WHERE list_contains(?::INTEGER[], run_id)",
            [orjson.dumps(config).decode(), list(run_ids)],
        )


def _merge_size(store: Store, ids: list[int], size: int, config: dict[str, Any], *, strict: bool) -> int | None:
    """Merge one batch size's passes ``ids`` into a run stamped with ``config``; its run id, or None when no pass
    completed or (unless ``strict``, which raises) the merge failed, which is said on stderr."""
    complete = store.query(
        "SELECT count(*) FROM runs WHERE list_contains(?::INTEGER[], run_id) AND config->>'$.status' = 'complete'",
        [ids],
    )[0][0]
    if not complete:
        return None
    try:
        run_id = merge_passes(store, ids).run_id
    except Exception as exc:  # the merge is one transaction: the passes stay, whole, whatever failed
        if strict:
            raise
        what = str(exc) if isinstance(exc, XstackError) else f"{type(exc).__name__}: {exc}"
        print(f"xstack: error: batch size {size}: passes not merged: {what}", file=sys.stderr)
        return None
    stamp(store, [run_id], config)
    return run_id


def _say(message: str) -> None:
    print(f"xstack: {message}", file=sys.stderr, flush=True)
