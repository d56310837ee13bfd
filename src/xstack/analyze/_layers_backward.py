"""``layers.backward``: each layer's backward time beside its forward time.

The layer level times ``nn.Module`` calls, which are forward calls: a training step's backward pass runs outside
every one of them, so its operators are the op level's "outside layers". Autograd links each backward node to the
forward operator that made it: both carry the same sequence number (Kineto's ``Sequence number``, kept as
``op.sequence_number``). A backward node (an ``autograd::engine::evaluate_function: ...`` operator; of one that
runs others inside it, as a re-entrant checkpoint's does its block's, the time outside them) is charged to the
layer whose forward operator has its sequence number (in its process; of several, the one whose name the node's
names, ``aten::_log_softmax`` for ``LogSoftmaxBackward0``, else the latest started before it: a merged run lays
out the forward operators of one pass and the backward of another, which need not keep their order), and to
every layer that encloses that one. Nodes with no such operator, or whose operator ran outside
every layer (gradient accumulation into the parameters, ``AccumulateGrad``; the loss), are no layer's: the facts
count them. Layer calls recomputed in the backward pass (activation checkpointing) are no forward calls: their
time is in the backward node they ran in.

This is the PyTorch profiler's forward/backward correlation, which its TensorBoard plugin's module view meant to
draw, joined to xstack's layer spans.
"""

from __future__ import annotations

from typing import Any

from xstack.analyze.context import RunContext, run_context
from xstack.analyze.layers import _table, _warm_labels
from xstack.analyze.result import Chart, Column, Result, format_ns, notes_of
from xstack.text import counted
from xstack.trace import attrs as A
from xstack.trace.store import Store

BACKWARD_NODE = "autograd::engine::evaluate_function: "
"""How the PyTorch profiler names the run of one autograd node in a backward pass."""


def _seq(alias: str) -> str:
    """SQL: the autograd sequence number of the span ``alias`` (NULL where it has none)."""
    return f"""TRY_CAST({alias}.attrs->>'$."{A.OP_SEQUENCE_NUMBER}"' AS BIGINT)"""


def _nodes_sql(ctx: RunContext) -> str:
    """SQL: one row per backward node counted (past the warm-up, before the last step's end): its id, its own time
    (less that of the nodes run inside it, as a re-entrant checkpoint's backward runs its block's) and the layer
    span its forward operator ran in (NULL: none)."""
    return f"""WITH RECURSIVE node AS (
            SELECT span_id, parent_id, pid, start_ns, dur_ns, {_seq("spans")} AS seq,
                lower(regexp_replace(replace(name, '{BACKWARD_NODE}', ''), 'Backward[0-9]*$', '')) AS made_by
            FROM spans WHERE run_id = $run AND level = 'op' AND starts_with(name, '{BACKWARD_NODE}')
        ), up(node_id, anc, depth) AS (
            SELECT span_id, parent_id, 1 FROM node
            UNION ALL
            SELECT up.node_id, s.parent_id, up.depth + 1 FROM up JOIN spans s ON s.run_id = $run AND s.span_id = up.anc
            WHERE s.level = 'op'
        ), nearest AS (  -- the node each nested node runs in
            SELECT up.node_id, arg_min(up.anc, up.depth) AS outer_id FROM up JOIN node n ON n.span_id = up.anc
            GROUP BY 1
        ), inner_ns AS (
            SELECT e.outer_id, sum(n.dur_ns) AS ns FROM nearest e JOIN node n ON n.span_id = e.node_id GROUP BY 1
        ), fwd AS (
            SELECT o.pid, {_seq("o")} AS seq, o.start_ns, w.layer_id,
                replace(regexp_replace(o.name, '^.*::', ''), '_', '') AS op_name
            FROM spans o JOIN {ctx.owners()} w ON w.span_id = o.span_id
            WHERE o.run_id = $run AND o.level = 'op' AND w.layer_id IS NOT NULL
                AND NOT starts_with(o.name, '{BACKWARD_NODE}')
                AND {_seq("o")} IS NOT NULL
        ), counted AS (
            SELECT n.*, greatest(n.dur_ns - coalesce(i.ns, 0), 0) AS own_ns FROM node n
            LEFT JOIN inner_ns i ON i.outer_id = n.span_id
            WHERE NOT {ctx.in_warmup("n.start_ns")} AND NOT {ctx.after_last_step("n.start_ns")}
        )
        SELECT n.span_id AS node_id, n.own_ns AS dur_ns, f.layer_id
        FROM counted n LEFT JOIN fwd f ON n.pid = f.pid AND n.seq = f.seq
        QUALIFY row_number() OVER (PARTITION BY n.span_id ORDER BY f.op_name = n.made_by DESC NULLS LAST,
                                   f.start_ns <= n.start_ns DESC, f.start_ns DESC NULLS LAST) = 1"""


