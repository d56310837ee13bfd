"""The rule on the loop's own work: the time of the measured iterations that no model stage covers."""

from __future__ import annotations

import re
from typing import Any, Final

from xstack.analyze._io_common import CHECKPOINT_NAME
from xstack.analyze._io_loop import MOST_OF
from xstack.analyze._model_long import NO_STAGE, long_text
from xstack.analyze._recommend_common import Results, at_stake, get, main_io_off_the_path, num, severity
from xstack.analyze._recommend_input import holding_up
from xstack.analyze.pipeline import ImpactPer, Recommendation
from xstack.analyze.result import format_ns, format_value
from xstack.text import counted

UNSTAGED_MIN_NS: Final = 1_000_000
"""Time in no stage per iteration (the whole of it, in a run without iterations) under which the rule stays
silent: the profiler's own bookkeeping between stages (about 10 us a stage, 12 us a step) and a few statements
of glue are then a large share of a short step, and nothing worth moving."""
UNSTAGED_PCT: Final = 20.0
"""Share of the measured iterations during which no model stage ran, from which the loop's own work between
its stages is worth finding (an unmarked training loop's forward, backward, optimizer step and DataLoader waits
leave a few percent: zeroing gradients, the loss's bookkeeping)."""


def work_outside_stages(results: Results) -> Recommendation | None:
    """``UNSTAGED_PCT`` or more of the measured iterations ran in no model stage (``model.stages``' fact
    ``unstaged_pct``), in a run where some stage ran: the loop's own Python between the model's calls (preparing
    batches by hand, metrics, logging, host copies) is a large part of the step, and no level names it. Silent on
    a run that used a GPU: there the host's time between the stages is mostly waiting for the device at a
    synchronisation (``.item()``, ``.cpu()``), asynchronous launches returning early, which the device timeline's
    rules weigh (host-bound, syncs in the loop) with the kernels' times, not this one."""
    s = get(results, "model.stages")
    if s is None or not num(s.facts, "staged_ns") or s.facts.get("gpu"):
        return None  # no stage at all (an imported trace's iterations alone): nothing tells the loop's work apart
    pct, unstaged = num(s.facts, "unstaged_pct") or 0.0, num(s.facts, "unstaged_ns") or 0.0
    if pct < UNSTAGED_PCT:
        return None
    impact, per = at_stake(results, unstaged)
    if (impact or 0) < UNSTAGED_MIN_NS:
        return None
    where = "the merged step" if s.facts.get("merged") else "the measured iterations"
    if s.facts.get("unstaged_of") == "stages":  # a run without iterations: from its first stage to its last
        where = "the time from the first stage's start to the last one's end"
    each = f", {format_ns(impact)} per iteration" if impact and per == "iteration" and not s.facts.get("merged") else ""
    if s.facts.get("unstaged_pass"):  # a merged run's: the median of its model pass's iterations
        each = f", the median of pass {s.facts['unstaged_pass']}'s iterations"
    evidence = [
        f"{pct:.1f}% of {where} ({format_ns(unstaged)}{each}) ran in no stage: in no forward, backward, optimizer "
        "step, gradient clipping, DataLoader wait or span of yours (model.stages)"
    ]
    ops = s.facts.get("unstaged_ops") or []
    if ops:  # the op level was recorded: the operators the loop ran between its stages
        evidence.append(_ops_line(ops, num(s.facts, "unstaged_ops_ns") or 0.0, unstaged))
    io_line, io_action, io_leads = _file_io(results, impact, per)
    by_threads = False  # the main process's other threads did that I/O: a pool that reads the batch
    if io_line is None:
        io_line, io_action, io_leads = _thread_io(results, impact if per == "iteration" else None)
        by_threads = io_line is not None
    if io_line:
        evidence.append(io_line)
    program_line, program_action, program_leads = _programs(results, impact, per)
    if program_line:
        evidence.append(program_line)
    if (ranks_line := holding_up(results)) is not None:  # the job's other ranks wait for this one's own work
        evidence.append(ranks_line)
    fed_line = _fed_by_processes(results, per)
    if fed_line:
        evidence.append(fed_line)
    names = [str(o["op"]) for o in ops]
    known: dict[str, tuple[str, list[str]]] = {}
    for pattern, what, span in TRAINING_OPS:
        if found := [n for n in names if pattern.search(n)]:
            known[span] = (what, found)
    if "clip" in known and CLIP_SCALE in names:  # clip_grad_norm_ scales the gradients by its coefficient
        known["clip"][1].append(CLIP_SCALE)
    seen = {n for _, found in known.values() for n in found}
    other = next((n for n in names if n not in seen), None)
    if other is not None:
        longest = "the longest of the other PyTorch operators" if known else "the longest of the PyTorch operators"
        see = f"and find the code that calls {other}, {longest} that run there"
    elif ops and (num(s.facts, "unstaged_ops_ns") or 0.0) * 2 < unstaged:  # most of it ran no operator
        see = "and find the code that runs no PyTorch operator there (the loop's own Python, or a wait)"
    elif ops:
        see = "beyond the training work named below"
    else:
        see = "or record the op level (--levels model,layer,op) to see the PyTorch operators that run there"
    action = (
        "Find what the loop does between its stages: wrap its parts in xstack.span('name') (preparing the batch, "
        f"metrics, logging) {see}."
    )
    for span, (what, found) in known.items():
        action += (f" {' and '.join(found)} {'is' if len(found) == 1 else 'are'} {what}: training work, which "
                   f"belongs in the step; xstack.span('{span}') around {'it' if len(found) == 1 else 'them'} names "
                   "it as a stage.")  # fmt: skip
    if program_leads:  # programs started in the loop are most of the time in no stage: that first
        action = f"{program_action.strip()}{io_action} For the rest of that time: {action[0].lower()}{action[1:]}"
    elif io_leads:  # the file I/O is most of the time in no stage: that first, then how to find the rest
        action = f"{io_action.strip()}{program_action} For the rest of that time: {action[0].lower()}{action[1:]}"
    elif fed_line:  # its data comes from other processes already: what they hand it, and its wait for them
        action += FED_BY_PROCESSES + io_action + program_action
    elif by_threads:  # its threads prepare the batch: the advice on them says where else to, and at what cost
        action += " Then compute metrics and log every N steps." + io_action + program_action
    else:
        action += (
            " Then move the batch's preparation into DataLoader workers (the Dataset's __getitem__ or a collate_fn), "
            "where it overlaps the step, and compute metrics and log every N steps."
        )
        action += io_action + program_action
    return Recommendation(
        "work_outside_stages",
        f"The loop spends much of its {'step' if per == 'iteration' else 'time'} outside every model stage",
        severity(pct),
        evidence,
        [
            "model.stages",
            *(["io.input_bound"] if io_line or program_line or fed_line else []),
            *(["model.ranks"] if ranks_line else []),
        ],
        action,
        impact_ns=impact,
        impact_per=per,
    )


