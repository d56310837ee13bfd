"""Structural matching of the spans of leveled passes, in SQL over the store (temporary ``_lm_*`` tables).

Every measured iteration of every pass is one tree under its step span. A span's key is its parent's key
hashed with its level and its position among the spans of that level under the same parent: so a layer is
known by the chain of calls that leads to it and its place among its siblings, an op by its order within its
layer, a kernel by its order under its launch within its op. Keys are equal across passes and iterations
exactly where the structure is.

What a key is called is checked separately: each parent's sequence of children of one level (layers by
module path and type, the rest by name) must equal the reference sequence, taken from the pass that times
that level (the sequence most of its iterations have, below). An instance that differs, and is not aligned (below), is
matched up to its first difference only; the spans after it, and everything under them, are not merged.

The reference is the empty sequence where most iterations of the pass have the parent but no children of that
level under it; of two sequences as many iterations have (work every 2nd step, give or take one iteration), the
shorter one, then the one of the iterations holding fewer spans. Where at least half the iterations of a pass have
the reference sequence (half rounded down for work every 2nd step), an instance of that pass that
differs from it (a checkpoint every 5 steps, an op one iteration adds or swaps, the first micro-batch of a
gradient accumulation) is aligned with it instead (``_lm_extra``): its spans that match the reference's take
their places (a place it lacks has one observation less), and the others are occasional. Occasional spans take no
place among their siblings, so that the rest of that iteration matches, and are keyed by parent, level, name and
their rank among the occasional spans of that name (``occasional`` in ``_lm_tree``). Each round of alignments
builds the tree again, as keys below them change, up to ``MAX_ROUNDS`` times.
"""

from __future__ import annotations

from difflib import SequenceMatcher
from typing import Final

import duckdb

TEMP_TABLES: Final = (
    "_lm_pass", "_lm_extra", "_lm_own", "_lm_base", "_lm_tree", "_lm_inst", "_lm_ref", "_lm_div", "_lm_ok"
)  # fmt: skip
_BUILT: Final = TEMP_TABLES[2:]
"""The tables each round builds again (the passes and the alignments made so far stay)."""
MAX_ROUNDS: Final = 8
"""How many times the tree is built again for instances aligned under spans the round before matched."""

_ROOTS: Final = """
CREATE TEMP TABLE _lm_base AS
SELECT s.run_id, s.span_id, s.parent_id,
    -- annotations copied onto a device (Kineto's gpu_user_annotation) exist only in passes that trace it
    CASE WHEN s.level = 'model' AND coalesce(s.device, 'cpu') <> 'cpu' THEN 'model@device' ELSE s.level END AS level,
    s.start_ns, s.dur_ns,
    CASE WHEN s.level = 'layer'
        THEN coalesce(s.attrs->>'$."layer.path"', s.name) || ' (' || coalesce(s.attrs->>'$."layer.type"', '?') || ')'
        ELSE s.name END AS cname,
    x.occ IS NOT NULL AS occasional, x.occ, x.span_id IS NOT NULL AS aligned,
    -- an occasional span takes no place among its siblings; the others of an aligned sequence take the place of
    -- the reference's span they match
    coalesce(x.pos, row_number() OVER (PARTITION BY s.run_id, s.parent_id, level, x.occ IS NOT NULL
                                       ORDER BY s.start_ns, s.span_id) - 1) AS pos
FROM _spans s JOIN _lm_pass p USING (run_id) LEFT JOIN _lm_extra x USING (run_id, span_id)
WHERE s.parent_id IS NOT NULL;

-- a level's own pass, the one its durations come from: the shallowest pass that records it
CREATE TEMP TABLE _lm_own AS
SELECT level, arg_min(b.run_id, p.rank) AS run_id FROM _lm_base b JOIN _lm_pass p USING (run_id)
WHERE level <> 'model' GROUP BY level
UNION ALL
SELECT 'model', arg_min(run_id, rank) FROM _lm_pass;

CREATE TEMP TABLE _lm_tree AS
WITH RECURSIVE roots AS (
    SELECT s.run_id, s.span_id, s.start_ns, s.dur_ns,
        coalesce(TRY_CAST(s.attrs->>'$."model.step"' AS BIGINT),
                 TRY_CAST(regexp_extract(s.name, '^ProfilerStep#([0-9]+)$', 1) AS BIGINT)) AS iter
    FROM _spans s JOIN _lm_pass p USING (run_id)
    WHERE s.parent_id IS NULL AND s.level = 'model'
      AND (s.attrs->>'$."model.kind"' = 'step' OR regexp_matches(s.name, '^ProfilerStep#[0-9]+$'))
),
t(run_id, span_id, parent_id, iter, key, parent_key, level, pos, cname, pcname, start_ns, dur_ns, occasional,
  aligned, loose) AS (
    SELECT r.run_id, r.span_id, NULL::BIGINT, r.iter, hash('step'), NULL::UBIGINT, 'model', 0, 'step', NULL::VARCHAR,
        r.start_ns, r.dur_ns, false, false, true
    FROM roots r JOIN _lm_pass p USING (run_id)
    WHERE r.iter >= p.first_iter AND r.iter < p.end_iter
    UNION ALL
    SELECT b.run_id, b.span_id, b.parent_id, t.iter,
        CASE WHEN b.occasional THEN hash(t.key, b.level, 'occasional', b.cname, b.occ)
            ELSE hash(t.key, b.level, b.pos) END,
        t.key, b.level, b.pos, b.cname, t.cname, b.start_ns, b.dur_ns, b.occasional, b.aligned,
        -- the step itself, or an operator the loop runs outside every layer and stage (and those it calls)
        t.loose AND b.level = 'op'
    FROM t JOIN _lm_base b ON b.run_id = t.run_id AND b.parent_id = t.span_id
)
SELECT * FROM t;
"""

