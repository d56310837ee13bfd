// xstack report: sortable, filterable, paginated tables drawn from embedded JSON, and the trace download.
// Cells are set with textContent only, so no name from a trace is ever parsed as markup.
"use strict";
(function () {
  function compare(a, b) {
    // Missing values sort last in both directions; numbers numerically; anything else as text.
    if (a === b) return 0;
    if (a === null || a === undefined) return 1;
    if (b === null || b === undefined) return -1;
    if (typeof a === "number" && typeof b === "number") return a - b;
    const x = typeof a === "object" ? JSON.stringify(a) : String(a);
    const y = typeof b === "object" ? JSON.stringify(b) : String(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }

  function el(tag, props, text) {
    const node = document.createElement(tag);
    if (props) Object.assign(node, props);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function Table(box) {
    const data = JSON.parse(box.querySelector("script.xtable-data").textContent);
    const cols = data.cols, rows = data.rows, disp = data.disp, size = data.page || 50;
    const dispAt = [];
    let k = 0;
    cols.forEach(function (c, i) { dispAt[i] = c.fmt ? k++ : -1; });
    const text = function (r, i) {
      if (dispAt[i] >= 0) return disp[r][dispAt[i]];
      const v = rows[r][i];
      return v === null || v === undefined ? "-" : String(v);
    };
    // Long text (kernel names, module paths) gets a wide column, or numbers squeeze it to a sliver.
    const wide = cols.map(function (c, i) {
      if (c.num) return false;
      for (let r = 0; r < Math.min(rows.length, 200); r++) if (text(r, i).length > 30) return true;
      return false;
    });
    const cellClass = cols.map(function (c, i) { return c.num ? "num" : wide[i] ? "wide" : ""; });
    let order = rows.map(function (_, i) { return i; });
    let view = order, page = 0, sortCol = -1, sortDir = 1, query = "";

    const filter = el("input", { type: "search", placeholder: "filter rows", className: "filter" });
    const first = el("button", { className: "first", title: "first page" }, "\u00ab");
    const prev = el("button", { className: "prev", title: "previous page" }, "\u2039");
    const next = el("button", { className: "next", title: "next page" }, "\u203a");
    const last = el("button", { className: "last", title: "last page" }, "\u00bb");
    const info = el("span", { className: "pageinfo" });
    const controls = el("div", { className: "controls" });
    controls.append(filter, first, prev, info, next, last);
    const table = el("table");
    const head = el("tr");
    const body = el("tbody");
    const ths = cols.map(function (c, i) {
      // Cells carry their unit (9.8 us, 1.2 GiB) except percentages and ratios: name those in the header.
      const unit = { pct: "%", "flop/byte": "FLOP/byte", ratio: "ratio" }[c.unit];
      const label = unit && c.name.indexOf(unit) < 0 ? c.name + " (" + unit + ")" : c.name;
      // A unit per row (bytes, counts, ns in one column): raw values compare only within a unit.
      const how = c.by === undefined ? "(click to sort)"
        : "(click to sort: rows grouped by " + cols[c.by].name + " first, then sorted within each " + cols[c.by].name + ")";
      const th = el("th", { className: c.num ? "num" : "", title: (c.help ? c.help + " " : "") + how }, label);
      th.dataset.col = String(i);
      th.addEventListener("click", function () { sortBy(i); });
      head.append(th);
      return th;
    });
    const thead = el("thead");
    thead.append(head);
    table.append(thead, body);
    const scroll = el("div", { className: "scroll" });
    scroll.append(table);
    box.append(controls, scroll);
    if (data.truncated) box.append(el("p", { className: "note" }, data.truncated.toLocaleString("en-US") + (data.truncated === 1 ? " more row was" : " more rows were") + " left out by the analysis."));

    function pages() { return Math.max(1, Math.ceil(view.length / size)); }

    function render() {
      page = Math.min(Math.max(page, 0), pages() - 1);
      const start = page * size, end = Math.min(start + size, view.length);
      const frag = document.createDocumentFragment();
      for (let p = start; p < end; p++) {
        const r = view[p], tr = el("tr");
        for (let i = 0; i < cols.length; i++) tr.append(el("td", { className: cellClass[i] }, text(r, i)));
        frag.append(tr);
      }
      body.replaceChildren(frag);
      const fmt = function (n) { return n.toLocaleString("en-US"); };
      info.textContent = view.length
        ? "rows " + fmt(start + 1) + "\u2013" + fmt(end) + " of " + fmt(view.length) + (view.length < rows.length ? " (filtered from " + fmt(rows.length) + ")" : "") + ", page " + fmt(page + 1) + " of " + fmt(pages())
        : "no rows match";
      first.disabled = prev.disabled = page === 0;
      next.disabled = last.disabled = page >= pages() - 1;
    }

    function applyFilter() {
      if (!query) { view = order; return; }
      view = order.filter(function (r) {
        for (let i = 0; i < cols.length; i++) if (text(r, i).toLowerCase().indexOf(query) >= 0) return true;
        return false;
      });
    }

    function directed(x, y) {
      // The direction reverses values only: a missing one stays last.
      const missing = x === null || x === undefined || y === null || y === undefined;
      return missing ? compare(x, y) : sortDir * compare(x, y);
    }

    function sortBy(i) {
      sortDir = sortCol === i ? -sortDir : (cols[i].num ? -1 : 1);  // numbers: largest first
      sortCol = i;
      const by = cols[i].by;
      order = order.slice().sort(function (a, b) {
        return (by === undefined ? 0 : compare(rows[a][by], rows[b][by])) || directed(rows[a][i], rows[b][i]) || a - b;
      });
      ths.forEach(function (th, j) { th.setAttribute("aria-sort", j === i ? (sortDir > 0 ? "ascending" : "descending") : "none"); });
      applyFilter();
      page = 0;
      render();
    }

    let timer = 0;
    filter.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(function () { query = filter.value.trim().toLowerCase(); applyFilter(); page = 0; render(); }, 150);
    });
    first.addEventListener("click", function () { page = 0; render(); });
    prev.addEventListener("click", function () { page -= 1; render(); });
    next.addEventListener("click", function () { page += 1; render(); });
    last.addEventListener("click", function () { page = pages() - 1; render(); });
    render();
  }

  async function traceBlob() {
    // The embedded trace is gzip in base64: unpacked here by the browser, never fetched.
    const node = document.getElementById("trace-data");
    if (!node) throw new Error("this report has no embedded trace");
    const bin = atob(node.textContent.trim());
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Blob([await new Response(stream).arrayBuffer()], { type: "application/json" });
  }

  function setupTrace() {
    const link = document.getElementById("trace-download");
    if (!link || !link.dataset.embedded) return;
    link.addEventListener("click", async function (ev) {
      if (link.dataset.ready) return;  // the href is the unpacked trace now: let the browser save it
      ev.preventDefault();
      link.textContent = "Unpacking\u2026";
      link.href = URL.createObjectURL(await traceBlob());
      link.dataset.ready = "1";
      link.textContent = "Download " + link.getAttribute("download");
      link.click();
    });
  }

  window.xstackReport = { traceBlob: traceBlob, tables: 0 };
  document.querySelectorAll(".xtable").forEach(function (box) { Table(box); window.xstackReport.tables += 1; });
  setupTrace();
})();
