"""An IterableDataset over the shards of DATA_DIR in 2 workers (tests/collect/test_dataloaders.py).

argv: DATA_DIR, ``split`` (each worker reads its own shards, by ``get_worker_info``) or ``all`` (each reads every
shard: every item yielded twice). Prints the items the loop saw.
"""

import os
import sys

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class Shards(IterableDataset):
    def __init__(self, root: str, split: bool) -> None:
        self.files = sorted(os.path.join(root, n) for n in os.listdir(root))
        self.split = split

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        files = self.files[info.id :: info.num_workers] if self.split and info is not None else self.files
        for path in files:
            with open(path, "rb") as f:
                for line in f:
                    yield torch.tensor([float(len(line))])


model = torch.nn.Linear(1, 1)
items = 0
for batch in DataLoader(Shards(sys.argv[1], sys.argv[2] == "split"), batch_size=8, num_workers=2):
    model(batch).sum().backward()
    items += len(batch)
print(items)
