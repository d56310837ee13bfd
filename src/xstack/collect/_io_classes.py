"""The ``io.path_class`` of each file the io level recorded: what its path's text says
(``trace.io_paths.path_class``), and what the calls on it say, which the text cannot:

- a path that a call found to be a directory (opened to list it, or stat'ed), or that holds another path of the
  trace, is ``directory``, wherever it is;
- a file that a compiler, assembler or linker opened (torch.compile's C++ builds: the source it writes, the
  preprocessed header, the objects) is ``python`` where its path would make it data: the program's build, not its
  data;
- a file that the program's standard output or error went to (``xstack run ... > out.txt``) is ``stream``, as the
  terminal it stands for would be, so that redirecting the output does not turn it into data: calls on
  descriptor 1 or 2 that the process did not open itself (it inherited them from the shell, or a worker from
  its parent) name that file. A descriptor 1 or 2 that the process opened (after closing its standard output)
  is an ordinary file; one that it ``dup2``'d onto them is still its output;
- a file that the standard library's ``tempfile`` made to probe a temporary folder (it picks the folder the first
  time a temporary file or folder is asked for, as multiprocessing does in each worker it spawns) is ``python``:
  an eight-character random name in a temporary folder, opened once, ``b"blat"`` written, closed, nothing else.

The processes' parents and command lines tell those that are not the program's workers (``process_roles``): the
helpers of ``multiprocessing``, and the programs started by exec with every process below them.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable
from pathlib import PurePosixPath

from xstack.collect import _process_roles
from xstack.collect._io_counters import OPENS, STREAM_PATHS, WRITES, Op
from xstack.collect._io_records import IoProcess
from xstack.trace.io_paths import DATA, DIRECTORY, PYTHON, STREAM, UNKNOWN, path_class

_STANDARD_OUTPUT = (1, 2)
_OPENED = OPENS - {"dup"}
"""Calls that open a new file on the descriptor they return (``dup`` makes it another name of an open one)."""

_TEMP_DIRS = frozenset({"/tmp", "/var/tmp", "/usr/tmp", tempfile.gettempdir()})
"""The folders ``tempfile`` tries (``$TMPDIR`` as this process sees it included)."""
_PROBE_NAME = re.compile(r"[a-z0-9_]{8}")
"""The name ``tempfile`` gives its probe (eight characters of ``_RandomNameSequence``)."""
_PROBE_BYTES = len(b"blat")
"""What ``tempfile._get_default_tempdir`` writes into its probe before it closes and removes it."""
_PROBE_CALLS = frozenset({"open", "openat", "fstat", "write", "close"})


class PathClasses:
    """The class of every file of a recorded trace; built from all its calls, in time order."""

    def __init__(self, ops: Iterable[Op], builders: Iterable[int] = ()) -> None:
        """``builders``: the processes that run a compiler, assembler or linker (``build_processes``)."""
        self.directories: set[str] = set()
        self.built: set[str] = set()
        """Files a compiler, assembler or linker opened: the program's build (torch.compile's C++), not its data."""
        building = frozenset(builders)
        self.outputs: set[str] = set()
        """Files that standard output or error went to."""
        self.probes: set[str] = set()
        """Files ``tempfile`` made to probe a temporary folder."""
        opened: set[tuple[int, int]] = set()  # (pid, descriptor 1 or 2) the process opened itself
        calls: dict[str, list[Op]] = {}  # the calls on paths named as tempfile's probes are
        named: dict[str, bool] = {}  # whether a path is named as a probe is: asked once per path, not per call
        for op in ops:
            path = op.path
            if not path or op.errno:
                continue
            if op.fd_kind == "dir":
                self.directories.add(path)
            if op.pid in building:
                self.built.add(path)
            if op.fd in _STANDARD_OUTPUT:
                if op.op in _OPENED:
                    opened.add((op.pid, op.fd))
                elif (op.pid, op.fd) not in opened:
                    self.outputs.add(path)
            probe = named.get(path)
            if probe is None:
                probe = named[path] = probe_name(path)
            if probe:
                calls.setdefault(path, []).append(op)
        self.probes = {path for path, on in calls.items() if _probe_calls(on)}
        self.directories |= _folders(named)
        self._known: dict[tuple[str | None, str], str] = {}

    def of(self, path: str | None, fd_kind: str) -> str:
        """The class of ``path`` (None or a ``<...>`` name: a descriptor with no path, of kind ``fd_kind``)."""
        key = (path, fd_kind)
        known = self._known.get(key)
        if known is None:
            known = self._known[key] = self._of(path, fd_kind)
        return known

    def _of(self, path: str | None, fd_kind: str) -> str:
        if not path or path.startswith("<"):
            return STREAM if fd_kind in STREAM_PATHS else UNKNOWN
        if path in self.outputs:
            return STREAM
        if path in self.directories or fd_kind == "dir":
            return DIRECTORY
        if path in self.probes:
            return PYTHON
        cls = path_class(path)
        return PYTHON if cls == DATA and path in self.built else cls


def _folders(paths: Iterable[str]) -> set[str]:
    """The paths that hold another of ``paths``: folders, whatever their opens said (``os.open(folder)`` with no
    ``O_DIRECTORY``, its descriptor then the ``dir_fd`` of the opens of its files, as ``os.fwalk`` does)."""
    held: set[str] = set()
    for path in paths:
        while (cut := path.rfind("/")) > 0 and (path := path[:cut]) not in held:
            held.add(path)
    return {p for p in paths if p in held}


def probe_name(path: str) -> bool:
    """``path`` is named as ``tempfile``'s probe of a temporary folder is (its calls then tell whether it is one):
    ``os.path.join`` of the folder's absolute path and the name, as ``tempfile`` makes it (asked of every path a
    run recorded: no ``PurePosixPath``, some 7 us a path)."""
    folder, _, name = path.rpartition("/")
    return _PROBE_NAME.fullmatch(name) is not None and folder in _TEMP_DIRS


def _probe_calls(ops: list[Op]) -> bool:
    """One process opened it once, wrote ``b"blat"`` and closed it, and no call did more than look at it."""
    opens = sum(op.op in _OPENED for op in ops)
    written = sum(max(op.bytes, 0) for op in ops if op.op in WRITES)
    return (
        len({op.pid for op in ops}) == 1 and opens == 1 and written == _PROBE_BYTES
        and all(op.op in _PROBE_CALLS for op in ops)
    )  # fmt: skip


_BUILDER = re.compile(
    r"(?:[\w.-]+-)?(?:gcc|g\+\+|cc|c\+\+|cpp|clang|clang\+\+|cc1|cc1plus|collect2|ld|ld\.\w+|as|lto1|lto-wrapper"
    r"|nvcc|ptxas|cicc|fatbinary|nvlink|cudafe\+\+)(?:-\d+(?:\.\d+)*)?"
)
"""The name of a compiler, assembler or linker's executable (``x86_64-linux-gnu-gcc-12``, ``cc1plus``, ``ptxas``)."""


