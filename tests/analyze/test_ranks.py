"""``model.ranks`` and the rules that read it: a DDP job whose one rank waits for its data makes every rank wait
at the gradient all-reduce; the other ranks' stores, found beside this one, say which rank to fix."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from tests.conftest import needs_torch
from xstack.analyze._model_ranks import candidates, ranks_text
from xstack.analyze._recommend_input import WORK_SHARE, _io_line
from xstack.analyze.pipeline import analyze
from xstack.trace import attrs as A
from xstack.trace.sink import Sink
from xstack.trace.store import RunInfo, Store

SLOW_RANK = """
import os, sys, torch, torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

dist.init_process_group("gloo")
rank = dist.get_rank()
path = sys.argv[1] if rank == 1 else sys.argv[2]  # rank 1 reads its items from a larger file


class Items(Dataset):
    def __len__(self):
        return 8 * 16

    def __getitem__(self, i):
        with open(path, "rb") as f:
            data = f.read()
        return torch.full((16,), float(data[i % len(data)]))


torch.manual_seed(0)
torch.set_num_threads(1)  # two ranks on two cores
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 2048), nn.ReLU(), nn.Linear(2048, 2048),
                                                          nn.ReLU(), nn.Linear(2048, 1)))  # steps of tens of ms
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x in DataLoader(Items(), batch_size=8):
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""

TRIES = 3
"""Tries of the job: gloo's TCP transport now and then aborts a rank at the end (tests/cli/test_run.py, _alone)."""


