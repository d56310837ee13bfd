"""The io level's interposition library (``collect/_io/*.c``): finding it, preloading it into a program's
process tree, and attaching it at run time to a process that was not preloaded.

Preload mode: ``preload_env`` gives the environment that makes every process of the tree (workers,
subprocesses, exec'd children that keep the environment) load the library and record into
``$XSTACK_IO_DIR``. Attach mode: ``attach`` loads the library with ctypes and redirects the calls of every
loaded object to it (GOT patching, see ``_io/attach.c``) until ``detach``; forked children inherit it,
programs started by exec are not covered (each leaves a not-covered note). The records are read by
``collect._io_records.read_trace``.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from xstack.errors import UsageError, XstackError

DIR_ENV = "XSTACK_IO_DIR"
"""Directory the library writes its record files into (absolute); unset or empty: the library records nothing."""
EXCLUDE_ENV = "XSTACK_IO_EXCLUDE"
"""``:``-separated absolute path prefixes whose files are not recorded (the profile's own store)."""
MAX_RECORDS_ENV = "XSTACK_IO_MAX_RECORDS"
"""Most calls one process records (default 8,000,000); later calls are counted as dropped, per operation."""
LIBRARY_NAME = "libxstack_io.so"

_MODE_PRELOAD = 1
_library: ctypes.CDLL | None = None


@functools.cache
def library_path() -> Path | None:
    """The built library, or None when the package was installed without building it. Looked for once: the
    level checks it before it starts, and the file system calls of a second look would be recorded as the
    program's."""
    path = Path(__file__).resolve().parent / "_io" / LIBRARY_NAME
    return path if path.is_file() else None


def unavailable_reason() -> str | None:
    """Why the library cannot be used here, or None; never raises."""
    if not sys.platform.startswith("linux"):
        return f"the io level's interposition library needs Linux with glibc (this is {sys.platform})"
    path = library_path()
    if path is None:
        expected = Path(__file__).resolve().parent / "_io" / LIBRARY_NAME
        return (
            f"the io level's library {expected} was not built (no C compiler when xstack was installed): "
            "install gcc (apt-get install gcc) and reinstall xstack (pip install -e . in a checkout)"
        )
    try:
        _load(path)
    except OSError as exc:
        return f"cannot load the io level's library {path}: {exc}"
    return None


def preload_env(
    directory: Path,
    exclude: Sequence[str] = (),
    max_records: int | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A copy of ``base`` (default ``os.environ``) that preloads the library, recording into ``directory``.

    The library goes first in ``LD_PRELOAD`` (kept values follow); ``directory`` is created. Raises
    ``XstackError`` when the library is unavailable, ``UsageError`` for a path that contains ``:``.
    """
    path = library_path()
    if path is None:
        raise XstackError(unavailable_reason() or "the io level's library is missing")
    env = dict(os.environ if base is None else base)
    kept = [p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p and Path(p).name != LIBRARY_NAME]
    env["LD_PRELOAD"] = ":".join([str(path), *kept])
    directory.mkdir(parents=True, exist_ok=True)
    env[DIR_ENV] = _no_colon(str(directory.resolve()))
    if exclude:
        env[EXCLUDE_ENV] = _exclude_list(exclude)
    else:
        env.pop(EXCLUDE_ENV, None)
    if max_records is not None:
        env[MAX_RECORDS_ENV] = str(int(max_records))
    return env


def preloaded() -> bool:
    """True when this process was started with the library preloaded and records to ``$XSTACK_IO_DIR``."""
    if not os.environ.get(DIR_ENV) or LIBRARY_NAME not in os.environ.get("LD_PRELOAD", ""):
        return False
    library = _loaded()
    return library is not None and int(library.xstack_io_mode()) == _MODE_PRELOAD


def flush() -> None:
    """Write this process's buffered records to its file (before reading them); no-op when not loaded."""
    library = _loaded()
    if library is not None:
        library.xstack_io_flush()


def attach(directory: Path, exclude: Sequence[str] = (), max_records: int | None = None) -> None:
    """Start recording this process's calls into ``directory`` without LD_PRELOAD, until ``detach``.

    Raises ``XstackError`` with the reason when it cannot (library missing, preloaded already, platform).
    """
    reason = unavailable_reason()
    if reason is not None:
        raise XstackError(reason)
    if preloaded():
        raise XstackError(f"the io library is preloaded in this process already (records go to ${DIR_ENV})")
    library = _load(library_path())
    directory.mkdir(parents=True, exist_ok=True)
    patterns = _exclude_list(exclude)
    limit = max_records if max_records is not None else int(os.environ.get(MAX_RECORDS_ENV) or 0)
    rc = library.xstack_io_attach(os.fsencode(directory.resolve()), os.fsencode(patterns), limit)
    if rc != 0:
        raise XstackError(f"cannot attach the io library: {library.xstack_io_error().decode(errors='replace')}")


def detach() -> None:
    """Stop attach-mode recording and restore every redirected call; idempotent."""
    library = _loaded()
    if library is not None:
        library.xstack_io_detach()


def _exclude_list(prefixes: Sequence[str]) -> str:
    """The ``:``-separated prefixes, each as given (made absolute) and with symlinks resolved: the library
    compares the paths a program opens as written, and the kernel's resolved ones for descriptors it
    discovers. A trailing ``/`` is kept (only what is under the directory, not its namesakes)."""
    forms = (
        form + ("/" if str(p).endswith("/") else "")
        for p in prefixes
        for form in (os.path.abspath(p), os.path.realpath(p))
    )
    return ":".join(_no_colon(p) for p in dict.fromkeys(forms))


def _no_colon(path: str) -> str:
    if ":" in path:
        raise UsageError(f"{path}: a path with ':' cannot be passed to the io library (its lists are ':'-separated)")
    return path


def _load(path: Path | None) -> ctypes.CDLL:
    """Load the library (RTLD_LOCAL: its wrappers must not become the process's symbols)."""
    global _library
    if _library is None:
        if path is None:
            raise OSError("library not built")
        _library = _declare(ctypes.CDLL(str(path), mode=os.RTLD_LOCAL))
    return _library


def _loaded() -> ctypes.CDLL | None:
    """The library if this process has it loaded already (preloaded or attached), without loading it."""
    path = library_path()
    if _library is not None or path is None:
        return _library
    try:
        return _load_existing(path)
    except OSError:
        return None


def _load_existing(path: Path) -> ctypes.CDLL:
    global _library
    _library = _declare(ctypes.CDLL(str(path), mode=os.RTLD_NOLOAD | os.RTLD_LOCAL))
    return _library


def _declare(library: ctypes.CDLL) -> ctypes.CDLL:
    library.xstack_io_mode.restype = ctypes.c_int
    library.xstack_io_mode.argtypes = []
    library.xstack_io_flush.restype = None
    library.xstack_io_flush.argtypes = []
    library.xstack_io_attach.restype = ctypes.c_int
    library.xstack_io_attach.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64]
    library.xstack_io_detach.restype = None
    library.xstack_io_detach.argtypes = []
    library.xstack_io_patched.restype = ctypes.c_int
    library.xstack_io_patched.argtypes = []
    library.xstack_io_error.restype = ctypes.c_char_p
    library.xstack_io_error.argtypes = []
    return library


__all__ = [
    "DIR_ENV",
    "EXCLUDE_ENV",
    "LIBRARY_NAME",
    "MAX_RECORDS_ENV",
    "attach",
    "detach",
    "flush",
    "library_path",
    "preload_env",
    "preloaded",
    "unavailable_reason",
]