FED_BY_PROCESSES: Final = (
    " Its data comes from other processes already: wrap its wait for them in xstack.span('data') to see how much of "
    "that time is waiting, and where it gathers their items into batches one by one, have each of their tasks return "
    "a whole batch, ready for the model (a loop that took 64 small .npy files a step from Pool.imap and stacked them "
    "stepped in 4.2 ms; with one batch per task, in 2.6 ms)."
)
"""What ``work_outside_stages`` advises a loop fed by other processes than DataLoader workers (``_fed_by_processes``)
instead of moving its batch's preparation into DataLoader workers."""


def _fed_by_processes(results: Results, per: ImpactPer) -> str | None:
    """Where no DataLoader ran in the measured iterations (``io.input_bound``'s ``dataloader_waits`` false) and
    other processes read the data files in them (``worker_data_opens_per_iteration``: a ``multiprocessing.Pool``'s,
    a producer's feeding a queue), while the main process's own file I/O was under the input-bound threshold of
    the loop's time (``main_io_off_the_path``, as ``small_files`` judges such a loop): the evidence line, with their
    time on and waiting for a CPU; else None. The loop's time in no stage
    then holds its waits for their results and its own work on them: a loop fed by ``Pool.imap`` was told to move
    its batch's preparation into DataLoader workers, which the pool's processes already were."""
    io = get(results, "io.input_bound")
    facts = io.facts if io is not None else {}
    processes, opens = int(num(facts, "workers") or 0), num(facts, "worker_data_opens_per_iteration") or 0.0
    loop = num(facts, "loop_ns")
    if per != "iteration" or facts.get("dataloader_waits") is not False or not processes or not opens or not loop:
        return None
    if (own := main_io_off_the_path(facts, loop)) is None:  # the main process reads or writes on the steps' path
        return None
    iterations = int(num(facts, "iterations") or 0)
    main = (f"spent {format_ns(own / iterations)} per iteration in file I/O itself" if own and iterations
            else "read none")  # fmt: skip
    cpu, delay = num(facts, "worker_cpu_pct"), num(facts, "worker_run_delay_pct")
    cpus = (f"; they ran on a CPU {cpu:.0f}% of their lives and waited for one {delay:.0f}%"
            if cpu is not None and delay is not None else "")  # fmt: skip
    path = facts.get("worker_data_path")
    among = f", {path} among them" if path else ""
    return (f"no DataLoader ran: {counted(processes, 'other process', 'other processes')} opened the data files, "
            f"{opens:,.1f} a measured iteration{among}, while the main process {main}{cpus}: the loop can wait "
            "for their results only between its stages (io.input_bound)")  # fmt: skip