def _job(tmp_path: Path, size: int, levels: str = "model", source: str = SLOW_RANK,
         args: tuple[str, ...] = ("items.bin", "small.bin")) -> None:  # fmt: skip
    """The job (``source``, given ``args``), rank 1 reading ``size`` bytes per item, rank 0 4 KiB."""
    (tmp_path / "slow_rank.py").write_text(textwrap.dedent(source))
    (tmp_path / "items.bin").write_bytes(bytes(range(256)) * (size // 256))
    (tmp_path / "small.bin").write_bytes(bytes(range(256)) * 16)
    job = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "xstack",
           "run", "--levels", levels, "-o", "prof-{rank}.duckdb", "--", "slow_rank.py", *args]  # fmt: skip
    for _ in range(TRIES):
        done = subprocess.run(job, capture_output=True, text=True, cwd=tmp_path, timeout=240)
        if not (done.returncode and "SIGABRT" in done.stderr):
            break
    assert done.returncode == 0, done.stderr[-3000:]


@needs_torch
def test_a_rank_that_waits_for_the_slow_input_of_another_is_sent_to_that_rank(tmp_path: Path) -> None:
    """Rank 1 reads a 32 MiB file for each item, rank 0 a 4 KiB one: rank 1 waits for its DataLoader much of its
    steps. Rank 0 waited hardly at all for its own, and its backward took as long as rank 1's input (the
    all-reduce waits for rank 1): read alone, its summary showed a step spent in backward and no input-bound
    finding. With the io level, the two ranks' file I/O is set side by side."""
    _job(tmp_path, 32 << 20, "model,io")
    found = {}
    for rank in (0, 1):
        with Store.open(tmp_path / f"prof-{rank}.duckdb") as store:
            result = analyze(store)
        found[rank] = ({r.id: r for r in result.results}["model.ranks"],
                       {rec.rule: rec for rec in result.recommendations})  # fmt: skip
    ranks, fired = found[0]
    f = ranks.facts
    assert (f["rank"], f["world_size"], f["ranks_read"], f["missing_ranks"]) == (0, 2, 2, [])
    assert [row[0] for row in ranks.rows] == ["0 (this store)", "1"] and ranks.rows[1][1] == "prof-1.duckdb"
    assert f["slowest_rank"] == 1 and f["slowest_wait_pct"] >= 50 and f["own_wait_pct"] < 10
    assert f["input_bound_elsewhere"] is True and f["waits_in_stage"] == "backward"
    # rank 0's backward holds the wait for rank 1's batch: half of it at least beyond rank 1's own backward
    assert f["waits_in_ns"] - f["waits_in_other_ns"] >= 0.5 * (f["slowest_wait_ns"] - f["own_wait_ns"]), f
    assert "input_bound" not in fired  # its own DataLoader keeps up
    # no DistributedSampler: each rank takes every item, as the next rank's store, read beside it, shows
    assert (
        f["next_rank_loaders"] == [{"dataset": "Items", "items": 128, "batches": 16}] and "ranks_repeat_items" in fired
    )
    rec = fired.get("input_bound_elsewhere")
    assert rec is not None and rec.title == "Training is input-bound on rank 1: this rank waits for its data"
    assert rec.evidence[0].startswith("rank 1 waits ") and "(prof-1.duckdb); this rank (0) waits " in rec.evidence[0]
    assert rec.evidence[1].startswith("this rank's backward takes ")
    assert rec.evidence[2].startswith("rank 1's file I/O that its loop waits on (in its DataLoader's workers, and in "
                                      "the loop while it waits for a batch) takes ")  # fmt: skip
    assert (
        f["slowest_io_time_ns"] > 10 * f["own_io_time_ns"] and f["slowest_io_read_bytes"] == f["own_io_read_bytes"] == 0
    )  # no workers
    assert rec.action.startswith("Make rank 1's input faster, not this rank's: its own summary (xstack summary "
                                 "prof-1.duckdb)")  # fmt: skip
    assert rec.severity == "high" and 0 < rec.impact_ns <= f["own_step_ns"]
    ranks, fired = found[1]  # the slow rank: its own input-bound finding, which the other rank waits for
    assert ranks.facts["slowest_rank"] == 1 and ranks.facts["input_bound_elsewhere"] is False
    assert "input_bound_elsewhere" not in fired and "input_bound" in fired
    assert any(line.startswith("the job's other ranks read beside this one step with it and wait less for their own "
                               "data (rank 0: ") for line in fired["input_bound"].evidence)  # fmt: skip


@needs_torch
def test_a_rank_that_saves_checkpoints_alone_is_found_to_hold_up_the_job(tmp_path: Path) -> None:
    """Rank 0 alone saves the model after every step, as a DDP loop's ``if rank == 0: torch.save(...)`` does: rank 1
    waited for it in its backward, where the gradient all-reduce waits for every rank, and its summary showed a long
    backward and nothing to fix; rank 0's showed its saves, not that the job waited for them."""
    source = SLOW_RANK.replace("    opt.zero_grad()\n", "    opt.zero_grad()\n    if rank == 0:\n"
                               "        torch.save(model.state_dict(), 'ckpt.pt')\n")  # fmt: skip
    _job(tmp_path, 4096, "model,io", source)
    found = {}
    for rank in (0, 1):
        with Store.open(tmp_path / f"prof-{rank}.duckdb") as store:
            result = analyze(store)
        found[rank] = ({r.id: r for r in result.results}["model.ranks"].facts,
                       {rec.rule: rec for rec in result.recommendations})  # fmt: skip
    facts, fired = found[1]
    assert facts["laggard_rank"] == 0 and facts["held_up"] is True, facts
    # its saves are work: its loop's CPU time per step exceeds this rank's by most of the wait (not a CPU it lacked)
    assert facts["laggard_cpu_ns"] - facts["own_cpu_ns"] >= WORK_SHARE * facts["held_up_ns"], facts
    assert facts["own_backward_ns"] - facts["laggard_backward_ns"] >= facts["held_up_ns"] > 0, facts
    rec = fired["held_up_by_rank"]
    assert rec.title == "Rank 0 holds up the job: this rank waits for it in its backward"
    assert rec.evidence[0].startswith("this rank's backward takes ") and rec.impact_ns == facts["held_up_ns"]
    assert rec.action.startswith("Look at what rank 0 does that this rank does not: xstack summary prof-0.duckdb.")
    facts, fired = found[0]
    assert facts["laggard_rank"] == 0 and facts["holding_up"] == [1] and "held_up_by_rank" not in fired, facts
    rec = fired["work_outside_stages"]
    assert any(e.startswith("rank 1 of the job waits for this rank at DDP's gradient all-reduce, up to ")
               for e in rec.evidence), rec.evidence  # fmt: skip
    assert "model.ranks" in rec.sources and "checkpoint saves" in " ".join(rec.evidence), rec.evidence


@needs_torch
def test_ranks_that_keep_up_with_their_input_get_no_finding(tmp_path: Path) -> None:
    """With a DistributedSampler, each rank takes its own half of the items: no rank takes every item. Twice the
    items, so that each rank steps as many times as in the job without it, which the timing checks were made on."""
    source = SLOW_RANK.replace("DataLoader(Items(), batch_size=8)", "DataLoader(Items(), batch_size=8, sampler=torch."
                               "utils.data.distributed.DistributedSampler(Items()))")  # fmt: skip
    source = source.replace("return 8 * 16", "return 2 * 8 * 16")
    assert source.count("DistributedSampler") == 1 and "2 * 8 * 16" in source
    _job(tmp_path, 4096, source=source)
    for rank in (0, 1):
        with Store.open(tmp_path / f"prof-{rank}.duckdb") as store:
            result = analyze(store)
        facts = {r.id: r for r in result.results}["model.ranks"].facts
        fired = {rec.rule: rec for rec in result.recommendations}
        assert facts["ranks_read"] == 2 and facts["input_bound_elsewhere"] is False, facts
        assert "input_bound_elsewhere" not in fired and "input_bound" not in fired
        (loader,) = store_loaders(tmp_path / f"prof-{rank}.duckdb")
        assert (loader["items"], loader["batches"], loader["sampler"]) == (256, 16, "DistributedSampler")
        assert "ranks_repeat_items" not in fired
        # alike: neither holds up the other by its own work. On a machine that other programs load (3 busy ones beside
        # the 2 ranks on 2 CPUs), one rank now and then lags for want of a CPU, and this rank waits for it: said so
        rec = fired.get("held_up_by_rank")
        assert rec is None or rec.title.endswith("it waits for a CPU, and this rank for it"), facts


@needs_torch
def test_a_rank_s_store_without_the_others_beside_it_says_which_it_lacks(tmp_path: Path) -> None:
    """Rank 1's store copied away (another node's): rank 0 is compared with no other and says which rank it
    lacks; a store of an earlier job under rank 1's name is not this job's."""
    _job(tmp_path, 4096)
    alone = tmp_path / "alone"
    alone.mkdir()
    (tmp_path / "prof-0.duckdb").rename(alone / "prof-0.duckdb")
    with Store.open(alone / "prof-0.duckdb") as store:
        ranks = {r.id: r for r in analyze(store).results}["model.ranks"]
    assert ranks.facts["ranks_read"] == 1 and ranks.facts["missing_ranks"] == [1]
    assert any(label.startswith("no store beside this one for rank 1") for label in ranks.labels)
    assert ranks.facts["input_bound_elsewhere"] is False
    # no DistributedSampler: this rank takes all 128 items, as rank 1 does, which its store alone tells
    with Store.open(alone / "prof-0.duckdb") as store:
        fired = {rec.rule: rec for rec in analyze(store).recommendations}
    rec = fired["ranks_repeat_items"]
    assert rec.evidence[0].startswith("this rank (0 of 2) takes 16 batches of 8 an epoch from DataLoader(Items, "
                                      "batch_size=8, ")  # fmt: skip
    assert rec.evidence[0].endswith("whose dataset holds 128 items, its sampler a SequentialSampler: the whole "
                                    "dataset, where its share of the job's 2 ranks would be 8 batches (model.ranks, "
                                    "model.stages)"), rec.evidence  # fmt: skip


SHARDED = """
import glob, sys, torch, torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

dist.init_process_group("gloo")


class Shards(IterableDataset):
    def __iter__(self):
        files = sorted(glob.glob("shards/*.bin"))
        if sys.argv[1] == "split":  # each rank its own shards
            files = files[dist.get_rank()::dist.get_world_size()]
        for path in files:
            with open(path, "rb") as f:
                data = f.read()
            for i in range(0, len(data), 64):
                yield torch.tensor(list(data[i:i + 16]), dtype=torch.float32)


torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.parallel.DistributedDataParallel(nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x in DataLoader(Shards(), batch_size=8):
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


@needs_torch
@pytest.mark.parametrize("split", [False, True])
def test_ranks_that_each_read_every_shard_of_an_iterable_dataset_are_told_to_split_them(
    tmp_path: Path, split: bool
) -> None:
    """An IterableDataset whose __iter__ reads every shard on every rank (it would split them between workers, but
    not between ranks): both ranks read the same 4 shards whole, which only the io level of both can tell."""
    (tmp_path / "shards").mkdir()
    for i in range(4):
        (tmp_path / "shards" / f"{i}.bin").write_bytes(bytes(range(256)) * 16)
    _job(tmp_path, 4096, "model,io", SHARDED, ("split" if split else "all",))
    with Store.open(tmp_path / "prof-0.duckdb") as store:
        result = analyze(store)
    facts = {r.id: r for r in result.results}["model.ranks"].facts
    fired = {rec.rule: rec for rec in result.recommendations}
    assert facts["same_data_rank"] == 1 and facts["data_read_bytes"] == (2 if split else 4) * 4096, facts
    if split:
        assert facts["same_data_files"] == 0 and "ranks_repeat_items" not in fired, facts
        return
    assert facts["same_data_files"] == 4 and facts["same_data_bytes"] == 4 * 4096, facts
    rec = fired["ranks_repeat_items"]
    assert rec.title == "Each of the job's 2 ranks reads all the data: items repeated, or read 2 times"
    assert rec.evidence[0] == (
        f"this rank and rank 1 each read the same 4 data files whole ({tmp_path}/shards/0.bin "
        "the largest): 16.0 KiB of the 16.0 KiB this rank read from data files (model.ranks)"
    )
    assert rec.evidence[1].startswith("the loop iterates DataLoader(Shards, batch_size=8, ")
    assert rec.action.startswith("Give each rank its own shards in Shards.__iter__, as well as each worker: ")


def store_loaders(path: Path) -> list[dict[str, object]]:
    """The DataLoaders a store's run recorded (``runs.config.dataloaders``)."""
    with Store.open(path) as store:
        (config,) = store.query("SELECT config FROM runs")[0]
    return list(orjson.loads(config)[A.CONFIG_DATALOADERS])


def test_a_run_of_one_process_has_no_other_ranks(tmp_path: Path) -> None:
    import xstack

    with xstack.profile(levels="model", path=tmp_path / "one.duckdb") as prof:
        for _ in range(3):
            prof.step()
    with Store.open(tmp_path / "one.duckdb") as store:
        ranks = {r.id: r for r in analyze(store).results}["model.ranks"]
    assert not ranks.available and ranks.missing == ["other ranks"]
    assert "torchrun --nproc-per-node N -m xstack run -o 'prof-{rank}.duckdb'" in ranks.hint


@pytest.mark.parametrize(
    ("name", "rank", "other", "expected"),
    [("prof-0.duckdb", 0, 1, ["prof-1.duckdb"]),  # -o 'prof-{rank}.duckdb'
     ("prof.rank3.duckdb", 3, 0, ["prof.rank0.duckdb"]),  # xstack run's and mp.spawn's own names
     ("run10-1.duckdb", 1, 2, ["run10-2.duckdb"]),  # 10 is no rank 1
     ("r1-1.duckdb", 1, 0, ["r0-1.duckdb", "r1-0.duckdb"]),  # either could be the rank
     ("prof.duckdb", 0, 1, [])],
)  # fmt: skip
def test_the_other_ranks_stores_are_looked_for_by_this_one_s_name(name: str, rank: int, other: int,
                                                                   expected: list[str]) -> None:  # fmt: skip
    assert [p.name for p in candidates(Path("/d") / name, rank, other)] == expected


def test_the_slow_rank_s_file_io_is_named_where_it_holds_its_wait() -> None:
    facts = {"slowest_rank": 3, "slowest_wait_ns": 40e6, "own_wait_ns": 1e6, "slowest_io_time_ns": 30e6,
             "own_io_time_ns": 2e6, "slowest_io_read_bytes": 64 << 20, "own_io_read_bytes": 1 << 20}  # fmt: skip
    line = _io_line(facts)
    assert line is not None
    assert line.endswith("takes 30.0 ms per iteration against 2.00 ms here; its workers read 64.0 MiB of data per "
                         "iteration against 1.00 MiB here (model.ranks)")  # fmt: skip
    assert _io_line(facts | {"slowest_io_time_ns": 3e6}) is None  # not twice this rank's
    assert _io_line(facts | {"slowest_io_time_ns": 8e6, "own_io_time_ns": 1e6}) is None  # a sliver of the wait it makes
    assert "its workers read" not in (_io_line(facts | {"slowest_io_read_bytes": 0}) or "")  # no workers
    assert _io_line({k: v for k, v in facts.items() if not k.endswith("_io_time_ns")}) is None  # no io level


def _rank_store(path: Path, rank: int, started_ns: int, wait_ns: int) -> None:
    """A rank's store of 6 steps of 10 ms, each waiting ``wait_ns`` for the DataLoader."""
    with Store.create(path) as store:
        config = {"pid": 1, "distributed": {"rank": rank, "world_size": 2}}
        store.add_run(RunInfo(1, "job", started_at_ns=started_ns, levels=["model"], config=config))
        sink = Sink(store, 1)
        for k in range(6):
            at = k * 10_000_000
            sink.span(1 + k, None, "model", f"step#{k}", at, 10_000_000, 1, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: k})
            sink.span(10 + k, 1 + k, "model", "dataloader.next", at, wait_ns, 1, 1, {A.MODEL_KIND: "dataloader"})
        sink.close()


