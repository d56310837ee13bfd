"""The ``io.path_class`` of each file the io level recorded: what its path's text says
(``trace.io_paths.path_class``), and what the calls on it say, which the text cannot:

- a path that a call found to be a directory (opened to list it, or stat'ed) is ``directory``, wherever it is;
- a file that the program's standard output or error went to (``xstack run ... > out.txt``) is ``stream``, as the
  terminal it stands for would be, so that redirecting the output does not turn it into data: calls on
  descriptor 1 or 2 that the process did not open itself (it inherited them from the shell, or a worker from
  its parent) name that file. A descriptor 1 or 2 that the process opened (after closing its standard output)
  is an ordinary file; one that it ``dup2``'d onto them is still its output;
- a file that the standard library's ``tempfile`` made to probe a temporary folder (it picks the folder the first
  time a temporary file or folder is asked for, as multiprocessing does in each worker it spawns) is ``python``:
  an eight-character random name in a temporary folder, opened once, ``b"blat"`` written, closed, nothing else.

The processes' command lines tell the helpers of ``multiprocessing`` (``process_roles``, with the predicates the
system level tells them by, ``_process_roles``): they are processes of the program, not its workers.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable
from pathlib import PurePosixPath

from xstack.collect._io_counters import OPENS, STREAM_PATHS, WRITES, Op
from xstack.collect._io_records import IoProcess
from xstack.collect._process_roles import helper_role, spawned_worker
from xstack.trace.io_paths import DIRECTORY, PYTHON, STREAM, UNKNOWN, path_class

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

    def __init__(self, ops: Iterable[Op]) -> None:
        self.directories: set[str] = set()
        self.outputs: set[str] = set()
        """Files that standard output or error went to."""
        self.probes: set[str] = set()
        """Files ``tempfile`` made to probe a temporary folder."""
        opened: set[tuple[int, int]] = set()  # (pid, descriptor 1 or 2) the process opened itself
        calls: dict[str, list[Op]] = {}  # the calls on paths named as tempfile's probes are
        for op in ops:
            path = op.path
            if not path or op.errno:
                continue
            if op.fd_kind == "dir":
                self.directories.add(path)
            if op.fd in _STANDARD_OUTPUT:
                if op.op in _OPENED:
                    opened.add((op.pid, op.fd))
                elif (op.pid, op.fd) not in opened:
                    self.outputs.add(path)
            if _probe_name(path):
                calls.setdefault(path, []).append(op)
        self.probes = {path for path, on in calls.items() if _probe_calls(on)}

    def of(self, path: str | None, fd_kind: str) -> str:
        """The class of ``path`` (None or a ``<...>`` name: a descriptor with no path, of kind ``fd_kind``)."""
        if not path or path.startswith("<"):
            return STREAM if fd_kind in STREAM_PATHS else UNKNOWN
        if path in self.outputs:
            return STREAM
        if path in self.directories or fd_kind == "dir":
            return DIRECTORY
        if path in self.probes:
            return PYTHON
        return path_class(path)


def _probe_name(path: str) -> bool:
    p = PurePosixPath(path)
    return str(p.parent) in _TEMP_DIRS and _PROBE_NAME.fullmatch(p.name) is not None


def _probe_calls(ops: list[Op]) -> bool:
    """One process opened it once, wrote ``b"blat"`` and closed it, and no call did more than look at it."""
    opens = sum(op.op in _OPENED for op in ops)
    written = sum(max(op.bytes, 0) for op in ops if op.op in WRITES)
    return (
        len({op.pid for op in ops}) == 1 and opens == 1 and written == _PROBE_BYTES
        and all(op.op in _PROBE_CALLS for op in ops)
    )  # fmt: skip


def process_roles(processes: Iterable[IoProcess]) -> dict[int, str]:
    """The processes that are not the program's workers (``A.IO_PROCESS_ROLE``), by pid: the helpers of
    ``multiprocessing``, started with a helper's code (a process forked from one, a worker the forkserver forked,
    inherits its command line, and is not one); and ``subprocess``, a program the profiled one (or one of its
    workers) started by exec (``subprocess.run``, ``os.system``: ``cat``, a shell, another Python), other than a
    worker ``multiprocessing`` spawned, with the processes forked from it. The process ``xstack run`` started, the
    root of the tree, is none of them."""
    processes = list(processes)
    recorded = {p.pid for p in processes}
    roles: dict[int, str] = {}
    for p in sorted(processes, key=lambda p: p.start_ns):  # a fork child after the image it was forked from
        if p.forked:
            role = "subprocess" if roles.get(p.ppid) == "subprocess" else None
        else:
            role = helper_role(p.argv) or _exec_role(p, recorded)
        if role and roles.get(p.pid) in (None, "subprocess"):
            roles[p.pid] = role
    return roles


def _exec_role(p: IoProcess, recorded: set[int]) -> str | None:
    """``subprocess`` for an exec'd image whose parent was recorded (so not the tree's root) and that is not a
    worker ``multiprocessing`` spawned."""
    return "subprocess" if p.ppid in recorded and not spawned_worker(p.argv) else None