_MACROS: Final = """
-- whether the iterations of a group are every 2nd one (one parity, no gap)
CREATE OR REPLACE TEMP MACRO _lm_every_2nd(it) AS
    count(DISTINCT it % 2) = 1 AND max(it) - min(it) = 2 * (count(*) - 1);
-- how many iterations a sequence counts as holding: where the sequences most held, give or take one, of 3 or more,
-- are each every 2nd iteration's (work every 2nd step over an odd number of iterations), they count as many
CREATE OR REPLACE TEMP MACRO _lm_held(times, most, alternating) AS
    CASE WHEN most >= 3 AND alternating AND times >= most - 1 THEN most ELSE times END;
"""
_MACRO_NAMES: Final = ("_lm_every_2nd", "_lm_held")

_INSTANCES: Final = """
CREATE TEMP TABLE _lm_inst AS
SELECT run_id, iter, parent_key, level, count(*) AS n, md5(string_agg(cname, chr(31) ORDER BY pos)) AS sig,
    bool_or(aligned) AS aligned, any_value(pcname) AS pcname
FROM _lm_tree WHERE parent_key IS NOT NULL AND NOT occasional
GROUP BY run_id, iter, parent_key, level;

-- the reference sequence of each (parent, level): the one most iterations of the level's own pass have; of two
-- that as many have (work every 2nd step), the shorter, which the other usually extends, then the one of the
-- iterations that hold fewer spans in all, so that the references of all parents come from the same iterations.
-- Only the children of the parent's usual name count (an iteration whose parent differs there is a divergence
-- of the parent's level, not a sequence of this one).
CREATE TEMP TABLE _lm_ref AS
WITH sizes AS (SELECT run_id, iter, count(*) AS size FROM _lm_tree GROUP BY ALL),
names AS (  -- ranked as the sequences are, below
    SELECT run_id, key, cname FROM (
        SELECT *, bool_and(alternate OR times < most - 1) OVER (PARTITION BY run_id, key) AS alternating FROM (
            SELECT t.run_id, t.key, t.cname, count(*) AS times, avg(z.size) AS size, min(t.iter) AS iter,
                _lm_every_2nd(t.iter) AS alternate,
                max(count(*)) OVER (PARTITION BY t.run_id, t.key) AS most
            FROM _lm_tree t JOIN sizes z USING (run_id, iter)
            WHERE t.run_id IN (SELECT run_id FROM _lm_own)
            GROUP BY t.run_id, t.key, t.cname
        )
    )
    QUALIFY row_number() OVER (PARTITION BY run_id, key
                               ORDER BY _lm_held(times, most, alternating) DESC, size, iter) = 1
),
counted AS (
    SELECT i.parent_key, i.level, i.sig, any_value(i.run_id) AS run_id, count(*) AS times, min(i.iter) AS iter,
        any_value(i.n) AS n, avg(z.size) AS size,
        _lm_every_2nd(i.iter) AS alternate
    FROM _lm_inst i JOIN _lm_own o ON o.level = i.level AND o.run_id = i.run_id
    JOIN names nm ON nm.run_id = i.run_id AND nm.key = i.parent_key AND nm.cname = i.pcname
    JOIN sizes z ON z.run_id = i.run_id AND z.iter = i.iter
    GROUP BY i.parent_key, i.level, i.sig
),
-- the empty sequence: the iterations of the level's own pass that have the parent but none of its children of
-- that level (a span that most iterations lack is checked against none); occasional children count, so that an
-- instance aligned in one round is not taken for an empty one in the next
empty AS (
    SELECT c.parent_key, c.level, '' AS sig, o.run_id, count(*) AS times, min(p.iter) AS iter, 0 AS n,
        avg(z.size) AS size,
        _lm_every_2nd(p.iter) AS alternate
    FROM (SELECT DISTINCT parent_key, level FROM _lm_inst) c
    JOIN _lm_own o ON o.level = c.level
    JOIN _lm_tree p ON p.run_id = o.run_id AND p.key = c.parent_key
    JOIN names nm ON nm.run_id = p.run_id AND nm.key = p.key AND nm.cname = p.cname
    JOIN sizes z ON z.run_id = p.run_id AND z.iter = p.iter
    WHERE NOT EXISTS (SELECT 1 FROM _lm_tree k WHERE k.run_id = p.run_id AND k.parent_id = p.span_id
                      AND k.level = c.level)
    GROUP BY ALL
)
SELECT parent_key, level, run_id, iter, times, alternating FROM (
    SELECT *, bool_and(alternate OR times < most - 1) OVER (PARTITION BY parent_key, level) AS alternating FROM (
        SELECT *, max(times) OVER (PARTITION BY parent_key, level) AS most
        FROM (SELECT * FROM counted UNION ALL SELECT * FROM empty)
    )
)
QUALIFY row_number() OVER (PARTITION BY parent_key, level
                           ORDER BY _lm_held(times, most, alternating) DESC, n, size, iter) = 1;
"""