def is_builder(name: str) -> bool:
    """``name`` (a program's file name) is a compiler, assembler or linker's (``_BUILDER``)."""
    return _BUILDER.fullmatch(name) is not None


def build_processes(processes: Iterable[IoProcess]) -> set[int]:
    """The processes whose recorded image runs a compiler, assembler or linker: what torch.compile's C++ backend
    (and a CUDA extension's build) runs; the files they open are the build's."""
    return {p.pid for p in processes if is_builder(PurePosixPath(p.exe).name)}


def process_roles(processes: Iterable[IoProcess]) -> dict[int, str]:
    """The processes that are not the program's workers (``A.IO_PROCESS_ROLE``), by pid, by the rule the system
    level tells them by (``_process_roles.process_roles``): the helpers of ``multiprocessing``; ``subprocess``, a
    program the profiled one (or one of its workers) started by exec, other than a helper or a worker
    ``multiprocessing`` spawned, and every process below one (its forks, its spawned workers, its own helpers).

    A process may record several images (``subprocess.run`` forks, then execs): its parent is that of its first,
    and what it runs that of its first exec'd image (a helper's code, a spawned worker's argument), or, where it
    never exec'd, the command line it inherited. The process that started first, the root of the tree (the
    process ``xstack run`` started), is none of them."""
    images = sorted(processes, key=lambda p: (p.start_ns, p.pid))
    if not images:
        return {}
    first: dict[int, IoProcess] = {}
    execd: dict[int, IoProcess] = {}
    for p in images:
        first.setdefault(p.pid, p)
        if not p.forked:
            execd.setdefault(p.pid, p)
    root = images[0].pid
    records = [(pid, p.ppid, execd.get(pid, p).argv, pid not in execd) for pid, p in first.items() if pid != root]
    root_argv = [p for p in images if p.pid == root][-1].argv  # what the root's forks inherit
    return _process_roles.process_roles(records, root_argv)