UNSTAGED_IO_SHARE: Final = 0.1
"""Share of the time in no stage per iteration from which the main process's file I/O there is named."""
OCCASIONAL_SHARE: Final = 0.5
"""Share of the measured iterations that hold ``MOST_OF`` the main process's file I/O in no stage, at most, for
that I/O to be said to run in some iterations only (a checkpoint every N steps), not in every one."""
SAVE_OFF_THE_STEP: Final = (
    " Saving checkpoints between the stages puts their writing on the step's path: save less often, or off the "
    "loop's critical path: copy the state to CPU memory and write it from a background thread or process "
    "(torch.distributed.checkpoint's async_save does both)."
)
BETWEEN_SAID: Final = 0.1
"""Share of the file-call time of the files written or read between the stages (of the checkpoints' where they are
most of it) from which the time the program spent between those calls (serialising, encoding, decoding) is said,
with the files' time from open to close; it counts however small."""
OPEN_FACTS: Final = {"write": "main_io_unstaged_written_open_ns", "read": "main_io_unstaged_read_open_ns"}
"""``io.input_bound``'s fact of the time files were open outside every stage, by the kind of the loop's I/O there."""
IO_LEADS: Final = 0.5
"""Share of the time in no stage per iteration from which the main process's file I/O there leads the advice."""
CHECKPOINT_SHARE: Final = 0.5
"""Share of the main process's file I/O in no stage on files named as checkpoints from which the advice is about
saving them."""


