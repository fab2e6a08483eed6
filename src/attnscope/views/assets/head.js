/* attnscope views: the head view. Queries on the left, keys on the right, one line per (query, key)
   with opacity by weight, one colour per head; drawn on a canvas so 512 tokens stay responsive. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const el = (...a) => A.el(...a);
  const ROW = 20; // px per token row
  const BUCKETS = 16; // opacity levels: one canvas path per head and level
  const MIN_ALPHA = 0.01; // lines fainter than this are not drawn unless a token is focused
  A.views = A.views || {};

  function tokenColumn(model, side) {
    const col = el("div", { class: `as-tokens as-${side}`, tabindex: "0", role: "listbox",
                            "aria-label": side === "q" ? "query tokens (from)" : "key tokens (to)" });
    model.tokens.forEach((t, i) => {
      const cls = ["as-tok", model.special[i] ? "as-special" : "", model.segments[i] > 0 ? "as-seg-b" : ""];
      col.append(el("div", { class: cls.join(" "), "data-index": String(i), role: "option", title: A.tokenLabel(model, i),
                             text: t }));
    });
    return col;
  }

  // The lines of one head that cross the visible band [top, top + height), bucketed by opacity into paths.
  // Only that band is drawn (the canvas stays on screen while the tokens scroll), so 512 tokens stay cheap.
  function headPaths(model, src, layer, head, focus, filter, band) {
    const n = model.n;
    const codes = src.codes(layer, head);
    const perCode = src.scale(layer, head) / 255 / src.top(layer, head); // opacity of one code step
    const minCode = focus ? 1 : Math.max(1, Math.ceil(MIN_ALPHA / (perCode || 1)));
    const paths = Array.from({ length: BUCKETS }, () => new Path2D());
    const y = (i) => i * ROW + ROW / 2 - band.top;
    const qs = focus && focus.side === "q" ? [focus.index] : [...Array(n).keys()];
    for (const q of qs) {
      const yq = y(q);
      const k0 = focus && focus.side === "k" ? focus.index : 0;
      const k1 = focus && focus.side === "k" ? focus.index + 1 : n;
      for (let k = k0; k < k1; k++) {
        const c = codes[q * n + k];
        if (c < minCode) continue;
        const yk = y(k);
        if ((yq < 0 && yk < 0) || (yq > band.height && yk > band.height) || !A.passes(model, filter, q, k)) continue;
        const b = Math.min(BUCKETS - 1, Math.floor(Math.min(1, c * perCode) * BUCKETS));
        paths[b].moveTo(0, yq);
        paths[b].lineTo(band.width, yk);
      }
    }
    return paths;
  }

  function drawnHeads(ctx) {
    const src = ctx.source();
    return src.perHead ? ctx.state.heads.filter((h) => ctx.model.heads.includes(h)) : [null];
  }

  function draw(canvas, ctx, focus, band) {
    const g = A.sizeCanvas(canvas, band.width, band.height);
    const src = ctx.source();
    const layer = src.perLayer ? ctx.state.layer : null;
    const count = ctx.model.payload.model.heads || ctx.model.heads.length;
    g.lineWidth = 1.5;
    for (const head of drawnHeads(ctx)) {
      const paths = headPaths(ctx.model, src, layer, head, focus, ctx.state.filter, band);
      g.strokeStyle = A.headColour(head, count);
      paths.forEach((p, b) => {
        g.globalAlpha = (b + 0.5) / BUCKETS;
        g.stroke(p);
      });
    }
    g.globalAlpha = 1;
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
    const src = ctx.source();
    const layer = src.perLayer ? ctx.state.layer : null;
    const heads = drawnHeads(ctx);
    cols[focus.side].children[focus.index].classList.add("as-focus");
    const other = cols[focus.side === "q" ? "k" : "q"].children;
    for (let j = 0; j < ctx.model.n; j++) {
      const [q, k] = focus.side === "q" ? [focus.index, j] : [j, focus.index];
      let sum = 0;
      for (const h of heads) sum += src.value(layer, h, q, k) / src.top(layer, h);
      if (heads.length) other[j].style.setProperty("--w", String(Math.min(1, sum / heads.length)));
    }
  }

  function keyboard(col, side, ctx, hover) {
    col.addEventListener("keydown", (e) => {
      const cur = hover.get();
      const at = cur && cur.side === side ? cur.index : -1;
      const moves = { ArrowDown: 1, ArrowUp: -1, PageDown: 10, PageUp: -10, Home: -1e9, End: 1e9 };
      if (e.key in moves) {
        const i = Math.max(0, Math.min(ctx.model.n - 1, at + moves[e.key]));
        hover.set({ side: side, index: i });
        col.children[i].scrollIntoView({ block: "nearest" });
      } else if (e.key === "Enter" && at >= 0) {
        hover.pin(side, at);
      } else if (e.key === "Escape") {
        hover.set(null);
        ctx.set({ query: null });
      } else return;
      e.preventDefault();
    });
  }

  A.views.head = {
    label: "Head",
    render(panel, ctx) {
      const model = ctx.model;
      const fixed = ctx.options.fixed;
      panel.append(el("div", { class: "as-controls" }, [
        fixed ? null : A.controls.layer(ctx), A.controls.source(ctx), A.controls.filter(ctx),
        fixed ? null : A.controls.heads(ctx, "multi"),
        A.controls.badge(ctx, () => ({ layer: ctx.state.layer, heads: ctx.state.heads })),
      ]));
      panel.append(el("p", { class: "as-hint", text: "Left: queries, right: keys (0-indexed). Hover or arrow-key through " +
        "tokens to see only their lines; click or Enter pins a query, Esc clears." }));
      const width = 280;
      const cols = { q: tokenColumn(model, "q"), k: tokenColumn(model, "k") };
      const canvas = el("canvas", { class: "as-lines", "aria-hidden": "true" });
      const body = el("div", { class: "as-head-body" }, [cols.q, canvas, cols.k]);
      panel.append(body);
      // the part of the token columns in view: the canvas is sticky, so only that band gets lines
      const band = () => ({ top: body.scrollTop, width: width,
                            height: Math.min(model.n * ROW, body.clientHeight || model.n * ROW) });

      let hovered = null;
      let frame = 0;
      const focus = () => hovered || (ctx.state.query !== null && ctx.state.query !== undefined
        ? { side: "q", index: ctx.state.query } : null);
      const redraw = () => {
        cancelAnimationFrame(frame);
        frame = requestAnimationFrame(() => {
          draw(canvas, ctx, focus(), band());
          shade(cols, ctx, focus());
        });
      };
      const hover = {
        get: () => hovered,
        set(f) { hovered = f; redraw(); },
        pin(side, i) {
          if (side !== "q") return;
          ctx.set({ query: i });
          ctx.emit("attnscope:select", { view: "head", layer: ctx.state.layer, head: ctx.state.heads[0] ?? null,
                                         query: i, key: null, source: ctx.source().name });
        },
      };
      for (const side of ["q", "k"]) {
        const col = cols[side];
        col.addEventListener("mouseover", (e) => {
          const t = e.target.closest(".as-tok");
          if (t) hover.set({ side: side, index: Number(t.dataset.index) });
        });
        col.addEventListener("mouseleave", () => hover.set(null));
        col.addEventListener("click", (e) => {
          const t = e.target.closest(".as-tok");
          if (t) hover.pin(side, Number(t.dataset.index));
        });
        col.addEventListener("blur", () => hover.set(null));
        keyboard(col, side, ctx, hover);
      }
      ctx.subscribe((s, p) => ctx.changed(p, ["layer", "heads", "source", "filter", "query", "theme"]) && redraw());
      body.addEventListener("scroll", () => {
        cancelAnimationFrame(frame);
        frame = requestAnimationFrame(() => draw(canvas, ctx, focus(), band()));
      }, { passive: true });
      const resize = new ResizeObserver(redraw);
      resize.observe(body);
      ctx.onDispose(() => {
        cancelAnimationFrame(frame);
        resize.disconnect();
      });
      draw(canvas, ctx, focus(), band());
      shade(cols, ctx, focus());
    },
  };
})();
