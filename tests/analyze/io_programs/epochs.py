"""A training loop that reads its data files through a DataLoader, for ``diff.io`` (tests/analyze/test_diff_io.py).

argv: DATA_DIR EPOCHS OUT [LABELS]. Each epoch reads every file of DATA_DIR once, whole, in the main process
(num_workers=0); LABELS, when given, is read once before the loop; then OUT is written: 512 bytes per epoch.
"""

import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset

import xstack


class Files(Dataset):
    def __init__(self, root: str) -> None:
        self.paths = sorted(os.path.join(root, n) for n in os.listdir(root))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        with open(self.paths[i], "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).float()


data_dir, epochs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if len(sys.argv) > 4:
    with open(sys.argv[4], "rb") as f:
        labels = f.read()
model = torch.nn.Linear(4096, 1)
loader = DataLoader(Files(data_dir), batch_size=2)
for _epoch in range(epochs):
    for batch in loader:
        model(batch).sum().backward()
        xstack.step()
with open(out, "wb") as f:
    f.write(b"w" * 512 * epochs)
print("done")
