"""Hugging Face's ``generate`` is a model stage of its own, holding the model's forward calls, on a real GPT-2
built from its config (no weights downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import xstack  # noqa: E402
from xstack.analyze.health import stage_breakdown  # noqa: E402


def _gpt2() -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=200, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    return transformers.GPT2LMHeadModel(config).eval()


def _generate(model: Any, prof: Any = None) -> list[Any]:
    ids = torch.randint(0, 200, (2, 6), generator=torch.Generator().manual_seed(1))
    out = []
    for _ in range(4):
        out.append(model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0))
        if prof is not None:
            prof.step()
    return out


@pytest.mark.parametrize("levels", ["model", "model,layer"])
def test_each_generate_call_is_a_stage_that_holds_its_forward_calls(tmp_path: Path, levels: str) -> None:
    original = transformers.GenerationMixin.generate
    model = _gpt2()
    plain = _generate(model)
    with xstack.profile(levels=levels, path=tmp_path / "g.duckdb") as prof:
        profiled = _generate(model, prof)
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled, strict=True))  # the same tokens
    assert transformers.GenerationMixin.generate is original  # put back
    with prof.open() as store:
        rows = store.query(
            "SELECT span_id, parent_id, name, attrs->>'$.\"model.kind\"', start_ns, start_ns + dur_ns FROM spans "
            "WHERE level = 'model' ORDER BY start_ns"
        )
        stages = {(r["stage"], r["kind"]): r for r in stage_breakdown(store, 1).to_records()}
    generates = [r for r in rows if r[3] == "generate"]
    forwards = [r for r in rows if r[3] == "forward"]
    assert [r[2] for r in generates] == ["GPT2LMHeadModel.generate"] * 4
    assert len(forwards) == 4 * 8  # one forward per new token
    for f in forwards:  # each forward call inside a generate call, as its child
        parent = next(g for g in generates if g[0] == f[1])
        assert parent[4] <= f[4] and f[5] <= parent[5]
    # the time between a generation's forward calls (the tokens chosen, the stopping criteria) is in its stage
    for g in generates:
        inside = sum(f[5] - f[4] for f in forwards if f[1] == g[0])
        assert g[5] - g[4] > inside > 0
    assert stages[("GPT2LMHeadModel.generate", "generate")]["calls"] == 3  # past the warm-up
