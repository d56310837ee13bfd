"""A program that touches a file of every class, for the io level's path classes (tests/collect/test_io_classes.py).

argv: DATA_DIR SRC_DIR LISTED_DIR [STAGED]. It checks that DATA_DIR is a directory (a stat) and lists it, reads the
files in it (data), reads the entry points of the packages installed in SRC_DIR as an editable install leaves them
(``NAME.egg-info``), writes to its standard output and error (which the test redirects to files) and starts a
second interpreter (which reads its pyvenv.cfg, when it runs from a virtual environment). The interpreter reads
this script itself; it reads one of xstack's modules as a traceback through the profiler would. It lists LISTED_DIR
through a descriptor that ``os.open`` opened without ``O_DIRECTORY`` and nothing stat'ed (``os.listdir(fd)``:
``fdopendir``, then ``readdir``). It reads STAGED, a file staged in ``/dev/shm``, where given.
"""

import importlib.metadata
import os
import subprocess
import sys

import xstack

data = sys.argv[1]
for dist in importlib.metadata.distributions(path=[sys.argv[2]]):
    dist.entry_points  # noqa: B018 - reads NAME.egg-info/entry_points.txt
if not os.path.isdir(data):
    sys.exit(f"{data}: not a directory")
for name in sorted(os.listdir(data)):
    with open(os.path.join(data, name), "rb") as f:
        f.read()
for staged in sys.argv[4:]:
    with open(staged, "rb") as f:
        f.read()
with open(os.path.join(os.path.dirname(xstack.__file__), "runner.py"), "rb") as f:
    f.read()
fd = os.open(sys.argv[3], os.O_RDONLY)
os.listdir(fd)
os.close(fd)
print("read", flush=True)
print("warned", file=sys.stderr, flush=True)
subprocess.run([sys.executable, "-c", "print('child')"], check=True)
