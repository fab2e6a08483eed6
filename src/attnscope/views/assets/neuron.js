/* attnscope views: the neuron view. For one layer, head and query token: the q vector, every key's k
   vector, q*k elementwise, q.k, the scaled score and the softmax weight; then every key's v vector,
   weight x v and their sum, which is the context row. q, k, v, q.k (the trace's "scores"), the
   weights and the context are the trace's own float32 numbers; q*k, scores*scaling and weight*v are
   rounded to float32 (Math.fround), which reproduces numpy's float32 arithmetic exactly. The two
   parts sit side by side when the pane is wide enough and wrap below each other when it is not. */
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
  function vectorCanvas(rows, d, cw, cell, theme, label, tip, describe) {
    const values = new Float64Array(rows * d);
    for (let r = 0; r < rows; r++) for (let t = 0; t < d; t++) values[r * d + t] = cell(r, t);
    const max = maxAbs(values);
    const part = (from, to) => {
      const canvas = A.canvas(d * cw, (to - from) * ROW, "as-vec");
      const g = canvas.getContext("2d");
      const byColour = new Map(); // one fillStyle per colour (a few hundred), not per cell: the same pixels
      for (let i = from * d; i < to * d; i++) {
        const colour = A.diverging(values[i], max, theme);
        if (!byColour.has(colour)) byColour.set(colour, []);
        byColour.get(colour).push(i);
      }
      for (const [colour, cells] of byColour) {
        g.fillStyle = colour;
        for (const i of cells) g.fillRect((i % d) * cw, (Math.floor(i / d) - from) * ROW + 3, cw - 1, ROW - 6);
      }
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

  // The keys in the chosen order (cross-attention: the source tokens, nk of them).
  function orderKeys(model, b, query, order) {
    const nk = A.keys(model).n;
    const keys = [...Array(nk).keys()];
    if (order === "weight") keys.sort((x, y) => b.weights[query * nk + y] - b.weights[query * nk + x]);
    return keys;
  }

  // A CSS grid whose put(node, row, column, rowSpan) places cells; the vector canvases span every key row.
  function grid(n, d, cw, numbers, extraRows, cls) {
    const node = el("div", { class: cls || "as-neuron" });
    node.style.gridTemplateColumns = `minmax(5em, max-content) ${d * cw}px ${d * cw}px repeat(${numbers}, max-content)`;
    node.style.gridTemplateRows = `auto ${ROW}px auto repeat(${n + (extraRows || 0)}, ${ROW}px)`;
    const put = (cell, row, col, span) => {
      cell.style.gridRow = span ? `${row} / span ${span}` : String(row);
      cell.style.gridColumn = String(col);
      node.append(cell);
    };
    return { node: node, put: put };
  }

  // One key's numbers: q . k (the trace's scores), scaled (float32 product), T5's position bias when the block has
  // it (added to scaled before the softmax), the softmax weight and its bar.
  function keyRow(put, v, row) {
    const off = v.masked ? "as-off" : "";
    const key = String(v.key);
    put(el("span", { class: `as-tok-cell ${off}`, "data-key": key, text: v.label }), row, 1);
    put(el("span", { "data-key": key, class: off }, [number("scores", v.score)]), row, 4);
    put(el("span", { "data-key": key, class: off }, [v.masked
      ? el("span", { class: "as-num", "data-stage": "scaled", "data-value": "-Infinity", text: "masked (−∞)" })
      : number("scaled", v.scaled)]), row, 5);
    if (v.bias !== undefined) put(el("span", { "data-key": key, class: off }, [number("position_bias", v.bias)]), row, 6);
    const bar = el("span", { class: "as-bar" });
    bar.style.width = `${v.bar * 6}em`;
    put(el("span", { "data-key": key, class: `as-weight ${off}` }, [bar, number("weights", v.weight)]), row,
        v.bias === undefined ? 6 : 7);
  }

  // Cell width of the vector canvases: two canvases and ~26em of numbers fit the pane (2..10 px a dimension).
  function cellWidth(d, width) {
    return Math.max(2, Math.min(10, Math.floor((Math.max(width, 360) - 440) / (2 * d))));
  }

  function table(ctx, b, query, order, tip, width) {
    const { model } = ctx;
    const [n, d] = [A.keys(model).n, b.d]; // n: the keys
    const cw = cellWidth(d, width);
    const keys = orderKeys(model, b, query, order);
    const q = b.q.subarray(query * d, (query + 1) * d);
    const k = (j, t) => b.k[j * d + t];
    const row = b.weights.subarray(query * n, (query + 1) * n);
    const widest = Math.max(...row); // bars are relative to this query's largest weight
    const bias = b.position_bias ? b.position_bias.subarray(query * n, (query + 1) * n) : null; // T5
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
      key: j, label: A.keyLabel(model, j), masked: model.causal && j > query, score: b.scores[query * n + j],
      scaled: f32(b.scores[query * n + j] * scaling), weight: row[j], bar: widest > 0 ? Math.max(0, row[j] / widest) : 0,
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
    const w = (j) => b.weights[query * n + j];
    const v = (j, t) => b.v[j * d + t];
    const wv = (j, t) => f32(w(j) * v(j, t));
    const context = b.context.subarray(query * d, (query + 1) * d);
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
      const off = model.causal && j > query ? "as-off" : "";
      put(el("span", { class: `as-tok-cell ${off}`, "data-key": String(j), text: A.keyLabel(model, j) }), 4 + r, 1);
      put(el("span", { "data-key": String(j), class: off }, [number("weights", w(j))]), 4 + r, 4);
    });
    const sum = [...Array(d).keys()].map((t) => keys.reduce((s, j) => s + wv(j, t), 0));
    const diff = Math.max(...sum.map((s, t) => Math.abs(s - context[t])));
    put(el("span", { class: "as-th", text: "sum = context" }), 4 + n, 1);
    const canvas = vectorCanvas(1, d, cw, (r, t) => context[t], ctx.theme(), `context row of query ${query}`, tip,
      (r, t) => [`context[${t}] = ${A.fmt(context[t])}`, `sum of weight × v[${t}] = ${A.fmt(sum[t])}`]);
    put(canvas, 4 + n, 3);
    const note = el("p", { class: "as-hint as-context-note", text: `The sum over keys of weight × v is the trace's ` +
      `context row (the head's output for this query), within float32 rounding: max difference ${A.fmtError(diff)}.` });
    return el("div", { class: "as-neuron-values" }, [node, note]);
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
        const block = await blockFor(ctx, layer, head, content);
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

  async function blockFor(ctx, layer, head, content) {
    const { model } = ctx;
    const have = model.neuronBlock(layer, head);
    if (have) return have;
    if (!model.payload.neuron.available || !ctx.options.loadNeuron) return null;
    content.replaceChildren(el("p", { class: "as-hint", text: `loading layer ${layer}, head ${head}…` }));
    const got = await ctx.options.loadNeuron(layer, head);
    return got && got.d !== undefined ? adopt(model, got) : model.addBlock(got); // decoded (binary form) or JSON
  }

  // A block loadNeuron gave decoded (the web app's binary form, A.neuronFromArrays) joins the payload's: in
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
