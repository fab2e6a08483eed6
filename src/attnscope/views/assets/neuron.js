/* attnscope views: the neuron view. For one layer, head and query token: the q vector, every key's k
   vector, q*k elementwise, q.k, the scaled score and the softmax weight; then every key's v vector,
   weight x v and their sum, which is the context row. q, k, v, q.k (the trace's "scores"), the
   weights and the context are the trace's own float32 numbers; q*k, scores*scaling and weight*v are
   rounded to float32 (Math.fround), which reproduces numpy's float32 arithmetic exactly. The two
   parts sit side by side when the pane is wide enough and wrap below each other when it is not. On a long trace
   the web app sends the shown query's row of each [query, ...] stage only (a row block, b.query; rowOf reads
   either kind), and the vector columns are one pixel per cell, scaled up (vectorCanvas). */
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

  function number(stage, v, extra) {
    return el("span", { class: `as-num ${extra || ""}`, "data-stage": stage, "data-value": String(v), text: A.fmt(v) });
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

  // A CSS grid whose put(node, row, column, rowSpan) places cells; the vector canvases span every key row.
  function grid(n, d, cw, numbers, extraRows, cls) {
    const node = el("div", { class: cls || "as-neuron" });
    node.style.gridTemplateColumns = `minmax(5em, max-content) ${d * cw}px ${d * cw}px repeat(${numbers}, max-content)`;
    node.style.gridTemplateRows = `auto ${ROW}px auto repeat(${n + (extraRows || 0)}, ${ROW}px)`;
    const put = (cell, row, col, span) => {
      cell.style.gridArea = span ? `${row} / ${col} / span ${span}` : `${row} / ${col}`;
      node.append(cell);
    };
    return { node: node, put: put };
  }

  // A key's cell: its number (or text) with the key it belongs to; a masked key's in the muted colour (a colour,
  // not opacity: 2,000 masked keys' cells each with an opacity cost a layout and paint of their own).
  function keyCell(node, key, masked) {
    node.dataset.key = String(key);
    if (masked) {
      node.dataset.masked = "";
      node.style.color = "var(--muted)";
    }
    return node;
  }

  // One key's numbers: q . k (the trace's scores), scaled (float32 product), T5's position bias when the block has
  // it (added to scaled before the softmax), the softmax weight and its bar.
  function keyRow(put, v, row) {
    const cell = (node) => keyCell(node, v.key, v.masked);
    put(cell(el("span", { class: "as-tok-cell", text: v.label })), row, 1);
    put(cell(number("scores", v.score)), row, 4);
    put(cell(v.masked ? el("span", { class: "as-num", "data-stage": "scaled", "data-value": "-Infinity",
                                     text: "masked (−∞)" }) : number("scaled", v.scaled)), row, 5);
    if (v.bias !== undefined) put(cell(number("position_bias", v.bias)), row, 6);
    const bar = el("span", { class: "as-bar" });
    bar.style.width = `${v.bar * 6}em`;
    put(cell(el("span", { class: "as-weight" }, [bar, number("weights", v.weight)])), row, v.bias === undefined ? 6 : 7);
  }

  // Cell width of the vector canvases: two canvases and ~26em of numbers fit the pane (2..10 px a dimension).
  function cellWidth(d, width) {
    return Math.max(2, Math.min(10, Math.floor((Math.max(width, 360) - 440) / (2 * d))));
  }

  function table(ctx, b, query, order, tip, width) {
    const { model } = ctx;
    const [n, d] = [A.keys(model).n, b.d]; // n: the keys
    const cw = cellWidth(d, width);
    const row = rowOf(b, "weights", query, n);
    const keys = orderKeys(model, row, order);
    const q = rowOf(b, "q", query, d);
    const k = (j, t) => b.k[j * d + t];
    const scores = rowOf(b, "scores", query, n);
    const widest = Math.max(...row); // bars are relative to this query's largest weight
    const bias = rowOf(b, "position_bias", query, n); // T5
    const { node, put } = grid(n, d, cw, bias ? 4 : 3);
    const titles = ["key", "k", "q × k (elementwise)", "q · k", "scaled", bias ? "+ position bias" : null,
                    bias ? "softmax(scaled + bias) (bar: / row max)" : "softmax weight (bar: / row max)"]
      .filter(Boolean);
    ["query", "q"].forEach((h, c) => put(el("span", { class: "as-th", text: h }), 1, c + 1));
    put(el("span", { class: "as-tok-cell as-query-tok", text: A.tokenLabel(model, query) }), 2, 1);
    titles.forEach((h, c) => put(el("span", { class: "as-th", text: h }), 3, c + 1));
    const who = (r) => `key ${A.keyLabel(model, keys[r])}`;
    const vectors = [
      [1, (r, t) => q[t], `q vector of query ${query}`, (r, t) => [`q[${t}] = ${A.fmt(q[t])}`], 2],
      [n, (r, t) => k(keys[r], t), "k vectors of every key", (r, t) => [who(r), `k[${t}] = ${A.fmt(k(keys[r], t))}`], 4],
      [n, (r, t) => f32(q[t] * k(keys[r], t)), "q times k, elementwise",
       (r, t) => [who(r), `q[${t}] × k[${t}] = ${A.fmt(f32(q[t] * k(keys[r], t)))}`], 4],
    ];
    vectors.forEach(([rows, value, label, describe, at], i) => {
      const canvas = vectorCanvas(rows, d, cw, value, ctx.theme(), label, tip, describe);
      put(canvas, at, i === 2 ? 3 : 2, rows > 1 ? rows : 0);
    });
    const scaling = f32(b.scaling);
    keys.forEach((j, r) => keyRow(put, {
      key: j, label: A.keyLabel(model, j), masked: model.causal && j > query, score: scores[j],
      scaled: f32(scores[j] * scaling), weight: row[j], bar: widest > 0 ? Math.max(0, row[j] / widest) : 0,
      bias: bias ? bias[j] : undefined,
    }, 4 + r));
    const rule = el("p", { class: "as-hint as-scaling", text: `scaled = q · k ${A.scalingText(d, b.scaling)}` +
      (bias ? "; the weight is the softmax of scaled + the relative position bias (T5's, per head and distance)" : "") });
    const parts = el("div", { class: "as-neuron-parts" }, [el("div", { class: "as-neuron-scores" }, [rule, node])]);
    if (b.v && b.context) parts.append(valuesPart(ctx, b, query, keys, cw, tip));
    return parts;
  }

  // Every key's v, weight × v (float32) and their sum over keys, next to the trace's context row.
  function valuesPart(ctx, b, query, keys, cw, tip) {
    const { model } = ctx;
    const [n, d] = [A.keys(model).n, b.d]; // n: the keys
    const weights = rowOf(b, "weights", query, n);
    const w = (j) => weights[j];
    const v = (j, t) => b.v[j * d + t];
    const wv = (j, t) => f32(w(j) * v(j, t));
    const context = rowOf(b, "context", query, d);
    const { node, put } = grid(n, d, cw, 1, 1, "as-neuron-v");
    put(el("span", { class: "as-th", text: "query" }), 1, 1);
    put(el("span", { class: "as-tok-cell as-query-tok", text: A.tokenLabel(model, query) }), 2, 1);
    ["key", "v", "weight × v", "weight"].forEach((h, c) => put(el("span", { class: "as-th", text: h }), 3, c + 1));
    const who = (r) => `key ${A.keyLabel(model, keys[r])}`;
    const vectors = [
      [(r, t) => v(keys[r], t), "v vectors of every key", (r, t) => [who(r), `v[${t}] = ${A.fmt(v(keys[r], t))}`]],
      [(r, t) => wv(keys[r], t), "weight times v", (r, t) => [who(r), `${A.fmt(w(keys[r]))} × v[${t}] = ${A.fmt(wv(keys[r], t))}`]],
    ];
    vectors.forEach(([value, label, describe], i) => {
      const canvas = vectorCanvas(n, d, cw, value, ctx.theme(), label, tip, describe);
      put(canvas, 4, i + 2, n);
    });
    keys.forEach((j, r) => {
      const masked = model.causal && j > query;
      put(keyCell(el("span", { class: "as-tok-cell", text: A.keyLabel(model, j) }), j, masked), 4 + r, 1);
      put(keyCell(number("weights", w(j)), j, masked), 4 + r, 4);
    });
    const sum = [...Array(d).keys()].map((t) => keys.reduce((s, j) => s + wv(j, t), 0));
    const diff = Math.max(...sum.map((s, t) => Math.abs(s - context[t])));
    put(el("span", { class: "as-th", text: "sum = context" }), 4 + n, 1);
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
        const width = content.clientWidth || 1280;
        if (block) content.append(modernNote(model.payload.model, head, model.payload.attention), table(ctx, block, query, order.value, tip, width));
        else content.append(missing(ctx, layer, head));
        ctx.emit("attnscope:drawn", { view: "neuron", layer: layer, head: head, query: query });
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

  // A fetched row block of (layer, head, query), or null.
  A.neuronRowBlock = (model, layer, head, query) =>
    (model.rowBlocks && model.rowBlocks.get(`${layer}:${head}:${query}`)) || null;

  // Row blocks stay apart from the whole ones (model.readyBlock): a reader of any query's row there would find
  // none; the matrix reads a hovered cell's exact weight through A.neuronRow on either.
  function keepRow(model, block) {
    model.rowBlocks = model.rowBlocks || new Map();
    const key = `${block.layer}:${block.head}:${block.query}`;
    model.rowBlocks.delete(key);
    model.rowBlocks.set(key, block);
    for (const old of model.rowBlocks.keys()) if (model.rowBlocks.size > ROW_BLOCKS) model.rowBlocks.delete(old);
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
