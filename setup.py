"""Build of the native libraries; the package's metadata lives in pyproject.toml.

- the io level's interposition library, preloaded into profiled programs (or dlopen'ed by ctypes):
  ``xstack/collect/_io/libxstack_io.so``;
- the system level's sampler thread, loaded by ctypes: ``xstack/collect/_sampler/libxstack_sampler.so``.

Both are plain shared objects, never imported as Python modules, so they are built without the interpreter's
ABI tag in their names. The builds are optional: without a C compiler the package still installs,
``xstack.collect._io_native.unavailable_reason()`` says how to get the io library, and the system level falls
back to its Python sampler.
"""

from __future__ import annotations

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

LIBRARY = "xstack.collect._io.libxstack_io"
SOURCE_DIR = "src/xstack/collect/_io"
SAMPLER = "xstack.collect._sampler.libxstack_sampler"
SOURCES = ["core.c", "output.c", "api.c", "paths.c", "records.c", "streams.c", "attach.c", "coverage.c", "clock.c"]
SOURCES += ["hooks_posix.c", "hooks_stat.c", "hooks_stdio.c", "hooks_dir.c", "hooks_proc.c", "hooks_signal.c"]


class BuildSharedLibrary(build_ext):
    """build_ext that names the io library like a library rather than a Python extension module."""

    def get_ext_filename(self, fullname: str) -> str:
        # called with the dotted name and, from get_ext_fullpath, with its last component alone
        if fullname in (LIBRARY, LIBRARY.rpartition(".")[2], SAMPLER, SAMPLER.rpartition(".")[2]):
            return os.path.join(*fullname.split(".")) + ".so"
        return str(super().get_ext_filename(fullname))

    def get_export_symbols(self, ext: Extension) -> list[str]:
        if ext.name in (LIBRARY, SAMPLER):
            return []  # no PyInit_ function: the libraries export their own C interfaces only
        return list(super().get_export_symbols(ext))


io_library = Extension(
    LIBRARY,
    sources=[f"{SOURCE_DIR}/{name}" for name in SOURCES],
    depends=[f"{SOURCE_DIR}/xio.h"],
    extra_compile_args=["-O2", "-std=gnu11", "-fvisibility=hidden", "-fno-strict-aliasing"],
    libraries=["dl", "pthread"],
    optional=True,
)

sampler_library = Extension(
    SAMPLER,
    sources=["src/xstack/collect/_sampler/sampler.c"],
    extra_compile_args=["-O2", "-std=gnu11", "-fvisibility=hidden"],
    libraries=["pthread"],
    optional=True,
)

setup(ext_modules=[io_library, sampler_library], cmdclass={"build_ext": BuildSharedLibrary})