def _has_nodes(store: Store, run_id: int) -> bool:
    """Whether the run holds any backward node (one scan of its op names, before the span walks)."""
    return bool(
        store.query(
            f"SELECT count(*) FROM spans WHERE run_id = ? AND level = 'op' AND starts_with(name, '{BACKWARD_NODE}')",
            [run_id],
        )[0][0]
    )


def _nodes(ctx: RunContext) -> str:
    """Name of a temp table of the run's counted backward nodes (``_nodes_sql``), made once per run context (as
    ``layers._table``): the analysis, the summary's top layers and the diff read it."""
    name = f"_ax_backward_{ctx.run_id}"
    if name not in ctx._tables:
        ctx.store.con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS {_nodes_sql(ctx)}", {"run": ctx.run_id})
        ctx._tables[name] = name
    return name


def _charged_sql(nodes: str, layers: str) -> str:
    """SQL: each node of ``nodes`` charged to its layer (``own``) and to every layer around it: node_id, dur_ns,
    layer_id, own."""
    return f"""WITH RECURSIVE charged(node_id, dur_ns, layer_id, own) AS (
            SELECT node_id, dur_ns, layer_id, true FROM {nodes} WHERE layer_id IS NOT NULL
            UNION ALL
            SELECT c.node_id, c.dur_ns, l.parent_id, false FROM charged c
            JOIN {layers} l ON l.span_id = c.layer_id JOIN {layers} p ON p.span_id = l.parent_id
        ) SELECT * FROM charged"""


def backward_ops_table(store: Store, ctx: RunContext) -> str | None:
    """Name of a temp table ``(span_id, layer_id)``: each operator of a counted backward node (the node and the
    operators it runs, not those of a node run inside it) and the layer span the node is charged to, made once per
    run context, for the diff to key the backward's operators by their layer; None where the run has no layer and
    op levels or no backward node."""
    if not (ctx.has("layer") and ctx.has("op")) or not _has_nodes(store, ctx.run_id):
        return None
    name = f"_ax_backward_ops_{ctx.run_id}"
    if name not in ctx._tables:
        store.con.execute(
            f"""CREATE OR REPLACE TEMP TABLE {name} AS
            WITH RECURSIVE down(span_id, layer_id) AS (
                SELECT node_id, layer_id FROM {_nodes(ctx)} WHERE layer_id IS NOT NULL
                UNION ALL
                SELECT c.span_id, d.layer_id FROM down d JOIN spans c ON c.run_id = $run AND c.parent_id = d.span_id
                WHERE c.level = 'op' AND NOT starts_with(c.name, '{BACKWARD_NODE}')
            ) SELECT * FROM down""",
            {"run": ctx.run_id},
        )
        ctx._tables[name] = name
    return name


def backward_by_layer(store: Store, run_id: int) -> dict[str, int]:
    """The backward time (ns) charged to each layer name (its own nodes' and its sub-layers', as column
    ``backward`` of ``layers.backward``), for the summary's top layers; empty where the run has no layer and op
    levels or no backward pass."""
    ctx = run_context(store, run_id)
    if not (ctx.has("layer") and ctx.has("op")) or not _has_nodes(store, ctx.run_id):
        return {}
    layers = _table(ctx)
    rows = store.query(
        f"""SELECT l.name, sum(c.dur_ns) FROM ({_charged_sql(_nodes(ctx), layers)}) c
            JOIN {layers} l ON l.span_id = c.layer_id GROUP BY 1"""
    )
    return {str(n): int(t) for n, t in rows}


