"""A program whose worker is started the way ``multiprocessing``'s spawn mode (and a DataLoader with
``multiprocessing_context="spawn"``) starts them, for the io level's classes of processes and files
(tests/collect/test_io_classes.py).

argv: DATA_FILE. The main process puts a block of shared memory (``/dev/shm``, which starts the resource tracker)
and the path of DATA_FILE on a queue; the worker, a fresh interpreter, reads the file into the shared memory and
opens a listening socket as ``multiprocessing`` does to hand a descriptor over (in its ``pymp-*`` folder, which
``tempfile`` first probes for). The main process prints what the worker copied.
"""

import multiprocessing as mp
import sys
from multiprocessing import connection, shared_memory


def work(jobs: "mp.Queue[tuple[str, str]]", done: "mp.Queue[int]") -> None:
    name, path = jobs.get()
    memory = shared_memory.SharedMemory(name)
    with open(path, "rb") as f:
        data = f.read()
    memory.buf[: len(data)] = data
    with connection.Listener(family="AF_UNIX"):  # an address in multiprocessing's temporary folder
        pass
    memory.close()
    done.put(len(data))


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    memory = shared_memory.SharedMemory(create=True, size=4096)
    jobs: "mp.Queue[tuple[str, str]]" = ctx.Queue()
    done: "mp.Queue[int]" = ctx.Queue()
    worker = ctx.Process(target=work, args=(jobs, done))
    worker.start()
    jobs.put((memory.name, sys.argv[1]))
    n = done.get()
    print("copied", bytes(memory.buf[:n]).decode())
    worker.join()
    memory.close()
    memory.unlink()
