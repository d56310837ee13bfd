"""The report's Perfetto trace: exported, gzipped and embedded as base64 for the page to unpack on download.

The page unpacks it with the browser's own ``DecompressionStream`` (no library, no network). Past the size cap
the compressed trace is written beside the report instead, and the page links to it and says so.
"""

from __future__ import annotations

import base64
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from xstack.analyze.result import format_value
from xstack.report._svg import esc
from xstack.trace.store import Store

DEFAULT_TRACE_CAP_BYTES = 16 << 20
"""Largest compressed trace embedded in a report (16 MiB: about 10^6 spans); larger ones go beside it."""


@dataclass
class Trace:
    """How the report carries its trace: the section's HTML, and where the trace went."""

    html: str
    mode: Literal["embedded", "beside", "none"]
    path: Path | None = None
    """The file written beside the report (mode ``beside``)."""
    json_bytes: int = 0
    gzip_bytes: int = 0


def trace_section(store: Store | None, run_id: int, run_name: str, out: Path, cap_bytes: int) -> Trace:
    """Export the run to Perfetto JSON and embed it (gzip + base64), or write it beside ``out`` past the cap."""
    head = '<section id="trace"><h2>Perfetto trace</h2>'
    if store is None:
        note = "No trace: the report was written without its store (pass store= to write_report)."
        return Trace(f'{head}<p class="note">{esc(note)}</p></section>', "none")
    from xstack.export.perfetto import export_perfetto

    name = (re.sub(r"[^A-Za-z0-9._-]+", "_", run_name).strip("._") or "trace") + ".perfetto.json"
    with tempfile.TemporaryDirectory(prefix="xstack-report-") as tmp:
        # Gzipped as it is written (level 1: twice as fast as the default 6 on a 280 MB trace, for a file a
        # quarter larger), its header naming ``name``: the JSON itself never goes to disk.
        packed = Path(tmp) / (name + ".gz")
        stats = export_perfetto(store, packed, run_id=run_id)
        json_bytes, gzip_bytes = stats.json_bytes, packed.stat().st_size
        what = f"{stats.describe()}; {format_value(json_bytes, 'bytes')} of JSON"
        if gzip_bytes <= cap_bytes:
            data = base64.b64encode(packed.read_bytes()).decode("ascii")
            body = (
                f'<p><a id="trace-download" class="button" href="#" download="{esc(name)}" data-embedded="1">'
                f"Download {esc(name)}</a> ({esc(what)}), then open it in "
                '<a href="https://ui.perfetto.dev">ui.perfetto.dev</a> (Open trace file).</p>'
                f'<script type="application/octet-stream" id="trace-data">{data}</script>'
            )
            return Trace(head + body + "</section>", "embedded", None, json_bytes, gzip_bytes)
        beside = out.with_name(out.stem + ".perfetto.json.gz")
        shutil.move(str(packed), beside)
    body = (
        f'<p class="note">The trace is {esc(format_value(gzip_bytes, "bytes"))} compressed, over the '
        f"{esc(format_value(cap_bytes, 'bytes'))} this report embeds, so it was written beside the report: "
        f'<a id="trace-download" class="button" href="{esc(quote(beside.name))}">{esc(beside.name)}</a> '
        f"({esc(what)}). Keep it next to this file; ui.perfetto.dev opens it as it is, compressed.</p>"
    )
    return Trace(head + body + "</section>", "beside", beside, json_bytes, gzip_bytes)
