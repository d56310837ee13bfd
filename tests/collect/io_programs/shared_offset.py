"""A DataLoader of 2 workers reading fixed-size records of one file (tests/collect/test_dataloaders.py).

argv: PATH, MODE: ``shared`` (the file opened in the dataset's ``__init__``, before the workers fork: they share
its offset, and a seek of one moves where the other reads), ``own`` (opened in each worker on first use) or
``pread`` (the shared descriptor read with ``os.pread``). Prints how many records came back wrong.
"""

import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset

N, R = 2048, 1024


class Records(Dataset):
    def __init__(self, path: str, mode: str) -> None:
        self.path, self.mode = path, mode
        self.f = open(path, "rb") if mode != "own" else None  # noqa: SIM115

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.f is None:
            self.f = open(self.path, "rb")  # noqa: SIM115
        if self.mode == "pread":
            data = os.pread(self.f.fileno(), R, i * R)
        else:
            self.f.seek(i * R)
            data = self.f.read(R)
        return torch.tensor(int(int.from_bytes(data[:8], "little") != i))


path = sys.argv[1]
if not os.path.exists(path):
    with open(path, "wb") as f:
        for i in range(N):
            f.write(i.to_bytes(8, "little") * (R // 8))
wrong = sum(int(b.sum()) for b in DataLoader(Records(path, sys.argv[2]), batch_size=64, shuffle=True, num_workers=2))
print(wrong)
