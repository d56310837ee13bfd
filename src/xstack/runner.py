"""``xstack run``: run a Python program, unmodified, inside a profile, as ``python`` itself would run it.

The program runs in this process (so module hooks reach it) with its own ``sys.argv``, standard streams and
exit code. Whatever happens to it, its store is completed: a crash, ``os._exit(N)`` (N > 0) or Ctrl-C marks the
run ``cut_short``. Given a ``Measured`` pass, the profile records that many iterations (ended by
``xstack.step()``) and then stops the program, which is how ``xstack profile`` runs each pass of a leveled
measurement.
"""

from __future__ import annotations

import builtins
import io
import itertools
import os
import pkgutil  # noqa: F401  runpy.run_path imports it as it starts the program: its reads are not the program's
import runpy
import shlex
import signal
import sys
import threading
import traceback
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import orjson

from xstack import salvage
from xstack.collect import _child
from xstack.collect.io import CHILD_ENV as IO_CHILD_ENV
from xstack.collect.io import run_preloaded
from xstack.collect.metrics import CLOCK_CONTROL_ENV, NCU_CHILD_ENV, REPLAY_ENV, run_under_ncu
from xstack.collect.syscalls import CHILD_ENV as SYSCALLS_CHILD_ENV
from xstack.collect.syscalls import requested as syscalls_requested
from xstack.collect.syscalls import run_traced
from xstack.errors import StoreError, UsageError
from xstack.leveled.passes import pass_config
from xstack.leveled.progress import PassProgress
from xstack.profile import (
    PassComplete,
    Profile,
    describe_failure,
    parse_levels,
    ranked,
    running_program,
    stopped_from,
)
from xstack.text import counted
from xstack.trace import attrs as A
from xstack.trace.store import Store, append_store, check_new, scratch_path


@dataclass
class Program:
    """What to run: a script path, a module name or a command (``python -c``'s code), and its arguments."""

    script: Path | None
    module: str | None
    args: list[str]
    code: str | None = None
    unbuffered: bool = False
    """``python -u``: standard output and error unbuffered."""

    @property
    def name(self) -> str:
        if self.code is not None:
            return "command"
        return self.script.stem if self.script else (self.module or "program").rsplit(".", 1)[-1]

    def argv(self) -> list[str]:
        """The program as ``python`` takes it: ``script.py ARGS``, ``-m module ARGS`` or ``-c code ARGS``, after
        ``-u`` where it is unbuffered."""
        flags = ["-u"] if self.unbuffered else []
        if self.code is not None:
            return [*flags, "-c", self.code, *self.args]
        if self.script is not None:
            return [*flags, str(self.script), *self.args]
        return [*flags, "-m", self.module or "", *self.args]


@dataclass
class Measured:
    """One pass of a leveled measurement: ``warmup`` + ``iters`` iterations, then the program is stopped.
    ``index`` and ``count`` number the pass among the measurement's (for the progress bar)."""

    warmup: int
    iters: int
    pass_name: str
    passes: list[str]
    index: int = 1
    count: int = 1
    progress: bool = True
    quiet: bool = False
    """Print nothing of its own (``xstack profile`` speaks for its passes)."""
    min_measured_s: float | None = None
    """Go on past ``iters`` until the measured iterations have lasted this long (s): a pass sampling the
    system level needs enough samples inside them."""


LAUNCHERS = {
    "torchrun": "torchrun",
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torchrun",
    "accelerate": "accelerate launch",
    "deepspeed": "deepspeed",
}
"""Programs that start the program to profile in processes of their own, one per rank."""


def _launcher_error(launcher: str, command: str) -> UsageError:
    """Why ``command`` does not run under ``launcher`` and how to profile each rank instead."""
    module = "-m" if launcher != "deepspeed" else "--module"
    return UsageError(
        f"{command}: {launcher} starts the program in processes of its own, one per rank, which {command} would not "
        f"profile: start xstack run inside it, one store per rank, as in: {launcher} ... {module} xstack run "
        "--levels model,layer -o prof-{rank}.duckdb -- train.py ARGS"
    )


