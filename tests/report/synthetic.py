"""A synthetic profile of 10^5 GPU kernels, built in SQL in about a second, for report scale tests.

One step (model span) of ``layers`` layer calls, each of ``ops_per_layer`` operators; each operator launches
one kernel (a ``cudaLaunchKernel`` runtime call and its kernel, paired by correlation id), as the Kineto
importer links them. Kernel names cycle through ordinary C++ names and a few hostile ones (markup, quotes,
``</script>``) that the report must show as text.
"""

from __future__ import annotations

from pathlib import Path

from xstack.trace.store import RunInfo, Store

HOSTILE_NAMES = (
    "<script>alert(1)</script>",
    'void k<float></script><img src=x onerror="alert(2)">&amp; "q" \'s\'',
)
"""Kernel names that would run script or fetch an image if the report pasted them into markup unescaped."""
HOSTILE_LAYER = "model.blocks.0.</script><b>bold</b>"
NAMES = 200
"""Distinct ordinary kernel names."""


def build_store(path: Path, layers: int = 1000, ops_per_layer: int = 100) -> Path:
    """Write the synthetic store to ``path``: ``layers * ops_per_layer`` ops, runtime calls and kernels."""
    n = layers * ops_per_layer
    with Store.create(path) as store:
        store.add_run(
            RunInfo(
                1,
                "synthetic-1e5",
                command="synthetic",
                framework="pytorch",
                device="cuda:0",
                levels=["model", "layer", "op", "runtime", "kernel"],
                pass_name="import",
                config={"devices": [{"id": 0, "name": "Synthetic GPU <0>"}]},
            )
        )
        con = store.con
        con.execute(
            "INSERT INTO _spans VALUES (1, 1, NULL, 'model', 'ProfilerStep#0', 0, ?, 1, 1, 'cpu', NULL, NULL, "
            """'{"model.kind": "step"}')""",
            [layers * 100_000],
        )
        con.execute(
            """INSERT INTO _spans SELECT 1, 2 + i, 1, 'layer', 'Linear_' || i, i * 100000, 90000, 1, 1, 'cpu',
                   NULL, NULL, json_object('layer.path', CASE WHEN i = 0 THEN ? ELSE 'model.blocks.' || i END,
                                           'layer.type', 'Linear')
               FROM range(?) t(i)""",
            [HOSTILE_LAYER, layers],
        )
        op_start = f"(k // {ops_per_layer}) * 100000 + (k % {ops_per_layer}) * 900"
        con.execute(
            f"""INSERT INTO _spans SELECT 1, 1000000 + k, 2 + k // {ops_per_layer}, 'op', 'aten::addmm',
                   {op_start}, 800, 1, 1, 'cpu', NULL, NULL, NULL FROM range(?) t(k)""",
            [n],
        )
        con.execute(
            f"""INSERT INTO _spans SELECT 1, 2000000 + k, 1000000 + k, 'runtime', 'cudaLaunchKernel',
                   {op_start} + 100, 300, 1, 1, 'cpu', NULL, k, NULL FROM range(?) t(k)""",
            [n],
        )
        names = "CASE k % 97 WHEN 0 THEN $h0 WHEN 1 THEN $h1 ELSE 'void gemm_kernel_' || (k % $names) || " \
            "'<float, 128>(Params)' END"  # fmt: skip
        con.execute(
            f"""INSERT INTO _spans SELECT 1, 3000000 + k, 2000000 + k, 'kernel', {names},
                   {op_start} + 500, 300 + (k % 7) * 50, 0, 7, 'cuda:0', 7, k,
                   '{{"kernel.grid": [64, 1, 1], "kernel.block": [128, 1, 1]}}' FROM range($n) t(k)""",
            {"h0": HOSTILE_NAMES[0], "h1": HOSTILE_NAMES[1], "names": NAMES, "n": n},
        )
    return path
