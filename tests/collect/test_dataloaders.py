"""The DataLoaders a profiled program iterates: their settings in ``runs.config.dataloaders`` with the CPUs the
program could use, each wait for a batch naming its DataLoader, and the input-bound result and rule built on
them, for a real program with real DataLoaders profiled through the CLI."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from xstack.analyze.pipeline import analyze
from xstack.collect._cpus import usable_cpus
from xstack.report.html import render_html
from xstack.trace import attrs as A
from xstack.trace.store import Store

torch = pytest.importorskip("torch")
PROGRAM = Path(__file__).parent / "io_programs" / "dataloaders.py"
FILES = 16


def _needs_io() -> None:
    from xstack.collect.io import IoCollector

    if (reason := IoCollector().unavailable_reason()) is not None:
        pytest.skip(f"io level unavailable: {reason}")


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _needs_io()
    root = tmp_path_factory.mktemp("loaders")
    data = root / "data"
    data.mkdir()
    for i in range(FILES):
        (data / f"{i:02d}.bin").write_bytes(os.urandom(64))
    store = root / "train.duckdb"
    # io alone brings the model level, whose DataLoader waits these tests read
    done = subprocess.run([sys.executable, "-m", "xstack", "run", "--levels", "io", "-o", str(store), "--",
                           "python", str(PROGRAM), str(data)], capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n"
    with Store.open(store) as s:
        assert s.query("SELECT levels FROM runs") == [(["model", "io"],)]
    return store


def test_each_iterated_dataloader_is_recorded_with_its_settings(profiled: Path) -> None:
    with Store.open(profiled) as s:
        config = orjson.loads(s.query("SELECT config FROM runs")[0][0])
        waits = s.query(
            f"""SELECT attrs->>'$."{A.MODEL_DATALOADER}"', count(*) FROM spans
                WHERE level = 'model' AND attrs->>'$."{A.MODEL_KIND}"' = 'dataloader' GROUP BY 1 ORDER BY 1"""
        )
    assert config[A.CONFIG_CPU_COUNT] == usable_cpus() == len(os.sched_getaffinity(0))
    common = {"pin_memory": False, "cuda": False, "iterable": False}
    assert config[A.CONFIG_DATALOADERS] == [  # the unused one is not there
        {"index": 0, "dataset": "Files", "batch_size": 4, "num_workers": 2, "persistent_workers": True,
         "prefetch_factor": 3, "iterated": 2, "start_method": multiprocessing.get_all_start_methods()[0],
         "batched": False, "sampler_batches": False, "items": FILES, "batches": FILES // 4,
         "sampler": "SequentialSampler", **common},
        {"index": 1, "dataset": "Validation", "batch_size": 8, "num_workers": 0, "persistent_workers": False,
         "prefetch_factor": None, "iterated": 1, "start_method": None, "batched": True, "sampler_batches": False,
         "items": FILES, "batches": FILES // 8, "sampler": "SequentialSampler", **common},
    ]  # fmt: skip
    # each epoch waits once more than it has batches: for the StopIteration that ends it; and the persistent
    # workers start in the first iter(), a wait of its own (the main process's val loader starts none)
    assert waits == [("0", 2 * (FILES // 4 + 1) + 1), ("1", FILES // 8 + 1)]


def test_the_input_bound_result_and_rule_start_from_the_settings(profiled: Path) -> None:
    cpus = usable_cpus()
    with Store.open(profiled) as s:
        a = analyze(s)
    r = a.result("io.input_bound")
    train = (
        "DataLoader(Files, batch_size=4, num_workers=2, persistent_workers=True, pin_memory=False, prefetch_factor=3)"
    )
    assert r.facts["cores"] == cpus and [d["dataset"] for d in r.facts["dataloaders"]] == ["Files", "Validation"]
    # the warm-up label first (iteration 1 is left out of the verdict), then the DataLoaders and the CPUs
    assert r.labels[0].startswith("iteration 1 left out as warm-up"), r.labels
    # the warm-up's wait (the workers starting) is told apart from the 9 waits after it
    # and the wait that found the end of the last epoch, after the last step(), is told apart from those in steps
    assert re.fullmatch(re.escape(train) + r": waited \S+ \S+ in 9 waits \(\S+ \S+ of it in the wait after the last "
                        r"step\(\)\), and \S+ \S+ in the warm-up", r.labels[1])  # fmt: skip
    assert re.fullmatch(r"DataLoader\(Validation, batch_size=8, num_workers=0, .*\): waited \S+ \S+ in 3 waits, all "
                        r"after the last step\(\)", r.labels[2])  # fmt: skip
    assert r.labels[3:] == [f"{cpus} usable CPUs"]
    rec = next(rec for rec in a.recommendations if rec.rule == "input_bound")
    assert any(e.startswith(f"the loop waits on {train}") and " in 9 waits past the warm-up (" in e
               for e in rec.evidence)  # fmt: skip
    assert rec.action.startswith(train + ": ")
    # what it already does is not advised: persistent workers, a raised prefetch_factor, and no GPU to pin for
    assert not re.search("persistent_workers=True \\(|prefetch_factor from|pin_memory=True", rec.action)
    # its items sleep 10 ms and read 64 bytes: the workers are blocked, neither on a CPU nor reading files, so more
    # of them overlap their sleeps, past the CPUs too; building the items cheaper is not what shortens the wait.
    # Unless other work on the machine kept them waiting for a CPU 20% of the loop's time (two programs spinning
    # on 2 CPUs did): then the CPUs are short, and the advice is the settings' own
    loop = 2 * r.facts["loop_ns"]
    if 100 * r.facts["worker_run_delay_ns"] / loop < 20:
        assert 100 * (r.facts["worker_cpu_ns"] + r.facts["worker_run_delay_ns"]) / loop < 50, r.facts
        assert "its 2 workers were blocked" in rec.action and "raise num_workers from 2 (" in rec.action, rec.action
        assert "towards the" not in rec.action and "decode and augment less" not in rec.action
        assert any(e.startswith("its 2 worker processes were on a CPU") for e in rec.evidence), rec.evidence
    elif cpus > 2:
        assert f"raise num_workers from 2 towards the {cpus} usable CPUs" in rec.action
    else:
        assert "num_workers from" not in rec.action and "make each batch cheaper to build: the workers' file I/O (" in (
            rec.action
        )
    section = render_html(a).split('id="r-io-input_bound"')[1].split("</section>")[0]
    assert r.labels[0] in section  # the settings show in the report's input section


def test_the_waits_for_each_dataloader_leave_the_warm_up_out(profiled: Path) -> None:
    """The first iteration's wait also starts the workers: the figures the advice reads are those of the
    measured iterations, the warm-up's kept apart."""
    with Store.open(profiled) as s:
        a = analyze(s)
        warm_end = s.query(
            f"""SELECT start_ns + dur_ns FROM spans WHERE level = 'model' AND attrs->>'$."{A.MODEL_STEP}"' = '0'"""
        )[0][0]
        waits = s.query(
            f"""SELECT start_ns < ?, count(*), sum(dur_ns) FROM spans WHERE level = 'model'
                AND attrs->>'$."{A.MODEL_KIND}"' = 'dataloader' AND attrs->>'$."{A.MODEL_DATALOADER}"' = '0'
                GROUP BY 1""",
            [warm_end],
        )
    in_warmup = {bool(w): (int(n), int(ns)) for w, n, ns in waits}
    for id in ("io.input_bound", "model.stages"):
        train = a.result(id).facts["dataloaders"][0]
        assert (train["waits"], train["wait_ns"]) == in_warmup[False], id
        # the iter() that starts the workers and the first batch's wait
        assert (train["warmup_waits"], train["warmup_wait_ns"]) == in_warmup[True] == (2, in_warmup[True][1]), id
        assert train["after_last_step_waits"] == 1, id  # the StopIteration that ends the second epoch