_DIVERGENCE: Final = """
CREATE TEMP TABLE _lm_div AS
WITH ref_rows AS (
    SELECT r.parent_key, r.level, t.pos, t.cname
    FROM _lm_ref r JOIN _lm_tree t
      ON t.run_id = r.run_id AND t.iter = r.iter AND t.parent_key = r.parent_key AND t.level = r.level
    WHERE NOT t.occasional
),
expected AS (
    SELECT i.run_id, i.iter, i.parent_key, i.level, rr.pos, rr.cname, i.aligned
    FROM _lm_inst i JOIN ref_rows rr USING (parent_key, level)
),
got AS (
    SELECT run_id, iter, parent_key, level, pos, cname FROM _lm_tree WHERE parent_key IS NOT NULL AND NOT occasional
)
SELECT coalesce(g.run_id, e.run_id) AS run_id, coalesce(g.iter, e.iter) AS iter,
    coalesce(g.parent_key, e.parent_key) AS parent_key, coalesce(g.level, e.level) AS level,
    min(coalesce(g.pos, e.pos)) AS div
FROM got g FULL JOIN expected e
  ON g.run_id = e.run_id AND g.iter = e.iter AND g.parent_key = e.parent_key AND g.level = e.level AND g.pos = e.pos
WHERE g.cname IS DISTINCT FROM e.cname
    AND NOT (g.cname IS NULL AND e.aligned)  -- an aligned sequence may lack some of the reference's spans
GROUP BY ALL;

-- spans matched all the way up to their step: their own place, and every ancestor's, before any divergence
CREATE TEMP TABLE _lm_ok AS
WITH RECURSIVE ok(run_id, span_id) AS (
    SELECT run_id, span_id FROM _lm_tree WHERE parent_key IS NULL
    UNION ALL
    SELECT t.run_id, t.span_id
    FROM ok JOIN _lm_tree t ON t.run_id = ok.run_id AND t.parent_id = ok.span_id
    LEFT JOIN _lm_div d ON d.run_id = t.run_id AND d.iter = t.iter AND d.parent_key = t.parent_key
        AND d.level = t.level
    WHERE t.occasional OR d.div IS NULL OR t.pos < d.div
)
SELECT * FROM ok;
"""


def match(con: duckdb.DuckDBPyConnection, passes: list[tuple[int, int, int]]) -> None:
    """Build the ``_lm_*`` tables for ``passes``: ``(run_id, first_iter, end_iter)``, shallowest first, whose
    measured iterations are the steps ``first_iter <= n < end_iter``."""
    drop(con)
    con.execute("CREATE TEMP TABLE _lm_pass (run_id INTEGER, rank INTEGER, first_iter BIGINT, end_iter BIGINT)")
    con.executemany(
        "INSERT INTO _lm_pass VALUES (?, ?, ?, ?)",
        [(run_id, rank, first, end) for rank, (run_id, first, end) in enumerate(passes)],
    )
    con.execute("CREATE TEMP TABLE _lm_extra (run_id INTEGER, span_id BIGINT, occ INTEGER, pos INTEGER)")
    con.execute(_MACROS)
    for round_ in range(MAX_ROUNDS + 1):
        if round_:
            for table in _BUILT:
                con.execute(f"DROP TABLE IF EXISTS {table}")
        con.execute(_ROOTS)
        con.execute(_INSTANCES)
        con.execute(_DIVERGENCE)
        if round_ == MAX_ROUNDS or not _align_diverging(con):
            break


