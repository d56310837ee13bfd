"""Waiting for the program restarted under a tracer (the io library, strace, ncu) or for a pass of a leveled
measurement, and passing its exit status on as a shell would."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from typing import Any


def exit_code(returncode: int) -> int:
    """The exit code for a child's ``returncode``: its own, or 128 + N for one killed by signal N (``subprocess``
    gives -N), as a shell reports it (137 for SIGKILL, the out-of-memory killer's), so that the caller's code is
    what running the program without xstack would have given, not -N taken modulo 256 (247 for SIGKILL)."""
    return 128 - returncode if returncode < 0 else returncode


class Forked:
    """A forked child process, waited for as a ``subprocess.Popen`` is (``wait``, ``send_signal``,
    ``returncode``: -N when signal N killed it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)


def wait(process: subprocess.Popen[bytes] | Forked, *, forward_sigterm: bool = True) -> int:
    """Wait for ``process`` and return its exit code (``exit_code``). A Ctrl-C reaches it as well (one process
    group): it is waited for again, so that it can complete what it writes, and ends with 130 unless it chose a
    code of its own. A SIGTERM to this process (a scheduler's, or ``kill`` of its pid alone) is passed on to the
    child, which completes its profile at it, and waited for the same way: this process then reads what the child
    wrote, and its exit code says the child ended by the signal. Not where the child is a tracer running the
    program (``forward_sigterm`` false: strace, ncu), which would stop tracing it and leave it running."""
    main = forward_sigterm and threading.current_thread() is threading.main_thread()
    previous: Any = signal.SIG_DFL
    if main:

        def forward(signum: int, frame: Any) -> None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)

        previous = signal.signal(signal.SIGTERM, forward)
    try:
        try:
            code = process.wait()
        except KeyboardInterrupt:
            code = process.wait() or 130
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    return exit_code(code)


def killed_by(returncode: int) -> str:
    """What a negative ``returncode`` (``subprocess``'s -N) says: ``the program was killed by SIGKILL (signal 9)``."""
    number = -returncode
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    else:
        name = f"{name} (signal {number})"
    return f"the program was killed by {name}"
