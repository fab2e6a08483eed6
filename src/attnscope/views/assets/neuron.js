/* attnscope views: the neuron view. For one layer, head and query token: the q vector, every key's k
   vector, q*k elementwise, q.k, the scaled score and the softmax weight. q, k, q.k (the trace's
   "scores") and the weights are the trace's own float32 numbers; q*k and scores*scaling are
   rounded to float32 (Math.fround), which reproduces numpy's float32 arithmetic exactly. */
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

  // rows x d coloured cells: cell(r, t) gives the number for display row r, dimension t.
  function vectorCanvas(rows, d, cw, cell, theme, label) {
    const canvas = A.canvas(d * cw, rows * ROW, "as-vec");
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", label);
    const g = canvas.getContext("2d");
    const values = [];
    for (let r = 0; r < rows; r++) for (let t = 0; t < d; t++) values.push(cell(r, t));
    const max = maxAbs(values);
    values.forEach((v, i) => {
      const r = Math.floor(i / d);
      g.fillStyle = A.diverging(v, max, theme);
      g.fillRect((i % d) * cw, r * ROW + 3, cw - 1, ROW - 6);
    });
    return canvas;
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

  function orderKeys(model, b, query, order) {
    const keys = [...Array(model.n).keys()];
    if (order === "weight") keys.sort((x, y) => b.weights[query * model.n + y] - b.weights[query * model.n + x]);
    return keys;
  }

  // A CSS grid whose put(node, row, column, rowSpan) places cells; the vector canvases span every key row.
  function grid(n, d, cw) {
    const node = el("div", { class: "as-neuron" });
    node.style.gridTemplateColumns = `minmax(5em, max-content) ${d * cw}px ${d * cw}px repeat(3, max-content)`;
    node.style.gridTemplateRows = `auto ${ROW}px auto repeat(${n}, ${ROW}px)`;
    const put = (cell, row, col, span) => {
      cell.style.gridRow = span ? `${row} / span ${span}` : String(row);
      cell.style.gridColumn = String(col);
      node.append(cell);
    };
    return { node: node, put: put };
  }

  // One key's numbers: q . k (the trace's scores), scaled (float32 product), the softmax weight and its bar.
  function keyRow(put, v, row) {
    const off = v.masked ? "as-off" : "";
    const key = String(v.key);
    put(el("span", { class: `as-tok-cell ${off}`, "data-key": key, text: v.label }), row, 1);
    put(el("span", { "data-key": key, class: off }, [number("scores", v.score)]), row, 4);
    put(el("span", { "data-key": key, class: off }, [v.masked
      ? el("span", { class: "as-num", "data-stage": "scaled", "data-value": "-Infinity", text: "masked (−∞)" })
      : number("scaled", v.scaled)]), row, 5);
    const bar = el("span", { class: "as-bar" });
    bar.style.width = `${v.bar * 6}em`;
    put(el("span", { "data-key": key, class: `as-weight ${off}` }, [bar, number("weights", v.weight)]), row, 6);
  }

  function table(ctx, b, query, order, tip) {
    const { model } = ctx;
    const [n, d] = [model.n, b.d];
    const cw = Math.max(3, Math.min(10, Math.floor(320 / d)));
    const keys = orderKeys(model, b, query, order);
    const q = b.q.subarray(query * d, (query + 1) * d);
    const k = (j, t) => b.k[j * d + t];
    const row = b.weights.subarray(query * n, (query + 1) * n);
    const widest = Math.max(...row); // bars are relative to this query's largest weight
    const { node, put } = grid(n, d, cw);
    const titles = ["key", "k", "q × k (elementwise)", "q · k", `scaled (× ${A.fmt(b.scaling)})`,
                    "softmax weight (bar: / row max)"];
    ["query", "q"].forEach((h, c) => put(el("span", { class: "as-th", text: h }), 1, c + 1));
    put(el("span", { class: "as-tok-cell as-query-tok", text: A.tokenLabel(model, query) }), 2, 1);
    titles.forEach((h, c) => put(el("span", { class: "as-th", text: h }), 3, c + 1));
    const who = (r) => `key ${A.tokenLabel(model, keys[r])}`;
    const vectors = [
      [1, (r, t) => q[t], `q vector of query ${query}`, (r, t) => [`q[${t}] = ${A.fmt(q[t], 6)}`], 2],
      [n, (r, t) => k(keys[r], t), "k vectors of every key", (r, t) => [who(r), `k[${t}] = ${A.fmt(k(keys[r], t), 6)}`], 4],
      [n, (r, t) => f32(q[t] * k(keys[r], t)), "q times k, elementwise",
       (r, t) => [who(r), `q[${t}] × k[${t}] = ${A.fmt(f32(q[t] * k(keys[r], t)), 6)}`], 4],
    ];
    vectors.forEach(([rows, value, label, describe, at], i) => {
      const canvas = vectorCanvas(rows, d, cw, value, ctx.theme(), label);
      hoverValues(canvas, tip, d, cw, describe);
      put(canvas, at, i === 2 ? 3 : 2, rows > 1 ? rows : 0);
    });
    const scaling = f32(b.scaling);
    keys.forEach((j, r) => keyRow(put, {
      key: j, label: A.tokenLabel(model, j), masked: model.causal && j > query, score: b.scores[query * n + j],
      scaled: f32(b.scores[query * n + j] * scaling), weight: row[j], bar: widest > 0 ? Math.max(0, row[j] / widest) : 0,
    }, 4 + r));
    return node;
  }

  function firstWord(model) {
    const i = model.special.findIndex((s) => !s);
    return i < 0 ? 0 : i;
  }

  A.views.neuron = {
    label: "Neuron",
    render(panel, ctx) {
      const { model } = ctx;
      if (ctx.state.query === null || ctx.state.query === undefined) ctx.set({ query: firstWord(model) });
      const order = el("select", { "aria-label": "order of the keys" });
      for (const o of ["position", "weight"]) order.append(el("option", { value: o, text: o }));
      panel.append(el("div", { class: "as-controls" }, [
        A.controls.layer(ctx), A.controls.heads(ctx, "single"), A.controls.query(ctx),
        el("label", { class: "as-control" }, [el("span", { text: "order" }), order]),
        A.controls.badge(ctx, () => ({ layer: ctx.state.layer, heads: [ctx.state.head] })),
      ]));
      panel.append(el("p", { class: "as-hint", text: "One layer, head and query (0-indexed): q · k is the trace's " +
        "scores, scaled = scores × scaling, the weight is the softmax output, all the trace's own float32 numbers. " +
        "Hover the coloured cells for their values." }));
      const content = el("div", { class: "as-neuron-body" });
      panel.append(content);
      const tip = A.tooltip(content);
      let generation = 0;
      const refresh = async () => {
        const mine = ++generation;
        const { layer, head, query } = ctx.state;
        const block = await blockFor(ctx, layer, head, content);
        if (mine !== generation) return;
        content.replaceChildren(tip.node);
        if (block) content.append(table(ctx, block, query, order.value, tip));
        else content.append(missing(ctx, layer, head));
        ctx.emit("attnscope:drawn", { view: "neuron", layer: layer, head: head, query: query });
      };
      content.addEventListener("click", (e) => {
        const cell = e.target.closest("[data-key]");
        if (!cell) return;
        const key = Number(cell.dataset.key);
        ctx.set({ key: key });
        ctx.emit("attnscope:select", { view: "neuron", layer: ctx.state.layer, head: ctx.state.head,
                                       query: ctx.state.query, key: key, source: "weights" });
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
    return model.addBlock(await ctx.options.loadNeuron(layer, head));
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
