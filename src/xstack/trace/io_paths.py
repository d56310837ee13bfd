"""Where a file of the ``io`` level lives: the ``io.path_class`` of a path, shared by the live io level and the
Darshan importer so that both sort files the same way.

Notes: the class is read from the path's text alone (no ``stat``: an imported log's files are on another
machine), first match wins: standard streams and pipes, then the profiler's own files, then Python's (its
installation, installed packages, virtual environments, and Python source and bytecode wherever they are, the
program's own modules included), then the files processes share (shared memory segments and semaphores by the
names their libraries give them, multiprocessing's temporary folder), then the system's, so
``/usr/lib/python3.11/os.py`` is ``python``, ``/dev/shm/sem.x`` ``ipc`` and ``/dev/shm/train/x.npy`` ``data``
(staged in memory by the program). What only the calls can tell, that a path is a directory, that the program's
output was redirected to it, or that it was the standard library's probe of a temporary folder, the live io
level adds (``collect._io_classes``).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Final

import orjson

DATA: Final = "data"
DIRECTORY: Final = "directory"
PYTHON: Final = "python"
PROFILER: Final = "profiler"
SYSTEM: Final = "system"
STREAM: Final = "stream"
IPC: Final = "ipc"
UNKNOWN: Final = "unknown"

CLASSES: Final = {
    DATA: "the program's own files: everything the other classes leave",
    DIRECTORY: "directories, opened for listing or stat'ed, or holding another path of the trace (known from the "
    "calls: the io level only)",
    PYTHON: "the interpreter (and the files it looks for as it starts: pythonXY.zip, ._pth), its library and C "
    "headers, installed packages and their metadata (*.dist-info, *.egg-info, an editable install's too), virtual "
    "environments (pyvenv.cfg), Python source and bytecode anywhere (.py, .pyc, __pycache__, extension modules), "
    "the program's script included, the code torch.compile and Triton build and cache (torchinductor_USER, "
    "~/.triton/cache), and every file that a compiler, assembler or linker the program runs opens (the live io "
    "level: torch.compile's C++ builds)",
    PROFILER: "xstack's own files (its package, its io library, its package metadata)",
    SYSTEM: "the operating system's: /usr, /lib, /etc, /proc, /sys, /dev, ...",
    STREAM: "standard streams, pipes, sockets and terminals, and a file the program's standard output or error "
    "was redirected to (known from the calls: the io level only)",
    IPC: "shared memory and semaphores (in /dev/shm: PyTorch's torch_* tensors that workers hand over, sem.*, "
    "psm_*, and the segments OpenMP, joblib, NCCL, CUDA, Ray and MPI name there; other files there are data, "
    "staged on a fast tier), and the temporary files and sockets of Python's multiprocessing (its pymp-* folder)",
    UNKNOWN: "a name that says nothing of where the file is (relative, <fd 7>, anonymised by Darshan)",
}
"""Every ``io.path_class``, with what it holds."""

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

PROFILER_ROOTS: Final = tuple(dict.fromkeys((str(Path(__file__).parent.parent.absolute()),
                                             str(Path(__file__).parent.parent.resolve()))))  # fmt: skip
"""The folder of the xstack package that classifies (as imported, and with links resolved): a path inside it is
``profiler``."""

_STREAM_NAMES: Final = frozenset({"<stdin>", "<stdout>", "<stderr>", "<pipe>", "<socket>", "<tty>"})
_STREAM = re.compile(r"^(?:(?:pipe|socket|anon_inode):.*|/dev/(?:pts/.*|tty.*|std(?:in|out|err)|console))$")
_SHM = re.compile(r"^/(?:dev|run)/shm(?:/|$)")
_IPC = re.compile(
    r"^/(?:dev|run)/shm(?:/?$|/(?:"  # the folder itself, and the names that libraries give their segments there:
    r"torch_|sem\.|psm_|pym-"  # PyTorch's shared tensors, semaphores, multiprocessing's shared_memory and heap
    r"|__KMP_REGISTERED_LIB_|joblib_memmapping_folder_|loky-"  # OpenMP's registration, joblib's and loky's
    r"|nccl-|cuda\.shm\.|plasma|vader_segment\.|mpich_shar_tmp"  # NCCL, CUDA IPC, Ray, Open MPI, MPICH
    r"))|^/memfd:|/pymp-[a-z0-9_]{8}(?:/|$)"
)
_PROFILER = re.compile(r"/xstack(?:-[^/]*)?\.(?:dist|egg)-info(?:/|$)")
_PYTHON = re.compile(
    r"/(?:site-packages|dist-packages|__pycache__)(?:/|$)"  # installed packages, bytecode caches
    r"|/lib(?:32|64)?/python\d+(?:\.\d+)?t?(?:/|$)"  # the standard library
    r"|\.(?:py|pyc|pyo|pyi|pyw|pyd|pth)$|\.(?:cpython-[^/]*|abi3)\.so$"  # source, bytecode, extension modules
    r"|/pyvenv\.cfg$|/bin/python\d*(?:\.\d+)?t?$|/libpython\d[^/]*$"  # virtual environments, the interpreter
    r"|\.(?:dist|egg)-info(?:/|$)|\.egg-link$"  # package metadata, wherever it is (an editable install's too)
    r"|/python\d+\.zip$|/pybuilddir\.txt$|\._pth$|/Modules/Setup\.local$"  # what the interpreter looks for as it starts
    r"|/include/python\d+(?:\.\d+)?t?(?:/|$)"  # its C headers (torch.compile's C++ builds include them)
    r"|/torchinductor_[^/]+(?:/|$)|/\.triton/(?:cache|dump)(?:/|$)"  # torch.compile's and Triton's caches
    r"|/\.cache/torch/(?:inductor|kernels|triton)(?:/|$)"
)


@functools.lru_cache(maxsize=1 << 16)
def path_class(path: str) -> str:
    """The ``io.path_class`` of ``path`` from its text (``CLASSES`` says what each holds): ``stream`` (standard
    streams, pipes, sockets, terminals), ``unknown`` (empty, relative or anonymised names, such as ``<fd 7>``
    or the hashes of an anonymised Darshan log, that say nothing of where the file is), ``profiler`` (inside
    ``PROFILER_ROOTS``, or its package metadata), ``python`` (inside ``site-packages``, ``dist-packages``,
    ``__pycache__`` or a ``lib/pythonX.Y`` folder, a ``.py``/``.pyc``/extension module anywhere, package metadata
    (``*.dist-info``, ``*.egg-info``) anywhere, ``pyvenv.cfg``, the interpreter), ``ipc`` (the segments that
    PyTorch, multiprocessing, OpenMP, joblib, NCCL, CUDA, Ray and MPI name in ``/dev/shm`` or ``/run/shm``, those
    folders themselves, memfd files, multiprocessing's ``pymp-*`` folders), ``system`` (under one of
    ``SYSTEM_ROOTS``) or ``data`` (any other absolute path: a file of another name in ``/dev/shm`` is one that the
    program staged there, read as a fast tier)."""
    if path.lower() in _STREAM_NAMES or _STREAM.match(path):
        return STREAM
    if not path.startswith("/"):
        return UNKNOWN
    if _inside(path, PROFILER_ROOTS) or _PROFILER.search(path):
        return PROFILER
    if _PYTHON.search(path):
        return PYTHON
    if _IPC.search(path):
        return IPC
    if _inside(path, SYSTEM_ROOTS) and not _SHM.match(path):  # files staged in /dev/shm are the program's data
        return SYSTEM
    return DATA


def path_text(name: bytes | str) -> str:
    """A file's name as the store keeps it: its bytes read as UTF-8, those that are not written as ``\\xe9``
    (``/data/caf\\xe9.bin`` for Latin-1's ``café.bin``). A name is bytes to the kernel, and Python's own decoding
    (``os.fsdecode``) keeps the others as lone surrogates, which no JSON, and so no span's attributes, can hold;
    a ``str`` is taken as ``os.fsdecode`` made it."""
    if isinstance(name, str):
        if name.isascii():
            return name
        name = name.encode("utf-8", "surrogateescape")
    return name.decode("utf-8", "backslashreplace")


def is_utf8(path: Path) -> bool:
    """Whether ``path``, made absolute, is UTF-8: what DuckDB and PyDarshan open (no lone surrogates in it)."""
    try:
        str(path.absolute()).encode()
    except UnicodeEncodeError:
        return False
    return True


def json_dumps(value: Any, option: int | None = None) -> bytes:
    """``value`` as JSON (``orjson``, with its ``option`` flags, what it cannot write as text), with the strings
    that hold a name Python decoded from bytes that are not UTF-8 (``os.fsdecode``'s lone surrogates, which JSON
    cannot hold) written as ``path_text`` writes them: a command line, a file's path in a run's config, a span's
    name the program gave."""
    try:
        return orjson.dumps(value, option=option, default=str)
    except TypeError:  # (orjson's JSONEncodeError): copied with such strings escaped, only then
        return orjson.dumps(_escaped(value), option=option, default=str)


def _escaped(value: Any) -> Any:
    if isinstance(value, str):
        return path_text(value)
    if isinstance(value, dict):
        return {_escaped(k): _escaped(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_escaped(v) for v in value]
    return value


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)