def _file_io(results: Results, unstaged_ns: int | None, per: ImpactPer) -> tuple[str | None, str, bool]:
    """Where the io level saw the main process's file I/O outside every stage take ``UNSTAGED_IO_SHARE`` or more of
    the time in no stage (``unstaged_ns``, per iteration, or ``per`` run in a run without iterations, between its
    first stage and its last; ``io.input_bound``'s ``main_io_unstaged_*`` facts): the evidence line, what to add
    to the advice, and whether it is ``IO_LEADS`` of that time or more, so that the advice starts with it; else
    (None, "", False). Where ``MOST_OF`` it ran in ``OCCASIONAL_SHARE`` of the measured iterations or fewer, it
    says so; where ``CHECKPOINT_SHARE`` of it or more was on files named as checkpoints, it advises on saving
    them. Where that I/O is mostly writing or mostly reading, the files' time from open to close beyond their
    calls counts too (``main_io_unstaged_written_open_ns``, ``main_io_unstaged_checkpoint_save_ns`` for
    checkpoints, ``main_io_unstaged_read_open_ns``: the state pickled, the zip format's CRC, an image encoded or
    decoded), said where it is ``BETWEEN_SAID`` of the calls' or more."""
    io = get(results, "io.input_bound")
    facts = io.facts if io is not None else {}
    each = " per iteration" if per == "iteration" else ""
    ns = num(facts, "main_io_unstaged_ns" if each else "main_io_unstaged_total_ns")
    path, kind = facts.get("main_io_unstaged_path"), facts.get("main_io_unstaged_kind")
    total = num(facts, "main_io_unstaged_total_ns") or 0.0
    saves, ckpt_ns = int(num(facts, "main_io_unstaged_checkpoints") or 0), num(facts, "main_io_unstaged_checkpoint_ns")
    checkpoints = bool(saves and ckpt_ns and total and ckpt_ns >= CHECKPOINT_SHARE * total)
    scale = (ns or 0.0) / total if total else 0.0  # from the facts' totals to ns's: per iteration or all of it
    # what the program does between a file's calls (a save's pickling and CRC, an image's encoding or decoding) is
    # part of writing or reading it: the files' time from open to close, beyond their calls' (all the calls: a
    # lower bound)
    opened = "main_io_unstaged_checkpoint_save_ns" if checkpoints else OPEN_FACTS.get(str(kind))
    held_ns = scale * (num(facts, opened) or 0.0) if opened else 0.0
    between = max(0.0, held_ns - ((ckpt_ns or 0.0) * scale if checkpoints else ns or 0.0))
    if not unstaged_ns or not ns or not path or ns + between < UNSTAGED_IO_SHARE * unstaged_ns:
        return None, "", False
    leads = ns + between >= IO_LEADS * unstaged_ns
    several = (saves if checkpoints else int(num(facts, "main_io_unstaged_files") or 0)) > 1
    took = (f", which took {format_ns(held_ns)}{each} from {'each' if several else 'the'} file's open to its close, "
            f"{'serialising' if checkpoints else 'what the program did between its calls'} included"
            if between and between >= BETWEEN_SAID * (held_ns - between) else "")  # fmt: skip
    doing = {"write": "writing", "read": "reading"}.get(str(kind), "opening and closing")
    name = str(path).rsplit("/", 1)[-1]
    iterations, held = int(num(facts, "iterations") or 0), int(num(facts, "main_io_unstaged_iterations") or 0)
    occasional = 0 < held <= OCCASIONAL_SHARE * iterations
    where = (f", {MOST_OF:.0%} of it in {held:,} of the {iterations:,} measured iterations" if occasional
             else "")  # fmt: skip
    if checkpoints and ckpt_ns:  # checkpoints saved between the stages
        size = format_value((num(facts, "main_io_unstaged_checkpoint_bytes") or 0) / saves, "bytes")
        files = f"{saves:,} checkpoint saves, {size} each on average, {name} among them" if saves > 1 else (
            f"the save of the checkpoint {name}, {size}")  # fmt: skip
        line = (f"the main process's file I/O took {format_ns(ns)} of it{each}{where}; "
                f"{min(100.0, 100.0 * ckpt_ns / total):.0f}% of it in {files}{took} (io.input_bound)")  # fmt: skip
        return line, SAVE_OFF_THE_STEP if each else SAVE_OFF_THE_STEP.replace("step's", "loop's"), leads
    count = int(num(facts, "main_io_unstaged_files") or 0)
    files = f"{count:,} files ({path} the longest)" if count > 1 else str(path)
    line = (f"the main process's file I/O took {format_ns(ns)} of it{each}{where}, most of it {doing} {files}{took} "
            "(io.input_bound)")  # fmt: skip
    them = "them" if count > 1 else "it"
    if kind == "read":
        then = f"read {them} once, before the loop, or in DataLoader workers"
    elif kind == "write" and count > max(iterations, 1):  # outputs, an item each: fewer files, or a thread
        then = (f"write {them} into fewer, larger files (a .npy or .npz per batch, a tar shard), or from a "
                "background thread (a queue that one thread drains)")  # fmt: skip
    elif occasional or not each:
        then = "do it less often, or from a background thread"
    else:
        then = "do it every N steps, or from a background thread"
    what = f"{count:,} files" if count > 1 else name
    path_of = "step's" if each else "loop's"
    return line, f" {doing.capitalize()} {what} between the stages puts file I/O on the {path_of} path: {then}.", leads


BUILT_IN_LOOP: Final = (
    "code is built in the measured iterations, as torch.compile does when it compiles again (TORCH_LOGS=recompiles "
    "says why: a new shape, dtype or Python value the graph depends on, such as a last batch of another size; "
    "mark_dynamic, fixed shapes or DataLoader(drop_last=True) avoid it), or a C++ or CUDA extension built in the loop: "
    "build it once, before the loop."
)
"""What the rules say of compilers and linkers started in the measured iterations, or of a compiler's cache written
in them."""
COMPILE_CACHE: Final = r"torchinductor|/triton/|\.triton/|torch_extensions"
"""A path written in the loop that is a compiler's cache (torch.compile's Inductor and Triton, a C++ extension's build
folder): code built there, not the program's files."""

PROGRAMS_NAMED: Final = 3
"""Programs named in the evidence of programs started in the loop, the most started first."""


