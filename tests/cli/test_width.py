"""How wide ``xstack summary`` and ``xstack diff`` print: unwrapped in a pipe or a file, at the terminal's width
on a terminal (a real pseudo-terminal of a set size), at ``COLUMNS`` where it is set."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from tests.conftest import kineto_fixture
from xstack.importers.kineto import import_kineto
from xstack.trace.store import Store

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
FLOWS = "flow arrows (ac2g, fwdbwd) with a start and no finish, or a finish and no start"
"""The BERT trace's first health finding: 82 characters, which rich's 80-column fallback wrapped."""


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The real BERT and ViT inference traces, imported."""
    tmp = tmp_path_factory.mktemp("width")
    out = []
    for name in ("h100_bert_small_infer_full", "h100_vit_image_cls_infer_full"):
        with Store.create(tmp / f"{name}.duckdb") as store:
            import_kineto(store, kineto_fixture(f"{name}.json.gz"))
        out.append(tmp / f"{name}.duckdb")
    return out[0], out[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return env | extra


def in_a_pipe(*args: str, **env: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "xstack", *args], capture_output=True, text=True, env=_env(**env),
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def on_a_terminal(columns: int, *args: str) -> str:
    """The command's output on a pseudo-terminal ``columns`` wide, escape codes left out."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "xstack", *args], stdin=slave, stdout=slave, stderr=slave,
                            env=_env(TERM="xterm-256color"))  # fmt: skip
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=120) == 0
    return ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")


def _widest(text: str) -> int:
    return max(len(line.rstrip()) for line in text.splitlines())


def test_in_a_pipe_tables_keep_their_width(stores: tuple[Path, Path]) -> None:
    bert, vit = map(str, stores)
    summary = in_a_pipe("summary", bert)
    assert any(FLOWS in line for line in summary.splitlines()), summary  # the finding on one line
    diff = in_a_pipe("diff", bert, vit, "--top", "5")
    headers = [line for line in diff.splitlines() if "┃ item" in line]
    assert headers and all(h in headers[0] for h in ("status", "items", "delta", "change (%)", "noise"))
    assert _widest(diff) > 80
    assert _widest(in_a_pipe("diff", bert, vit, "--top", "5", COLUMNS="80")) <= 80  # COLUMNS still wins


def test_on_a_terminal_the_output_fits_it(stores: tuple[Path, Path]) -> None:
    bert, vit = map(str, stores)
    for args in (("summary", bert), ("diff", bert, vit, "--top", "5")):
        text = on_a_terminal(100, *args)
        assert 80 < _widest(text) <= 100, args


def test_in_a_pipe_no_line_ends_in_the_padding_of_its_table(stores: tuple[Path, Path]) -> None:
    """rich pads every cell to its column's width: the run's key/value lines, a table's title and its last
    column were printed with spaces to the widest line, which every grep, diff or mail of the output carried."""
    bert, vit = map(str, stores)
    for args in (("summary", bert), ("diff", bert, vit, "--top", "5"), ("summary", bert, "--top", "3")):
        for env in ({}, {"COLUMNS": "80"}):
            text = in_a_pipe(*args, **env)
            padded = [line for line in text.splitlines() if line != line.rstrip()]
            assert not padded and ("\n source " in text or args[0] == "diff"), (args, env, padded[:3])
