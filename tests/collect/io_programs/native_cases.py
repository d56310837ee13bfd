"""Programs run under the io library by tests/collect/test_io_native.py: ``python native_cases.py CASE ARGS``.

Each case does a known sequence of file operations (the test checks the records against it) and prints one
JSON line with what the program itself observed.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path


def posix(data: str, out: str) -> dict[str, object]:
    """Reads of a 10,000-byte file: whole, partial with seeks, pread, readv; writes; syncs; stats; mmap."""
    fd = os.open(data, os.O_RDONLY)
    while os.read(fd, 4096):  # 4096, 4096, 1808, then 0 at the end
        pass
    os.close(fd)
    fd = os.open(data, os.O_RDONLY)
    os.read(fd, 100)
    os.lseek(fd, 5000, os.SEEK_SET)
    os.read(fd, 200)
    os.lseek(fd, -100, os.SEEK_END)
    os.read(fd, 1000)  # 100 bytes, from 9900
    os.pread(fd, 50, 20)
    os.readv(fd, [bytearray(10), bytearray(20)])  # at the end: 0 bytes
    os.lseek(fd, 0, os.SEEK_SET)
    os.readv(fd, [bytearray(10), bytearray(20)])
    os.close(fd)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"x" * 1000)
    os.writev(fd, [b"a" * 10, b"b" * 20])
    os.pwrite(fd, b"z" * 5, 2)
    os.fsync(fd)
    os.fdatasync(fd)
    os.close(fd)
    os.stat(data)
    os.lstat(data)
    fd = os.open(data, os.O_RDONLY)
    os.fstat(fd)
    with mmap.mmap(fd, 4096, access=mmap.ACCESS_READ) as mapped:
        first = mapped[:1]
    os.close(fd)
    return {"mapped": first.hex()}


def relative(data_dir: str) -> dict[str, object]:
    """Relative paths (against the cwd and against a directory descriptor) resolve to the same absolute one."""
    os.chdir(data_dir)
    os.makedirs("sub", exist_ok=True)
    dirfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    fds = [os.open("known.bin", os.O_RDONLY), os.open("./sub/../known.bin", os.O_RDONLY)]
    fds.append(os.open("known.bin", os.O_RDONLY, dir_fd=dirfd))
    os.stat("known.bin", dir_fd=dirfd)
    os.stat("sub/../known.bin")
    for fd in [*fds, dirfd]:
        os.close(fd)
    return {}


def unnamed(data_dir: str) -> dict[str, object]:
    """Two unnamed temporary files open at once in one folder (O_TMPFILE, as tempfile.TemporaryFile makes them),
    each written, read back and closed; and the folder itself listed."""
    fds = []
    for _ in range(2):
        try:
            fds.append(os.open(data_dir, os.O_TMPFILE | os.O_RDWR, 0o600))
        except OSError as exc:  # a file system without O_TMPFILE
            return {"unsupported": os.strerror(exc.errno or 0)}
    made = []
    for fd, size in zip(fds, (5000, 300), strict=True):
        os.write(fd, b"y" * size)
        os.lseek(fd, 0, os.SEEK_SET)
        os.read(fd, size + 1)
        made.append((os.fstat(fd).st_ino, size))
        os.close(fd)
    os.listdir(data_dir)
    return {"made": made}


def errnos(data: str) -> dict[str, object]:
    """A missing file, a read of a closed descriptor, a descriptor closed twice."""
    seen: dict[str, object] = {}
    try:
        os.open(data + ".missing", os.O_RDONLY)
    except OSError as exc:
        seen["open"] = exc.errno
    fd = os.open(data, os.O_RDONLY)
    os.close(fd)
    try:
        os.read(fd, 10)
    except OSError as exc:
        seen["read"] = exc.errno
    try:
        os.close(fd)
    except OSError as exc:
        seen["close"] = exc.errno
    seen["fd"] = fd
    return seen


def streams() -> dict[str, object]:
    """A pipe and a socket pair, written and read through their descriptors."""
    r, w = os.pipe()
    os.write(w, b"p" * 100)
    got_pipe = len(os.read(r, 100))
    a, b = socket.socketpair()
    sockets = [a.fileno(), b.fileno()]
    os.write(a.fileno(), b"s" * 64)
    got_socket = len(os.read(b.fileno(), 64))
    for fd in (r, w):
        os.close(fd)
    a.close()
    b.close()
    return {"pipe": [r, w, got_pipe], "socket": [*sockets, got_socket]}


def threads(data_dir: str, count: str) -> dict[str, object]:
    """8 threads, each reading its own file 10 bytes at a time ``count`` times."""
    tids: dict[str, int] = {}

    def work(i: int) -> None:
        tids[f"t{i}.bin"] = threading.get_native_id()
        fd = os.open(os.path.join(data_dir, f"t{i}.bin"), os.O_RDONLY)
        for _ in range(int(count)):
            os.read(fd, 10)
        os.close(fd)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return {"tids": tids}


def fork(inherited: str, fresh: str) -> dict[str, object]:
    """The parent reads 10 bytes and forks; the child reads the inherited descriptor and a new file, forks a
    grandchild that reads both (one descriptor opened by its grandparent, one by its parent), then leaves by
    os._exit (no destructors)."""
    fd = os.open(inherited, os.O_RDONLY)
    os.read(fd, 10)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.read(fd, 20)
        other = os.open(fresh, os.O_RDONLY)
        os.read(other, 5)
        grandchild = os.fork()
        if grandchild == 0:
            os.read(fd, 7)
            os.read(other, 3)
            os._exit(0)
        os.waitpid(grandchild, 0)
        os.write(w, b"%d %d" % (grandchild, other))
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    grandchild, other = map(int, os.read(r, 100).split())
    os.close(fd)
    return {"child": pid, "fd": fd, "status": status, "grandchild": grandchild, "other": other}


def fork_storm(data: str, forks: str) -> dict[str, object]:
    """Threads record calls as fast as they can (holding the library's lock often) while the main thread
    forks; every child reads a file and leaves by os._exit. A fork taken while another thread held the lock
    must not leave the child waiting on it."""
    stop = threading.Event()

    def hammer() -> None:
        r, w = os.pipe()
        while not stop.is_set():
            os.write(w, b"x")
            os.read(r, 1)
        os.close(r)
        os.close(w)

    workers = [threading.Thread(target=hammer) for _ in range(4)]
    for t in workers:
        t.start()
    children = []
    for _ in range(int(forks)):
        pid = os.fork()
        if pid == 0:
            fd = os.open(data, os.O_RDONLY)
            os.read(fd, 100)
            os.close(fd)
            os._exit(0)
        children.append(pid)
        os.waitpid(pid, 0)
    stop.set()
    for t in workers:
        t.join()
    return {"children": children}


def signals(data: str, out: str) -> dict[str, object]:
    """A timer whose handler writes a file fires while the main thread reads in a loop."""
    fd = os.open(data, os.O_RDONLY)
    log = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    fired = [0]

    def on_timer(signum: int, frame: object) -> None:
        fired[0] += 1
        os.write(log, b"t")

    signal.signal(signal.SIGALRM, on_timer)
    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
    deadline = time.monotonic() + 0.5
    reads = 0
    while time.monotonic() < deadline or fired[0] < 5:
        os.pread(fd, 64, 0)
        reads += 1
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    os.close(fd)
    os.close(log)
    return {"fired": fired[0], "reads": reads}


def killed(data: str) -> dict[str, object]:
    """Reads, waits past the flush interval, reads again (which flushes both), then waits to be killed."""
    fd = os.open(data, os.O_RDONLY)
    os.read(fd, 10)
    time.sleep(0.3)
    os.read(fd, 20)
    print(json.dumps({"ready": True}), flush=True)
    time.sleep(60)
    return {}


def terminated(data: str, default_again: str = "") -> dict[str, object]:
    """Reads (records still buffered: no flush interval passes), then waits for a termination signal, left at
    its default action or, with ``default_again``, set to a handler and back to the default."""
    if default_again:
        sig = signal.Signals[default_again]
        signal.signal(sig, lambda *_: None)
        signal.signal(sig, signal.SIG_DFL)
    fd = os.open(data, os.O_RDONLY)
    os.read(fd, 10)
    os.read(fd, 20)
    print(json.dumps({"ready": True}), flush=True)
    time.sleep(60)
    return {}


def dispositions() -> dict[str, object]:
    """What the program sees of SIGTERM's action (the library stands in for its default): through Python, and
    through sigaction itself."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(256)  # a struct sigaction; its first field is the handler

    def handler_by_sigaction() -> int:
        assert libc.sigaction(signal.SIGTERM, None, buf) == 0
        return ctypes.c_void_p.from_buffer(buf).value or 0

    seen: dict[str, object] = {"python_at_start": str(signal.getsignal(signal.SIGTERM))}
    seen["sigaction_at_start"] = handler_by_sigaction()
    got: list[int] = []
    seen["replaced"] = str(signal.signal(signal.SIGTERM, lambda sig, _: got.append(sig)))
    os.kill(os.getpid(), signal.SIGTERM)  # the program's own handler runs, and the process lives on
    seen["handled"] = got
    seen["back_to_default"] = signal.signal(signal.SIGTERM, signal.SIG_DFL) is not signal.SIG_DFL
    seen["sigaction_after"] = handler_by_sigaction()
    seen["python_after"] = str(signal.getsignal(signal.SIGTERM))
    seen["sighup_ignored"] = str(signal.signal(signal.SIGHUP, signal.SIG_IGN))
    seen["sighup_now"] = str(signal.getsignal(signal.SIGHUP))
    os.kill(os.getpid(), signal.SIGHUP)  # ignored: nothing happens
    return seen


def pool(data_dir: str) -> dict[str, object]:
    """A multiprocessing pool whose workers read files and are then terminated (SIGTERM) in their next task."""
    import multiprocessing

    paths = sorted(os.path.join(data_dir, name) for name in os.listdir(data_dir))
    with multiprocessing.get_context("fork").Pool(2) as workers:
        sizes = workers.map(_read_whole, paths, chunksize=1)
        workers.map_async(time.sleep, [30, 30], chunksize=1)
        time.sleep(0.05)  # the workers take their tasks
    return {"bytes": sum(sizes)}  # leaving the with block terminated them


def _read_whole(path: str) -> int:
    with open(path, "rb") as f:
        return len(f.read())


def excluded(kept: str, hidden: str) -> dict[str, object]:
    """Reads a file under an excluded prefix (and its dup, fstat) and one outside it."""
    for path in (kept, hidden):
        fd = os.open(path, os.O_RDONLY)
        os.read(fd, 10)
        copy = os.dup(fd)
        os.fstat(copy)
        os.close(copy)
        os.close(fd)
        os.stat(path)
    return {}


def spawn(*command: str) -> dict[str, object]:
    """Runs a program as a child (subprocess: vfork and exec) and reports its pid."""
    import subprocess

    proc = subprocess.Popen(list(command))
    proc.wait()
    return {"pid": proc.pid, "rc": proc.returncode}


def spawn_clean_env(*command: str) -> dict[str, object]:
    """Runs a program with an environment of its own (no LD_PRELOAD): it cannot be recorded."""
    import subprocess

    proc = subprocess.Popen(list(command), env={"PATH": os.defpath})
    proc.wait()
    return {"pid": proc.pid, "rc": proc.returncode}


def execs(data: str) -> dict[str, object]:
    """Reads, then replaces itself with another Python program that reads the same file."""
    fd = os.open(data, os.O_RDONLY)
    os.read(fd, 10)
    code = f"import os; fd = os.open({data!r}, os.O_RDONLY); os.read(fd, 30); print('{{}}')"
    os.execv(sys.executable, [sys.executable, "-c", code])


def close_all(out: str) -> dict[str, object]:
    """Closes every descriptor past stderr (the library's own file among them), then writes a file of its
    own, which reuses the number, across a flush interval."""
    os.closerange(3, 65536)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"a" * 100)
    time.sleep(0.15)
    os.write(fd, b"b" * 100)
    os.close(fd)
    return {"fd": fd}