def _programs(results: Results, unstaged_ns: int | None, per: ImpactPer) -> tuple[str | None, str, bool]:
    """Where the main process started programs by exec in the measured iterations (``io.input_bound``'s
    ``loop_program*`` facts) whose lifetimes are ``UNSTAGED_IO_SHARE`` or more of the time in no stage per
    iteration (``unstaged_ns``): the evidence line, what to add to the advice and whether they are ``IO_LEADS`` of
    that time or more; else (None, "", False). A program run with ``subprocess.run`` or ``os.system`` is waited for
    between the stages; one left running (``Popen``) is not, and the line says how long they lived, not that the
    loop waited."""
    io = get(results, "io.input_bound")
    facts = io.facts if io is not None else {}
    started, names = int(num(facts, "loop_programs") or 0), facts.get("loop_program_names")
    iterations = int(num(facts, "iterations") or 0)
    lived = num(facts, "loop_program_lived_ns") or 0.0
    ran = num(facts, "loop_program_ns") or 0.0  # some of them running: those side by side counted once
    if per != "iteration" or not unstaged_ns or not started or not iterations or not isinstance(names, dict):
        return None, "", False
    each = ran / iterations
    if each < UNSTAGED_IO_SHARE * unstaged_ns:
        return None, "", False
    named = ", ".join(f"{name} {counted(int(n), 'time')}" for name, n in list(names.items())[:PROGRAMS_NAMED])
    if len(names) > PROGRAMS_NAMED:
        named += f", {counted(len(names) - PROGRAMS_NAMED, 'other')}"
    held = int(num(facts, "loop_program_iterations") or 0)
    loop = num(facts, "loop_ns")  # the measured iterations' time: the programs may run inside a stage too
    share = f", {min(100.0, 100.0 * each * iterations / loop):.0f}% of the iterations' time" if loop else ""
    line = (f"the main process started {counted(started, 'program')} by exec in {held:,} of the {iterations:,} "
            f"measured iterations ({named}), which ran at least {format_ns(lived / started)} each (from when the io "
            f"level saw them start to their exit), one or more of them running for {format_ns(each)} per iteration"
            f"{share} (io.input_bound)")  # fmt: skip
    first = next(iter(names))
    if 2 * int(num(facts, "loop_program_builds") or 0) >= started:  # compilers and linkers: code built in the loop
        built = f" The programs are mostly compilers and linkers ({first}): {BUILT_IN_LOOP}"
        return line, built, each >= IO_LEADS * unstaged_ns
    action = (f" Starting a program such as {first} in the loop costs a fork, an exec and the program's start-up "
              "each time, and subprocess.run and os.system wait for it to end: do its work in the process itself "
              "(Python's own file calls instead of cat or cp, a library such as pynvml instead of nvidia-smi), or "
              "start it once, before the loop, and keep it running, or run it every N steps.")  # fmt: skip
    return line, action, each >= IO_LEADS * unstaged_ns


MANY_FILES: Final = 2
"""Files per measured iteration, at least, that the main process's other threads read for the advice to be about
the files' number: each one's open, parsing and close run in Python, under the loop's GIL."""
THREADS_READ_MANY: Final = (
    " The threads read {files} files per iteration while the loop waits for them, and each costs an open, its "
    "parsing and a close in Python, under the GIL the loop needs too: pack them into fewer, larger files (a .npy "
    "per batch, one array loaded once, tar shards), which takes that cost away (a pool of 2 threads loading 64 small "
    ".npy files a batch took a step from 4.2 ms to 0.5 ms with a .npy per batch), or read them in DataLoader "
    "workers, processes that do not share the loop's GIL, where the machine has CPUs for them beside the loop's "
    "(with 2 CPUs, 2 workers made that step 5.7 ms)."
)
"""The advice to a loop that waits on its threads' reads of many files (``MANY_FILES`` per iteration or more)."""
THREADS_READ: Final = (
    " Threads that read while the loop waits for them put the reading on the step's path: read in DataLoader workers "
    "(a Dataset whose __getitem__ reads and decodes, num_workers > 0), processes that read ahead of the loop without "
    "sharing its GIL. Reading the next batch in threads while this one computes helps only where the reads wait on "
    "storage, not on Python (decoding, small files)."
)
"""The advice to a loop that waits on its threads' reads of a few files per iteration."""
THREADS_OTHER: Final = (
    " Threads {doing} files while the loop waits for them put that I/O on the step's path: let it overlap the steps "
    "(do not wait for it in the loop), or do it every N steps."
)
"""The advice to a loop that waits on its threads' writes (``{doing}``: Writing, Opening and closing)."""


