/* attnscope views: the neuron view as a figure, drawn as bertviz's neuron view draws it. For one layer, head and
   query: the query's q vector; for every key its k vector, q × k (elementwise: one cell per dimension of the
   head), their sum q · k (the trace's scores), the scaled score and the softmax weight. q, k, the scores and the
   weights are the trace's own float32 numbers (the page's neuron block; each cell carries its number in
   data-value); q × k and scaled are rounded to float32 (Math.fround), as the page's neuron view computes them.
   Without the exact block (a page whose neuron budget left this head out) the figure shows the weights alone. The
   web app's row block of a long trace (one query's q, scores and weights, every key's k) draws the same figure. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const F = A.fig; // figure.js, with export.js's caption and token labels
  const f32 = Math.fround;
  const MONO = ' font-family="ui-monospace, monospace"';
  const GAP = 16; // px between the figure's columns
  const NUMBER = 72; // px: a column of numbers
  const BAR = 90; // px: a weight of 1
  const MAX_KEYS = 96; // rows a figure draws: past this, the keys with the largest weights (the caption says so)

  function maxAbs(values) {
    let m = 0;
    for (const v of values) if (Math.abs(v) > m) m = Math.abs(v);
    return m;
  }

  // One vector as a row of d cells at (x, y), coloured blue below zero and orange above (|v| / top); each cell
  // carries its number (data-value), so a reader of the SVG has the figure's numbers, not only its colours.
  function vector(cls, values, x, y, cw, top, key) {
    const at = key === undefined ? "" : ` data-key="${key}"`;
    const cells = values.map((v, t) => `<rect x="${F.num(x + t * cw)}" y="${y + 3}" width="${F.num(cw - 0.5)}" ` +
      `height="${F.ROW - 6}" fill="${A.diverging(v, top, "light")}" data-value="${v}"/>`);
    return `<g class="${cls}"${at}>${cells.join("")}</g>`;
  }

  // The columns' x positions: labels end at `label`, then k, q × k, q · k, scaled (right-aligned), the weight bar.
  function columns(label, vec) {
    const qk = label + vec + GAP;
    const score = qk + vec + GAP + NUMBER;
    return { k: label, qk: qk, score: score, scaled: score + NUMBER + 8, bar: score + NUMBER + 8 + GAP };
  }

  // The keys drawn, in order: every key, or on a long text the MAX_KEYS with the largest weights.
  function drawnKeys(b, query, n) {
    const keys = [...Array(n).keys()];
    if (n <= MAX_KEYS) return keys;
    const row = A.neuronRow(b, "weights", query, n);
    return keys.sort((i, j) => row[j] - row[i]).slice(0, MAX_KEYS).sort((i, j) => i - j);
  }

  // Each drawn key's row: its label, k, q × k, q · k, scaled (masked keys of a causal model: −∞) and the weight.
  function keyRows(model, b, query, keys, x, y0, cw, tops) {
    const [n, d] = [A.keys(model).n, b.d];
    const q = Array.from(A.neuronRow(b, "q", query, d));
    const [scores, weights] = [A.neuronRow(b, "scores", query, n), A.neuronRow(b, "weights", query, n)];
    const scaling = f32(b.scaling);
    const bias = A.neuronRow(b, "position_bias", query, n); // T5's, per key
    const out = [];
    for (const [r, j] of keys.entries()) {
      const y = y0 + r * F.ROW;
      const k = Array.from(b.k.subarray(j * d, (j + 1) * d));
      const masked = model.causal && j > query;
      const score = scores[j];
      const scaled = bias ? f32(f32(score * scaling) + bias[j]) : f32(score * scaling);
      const weight = weights[j];
      const off = masked ? ` fill="${F.MUTED}"` : "";
      out.push(F.text(x.k - 4, y + 13, F.keyText(model, j), ` text-anchor="end"${off}`),
        vector("k", k, x.k, y, cw, tops.qk, j), vector("qk", q.map((v, t) => f32(v * k[t])), x.qk, y, cw, tops.prod, j),
        F.text(x.score, y + 13, A.fmt(score), ` text-anchor="end" class="score" data-key="${j}"${MONO}${off}`),
        F.text(x.scaled, y + 13, masked ? "−∞" : A.fmt(scaled),
               ` text-anchor="end" class="scaled" data-key="${j}"${MONO}${off}`),
        `<rect x="${F.num(x.bar)}" y="${y + 4}" width="${F.num(Math.max(0, weight) * BAR)}" height="${F.ROW - 8}" ` +
        `fill="${F.colour(0.6)}"/>`,
        F.text(x.bar + BAR + 6, y + 13, A.fmt(weight), ` class="weight" data-key="${j}"${MONO}${off}`));
    }
    return out.join("\n");
  }

  function exactFigure(model, state, b, options) {
    const [layer, head, query] = [state.layer, state.head, A.neuronQuery(model, state)];
    const [n, d] = [A.keys(model).n, b.d];
    const cw = Math.max(2, Math.min(8, Math.floor(256 / d)));
    const label = F.widest(model, 12) + 8;
    const x = columns(label, d * cw);
    const keys = drawnKeys(b, query, n);
    const q = Array.from(A.neuronRow(b, "q", query, d));
    const k = keys.flatMap((j) => Array.from(b.k.subarray(j * d, (j + 1) * d)));
    const prod = k.map((v, i) => f32(q[i % d] * v));
    const tops = { qk: maxAbs([...q, ...k]) || 1, prod: maxAbs(prod) || 1 }; // one colour scale for q and k
    const y0 = 2 * F.ROW + 10; // below the query's row and the column titles
    const heads = [[x.k, "k", ""], [x.qk, "q × k (elementwise)", ""], [x.score, "q · k", ' text-anchor="end"'],
      [x.scaled, b.position_bias ? "scaled + bias" : "scaled", ' text-anchor="end"'], [x.bar, "softmax weight", ""]];
    const legend = y0 + keys.length * F.ROW + 22;
    const body = [F.text(x.k - 4, 13, A.tokenLabel(model, query), ' text-anchor="end" font-weight="600"'),
      vector("q", q, x.k, 0, cw, tops.qk), F.text(x.k + d * cw + 6, 13, "q (the query)", ` fill="${F.MUTED}"`),
      `<g class="titles" font-weight="600">${F.text(x.k - 4, y0 - 6, "key", ' text-anchor="end"')}` +
      `${heads.map(([at, s, extra]) => F.text(at, y0 - 6, s, extra)).join("")}</g>`,
      `<g class="keys">${keyRows(model, b, query, keys, x, y0, cw, tops)}</g>`,
      F.divergingBar(x.k, legend, d * cw, tops.qk, "colour of q and k"),
      F.divergingBar(x.qk, legend, d * cw, tops.prod, "colour of q × k")];
    const info = model.payload.model || {};
    const rule = `q · k = Σ q × k; scaled = q · k ${A.scalingText(d, b.scaling)}` +
      (b.position_bias ? " + position bias" : "") + "; weight = softmax over keys";
    const grouped = info.kv_heads && info.kv_heads < info.heads; // grouped-query attention: k of a shared k/v head
    const parts = [`layer ${layer}`, `head ${head}`, grouped ? `k of k/v head ${Math.floor(head / (info.heads / info.kv_heads))}` : null,
      `query ${A.tokenLabel(model, query)}`, info.rope ? "q and k after the rotation (RoPE)" : null,
      keys.length < n ? `the ${keys.length} keys with the largest weights of ${n}` : null,
      model.causal ? "keys after the query masked (−∞)" : null, "exact float32"];
    return F.svg(body.join("\n"), x.bar + BAR + 70, legend + 30,
                 [...F.caption(model, "neuron", parts, layer, [head]), rule], options);
  }

  // Without the exact block: one query's row of one head from the page's 8-bit map, every key's weight.
  function weightsFigure(model, state, options) {
    const src = model.sources.get("weights") || model.sources.values().next().value;
    const [layer, head, query] = [state.layer, state.head, A.neuronQuery(model, state)];
    const n = A.keys(model).n;
    const label = F.widest(model, 12) + 8;
    const rows = ['<g class="rows">'];
    for (let k = 0; k < n; k++) {
      const [y, w] = [k * F.ROW, src.value(layer, head, query, k)];
      rows.push(F.text(label - 4, y + 13, F.keyText(model, k), ' text-anchor="end"'),
        `<rect x="${F.num(label)}" y="${y + 3}" width="${F.num(Math.max(0, w) * 2 * BAR)}" height="${F.ROW - 6}" ` +
        `fill="${F.colour(0.6)}"/>`, F.text(label + 2 * BAR + 6, y + 13, `≈ ${A.fmt(w)}`, MONO));
    }
    rows.push("</g>");
    const parts = [`layer ${layer}`, `head ${head}`, `query ${A.tokenLabel(model, query)}`,
      "softmax weights (8-bit approximation: this page carries no q and k for this head)"];
    return F.svg(rows.join("\n"), label + 2 * BAR + 80, n * F.ROW, F.caption(model, "neuron", parts, layer, [head]),
                 options);
  }

  function neuronFigure(model, state, zoomed, options) {
    const b = model.readyBlock(state.layer, state.head) ||
      A.neuronRowBlock(model, state.layer, state.head, A.neuronQuery(model, state)); // the web app's row of a long trace
    return b && b.q && b.k ? exactFigure(model, state, b, options) : weightsFigure(model, state, options);
  }

  if (A.figureMakers) {
    A.figureMakers.neuron = neuronFigure;
    A.figureViews = Object.keys(A.figureMakers);
  }
})();
