"""Waiting for the program restarted under a tracer (the io library, strace, ncu) or for a pass of a leveled
measurement, and passing its exit status on as a shell would."""

from __future__ import annotations

import signal
import subprocess


def exit_code(returncode: int) -> int:
    """The exit code for a child's ``returncode``: its own, or 128 + N for one killed by signal N (``subprocess``
    gives -N), as a shell reports it (137 for SIGKILL, the out-of-memory killer's), so that the caller's code is
    what running the program without xstack would have given, not -N taken modulo 256 (247 for SIGKILL)."""
    return 128 - returncode if returncode < 0 else returncode


def wait(process: subprocess.Popen[bytes]) -> int:
    """Wait for ``process`` and return its exit code (``exit_code``). A Ctrl-C reaches it as well (one process
    group): it is waited for again, so that it can complete what it writes, and ends with 130 unless it chose a
    code of its own."""
    try:
        code = process.wait()
    except KeyboardInterrupt:
        code = process.wait() or 130
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
