"""A DataLoader of 2 workers reading the rows of one HDF5 dataset (tests/collect/test_dataloaders.py).

argv: PATH, MODE: ``shared`` (the ``h5py.File`` opened in the dataset's ``__init__``, before the workers fork: they
read through the descriptor they inherited) or ``own`` (opened in each worker on first use). Prints the sum of the
rows read, one per item, so that both modes can be checked to read the same data.
"""

import sys

import h5py
import torch
from torch.utils.data import DataLoader, Dataset


class Rows(Dataset):
    def __init__(self, path: str, mode: str) -> None:
        self.path = path
        with h5py.File(path, "r") as f:
            self.n = len(f["x"])
        self.file = h5py.File(path, "r") if mode == "shared" else None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        return torch.from_numpy(self.file["x"][i])


total = 0.0
for batch in DataLoader(Rows(sys.argv[1], sys.argv[2]), batch_size=32, num_workers=2):
    total += float(batch.double().sum())
print(repr(total))
