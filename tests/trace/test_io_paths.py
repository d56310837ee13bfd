"""The io level's path classes, shared by the live io level and the Darshan importer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import xstack
from xstack.trace.io_paths import CLASSES, path_class, path_text

PACKAGE = Path(xstack.__file__).parent


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("<STDIN>", "stream"),
        ("<STDERR>", "stream"),
        ("<pipe>", "stream"),
        ("socket:[12345]", "stream"),
        ("/dev/pts/3", "stream"),
        ("/dev/tty", "stream"),
        ("/usr/lib/python3.11/os.py", "python"),
        ("/home/u/venv/lib/python3.11/site-packages/torch/__init__.py", "python"),
        ("/usr/lib/python3/dist-packages/yaml/__init__.py", "python"),
        ("/opt/conda/lib/python3.12t/json/__init__.py", "python"),
        ("/usr/lib/x86_64-linux-gnu/libc.so.6", "system"),
        ("/etc/passwd", "system"),
        ("/proc/self/maps", "system"),
        ("/sys/devices/system/cpu/online", "system"),
        ("/dev/null", "system"),
        ("/var/lib/dpkg/status", "system"),
        ("/snap/core/1/x", "system"),
        ("/usr", "system"),
        ("/usr/bin/python3.11", "python"),
        ("/home/u/venv/pyvenv.cfg", "python"),  # the virtual environment's, read as the interpreter starts
        ("/home/u/venv/bin/python", "python"),
        ("/opt/py/lib/libpython3.12.so.1.0", "python"),
        ("/home/u/project/train.py", "python"),  # the program's own script and modules
        ("/home/u/project/__pycache__/model.cpython-311.pyc", "python"),
        ("/home/u/project/__pycache__", "python"),
        ("/home/u/project/fast.cpython-311-x86_64-linux-gnu.so", "python"),
        ("/home/u/project/fast.abi3.so", "python"),
        (str(PACKAGE / "runner.py"), "profiler"),  # xstack's own modules and io library
        (str(PACKAGE / "collect" / "_io" / "libxstack_io.so"), "profiler"),
        (str(PACKAGE), "profiler"),
        ("/home/u/venv/lib/python3.11/site-packages/xstack-0.1.0.dist-info/entry_points.txt", "profiler"),
        ("/home/u/xstack/src/xstack.egg-info/entry_points.txt", "profiler"),  # an editable install of xstack
        ("/home/u/project/src/mypkg.egg-info/entry_points.txt", "python"),  # of the program's own package
        ("/home/u/project/src/mypkg.egg-info", "python"),
        ("/opt/tools/thing-2.0.dist-info/METADATA", "python"),
        ("/home/u/venv/src/mypkg.egg-link", "python"),
        ("/data/train/shard.info/part-0", "data"),
        ("/dev/shm/torch_29770_3913507187_0", "ipc"),  # a tensor a DataLoader worker hands over
        ("/dev/shm/torch_29770_3913507187_0 (deleted)", "ipc"),  # the same, named through /proc/self/fd
        ("/dev/shm/sem.mp-2k1ab3cd", "ipc"),  # a POSIX semaphore
        ("/dev/shm/psm_b128b029", "ipc"),  # multiprocessing.shared_memory
        ("/run/shm/sem.x", "ipc"),
        ("/dev/shm", "ipc"),
        ("/dev/shm/__KMP_REGISTERED_LIB_4412_0", "ipc"),  # OpenMP's registration
        ("/dev/shm/pym-4412-k2j3h4l5", "ipc"),  # a multiprocessing heap's arena
        ("/dev/shm/joblib_memmapping_folder_4412_ab12/x.pkl", "ipc"),
        ("/dev/shm/nccl-Xk2j3h", "ipc"),
        ("/dev/shm/cuda.shm.0.3a", "ipc"),
        # files the program staged on a fast tier, as the small-files advice tells it to: its data
        ("/dev/shm/train/00586.npy", "data"),
        ("/dev/shm/imagenet.tar", "data"),
        ("/run/shm/x", "data"),
        ("/dev/shm/torchvision_data/x.bin", "data"),
        ("/memfd:pytorch (deleted)", "ipc"),
        ("/tmp/pymp-i9nazalg/listener-49o1hglo", "ipc"),  # multiprocessing's folder: a socket to hand a descriptor
        ("/scratch/job/pymp-ys2wdqpk", "ipc"),
        ("/data/pymp-notes.txt", "data"),
        ("/root/.pyenv/versions/3.11.7/lib/python311.zip", "python"),  # what an interpreter looks for as it starts
        ("/root/.pyenv/versions/3.11.7/bin/pybuilddir.txt", "python"),
        ("/work/venv/bin/python._pth", "python"),
        ("/root/.pyenv/versions/3.11.7/bin/Modules/Setup.local", "python"),
        ("/root/.pyenv/versions/3.11.7/include/python3.11/Python.h", "python"),  # torch.compile's C++ includes it
        ("/tmp/torchinductor_root/fxgraph/tu/ftujsq7nph/2voi53wegr", "python"),  # torch.compile's cache
        ("/tmp/torchinductor_root/24/c244b2rga7.so", "python"),
        ("/home/u/.triton/cache/ab12/kernel.cubin", "python"),
        ("/home/u/.cache/torch/inductor/x.json", "python"),
        ("/data/include/pythonic.h", "data"),
        ("/data/train/img_001.npz", "data"),
        ("/data/train/notes.pyx.txt", "data"),
        ("/data/python", "data"),
        ("/home/u/project/lib/pythonic/data.bin", "data"),
        ("/usrdata/x", "data"),
        ("/var/tmp/x.bin", "data"),
        ("<fd 7>", "unknown"),
        ("549727794", "unknown"),
        ("", "unknown"),
    ],
)
def test_path_class(path: str, expected: str) -> None:
    assert path_class(path) == expected


def test_every_class_is_described() -> None:
    paths = ("/d", "/usr/x", "/usr/lib/python3/os.py", "<pipe>", "x", str(PACKAGE), "/dev/shm/sem.x")
    classes = {path_class(p) for p in paths}
    assert classes | {"directory"} == set(CLASSES)  # directories are known from the calls (collect._io_classes)


def test_a_name_that_is_not_utf8_keeps_its_other_bytes_escaped() -> None:
    """As bytes from the records, or as ``os.fsdecode`` made them (lone surrogates, which JSON cannot hold)."""
    latin1 = b"/data/caf\xe9.bin"
    assert path_text(latin1) == path_text(os.fsdecode(latin1)) == "/data/caf\\xe9.bin"
    assert path_text("/data/café.bin".encode()) == path_text("/data/café.bin") == "/data/café.bin"
    assert path_text(b"/data/a.bin") == "/data/a.bin" and path_text("") == ""
