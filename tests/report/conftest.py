"""Fixtures of the report tests: the real BERT trace imported and analysed once for the whole package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import kineto_fixture
from xstack.analyze.pipeline import Analysis, analyze
from xstack.importers.kineto import import_kineto
from xstack.trace.store import Store

BERT = "h100_bert_small_infer_full.json.gz"


@pytest.fixture(scope="package")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, Analysis]]:
    """The real H100 BERT inference trace as a store (open read-only) and its full analysis."""
    trace = kineto_fixture(BERT)
    path = tmp_path_factory.mktemp("bert") / "bert.duckdb"
    with Store.create(path) as store:
        import_kineto(store, trace)
    store = Store.open(path)
    yield store, analyze(store)
    store.close()


@pytest.fixture(scope="package")
def bert_path(bert: tuple[Store, Analysis]) -> Path:
    return bert[0].path
