/* attnscope views: the head view. Queries on the left, keys on the right, one line per (query, key)
   with opacity by weight, one colour per head; drawn on a canvas so 512 tokens stay responsive. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const el = (...a) => A.el(...a);
  const MIN_ROW = 20; // px per token row; a short text gets taller rows (up to MAX_ROW) to use the page
  const MAX_ROW = 34;
  const BUCKETS = 16; // opacity levels: one canvas path per head and level
  const MIN_ALPHA = 0.01; // lines fainter than this are not drawn unless a token is focused
  const MAX_LINES = 12000; // beyond this many, the faintest lines are left out until a token is focused
  const SCROLL_LINES = 1500; // while the columns scroll or a long map arrives: the strongest few, then all MAX_LINES
  const IDLE_MS = 150; // once the page has been still this long (scrolling stopped, the maps arrived)
  const ARRIVALS_MS = 100; // heads arriving closer together than this are drawn in one frame
  A.views = A.views || {};

  // side "q": the query tokens; "k": the key tokens (a cross-attention's source tokens, A.keys).
  function tokenColumn(model, side) {
    const col = el("div", { class: `as-tokens as-${side}`, tabindex: "0", role: "listbox",
                            "aria-label": model.payload.attention === "cross" ? `${A.sides(model)[side]} (${side === "q"
                              ? "from" : "to"})` : side === "q" ? "query tokens (from)" : "key tokens (to)" });
    const toks = side === "q" ? model : A.keys(model);
    const label = side === "q" ? A.tokenLabel : A.keyLabel;
    toks.tokens.forEach((t, i) => {
      const cls = ["as-tok", toks.special[i] ? "as-special" : "", toks.segments[i] > 0 ? "as-seg-b" : ""];
      col.append(el("div", { class: cls.join(" "), "data-index": String(i), role: "option", title: label(model, i),
                             text: t }));
    });
    return col;
  }

  // Calls each(q, k, opacity) for every line of one head that crosses the visible band [top, top + height)
  // and passes the sentence filter. Only that band is drawn (the canvas stays put while the tokens scroll).
  function eachLine(model, src, layer, head, focus, filter, band, each) {
    const [n, nk] = [model.n, A.keys(model).n];
    const codes = src.codes(layer, head);
    const perCode = src.scale(layer, head) / 255 / src.top(layer, head); // opacity of one code step
    const minCode = focus ? 1 : Math.max(1, Math.ceil(MIN_ALPHA / (perCode || 1)));
    const qs = focus && focus.side === "q" ? focus.indices || [focus.index] : [...Array(n).keys()];
    const [k0, k1] = focus && focus.side === "k" ? [focus.index, focus.index + 1] : [0, nk];
    for (const q of qs) {
      const yq = q * band.row + band.row / 2 - band.top;
      for (let k = k0; k < k1; k++) {
        const c = codes[q * nk + k];
        if (c < minCode) continue;
        const yk = k * band.row + band.row / 2 - band.top;
        if ((yq < 0 && yk < 0) || (yq > band.height && yk > band.height) || !A.passes(model, filter, q, k)) continue;
        each(yq, yk, Math.min(1, c * perCode));
      }
    }
  }

  // Every line of one head at or above MIN_ALPHA that passes the filter, strongest first, read from the n x n
  // codes once per map by a counting sort on the uint8 codes (a histogram gives each code's offset; no comparison
  // sort of millions of lines): {q, k, code, count, bins}, bins[code] = the opacity bucket (0-255) of that code.
  const LISTS = new WeakMap(); // source -> (layer|head|filter|held -> list)
  function lineList(model, src, layer, head, filter) {
    const memo = LISTS.get(src) || new Map();
    LISTS.set(src, memo);
    const key = `${layer}|${head}|${filter}|${src.loaded ? src.loaded(layer, head) : true}`;
    if (memo.has(key)) return memo.get(key);
    const [n, nk] = [model.n, A.keys(model).n];
    const codes = src.codes(layer, head); // [query * key]
    const perCode = src.scale(layer, head) / 255 / src.top(layer, head); // opacity of one code step
    const minCode = Math.max(1, Math.ceil(MIN_ALPHA / (perCode || 1)));
    const all = !filter || filter === "all";
    const keep = (i) => all || A.passes(model, filter, Math.floor(i / nk), i % nk);
    const hist = new Uint32Array(257); // [code] how many lines have it (hist[256] = 0)
    if (all) for (let i = 0; i < n * nk; i++) hist[codes[i]]++;
    else for (let i = 0; i < n * nk; i++) if (codes[i] >= minCode && keep(i)) hist[codes[i]]++;
    const at = new Uint32Array(257); // at[c]: where code c's lines start (strongest first)
    for (let c = 255; c >= minCode; c--) at[c] = at[c + 1] + hist[c + 1];
    const count = minCode <= 255 ? at[minCode] + hist[minCode] : 0;
    const list = { q: new Uint32Array(count), k: new Uint32Array(count), code: new Uint8Array(count), count: count,
                   bins: new Uint8Array(256).map((_, c) => Math.min(255, Math.floor(Math.min(1, c * perCode) * 256))),
                   perCode: perCode };
    for (let i = 0; i < n * nk; i++) {
      const c = codes[i];
      if (c < minCode || !keep(i)) continue;
      const j = at[c]++;
      list.q[j] = Math.floor(i / nk);
      list.k[j] = i % nk;
      list.code[j] = c;
    }
    memo.set(key, list);
    return list;
  }

  // How many of one head's lines cross the band, by opacity bucket (added into counts).
  function countBand(list, band, counts) {
    const [r, top, h] = [band.row, band.top, band.height];
    for (let i = 0; i < list.count; i++) {
      const yq = list.q[i] * r + r / 2 - top;
      const yk = list.k[i] * r + r / 2 - top;
      if ((yq < 0 && yk < 0) || (yq > h && yk > h)) continue;
      counts[list.bins[list.code[i]]]++;
    }
  }

  // The lines of one head in the band at or above `floor`: the list is strongest first, so it stops at the floor.
  function bandLines(list, band, floor, each) {
    const [r, top, h] = [band.row, band.top, band.height];
    for (let i = 0; i < list.count; i++) {
      const a = Math.min(1, list.code[i] * list.perCode);
      if (a < floor) return;
      const yq = list.q[i] * r + r / 2 - top;
      const yk = list.k[i] * r + r / 2 - top;
      if ((yq < 0 && yk < 0) || (yq > h && yk > h)) continue;
      each(yq, yk, a);
    }
  }

  // The faintest opacity drawn so that at most `limit` lines are: raster time grows with every line.
  function cutoff(counts, limit) {
    let total = 0;
    for (let i = counts.length - 1; i >= 0; i--) {
      total += counts[i];
      if (total > limit) return (i + 1) / counts.length;
    }
    return 0;
  }

  // The selected heads whose maps are here (a lazy layer's other heads arrive after the first: data.js).
  function drawnHeads(ctx) {
    const src = A.headSource(ctx.model, ctx.state);
    if (!src.perHead) return [null];
    const layer = src.perLayer ? ctx.state.layer : null;
    return ctx.state.heads.filter((h) => ctx.model.heads.includes(h) && (!src.lazy || src.loaded(layer, h)));
  }

  // The selected heads still on their way (their lines are added as each arrives).
  function pendingHeads(ctx) {
    const drawn = drawnHeads(ctx);
    const src = A.headSource(ctx.model, ctx.state);
    return src.perHead ? ctx.state.heads.filter((h) => ctx.model.heads.includes(h) && !drawn.includes(h)) : [];
  }

  // Draws the lines; returns {floor: the opacity below which lines were left out (0: none were), drawn, total,
  // partial}. quick: when more than `limit` lines are in view (a long text), only the strongest SCROLL_LINES now
  // (partial: the caller draws all `limit` once the page is idle).
  function draw(canvas, ctx, focus, band, limit, quick) {
    const g = A.sizeCanvas(canvas, band.width, band.height);
    const src = A.headSource(ctx.model, ctx.state);
    const layer = src.perLayer ? ctx.state.layer : null;
    const count = ctx.model.payload.model.heads || ctx.model.heads.length;
    const heads = drawnHeads(ctx);
    const lists = focus ? null : heads.map((h) => lineList(ctx.model, src, layer, h, ctx.state.filter));
    const lines = (head, floor, each) => (focus ? eachLine(ctx.model, src, layer, head, focus, ctx.state.filter, band,
      each) : bandLines(lists[heads.indexOf(head)], band, floor, each));
    const counts = new Uint32Array(256);
    if (!focus) for (const list of lists) countBand(list, band, counts);
    const total = counts.reduce((x, y) => x + y, 0);
    const cap = quick && total > limit ? SCROLL_LINES : limit;
    const floor = focus ? 0 : cutoff(counts, cap);
    const shown = { floor: floor, total: total, drawn: 0, partial: !focus && cap < limit };
    g.lineWidth = 1;
    for (const head of heads) {
      const paths = Array.from({ length: BUCKETS }, () => new Path2D());
      lines(head, floor, (yq, yk, a) => {
        shown.drawn++;
        const p = paths[Math.min(BUCKETS - 1, Math.floor(a * BUCKETS))];
        p.moveTo(0, yq);
        p.lineTo(band.width, yk);
      });
      g.strokeStyle = A.headColour(head, count);
      paths.forEach((p, b) => {
        g.globalAlpha = (b + 0.5) / BUCKETS;
        g.stroke(p);
      });
    }
    g.globalAlpha = 1;
    return shown;
  }

  // Shade the other column by the focused token's mean weight over the drawn heads.
  function shade(cols, ctx, focus) {
    for (const col of Object.values(cols)) {
      for (const t of col.children) {
        t.style.removeProperty("--w");
        t.classList.remove("as-focus");
      }
    }
    if (!focus) return;
    const src = A.headSource(ctx.model, ctx.state);
    const layer = src.perLayer ? ctx.state.layer : null;
    const heads = drawnHeads(ctx);
    const picked = focus.indices || [focus.index]; // several queries (shift-click): shaded by their mean
    for (const i of picked) cols[focus.side].children[i].classList.add("as-focus");
    const other = cols[focus.side === "q" ? "k" : "q"].children;
    const count = heads.length * picked.length;
    for (let j = 0; j < other.length; j++) {
      let sum = 0;
      let value = 0;
      for (const i of picked) {
        const [q, k] = focus.side === "q" ? [i, j] : [j, i];
        for (const h of heads) {
          sum += src.value(layer, h, q, k) / src.top(layer, h);
          value += src.value(layer, h, q, k);
        }
      }
      if (!count) continue;
      other[j].style.setProperty("--w", String(Math.min(1, sum / count)));
      const over = [heads.length > 1 ? `${heads.length} heads` : "", picked.length > 1 ? `${picked.length} queries` : ""];
      const what = count > 1 ? `mean over ${over.filter(Boolean).join(" and ")}` : src.label;
      other[j].title = `${(focus.side === "q" ? A.keyLabel : A.tokenLabel)(ctx.model, j)} · ${what}: ≈ ${A.fmt(value / count)} (8-bit approximation)`;
    }
  }

  function keyboard(col, side, ctx, hover) {
    col.addEventListener("keydown", (e) => {
      const cur = hover.get();
      const at = cur && cur.side === side ? cur.index : -1;
      const moves = { ArrowDown: 1, ArrowUp: -1, PageDown: 10, PageUp: -10, Home: -1e9, End: 1e9 };
      if (e.key in moves) {
        const i = Math.max(0, Math.min(col.children.length - 1, at + moves[e.key]));
        hover.set({ side: side, index: i });
        col.children[i].scrollIntoView({ block: "nearest" });
      } else if (e.key === "Enter" && at >= 0) {
        hover.pin(side, at);
      } else if (e.key === "Escape") {
        hover.set(null);
        ctx.set({ query: null, queries: null });
      } else return;
      e.preventDefault();
    });
  }

  function layout(panel, ctx) {
    const fixed = ctx.options.fixed;
    panel.append(el("div", { class: "as-controls" }, [
      A.controls.attention(ctx), fixed ? null : A.controls.layer(ctx), A.controls.source(ctx), A.controls.filter(ctx),
      fixed ? null : A.controls.heads(ctx, "multi"), fixed ? null : meanToggle(ctx),
      A.controls.badge(ctx, () => ({ layer: ctx.state.layer, heads: ctx.state.heads })),
    ]));
    panel.append(el("p", { class: "as-hint", text: `Left: ${A.sides(ctx.model).q}, right: ${A.sides(ctx.model).k} ` +
      "(0-indexed). Hover or arrow-key through " +
      "tokens to see only their lines; click or Enter pins a query (shift-click adds more), Esc clears." }));
    panel.append(legend());
    const cols = { q: tokenColumn(ctx.model, "q"), k: tokenColumn(ctx.model, "k") };
    const canvas = el("canvas", { class: "as-lines", "aria-hidden": "true" });
    const body = el("div", { class: "as-head-body" }, [cols.q, canvas, cols.k]);
    const status = el("p", { class: "as-hint as-status", "aria-live": "polite" });
    panel.append(body, status);
    return { cols: cols, canvas: canvas, body: body, status: status };
  }

  // "mean of the selected heads": one set of lines, the heads' mean weights (raw weights only).
  function meanToggle(ctx) {
    const button = el("button", { type: "button", class: "as-link as-mean", title: "draw the mean of the selected " +
      "heads as one map", text: "mean of the selected heads", onclick: () => ctx.set({ meanHeads: !ctx.state.meanHeads }) });
    const sync = () => {
      button.setAttribute("aria-pressed", String(!!ctx.state.meanHeads));
      button.disabled = ctx.source().name !== "weights";
    };
    ctx.subscribe((s, p) => ctx.changed(p, ["meanHeads", "source"]) && sync());
    sync();
    return button;
  }

  // What the lines mean: opacity is the weight, one colour per head, the values on hover.
  function legend() {
    const ramp = el("span", { class: "as-ramp", "aria-hidden": "true" });
    return el("p", { class: "as-hint as-head-legend" }, [el("span", { text: "line opacity = attention weight: 0 " }),
      ramp, el("span", { text: " 1 · one colour per head · hover a token: the other side is shaded by its weights, " +
        "each token's value in its tooltip" })]);
  }

  // Taller rows and wider lines for a short text, so the view uses the page; the row never below MIN_ROW.
  function fit(panel, cols, body, n) {
    const row = Math.max(MIN_ROW, Math.min(MAX_ROW, Math.floor(((window.innerHeight || 900) - 320) / n)));
    body.style.setProperty("--row", `${row}px`);
    const free = (panel.clientWidth || 1200) - cols.q.offsetWidth - cols.k.offsetWidth - 24;
    const width = Math.max(280, Math.min(640, free, row * 18));
    body.style.setProperty("--lines-w", `${width}px`);
    return { row: row, width: width };
  }

  // Hover, click and keys on the token columns: hover shows one token's lines, click or Enter pins a query.
  function listen(ctx, cols, hover) {
    for (const side of ["q", "k"]) {
      const col = cols[side];
      const at = (e) => e.target.closest(".as-tok");
      col.addEventListener("mouseover", (e) => at(e) && hover.set({ side: side, index: Number(at(e).dataset.index) }));
      col.addEventListener("mouseleave", () => hover.set(null));
      col.addEventListener("click", (e) => at(e) && hover.pin(side, Number(at(e).dataset.index), e.shiftKey));
      col.addEventListener("blur", () => hover.set(null));
      keyboard(col, side, ctx, hover);
    }
  }

  // The status line under the lines: how many are drawn of how many, which heads are still loading.
  function report(status, shown, pending) {
    const cut = shown.floor > 0 ? `Showing the ${shown.drawn.toLocaleString("en")} strongest of ` +
      `${shown.total.toLocaleString("en")} lines in view (opacity ≥ ${A.fmt(shown.floor)}; lines below ` +
      `${MIN_ALPHA} are never drawn); hover a token to see all of its lines.` : "";
    const loading = pending.length ? `Loading head${pending.length > 1 ? "s" : ""} ${pending.join(", ")}…` : "";
    status.textContent = [cut, loading].filter(Boolean).join(" ");
    status.dataset.drawn = String(shown.drawn);
    status.dataset.total = String(shown.total);
    status.dataset.pending = String(pending.length);
    status.dataset.partial = String(shown.partial); // "true": the strongest few now, all once idle
  }

  A.views.head = {
    label: "Head",
    render(panel, ctx) {
      const { cols, canvas, body, status } = layout(panel, ctx);
      const n = Math.max(ctx.model.n, A.keys(ctx.model).n); // rows: the longer column (cross: target or source)
      const size = fit(panel, cols, body, n);
      // the part of the token columns in view: the canvas is sticky, so only that band gets lines
      const band = () => ({ top: body.scrollTop, width: size.width, row: size.row,
                            height: Math.min(n * size.row, body.clientHeight || n * size.row) });
      let hovered = null;
      let frame = 0;
      const focus = () => {
        if (hovered) return hovered;
        const qs = A.selectedQueries(ctx.state);
        return qs.length ? { side: "q", index: qs[0], indices: qs.length > 1 ? qs : null } : null;
      };
      const paint = (limit, quick) => {
        const shown = draw(canvas, ctx, focus(), band(), limit || MAX_LINES, quick);
        report(status, shown, pendingHeads(ctx));
        return shown;
      };
      const later = (f) => {
        cancelAnimationFrame(frame);
        frame = requestAnimationFrame(f);
      };
      const redraw = () => later(() => (paint(), shade(cols, ctx, focus())));
      const hover = {
        get: () => hovered,
        set(f) { hovered = f; redraw(); },
        pin(side, i, shift) {
          if (side !== "q") return;
          ctx.set(A.pickQuery(ctx.state, i, shift));
          ctx.emit("attnscope:select", { view: "head", layer: ctx.state.layer, head: ctx.state.heads[0] ?? null,
                                         query: i, key: null, source: ctx.source().name });
        },
      };
      listen(ctx, cols, hover);
      let idle = 0;
      const settle = () => { // every line (up to MAX_LINES) once nothing has changed for IDLE_MS
        clearTimeout(idle);
        idle = setTimeout(() => later(() => paint()), IDLE_MS);
      };
      // a new map (layer, heads, source, filter, a head arriving): a long text gets its strongest lines at once,
      // all of them when idle (software rasters take ~30 ms per 1,000 long lines)
      const now = () => {
        cancelAnimationFrame(frame);
        if (paint(MAX_LINES, true).partial) settle();
        shade(cols, ctx, focus());
      };
      ctx.subscribe((s, p) => ctx.changed(p, ["layer", "heads", "source", "filter", "query", "queries", "theme",
                                              "meanHeads"]) && now());
      body.addEventListener("scroll", () => {
        later(() => paint(SCROLL_LINES)); // few while moving
        settle();
      }, { passive: true });
      let seen = ""; // the body's size last drawn at: the observer's first call (same size) draws nothing again
      const resize = new ResizeObserver(() => {
        const wh = `${body.clientWidth}x${body.clientHeight}`;
        if (wh !== seen) redraw();
        seen = wh;
      });
      resize.observe(body);
      let burst = 0; // a layer's heads arrive in a burst: drawn together once none came for ARRIVALS_MS
      const arrived = ctx.model.onMap ? ctx.model.onMap(() => {
        clearTimeout(burst);
        if (status.dataset.pending === "0") return;
        burst = setTimeout(() => later(now), pendingHeads(ctx).length ? ARRIVALS_MS : 0); // the last: at once
      }) : () => null;
      ctx.onDispose(() => (cancelAnimationFrame(frame), clearTimeout(idle), clearTimeout(burst), resize.disconnect(),
                           arrived()));
      now();
      seen = `${body.clientWidth}x${body.clientHeight}`;
    },
  };
})();
