"""The model level finds top-level module calls without putting the calls nested in them on the slow path."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
nn = torch.nn
module_globals = torch.nn.modules.module

import xstack  # noqa: E402


class Probe(nn.Module):
    """Records, on each call, whether any global module hook was installed while it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.seen: list[bool] = []

    def forward(self, x: Any) -> Any:
        self.seen.append(bool(module_globals._global_forward_pre_hooks or module_globals._global_forward_hooks))
        return self.fc(x)


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Probe()
        self.head = nn.Linear(4, 2)

    def forward(self, x: Any) -> Any:
        return self.head(self.inner(x))


def _model_spans(path: Path) -> list[tuple[str, str | None, int | None]]:
    with xstack.open_store(path) as store:
        rows = store.query("SELECT name, attrs, parent_id FROM spans WHERE level = 'model' ORDER BY start_ns")
    return [(n, orjson.loads(a or "{}").get("model.kind"), p) for n, a, p in rows]


def test_each_top_level_call_is_a_span_and_nested_calls_run_without_global_hooks(tmp_path: Path) -> None:
    outer, other = Outer(), nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with xstack.profile(levels="model", path=tmp_path / "p.duckdb") as prof:
        for _ in range(3):
            outer(x)
            other(x)
            prof.step()
        outer.inner(x)  # a sub-module called on its own is a top-level call too ...
        outer(x)  # ... and opens no span of its own when called inside its model again
    forwards = [(n, k) for n, k, _ in _model_spans(tmp_path / "p.duckdb") if k == "forward"]
    assert forwards == [("Outer", "forward"), ("Linear", "forward")] * 3 + [("Probe", "forward"), ("Outer", "forward")]
    # the first call of each root runs while the sentinel is away; nested calls never see a global hook
    assert outer.inner.seen == [False] * 5
    # nothing is left on the roots after the profile
    assert not outer._forward_pre_hooks and not outer._forward_hooks and not other._forward_hooks


def test_a_forward_that_raises_closes_its_span_and_the_next_call_is_seen(tmp_path: Path) -> None:
    class Broken(nn.Module):
        def forward(self, x: Any) -> Any:
            raise ValueError("boom")

    broken, fine = Broken(), nn.Linear(4, 4)
    with xstack.profile(levels="model", path=tmp_path / "p.duckdb"):
        with pytest.raises(ValueError):
            broken(torch.randn(1, 4))
        fine(torch.randn(1, 4))
    names = [n for n, k, _ in _model_spans(tmp_path / "p.duckdb") if k == "forward"]
    assert names == ["Broken", "Linear"]
    with xstack.open_store(tmp_path / "p.duckdb") as store:
        assert not store.query("SELECT * FROM health WHERE \"check\" = 'unclosed_spans'")


def test_known_roots_are_seen_on_every_thread(tmp_path: Path) -> None:
    model = nn.Linear(4, 4)
    x = torch.randn(1, 4)
    with xstack.profile(levels="model", path=tmp_path / "p.duckdb"):
        model(x)  # known from here on

        def work() -> None:
            for _ in range(20):
                model(x)

        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    forwards = [n for n, k, _ in _model_spans(tmp_path / "p.duckdb") if k == "forward"]
    assert forwards == ["Linear"] * 41


def test_results_are_unchanged_at_the_model_level(tmp_path: Path) -> None:
    torch.manual_seed(0)
    outer = Outer()
    x = torch.randn(8, 4)
    plain = [outer(x) for _ in range(3)]
    with xstack.profile(levels="model", path=tmp_path / "p.duckdb"):
        profiled = [outer(x) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled, strict=True))


class _AutoEncoder(nn.Module):
    """A module that is never called itself: its ``training_step`` calls its encoder and its decoder, as a
    LightningModule's does; ``generate`` calls the module itself, as a Hugging Face model's does."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
        self.decoder = nn.Sequential(nn.Linear(4, 8), nn.ReLU())

    def forward(self, x: Any) -> Any:
        return self.decoder(self.encoder(x))

    def training_step(self, x: Any) -> Any:
        return self.decoder(self.encoder(x))

    def generate(self, x: Any) -> Any:
        return self(x)


class _Trainer:
    """Calls the model from a method of its own, as a trainer does."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def step(self, x: Any) -> Any:
        return self.model.encoder(x)