CRASHING = """
import time, torch, xstack
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.005)  # decoding, say: the loop waits for each batch
        return torch.zeros(8)

for i, batch in enumerate(DataLoader(Slow(), batch_size=2)):
    if i == 5:
        raise RuntimeError("bad batch")
    batch.sum()
    xstack.step()
"""


def test_a_crashed_loops_advice_says_which_waits_each_figure_counts(tmp_path: Path) -> None:
    """The program raises after its fifth step(), waiting for a sixth batch: that wait is in no measured step.
    model.stages' share counts the waits within the steps, the DataLoader's total also counts that one, and the
    advice says so of each figure."""
    _needs_io()
    (tmp_path / "prog.py").write_text(CRASHING)
    done = subprocess.run([sys.executable, "-m", "xstack", "run", "--levels", "model,io", "-o", "s.duckdb", "--",
                           "python", "prog.py"], capture_output=True, text=True, cwd=tmp_path, timeout=240)  # fmt: skip
    assert done.returncode == 1 and "RuntimeError: bad batch" in done.stderr, done.stderr
    report = subprocess.run([sys.executable, "-m", "xstack", "report", "s.duckdb", "-o", "-"], capture_output=True,
                            text=True, cwd=tmp_path, timeout=240)  # fmt: skip
    assert report.returncode == 0, report.stderr
    evidence = report.stdout.split("Training is input-bound")[1].split("**Do:**")[0]
    stages = re.search(r"the loop waited (\S+ \S+) for DataLoader batches within its 4 measured steps, [\d.]+% of "
                       r"their time \(model.stages\)", evidence)  # fmt: skip
    loader = re.search(r"the loop waits on DataLoader\(Slow, batch_size=2, .*\), (\S+ \S+) in 5 waits past the "
                       r"warm-up \((\S+ \S+) of it in the wait after the last step\(\)\); \d+ usable CPUs "
                       r"\(io.input_bound\)", evidence)  # fmt: skip
    assert stages and loader, evidence
    with Store.open(tmp_path / "s.duckdb") as s:
        a = analyze(s)
    facts = a.result("model.stages").facts
    (entry,) = a.result("io.input_bound").facts["dataloaders"]
    assert entry["after_last_step_waits"] == 1 and entry["waits"] == 5
    assert (
        facts["dataloader_in_steps_ns"] == entry["wait_ns"] - entry["after_last_step_wait_ns"]
    )  # the two figures agree


