"""Where a file of the ``io`` level lives: the ``io.path_class`` of a path, shared by the live io level and the
Darshan importer so that both sort files the same way.

Notes: the class is read from the path's text alone (no ``stat``: an imported log's files are on another
machine). Python's own files are recognised before system ones, so ``/usr/lib/python3.11/os.py`` is ``python``.
"""

from __future__ import annotations

import functools
import re
from typing import Final

DATA: Final = "data"
PYTHON: Final = "python"
SYSTEM: Final = "system"
STREAM: Final = "stream"
UNKNOWN: Final = "unknown"

SYSTEM_ROOTS: Final = (
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/bin",
    "/sbin",
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/boot",
    "/run",
    "/var/lib",
    "/var/cache",
    "/var/run",
    "/snap",
    "/nix/store",
)
"""Folders of the operating system and its packages: a path inside one of them is ``system``."""

_STREAM_NAMES: Final = frozenset({"<stdin>", "<stdout>", "<stderr>", "<pipe>", "<socket>", "<tty>"})
_STREAM = re.compile(r"^(?:(?:pipe|socket|anon_inode):.*|/dev/(?:pts/.*|tty.*|std(?:in|out|err)|console))$")
_PYTHON = re.compile(r"/(?:site-packages|dist-packages)(?:/|$)|/lib(?:32|64)?/python\d+(?:\.\d+)?t?(?:/|$)")


@functools.lru_cache(maxsize=1 << 16)
def path_class(path: str) -> str:
    """The ``io.path_class`` of ``path``: ``stream`` (standard streams, pipes, sockets, terminals), ``python``
    (inside ``site-packages``, ``dist-packages`` or a ``lib/pythonX.Y`` folder), ``system`` (under one of
    ``SYSTEM_ROOTS``), ``data`` (any other absolute path) or ``unknown`` (empty, relative or anonymised names,
    such as ``<fd 7>`` or the hashes of an anonymised Darshan log, that say nothing of where the file is)."""
    if path.lower() in _STREAM_NAMES or _STREAM.match(path):
        return STREAM
    if not path.startswith("/"):
        return UNKNOWN
    if _PYTHON.search(path):
        return PYTHON
    if any(path == root or path.startswith(root + "/") for root in SYSTEM_ROOTS):
        return SYSTEM
    return DATA