def layer_backward(store: Store, run_id: int) -> Result:
    """``layers.backward``: per layer (path and type), its forward calls and their time, and the time of the
    backward nodes its forward operators made (``backward``: its own and its sub-layers'; ``backward self``: its
    own), with backward over forward, largest backward first; past the warm-up, as A5-A7 count.

    Notes: a backward node is an ``autograd::engine::evaluate_function`` operator; it is charged to the layer whose
    forward operator carries its sequence number (module docstring). Facts: ``backward_ns``, the time of every
    counted node; ``attributed_ns`` and ``attributed_pct``, the part charged to a layer; ``nodes`` and
    ``unattributed_nodes``; ``unattributed`` names the three nodes with the most time that are no layer's (most
    often ``AccumulateGrad``, a parameter's gradient accumulated, and the loss's). In a merged run the forward
    times are the layer pass's and the backward times the op pass's, which its op recording slows: compare
    layers within a column more than across the two."""
    ctx = run_context(store, run_id)
    title = "Forward and backward time per layer"
    if missing := ctx.require("layers.backward", title, "layer", "op"):
        return missing
    if not _has_nodes(store, ctx.run_id):
        return ctx.lacking("layers.backward", title, "backward")
    layers = _table(ctx)
    nodes = _nodes(ctx)
    total, count, attributed, unattributed_n = store.query(
        f"""SELECT coalesce(sum(dur_ns), 0), count(*), coalesce(sum(dur_ns) FILTER (layer_id IS NOT NULL), 0),
            count(*) FILTER (layer_id IS NULL) FROM {nodes}"""
    )[0]
    if not count:
        return ctx.lacking("layers.backward", title, "backward")
    recomputed = f"""(SELECT span_id FROM spans WHERE run_id = {int(ctx.run_id)} AND level = 'layer'
        AND coalesce(TRY_CAST(attrs->>'$."{A.LAYER_RECOMPUTED}"' AS BOOLEAN), false))"""
    n_recomputed = int(store.query(f"SELECT count(*) FROM {recomputed}")[0][0])
    rows = store.query(
        f"""WITH back AS (
                SELECT l.path, l.type, sum(c.dur_ns) AS backward_ns,
                    coalesce(sum(c.dur_ns) FILTER (c.own), 0) AS own_ns
                FROM ({_charged_sql(nodes, layers)}) c JOIN {layers} l ON l.span_id = c.layer_id GROUP BY 1, 2
            ), fwd AS (
                SELECT path, type, count(*) AS calls, sum(dur_ns) AS forward_ns, min(start_ns) AS first
                FROM {layers} WHERE counted AND span_id NOT IN (SELECT span_id FROM {recomputed}) GROUP BY 1, 2
            )
            SELECT path, type, coalesce(calls, 0), forward_ns, backward_ns, own_ns,
                backward_ns / nullif(forward_ns, 0)
            FROM back LEFT JOIN fwd USING (path, type)
            ORDER BY backward_ns DESC, first, path"""
    )
    named = store.con.execute(
        f"""SELECT replace(s.name, '{BACKWARD_NODE}', ''), count(*), sum(n.dur_ns) FROM {nodes} n
            JOIN spans s ON s.run_id = $run AND s.span_id = n.node_id
            WHERE n.layer_id IS NULL GROUP BY 1 ORDER BY 3 DESC, 1 LIMIT 3""",
        {"run": ctx.run_id},
    ).fetchall()
    cols = [
        Column("path"),
        Column("type"),
        Column("calls", "count", "forward calls of the layer, past the warm-up"),
        Column("forward", "ns", "the forward calls' time"),
        Column(
            "backward", "ns", "time of the backward nodes made by the layer's forward operators and its sub-layers'"
        ),
        Column("backward self", "ns", "time of the backward nodes made by the layer's own forward operators"),
        Column("backward / forward", "ratio"),
    ]
    out: list[tuple[Any, ...]] = [
        (str(p), t, int(c), None if f is None else int(f), int(b), int(o), None if r is None else float(r))
        for p, t, c, f, b, o, r in rows
    ]
    facts: dict[str, Any] = {
        "backward_ns": int(total),
        "attributed_ns": int(attributed),
        "attributed_pct": 100.0 * int(attributed) / int(total) if total else None,
        "nodes": int(count),
        "unattributed_nodes": int(unattributed_n),
        "unattributed": [{"node": str(n), "calls": int(c), "ns": int(t)} for n, c, t in named],
    }
    labels = [
        f"{format_ns(int(attributed))} of the backward pass's {format_ns(int(total))} charged to layers "
        f"({facts['attributed_pct']:.0f}%); the rest is no layer's"
        + (": " + ", ".join(f"{n} {format_ns(int(t))}" for n, _, t in named) if named else "")
    ]
    if n_recomputed:
        labels.append(
            f"{counted(n_recomputed, 'layer call')} recomputed in the backward pass (activation checkpointing) "
            "left out of the forward columns: their time is in the backward nodes they ran in"
        )
    if ctx.pass_name == "merged":
        labels.append(
            "forward times from the layer pass, backward times from the op pass, which its op recording slows: "
            "compare layers within a column"
        )
    return Result(
        "layers.backward",
        title,
        cols,
        out,
        notes=notes_of(layer_backward),
        run_id=ctx.run_id,
        chart=Chart("hbar", "path", ("forward", "backward"), "Forward and backward time per layer", limit=40),
        facts=facts,
        labels=labels + _warm_labels(ctx) + ctx.replayed_labels("forward and backward times"),
    )