@pytest.mark.parametrize("levels", ["model", "model,layer"])
def test_models_called_by_the_module_that_holds_them_are_named_by_their_place_in_it(tmp_path: Path,
                                                                                     levels: str) -> None:  # fmt: skip
    """The encoder and the decoder were both ``Sequential``, and their layers both ``0`` and ``1``: the layer
    tables added them up as one. (A model keeps the name found at its first call.)"""
    module, x = _AutoEncoder(), torch.randn(2, 8)
    with xstack.profile(levels=levels, path=tmp_path / "p.duckdb") as prof:
        module.training_step(x)
        module.generate(x)  # the module calls itself: it is the model
        _Trainer(_AutoEncoder()).step(x)  # something that is no module calls it: named by its type
    with prof.open() as store:
        rows = store.query("SELECT level, name FROM spans WHERE level IN ('model', 'layer') ORDER BY start_ns")
    forwards = [name for level, name in rows if level == "model" and name != "region"]
    assert forwards == ["encoder", "decoder", "_AutoEncoder", "Sequential"]
    if "layer" in levels:
        layers = [name for level, name in rows if level == "layer"]
        assert layers[:6] == ["encoder", "encoder.0", "encoder.1", "decoder", "decoder.0", "decoder.1"]
        assert layers[6:] == ["_AutoEncoder", "encoder", "encoder.0", "encoder.1", "decoder", "decoder.0", "decoder.1",
                              "Sequential", "0", "1"]  # fmt: skip


class _GanTrainer:
    """No module: holds its two models as attributes, and calls them from its own method."""

    def __init__(self) -> None:
        self.gen = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
        self.disc = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(), nn.Linear(8, 1))

    def step(self, z: Any) -> Any:
        return self.disc(self.gen(z))


def _names(store: Any) -> tuple[list[str], list[str]]:
    rows = store.query("SELECT level, name FROM spans WHERE level IN ('model', 'layer') ORDER BY start_ns")
    return (
        [n for level, n in rows if level == "model" and n != "region"],
        [n for level, n in rows if level == "layer"],
    )


def test_two_models_of_one_type_are_told_apart_by_the_names_the_program_calls_them_by(tmp_path: Path) -> None:
    """A GAN's generator and discriminator were both ``Sequential``, their layers both ``0``, ``1``, ``2``: the
    layer tables summed a ReLU with a LeakyReLU. The first model keeps its name; the second takes the name its
    caller holds it by (a variable, or an attribute of the caller's ``self``)."""
    G = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))  # noqa: N806
    D = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(), nn.Linear(8, 1))  # noqa: N806
    trainer, z = _GanTrainer(), torch.randn(2, 4)
    with xstack.profile(levels="model,layer", path=tmp_path / "p.duckdb") as prof:
        for _ in range(2):
            D(G(z))
    with prof.open() as store:
        forwards, layers = _names(store)
    assert forwards == ["Sequential", "D"] * 2
    assert layers == ["Sequential", "0", "1", "2", "D", "D.0", "D.1", "D.2"] * 2
    with xstack.profile(levels="model,layer", path=tmp_path / "t.duckdb") as prof:
        trainer.step(z)
    with prof.open() as store:
        forwards, layers = _names(store)
    assert forwards == ["Sequential", "disc"]  # G and D, alive but not called, took no name in this profile
    assert layers == ["Sequential", "0", "1", "2", "disc", "disc.0", "disc.1", "disc.2"]


def test_models_called_in_turn_by_one_variable_are_numbered(tmp_path: Path) -> None:
    models = [nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(3)]
    x = torch.randn(2, 4)
    with xstack.profile(levels="model,layer", path=tmp_path / "p.duckdb") as prof:
        for model in models:  # "model" names each in turn: it names none of them
            model(x)
    with prof.open() as store:
        forwards, layers = _names(store)
    assert forwards == ["Sequential", "Sequential#2", "Sequential#3"]
    assert layers == ["Sequential", "0", "1", "Sequential#2", "Sequential#2.0", "Sequential#2.1",
                      "Sequential#3", "Sequential#3.0", "Sequential#3.1"]  # fmt: skip
