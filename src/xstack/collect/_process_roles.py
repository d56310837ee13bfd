"""The roles of the profiled program's child processes that are not its workers (``A.IO_PROCESS_ROLE``,
``config.system.process_roles``), told by their ancestry and command lines. One rule for the system level
(``system.Sampler``: the ``Record`` its sampler read of each descendant when it first saw it) and the io
level (``_io_classes.process_roles``: a ``Record`` made of the images each process recorded), so that the two
levels give a process the same role.

The system level's records are read at first sight, not as the sampler stops: a helper may have ended by then
(a resource tracker stopped, a forkserver of an earlier DataLoader), and ``/proc`` no longer tells it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_HELPERS = re.compile(r"\bfrom multiprocessing\.(resource_tracker|semaphore_tracker|forkserver) import main\b")
"""The code ``multiprocessing`` starts its helper processes with (``python -c CODE``): the resource tracker (the
semaphore tracker before Python 3.8) and the forkserver."""

_SPAWNED_WORKER = "--multiprocessing-fork"
"""The argument ``multiprocessing`` starts a worker with in spawn mode (``python -c 'from multiprocessing.spawn
import spawn_main; ...' --multiprocessing-fork``)."""

SUBPROCESS = "subprocess"

Record = tuple[int, int, list[str], bool]
"""What is known of a descendant of the profiled program: ``(pid, parent pid, command line, inherited)`` (0:
parent unknown; an empty command line: unreadable; ``inherited``: forked from that parent, not exec'd since)."""


def process_roles(records: Iterable[Record], root_argv: list[str]) -> dict[int, str]:
    """The descendants that are not the program's workers, by pid, from a ``Record`` of each (the profiled
    program, the root of the tree, has none: a process whose parent is it counts as one whose parent is unknown):

    - ``subprocess``: a program started by exec (``subprocess.run``, ``os.system``: a shell, ``cat``, another
      Python, a copy of the program itself: a command line or a stack of its own, not ``inherited``), other
      than a helper or a worker ``multiprocessing`` spawned; and every process whose parent, or a nearer
      ancestor recorded, is a subprocess, whatever its command line (its DataLoader workers, its ``os.fork``
      children, its spawned workers, its own helpers): they are that program's processes, not the profiled one's;
    - the helpers of ``multiprocessing`` (``resource_tracker``, ``forkserver``): their command line runs a
      helper's code. A process forked from one (a worker the forkserver forked) is a worker.

    A process forked from the profiled program or from one of its workers (a DataLoader worker) is a worker.
    Where the parent is unknown (it ended before its child was seen, which then went to another parent), the
    command line alone tells: one ``inherited`` from a subprocess's command line other than the profiled
    program's (``root_argv``) is a subprocess. An unreadable command line gives no role of its own."""
    seen = {pid: (ppid, argv, inherited) for pid, ppid, argv, inherited in records}
    own = {pid: role for pid, (_, argv, inherited) in seen.items() if argv and not inherited
           and (role := helper_role(argv) or (None if spawned_worker(argv) else SUBPROCESS))}  # fmt: skip
    execd = {tuple(seen[pid][1]) for pid, role in own.items() if role == SUBPROCESS} - {tuple(root_argv)}
    roles: dict[int, str | None] = {}
    for first in seen:
        chain, at = [], first  # ``first`` and its ancestors not yet told, up to one told or not seen
        while at in seen and at not in roles and at not in chain:  # a pid met twice (reused) ends it
            chain.append(at)
            at = seen[at][0]
        above = roles.get(at)
        for pid in reversed(chain):
            ppid, argv, inherited = seen[pid]
            if above == SUBPROCESS:
                roles[pid] = above
            elif ppid in seen:
                roles[pid] = own.get(pid)
            else:  # the parent unknown (or the program itself): the command line alone
                roles[pid] = own.get(pid) or (SUBPROCESS if inherited and tuple(argv) in execd else None)
            above = roles[pid]
    return {pid: role for pid, role in roles.items() if role}


def spawned_worker(argv: list[str]) -> bool:
    """True where the command line ``argv`` is a worker ``multiprocessing`` started in spawn mode: exec'd, yet
    one of the program's workers (or of the subprocess that started it), not a subprocess of its own."""
    return _SPAWNED_WORKER in argv


def helper_role(argv: list[str]) -> str | None:
    """``forkserver`` or ``resource_tracker`` where the command line ``argv`` runs a helper's code (``python -c
    CODE``), else None. A process forked from a helper has its command line too: the caller tells them apart."""
    code = next((argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "-c"), "")
    found = _HELPERS.search(code)
    if not found:
        return None
    return "forkserver" if found.group(1) == "forkserver" else "resource_tracker"