def parse_program(argv: Sequence[str], command: str = "xstack run") -> Program:
    """``[python] [-u] script.py ARGS``, ``[python] [-u] -m module ARGS`` or ``[python] [-u] -c code ARGS``; a
    leading python executable is optional. A launcher of one process per rank (``LAUNCHERS``) is refused, saying
    how to profile its ranks."""
    argv = list(argv)
    if argv and Path(argv[0]).name.startswith("python") and not argv[0].endswith(".py"):
        argv = argv[1:]
    unbuffered = bool(argv) and argv[0] == "-u"
    argv = argv[1:] if unbuffered else argv
    if not argv:
        raise UsageError(f"{command}: no program given ({command} -- python script.py ARGS)")
    program = _parse_rest(argv, command)
    program.unbuffered = unbuffered
    return program


def _parse_rest(argv: list[str], command: str) -> Program:
    """``parse_program`` after the python executable and ``-u``."""
    if (launcher := LAUNCHERS.get(Path(argv[0]).name)) or (argv[0] == "-m" and (launcher := LAUNCHERS.get(
            argv[1] if len(argv) > 1 else ""))):  # fmt: skip
        raise _launcher_error(launcher, command)
    if argv[0] == "-m":
        if len(argv) < 2:
            raise UsageError(f"{command}: -m needs a module name")
        if not _module_exists(argv[1]):
            raise UsageError(f"{command}: -m {argv[1]}: no such module")
        return Program(None, argv[1], argv[2:])
    if argv[0] == "-c":
        if len(argv) < 2:
            raise UsageError(f"{command}: -c needs the code to run")
        return Program(None, None, argv[2:], code=argv[1])
    if argv[0].startswith("-"):
        raise UsageError(f"{command}: unsupported python option {argv[0]!r} (only -u, -m MODULE or -c CODE)")
    script = Path(argv[0])
    if not script.is_file():
        raise UsageError(f"{command}: {script}: no such script")
    return Program(script, None, argv[1:])


def refuse_ranked(command: str) -> None:
    """A ``UsageError`` for ``command`` (``xstack profile``, ``xstack sweep``) started under a launcher of one
    process per rank: it runs the program afresh for each pass, and the processes of a second pass cannot join
    the job's rendezvous again (the launcher's store still holds the first pass's addresses)."""
    if ranked() is not None:
        raise UsageError(
            f"{command} runs the program once per pass, and under a launcher of one process per rank (torchrun) "
            "the processes of a second pass cannot join the job again: profile each rank with xstack run, one "
            "store per rank, as in: torchrun ... -m xstack run --levels model,layer --iters 20 -o "
            "prof-{rank}.duckdb -- train.py ARGS"
        )


def rank_path(out: Path | None, program: Program) -> Path | None:
    """The store of this process: under a launcher of one process per rank (torchrun sets ``RANK`` and
    ``WORLD_SIZE``), each rank's own, ``{rank}`` in ``out`` replaced by the rank, else ``.rankN`` added before
    its suffix (the default path's too); ``{rank}`` outside such a launcher is rank 0. The program restarted
    under a tracer (the io library, ncu, strace) by this rank's ``xstack run`` is given the store named already,
    which it writes as is: the tracer's output is added to that store."""
    if _wrapped_child():
        return out
    job = ranked()
    rank = str(job[0]) if job is not None else "0"
    if out is not None and "{rank}" in str(out):
        return Path(str(out).replace("{rank}", rank))
    if job is None:
        return out
    path = out or Path("xstack-out") / f"{program.name}.duckdb"
    if path.stem.endswith(f".rank{rank}"):  # a restart of this rank's xstack run (under a tracer): named already
        return path
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def _module_exists(name: str) -> bool:
    """Whether the top-level package of module ``name`` can be found where the program will look (the current
    folder first, as ``python -m`` does); nothing is imported: a package's own code runs only in the profile."""
    import importlib.util

    top = name.partition(".")[0]
    if top in sys.modules:
        return True
    sys.path.insert(0, os.getcwd())
    try:  # every finder, editable installs' too; a top-level name has no parent package to import
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return True  # let the program's run say what is wrong, as python would
    finally:
        sys.path.remove(os.getcwd())