_ALIGN: Final = """
WITH diverging AS (SELECT run_id, parent_key, level, count(*) AS n FROM _lm_div GROUP BY ALL),
parents AS (  -- how many iterations of each pass have the parent
    SELECT t.run_id, t.key AS parent_key, count(*) AS n FROM _lm_tree t
    JOIN (SELECT DISTINCT run_id, parent_key FROM _lm_div) d ON d.run_id = t.run_id AND d.parent_key = t.key
    GROUP BY ALL
),
cand AS (
    SELECT d.run_id, d.iter, d.parent_key, d.level, r.run_id AS ref_run, r.iter AS ref_iter
    FROM _lm_div d
    JOIN _lm_tree par ON par.run_id = d.run_id AND par.iter = d.iter AND par.key = d.parent_key
    JOIN _lm_ok ok ON ok.run_id = par.run_id AND ok.span_id = par.span_id
    JOIN diverging v ON v.run_id = d.run_id AND v.parent_key = d.parent_key AND v.level = d.level
    JOIN parents p ON p.run_id = d.run_id AND p.parent_key = d.parent_key
    JOIN _lm_ref r ON r.parent_key = d.parent_key AND r.level = d.level
    -- at least half the pass's iterations have the reference sequence (every 2nd iteration of 5 or more: half
    -- rounded down)
    WHERE 2 * v.n <= p.n OR (r.alternating AND p.n >= 5 AND 2 * v.n = p.n + 1)
)
SELECT c.run_id,
    (SELECT list([t.span_id::VARCHAR, t.cname] ORDER BY t.pos) FROM _lm_tree t
     WHERE t.run_id = c.run_id AND t.iter = c.iter AND t.parent_key = c.parent_key AND t.level = c.level
       AND NOT t.occasional),
    (SELECT list(t.cname ORDER BY t.pos) FROM _lm_tree t
     WHERE t.run_id = c.ref_run AND t.iter = c.ref_iter AND t.parent_key = c.parent_key AND t.level = c.level
       AND NOT t.occasional)
FROM cand c
"""


def _align_diverging(con: duckdb.DuckDBPyConnection) -> int:
    """Align with the reference sequence the diverging instances under matched parents, in passes whose
    iterations mostly have that sequence: add to ``_lm_extra`` their spans the reference lacks (occasional) and
    the place in the reference of the others; returns how many spans were added."""
    extra: list[tuple[int, int, int | None, int | None]] = []
    for run_id, got, ref in con.execute(_ALIGN).fetchall():
        places = _align(ref or [], [name for _, name in got])
        ranks: dict[str, int] = {}
        for (span_id, name), place in zip(got, places, strict=True):
            if place is None:
                extra.append((int(run_id), int(span_id), ranks.setdefault(name, 0), None))
                ranks[name] += 1
            else:
                extra.append((int(run_id), int(span_id), None, place))
    if extra:
        con.executemany("INSERT INTO _lm_extra VALUES (?, ?, ?, ?)", extra)
    return len(extra)


def _align(ref: list[str], got: list[str]) -> list[int | None]:
    """For each span of ``got``, the position in ``ref`` of the span it matches (the longest runs of equal names
    first, as ``difflib`` finds them), or None for one the reference lacks."""
    places: list[int | None] = [None] * len(got)
    for block in SequenceMatcher(None, ref, got, autojunk=False).get_matching_blocks():
        for k in range(block.size):
            places[block.b + k] = block.a + k
    return places


def drop(con: duckdb.DuckDBPyConnection) -> None:
    """Remove the temporary tables and macros."""
    for table in TEMP_TABLES:
        con.execute(f"DROP TABLE IF EXISTS {table}")
    for macro in _MACRO_NAMES:
        con.execute(f"DROP MACRO IF EXISTS {macro}")


def main_thread(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[int, int]:
    """The process and thread of a run's iterations: those of most of its step spans, else of most of its
    top-level model spans (a server's two pool threads hold more of those, their requests, than the thread that
    marks the steps)."""
    row = con.execute(
        """SELECT pid, tid FROM _spans WHERE run_id = ? AND level = 'model' AND parent_id IS NULL GROUP BY pid, tid
        ORDER BY count(*) FILTER (WHERE attrs->>'$."model.kind"' = 'step'
                                  OR regexp_matches(name, '^ProfilerStep#[0-9]+$')) DESC, count(*) DESC, pid, tid
        LIMIT 1""",
        [run_id],
    ).fetchone()
    return (int(row[0]), int(row[1])) if row is not None else (0, 0)
