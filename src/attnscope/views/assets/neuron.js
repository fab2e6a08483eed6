/* attnscope views: the neuron view. For one layer, head and query token: the q vector, every key's k
   vector, q*k elementwise, q.k, the scaled score and the softmax weight; then every key's v vector,
   weight x v and their sum, which is the context row. q, k, v, q.k (the trace's "scores"), the
   weights and the context are the trace's own float32 numbers; q*k, scores*scaling and weight*v are
   rounded to float32 (Math.fround), which reproduces numpy's float32 arithmetic exactly. The two
   parts sit side by side when the pane is wide enough and wrap below each other when it is not. On a long trace
   the web app sends the shown query's row of each [query, ...] stage only (a row block, b.query; rowOf reads
   either kind), the vector columns are one pixel per cell, scaled up (vectorCanvas), and the key rows come in
   chunks the browser lays out only near the screen (keyChunks), those past the first screen built just after it
   is shown (fillLater; the panel's body says data-rows="all" once every row is in). */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const el = (...a) => A.el(...a);
  A.views = A.views || {};
  const ROW = 22;
  const f32 = Math.fround;

  function maxAbs(values) {
    let m = 0;
    for (const v of values) if (Math.abs(v) > m) m = Math.abs(v);
    return m;
  }

  // Rows per canvas: a canvas taller than 32,767 px stays blank in Chromium (2,048 keys x 22 px is 45,056), so a
  // long vector column is a stack of canvases of at most this many rows, coloured on one scale.
  const CANVAS_ROWS = 1024;

  // rows x d coloured cells: cell(r, t) gives the number for display row r, dimension t. One canvas (class
  // as-vec), or for more than CANVAS_ROWS rows a stack of them in one box; hover describe(r, t) on either.
  // A cell is cw - 1 px by ROW - 6 px at (t cw, r ROW + 3) on the page: the canvas holds one pixel per cell and is
  // shown cw x ROW times larger, without smoothing, through a mask that leaves the 1 px and 6 px gaps out (the
  // same pixels; a canvas of 2,048 keys x 64 dims held 45,056 x 448 px, 80 MB for the four columns, and took
  // seconds to allocate and draw).
  function vectorCanvas(rows, d, cw, cell, theme, label, tip, describe) {
    const values = new Float64Array(rows * d);
    for (let r = 0; r < rows; r++) for (let t = 0; t < d; t++) values[r * d + t] = cell(r, t);
    const max = maxAbs(values);
    const part = (from, to) => {
      const canvas = el("canvas", { class: "as-vec" });
      [canvas.width, canvas.height] = [d, to - from];
      Object.assign(canvas.style, { width: `${d * cw}px`, height: `${(to - from) * ROW}px` }, cellMask(cw));
      const g = canvas.getContext("2d");
      const image = g.createImageData(d, to - from);
      for (let i = from * d; i < to * d; i++) A.divergingInto(image.data, (i - from * d) * 4, values[i], max, theme);
      g.putImageData(image, 0, 0);
      hoverValues(canvas, tip, d, cw, (r, t) => describe(r + from, t));
      return canvas;
    };
    if (rows <= CANVAS_ROWS) {
      const canvas = part(0, rows);
      canvas.setAttribute("role", "img");
      canvas.setAttribute("aria-label", label);
      return canvas;
    }
    const box = el("div", { class: "as-vec-stack", role: "img", "aria-label": label });
    for (let from = 0; from < rows; from += CANVAS_ROWS) box.append(part(from, Math.min(rows, from + CANVAS_ROWS)));
    return box;
  }

  // The style that shows a one-pixel-per-cell canvas as cells of cw - 1 x ROW - 6 px: scaled up without smoothing,
  // masked to each cell's box (3 px above and below, 1 px right of it left out).
  function cellMask(cw) {
    const rows = `repeating-linear-gradient(to bottom, transparent 0 3px, #000 3px ${ROW - 3}px, transparent ${ROW - 3}px ${ROW}px)`;
    const cols = `repeating-linear-gradient(to right, #000 0 ${cw - 1}px, transparent ${cw - 1}px ${cw}px)`;
    const mask = `${rows}, ${cols}`;
    return { imageRendering: "pixelated", maskImage: mask, webkitMaskImage: mask, maskComposite: "intersect",
             webkitMaskComposite: "source-in" };
  }

  function hoverValues(canvas, tip, d, cw, describe) {
    canvas.addEventListener("mousemove", (e) => {
      const r = Math.floor(e.offsetY / ROW);
      const t = Math.floor(e.offsetX / cw);
      if (t < 0 || t >= d) return tip.hide();
      const box = canvas.getBoundingClientRect();
      const host = tip.node.parentElement.getBoundingClientRect();
      tip.show(box.left - host.left + e.offsetX, box.top - host.top + e.offsetY, describe(r, t));
    });
    canvas.addEventListener("mouseleave", () => tip.hide());
  }

  // Query `query`'s row of a query-side stage (q, context [token, d_head]; scores, weights, position_bias
  // [query, key]), `width` numbers: a whole block holds every row, a row block (the web app's, b.query: fetched
  // for the query shown) its query's alone, so any other query's row is null.
  function rowOf(b, name, query, width) {
    if (!b[name]) return null;
    if (b.query === undefined) return b[name].subarray(query * width, (query + 1) * width);
    return b.query === query ? b[name].subarray(0, width) : null;
  }
  A.neuronRow = rowOf;

  // The keys in the chosen order (cross-attention: the source tokens, nk of them); row: the query's weights.
  function orderKeys(model, row, order) {
    const keys = [...Array(A.keys(model).n).keys()];
    if (order === "weight") keys.sort((x, y) => row[y] - row[x]);
    return keys;
  }

  // A CSS grid whose put(node, row, column, rowSpan, columnSpan) places cells; the vector canvases span every key
  // row, and the key rows come in chunks (keyChunks). `columns`: its grid-template-columns.
  function grid(n, columns, extraRows, cls) {
    const node = el("div", { class: cls || "as-neuron" });
    node.style.gridTemplateColumns = columns;
    node.style.gridTemplateRows = `auto ${ROW}px auto repeat(${n + (extraRows || 0)}, ${ROW}px)`;
    const put = (cell, row, col, span, colSpan) => {
      cell.style.gridArea = `${row} / ${col}` + (span || colSpan ? ` / span ${span || 1} / span ${colSpan || 1}` : "");
      node.append(cell);
    };
    return { node: node, put: put };
  }

  // Key rows per chunk. A long trace has thousands of key rows (2,048 keys x 5-7 elements in the scores and 2 in the
  // values): one grid of them all cost ~1 s of layout and paint before the first frame. Each chunk is a grid of its
  // own with `content-visibility: auto`, so the browser lays out and paints only the chunks near the screen; every
  // cell is in the page (its data-* numbers and text read as before, found by find-in-page).
  const CHUNK = 32;

  // The px width of each column of a `cls` grid laid out with `columns` (max-content tracks) holding `fill`'s cells
  // (the headers and the widest key rows), measured once in a hidden copy in `host`: the chunks and the grid above
  // them then share these widths. Null when `host` is not laid out (then each chunk sizes its own columns).
  function measuredColumns(host, cls, columns, fill) {
    const probe = grid(0, columns, 0, cls);
    Object.assign(probe.node.style, { position: "absolute", visibility: "hidden", gridTemplateRows: "none" });
    fill(probe.put);
    host.append(probe.node);
    const tracks = getComputedStyle(probe.node).gridTemplateColumns.split(" ")
      .map((t) => (/px$/.test(t) ? parseFloat(t) : NaN)); // "83.5px 640px ..." once laid out
    probe.node.remove();
    return tracks.length > 1 && tracks.every((t) => t >= 0) ? tracks : null;
  }

  // The keys' cells in chunks of CHUNK rows from grid row `first`: cellsOf(r) gives display row r's cells for each
  // span of columns [column, count] (1-based, as the grid's); widths: the measured column widths (px) or null. The
  // first SHOWN_ROWS rows are built now; the chunks past them are put in the grid empty (their size already theirs)
  // and a function that fills each is pushed onto `later` (fillLater builds them once the view is shown).
  function keyChunks(put, n, first, spans, widths, cellsOf, later) {
    const gap = 10; // .as-neuron's column-gap
    for (let from = 0; from < n; from += CHUNK) {
      const m = Math.min(CHUNK, n - from);
      const chunks = spans.map(([col, count]) => {
        const chunk = el("div", { class: "as-key-rows" });
        const own = widths ? widths.slice(col - 1, col - 1 + count) : null;
        chunk.style.gridTemplateColumns = own ? own.map((w) => `${w}px`).join(" ") : `repeat(${count}, max-content)`;
        chunk.style.gridTemplateRows = `repeat(${m}, ${ROW}px)`;
        const wide = own ? own.reduce((a, w) => a + w, 0) + gap * (count - 1) : 0;
        chunk.style.containIntrinsicSize = `${wide}px ${m * ROW}px`; // its size while off screen
        put(chunk, first + from, col, m, count);
        return chunk;
      });
      const fill = () => {
        for (let r = from; r < from + m; r++) cellsOf(r).forEach((cells, i) => chunks[i].append(...cells));
      };
      if (from < SHOWN_ROWS) fill();
      else later.push(fill);
    }
  }

  // Key rows built before the view is shown: more than a screen (128 x 22 px). A long trace's other rows (2,048 keys
  // make ~16,000 cells, a few hundred ms of building) come in just after, a slice at a time (fillLater), so the
  // Neuron tab shows its first screen without waiting for them.
  const SHOWN_ROWS = 4 * CHUNK;
  const SLICE_MS = 12; // building per task before the browser gets a turn (a frame, a click)

  // Run the fills, SLICE_MS of them per task, after the view is shown. Resolves true once every fill ran, false as
  // soon as current() says the view was drawn anew meanwhile (its old rows are not built).
  function fillLater(fills, current) {
    if (!fills.length) return Promise.resolve(true);
    return new Promise((resolve) => {
      let i = 0;
      const step = () => {
        if (!current()) return resolve(false);
        const until = performance.now() + SLICE_MS;
        while (i < fills.length && performance.now() < until) fills[i++]();
        if (i < fills.length) setTimeout(step, 0);
        else resolve(true);
      };
      setTimeout(step, 0);
    });
  }

  // A `cls` grid of the header cells heads(put) above n key rows in chunks from row 4 (keyChunks; cellsOf(r): row r's
  // cells per span), its columns measured from the headers and the widest rows (by each of `sizes`, widestRows);
  // the caller puts the vector canvases in. later: keyChunks'.
  function keyGrid(host, cls, columns, n, extraRows, heads, spans, sizes, cellsOf, later) {
    const sizing = widestRows(n, sizes);
    const widths = measuredColumns(host, cls, columns, (put) => {
      heads(put);
      sizing.forEach((r, i) => cellsOf(r)
        .forEach((cells, s) => cells.forEach((c, j) => put(c, 4 + i, spans[s][0] + j))));
    });
    const g = grid(n, widths ? widths.map((w) => `${w}px`).join(" ") : columns, extraRows, cls);
    heads(g.put);
    keyChunks(g.put, n, 4, spans, widths, cellsOf, later);
    return g;
  }

  // Each label's width as drawn, in the key cells' font (a canvas measures text without laying anything out).
  function drawnWidths(host, labels) {
    const probe = el("span", { class: "as-tok-cell" });
    host.append(probe);
    const g = document.createElement("canvas").getContext("2d");
    g.font = getComputedStyle(probe).font;
    probe.remove();
    return labels.map((label) => g.measureText(label).width);
  }

  // The display rows whose cells are widest in some column: the top 3 of each of `sizes` (per column, a row's
  // size there: its label's drawn width, a number's length, the bar's width); with the headers they size the
  // columns (measuredColumns).
  function widestRows(n, sizes) {
    const rows = new Set();
    for (const size of sizes) {
      const of = Array.from({ length: n }, (_, r) => size(r));
      for (const r of [...of.keys()].sort((a, b) => of[b] - of[a]).slice(0, 3)) rows.add(r);
    }
    return [...rows];
  }

  // A key's cell: a span with its text and the key it belongs to, its numbers (stage, exact value) in data-*; a
  // masked key's in the muted colour (attnscope.css: a colour, not opacity, which would cost each of 2,000 masked
  // keys' cells a layer). Built without A.el: a long trace has ~16,000 of them.
  function keyCell(cls, text, key, masked, stage, value) {
    const node = document.createElement("span");
    node.className = cls;
    node.textContent = text;
    if (stage) {
      node.dataset.stage = stage;
      node.dataset.value = String(value);
    }
    node.dataset.key = String(key);
    if (masked) node.dataset.masked = "";
    return node;
  }
  const MASKED = "masked (−∞)";

  // One key's cells: its label, then q . k (the trace's scores), scaled (float32 product), T5's position bias when
  // the block has it (added to scaled before the softmax), the softmax weight after its bar (the cell's ::before,
  // --bar wide).
  function keyCells(v) {
    const num = (stage, value) => keyCell("as-num", A.fmt(value), v.key, v.masked, stage, value);
    const weight = keyCell("as-num as-weight", A.fmt(v.weight), v.key, v.masked, "weights", v.weight);
    weight.style.setProperty("--bar", `${v.bar * 6}em`);
    const numbers = [num("scores", v.score),
      v.masked ? keyCell("as-num", MASKED, v.key, true, "scaled", "-Infinity") : num("scaled", v.scaled)];
    if (v.bias !== undefined) numbers.push(num("position_bias", v.bias));
    numbers.push(weight);
    return [[keyCell("as-tok-cell", v.label, v.key, v.masked)], numbers];
  }

  // Cell width of the vector canvases: two canvases and ~26em of numbers fit the pane (2..10 px a dimension).
  function cellWidth(d, width) {
    return Math.max(2, Math.min(10, Math.floor((Math.max(width, 360) - 440) / (2 * d))));
  }

  function table(ctx, b, query, order, tip, host, later) {
    const { model } = ctx;
    const [n, d] = [A.keys(model).n, b.d]; // n: the keys
    const cw = cellWidth(d, host.clientWidth || 1280);
    const row = rowOf(b, "weights", query, n);
    const keys = orderKeys(model, row, order);
    const q = rowOf(b, "q", query, d);
    const k = (j, t) => b.k[j * d + t];
    const scores = rowOf(b, "scores", query, n);
    const widest = Math.max(...row); // bars are relative to this query's largest weight
    const bias = rowOf(b, "position_bias", query, n); // T5
    const scaling = f32(b.scaling);
    const rows = keys.map((j) => ({
      key: j, label: A.keyLabel(model, j), masked: model.causal && j > query, score: scores[j],
      scaled: f32(scores[j] * scaling), weight: row[j], bar: widest > 0 ? Math.max(0, row[j] / widest) : 0,
      bias: bias ? bias[j] : undefined,
    }));
    const titles = ["key", "k", "q × k (elementwise)", "q · k", "scaled", bias ? "+ position bias" : null,
                    bias ? "softmax(scaled + bias) (bar: / row max)" : "softmax weight (bar: / row max)"]
      .filter(Boolean);
    const heads = (put) => {
      ["query", "q"].forEach((h, c) => put(el("span", { class: "as-th", text: h }), 1, c + 1));
      put(el("span", { class: "as-tok-cell as-query-tok", text: A.tokenLabel(model, query) }), 2, 1);
      titles.forEach((h, c) => put(el("span", { class: "as-th", text: h }), 3, c + 1));
    };
    const numbers = bias ? 4 : 3;
    const drawn = drawnWidths(host, rows.map((v) => v.label));
    const { node, put } = keyGrid(host, "as-neuron", `minmax(5em, max-content) ${d * cw}px ${d * cw}px ` +
      `repeat(${numbers}, max-content)`, n, 0, heads, [[1, 1], [4, numbers]], [(r) => drawn[r],
      (r) => A.fmt(rows[r].score).length, (r) => (rows[r].masked ? MASKED : A.fmt(rows[r].scaled)).length,
      (r) => (bias ? A.fmt(rows[r].bias).length : 0), (r) => rows[r].bar * 100 + A.fmt(rows[r].weight).length],
      (r) => keyCells(rows[r]), later);
    const who = (r) => `key ${A.keyLabel(model, keys[r])}`;
    const vectors = [
      [1, (r, t) => q[t], `q vector of query ${query}`, (r, t) => [`q[${t}] = ${A.fmt(q[t])}`], 2],
      [n, (r, t) => k(keys[r], t), "k vectors of every key", (r, t) => [who(r), `k[${t}] = ${A.fmt(k(keys[r], t))}`], 4],
      [n, (r, t) => f32(q[t] * k(keys[r], t)), "q times k, elementwise",
       (r, t) => [who(r), `q[${t}] × k[${t}] = ${A.fmt(f32(q[t] * k(keys[r], t)))}`], 4],
    ];
    vectors.forEach(([count, value, label, describe, at], i) => {
      const canvas = vectorCanvas(count, d, cw, value, ctx.theme(), label, tip, describe);
      put(canvas, at, i === 2 ? 3 : 2, count > 1 ? count : 0);
    });
    const rule = el("p", { class: "as-hint as-scaling", text: `scaled = q · k ${A.scalingText(d, b.scaling)}` +
      (bias ? "; the weight is the softmax of scaled + the relative position bias (T5's, per head and distance)" : "") });
    const parts = el("div", { class: "as-neuron-parts" }, [el("div", { class: "as-neuron-scores" }, [rule, node])]);
    if (b.v && b.context) parts.append(valuesPart(ctx, b, query, keys, cw, tip, host, drawn, later));
    return parts;
  }

  // Every key's v, weight × v (float32) and their sum over keys, next to the trace's context row.
  function valuesPart(ctx, b, query, keys, cw, tip, host, drawn, later) {
    const { model } = ctx;
    const [n, d] = [A.keys(model).n, b.d]; // n: the keys
    const weights = rowOf(b, "weights", query, n);
    const w = (j) => weights[j];
    const v = (j, t) => b.v[j * d + t];
    const wv = (j, t) => f32(w(j) * v(j, t));
    const context = rowOf(b, "context", query, d);
    const labels = keys.map((j) => A.keyLabel(model, j));
    const cells = (r) => {
      const [j, masked] = [keys[r], model.causal && keys[r] > query];
      return [[keyCell("as-tok-cell", labels[r], j, masked)],
              [keyCell("as-num", A.fmt(w(j)), j, masked, "weights", w(j))]];
    };
    const heads = (put) => {
      put(el("span", { class: "as-th", text: "query" }), 1, 1);
      put(el("span", { class: "as-tok-cell as-query-tok", text: A.tokenLabel(model, query) }), 2, 1);
      ["key", "v", "weight × v", "weight"].forEach((h, c) => put(el("span", { class: "as-th", text: h }), 3, c + 1));
      put(el("span", { class: "as-th", text: "sum = context" }), 4 + n, 1);
    };
    const { node, put } = keyGrid(host, "as-neuron-v", `minmax(5em, max-content) ${d * cw}px ${d * cw}px max-content`,
      n, 1, heads, [[1, 1], [4, 1]], [(r) => drawn[r], (r) => A.fmt(w(keys[r])).length], cells, later);
    const who = (r) => `key ${A.keyLabel(model, keys[r])}`;
    const vectors = [
      [(r, t) => v(keys[r], t), "v vectors of every key", (r, t) => [who(r), `v[${t}] = ${A.fmt(v(keys[r], t))}`]],
      [(r, t) => wv(keys[r], t), "weight times v", (r, t) => [who(r), `${A.fmt(w(keys[r]))} × v[${t}] = ${A.fmt(wv(keys[r], t))}`]],
    ];
    vectors.forEach(([value, label, describe], i) => {
      const canvas = vectorCanvas(n, d, cw, value, ctx.theme(), label, tip, describe);
      put(canvas, 4, i + 2, n);
    });
    const sum = [...Array(d).keys()].map((t) => keys.reduce((s, j) => s + wv(j, t), 0));
    const diff = Math.max(...sum.map((s, t) => Math.abs(s - context[t])));
    const canvas = vectorCanvas(1, d, cw, (r, t) => context[t], ctx.theme(), `context row of query ${query}`, tip,
      (r, t) => [`context[${t}] = ${A.fmt(context[t])}`, `sum of weight × v[${t}] = ${A.fmt(sum[t])}`]);
    put(canvas, 4 + n, 3);
    const note = el("p", { class: "as-hint as-context-note", text: `The sum over keys of weight × v is the trace's ` +
      `context row (the head's output for this query), within float32 rounding: max difference ${A.fmtError(diff)}.` });
    const part = el("div", { class: "as-neuron-values" }, [node, note]);
    // past CANVAS_ROWS keys this part wraps below the scores' tens of thousands of px unless the pane is very wide:
    // the browser lays it out when it comes near the screen (about its size meanwhile), not before the first frame
    if (n > CANVAS_ROWS) {
      Object.assign(part.style, { contentVisibility: "auto",
                                  containIntrinsicSize: `auto ${2 * d * cw + 240}px auto ${(n + 6) * ROW}px` });
    }
    return part;
  }

  // RoPE and grouped-query attention in words: q and k shown are the rotated ones; which k/v head this head reads.
  // Cross-attention: where q, k and v come from.
  function modernNote(info, head, attention) {
    const parts = [];
    if (attention === "cross") {
      parts.push("Cross-attention: q comes from the decoder (this target token's hidden state), k and v from the " +
        "encoder's output over the source tokens, so every target token sees every source token (no causal mask).");
    }
    if (info.rope) {
      parts.push(`q and k are shown after the rotation (RoPE, ${info.rope}: ${info.d_rot} of ${info.d_head} dims ` +
        "of each head turned by position × θ_i): their dot products are the scores.");
    }
    if (info.kv_heads && info.kv_heads < info.heads) {
      const g = info.heads / info.kv_heads, kv = Math.floor(head / g);
      const first = kv * g, last = first + g - 1;
      parts.push(`Grouped-query attention: head ${head} reads k/v head ${kv} (of ${info.kv_heads}), shared by ` +
        `query heads ${first}..${last}: their k and v are the same numbers.`);
    }
    return el("p", { class: "as-hint as-modern", text: parts.join(" ") });
  }

  function firstWord(model) {
    const i = model.special.findIndex((s) => !s);
    return i < 0 ? 0 : i;
  }

  A.neuronQuery = (model, state) => state.query ?? firstWord(model); // the query the view shows

  A.views.neuron = {
    label: "Neuron",
    render(panel, ctx) {
      const { model } = ctx;
      // with no query selected it shows the first word's, without selecting it (the head view stays as it was)
      const shownQuery = () => A.neuronQuery(model, ctx.state);
      const order = el("select", { "aria-label": "order of the keys" });
      for (const o of ["position", "weight"]) order.append(el("option", { value: o, text: o }));
      panel.append(el("div", { class: "as-controls" }, [
        A.controls.attention(ctx), A.controls.layer(ctx), A.controls.heads(ctx, "single"), A.controls.query(ctx, firstWord(model)),
        el("label", { class: "as-control" }, [el("span", { text: "order" }), order]),
        A.controls.badge(ctx, () => ({ layer: ctx.state.layer, heads: [ctx.state.head] })),
      ]));
      panel.append(el("p", { class: "as-hint", text: "One layer, head and query (0-indexed): q · k is the trace's " +
        "scores, scaled = scores × scaling, the weight is the softmax output; weight × v summed over the keys is " +
        "the context, all the trace's own float32 numbers. Hover the coloured cells for their values." }));
      const content = el("div", { class: "as-neuron-body" });
      panel.append(content);
      const tip = A.tooltip(content);
      let generation = 0;
      const refresh = async () => {
        const mine = ++generation;
        const { layer, head } = ctx.state;
        const query = shownQuery();
        const block = await blockFor(ctx, layer, head, query, content);
        if (mine !== generation) return;
        content.replaceChildren(tip.node);
        const later = []; // the key rows past the first screen (keyChunks)
        if (block) content.append(modernNote(model.payload.model, head, model.payload.attention), table(ctx, block, query, order.value, tip, content, later));
        else content.append(missing(ctx, layer, head));
        // drawn: the first screen is there; data-rows="all" (and the render's promise): every key row is too
        content.dataset.rows = later.length ? "some" : "all";
        ctx.emit("attnscope:drawn", { view: "neuron", layer: layer, head: head, query: query });
        if (await fillLater(later, () => mine === generation)) content.dataset.rows = "all";
      };
      content.addEventListener("click", (e) => {
        const cell = e.target.closest("[data-key]");
        if (!cell) return;
        const key = Number(cell.dataset.key);
        ctx.set({ key: key });
        ctx.emit("attnscope:select", { view: "neuron", layer: ctx.state.layer, head: ctx.state.head,
                                       query: shownQuery(), key: key, source: "weights" });
      });
      order.addEventListener("change", refresh);
      ctx.subscribe((s, p) => ctx.changed(p, ["layer", "head", "query", "theme"]) && refresh());
      return refresh();
    },
  };

  // The exact numbers of (layer, head) for `query`: the page's whole block, else (the web app) one fetched with
  // loadNeuron(layer, head, query): on a long trace (maps fetched as shown) the query's row of each query-side stage
  // and every key's k and v (1.1 MB at 2,048 SmolLM2 tokens, where the whole block is 36 MB), kept for the next
  // visit (A.neuronRowBlock); on a short one the whole block (query undefined), as the payload's.
  async function blockFor(ctx, layer, head, query, content) {
    const { model } = ctx;
    const have = model.neuronBlock(layer, head) || A.neuronRowBlock(model, layer, head, query);
    if (have) return have;
    if (!model.payload.neuron.available || !ctx.options.loadNeuron) return null;
    content.replaceChildren(el("p", { class: "as-hint", text: `loading layer ${layer}, head ${head}…` }));
    const got = await ctx.options.loadNeuron(layer, head, model.lazy ? query : undefined);
    if (got && got.d !== undefined && got.query !== undefined) return keepRow(model, got); // decoded row block
    return got && got.d !== undefined ? adopt(model, got) : model.addBlock(got); // decoded (binary form) or JSON
  }

  const ROW_BLOCKS = 16; // fetched row blocks a page keeps (~1.1 MB each at 2,048 tokens), the oldest dropped

  // Row blocks by payload, not by decoded model: the web app draws the same payload again on a change of view (a
  // new model each time), and a row fetched for one view is still there for the next. payload -> "layer:head:query"
  // -> block.
  const rowBlocks = new WeakMap();

  // A fetched row block of (layer, head, query), or null.
  A.neuronRowBlock = (model, layer, head, query) =>
    (rowBlocks.has(model.payload) && rowBlocks.get(model.payload).get(`${layer}:${head}:${query}`)) || null;

  // Row blocks stay apart from the whole ones (model.readyBlock): a reader of any query's row there would find
  // none; the matrix reads a hovered cell's exact weight through A.neuronRow on either.
  function keepRow(model, block) {
    if (!rowBlocks.has(model.payload)) rowBlocks.set(model.payload, new Map());
    const kept = rowBlocks.get(model.payload);
    const key = `${block.layer}:${block.head}:${block.query}`;
    kept.delete(key);
    kept.set(key, block);
    for (const old of kept.keys()) if (kept.size > ROW_BLOCKS) kept.delete(old);
    return block;
  }

  // A whole block loadNeuron gave decoded (the web app's binary form, A.neuronFromArrays) joins the payload's: in
  // model.blocks for this view, and through model.readyBlock for the matrix's exact values and the neuron figure.
  function adopt(model, block) {
    const key = `${block.layer}:${block.head}`;
    if (!model.adopted) {
      const readyBlock = model.readyBlock;
      model.adopted = new Map();
      model.readyBlock = (layer, head) => model.adopted.get(`${layer}:${head}`) || readyBlock(layer, head);
    }
    model.adopted.set(key, block);
    model.blocks.set(key, Promise.resolve(block));
    return block;
  }

  function missing(ctx, layer, head) {
    const p = ctx.model.payload.neuron;
    const text = p.available
      ? `This page carries the exact numbers of ${p.blocks.length} of ${ctx.model.layers.length * ctx.model.heads.length} ` +
        `heads, not layer ${layer}, head ${head}. Rebuild it with to_html(..., neuron="all") or ` +
        "`attnscope view ... --neuron all` (or fewer --layers/--heads)."
      : "The neuron view needs the trace's q and k vectors, which these weights do not come with " +
        "(trace a model with attnscope.trace to get them).";
    return el("p", { class: "as-missing", text: text });
  }
})();
