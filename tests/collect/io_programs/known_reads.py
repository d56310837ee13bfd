"""A program with known file reads, for the io level's exact byte counts (tests/collect/test_io_level.py).

argv: DATA_DIR [crash]. Every file under DATA_DIR is made by the test; what is read of each is fixed here.
"""

import os
import sys
import threading

import numpy as np

import xstack

data = sys.argv[1]


def path(name: str) -> str:
    return os.path.join(data, name)


with xstack.span("load"):
    with open(path("full.bin"), "rb") as f:  # read fully: 10,000 bytes
        f.read()
    with open(path("partial.bin"), "rb", buffering=0) as f:  # 1,000 of its 50,000 bytes (unbuffered)
        f.read(1000)
    for _ in range(2):  # read twice: 2 x 3,000 bytes
        with open(path("twice.bin"), "rb") as f:
            f.read()
    fd = os.open(path("seeks.bin"), os.O_RDONLY)  # 100 at 0, 100 at 5,000, 50 at 9,950: 250 bytes, 2 seeks
    os.read(fd, 100)
    os.lseek(fd, 5000, os.SEEK_SET)
    os.read(fd, 100)
    os.lseek(fd, -50, os.SEEK_END)
    os.read(fd, 100)
    os.close(fd)
    np.fromfile(path("array.bin"), dtype=np.float32)  # 4,096 floats: 16,384 bytes through stdio
    with open(path("chunked.bin"), "rb", buffering=0) as f:  # PIL-style: 4 KiB chunks until EOF (20,000 bytes)
        while f.read(4096):
            pass

with xstack.span("preprocess"):

    def worker(i: int) -> None:
        with open(path(f"thread{i}.bin"), "rb") as f:
            f.read()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]  # 4 x 2,048 bytes
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pid = os.fork()
    if pid == 0:
        with open(path("child.bin"), "rb") as f:  # 7,777 bytes in a forked child
            f.read()
        os._exit(0)
    os.waitpid(pid, 0)

with xstack.span("postprocess"):
    with open(path("out.bin"), "wb") as f:  # 12,345 bytes written
        f.write(b"x" * 12345)
    if len(sys.argv) > 2 and sys.argv[2] == "crash":
        raise RuntimeError("crashed on purpose after the writes")