def _thread_io(results: Results, unstaged_ns: int | None) -> tuple[str | None, str, bool]:
    """``_file_io`` of the main process's other threads (``io.input_bound``'s ``thread_io_*`` facts): a thread
    pool that reads the batch while the loop waits for its results, between the stages. Their files' time from
    open to close counts as the main thread's does (``numpy.load`` parses a header between its reads: a pool of 2
    threads loading 64 small .npy files a batch had files open during 77% of the loop's time in no stage, its
    calls under way during 9%). ``unstaged_ns``: the time in no stage per iteration (None in a run without
    iterations, whose other threads are not weighed)."""
    io = get(results, "io.input_bound")
    facts = io.facts if io is not None else {}
    ns, path, kind = num(facts, "thread_io_unstaged_ns"), facts.get("thread_io_path"), facts.get("thread_io_kind")
    opened = num(facts, "thread_io_open_ns") or 0.0
    between = max(0.0, opened - (ns or 0.0))
    if not unstaged_ns or not ns or not path or ns + between < UNSTAGED_IO_SHARE * unstaged_ns:
        return None, "", False
    threads, files = int(num(facts, "thread_io_threads") or 0), int(num(facts, "thread_io_files") or 0)
    doing = {"write": "writing", "read": "reading"}.get(str(kind), "opening and closing")
    which = f"{files:,} files such as {path}" if files > 1 else str(path)
    held = (f"; they had {'the file' if files == 1 else 'those files'} open during {format_ns(opened)} of it, from "
            "each open to its close, what they did between the calls (decoding, parsing) included"
            if between >= BETWEEN_SAID * ns else "")  # fmt: skip
    line = (f"{counted(threads, 'other thread')} of the main process did file I/O during {format_ns(ns)} of it per "
            f"iteration, while no stage ran, most of it {doing} {which}{held} (io.input_bound)")  # fmt: skip
    leads = ns + between >= IO_LEADS * unstaged_ns
    iterations = int(num(facts, "iterations") or 0)
    if kind == "read" and iterations and files >= MANY_FILES * iterations:  # files a batch: each costs Python
        return line, THREADS_READ_MANY.format(files=f"{files / iterations:,.0f}"), leads
    if kind == "read":
        return line, THREADS_READ, leads
    return line, THREADS_OTHER.format(doing=doing.capitalize()), leads


TRAINING_OPS: Final = (
    (re.compile(r"loss|cross_entropy|kl_div"), "the loss, computed outside the model's forward", "loss"),
    (re.compile(r"^aten::_foreach_norm$"), "gradient clipping (clip_grad_norm_)", "clip"),
)
"""Operators that a training loop runs outside every stage as part of training (pattern on the name, what it
is, a name for its span): not work to move into DataLoader workers."""
CLIP_SCALE: Final = "aten::_foreach_mul_"
"""The operator by which clip_grad_norm_ scales the gradients, its own only beside its norm (an EMA of the
weights runs it too)."""


def _ops_line(ops: list[dict[str, Any]], ops_ns: float, unstaged_ns: float) -> str:
    """The operators that ran in no stage (``ops_ns`` in all, the longest ``ops``), and, where they took under
    half of the time in no stage, that the rest ran none."""
    named = ", ".join(f"{o['op']} {format_ns(o['ns'])} ({counted(o['calls'], 'call')})" for o in ops)
    line = f"PyTorch operators outside every stage took {format_ns(ops_ns)} of it: {named}"
    if ops_ns * 2 < unstaged_ns:
        line += (f"; the other {format_ns(unstaged_ns - ops_ns)} ran none: the loop's own Python, or waiting (file "
                 "I/O, a sleep, a lock)")  # fmt: skip
    return f"{line} (model.stages)"


LONG_PCT: Final = 5.0
"""Share of the measured iterations' time that their long iterations take beyond the median one
(``model.long_iterations``' fact ``extra_pct``) from which the long-iterations rule speaks."""
EVALUATE_LESS: Final = (
    "Evaluate less often or on fewer batches (a Hugging Face Trainer: a larger eval_steps, a smaller eval_dataset), "
    "or in another process from a copy of the weights."
)
NEW_LOADERS: Final = (
    "A DataLoader made anew starts its workers each time: make it once and iterate it again, with "
    "persistent_workers=True (a Hugging Face Trainer: dataloader_persistent_workers=True)."
)
EVALUATION_SHARE: Final = 0.25
"""Share of the long iterations' extra time, their DataLoader waits set apart, that their forward passes without
backward must take for the rule to advise on the evaluation."""
NAMED_STAGES: Final = 4
"""The stages that the long-iterations rule names, the most extra time first."""


