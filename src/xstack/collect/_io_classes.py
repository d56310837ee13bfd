"""The ``io.path_class`` of each file the io level recorded: what its path's text says
(``trace.io_paths.path_class``), and what the calls on it say, which the text cannot:

- a path that a call found to be a directory (opened to list it, or stat'ed) is ``directory``, wherever it is;
- a file that the program's standard output or error went to (``xstack run ... > out.txt``) is ``stream``, as the
  terminal it stands for would be, so that redirecting the output does not turn it into data: calls on
  descriptor 1 or 2 that the process did not open itself (it inherited them from the shell, or a worker from
  its parent) name that file. A descriptor 1 or 2 that the process opened (after closing its standard output)
  is an ordinary file; one that it ``dup2``'d onto them is still its output.
"""

from __future__ import annotations

from collections.abc import Iterable

from xstack.collect._io_counters import OPENS, STREAM_PATHS, Op
from xstack.trace.io_paths import DIRECTORY, STREAM, UNKNOWN, path_class

_STANDARD_OUTPUT = (1, 2)
_OPENED = OPENS - {"dup"}
"""Calls that open a new file on the descriptor they return (``dup`` makes it another name of an open one)."""


class PathClasses:
    """The class of every file of a recorded trace; built from all its calls, in time order."""

    def __init__(self, ops: Iterable[Op]) -> None:
        self.directories: set[str] = set()
        self.outputs: set[str] = set()
        """Files that standard output or error went to."""
        opened: set[tuple[int, int]] = set()  # (pid, descriptor 1 or 2) the process opened itself
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

    def of(self, path: str | None, fd_kind: str) -> str:
        """The class of ``path`` (None or a ``<...>`` name: a descriptor with no path, of kind ``fd_kind``)."""
        if not path or path.startswith("<"):
            return STREAM if fd_kind in STREAM_PATHS else UNKNOWN
        if path in self.outputs:
            return STREAM
        if path in self.directories or fd_kind == "dir":
            return DIRECTORY
        return path_class(path)