def child_command(program: Program, levels: Sequence[str], out: Path, measured: Measured | None, *,
                  syscalls: bool = False, warmup: int | None = None) -> list[str]:  # fmt: skip
    """The ``xstack run`` command line that records ``program`` at ``levels`` into ``out`` (as ``measured``, or
    with ``warmup`` iterations; tracing its system calls with ``syscalls``). The caller has checked ``out`` (a
    pass's fresh path, or the output its own run may write), so the child replaces whatever is there."""
    command = [sys.executable, "-m", "xstack", "run", "--levels", ",".join(levels), "-o", str(out), "--force"]
    if syscalls:
        command.append("--syscalls")
    if measured is None and warmup is not None:
        command += ["--warmup", str(warmup)]
    if measured is not None:
        command += [
            *("--warmup", str(measured.warmup), "--iters", str(measured.iters), "--pass-name", measured.pass_name),
            *("--passes", ";".join(measured.passes)),
            *(["--pass-index", f"{measured.index}/{measured.count}"] if measured.quiet else []),
            *(["--min-measured-s", f"{measured.min_measured_s:g}"] if measured.min_measured_s else []),
            *([] if measured.progress else ["--no-progress"]),
        ]
    return [*command, "--", *program.argv()]


def run_program(program: Program, *, levels: str, out: Path | None, measured: Measured | None = None,
                force: bool = False, append: bool = False, warmup: int | None = None) -> int:  # fmt: skip
    """Run ``program`` under a profile at ``levels`` into ``out``; returns its exit code. With the ``metrics``
    level, the program is restarted under Nsight Compute (``collect.metrics``); with the ``system`` level and
    system calls asked for (``XSTACK_SYSCALLS=1``), under strace (``collect.syscalls``). ``warmup``: the
    iterations of a run that is not ``measured`` left out of per-iteration statistics (default: the first).

    An existing store at ``out`` is refused before the program starts, unless ``force`` (replace it) or
    ``append`` (record into a scratch store beside it, whose run is then added to it in one transaction)."""
    shown = out or Path("xstack-out") / f"{program.name}.duckdb"
    parsed = parse_levels(levels)
    if append:
        with Store.open(shown, read_only=False):  # fails now, and clearly, on a missing or foreign store
            pass
        written = scratch_path(shown)
    else:
        check_new(shown, overwrite=force, can_append=True)
        written = shown
    # publishing uses absolute paths: the program may change its working folder (hydra does), and the profile in
    # this process makes its own absolute; the command lines of children keep the paths as given, which a
    # program that runs its own command line again in another folder (a copy of itself) relies on
    store, target = shown.absolute(), written.absolute()

    def publish() -> None:
        if measured is not None and measured.quiet or _wrapped_child():
            return  # the process that started this one speaks for it
        if not target.exists():
            return
        ranks = _rank_stores(target, shown)
        if append:
            ids = append_store(store, target)
            print(f"xstack: profile added to {shown} as run {', '.join(map(str, ids))}{ranks}", file=sys.stderr)
        else:
            print(f"xstack: profile written to {shown}{ranks}", file=sys.stderr)

    if _in_process(parsed) and not _wrapped_child():
        watched = _watch(written)  # this process stays in the working folder the paths were given in
        if watched is not None:  # the program ran in the child, which published its store, or was salvaged here
            code, salvaged = watched
            if salvaged:
                publish()
            return code
    code = _record(program, levels, parsed, written, measured, warmup, publish)  # a child's command line: as given
    publish()
    return code


def _rank_stores(written: Path, shown: Path) -> str:
    """What the run's last line adds for the processes the program started with ``torch.multiprocessing`` that
    were profiled into stores of their own (``runs.config.processes``), named beside ``shown``; "" for none."""
    try:
        with Store.open(written) as store:
            configs = [orjson.loads(c) for (c,) in store.query("SELECT config FROM runs") if c]
    except (StoreError, OSError, ValueError):  # a store the run could not finish is told of by what wrote it
        return ""
    names = list(dict.fromkeys(Path(p).name for c in configs for e in c.get(A.CONFIG_PROCESSES) or []
                               for p in e.get("stores") or []))  # fmt: skip
    if not names:
        return ""
    shown_names = [str(shown.with_name(n)) for n in names]
    listed = ", ".join(shown_names) if len(names) <= 3 else f"{shown_names[0]} ... {shown_names[-1]}"
    return f"; the {counted(len(names), 'process', 'processes')} it started with torch.multiprocessing to {listed}"


def _in_process(parsed: tuple[str, ...]) -> bool:
    """Whether ``_record`` runs the program in this process (no level needs it restarted under a tracer)."""
    return not (("system" in parsed and syscalls_requested()) or ("metrics" in parsed and not os.environ.get(
        NCU_CHILD_ENV)) or ("io" in parsed and not os.environ.get(IO_CHILD_ENV)))  # fmt: skip


