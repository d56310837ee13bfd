"""A training loop over two real DataLoaders, for their recorded settings (tests/collect/test_dataloaders.py).

argv: DATA_DIR. ``train`` reads the files of DATA_DIR in 2 persistent workers, slowly (the loop waits for it),
for 2 epochs; ``val`` reads them in the main process once, a batch per
``__getitems__`` call. A third DataLoader is made and never iterated.
"""

import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import xstack


class Files(Dataset):
    def __init__(self, root: str, delay_s: float) -> None:
        self.paths = sorted(os.path.join(root, n) for n in os.listdir(root))
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay_s)  # a wait, no CPU: a remote store's latency, say
        with open(self.paths[i], "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).float()


class Validation(Files):
    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:  # the DataLoader's batched fetch
        return [self[i] for i in indices]


model = torch.nn.Linear(64, 1)
train = DataLoader(Files(sys.argv[1], 0.01), batch_size=4, num_workers=2, persistent_workers=True,
                   prefetch_factor=3)  # fmt: skip
val = DataLoader(Validation(sys.argv[1], 0.0), batch_size=8)
unused = DataLoader(Files(sys.argv[1], 0.0), batch_size=2)
for _epoch in range(2):
    for batch in train:
        model(batch).sum().backward()
        xstack.step()
with torch.no_grad():
    for batch in val:
        model(batch)
print("done")
