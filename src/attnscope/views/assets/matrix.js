/* attnscope views: the matrix view. A query x key heatmap of one head with token labels, the causally
   masked area hatched, the value on hover and a colour legend. One pixel per cell, scaled up. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const el = (...a) => A.el(...a);
  A.views = A.views || {};
  const MAX_SIDE = 720; // px for the whole matrix
  const font = (cell) => `${Math.min(12, Math.floor(cell) - 1)}px system-ui, sans-serif`;

  function geometry(model, available) {
    const fit = Math.min(MAX_SIDE, available - 40) / model.n; // px per cell, whole pixels once there is room
    const cell = Math.max(1, Math.min(24, fit >= 2 ? Math.floor(fit) : fit));
    let label = 0;
    if (cell >= 10) {
      const g = document.createElement("canvas").getContext("2d");
      g.font = font(cell);
      label = Math.min(140, 8 + Math.max(...model.tokens.map((t, i) => g.measureText(A.tokenLabel(model, i)).width)));
    }
    return { cell: cell, label: Math.ceil(label), side: model.n * cell };
  }

  // [query, key] codes -> an n x n image through the theme's colour table.
  function heatImage(ctx, src, layer, head) {
    const n = ctx.model.n;
    const codes = src.codes(layer, head);
    const toLut = src.scale(layer, head) / A.top(ctx, src, layer, head); // code -> colour index
    const lut = A.lut(ctx.theme());
    const off = document.createElement("canvas");
    off.width = n;
    off.height = n;
    const g = off.getContext("2d");
    const img = g.createImageData(n, n);
    const colours = new Uint32Array(lut.buffer); // one RGBA pixel per entry
    const pixels = new Uint32Array(img.data.buffer);
    for (let i = 0; i < n * n; i++) pixels[i] = colours[Math.min(255, Math.round(codes[i] * toLut))];
    g.putImageData(img, 0, 0);
    return off;
  }

  A.hatch = function (g, theme) {
    const p = document.createElement("canvas");
    p.width = p.height = 6;
    const pg = p.getContext("2d");
    pg.strokeStyle = theme === "dark" ? "rgba(200,200,200,.35)" : "rgba(90,90,90,.35)";
    pg.beginPath();
    pg.moveTo(0, 6);
    pg.lineTo(6, 0);
    pg.stroke();
    return g.createPattern(p, "repeat");
  };

  // Keys after the query: the staircase above the diagonal.
  function maskPath(n, cell, x0, y0) {
    const path = new Path2D();
    path.moveTo(x0 + cell, y0);
    path.lineTo(x0 + n * cell, y0);
    path.lineTo(x0 + n * cell, y0 + (n - 1) * cell);
    for (let q = n - 1; q >= 0; q--) {
      path.lineTo(x0 + (q + 1) * cell, y0 + (q + 1) * cell);
      path.lineTo(x0 + (q + 1) * cell, y0 + q * cell);
    }
    path.closePath();
    return path;
  }

  function drawLabels(g, model, geo, fg) {
    g.font = font(geo.cell);
    g.fillStyle = fg;
    g.textBaseline = "middle";
    const fit = (t) => (t.length > 18 ? t.slice(0, 17) + "…" : t);
    model.tokens.forEach((t, i) => {
      const y = geo.label + i * geo.cell + geo.cell / 2;
      g.textAlign = "right";
      g.fillText(fit(A.tokenLabel(model, i)), geo.label - 4, y);
      g.save();
      g.translate(y, geo.label - 4);
      g.rotate(-Math.PI / 2);
      g.textAlign = "left";
      g.fillText(fit(A.tokenLabel(model, i)), 0, 0);
      g.restore();
    });
  }

  function drawMatrix(canvas, ctx, geo, where) {
    const { model } = ctx;
    const theme = ctx.theme();
    const size = geo.label + geo.side;
    const g = A.sizeCanvas(canvas, size, size);
    g.imageSmoothingEnabled = false;
    g.drawImage(heatImage(ctx, where.src, where.layer, where.head), geo.label, geo.label, geo.side, geo.side);
    if (model.causal && model.n > 1) {
      g.fillStyle = A.hatch(g, theme);
      g.fill(maskPath(model.n, geo.cell, geo.label, geo.label));
    }
    if (geo.label) drawLabels(g, model, geo, A.cssVar(ctx.root.querySelector(".as-app") || ctx.root, "--fg"));
  }

  function drawCursor(overlay, geo, cursor, picked, fg) {
    const size = geo.label + geo.side;
    const g = A.sizeCanvas(overlay, size, size);
    g.strokeStyle = fg;
    const box = (q, k, w) => {
      g.lineWidth = w;
      g.strokeRect(geo.label + k * geo.cell - 1, geo.label + q * geo.cell - 1, geo.cell + 2, geo.cell + 2);
    };
    if (picked && picked.key !== null && picked.key !== undefined) box(picked.query, picked.key, 2);
    g.globalAlpha = 0.5;
    for (const q of (picked && picked.queries) || []) g.strokeRect(geo.label, geo.label + q * geo.cell, geo.side, geo.cell);
    g.globalAlpha = 1;
    if (cursor) box(cursor.q, cursor.k, 1);
  }

  function describeCell(ctx, where, q, k) {
    const { model } = ctx;
    const lines = [`query ${A.tokenLabel(model, q)} → key ${A.tokenLabel(model, k)}`];
    if (model.causal && k > q) return lines.concat(["masked: a causal model's query never sees later keys"]);
    const exact = where.src.name === "weights" ? model.readyBlock(where.layer, where.head) : null;
    if (exact) return lines.concat([`${where.src.label}: ${A.fmt(exact.weights[q * model.n + k])}`]);
    const v = where.src.value(where.layer, where.head, q, k);
    const step = A.fmt(where.src.step(where.layer, where.head));
    return lines.concat([`${where.src.label}: ≈ ${A.fmt(v)} (8-bit approximation, within ±${step})`]);
  }

  function legend(ctx, where) {
    const w = 160;
    const bar = A.canvas(w, 10, "as-legend-bar");
    const g = bar.getContext("2d");
    const lut = A.lut(ctx.theme());
    for (let x = 0; x < w; x++) {
      const c = Math.round((x / (w - 1)) * 255) * 4;
      g.fillStyle = `rgb(${lut[c]},${lut[c + 1]},${lut[c + 2]})`;
      g.fillRect(x, 0, 1, 10);
    }
    const top = A.top(ctx, where.src, where.layer, where.head);
    const absolute = where.src.range === "unit" && ctx.state.scale === "unit";
    const parts = [el("span", { text: "0" }), bar, el("span", { text: A.fmt(top, 3) }),
                   el("span", { class: "as-muted", text: absolute ? "(weight)" : "(the max of this map)" })];
    if (ctx.model.causal) parts.push(el("span", { class: "as-swatch as-masked" }), el("span", { text: "masked (causal)" }));
    return el("div", { class: "as-legend", "aria-label": "colour scale" }, parts);
  }

  function cellAt(e, geo, n) {
    const k = Math.floor((e.offsetX - geo.label) / geo.cell);
    const q = Math.floor((e.offsetY - geo.label) / geo.cell);
    return q >= 0 && k >= 0 && q < n && k < n ? { q: q, k: k } : null;
  }

  function layout(panel, ctx) {
    const fixed = ctx.options.fixed;
    panel.append(el("div", { class: "as-controls" }, [
      fixed ? null : A.controls.layer(ctx), fixed ? null : A.controls.heads(ctx, "single"), A.controls.source(ctx),
      A.controls.scale(ctx), A.controls.badge(ctx, () => ({ layer: ctx.state.layer, heads: [ctx.state.head] })),
    ]));
    const parts = {
      canvas: el("canvas", { class: "as-matrix", tabindex: "0", role: "img", "aria-label":
        "attention matrix: rows are queries, columns keys; arrow keys move, Enter selects" }),
      overlay: el("canvas", { class: "as-matrix-overlay", "aria-hidden": "true" }),
      legend: el("div"),
      info: el("div", { class: "as-info", "aria-live": "polite" }),
    };
    parts.body = el("div", { class: "as-matrix-body" }, [parts.canvas, parts.overlay]);
    panel.append(el("p", { class: "as-hint", text: "Rows: queries, columns: keys (0-indexed). Hover for the value; " +
      "click a cell (or arrow keys, Enter) to select it." }), parts.legend, parts.body, parts.info);
    return parts;
  }

  // The selected cell or query, and a way on to the neuron view when the page has one.
  function showInfo(info, ctx, where) {
    const { query, key } = ctx.state;
    info.replaceChildren();
    if (query === null || query === undefined) return;
    info.append(el("span", { text: key === null || key === undefined ? `selected query ${A.tokenLabel(ctx.model, query)}`
      : describeCell(ctx, where, query, key).join(" · ") }));
    if (ctx.options.openView && ctx.model.payload.neuron.available) {
      info.append(el("button", { type: "button", class: "as-link", text: `neuron view of query ${query} →`,
                                 onclick: () => ctx.options.openView("neuron") }));
    }
  }

  // Mouse and keys on the matrix: hover(cell | null) shows a value, select(q, k) picks a cell.
  function listen(canvas, ctx, geo, cursor, hover, select) {
    const n = ctx.model.n;
    canvas.addEventListener("mousemove", (e) => hover(cellAt(e, geo, n)));
    canvas.addEventListener("mouseleave", () => hover(null));
    canvas.addEventListener("click", (e) => {
      const c = cellAt(e, geo, n);
      if (c) select(c.q, c.k, e.shiftKey); // shift-click adds the row to the selected queries
    });
    canvas.addEventListener("keydown", (e) => {
      const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
      const c = cursor() || { q: ctx.state.query ?? 0, k: ctx.state.key ?? 0 };
      const clamp = (v) => Math.max(0, Math.min(n - 1, v));
      if (e.key in moves) hover({ q: clamp(c.q + moves[e.key][0]), k: clamp(c.k + moves[e.key][1]) });
      else if (e.key === "Enter") select(c.q, c.k);
      else if (e.key === "Escape") hover(null);
      else return;
      e.preventDefault();
    });
  }

  A.views.matrix = {
    label: "Matrix",
    render(panel, ctx) {
      const parts = layout(panel, ctx);
      const tip = A.tooltip(parts.body);
      const geo = geometry(ctx.model, panel.clientWidth || MAX_SIDE);
      parts.canvas.dataset.cell = String(geo.cell); // px per cell and label margin, for code that points at cells
      parts.canvas.dataset.label = String(geo.label);
      let cursor = null;
      const where = () => {
        const src = ctx.source();
        return { src: src, layer: src.perLayer ? ctx.state.layer : null, head: src.perHead ? ctx.state.head : null };
      };
      const fg = () => A.cssVar(ctx.root.querySelector(".as-app") || ctx.root, "--fg");
      const marks = () => drawCursor(parts.overlay, geo, cursor, { query: ctx.state.query, key: ctx.state.key,
                                                                    queries: A.selectedQueries(ctx.state) }, fg());
      const hover = (c) => {
        cursor = c;
        marks();
        if (!c) return tip.hide();
        tip.show(geo.label + (c.k + 1) * geo.cell, geo.label + (c.q + 1) * geo.cell, describeCell(ctx, where(), c.q, c.k));
      };
      const select = (q, k, shift) => {
        ctx.set(Object.assign(A.pickQuery(ctx.state, q, shift), { key: k }));
        const w = where();
        ctx.emit("attnscope:select", { view: "matrix", layer: w.layer, head: w.head, query: q, key: k, source: w.src.name });
      };
      listen(parts.canvas, ctx, geo, () => cursor, hover, select);
      const full = () => {
        drawMatrix(parts.canvas, ctx, geo, where());
        parts.legend.replaceChildren(legend(ctx, where()));
        marks();
        showInfo(parts.info, ctx, where());
      };
      ctx.subscribe((s, p) => {
        if (ctx.changed(p, ["layer", "head", "source", "theme", "scale"])) full();
        else if (ctx.changed(p, ["query", "queries", "key"])) (marks(), showInfo(parts.info, ctx, where()));
      });
      full();
    },
  };
})();