VALIDATING = """
import time, torch, xstack
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(0.002)  # decoding, say
        return torch.zeros(8)

model = torch.nn.Linear(8, 1)
train, val = DataLoader(Slow(12), batch_size=2), DataLoader(Slow(4), batch_size=2)
for i, batch in enumerate(train):
    model(batch).sum().backward()
    if i % 2 == 1:
        with xstack.span("validate"), torch.no_grad():
            for v in val:
                model(v)
    xstack.step()
"""


def test_the_waits_inside_a_marked_stage_are_recorded_nested_in_it(tmp_path: Path) -> None:
    """A validation loop in ``xstack.span("validate")``, every other step: its DataLoader's waits are recorded,
    nested in the marked stage, and the input-bound result counts them (it listed the DataLoader with no waits)."""
    _needs_io()
    (tmp_path / "prog.py").write_text(VALIDATING)
    done = subprocess.run([sys.executable, "-m", "xstack", "run", "--levels", "model,io", "-o", "s.duckdb", "--",
                           "python", "prog.py"], capture_output=True, text=True, cwd=tmp_path, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Store.open(tmp_path / "s.duckdb") as s:
        parents = s.query(
            f"""SELECT p.name, p.attrs->>'$."{A.MODEL_KIND}"', count(*) FROM spans d JOIN spans p
                ON p.run_id = d.run_id AND p.span_id = d.parent_id
                WHERE d.level = 'model' AND d.attrs->>'$."{A.MODEL_KIND}"' = 'dataloader'
                  AND d.attrs->>'$."{A.MODEL_DATALOADER}"' = '1' GROUP BY ALL"""
        )
        a = analyze(s)
    assert parents == [("validate", "user", 9)]  # 3 validations of 2 batches, and the wait that ends each
    stages = {(r[0], r[1]): r[2] for r in a.result("model.stages").rows}
    assert stages[("validate", "user")] == 3 and stages[("dataloader.next", "dataloader")] >= 9
    r = a.result("io.input_bound")
    val = r.facts["dataloaders"][1]
    assert (val["dataset"], val["waits"], val["after_last_step_waits"]) == ("Slow", 9, 0)
    assert any(re.fullmatch(r"DataLoader\(Slow, batch_size=2, num_workers=0, .*\): waited \S+ \S+ in 9 waits", label)
               for label in r.labels), r.labels  # fmt: skip


def test_an_iterable_dataset_is_recorded_as_one() -> None:
    from torch.utils.data import DataLoader, IterableDataset

    from xstack.collect._dataloaders import describe

    class Stream(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(range(4))

    streamed = describe(DataLoader(Stream(), batch_size=2), 0)
    assert (streamed["dataset"], streamed["iterable"]) == (
        "test_an_iterable_dataset_is_recorded_as_one.<locals>.Stream",
        True,
    )
    assert describe(DataLoader(list(range(4)), batch_size=2), 1)["iterable"] is False


def test_batches_a_sampler_yields_whole_are_recorded_with_the_sampler_s_size() -> None:
    """``batch_size=None`` with a ``BatchSampler`` as the sampler: the dataset is indexed by a batch's indices at
    once (what the input-bound advice tells a TensorDataset to do), of the sampler's batch size."""
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

    from xstack.collect._dataloaders import describe

    data = TensorDataset(torch.ones(16, 4))
    whole = describe(
        DataLoader(data, sampler=BatchSampler(RandomSampler(data), 8, drop_last=False), batch_size=None), 0
    )
    assert (whole["batch_size"], whole["sampler_batches"], whole["batched"]) == (8, True, False)
    items = describe(DataLoader(data, batch_size=4), 1)
    assert (items["batch_size"], items["sampler_batches"]) == (4, False)
    unbatched = describe(DataLoader(data, batch_size=None), 2)  # one item per step, no batch size
    assert (unbatched["batch_size"], unbatched["sampler_batches"]) == (None, False)


def test_workers_that_each_read_every_shard_of_an_iterable_dataset_are_found(tmp_path: Path) -> None:
    """An IterableDataset whose __iter__ does not split its shards between its 2 workers yields each item twice:
    the loop saw 256 items of 128. Its workers each read every shard whole, which the io level sees; split by
    get_worker_info, they read 2 shards each and nothing is said."""
    _needs_io()
    data = tmp_path / "data"
    data.mkdir()
    for i in range(4):
        (data / f"shard-{i}.txt").write_bytes(b"".join(b"%d\n" % (32 * i + k) for k in range(32)))
    program = Path(__file__).parent / "io_programs" / "shards.py"
    fired = {}
    for how, items in (("all", 256), ("split", 128)):
        store = tmp_path / f"{how}.duckdb"
        done = subprocess.run([sys.executable, "-m", "xstack", "run", "--levels", "model,io", "-o", str(store), "--",
                               "python", str(program), str(data), how], capture_output=True, text=True,
                              timeout=240)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"{items}\n"
        with Store.open(store) as s:
            fired[how] = {rec.rule: rec for rec in analyze(s).recommendations}
    rec = fired["all"].get("shared_shards")
    assert rec is not None and rec.title.startswith("The 2 DataLoader workers each read all the data")
    assert rec.evidence[0].startswith(f"2 worker processes each read 4 data files whole ({data}/shard-")
    assert "shared_shards" not in fired["split"]


def test_workers_that_share_a_file_offset_are_found(tmp_path: Path) -> None:
    """A dataset that opens its file in __init__, before the DataLoader's workers fork, and seeks and reads it in
    __getitem__: the workers share one file offset, and a seek of one moves where the other reads. 43 to 137 of
    4,096 records came back wrong, silently; the io level saw the reads that started after the other worker moved
    the offset (107 where the program counted 100 wrong). Opened in each worker, or read with os.pread: none."""
    _needs_io()
    program = Path(__file__).parent / "io_programs" / "shared_offset.py"
    records = tmp_path / "records.bin"
    found = _by_mode(tmp_path, program, records, ("shared", "own", "pread"), "io.pattern")
    wrong, facts, fired = found["shared"]
    assert (facts["shared_offset_path"], facts["shared_offset_processes"]) == (str(records), 2)
    assert facts["shared_offset_reads"] >= 2048 // 4  # a 4 KiB buffered read serves up to 4 records
    rec = fired.get("shared_offset")
    assert rec is not None and "share the file offset of records.bin" in rec.title
    assert rec.severity == ("high" if facts["shared_offset_races"] else "medium")
    if wrong:  # a record read from the wrong place: a read that started after the other worker moved the offset
        assert facts["shared_offset_races"] > 0
    for mode in ("own", "pread"):
        wrong, facts, fired = found[mode]
        assert wrong == 0 and facts["shared_offset_processes"] == 0 and "shared_offset" not in fired, mode


def _by_mode(tmp_path: Path, program: Path, data: Path, modes: tuple[str, ...],
             analysis: str) -> dict[str, tuple[float, dict[str, Any], dict[str, Any]]]:  # fmt: skip
    """``program DATA MODE`` run under ``xstack run --levels model,io`` for each mode: the number it prints, the
    facts of ``analysis`` and the recommendations that fired, by rule."""
    found = {}
    for mode in modes:
        store = tmp_path / f"{mode}.duckdb"
        done = subprocess.run([sys.executable, "-m", "xstack", "run", "--levels", "model,io", "-o", str(store), "--",
                               "python", str(program), str(data), mode], capture_output=True, text=True,
                              timeout=240)  # fmt: skip
        assert done.returncode == 0, done.stderr
        with Store.open(store) as s:
            result = analyze(s)
        facts = next(r for r in result.results if r.id == analysis).facts
        found[mode] = (float(done.stdout), facts, {rec.rule: rec for rec in result.recommendations})
    return found


def test_workers_that_read_an_hdf5_file_opened_before_they_forked_are_told_to_open_their_own(tmp_path: Path) -> None:
    """h5py.File opened in the dataset's __init__: the workers read the file through the descriptor they
    inherited, which h5py's documentation advises against. Nothing was said; opened in each worker on first use,
    it is not a finding, and both read the same rows."""
    _needs_io()
    h5py = pytest.importorskip("h5py")
    import numpy as np

    program = Path(__file__).parent / "io_programs" / "forked_hdf5.py"
    data = tmp_path / "rows.h5"
    with h5py.File(data, "w") as f:
        f.create_dataset("x", data=np.arange(256 * 64, dtype=np.float32).reshape(256, 64), chunks=(16, 64))
    found = _by_mode(tmp_path, program, data, ("shared", "own"), "io.pattern")
    total, facts, fired = found["shared"]
    assert total == float(np.arange(256 * 64, dtype=np.float64).sum())
    assert (facts["forked_hdf5_path"], facts["forked_hdf5_processes"]) == (str(data), 2)
    assert facts["forked_hdf5_reads"] >= 256 // 16  # a chunk read per 16 rows at least
    rec = fired.get("forked_hdf5")
    assert rec is not None and rec.title == "DataLoader workers read an HDF5 file opened before they forked (rows.h5)"
    assert rec.evidence[0].startswith(f"2 processes other than the main one read {data} through descriptor ")
    assert "h5py.File(path, 'r') in __getitem__ when still None" in rec.action
    own_total, facts, fired = found["own"]
    assert own_total == total and facts["forked_hdf5_processes"] == 0 and "forked_hdf5" not in fired


def test_workers_that_read_an_lmdb_environment_opened_before_they_forked_are_told_to_open_their_own(
    tmp_path: Path,
) -> None:
    """lmdb.open in the dataset's __init__: the workers read its records through the memory mapping they
    inherited, in no call of their own, which LMDB's documentation says not to do. Nothing was said; opened in
    each worker on first use, it is not a finding, and both read the same records."""
    _needs_io()
    lmdb = pytest.importorskip("lmdb")
    import numpy as np

    program = Path(__file__).parent / "io_programs" / "forked_lmdb.py"
    data = tmp_path / "records.lmdb"
    with lmdb.open(str(data), map_size=1 << 24) as env, env.begin(write=True) as txn:
        for i in range(256):
            txn.put(b"%06d" % i, np.full(64, i, dtype=np.float32).tobytes())
    found = _by_mode(tmp_path, program, data, ("shared", "own"), "io.input_bound")
    total, facts, fired = found["shared"]
    assert total == 64.0 * sum(range(256))
    assert facts["worker_mapped_path"] == str(data / "data.mdb") and facts["worker_mapped_inherited"] is True
    rec = fired.get("forked_lmdb")
    assert rec is not None
    assert rec.title == "DataLoader workers use an LMDB environment opened before they forked (records.lmdb/data.mdb)"
    assert rec.evidence[0].startswith(f"the DataLoader workers read {data / 'data.mdb'} (")
    assert "lmdb.open(path, readonly=True, lock=False) in __getitem__ when still None" in rec.action
    own_total, facts, fired = found["own"]
    assert own_total == total and facts["worker_mapped_inherited"] is False and "forked_lmdb" not in fired


ROWS_BY_READS = """
import sys
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Rows(Dataset):
    def __init__(self, path):
        self.path = path
        header = np.load(path, mmap_mode="r")  # its shape, through a mapping dropped at once
        self.n, self.width, self.offset = header.shape[0], header.shape[1], header.offset
        del header

    def __len__(self):
        return self.n

    def __getitem__(self, i):  # a row by a read of its own, no mapping
        row = np.fromfile(self.path, dtype=np.float32, count=self.width, offset=self.offset + 4 * self.width * i)
        return torch.from_numpy(row)


total = 0.0
for batch in DataLoader(Rows(sys.argv[1]), batch_size=32, num_workers=2, multiprocessing_context="fork"):
    total += float(batch.double().sum())
print(repr(total))
"""


def test_a_mapping_the_main_process_dropped_before_the_workers_forked_is_not_theirs(tmp_path: Path) -> None:
    """The dataset's __init__ reads an array's shape through np.load(mmap_mode='r') and drops the mapping; the
    workers read each row with a call of their own. The unmap, before they forked, says they inherited no mapping:
    they were said to read the file through one, by page faults."""
    _needs_io()
    import numpy as np

    data = tmp_path / "rows.npy"
    np.save(data, np.arange(256 * 64, dtype=np.float32).reshape(256, 64))
    program = tmp_path / "rows.py"
    program.write_text(ROWS_BY_READS)
    total, facts, fired = _by_mode(tmp_path, program, data, ("reads",), "io.input_bound")["reads"]
    assert total == float(np.arange(256 * 64, dtype=np.float64).sum())
    with Store.open(tmp_path / "reads.duckdb") as s:
        (main,) = s.query("SELECT DISTINCT pid FROM spans WHERE level = 'io' AND name = 'mmap' AND "
                          f"attrs->>'$.\"{A.IO_PATH}\"' = ?", [str(data)])[0]  # fmt: skip
        unmaps = s.query("SELECT pid, (attrs->>'$.\"io.requested_bytes\"')::BIGINT FROM spans WHERE level = 'io' "
                         f"AND name = 'munmap' AND attrs->>'$.\"{A.IO_PATH}\"' = ?", [str(data)])  # fmt: skip
    assert unmaps == [(main, data.stat().st_size)]
    assert facts["worker_mapped_files"] == 0 and facts["worker_mapped_inherited"] is False
    assert facts["worker_data_reads_per_iteration"] > 0
    assert all("memory mapping" not in rec.action for rec in fired.values())


EPOCHS = """
import sys, torch, xstack
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=16, num_workers=1,
                    persistent_workers=sys.argv[1] == "persistent")
for epoch in range(3):
    for (x,) in loader:
        x.sum()
        xstack.step()
"""


@pytest.mark.parametrize("persistent", [False, True])
def test_each_iter_of_a_dataloader_is_a_stage_that_starts_its_epoch(tmp_path: Path, persistent: bool) -> None:
    """A loader whose workers do not persist starts them in iter(), at each epoch: about 20 ms an epoch for two
    forked workers, which was time in no stage, told to be the loop's own work. Each iter() is a dataloader stage,
    the epoch's first wait where it made a new iterator."""
    (tmp_path / "epochs.py").write_text(EPOCHS)
    store = tmp_path / "e.duckdb"
    done = subprocess.run([sys.executable, "-m", "xstack", "run", "--levels", "model", "-o", str(store), "--",
                           "python", "epochs.py", "persistent" if persistent else "fresh"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Store.open(store) as s:
        iters = s.query(
            f"""SELECT attrs->>'$."{A.MODEL_KIND}"', attrs->>'$."{A.MODEL_DATALOADER}"',
                    coalesce(attrs->>'$."{A.MODEL_DATALOADER_FIRST}"', 'false') FROM spans
                WHERE level = 'model' AND name = 'dataloader.iter' ORDER BY start_ns"""
        )
        ends = s.query(
            f"""SELECT name, attrs->>'$."{A.MODEL_DATALOADER_LAST}"' FROM spans
                WHERE level = 'model' AND attrs->>'$."{A.MODEL_DATALOADER_LAST}"' IS NOT NULL ORDER BY start_ns"""
        )
        [entry] = analyze(s).result("model.stages").facts["dataloaders"]
    # a new iterator at each epoch, or one for them all, whose workers the first iter() starts (the next two
    # reset it: no stage)
    assert iters == [("dataloader", "0", "true")] * (1 if persistent else 3)
    assert entry["iterated"] == 3
    # the epochs past the warm-up: two, each started by its iter() and its first batch's wait
    assert entry["first_waits"] == (0 if persistent else 2)
    # each epoch's end, the wait that found no batch left, where workers that do not persist are shut down
    assert ends == [("dataloader.next", "true")] * 3 and entry["last_waits"] == 3, ends
    assert entry["last_wait_ns"] > 0