def _watch(store: Path) -> tuple[int, bool] | None:
    """Fork: the child (``None`` returned) goes on to run and record the program; this process waits for it and
    returns its exit code, and whether it completed the store that the child, killed outright (SIGKILL, a
    segfault in native code), left behind (``xstack.salvage``). Where this process cannot fork safely (no
    ``fork``, other threads running, a fork that fails), ``None`` here: the program runs in this process, unwatched."""
    if not hasattr(os, "fork") or threading.active_count() > 1 or os.environ.get(NO_WATCH_ENV):
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError:  # no process to spare (EAGAIN at a process limit, ENOMEM): run it here, unwatched
        return None
    if pid == 0:
        return None
    forked = _child.Forked(pid)
    code = _child.wait(forked)
    returncode = forked.returncode if forked.returncode is not None else code
    return code, salvage.after_child(store, code, returncode, read_after=())


NO_WATCH_ENV = "XSTACK_NO_WATCH"
"""Set (to anything): ``xstack run`` runs the program in its own process, with no process waiting to salvage
its profile if it is killed outright (a debugger attached to the command's pid, say)."""


def _wrapped_child() -> bool:
    """Whether this process is the program restarted under a tracer (ncu, the io library, strace) by an ``xstack
    run`` that reads the tracer's output once it ends."""
    return any(os.environ.get(name) for name in (IO_CHILD_ENV, NCU_CHILD_ENV, SYSCALLS_CHILD_ENV))


def _record(program: Program, levels: str, parsed: tuple[str, ...], store: Path, measured: Measured | None,
            warmup: int | None, publish: Callable[[], None]) -> int:  # fmt: skip
    """Record ``program`` into ``store`` (replaced if it exists), under a tracer where a level needs one;
    ``publish`` is called once the store is complete if the program ends with ``os._exit``, which returns to
    no caller."""
    if "system" in parsed and syscalls_requested():
        tracers = [level for level in ("metrics", "io") if level in parsed]
        if tracers:  # one tracer at a time: each would trace the other, and time its own overhead
            raise UsageError(f"system calls cannot be traced together with the {tracers[0]} level (one tracer "
                             f"at a time): record {tracers[0]} in a run or pass of its own")  # fmt: skip
        return run_traced(child_command(program, parsed, store, measured, syscalls=True, warmup=warmup), store)
    if "metrics" in parsed and not os.environ.get(NCU_CHILD_ENV):
        return run_under_ncu(child_command(program, parsed, store, measured, warmup=warmup), store,
                             clock_control=os.environ.get(CLOCK_CONTROL_ENV, "none"),
                             replay=os.environ.get(REPLAY_ENV, "kernel"))  # fmt: skip
    if "io" in parsed and not os.environ.get(IO_CHILD_ENV):
        # a pass of a leveled measurement fails whole instead: its merge would be left without the io level
        return run_preloaded(child_command(program, parsed, store, measured, warmup=warmup), store,
                             keep_unread=measured is None)  # fmt: skip
    bar: AbstractContextManager[Any] = nullcontext()
    if measured is None:
        prof = Profile(levels, store, program.name, warmup=warmup, optimizer_steps=True)
    else:
        config = pass_config(measured.warmup, measured.iters, measured.passes, measured.min_measured_s)
        steps = measured.warmup + measured.iters
        prof = Profile(levels, store, program.name, pass_name=measured.pass_name, config=config, steps=steps,
                       optimizer_steps=True)  # fmt: skip
        bar = progress = PassProgress([measured.pass_name], measured.warmup, measured.iters, enabled=measured.progress,
                                      first=measured.index, count=measured.count)  # fmt: skip
        prof.on_step = lambda done: progress.advance(0, done)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    if program.code is not None:
        prof.command = shlex.join(program.argv())  # as python -c: argv[0] is "-c", the working folder first on the path
        sys.argv = ["-c", *program.args]
        sys.path.insert(0, "")
    elif program.script is not None:
        sys.argv = [str(program.script), *program.args]
        sys.path.insert(0, str(program.script.resolve().parent))
    else:
        sys.argv = [program.module or "", *program.args]
        sys.path.insert(0, os.getcwd())
    code = 0
    try:
        with (
            prof,
            bar,
            _completed_at_os_exit(lambda code: _finish_early(code, f"os._exit({code})", prof, bar, publish)),
            _completed_at_sigterm(
                lambda: _finish_early(128 + signal.SIGTERM, "SIGTERM", prof, bar, publish), prof.recording_busy
            ),
            _unbuffered_streams() if program.unbuffered else nullcontext(),
        ):
            code = _execute(program)
    except _ProgramFailed as failed:
        code = failed.code
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        sys.stdout.flush()
    if prof.done and (measured is None or not measured.quiet):
        by = f" (ended by {prof.ended_by}: the program calls no xstack.step())" if prof.ended_by else ""
        print(f"xstack: {counted(prof.completed, 'iteration')} recorded{by}; the program was stopped there",
              file=sys.stderr)  # fmt: skip
    if prof.shortfall is not None:  # said even by a quiet pass: its measurement is not what was asked
        from xstack.collect.model import unprofiled_processes

        advice = (
            "lower --warmup or --iters, or let the program run longer"
            if prof.completed
            else f"its iterations ran in the {counted(started, 'process', 'processes')} it started with "
            "torch.multiprocessing, which this does not follow: profile them with xstack run, without --iters, "
            "one store each"
            if (started := unprofiled_processes())
            else "end each iteration with xstack.step(): the program called it nowhere, and no optimizer stepped twice"
        )
        print(f"xstack: warning: {prof.shortfall} ({advice})", file=sys.stderr)  # fmt: skip
    return code