def attach(first: str, second: str, io_dir: str, outer: str = "", plugin_target: str = "") -> dict[str, object]:
    """Attaches the library at run time, reads a file with Python's open(), lists its folder and, through a
    shared object loaded after attaching (``outer``, which dlopens its neighbour by name), reads another file;
    runs a child program; detaches and reads one more file."""
    import ctypes
    import subprocess

    from xstack.collect import _io_native

    _io_native.attach(Path(io_dir))
    library = _io_native._loaded()
    assert library is not None
    patched = int(library.xstack_io_patched())
    with open(first, "rb") as f:
        f.read()
    listed = len(os.listdir(os.path.dirname(first)))
    plugin = None
    if outer:
        outer_read = ctypes.CDLL(outer).outer_read
        outer_read.restype = ctypes.c_long
        outer_read.argtypes = [ctypes.c_char_p]
        plugin = outer_read(plugin_target.encode())
    child = subprocess.run(["true"], check=True)
    _io_native.detach()
    _io_native.detach()  # idempotent
    with open(second, "rb") as f:
        f.read()
    return {"patched": patched, "after": int(library.xstack_io_patched()), "rc": child.returncode, "plugin": plugin,
            "listed": listed}  # fmt: skip


def dataloader(data_dir: str) -> dict[str, object]:
    """A DataLoader with 2 worker processes, each item read from its own file."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    files = sorted(Path(data_dir).glob("*.bin"))

    class Files(Dataset[torch.Tensor]):
        def __len__(self) -> int:
            return len(files)

        def __getitem__(self, i: int) -> torch.Tensor:
            with open(files[i], "rb") as f:
                return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)

    total = sum(int(batch.numel()) for batch in DataLoader(Files(), batch_size=None, num_workers=2))
    return {"bytes": total}


def _timed_reads(data: str) -> list[tuple[str, int, int]]:
    """8 reads of a pipe whose writer sleeps 30 ms first (long calls) and 8 preads of a file (short ones), with
    CLOCK_REALTIME read just before and after each: about 0.25 s, so the records span several flushes."""
    windows = []
    r, w = os.pipe()

    def writer() -> None:
        for _ in range(8):
            time.sleep(0.03)
            os.write(w, b"x")

    thread = threading.Thread(target=writer)
    thread.start()
    fd = os.open(data, os.O_RDONLY)
    for _ in range(8):
        before = time.time_ns()
        os.read(r, 1)
        windows.append(("pipe", before, time.time_ns()))
        before = time.time_ns()
        os.pread(fd, 100, 0)
        windows.append(("file", before, time.time_ns()))
    thread.join()
    for one in (fd, r, w):
        os.close(one)
    return windows


def timing(data: str, child_out: str) -> dict[str, object]:
    """Calls timed from Python around known reads, in this process and in a forked child (its own anchors)."""
    parent = _timed_reads(data)
    pid = os.fork()
    if pid == 0:
        Path(child_out).write_text(json.dumps(_timed_reads(data)))
        os._exit(0)
    os.waitpid(pid, 0)
    return {"parent": parent, "child": json.loads(Path(child_out).read_text()), "child_pid": pid}


def listing(data_dir: str) -> dict[str, object]:
    """Directory listings: os.listdir, a scandir run interrupted by a read, os.walk, a listing by descriptor
    (whose descriptor number a pipe then takes), and a directory that does not exist."""
    names = os.listdir(data_dir)
    with os.scandir(data_dir) as it:
        first = next(it).name
        with open(os.path.join(data_dir, "known.bin"), "rb") as f:
            f.read(10)
        rest = [e.name for e in it]
    walked = [(root, sorted(dirs), sorted(files)) for root, dirs, files in os.walk(os.path.join(data_dir, "tree"))]
    dirfd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    by_fd = os.listdir(dirfd)  # a dup of dirfd, listed by fdopendir, closed by closedir
    r, w = os.pipe()
    os.write(w, b"abc")
    got = os.read(r, 3)
    os.close(r)
    os.close(w)
    os.close(dirfd)
    try:
        os.listdir(os.path.join(data_dir, "missing"))
        missing = 0
    except FileNotFoundError as e:
        missing = e.errno or 0
    return {"names": len(names), "first": first, "rest": len(rest), "walked": walked, "by_fd": len(by_fd),
            "pipe": [r, w], "got": got.decode(), "missing": missing, "dirfd": dirfd}  # fmt: skip


def copies(data: str, out_dir: str) -> dict[str, object]:
    """In-kernel copies of a 10,000-byte file: sendfile at the source's offset and at a given one,
    copy_file_range at given offsets, shutil.copyfile; then renames: by path, by directory descriptors, of a
    folder, and one that fails."""
    out = Path(out_dir)
    src = os.open(data, os.O_RDONLY)
    dst = os.open(out / "sent.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sent = [os.sendfile(dst, src, None, 4000)]  # from the source's offset, which moves to 4000
    sent.append(os.sendfile(dst, src, 8000, 5000))  # 2,000 bytes from 8000: the source's offset stays
    os.read(src, 10)  # at 4000
    os.close(dst)
    dst = os.open(out / "ranged.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    ranged = os.copy_file_range(src, dst, 1000, 0, 100)
    os.close(dst)
    os.close(src)
    shutil.copyfile(data, out / "copied.bin")
    os.rename(out / "sent.bin", out / "moved.bin")
    dirfd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    os.replace("moved.bin", "final.bin", src_dir_fd=dirfd, dst_dir_fd=dirfd)
    os.close(dirfd)
    os.mkdir(out / "tmp-checkpoint")
    os.rename(out / "tmp-checkpoint", out / "checkpoint")
    try:
        os.rename(out / "missing.bin", out / "never.bin")
        failed = 0
    except FileNotFoundError as e:
        failed = e.errno
    return {"sent": sent, "ranged": ranged, "failed": failed}


def mappings(data: str) -> dict[str, object]:
    """File mappings unmapped after their descriptor closed: a failed unmap, then the real one; an anonymous
    mapping (not recorded); a mapping unmapped in two parts (not recorded), with other memory mapped where its
    first part was; a mapping a forked child unmaps, then its parent."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)  # the preloaded library's munmap comes first
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

    def mapped(size: int) -> int:
        fd = os.open(data, os.O_RDONLY)
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0)
        os.close(fd)
        return int(addr)

    addr = mapped(8192)
    failed = libc.munmap(addr, 0)  # a length of 0 is EINVAL: the mapping stays
    failed_errno = ctypes.get_errno()
    done = libc.munmap(addr, 8192)
    anon = libc.mmap(None, 8192, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    libc.munmap(anon, 8192)
    addr = mapped(8192)
    libc.munmap(addr, 4096)  # part of it, from its start: not recorded, and no longer the file's at that address
    fixed = 0x10  # MAP_FIXED: other memory at the same address
    other = libc.mmap(addr, 4096, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | fixed, -1, 0)
    same = other == addr
    libc.munmap(other, 4096)
    libc.munmap(addr + 4096, 4096)
    addr = mapped(4096)
    pid = os.fork()
    if pid == 0:
        os._exit(libc.munmap(addr, 4096))
    _, status = os.waitpid(pid, 0)
    return {
        "failed": failed,
        "errno": failed_errno,
        "done": done,
        "child": os.waitstatus_to_exitcode(status),
        "parent": libc.munmap(addr, 4096),
        "child_pid": pid,
        "same": same,
    }


def remapped(grow: str) -> dict[str, object]:
    """A file mapping that Python's mmap.resize() grows (mremap, which may move it), then closes: one unmap of the
    whole of it, at its new address and length."""
    with open(grow, "wb") as f:
        f.write(b"g" * 4096)
    with open(grow, "r+b") as f:
        mapped = mmap.mmap(f.fileno(), 4096)
        mapped.resize(16 * 4096)  # ftruncate, then mremap with MREMAP_MAYMOVE
        mapped[-1:] = b"e"
        mapped.close()
    return {"size": os.path.getsize(grow)}


def unseen(data: str, stream: str) -> dict[str, object]:
    """Descriptors the library never saw opened (opened by a raw system call), first used by a read, a write
    and an fread: each call's offset is where it started, not where it left the descriptor."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    nr_openat, nr_lseek, at_fdcwd = 257, 8, -100  # x86-64

    def raw_open(path: str, flags: int, at: int) -> int:
        fd = int(libc.syscall(nr_openat, at_fdcwd, os.fsencode(path), flags, 0o644))
        assert fd >= 0 and libc.syscall(nr_lseek, fd, at, os.SEEK_SET) == at
        return fd

    fd = raw_open(data, os.O_RDONLY, 100)
    reads = [len(os.read(fd, 50)), len(os.read(fd, 50))]  # from 100, then from 150
    os.close(fd)
    fd = raw_open(stream, os.O_WRONLY | os.O_CREAT, 10)
    writes = [os.write(fd, b"w" * 20), os.write(fd, b"w" * 5)]  # at 10, then at 30
    os.close(fd)
    # a stream on it made by glibc's _IO_fdopen, which the library does not wrap (fdopen is wrapped): its first
    # fread fills the stream's buffer, so the descriptor is past the bytes the fread returned
    libc._IO_fdopen.restype = ctypes.c_void_p
    libc.fread.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    f = libc._IO_fdopen(raw_open(data, os.O_RDONLY, 1000), b"rb")
    buf = ctypes.create_string_buffer(1024)  # 1 KiB: recorded each, where a smaller one would join a run
    got = [libc.fread(buf, 1, 1024, f), libc.fread(buf, 1, 1024, f)]  # from 1000, then from 2024
    libc.fclose(f)
    return {"reads": reads, "writes": writes, "freads": got}


def close_race(data_dir: str, rounds: str) -> dict[str, object]:
    """One thread closes socket pairs (a close that takes a while, the kernel freeing the descriptor early in
    it) while another opens, reads whole and closes small files, which often get a descriptor the first thread
    has just closed: every whole read starts at 0."""
    stop = threading.Event()
    closes = 0

    def closer() -> None:
        nonlocal closes
        while not stop.is_set():
            a, b = socket.socketpair()
            a.sendall(b"x" * 1000)
            a.close()
            b.close()
            closes += 2

    thread = threading.Thread(target=closer)
    thread.start()
    paths = sorted(Path(data_dir).glob("t*.bin"))
    read = 0
    try:
        for i in range(int(rounds)):
            fd = os.open(paths[i % len(paths)], os.O_RDONLY)
            read += len(os.read(fd, 4096))
            os.close(fd)
    finally:
        stop.set()
        thread.join()
    return {"read": read, "closes": closes}


def _spin(cpu_s: float) -> None:
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        pass


def contended(data: str) -> dict[str, object]:
    """Pinned to one CPU, two children each spin for 0.3 s of CPU at once (each waits for the other's turns),
    then a third spins as long alone; each reads ``data`` and leaves by os._exit, after telling its CPU time
    (``getrusage``, as the library reads it) through a pipe."""
    import resource

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # the children inherit it
    r, w = os.pipe()

    def child() -> int:
        pid = os.fork()
        if pid == 0:
            _spin(0.3)
            with open(data, "rb") as f:
                f.read()
            used = resource.getrusage(resource.RUSAGE_SELF)
            os.write(w, b"%d %d\n" % (os.getpid(), round((used.ru_utime + used.ru_stime) * 1e9)))
            os._exit(0)
        return pid

    together = [child(), child()]
    for pid in together:
        os.waitpid(pid, 0)
    alone = child()
    os.waitpid(alone, 0)
    os.close(w)
    with os.fdopen(r) as told:
        cpu = dict(line.split() for line in told.read().splitlines())
    return {"together": together, "alone": alone, "cpu_ns": {int(k): int(v) for k, v in cpu.items()}}


def _run_queue_wait() -> int:
    """The calling thread's time waiting in a run queue for a CPU so far (ns), from its schedstat file."""
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
        return int(f.read().split()[1])


def thread_waits(data: str) -> dict[str, object]:
    """Pinned to one CPU, a thread reads ``data`` then hashes for 0.3 s of its CPU time while the main thread does
    the same (hashing lets go of the GIL: the two wait for the CPU, not for the lock), tells its wait for a CPU so
    far and ends; the main thread then tells its own, and the process exits."""
    import hashlib

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    block, told = os.urandom(1 << 20), {}

    def hash_for(cpu_s: float) -> None:
        start = time.thread_time()
        while time.thread_time() - start < cpu_s:
            hashlib.sha256(block).digest()

    def ended_thread() -> None:
        with open(data, "rb") as f:
            f.read()
        hash_for(0.3)
        told["thread"] = _run_queue_wait()

    thread = threading.Thread(target=ended_thread)
    thread.start()
    hash_for(0.3)
    thread.join()
    told["main"] = _run_queue_wait()
    return told


def self_timed(data: str, calls: str) -> dict[str, object]:
    """``calls`` preads of ``data`` in this process, then half as many in a fork child that leaves by os._exit:
    what the library measures of its own cost counts each process's calls."""
    n = int(calls)
    fd = os.open(data, os.O_RDONLY)
    for i in range(n):
        os.pread(fd, 16, i % 64)
    pid = os.fork()
    if pid == 0:
        for i in range(n // 2):
            os.pread(fd, 16, i % 64)
        os._exit(0)
    os.waitpid(pid, 0)
    os.close(fd)
    return {"child": pid}


CASES = {
    "self_timed": self_timed,
    "contended": contended,
    "thread_waits": thread_waits,
    "remapped": remapped,
    "unseen": unseen,
    "close_race": close_race,
    "mappings": mappings,
    "copies": copies,
    "timing": timing,
    "posix": posix,
    "relative": relative,
    "unnamed": unnamed,
    "errnos": errnos,
    "streams": streams,
    "threads": threads,
    "fork": fork,
    "fork_storm": fork_storm,
    "signals": signals,
    "killed": killed,
    "terminated": terminated,
    "dispositions": dispositions,
    "pool": pool,
    "excluded": excluded,
    "spawn": spawn,
    "spawn_clean_env": spawn_clean_env,
    "execs": execs,
    "close_all": close_all,
    "attach": attach,
    "dataloader": dataloader,
    "listing": listing,
}

if __name__ == "__main__":
    result = CASES[sys.argv[1]](*sys.argv[2:])
    print(json.dumps(result), flush=True)
