"""Programs for the io library's per-thread record streams and its growing path index, run by
tests/collect/test_io_native.py: ``python stream_cases.py CASE ARGS``. Each prints one JSON line with what it
observed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def _read_once(path: str, tids: list[int], i: int) -> None:
    tids[i] = threading.get_native_id()
    fd = os.open(path, os.O_RDONLY)
    os.read(fd, 10)
    os.close(fd)


def churn(data: str, count: str) -> dict[str, object]:
    """``count`` threads one after another, each opening, reading and closing ``data``: more threads over
    the run than the library has streams, never more than one at a time."""
    tids = [0] * int(count)
    for i in range(len(tids)):
        t = threading.Thread(target=_read_once, args=(data, tids, i))
        t.start()
        t.join()
    return {"tids": tids}


def crowd(data: str, count: str) -> dict[str, object]:
    """``count`` threads alive at once (more than the library has streams), each opening, reading and
    closing ``data`` once all have started; none ends before all have read, so all hold a stream at once."""
    tids = [0] * int(count)
    start, end = threading.Barrier(len(tids)), threading.Barrier(len(tids))

    def work(i: int) -> None:
        start.wait()
        _read_once(data, tids, i)
        end.wait()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(tids))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"tids": tids}


def idle_thread(data: str) -> dict[str, object]:
    """A thread reads once and then waits forever; the main thread keeps reading past the flush interval,
    says it is ready and waits to be killed: the idle thread's read must reach the file all the same."""
    tid = [0]
    done = threading.Event()

    def idle() -> None:
        tid[0] = threading.get_native_id()
        fd = os.open(data, os.O_RDONLY)
        os.read(fd, 7)
        done.set()
        threading.Event().wait()

    threading.Thread(target=idle, daemon=True).start()
    done.wait()
    fd = os.open(data, os.O_RDONLY)
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        os.pread(fd, 1, 0)
    print(json.dumps({"ready": True, "tid": tid[0]}), flush=True)
    time.sleep(60)
    return {}


def many_paths(directory: str, count: str) -> dict[str, object]:
    """Opens ``count`` distinct missing files twice over: each open writes its path into the stream, which
    wraps around many times."""
    failed = 0
    for _ in range(2):
        for i in range(int(count)):
            try:
                os.open(os.path.join(directory, f"missing-{i}"), os.O_RDONLY)
            except FileNotFoundError:
                failed += 1
    return {"failed": failed}


def reattach(data: str, io_dir: str) -> dict[str, object]:
    """Attaches, reads on two threads, detaches, reads (not recorded), attaches again and reads on both threads
    again: the second thread's stream restarts in the second session's file. A descriptor opened in the first
    session is read and closed in the second: its path was written in the first session's file only."""
    from pathlib import Path

    from xstack.collect import _io_native

    def read(n: int) -> None:
        fd = os.open(data, os.O_RDONLY)
        os.read(fd, n)
        os.close(fd)

    resume, first_done = threading.Event(), threading.Event()
    tid = [0]

    def other() -> None:
        tid[0] = threading.get_native_id()
        read(1)
        first_done.set()
        resume.wait()
        read(2)

    _io_native.attach(Path(io_dir))
    read(3)
    kept = os.open(data, os.O_RDONLY)
    thread = threading.Thread(target=other)
    thread.start()
    first_done.wait()
    _io_native.detach()
    read(4)
    _io_native.attach(Path(io_dir))
    read(5)
    os.read(kept, 6)
    os.close(kept)
    resume.set()
    thread.join()
    _io_native.detach()
    return {"main": threading.get_native_id(), "other": tid[0]}


CASES = {"churn": churn, "crowd": crowd, "idle_thread": idle_thread, "many_paths": many_paths, "reattach": reattach}

if __name__ == "__main__":
    result = CASES[sys.argv[1]](*sys.argv[2:])
    print(json.dumps(result), flush=True)
