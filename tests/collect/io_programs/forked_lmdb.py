"""A DataLoader of 2 workers reading the records of an LMDB environment (tests/collect/test_dataloaders.py).

argv: PATH, MODE: ``shared`` (the environment opened in the dataset's ``__init__``, before the workers fork: they
read through the memory mapping they inherited) or ``own`` (opened in each worker on first use). Prints the sum of
the records read, so that both modes can be checked to read the same data.
"""

import sys

import lmdb
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Records(Dataset):
    def __init__(self, path: str, mode: str) -> None:
        self.path = path
        with lmdb.open(path, readonly=True, lock=False) as env:
            self.n = env.stat()["entries"]
        self.env = lmdb.open(path, readonly=True, lock=False) if mode == "shared" else None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.env is None:
            self.env = lmdb.open(self.path, readonly=True, lock=False)
        with self.env.begin() as txn:
            return torch.from_numpy(np.frombuffer(txn.get(b"%06d" % i), dtype=np.float32).copy())


total = 0.0
for batch in DataLoader(Records(sys.argv[1], sys.argv[2]), batch_size=32, num_workers=2):
    total += float(batch.double().sum())
print(repr(total))
