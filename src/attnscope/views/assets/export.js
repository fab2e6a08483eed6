/* attnscope views: figures. The view on screen as a standalone SVG (tokens as <text>, attention as <line> and
   <rect>, a light print theme, a caption with the model, layer, head and verification badge, colour bars on the
   heatmaps), and PNG at a chosen scale drawn from that SVG. The page's download buttons and `attnscope view -o
   fig.svg` share it; figure.js is the frame (caption, tight box, colour bars), neuron-figure.js the neuron view. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const F = A.fig; // figure.js
  const { esc, num, text, width, blank, fields, svg, MUTED } = F;
  const ROW = 18; // px per token row in the head and neuron figures
  const MIN_OPACITY = 0.01; // head-view lines fainter than this are left out (the caption says so)
  const THUMB = 32; // model-view thumbnails: at most 32 x 32 max-pooled cells
  const FIG_CELLS = 256; // a matrix figure has at most this many cells a side: beyond, blocks are max-pooled
  const FIG_LABELS = 160; // up to this many rows carry token labels, more carry index ticks
  const FIG_LINES = 12000; // a head figure draws at most this many lines, the strongest (the caption says so)

  function colour(value) {
    const lut = A.lut("light");
    const i = Math.max(0, Math.min(255, Math.round(value * 255))) * 4;
    return `#${[lut[i], lut[i + 1], lut[i + 2]].map((c) => c.toString(16).padStart(2, "0")).join("")}`;
  }

  function badge(model, layer, heads) {
    if (layer === null || !heads.length || heads[0] === null) {
      const c = model.check;
      if (!c || c.ok === null) return `NOT VERIFIED: ${(c && c.unsupported) || "no check"}`;
      return `${c.ok ? "✓ trace verified" : "✗ trace check failed"} · max error ${A.fmtError(c.max_error)}`;
    }
    return A.describeCheck(model, layer, heads).text;
  }

  // An encoder-decoder page's kind of attention is named first (cross: rows target tokens, columns source tokens);
  // a self-attention page has no kind (an empty attention_label), left out.
  function caption(model, view, parts, layer, heads) {
    const [m, kind, nk] = [model.payload.model, model.payload.attention_label, A.keys(model).n];
    const what = fields(blank(m.name) ? "model" : m.name, `${view} view`, kind, ...parts, "0-indexed");
    const n = model.payload.attention === "cross" ? `${model.n} target × ${nk} source tokens` : `${model.n} tokens`;
    return [what, fields(badge(model, layer, heads), n)];
  }

  const clip = (t) => (t.length > 24 ? t.slice(0, 23) + "…" : t);
  const tokenText = (model, i) => clip(A.tokenLabel(model, i));
  const keyText = (model, j) => clip(A.keyLabel(model, j)); // a cross map's keys are the source tokens (A.keys)
  const widest = (model, size) => Math.max(...model.tokens.map((t, i) => width(tokenText(model, i), size)),
                                           ...A.keys(model).tokens.map((t, j) => width(keyText(model, j), size)));

  function headFigure(model, state, zoomed, options) {
    const src = A.headSource ? A.headSource(model, state) : model.sources.get(state.source);
    const layer = src.perLayer ? state.layer : null;
    const heads = src.perHead ? state.heads.filter((h) => model.heads.includes(h)) : [null];
    const [n, nk] = [model.n, A.keys(model).n];
    const colW = widest(model, 12) + 8;
    const span = 260;
    const y = (i) => i * ROW + ROW / 2;
    const count = model.payload.model.heads || model.heads.length;
    const picked = A.selectedQueries(state);
    const queries = picked.length ? picked : [...Array(n).keys()];
    const found = []; // [opacity, head, query, key] of every line at or above MIN_OPACITY
    for (const h of heads) {
      for (const q of queries) {
        for (let k = 0; k < nk; k++) {
          const w = src.value(layer, h, q, k) / src.top(layer, h);
          if (w >= MIN_OPACITY && A.passes(model, state.filter, q, k)) found.push([w, h, q, k]);
        }
      }
    }
    const total = found.length;
    if (total > FIG_LINES) found.sort((a, b) => b[0] - a[0]).length = FIG_LINES; // a long text: the strongest
    const out = [];
    for (const h of heads) {
      out.push(`<g class="lines" data-head="${h === null ? "" : h}" stroke="${A.headColour(h, count)}" stroke-width="1">`);
      for (const [w, , q, k] of found.filter((l) => l[1] === h)) {
        out.push(`<line x1="${num(colW)}" y1="${y(q)}" x2="${num(colW + span)}" y2="${y(k)}" ` +
                 `stroke-opacity="${w.toFixed(3)}"/>`);
      }
      out.push("</g>");
    }
    const tokens = [...Array(Math.max(n, nk)).keys()].map((i) => // row i: query i on the left, key i on the right
      (i < n ? text(colW - 4, y(i) + 4, tokenText(model, i), ' text-anchor="end"') : "") +
      (i < nk ? text(colW + span + 4, y(i) + 4, keyText(model, i)) : "")).join("\n");
    const body = `${out.join("\n")}\n<g class="tokens">\n${tokens}\n</g>`;
    const parts = [src.label, layer === null ? null : `layer ${layer}`,
      heads[0] === null ? null : `head${heads.length > 1 ? "s" : ""} ${heads.join(", ")}`,
      src.selected ? `heads ${src.selected(layer).join(", ")}` : null,
      picked.length ? `quer${picked.length > 1 ? "ies" : "y"} ${picked.map((q) => A.tokenLabel(model, q)).join(", ")}`
        : null,
      total > FIG_LINES ? `the ${FIG_LINES.toLocaleString("en")} strongest of ${total.toLocaleString("en")} lines ` +
        `drawn (below ${MIN_OPACITY} left out)` : `lines below ${MIN_OPACITY} left out`];
    const verified = src.selected ? src.selected(layer) : heads; // the badge of the heads behind the lines
    return svg(body, 2 * colW + span, Math.max(n, nk) * ROW, caption(model, "head", parts, layer, verified), options);
  }

  function cells(src, layer, head, px, x0, y0, top) {
    // rq x rk blocks in a px x px square (a cross map is not square), each the max of its cells; white left out
    const [nq, nk] = [src.nq, src.nk];
    const [rq, rk] = [Math.min(nq, THUMB), Math.min(nk, THUMB)];
    const pooled = new Float32Array(rq * rk);
    for (let q = 0; q < nq; q++) {
      for (let k = 0; k < nk; k++) {
        const i = Math.floor((q * rq) / nq) * rk + Math.floor((k * rk) / nk);
        pooled[i] = Math.max(pooled[i], src.value(layer, head, q, k) / top);
      }
    }
    const out = [];
    for (let i = 0; i < rq * rk; i++) {
      const fill = colour(pooled[i]);
      if (fill === "#ffffff") continue;
      out.push(`<rect x="${num(x0 + (i % rk) * px / rk)}" y="${num(y0 + Math.floor(i / rk) * px / rq)}" ` +
               `width="${num(px / rk)}" height="${num(px / rq)}" fill="${fill}"/>`);
    }
    return out.join("\n");
  }

  // What full colour means, as on the page (A.top): absolute for weights on the "absolute" scale, else the map's max.
  const mapTop = (src, state, layer, head) =>
    (src.range === "unit" && state.scale === "unit" ? 1 : src.scale(layer, head) || 1);

  // The cells of rows q0..q1-1 and columns k0..k1-1, f x f cells per block (the max of the block), white left out.
  function windowCells(src, layer, head, w, f, cell, x0, top) {
    const cols = Math.ceil((w.k1 - w.k0) / f);
    const pooled = new Float32Array(Math.ceil((w.q1 - w.q0) / f) * cols);
    for (let q = w.q0; q < w.q1; q++) {
      for (let k = w.k0; k < w.k1; k++) {
        const i = Math.floor((q - w.q0) / f) * cols + Math.floor((k - w.k0) / f);
        pooled[i] = Math.max(pooled[i], src.value(layer, head, q, k) / top);
      }
    }
    const out = [];
    pooled.forEach((v, i) => {
      const fill = colour(v);
      if (fill !== "#ffffff") out.push(`<rect x="${num(x0 + (i % cols) * cell)}" y="${num(x0 + Math.floor(i / cols) * cell)}" ` +
                                       `width="${num(cell)}" height="${num(cell)}" fill="${fill}"/>`);
    });
    return out.join("\n");
  }

  // Row and column labels: tokens when every cell is one, else every `step`-th index.
  function axisLabels(model, w, f, cell, label) {
    const rows = Math.ceil((w.q1 - w.q0) / f);
    const step = f > 1 || rows > FIG_LABELS ? [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000].find((s) => s * cell / f >= 24) || 1000 : 0;
    const name = (i, key) => (step ? String(i) : (key ? keyText : tokenText)(model, i));
    const out = [];
    for (let i = Math.min(w.q0, w.k0); i < Math.max(w.q1, w.k1); i++) { // row i, then column i
      if (step && i % step) continue;
      if (i >= w.q0 && i < w.q1) out.push(text(label - 4, label + ((i - w.q0) / f) * cell + cell / 2 + 4, name(i), ' text-anchor="end"'));
      const c = label + ((i - w.k0) / f) * cell + cell / 2 - 4;
      if (i >= w.k0 && i < w.k1) out.push(text(c, label - 4, name(i, true), ` transform="rotate(-90 ${num(c)} ${num(label - 4)})"`));
    }
    return out.join("\n");
  }

  // The map, or the part of it the matrix view is zoomed to (root.attnscopeMatrix): at most FIG_CELLS blocks a side.
  function matrixFigure(model, state, zoomed, options) {
    const src = model.sources.get(state.source) || model.sources.values().next().value;
    const layer = src.perLayer ? state.layer : null;
    const head = src.perHead ? state.head : null;
    const w = zoomed || { q0: 0, q1: src.nq, k0: 0, k1: src.nk };
    const f = Math.ceil(Math.max(w.q1 - w.q0, w.k1 - w.k0) / FIG_CELLS); // cells per block
    const [rows, cols] = [Math.ceil((w.q1 - w.q0) / f), Math.ceil((w.k1 - w.k0) / f)];
    const cell = Math.max(2, Math.min(20, 600 / Math.max(rows, cols)));
    const label = f > 1 || rows > FIG_LABELS ? 40 : widest(model, 11) + 6;
    const top = mapTop(src, state, layer, head);
    const body = [`<g class="cells">${windowCells(src, layer, head, w, f, cell, label, top)}</g>`,
      `<rect x="${num(label)}" y="${num(label)}" width="${num(cols * cell)}" height="${num(rows * cell)}" fill="none" ` +
      `stroke="${MUTED}" stroke-width="0.5"/>`, `<g class="tokens" font-size="11">${axisLabels(model, w, f, cell, label)}</g>`,
      F.colourBar(label + cols * cell + 16, label, Math.max(rows * cell, 96), colour,
                  [top, 0, top === 1 ? "1" : `${A.fmt(top)} (max)`], src.label)];
    if (model.causal && src.nq === src.nk) body.push(`<text x="${num(label)}" y="${num(label + rows * cell + 16)}" fill="${MUTED}">` +
      "white above the diagonal: a causal query never sees later keys</text>");
    const whole = w.q0 === 0 && w.k0 === 0 && w.q1 === src.nq && w.k1 === src.nk;
    const parts = [src.label, layer === null ? null : `layer ${layer}`, head === null ? null : `head ${head}`,
      whole ? null : `queries ${w.q0}–${w.q1 - 1}, keys ${w.k0}–${w.k1 - 1} (as zoomed)`,
      f > 1 ? `each cell the max of ${f} × ${f} (max-pooled)` : null,
      `colour: 0 (white) to ${top === 1 ? "1" : A.fmt(top) + " (this map's max)"}`];
    return svg(body.join("\n"), label + cols * cell + 80, label + Math.max(rows * cell, 96) + 20,
               caption(model, "matrix", parts, layer, head === null ? [] : [head]), options);
  }

  function modelFigure(model, state, zoomed, options) {
    const src = model.sources.get(state.source) || model.sources.values().next().value;
    const layers = src.perLayer ? model.layers : [null];
    const heads = src.perHead ? model.heads : [null];
    const px = 64;
    const gap = 6;
    const left = 64;
    const body = ['<g class="axes" font-size="11">'];
    heads.forEach((h, j) => body.push(text(left + j * (px + gap) + px / 2, 12, h === null ? "" : `head ${h}`,
                                           ' text-anchor="middle"')));
    layers.forEach((l, i) => body.push(text(0, 18 + i * (px + gap) + px / 2 + 4, l === null ? "" : `layer ${l}`)));
    body.push("</g>");
    layers.forEach((l, i) => heads.forEach((h, j) => {
      const x = left + j * (px + gap);
      const y = 18 + i * (px + gap);
      const top = mapTop(src, state, l, h);
      body.push(`<g class="thumb" data-layer="${l ?? ""}" data-head="${h ?? ""}">` +
        `${cells(src, l, h, px, x, y, top)}<rect x="${x}" y="${y}" width="${px}" height="${px}" ` +
        `fill="none" stroke="${MUTED}" stroke-width="0.5"/></g>`);
    }));
    const unit = src.range === "unit" && state.scale === "unit"; // as mapTop: absolute, else each map's max
    body.push(F.colourBar(left + heads.length * (px + gap) + 10, 18, Math.min(layers.length * (px + gap) - gap, 192),
                          colour, unit ? [1, 0] : [1, 0, "each map's max"], src.label));
    const [rq, rk] = [Math.min(src.nq, THUMB), Math.min(src.nk, THUMB)];
    const parts = [src.label, `${layers.length} layers × ${heads.length} heads`,
      rq < src.nq || rk < src.nk ? `each map max-pooled to ${rq} × ${rk}` : null];
    return svg(body.join("\n"), left + heads.length * (px + gap) + 80, 18 + layers.length * (px + gap),
               caption(model, "model", parts, null, []), options);
  }

  // The views drawn as figures; neuron-figure.js adds the neuron view's (A.figureMakers.neuron).
  const FIGURES = (A.figureMakers = { head: headFigure, matrix: matrixFigure, model: modelFigure });
  A.figureViews = Object.keys(FIGURES);
  // What neuron-figure.js draws with: the caption of a view's figure, its token labels, the print colours.
  Object.assign(F, { caption: caption, tokenText: tokenText, keyText: keyText, widest: widest, colour: colour, ROW: ROW });

  // The generation view at one step (assets/generation.js gathers `fig`): the text so far, each token a <text> on a
  // <rect> shaded by the step's query's attention to it, the token written outlined, and the top alternatives.
  A.generationSVG = function (fig, options) {
    const [maxW, lineH] = [760, 26];
    const top = fig.row ? Math.max(...fig.row, 1e-12) : 0;
    const out = ['<g class="tokens" font-family="ui-monospace, monospace" font-size="13" xml:space="preserve">'];
    let [x, y] = [0, 0];
    fig.tokens.forEach((t, i) => {
      const shown = String(t).replace(/\n/g, "↵");
      const w = Math.max(10, width(shown, 13) + 6);
      if (x + w > maxW && x > 0) [x, y] = [0, y + lineH];
      const v = fig.row && i < fig.row.length ? fig.row[i] / top : null;
      const writing = i === fig.tokens.length - 1;
      const edge = writing ? ' stroke="#e6550d" stroke-dasharray="3 2"' : i === fig.query ? ' stroke="#333333"' : "";
      out.push(`<rect x="${num(x)}" y="${y}" width="${num(w)}" height="${lineH - 6}" rx="3" fill="#08519c" ` +
               `fill-opacity="${v === null ? 0 : (0.08 + 0.8 * v).toFixed(3)}"${edge}/>`);
      const ink = writing ? ' fill="#e6550d" font-weight="600"' : v !== null && v > 0.55 ? ' fill="#ffffff"' : "";
      out.push(text(x + 3, y + 15, shown, ` data-position="${i}"${ink}`));
      x += w + 2;
    });
    out.push("</g>");
    const y0 = y + lineH + 16;
    const best = Math.max(...fig.alternatives.map((a) => a.probability), 1e-12);
    const bars = [`<g class="alternatives" transform="translate(0 ${y0})">`,
      text(0, 0, `step ${fig.step}: top alternatives (probability)`, ' font-weight="600"')];
    fig.alternatives.forEach((a, i) => {
      const yy = 10 + i * 18;
      bars.push(text(0, yy + 11, JSON.stringify(a.token), ' font-family="ui-monospace, monospace"'),
        `<rect x="150" y="${yy + 2}" width="${num((160 * a.probability) / best)}" height="11" ` +
        `fill="${a.token === fig.token ? "#e6550d" : "#9ecae1"}"/>`, text(318, yy + 11, a.probability.toFixed(4)));
    });
    bars.push("</g>");
    if (fig.row) { // what the shades mean: the token's rectangle is #08519c at opacity 0.08 + 0.8 × weight / max
      const shade = (v) => `#${[8, 81, 156].map((c) => Math.round(255 + (c - 255) * (0.08 + 0.8 * v))
        .toString(16).padStart(2, "0")).join("")}`;
      bars.push(F.colourBar(420, y0 + 12, Math.max(64, fig.alternatives.length * 18 - 6), shade,
                            [top, 0, `${A.fmt(top)} (max)`], "attention of the step's query"));
    }
    return svg(out.join("\n") + "\n" + bars.join("\n"), maxW, y0 + 14 + fig.alternatives.length * 18, fig.caption,
               options);
  };

  // figureSVG(root, view?, options?) -> the SVG text of the view shown in `root` (or of `view`), with the current
  // selection. options.caption: false leaves the caption out (default: the caption is drawn).
  A.figureSVG = function (root, view, options) {
    if (root.attnscopeFigure) return root.attnscopeFigure(options); // a page with one figure of its own (generation)
    const shown = root.attnscopeShown;
    if (!shown) throw new Error("no attnscope views drawn in this element");
    const name = view || shown.view();
    if (!FIGURES[name]) throw new Error(`no figure for the ${name} view: choose one of ${A.figureViews.join(", ")}`);
    return FIGURES[name](shown.model, shown.state(), name === "matrix" ? root.attnscopeMatrix : null, options);
  };

  // figureReady(root, view?) -> Promise: on a lazily sent trace (the web app on a long text), the maps the head or
  // matrix figure draws are fetched first (the layer's shown heads; the matrix's head, or its heads for their
  // mean), so that no head is drawn from its overview. The model figure draws max-pooled thumbnails either way.
  A.figureReady = async function (root, view) {
    const shown = root.attnscopeShown;
    if (!shown || !shown.model.lazy) return;
    const [name, state, model] = [view || shown.view(), shown.state(), shown.model];
    const src = model.sources.get(state.source || "weights") || model.sources.values().next().value;
    if (!src || !src.lazy || (name !== "head" && name !== "matrix")) return;
    const picked = (state.heads || []).filter((h) => src.heads.includes(h));
    const heads = !src.perHead ? [null] : name === "head" || (state.meanHeads && picked.length) ? picked : [state.head];
    await Promise.all(heads.map((h) => src.load(src.perLayer ? state.layer : null, h)));
  };

  // figurePNG(root, scale, view?, options?) -> a PNG data: URL of the same figure, `scale` device pixels per SVG pixel.
  A.figurePNG = async function (root, scale, view, options) {
    return A.svgToPNG(A.figureSVG(root, view, options), scale);
  };

  // SVG text -> a PNG data: URL, `scale` device pixels per SVG pixel.
  A.svgToPNG = async function (doc, scale) {
    const img = new Image();
    img.src = `data:image/svg+xml;charset=utf-8,${encodeURIComponent(doc)}`;
    await img.decode();
    const canvas = document.createElement("canvas");
    canvas.width = Math.round(img.naturalWidth * scale);
    canvas.height = Math.round(img.naturalHeight * scale);
    const g = canvas.getContext("2d");
    g.scale(scale, scale);
    g.drawImage(img, 0, 0);
    return canvas.toDataURL("image/png");
  };

  // The effect grids of an intervention (views/effects.py's payload): one layer x head heatmap per grid, each
  // cell coloured as on the page (blue below zero, orange above) with its value as text; NaN hatched grey.
  A.effectsSVG = function (data, options) {
    const cellW = 58;
    const cellH = 20;
    const body = [];
    let y = 0;
    for (const g of data.grids) {
      const nHeads = g.values.length ? g.values[0].length : 0;
      let top = 0;
      for (const row of g.values) for (const v of row) if (v !== null) top = Math.max(top, Math.abs(v));
      body.push(`<g class="grid" data-name="${esc(g.name)}">`, text(0, y + 14, `${g.label} (${g.name})`,
                                                                       ' font-weight="600"'));
      y += 22;
      const bar = F.divergingBar(56 + nHeads * cellW + 14, y + cellH + 14, 120, top, "colour: the value");
      for (let h = 0; h < nHeads; h++) body.push(text(56 + h * cellW + cellW / 2, y + 14, `head ${h}`, ' text-anchor="middle"'));
      y += cellH;
      g.values.forEach((row, layer) => {
        body.push(text(0, y + 14, `layer ${layer}`));
        row.forEach((v, h) => {
          const x = 56 + h * cellW;
          body.push(`<rect x="${x}" y="${y}" width="${cellW - 2}" height="${cellH - 2}" ` +
                    `fill="${v === null ? "#dddddd" : A.diverging(v, top, "light")}"/>`);
          const shown = v === null ? "NaN" : (v >= 0 ? "+" : "") + v.toFixed(Math.abs(v) >= 100 ? 1 : 4);
          body.push(text(x + cellW / 2 - 1, y + 13, shown, ' text-anchor="middle" font-size="10"'));
        });
        y += cellH;
      });
      body.push("</g>", bar); // the grid's colour bar after it: the grid's texts are its labels and values
      y += 12;
    }
    const widest = Math.max(0, ...data.grids.map((g) => (g.values.length ? g.values[0].length : 0)));
    const lines = [`${data.title} · layers × heads, 0-indexed`, "blue below zero, orange above; NaN grey"];
    return svg(body.join("\n"), 56 + widest * cellW + 150, y, lines, options);
  };

  function save(url, name) {
    const a = A.el("a", { href: url, download: name });
    document.body.append(a);
    a.click();
    a.remove();
  }

  // A download button for any figure: `make()` returns the SVG text (or a Promise of it), saved as `name`.
  A.svgButton = function (make, name) {
    return A.el("button", { type: "button", class: "as-export", "data-format": "svg", text: "⤓ SVG",
                            title: "download as an SVG figure", onclick: async () => {
      const url = URL.createObjectURL(new Blob([await make()], { type: "image/svg+xml" }));
      save(url, typeof name === "function" ? name() : name);
      setTimeout(() => URL.revokeObjectURL(url), 1000);
    } });
  };

  // A PNG download button for any figure: `make()` returns the SVG text (or a Promise of it), drawn at twice its size.
  A.pngButton = function (make, name) {
    return A.el("button", { type: "button", class: "as-export", "data-format": "png", text: "⤓ PNG",
                            title: "download as a PNG figure (2x)", onclick: async () =>
      save(await A.svgToPNG(await make(), 2), typeof name === "function" ? name() : name) });
  };

  // The download buttons of the header: the view shown (its maps fetched first on a lazy trace), as SVG, or as
  // PNG at twice the screen size.
  A.exportButtons = function (root) {
    const name = (ext) => {
      const s = root.attnscopeShown;
      const st = s.state();
      return `attnscope-${s.view()}-layer${st.layer}-head${st.head}.${ext}`;
    };
    const make = async () => {
      await A.figureReady(root);
      return A.figureSVG(root);
    };
    return [A.svgButton(make, () => name("svg")), A.pngButton(make, () => name("png"))];
  };
})();
