"""Hooking a module once the program imports it, without importing it first (``collect._after_import``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from xstack.collect._after_import import AfterImport, after_import


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh importable package ``xs_probe_pkg`` whose code sets ``READY``."""
    root = tmp_path / "xs_probe_pkg"
    root.mkdir()
    (root / "__init__.py").write_text("READY = True\n")
    (root / "sub.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "xs_probe_pkg"
    for name in [n for n in sys.modules if n.startswith("xs_probe_pkg")]:
        del sys.modules[name]


def test_the_callback_runs_once_after_the_modules_code_and_the_watcher_leaves(package: str) -> None:
    seen: list[bool] = []
    watcher = after_import(package, lambda: seen.append(sys.modules[package].READY), lambda e: None)
    assert isinstance(watcher, AfterImport) and watcher in sys.meta_path and package not in sys.modules
    __import__(f"{package}.sub")  # a submodule imports its package first
    assert seen == [True] and watcher not in sys.meta_path
    del sys.modules[package]
    __import__(package)  # a second import of the module: the watcher is gone
    assert seen == [True]


def test_an_imported_module_runs_the_callback_now(package: str) -> None:
    __import__(package)
    seen: list[int] = []
    assert after_import(package, lambda: seen.append(1), lambda e: None) is None and seen == [1]


def test_a_failing_callback_never_fails_the_programs_import(package: str) -> None:
    errors: list[BaseException] = []

    def boom() -> None:
        raise RuntimeError("no hooks")

    after_import(package, boom, errors.append)
    module = __import__(package)
    assert module.READY and [str(e) for e in errors] == ["no hooks"]


def test_a_watcher_removed_before_the_import_calls_nothing(package: str) -> None:
    seen: list[int] = []
    watcher = after_import(package, lambda: seen.append(1), lambda e: None)
    assert watcher is not None
    watcher.remove()
    watcher.remove()  # idempotent
    __import__(package)
    assert seen == [] and watcher not in sys.meta_path


def test_a_module_that_does_not_exist_is_left_to_fail_as_it_would(package: str) -> None:
    watcher = after_import("xs_probe_missing", lambda: None, lambda e: None)
    try:
        with pytest.raises(ModuleNotFoundError):
            __import__("xs_probe_missing")
    finally:
        assert watcher is not None
        watcher.remove()


def test_two_watchers_of_one_module_each_run_in_the_order_they_were_set(package: str) -> None:
    """The second watcher wraps the loader the first wrapped already: unwrapping it deleted the first one's
    wrapper, and the program's import failed (AttributeError: no attribute 'exec_module')."""
    seen: list[str] = []
    after_import(package, lambda: seen.append("first"), lambda e: None)
    after_import(package, lambda: seen.append("second"), lambda e: None)
    module = __import__(package)
    assert module.READY and seen == ["first", "second"]
    loader = sys.modules[package].__spec__.loader
    assert "exec_module" not in vars(loader)  # the loader's own method again


BROKEN_TORCH = """
import sys, xstack
with xstack.profile(levels="model,layer,op", path=sys.argv[1]):
    import torch  # a stand-in without Tensor or autograd: the layer and op levels' hooking fails on it
    print(torch.READY)
    xstack.step()
"""


def test_hooking_that_fails_at_the_program_s_import_of_torch_is_each_level_s_health(tmp_path: Path) -> None:
    """The layer and op levels hook PyTorch where the program imports it, as the model level does. Where that
    fails, the program's import goes on and each level says what it did not record."""
    import subprocess

    from xstack.trace.store import Store

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("READY = 'imported'\n")
    (tmp_path / "prog.py").write_text(BROKEN_TORCH)
    env = {"PYTHONPATH": f"{tmp_path}:{Path(__file__).resolve().parents[2] / 'src'}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "prog.py", "p.duckdb"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout == "imported\n", done.stderr
    with Store.open(tmp_path / "p.duckdb") as store:
        health = dict(store.query('SELECT "check", detail FROM health'))
    for check in ("layer_hooks_failed", "op_level_failed"):
        assert "the program imported torch failed (" in health[check], (check, health)
