"""The io level's path classes, shared by the live io level and the Darshan importer."""

from __future__ import annotations

import pytest

from xstack.trace.io_paths import path_class


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
        ("/data/train/img_001.npz", "data"),
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
