"""The attention explorer's page: its CSS and JavaScript, inlined by ``explore.py`` so the file
needs no network.  The script reads the JSON that ``explore`` embeds (``<script
type="application/json" id="explorer-data">``) and builds everything else: tokens go in
through ``textContent`` only, never as markup, so a token such as ``<b>`` stays text.

What the page shows (one attention matrix at a time, chosen with the selectors):

    left column    the tokens attended to (keys)          right column   the tokens attending (queries)
    a line from key j to query i, as opaque as weight a[i][j]; the matrix beside it, row i column j

Hovering a query token shows what it attends to: each key token's weight is written on it
and kept in full (the JSON's 6 decimals) in its ``data-weight`` attribute, which the browser
test reads back;
hovering a key token shows what attends to it, the same way on the query tokens.
"""

#: One token row's height in px: the lines' end points are computed from it.
ROW = 24

CSS = """
:root { --dark: rgb(8, 48, 107); --line: #2b6cb0; --muted: #5f6b7a; }
* { box-sizing: border-box; }
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px; color: #1d2430;
       background: #fff; }
h1 { font-size: 18px; margin: 0 0 4px; }
.summary { color: var(--muted); margin: 0 0 10px; }
.translation { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; margin: 0 0 10px;
               overflow-wrap: anywhere; }
.notice { background: #fff7e0; border: 1px solid #e8c45a; padding: 6px 10px; margin: 0 0 10px;
          border-radius: 4px; }
.controls { display: flex; flex-wrap: wrap; gap: 14px; align-items: center; margin: 0 0 10px; }
.controls label { color: var(--muted); }
.controls select { font: inherit; margin-left: 4px; padding: 2px 4px; }
.help { color: var(--muted); font-size: 12px; margin: 0 0 12px; max-width: 980px; }
.views { display: flex; flex-wrap: wrap; gap: 32px; align-items: flex-start; }
.lines-view { display: flex; align-items: flex-start; max-height: 85vh; overflow-y: auto; }
.column { display: flex; flex-direction: column; }
.column h2, .matrix-view h2 { font-size: 12px; font-weight: 600; color: var(--muted); margin: 0 0 6px;
                              height: 16px; white-space: nowrap; }
.tokens { position: relative; }
.token { height: """ + str(ROW) + """px; line-height: """ + str(ROW - 2) + """px; padding: 0 6px;
         font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; white-space: pre; cursor: default;
         border: 1px solid transparent; border-radius: 3px; max-width: 220px; overflow: hidden;
         text-overflow: ellipsis; display: flex; gap: 8px; justify-content: space-between; }
.keys .token { flex-direction: row-reverse; }
.token .weight { font-size: 11px; opacity: 0.75; min-width: 2.6em; text-align: right; }
.token.focus { border-color: #d97706; background: #fff3dc; }
.token.unknown .label { text-decoration: underline dotted #b91c1c; }
.lines { display: block; }
.lines line { stroke: var(--line); stroke-linecap: round; }
.lines.focused line { visibility: hidden; }
.lines.focused line.on { visibility: visible; }
.matrix-view { max-width: 100%; overflow-x: auto; }
.matrix { border-collapse: collapse; font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; }
.matrix th { font-weight: normal; font-size: 11px; color: #1d2430; white-space: pre; padding: 0 4px; }
.matrix thead th { vertical-align: bottom; height: 1px; }
.matrix thead th span { writing-mode: vertical-rl; transform: rotate(180deg); display: inline-block;
                        max-height: 120px; overflow: hidden; text-overflow: ellipsis; }
.matrix tbody th { text-align: right; max-width: 160px; overflow: hidden; text-overflow: ellipsis; }
.matrix td { padding: 0; border: 1px solid #eef1f5; text-align: center; font-size: 9px; }
.matrix.cell24 td { width: 24px; min-width: 24px; height: 24px; }
.matrix.cell12 td { width: 12px; min-width: 12px; height: 12px; }
.matrix.cell6 td { width: 6px; min-width: 6px; height: 6px; border: 0; }
.matrix td.mark, .matrix th.mark { outline: 2px solid #d97706; outline-offset: -2px; }
.readout { min-height: 20px; margin: 8px 0 0; font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; }
.nbest { border-collapse: collapse; margin: 0 0 12px; }
.nbest td, .nbest th { padding: 2px 10px; text-align: left; }
.nbest th { color: var(--muted); font-weight: normal; font-size: 12px; }
.nbest tr.row { cursor: pointer; }
.nbest tr.row:hover { background: #f1f5fb; }
.nbest tr.chosen { background: #e3ecf8; font-weight: 600; }
.nbest td.text { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; white-space: pre; }
"""

