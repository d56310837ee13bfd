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

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)


SI_KERNEL = 0x80
"""``si_code`` of a signal the kernel sent: the terminal's Ctrl-C, sent to its whole foreground process group."""


PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
"""The signals ``wait`` passes on to the child, unless the terminal sent them (to the whole group)."""


def wait(process: subprocess.Popen[bytes] | Forked, *, forward_sigterm: bool = True) -> int:
    """Wait for ``process`` and return its exit code (``exit_code``).

    - A Ctrl-C from the terminal reaches the child as well (one process group): it is waited for, so that it can
      complete what it writes, and ends with 130 unless it chose a code of its own.
    - A SIGINT sent to this process alone (``kill -INT`` of its pid, ``Popen.send_signal``) is passed on to the
      child, then waited for the same way.
    - A SIGTERM (a scheduler's, or ``kill`` of this pid) is passed on to the child, which completes its profile
      at it: this process then reads what the child wrote, and its exit code says the child ended by the signal.
    - A SIGHUP (the terminal closed) or SIGQUIT (Ctrl-\\) is passed on the same way where the terminal did not
      send it to the child too; a child that dies of it leaves its store to be salvaged (``xstack.salvage``).

    Neither is passed on where the child is a tracer running the program (``forward_sigterm`` false: strace,
    ncu), which would stop tracing it and leave it running. Only the main thread can wait for signals; in
    another, a Ctrl-C is waited through, as in the first case, and nothing is passed on."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "sigtimedwait"):
        try:
            return exit_code(process.wait())
        except KeyboardInterrupt:
            return exit_code(process.wait() or 130)
    watched = {signal.SIGINT, signal.SIGCHLD} | (set(PASSED_ON) if forward_sigterm else set())
    before = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    interrupted = False
    try:
        while (code := process.poll()) is None:
            info = signal.sigtimedwait(watched, 0.25)  # SIGCHLD wakes it when the child ends
            if info is not None:
                interrupted |= _pass_on(process, info, forward_sigterm)
        while (info := signal.sigtimedwait(watched, 0)) is not None:  # not to be raised here once unblocked
            interrupted |= info.si_signo == signal.SIGINT
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
    return exit_code(code or (130 if interrupted else 0))


def _pass_on(process: subprocess.Popen[bytes] | Forked, info: Any, forward: bool) -> bool:
    """Pass the signal ``info`` on to ``process`` where ``wait`` says; returns whether it was a SIGINT."""
    signo = info.si_signo
    from_terminal = signo != signal.SIGTERM and info.si_code == SI_KERNEL  # the child has its own copy
    if forward and signo in PASSED_ON and not from_terminal:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signo)
    return bool(signo == signal.SIGINT)


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