@contextmanager
def _unbuffered_streams() -> Iterator[None]:
    """``python -u`` for the program: its standard output and error written through to their descriptors at every
    write (``PYTHONUNBUFFERED=1`` for the Python processes it starts), as they were after it."""
    saved = {name: getattr(sys, name) for name in ("stdout", "stderr")}
    env = os.environ.get("PYTHONUNBUFFERED")
    os.environ["PYTHONUNBUFFERED"] = "1"
    for name, stream in saved.items():
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):  # not a file (captured): left as it is
            continue
        stream.flush()
        raw = open(fd, "wb", buffering=0, closefd=False)  # noqa: SIM115  closed with the wrapper, not the fd
        setattr(sys, name, io.TextIOWrapper(raw, encoding=stream.encoding, errors=stream.errors, write_through=True))
    try:
        yield
    finally:
        for name, stream in saved.items():
            replaced = getattr(sys, name)
            if replaced is not stream:
                with suppress(OSError, ValueError):
                    replaced.flush()
                setattr(sys, name, stream)
        if env is None:
            os.environ.pop("PYTHONUNBUFFERED", None)
        else:
            os.environ["PYTHONUNBUFFERED"] = env


@contextmanager
def _completed_at_os_exit(finish: Callable[[int], None]) -> Iterator[None]:
    """``os._exit`` ends the process on the spot, so a profile left open there would be lost with it: while the
    program runs, ``os._exit`` in this process first calls ``finish(code)``. Forked children (DataLoader workers)
    exit as they would, and the program's ``finally`` blocks and handlers stay skipped, as ``os._exit`` skips
    them."""
    real, pid = os._exit, os.getpid()

    def _exit(status: int) -> NoReturn:
        if os.getpid() == pid:
            os._exit = real
            try:
                finish(status)
            except Exception as err:  # the process ends anyway: say why the profile may be incomplete
                print(f"xstack: the profile could not be completed at os._exit: {type(err).__name__}: {err}",
                      file=sys.stderr)  # fmt: skip
        real(status)

    os._exit = _exit
    try:
        yield
    finally:
        if os._exit is _exit:
            os._exit = real


_sigterm_handler: Any = None
"""The handler ``_completed_at_sigterm`` installed, while it is installed (a forked child puts the default back)."""


def _default_sigterm_in_child() -> None:
    if _sigterm_handler is not None and signal.getsignal(signal.SIGTERM) is _sigterm_handler:
        with suppress(ValueError):  # forked from a thread other than the main one: the handler is not its own
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


os.register_at_fork(after_in_child=_default_sigterm_in_child)


BUSY_RETRY_S, BUSY_RETRIES = 0.005, 200
"""A SIGTERM that comes while a span is being written is delivered again this much later, so many times at most."""


