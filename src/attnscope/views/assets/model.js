/* attnscope views: the model view. Every layer x head as a thumbnail heatmap (max-pooled so a sharp
   attention peak stays visible at 512 tokens); clicking one opens it large as a matrix or head view. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const el = (...a) => A.el(...a);
  A.views = A.views || {};
  const SIZES = { fit: null, small: 56, medium: 84, large: 128 }; // fit: every head across the pane's width
  const FIT = { min: 24, max: 128, label: 64, gap: 10 }; // px: the row label column; a cell's border, pad and gap

  // "fit": the largest thumbnail with which every head's column fits the holder's width (small when not laid out)
  function fitSize(holder, nHeads) {
    const width = holder.clientWidth;
    if (!width) return SIZES.small;
    const px = Math.floor((width - FIT.label) / nHeads) - FIT.gap;
    return Math.max(FIT.min, Math.min(FIT.max, px));
  }

  // The codes a thumbnail pools: the map, or for a lazy map not fetched its overview (at most 64 x 64, each the
  // max of its block: already max-pooled), never the overview scaled up to n x n first.
  function thumbCodes(src, layer, head) {
    if (src.lazy && !src.loaded(layer, head)) {
      const o = src.overview(layer, head);
      return { nq: o.rows, nk: o.cols, codes: o.codes };
    }
    return { nq: src.nq, nk: src.nk, codes: src.codes(layer, head) };
  }

  // nq x nk codes -> rq x rk image, each pixel the max of its block, coloured through the theme's table.
  function thumbImage(ctx, src, layer, head, cells, rq, rk) {
    const { nq, nk, codes } = cells;
    const pooled = new Uint8Array(rq * rk);
    const binQ = Array.from({ length: nq }, (_, i) => Math.floor((i * rq) / nq));
    const binK = Array.from({ length: nk }, (_, i) => Math.floor((i * rk) / nk));
    for (let q = 0; q < nq; q++) {
      const row = binQ[q] * rk;
      for (let k = 0; k < nk; k++) {
        const c = codes[q * nk + k];
        if (c > pooled[row + binK[k]]) pooled[row + binK[k]] = c;
      }
    }
    const toLut = src.scale(layer, head) / A.top(ctx, src, layer, head);
    const colours = new Uint32Array(A.lut(ctx.theme()).buffer);
    const img = new ImageData(rk, rq);
    const pixels = new Uint32Array(img.data.buffer);
    for (let i = 0; i < rq * rk; i++) pixels[i] = colours[Math.min(255, Math.round(pooled[i] * toLut))];
    return img;
  }

  // A thumbnail px wide; a cross-attention map (target x source) keeps its aspect: px tall for the longer side.
  function thumb(ctx, src, layer, head, px, open) {
    const longest = Math.max(src.nq, src.nk);
    const [hq, wk] = [Math.max(4, Math.round((px * src.nq) / longest)), Math.max(4, Math.round((px * src.nk) / longest))];
    const dpr = Math.min(2, window.devicePixelRatio || 1);
    const cells = thumbCodes(src, layer, head);
    const [rq, rk] = [Math.min(cells.nq, Math.ceil(hq * dpr)), Math.min(cells.nk, Math.ceil(wk * dpr))];
    const canvas = el("canvas", { width: String(rk), height: String(rq) });
    canvas.style.width = `${wk}px`;
    canvas.style.height = `${hq}px`;
    canvas.getContext("2d").putImageData(thumbImage(ctx, src, layer, head, cells, rq, rk), 0, 0);
    const name = [layer === null ? "" : `layer ${layer}`, head === null ? "" : `head ${head}`].filter(Boolean).join(", ");
    return el("button", { type: "button", class: "as-thumb", "data-layer": layer === null ? null : String(layer),
                          "data-head": head === null ? null : String(head), title: `${name || src.label}: open large`,
                          "aria-label": `${name || src.label}, open large`, onclick: () => open(layer, head) }, [canvas]);
  }

  function grid(ctx, px, open) {
    const src = ctx.source();
    const layers = src.perLayer ? ctx.model.layers : [null];
    const heads = src.perHead ? ctx.model.heads : [null];
    const box = el("div", { class: "as-grid", role: "group", "aria-label": `${src.label}: layers by heads` });
    box.style.gridTemplateColumns = `max-content repeat(${heads.length}, ${px + 6}px)`;
    box.append(el("span"), ...heads.map((h) => el("span", { class: "as-axis", text: h === null ? "" : `head ${h}` })));
    for (const layer of layers) {
      box.append(el("span", { class: "as-axis as-row", text: layer === null ? "" : `layer ${layer}` }));
      for (const head of heads) box.append(thumb(ctx, src, layer, head, px, open));
    }
    return box;
  }

  // The large view in a modal dialog, with its own copy of the state so the page stays as it was.
  function openDialog(ctx, layer, head) {
    const src = ctx.source();
    const store = A.store(Object.assign({}, ctx.state, {
      layer: layer ?? ctx.state.layer, head: head ?? ctx.state.head, heads: head === null ? ctx.state.heads : [head],
    }));
    const sub = A.context(ctx.root, ctx.model, store, { fixed: true });
    const body = el("div", { class: "as-dialog-body" });
    const title = [layer === null ? null : `layer ${layer}`, head === null ? null : `head ${head}`, src.label]
      .filter(Boolean).join(" · ");
    const dialog = el("dialog", { class: "as-dialog", "aria-label": title });
    let inner = null;
    const show = (name) => {
      if (inner) inner.dispose();
      inner = sub.scoped({ fixed: true });
      body.replaceChildren();
      for (const b of dialog.querySelectorAll("[data-show]")) b.setAttribute("aria-pressed", String(b.dataset.show === name));
      A.views[name].render(body, inner);
    };
    const tools = [el("strong", { text: title }),
      ...["matrix", "head"].map((v) => el("button", { type: "button", class: "as-tab-button", "data-show": v,
                                                      text: A.views[v].label, onclick: () => show(v) }))];
    if (ctx.options.openView && ctx.model.payload.neuron.available && head !== null) {
      tools.push(el("button", { type: "button", class: "as-link", text: "neuron view →", onclick: () => {
        dialog.close();
        ctx.set({ layer: layer, head: head });
        ctx.options.openView("neuron");
      } }));
    }
    tools.push(el("button", { type: "button", class: "as-close", "aria-label": "close", text: "×",
                              onclick: () => dialog.close() }));
    dialog.append(el("div", { class: "as-dialog-head" }, tools), body);
    (ctx.root.querySelector(".as-app") || ctx.root).append(dialog);
    dialog.addEventListener("close", () => {
      if (inner) inner.dispose();
      dialog.remove();
    });
    dialog.showModal();
    show("matrix");
    return dialog;
  }

  A.views.model = {
    label: "Model",
    render(panel, ctx) {
      const sizeSelect = el("select", { "aria-label": "thumbnail size" });
      for (const s of Object.keys(SIZES)) sizeSelect.append(el("option", { value: s, text: s }));
      sizeSelect.value = "fit";
      const holder = el("div", { class: "as-grid-holder" });
      panel.append(el("div", { class: "as-controls" }, [
        A.controls.attention(ctx), A.controls.source(ctx), A.controls.scale(ctx), el("label", { class: "as-control" }, [el("span", { text: "size" }), sizeSelect]),
      ]));
      const cross = ctx.model.payload.attention === "cross" ? " Cross-attention: rows are the target (decoder) " +
        "tokens, columns the source (encoder) tokens." : "";
      panel.append(el("p", { class: "as-hint", text: "Each thumbnail is one head's query x key map (0-indexed; the max " +
        "over each block of cells). Click or press Enter on one to open it large." + cross }), holder);
      const heads = () => (ctx.source().perHead ? ctx.model.heads.length : 1);
      const px = () => SIZES[sizeSelect.value] || fitSize(holder, heads());
      let drawn = 0;
      const draw = () => {
        drawn = px();
        holder.replaceChildren(grid(ctx, drawn, (l, h) => openDialog(ctx, l, h)));
      };
      sizeSelect.addEventListener("change", draw);
      if (window.ResizeObserver) {  // the pane's width changes (window, layout): fit again when the size would
        new ResizeObserver(() => sizeSelect.value === "fit" && px() !== drawn && draw()).observe(holder);
      }
      ctx.subscribe((s, p) => ctx.changed(p, ["source", "theme", "scale"]) && draw());
      draw();
    },
  };
})();