JS = r"""
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("explorer-data").textContent);
  var ROW = D.row_height, LIGHT = [255, 255, 255], DARK = [8, 48, 107];
  // First the last layer's cross-attention averaged over the heads: what decoding reads.
  var state = {kind: D.kinds[0].id, layer: D.kinds[0].layers - 1, head: "mean", hyp: 0};
  var el = function (id) { return document.getElementById(id); };

  function make(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function colour(w) {
    w = Math.min(Math.max(w, 0), 1);
    var c = LIGHT.map(function (lo, k) { return Math.round(lo + (DARK[k] - lo) * w); });
    return "rgb(" + c.join(",") + ")";
  }

  // The chosen matrix: weights[i][j] of query i on key j, with both sides' tokens.
  function current() {
    var hyp = D.hypotheses[state.hyp], kind = state.kind, stack, keys, queries;
    if (kind === "encoder") { stack = D.encoder; keys = D.source; queries = D.source; }
    else if (kind === "decoder") { stack = hyp.decoder; keys = hyp.inputs; queries = hyp.rows; }
    else { stack = hyp.cross; keys = D.source; queries = hyp.rows; }
    var heads = stack[state.layer], weights;
    if (state.head === "mean") {
      weights = heads[0].map(function (row, i) {
        return row.map(function (_, j) {
          var sum = 0;
          for (var h = 0; h < heads.length; h++) sum += heads[h][i][j];
          return sum / heads.length;
        });
      });
    } else {
      weights = heads[state.head];
    }
    return {weights: weights, keys: keys, queries: queries, kind: kind};
  }

  function fillSelect(select, options, value) {
    select.textContent = "";
    options.forEach(function (o) {
      var option = make("option", "", o[1]);
      option.value = String(o[0]);
      select.appendChild(option);
    });
    select.value = String(value);
  }

  function kindInfo() {
    return D.kinds.filter(function (k) { return k.id === state.kind; })[0];
  }

  function controls() {
    var info = kindInfo();
    fillSelect(el("kind"), D.kinds.map(function (k) { return [k.id, k.name]; }), state.kind);
    var layers = [];
    for (var l = 0; l < info.layers; l++) layers.push([l, "layer " + l]);
    state.layer = Math.min(state.layer, info.layers - 1);
    fillSelect(el("layer"), layers, state.layer);
    el("layer").disabled = info.layers === 1;
    var heads = [["mean", D.heads > 1 ? "mean of " + D.heads + " heads" : "the one head"]];
    if (D.heads > 1 && !D.averaged) for (var h = 0; h < D.heads; h++) heads.push([h, "head " + h]);
    fillSelect(el("head"), heads, state.head);
    el("head").disabled = heads.length === 1;
    el("keys-title").textContent = info.keys;
    el("queries-title").textContent = info.queries;
  }

  function tokenColumn(parent, labels, side, unknown) {
    parent.textContent = "";
    labels.forEach(function (label, index) {
      var token = make("div", "token");
      token.dataset.side = side;
      token.dataset.index = String(index);
      token.title = label;
      if (unknown && unknown[index]) {
        token.classList.add("unknown");
        token.title = label + " (not in the vocabulary: read as <unk>)";
      }
      token.appendChild(make("span", "label", label));
      token.appendChild(make("span", "weight", ""));
      parent.appendChild(token);
    });
  }

  var view = null, byKey = [], byQuery = [], focused = [];

  // Lines and cells are built as one string each: tens of thousands of elements at once are
  // many times faster than one by one.  Only numbers go into these strings; every token
  // goes in through textContent.
  function draw() {
    view = current();
    var unknown = view.kind === "decoder" ? null : D.unknown;
    tokenColumn(el("keys"), view.keys, "key", unknown);
    tokenColumn(el("queries"), view.queries, "query", view.kind === "encoder" ? D.unknown : null);
    var svg = el("lines"), height = Math.max(view.keys.length, view.queries.length) * ROW;
    var width = Number(svg.getAttribute("width")), parts = [];
    svg.setAttribute("height", String(height));
    view.weights.forEach(function (row, i) {
      row.forEach(function (w, j) {
        if (w < 0.002) return;          // invisible anyway; the tokens keep every weight
        parts.push('<line x1="2" x2="' + (width - 2) + '" y1="' + (j * ROW + ROW / 2) + '" y2="' +
                   (i * ROW + ROW / 2) + '" data-key="' + j + '" data-query="' + i + '" data-weight="' + w +
                   '" stroke-opacity="' + w + '" stroke-width="' + (1 + 3 * w) + '"></line>');
      });
    });
    svg.innerHTML = parts.join("");
    byKey = view.keys.map(function () { return []; });
    byQuery = view.queries.map(function () { return []; });
    Array.prototype.forEach.call(svg.children, function (line) {
      byKey[Number(line.dataset.key)].push(line);
      byQuery[Number(line.dataset.query)].push(line);
    });
    focused = [];
    matrix();
    clear();
  }

  function lineStyle(line, on) {
    // At rest every line is as opaque as its weight; a hovered token's lines stay visible
    // however small their weights, their width telling the weight.
    var w = Number(line.dataset.weight);
    line.setAttribute("stroke-opacity", String(on ? 0.2 + 0.8 * w : w));
    line.classList.toggle("on", on);
  }

  function matrix() {
    var table = el("matrix"), n = Math.max(view.keys.length, view.queries.length);
    var cell = n > 100 ? 6 : n > 40 ? 12 : 24;
    table.className = "matrix cell" + cell;
    table.textContent = "";
    var head = make("thead"), top = make("tr");
    top.appendChild(make("th"));
    view.keys.forEach(function (label) {
      var th = make("th"); th.title = label;
      if (cell >= 12) th.appendChild(make("span", "", label));
      top.appendChild(th);
    });
    head.appendChild(top); table.appendChild(head);
    var body = make("tbody"), rows = [];
    view.weights.forEach(function (row, i) {
      var cells = row.map(function (w, j) {
        var text = cell >= 24 && w >= 0.005 ? w.toFixed(2).replace(/^0/, "") : "";
        return '<td data-key="' + j + '" data-query="' + i + '" data-weight="' + w + '" style="background:' +
               colour(w) + (w > 0.5 ? ";color:#fff" : "") + '">' + text + "</td>";
      });
      rows.push("<tr><th></th>" + cells.join("") + "</tr>");
    });
    body.innerHTML = rows.join("");
    Array.prototype.forEach.call(body.querySelectorAll("th"), function (th, i) {
      th.title = view.queries[i];
      if (cell >= 12) th.textContent = view.queries[i];
    });
    table.appendChild(body);
  }

  function tokens(side) { return document.querySelectorAll(".token[data-side='" + side + "']"); }

  function clear() {
    document.querySelectorAll(".token.focus, .token[data-weight]").forEach(function (t) {
      t.classList.remove("focus"); t.style.background = ""; t.style.color = "";
      delete t.dataset.weight; t.querySelector(".weight").textContent = "";
    });
    focused.forEach(function (line) { lineStyle(line, false); });
    focused = [];
    el("lines").classList.remove("focused");
    el("matrix").querySelectorAll(".mark").forEach(function (c) { c.classList.remove("mark"); });
    el("readout").textContent = "Hover a token, or a cell of the matrix.";
  }

  // Hovering token ``index`` of ``side``: the other side's tokens get their weights, and only
  // the token's own lines stay drawn.
  function focus(side, index) {
    clear();
    var other = side === "key" ? "query" : "key";
    tokens(side)[index].classList.add("focus");
    tokens(other).forEach(function (t, k) {
      var w = side === "key" ? view.weights[k][index] : view.weights[index][k];
      t.dataset.weight = String(w);
      t.style.background = colour(w);
      t.style.color = w > 0.5 ? "#fff" : "";
      t.querySelector(".weight").textContent = w.toFixed(2);
    });
    focused = (side === "key" ? byKey : byQuery)[index];
    focused.forEach(function (line) { lineStyle(line, true); });
    el("lines").classList.add("focused");
    el("matrix").querySelectorAll("td[data-" + side + "='" + index + "']").forEach(function (c) {
      c.classList.add("mark");
    });
    var label = side === "key" ? view.keys[index] : view.queries[index];
    el("readout").textContent = side === "key" ? "what attends to " + JSON.stringify(label)
                                               : "what " + JSON.stringify(label) + " attends to";
  }

  function hoverCell(td) {
    var i = Number(td.dataset.query), j = Number(td.dataset.key);
    focus("query", i);
    tokens("key")[j].classList.add("focus");
    el("readout").textContent = JSON.stringify(view.queries[i]) + " \u2190 " + JSON.stringify(view.keys[j]) +
                                ": " + Number(td.dataset.weight).toFixed(4);
  }

  function nbest() {
    var table = el("nbest");
    if (D.hypotheses.length < 2 && D.hypotheses[0].score === null) { table.style.display = "none"; return; }
    table.textContent = "";
    var head = make("tr");
    ["", "output", "score", "log P"].forEach(function (t) { head.appendChild(make("th", "", t)); });
    table.appendChild(head);
    D.hypotheses.forEach(function (h, k) {
      var tr = make("tr", "row" + (k === state.hyp ? " chosen" : ""));
      tr.dataset.index = String(k);
      tr.appendChild(make("td", "", (k + 1) + "."));
      tr.appendChild(make("td", "text", h.text));
      tr.appendChild(make("td", "", h.score === null ? "" : h.score.toFixed(4)));
      tr.appendChild(make("td", "", h.log_prob === null ? "" : h.log_prob.toFixed(4)));
      tr.addEventListener("click", function () { state.hyp = k; nbest(); draw(); });
      table.appendChild(tr);
    });
  }

  el("kind").addEventListener("change", function (e) { state.kind = e.target.value; controls(); draw(); });
  el("layer").addEventListener("change", function (e) { state.layer = Number(e.target.value); draw(); });
  el("head").addEventListener("change", function (e) {
    state.head = e.target.value === "mean" ? "mean" : Number(e.target.value); draw();
  });
  document.addEventListener("mouseover", function (e) {
    var token = e.target.closest(".token");
    if (token) { focus(token.dataset.side, Number(token.dataset.index)); return; }
    var td = e.target.closest("#matrix td");
    if (td) hoverCell(td);
  });
  el("views").addEventListener("mouseleave", clear);

  controls();
  nbest();
  draw();
  document.body.dataset.ready = "1";
})();
"""