@contextmanager
def _completed_at_sigterm(finish: Callable[[], None], busy: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """SIGTERM (``kill``, a batch scheduler's time limit or preemption) ends a program that leaves it at its
    default action on the spot, and the profile open in it with it. While the program runs with that default, a
    SIGTERM first calls ``finish()``, then ends the process by the signal itself, as it would have ended: exit
    status 128 + 15 to a shell, none of the program's ``finally`` blocks run. More SIGTERMs while ``finish`` runs
    are ignored (SIGKILL still ends it). One that comes while a span is being written (``busy``) is delivered
    again ``BUSY_RETRY_S`` later; where the recording stays in the middle of taking its lock past
    ``BUSY_RETRIES`` of those, the profile cannot be completed safely and is not (the process that waits on this
    one keeps what the journal holds). A program that sets its own handler replaces this one."""
    global _sigterm_handler
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:  # not ours to set, or the program's own
        yield
        return
    pid, retries = os.getpid(), itertools.count()

    def handler(signum: int, frame: Any) -> None:
        if os.getpid() == pid and busy() and next(retries) < BUSY_RETRIES:  # a span is being written: come back
            threading.Timer(BUSY_RETRY_S, os.kill, (pid, signal.SIGTERM)).start()
            return
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.getpid() == pid:
            try:
                finish()
            except Exception as err:  # the process ends anyway: say why the profile may be incomplete
                print(f"xstack: the profile could not be completed at SIGTERM: {type(err).__name__}: {err}",
                      file=sys.stderr)  # fmt: skip
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)
    _sigterm_handler = handler
    try:
        yield
    finally:
        _sigterm_handler = None
        if signal.getsignal(signal.SIGTERM) is handler:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _finish_early(code: int, reason: str, prof: Profile, bar: AbstractContextManager[Any],
                  publish: Callable[[], None]) -> None:  # fmt: skip
    """Complete ``prof`` as the program ends without returning: ``os._exit(code)`` or a signal (``cut_short``
    unless ``code`` is 0, ``reason`` recorded as ``config.error``), then ``publish`` it."""
    if prof.recording_busy():
        raise RuntimeError("the recorder was interrupted in the middle of an update")
    failed = _ProgramFailed(code, reason) if code else None
    sys.stdout.flush()
    bar.__exit__(None, None, None)
    prof.__exit__(type(failed) if failed else None, failed, None)
    publish()
    sys.stderr.flush()


class _ProgramFailed(Exception):
    """Carries a failed program's exit code out of the profile (which then records ``cut_short``), and what
    ended it (``reason``, recorded as ``config.error``)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code)
        self.code = code
        self.reason = reason


def _quiet_pass_complete(args: threading.ExceptHookArgs) -> None:
    """``threading.excepthook`` that lets a thread end silently where its ``step()`` ended the pass."""
    if not issubclass(args.exc_type, PassComplete):
        _THREAD_HOOK(args)


_THREAD_HOOK = threading.excepthook


def _execute(program: Program) -> int:
    threading.excepthook = _quiet_pass_complete
    try:
        with running_program():
            if program.code is not None:
                _run_code(program.code)
            elif program.script is not None:
                runpy.run_path(str(program.script.resolve()), run_name="__main__")  # __file__ absolute, as python's
            else:
                runpy.run_module(program.module or "", run_name="__main__", alter_sys=True)
    except PassComplete:
        return 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
        if code:
            raise _ProgramFailed(code, f"exit code {code}") from None
        return 0
    except KeyboardInterrupt:
        if stopped_from() is not None:  # the pass ended on another thread, which interrupted this one
            return 0
        print("KeyboardInterrupt", file=sys.stderr)
        raise _ProgramFailed(130, "KeyboardInterrupt") from None
    except BaseException as exc:
        _print_program_traceback(exc)
        raise _ProgramFailed(1, describe_failure(type(exc), exc) or "") from None
    return 0


def _run_code(code: str) -> None:
    """Run ``code`` as ``python -c`` does: compiled as ``<string>``, in a fresh ``__main__`` module (this
    process's own put back after it, as ``runpy`` does for a script)."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _print_program_traceback(exc: BaseException) -> None:
    """The traceback as ``python script.py`` prints it: the program's frames, without the runner's and
    runpy's above them; a program that does not compile, as python shows it, its place and no frame."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__)
                              or tb.tb_frame.f_code.co_filename.startswith("<frozen ")):  # fmt: skip
        tb = tb.tb_next
    traceback.print_exception(
        type(exc), exc, tb if tb is not None or isinstance(exc, SyntaxError) else exc.__traceback__
    )


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # as Python does for sys.exit("message")
    return 1