OTHER_THREADS_PCT: Final = 50.0
"""The share of the bytes the main process wrote in the long iterations that its threads other than the loop's must
write for the advice to be about that thread."""
OTHER_THREADS: Final = (
    "Those files are written by another thread of the main process, not the loop's (a writer thread, such as "
    "TensorBoard's SummaryWriter's, or a logging handler's): already off the loop's thread, the writing still takes a "
    "CPU and Python's GIL from it, and the loop's own stages run slower in these iterations. Record less (fewer "
    "add_scalar and add_histogram calls, every N steps), or write from another process."
)
"""The advice on long iterations whose writes are mostly another thread's (TensorBoard's writer thread, which
reopens its event file for each record: 625 opens in a 300-step loop whose 35 long iterations ran their backward and
forward slower)."""


def _built(results: Results, written: str) -> str | None:
    """Where code was built in the measured iterations: compilers and linkers started by exec in them, most of the
    programs the main process started there (``io.input_bound``'s ``loop_program*`` facts), or the file the long
    iterations wrote most to in a compiler's cache (``COMPILE_CACHE``, ``written``): the evidence line; else None."""
    io = get(results, "io.input_bound")
    facts = io.facts if io is not None else {}
    started, builds = int(num(facts, "loop_programs") or 0), int(num(facts, "loop_program_builds") or 0)
    names = facts.get("loop_program_names")
    if started and 2 * builds >= started and isinstance(names, dict):
        named = ", ".join(f"{name} {counted(int(n), 'time')}" for name, n in list(names.items())[:PROGRAMS_NAMED])
        return (f"the main process started {counted(started, 'program')} by exec in the measured iterations, "
                f"compilers and linkers ({named}): code built in the loop (io.input_bound)")  # fmt: skip
    if written and re.search(COMPILE_CACHE, written.lower()):
        return (
            f"the file they wrote most to, {written}, is in a compiler's cache: code built in the loop "
            "(model.long_iterations)"
        )
    return None