def test_a_store_of_another_job_under_a_rank_s_name_is_not_read(tmp_path: Path) -> None:
    """prof-1.duckdb left from a job an hour before: its rank 1 waited for data, but not beside this rank 0, which
    is told that the store beside it is of another job, and no rank is blamed."""
    now = 1_795_000_000 * 10**9
    _rank_store(tmp_path / "prof-0.duckdb", 0, now, 100_000)
    _rank_store(tmp_path / "prof-1.duckdb", 1, now - 3600 * 10**9, 9_000_000)
    with Store.open(tmp_path / "prof-0.duckdb") as store:
        result = analyze(store)
    ranks = {r.id: r for r in result.results}["model.ranks"]
    assert ranks.facts["ranks_read"] == 1 and ranks.facts["missing_ranks"] == [1]
    assert "rank 1: prof-1.duckdb holds no run of rank 1 of 2 with measured iterations from the time of this run" in (
        " ".join(ranks.labels)
    )
    assert "input_bound_elsewhere" not in {rec.rule for rec in result.recommendations}
    (tmp_path / "prof-1.duckdb").unlink()
    _rank_store(tmp_path / "prof-1.duckdb", 1, now + 2 * 10**9, 9_000_000)  # this job's, started 2 s after
    with Store.open(tmp_path / "prof-0.duckdb") as store:
        result = analyze(store)
    ranks = {r.id: r for r in result.results}["model.ranks"]
    assert ranks.facts["ranks_read"] == 2 and ranks.facts["slowest_rank"] == 1
    assert "input_bound_elsewhere" in {rec.rule for rec in result.recommendations}


def test_ranks_without_a_store_are_named_in_ranges() -> None:
    assert ranks_text([3]) == "rank 3"
    assert ranks_text([1, 3]) == "ranks 1, 3"
    assert ranks_text([1, 2, 5, 8, 9, 10, 11]) == "ranks 1, 2, 5, 8-11"
