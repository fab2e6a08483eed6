/* attnscope views: the matrix view. A query x key heatmap of one head on a canvas that pans and zooms, with
   token labels (index ticks when cells are small), the causally masked area hatched, the value on hover and a
   colour legend. Drawn from tiles (assets/tiles.js): when a cell would be smaller than a pixel each pixel shows
   the max of its block (max-pooled overview), zoomed in each cell is exact. Rows are queries, columns keys. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const el = (...a) => A.el(...a);
  A.views = A.views || {};
  const MAX_SIDE = 720; // px for the whole matrix at the start
  const MAX_CELL = 40; // px per cell at the deepest zoom
  const LABELS_FROM = 10; // px per cell from which rows and columns carry token labels (index ticks below)
  const font = (cell) => `${Math.max(9, Math.min(12, Math.floor(cell) - 1))}px system-ui, sans-serif`;

  // What the rows and columns are: the map's own sizes ([target, source] maps of a cross attention are not square).
  function axes(ctx, src) {
    const key = A.keyLabel || A.tokenLabel; // a cross-attention's keys are the source tokens (A.keys)
    return { nq: src.nq, nk: src.nk, q: (i) => A.tokenLabel(ctx.model, i), k: (j) => key(ctx.model, j) };
  }

  // px per cell (whole once there is room) so that the labels and the map together fit `available`
  function cellSize(n, room) {
    const fit = Math.min(MAX_SIDE, room) / n;
    return Math.min(24, fit >= 2 ? Math.floor(fit) : fit);
  }

  // px of the label margin: the widest token label in the font of that cell size
  function labelWidth(ax, cell) {
    const g = document.createElement("canvas").getContext("2d");
    g.font = font(Math.max(cell, 13));
    let widest = 0;
    for (let i = 0; i < Math.max(ax.nq, ax.nk); i++) {
      widest = Math.max(widest, g.measureText(ax[i < ax.nq ? "q" : "k"](i)).width);
    }
    return Math.ceil(Math.min(140, 8 + widest));
  }

  function geometry(ax, available) {
    const n = Math.max(ax.nq, ax.nk);
    const first = labelWidth(ax, cellSize(n, available - 40)); // the labels at a first guess of the cells
    const cell = cellSize(n, available - first - 2);            // the cells in what the labels leave
    const label = Math.min(first, labelWidth(ax, cell));        // smaller cells: a smaller font, never wider
    return { fit: cell, label: label, w: ax.nk * cell, h: ax.nq * cell, nq: ax.nq, nk: ax.nk, ax: ax };
  }

  // Keeps the zoom between the whole map and MAX_CELL px per cell, and the view inside the map.
  function clampView(geo, v) {
    const scale = Math.max(geo.fit, Math.min(Math.max(geo.fit, MAX_CELL), v.scale));
    const q0 = Math.max(0, Math.min(geo.nq - geo.h / scale, v.q0));
    const k0 = Math.max(0, Math.min(geo.nk - geo.w / scale, v.k0));
    return { scale: scale, q0: q0, k0: k0 };
  }

  // Zoom by `factor` around the canvas point (x, y): the cell under it stays under it.
  function zoomAt(geo, v, factor, x, y) {
    const [dx, dy] = [x - geo.label, y - geo.label];
    const scale = Math.max(geo.fit, Math.min(Math.max(geo.fit, MAX_CELL), v.scale * factor));
    return clampView(geo, { scale: scale, q0: v.q0 + dy / v.scale - dy / scale, k0: v.k0 + dx / v.scale - dx / scale });
  }

  const visible = (geo, v) => ({ q0: Math.floor(v.q0), q1: Math.min(geo.nq, Math.ceil(v.q0 + geo.h / v.scale)),
                                 k0: Math.floor(v.k0), k1: Math.min(geo.nk, Math.ceil(v.k0 + geo.w / v.scale)) });

  // Keys after the query, within the view: the staircase above the diagonal.
  function maskPath(geo, v) {
    const X = (k) => geo.label + (k - v.k0) * v.scale;
    const Y = (q) => geo.label + (q - v.q0) * v.scale;
    const { q0, q1 } = visible(geo, v);
    const path = new Path2D();
    path.moveTo(X(q0 + 1), Y(q0));
    path.lineTo(geo.label + geo.w, Y(q0));
    path.lineTo(geo.label + geo.w, Y(q1));
    for (let q = q1 - 1; q >= q0; q--) {
      path.lineTo(X(q + 1), Y(q + 1));
      path.lineTo(X(q + 1), Y(q));
    }
    path.closePath();
    return path;
  }

  // Token labels when cells are tall enough to read, else every `step`-th index (0-indexed).
  function drawLabels(g, geo, v, fg) {
    const fit = (t) => (t.length > 18 ? t.slice(0, 17) + "…" : t);
    const words = v.scale >= LABELS_FROM;
    let step = 1;
    for (const s of [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]) if ((step = s) * v.scale >= 36) break;
    const show = (i) => (words ? fit(geo.ax.q(i)) : i % step ? null : String(i));
    const showKey = (i) => (words ? fit(geo.ax.k(i)) : i % step ? null : String(i));
    const r = visible(geo, v);
    g.font = font(words ? v.scale : 12);
    g.fillStyle = fg;
    g.textBaseline = "middle";
    g.save();
    g.beginPath();
    g.rect(0, geo.label, geo.label, geo.h);
    g.clip();
    g.textAlign = "right";
    for (let q = r.q0; q < r.q1; q++) if (show(q)) g.fillText(show(q), geo.label - 4, geo.label + (q + 0.5 - v.q0) * v.scale);
    g.restore();
    g.save();
    g.beginPath();
    g.rect(geo.label, 0, geo.w, geo.label);
    g.clip();
    g.textAlign = "left";
    for (let k = r.k0; k < r.k1; k++) {
      if (!showKey(k)) continue;
      g.save();
      g.translate(geo.label + (k + 0.5 - v.k0) * v.scale, geo.label - 4);
      g.rotate(-Math.PI / 2);
      g.fillText(showKey(k), 0, 0);
      g.restore();
    }
    g.restore();
  }

  function drawMatrix(g, ctx, geo, v, pyr) {
    const size = [geo.label + geo.w, geo.label + geo.h];
    g.clearRect(0, 0, size[0], size[1]);
    const level = A.drawTiles(g, pyr, v, { x: geo.label, y: geo.label, w: geo.w, h: geo.h });
    if (ctx.model.causal && geo.nq === geo.nk && geo.nq > 1) {
      g.save();
      g.beginPath();
      g.rect(geo.label, geo.label, geo.w, geo.h);
      g.clip();
      g.fillStyle = A.hatch(g, ctx.theme());
      g.fill(maskPath(geo, v));
      g.restore();
    }
    drawLabels(g, geo, v, A.cssVar(ctx.root.querySelector(".as-app") || ctx.root, "--fg"));
    return level;
  }

  // The cell (or, in the overview, the block of 2^level cells) under the cursor, and the selected ones.
  function drawCursor(overlay, geo, v, level, cursor, picked, fg) {
    const g = A.sizeCanvas(overlay, geo.label + geo.w, geo.label + geo.h);
    g.beginPath();
    g.rect(geo.label - 2, geo.label - 2, geo.w + 4, geo.h + 4);
    g.clip();
    g.strokeStyle = fg;
    const f = 2 ** level;
    const box = (q, k, w, cells) => {
      g.lineWidth = w;
      const [q0, k0] = [Math.floor(q / cells) * cells, Math.floor(k / cells) * cells];
      g.strokeRect(geo.label + (k0 - v.k0) * v.scale - 1, geo.label + (q0 - v.q0) * v.scale - 1,
                   cells * v.scale + 2, cells * v.scale + 2);
    };
    if (picked && picked.key !== null && picked.key !== undefined) box(picked.query, picked.key, 2, 1);
    g.globalAlpha = 0.5;
    for (const q of (picked && picked.queries) || []) {
      g.strokeRect(geo.label, geo.label + (q - v.q0) * v.scale, geo.w, Math.max(1, v.scale));
    }
    g.globalAlpha = 1;
    if (cursor) box(cursor.q, cursor.k, 1, f);
  }

  // Query q's exact float32 weights of a head when the page has them: its whole neuron block, or the row block the
  // web app fetched for that query (neuron.js); else null (the 8-bit map answers).
  function exactRow(model, layer, head, q, nk) {
    const whole = model.readyBlock(layer, head);
    if (whole) return whole.weights.subarray(q * nk, (q + 1) * nk);
    const row = A.neuronRowBlock ? A.neuronRowBlock(model, layer, head, q) : null;
    return row ? A.neuronRow(row, "weights", q, nk) : null;
  }

  function describeCell(ctx, where, geo, q, k) {
    const { model } = ctx;
    const lines = [`query ${geo.ax.q(q)} → key ${geo.ax.k(k)}`];
    if (model.causal && geo.nq === geo.nk && k > q) {
      return lines.concat(["masked: a causal model's query never sees later keys"]);
    }
    const exact = where.src.name === "weights" ? exactRow(model, where.layer, where.head, q, geo.nk) : null;
    if (exact) return lines.concat([`${where.src.label}: ${A.fmt(exact[k])}`]);
    const v = where.src.value(where.layer, where.head, q, k);
    const step = A.fmt(where.src.step(where.layer, where.head));
    return lines.concat([`${where.src.label}: ≈ ${A.fmt(v)} (8-bit approximation, within ±${step})`]);
  }

  // In the overview a pixel is a block: say which cells, and their max (what the pixel's colour shows).
  function describeBlock(where, geo, pyr, level, q, k) {
    const f = 2 ** level;
    const [i, j] = [Math.floor(q / f), Math.floor(k / f)];
    const qs = `${i * f}–${Math.min(geo.nq, (i + 1) * f) - 1}`;
    const ks = `${j * f}–${Math.min(geo.nk, (j + 1) * f) - 1}`;
    const max = (pyr.code(level, i, j) / 255) * where.src.scale(where.layer, where.head);
    return [`queries ${qs} × keys ${ks}: one pixel, the max of ${f} × ${f} cells`,
      `${where.src.label}: max ≈ ${A.fmt(max)}`, "zoom in (wheel, + or double-click) to see single cells"];
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

  function cellAt(e, geo, v) {
    const [x, y] = [e.offsetX - geo.label, e.offsetY - geo.label];
    if (x < 0 || y < 0 || x >= geo.w || y >= geo.h) return null;
    const q = Math.floor(v.q0 + y / v.scale);
    const k = Math.floor(v.k0 + x / v.scale);
    return q < geo.nq && k < geo.nk ? { q: q, k: k } : null;
  }

  function layout(panel, ctx) {
    const fixed = ctx.options.fixed;
    const zoom = (text, title) => el("button", { type: "button", class: "as-link as-zoom", "data-zoom": text,
                                                 title: title, text: text });
    const parts = {
      canvas: el("canvas", { class: "as-matrix", tabindex: "0", role: "img", "aria-label":
        "attention matrix: rows are queries, columns keys; arrow keys move, Enter selects, + and - zoom" }),
      overlay: el("canvas", { class: "as-matrix-overlay", "aria-hidden": "true" }),
      legend: el("div"),
      info: el("div", { class: "as-info", "aria-live": "polite" }),
      zoom: [zoom("−", "zoom out (-)"), zoom("+", "zoom in (+)"), zoom("fit", "the whole map (0)")],
      status: el("span", { class: "as-muted as-zoom-status" }),
    };
    panel.append(el("div", { class: "as-controls" }, [
      A.controls.attention ? A.controls.attention(ctx) : null, fixed ? null : A.controls.layer(ctx),
      fixed ? null : A.controls.heads(ctx, "single"), A.controls.source(ctx),
      A.controls.scale(ctx), A.controls.badge(ctx, () => ({ layer: ctx.state.layer, heads: [ctx.state.head] })),
    ]));
    parts.body = el("div", { class: "as-matrix-body" }, [parts.canvas, parts.overlay]);
    const sides = A.sides ? A.sides(ctx.model) : { q: "queries", k: "keys" }; // cross: target rows, source columns
    panel.append(el("p", { class: "as-hint", text: `Rows: ${sides.q}, columns: ${sides.k} (0-indexed). ` +
      "Hover for the value; click a cell (or arrow keys, Enter) to select it. Zoom with the wheel (ctrl+wheel on a short text), + and -, " +
      "or a double-click; drag to pan." }), parts.legend,
    el("div", { class: "as-controls as-zoom-bar" }, [...parts.zoom, parts.status]), parts.body, parts.info);
    return parts;
  }

  // The selected cell or query, and a way on to the neuron view when the page has one.
  function showInfo(info, ctx, where, geo) {
    const { query, key } = ctx.state;
    info.replaceChildren();
    if (query === null || query === undefined) return;
    info.append(el("span", { text: key === null || key === undefined ? `selected query ${geo.ax.q(query)}`
      : describeCell(ctx, where, geo, query, key).join(" · ") }));
    if (ctx.options.openView && ctx.model.payload.neuron.available) {
      info.append(el("button", { type: "button", class: "as-link", text: `neuron view of query ${query} →`,
                                 onclick: () => ctx.options.openView("neuron") }));
    }
  }

  function zoomStatus(geo, v, level) {
    const r = visible(geo, v);
    const where = `queries ${r.q0}–${r.q1 - 1}, keys ${r.k0}–${r.k1 - 1} of ${geo.nq} × ${geo.nk}`;
    if (level > 0) return `overview: each pixel is the max of ${2 ** level} × ${2 ** level} cells · ${where}`;
    return `cells of ${A.fmt(v.scale).replace(/\.?0+$/, "")} px · ${where}`;
  }

  // Pointer, wheel and keys on the matrix; `act` hovers, selects, pans (px) and zooms (factor at a point).
  function listen(canvas, s, act) {
    let drag = null;
    let dragged = false;
    canvas.addEventListener("pointerdown", (e) => {
      if (e.button === 0) drag = { x: e.clientX, y: e.clientY, moved: false };
    });
    canvas.addEventListener("pointermove", (e) => {
      if (drag && (drag.moved || Math.hypot(e.clientX - drag.x, e.clientY - drag.y) > 3)) {
        if (!drag.moved) canvas.setPointerCapture(e.pointerId);
        act.pan(e.clientX - drag.x, e.clientY - drag.y);
        drag = { x: e.clientX, y: e.clientY, moved: true };
      } else act.hover(cellAt(e, s.geo, s.view));
    });
    canvas.addEventListener("pointerup", () => ((dragged = !!(drag && drag.moved)), (drag = null)));
    canvas.addEventListener("pointerleave", () => drag || act.hover(null));
    canvas.addEventListener("click", (e) => {
      const c = dragged ? null : cellAt(e, s.geo, s.view);
      dragged = false;
      if (c) act.select(c.q, c.k, e.shiftKey); // shift-click adds the row to the selected queries
    });
    canvas.addEventListener("dblclick", (e) => act.zoom(4, e.offsetX, e.offsetY));
    canvas.addEventListener("wheel", (e) => {
      if (!e.ctrlKey && s.geo.fit >= LABELS_FROM) return; // a short text: the wheel scrolls the page
      e.preventDefault();
      act.zoom(2 ** (-e.deltaY / 200), e.offsetX, e.offsetY);
    }, { passive: false });
    canvas.addEventListener("keydown", (e) => keys(e, s, act));
  }

  function keys(e, s, act) {
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    const f = 2 ** s.level; // in the overview a step moves one pixel: one block of cells
    const c = s.cursor || { q: act.state().query ?? 0, k: act.state().key ?? 0 };
    const clamp = (v, n) => Math.max(0, Math.min(n - 1, v));
    const zooms = { "+": 2, "=": 2, "-": 0.5, _: 0.5 };
    if (e.key in moves) act.move({ q: clamp(c.q + moves[e.key][0] * f, s.geo.nq), k: clamp(c.k + moves[e.key][1] * f, s.geo.nk) });
    else if (e.key in zooms) act.zoomCell(zooms[e.key], s.cursor);
    else if (e.key === "0") act.fit();
    else if (e.key === "Enter") act.select(c.q, c.k);
    else if (e.key === "Escape") act.hover(null);
    else return;
    e.preventDefault();
  }

  A.views.matrix = {
    label: "Matrix",
    render(panel, ctx) {
      const parts = layout(panel, ctx);
      const tip = A.tooltip(parts.body);
      const available = panel.clientWidth || MAX_SIDE;
      const s = { geo: null, view: null, level: 0, cursor: null, pyr: null, key: null, g: null, frame: 0 };
      const where = () => {
        const src = ctx.source();
        return { src: src, layer: src.perLayer ? ctx.state.layer : null, head: src.perHead ? ctx.state.head : null };
      };
      const setup = () => { // the geometry of the map's sizes; the zoom stays when another map has the same sizes
        const ax = axes(ctx, where().src);
        if (s.geo && s.geo.nq === ax.nq && s.geo.nk === ax.nk) return;
        s.geo = geometry(ax, available);
        s.view = { scale: s.geo.fit, q0: 0, k0: 0 };
        s.g = A.sizeCanvas(parts.canvas, s.geo.label + s.geo.w, s.geo.label + s.geo.h);
        parts.canvas.dataset.label = String(s.geo.label); // px of the label margin, for code that points at cells
      };
      const pyramid = () => {
        const w = where();
        const held = !w.src.loaded || w.src.loaded(w.layer, w.head); // a lazy source's stand-in until it arrives
        const key = [w.src.name, w.layer, w.head, ctx.theme(), ctx.state.scale, held].join("|");
        if (key === s.key) return s.pyr;
        const toLut = w.src.scale(w.layer, w.head) / A.top(ctx, w.src, w.layer, w.head); // code -> colour index
        const codes = w.src.codes(w.layer, w.head);
        s.pyr = A.pyramid(held ? codes : codes.slice(), s.geo.nq, s.geo.nk, A.codeColours(ctx.theme(), toLut));
        s.key = key;
        return s.pyr;
      };
      const fg = () => A.cssVar(ctx.root.querySelector(".as-app") || ctx.root, "--fg");
      const marks = () => drawCursor(parts.overlay, s.geo, s.view, s.level, s.cursor, { query: ctx.state.query,
        key: ctx.state.key, queries: A.selectedQueries(ctx.state) }, fg());
      const paint = () => {
        s.level = drawMatrix(s.g, ctx, s.geo, s.view, pyramid());
        Object.assign(parts.canvas.dataset, { cell: String(s.view.scale), q0: String(s.view.q0),
                                              k0: String(s.view.k0), level: String(s.level) });
        parts.status.textContent = zoomStatus(s.geo, s.view, s.level);
        ctx.root.attnscopeMatrix = visible(s.geo, s.view); // the part in view: what a figure of this view shows
        marks();
        A.emit(parts.canvas, "attnscope:drawn", { level: s.level, scale: s.view.scale });
      };
      const act = actions(ctx, s, tip, where, paint, marks);
      parts.zoom[0].onclick = () => act.zoom(0.5, s.geo.label + s.geo.w / 2, s.geo.label + s.geo.h / 2);
      parts.zoom[1].onclick = () => act.zoom(2, s.geo.label + s.geo.w / 2, s.geo.label + s.geo.h / 2);
      parts.zoom[2].onclick = act.fit;
      listen(parts.canvas, s, act);
      const full = () => {
        setup();
        paint();
        parts.legend.replaceChildren(legend(ctx, where()));
        showInfo(parts.info, ctx, where(), s.geo);
      };
      ctx.subscribe((st, p) => {
        if (ctx.changed(p, ["layer", "head", "source", "theme", "scale"])) full();
        else if (ctx.changed(p, ["query", "queries", "key"])) (marks(), showInfo(parts.info, ctx, where(), s.geo));
      });
      ctx.onDispose(() => (cancelAnimationFrame(s.frame), delete ctx.root.attnscopeMatrix));
      full();
    },
  };

  // What pointer and keys do to the view: s holds the geometry, the view, the level drawn and the cursor.
  function actions(ctx, s, tip, where, paint, marks) {
    const later = () => {
      cancelAnimationFrame(s.frame);
      s.frame = requestAnimationFrame(paint);
    };
    const act = {
      state: () => ctx.state,
      hover(c) {
        s.cursor = c;
        marks();
        if (!c) return tip.hide();
        const lines = s.level ? describeBlock(where(), s.geo, s.pyr, s.level, c.q, c.k)
          : describeCell(ctx, where(), s.geo, c.q, c.k);
        const [x, y] = [(c.k + 1 - s.view.k0) * s.view.scale, (c.q + 1 - s.view.q0) * s.view.scale];
        tip.show(s.geo.label + Math.min(s.geo.w, x), s.geo.label + Math.min(s.geo.h, y), lines);
      },
      select(q, k, shift) {
        ctx.set(Object.assign(A.pickQuery(ctx.state, q, shift), { key: k }));
        const w = where();
        ctx.emit("attnscope:select", { view: "matrix", layer: w.layer, head: w.head, query: q, key: k, source: w.src.name });
      },
      pan(dx, dy) {
        tip.hide();
        s.view = clampView(s.geo, { scale: s.view.scale, q0: s.view.q0 - dy / s.view.scale, k0: s.view.k0 - dx / s.view.scale });
        later();
      },
      zoom(factor, x, y) {
        tip.hide();
        s.view = zoomAt(s.geo, s.view, factor, x, y);
        later();
      },
      zoomCell(factor, c) { // around the cursor's cell, else the middle of the view
        const at = c ? [(c.k + 0.5 - s.view.k0) * s.view.scale, (c.q + 0.5 - s.view.q0) * s.view.scale] : [s.geo.w / 2, s.geo.h / 2];
        act.zoom(factor, s.geo.label + at[0], s.geo.label + at[1]);
      },
      fit() {
        tip.hide();
        s.view = { scale: s.geo.fit, q0: 0, k0: 0 };
        later();
      },
      move(c) { // the cursor to a cell, the view panned to keep it in sight
        const r = visible(s.geo, s.view);
        const span = [s.geo.h / s.view.scale, s.geo.w / s.view.scale];
        const q0 = c.q < r.q0 + 1 ? c.q : c.q >= s.view.q0 + span[0] - 1 ? c.q + 1 - span[0] : s.view.q0;
        const k0 = c.k < r.k0 + 1 ? c.k : c.k >= s.view.k0 + span[1] - 1 ? c.k + 1 - span[1] : s.view.k0;
        s.view = clampView(s.geo, { scale: s.view.scale, q0: q0, k0: k0 });
        paint();
        act.hover(c);
      },
    };
    return act;
  }

  A.matrixView = { clampView: clampView, zoomAt: zoomAt, geometry: geometry, MAX_CELL: MAX_CELL };
})();