def long_iterations(results: Results) -> Recommendation | None:
    """A few measured iterations of a live run take far longer than the usual one (``model.long_iterations``)
    and hold ``LONG_PCT`` or more of the measured time beyond the median, their DataLoader waits set apart (the
    input-bound rule weighs those), with work to show for it: they come every Nth iteration, or run more forward
    passes (an evaluation), start DataLoaders, or write files (a checkpoint). Iterations long for no such reason
    (a busy machine's) are the loop's spread: no advice."""
    r = get(results, "model.long_iterations")
    if r is None or not r.available or not r.facts.get("long"):
        return None
    f = r.facts
    stages = [s for s in f.get("stages") or [] if isinstance(s, dict)]
    long = int(f["long"])
    # the DataLoader's waits in them are the input-bound rule's to weigh: this one speaks of the rest
    beyond = sum(float(s.get("extra_ns") or 0) for s in stages)
    waits = sum(float(s.get("extra_ns") or 0) for s in stages if s.get("kind") == "dataloader")
    whole = num(f, "extra_pct") or 0.0
    pct = whole * (beyond - waits) / beyond if beyond > 0 else 0.0
    more_calls = any((s.get("extra_calls") or 0) >= long for s in stages
                     if s.get("name") != NO_STAGE and s.get("kind") != "dataloader")  # fmt: skip
    writes = int(f.get("writes_bytes") or 0)
    if pct < LONG_PCT or not (f.get("every") or f.get("evaluation") or f.get("new_loaders") or writes or more_calls):
        return None
    work_ns = (num(f, "per_iteration_ns") or 0) * (beyond - waits) / beyond
    verb = "takes" if long == 1 else "take"
    evidence = [
        f"{long:,} of the {int(f['iterations']):,} measured iterations, {long_text(f)}, {verb} "
        f"{num(f, 'ratio') or 0:.1f}x the median iteration "
        f"({format_ns(num(f, 'median_ns') or 0)}){' on average' if long > 1 else ''}: "
        f"{format_ns(num(f, 'extra_ns') or 0)} beyond it in all, {whole:.1f}% of the measured iterations' time, "
        f"{format_ns(num(f, 'per_iteration_ns') or 0)} per iteration (model.long_iterations)"
    ]
    if waits >= 0.05 * beyond:  # say what is left once the waits for data are set apart
        evidence[0] = evidence[0].removesuffix(" (model.long_iterations)") + (
            f"; {format_ns(waits)} of it waiting for the DataLoader, which the input-bound advice weighs, and "
            f"{format_ns(beyond - waits)} ({pct:.1f}%, {format_ns(work_ns)} per iteration) in the rest "
            "(model.long_iterations)")  # fmt: skip
    parts = []
    for s in stages[:NAMED_STAGES]:
        name, kind, calls = str(s.get("name")), str(s.get("kind") or ""), float(s.get("extra_calls") or 0)
        shown = kind and kind != "dataloader" and kind not in name.lower()  # BertModel (forward), backward
        what = "time in no stage" if name == NO_STAGE else f"{name} ({kind})" if shown else name
        part = f"{what} {format_ns(s.get('extra_ns') or 0)}"
        if calls >= 1:
            part += f", {counted(round(calls), 'more wait' if name == 'dataloader.next' else 'more call')}"
        if kind == "forward" and f.get("evaluation") and calls >= 1:
            part += " and no more backward: an evaluation"
        if name == "dataloader.iter" and f.get("new_loaders"):
            part += ": DataLoaders started, their workers with them"
        parts.append(part)
    if parts:
        evidence.append(f"beyond a usual iteration, they spend: {'; '.join(parts)} (model.long_iterations)")
    threads = (num(f, "writes_other_threads_pct") or 0.0) >= OTHER_THREADS_PCT if writes else False
    if writes:
        files = int(f.get("writes_files") or 1)
        most = f", most to {f['writes_path']}" if files > 1 else f" ({f['writes_path']})"
        by = (f", {num(f, 'writes_other_threads_pct') or 0:.0f}% of them by threads other than the loop's"
              if threads else "")  # fmt: skip
        evidence.append(f"the main process writes {format_value(writes, 'bytes')} more to files in them, to "
                        f"{counted(files, 'file')}{most}{by} (model.long_iterations)")  # fmt: skip
    actions = []
    forwards = sum(float(s.get("extra_ns") or 0) for s in stages if s.get("kind") == "forward")
    if f.get("evaluation") and forwards >= EVALUATION_SHARE * (beyond - waits):
        actions.append(EVALUATE_LESS)
    if f.get("new_loaders"):
        actions.append(NEW_LOADERS)
    built = _built(results, str(f.get("writes_path") or "") if writes else "")
    if built:
        evidence.append(built)
        actions.append(f"{BUILT_IN_LOOP[0].upper()}{BUILT_IN_LOOP[1:]}")
    elif threads:  # a writer thread of the main process: already off the loop's thread, yet not off its CPUs
        actions.append(OTHER_THREADS)
    elif writes and re.search(CHECKPOINT_NAME, str(f.get("writes_path") or "").lower()):
        actions.append(SAVE_OFF_THE_STEP.strip())
    elif writes:
        actions.append("Write those files less often, or from a background thread, off the loop's critical path.")
    top = next((t for t in stages if t.get("kind") != "dataloader"), {"name": NO_STAGE})
    if top.get("name") == NO_STAGE:
        actions.append("Wrap the work these iterations do outside every stage in xstack.span('name'), so that the "
                       "profile names it, then run it less often or off the loop's critical path.")  # fmt: skip
    elif not actions and float(top.get("extra_calls") or 0) >= 1:  # a stage (a span of yours) they run more of
        actions.append(f"Run {top.get('name')} less often, or off the loop's critical path (in a background thread "
                       "or process, from a copy of what it needs).")  # fmt: skip
    elif not actions:  # the same stages, only slower
        actions.append("These iterations run the same stages as the others, only slower: something else took the "
                       "CPU then (DataLoader workers starting, another process); profile with the system level "
                       "(--levels model,system) to see what ran beside them.")  # fmt: skip
    actions.append("The median step leaves these iterations out and the mean step counts them: judge a change to "
                   "this work by the mean (xstack diff's row step mean).")  # fmt: skip
    return Recommendation(
        "long_iterations",
        "Some iterations take far longer than the usual one",
        severity(pct),
        evidence,
        ["model.long_iterations", *(["io.input_bound"] if built and built.endswith("(io.input_bound)") else [])],
        " ".join(actions),
        impact_ns=round(work_ns) or None,
    )
