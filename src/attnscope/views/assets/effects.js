/* attnscope effects: the layer x head grid of an intervention as a heatmap (rows: layers, columns: heads,
   0-indexed). window.attnscope.renderEffects(element, data, onPick) draws it; bootEffects() draws the page's
   own #attnscope-effects payload and, when the page carries a trace (#attnscope-data), the attention views
   below it: a click on a cell opens that head there. null values (NaN) show as "NaN", never as 0. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const el = (...a) => A.el(...a);

  function maxAbs(values) {
    let top = 0;
    for (const row of values) for (const v of row) if (v !== null) top = Math.max(top, Math.abs(v));
    return top;
  }

  function fmt(v) {
    return v === null ? "NaN" : (v >= 0 ? "+" : "") + v.toFixed(Math.abs(v) >= 100 ? 1 : 4);
  }

  function gridTable(grid, onPick) {
    const top = maxAbs(grid.values);
    const nHeads = grid.values.length ? grid.values[0].length : 0;
    const head = el("tr", {}, [el("th", { text: "layer \\ head" }),
      ...Array.from({ length: nHeads }, (_, h) => el("th", { scope: "col", text: String(h) }))]);
    const rows = grid.values.map((row, layer) => el("tr", {}, [el("th", { scope: "row", text: String(layer) }),
      ...row.map((v, h) => el("td", {}, [el("button", {
        type: "button", class: "as-fx-cell", "data-layer": layer, "data-head": h,
        style: v === null ? "background:repeating-linear-gradient(45deg,#bbb 0 3px,#eee 3px 6px)"
          : `background:${A.diverging(v, top, "light")}`,
        title: `layer ${layer}, head ${h} (0-indexed): ${fmt(v)}`, "aria-label": `layer ${layer} head ${h} ${fmt(v)}`,
        text: fmt(v), onclick: () => onPick(layer, h),
      })])),
    ]));
    return el("table", { class: "as-fx-grid" }, [el("thead", {}, [head]), el("tbody", {}, rows)]);
  }

  A.renderEffects = function (element, data, onPick) {
    const pick = onPick || (() => {});
    const blocks = data.grids.map((g) => el("section", { class: "as-fx-block" }, [
      el("h3", { text: `${g.label} (${g.name})` }), gridTable(g, pick)]));
    element.replaceChildren(el("div", { class: "as-fx" }, [
      el("h2", { text: data.title }, [A.svgButton ? A.svgButton(() => A.effectsSVG(data), "attnscope-effects.svg") : null]),
      el("p", { class: "as-fx-note", text: "rows: layers, columns: heads, all 0-indexed; blue below zero, orange " +
        "above; click a cell to open that head in the views below" }),
      ...blocks]));
    element.attnscopeFigure = (options) => A.effectsSVG(data, options); // what attnscope.figureSVG(element) returns
    element.dataset.attnscopeReady = "1";
  };

  A.bootEffects = function () {
    const root = document.getElementById("attnscope-effects-root");
    const data = JSON.parse(document.getElementById("attnscope-effects").textContent);
    const trace = document.getElementById("attnscope-data");
    let views = null;
    const pick = async (layer, head) => {
      if (!views) return;
      const ctrl = await views;
      ctrl.set({ layer: layer, head: head, heads: [head] });
      if (ctrl.show) await ctrl.show("head");
      A.emit(root, "attnscope:select", { view: "effects", layer: layer, head: head, query: null, key: null });
      document.getElementById("attnscope-root").scrollIntoView({ behavior: "smooth" });
    };
    A.renderEffects(root, data, pick);
    if (trace) views = A.render(document.getElementById("attnscope-root"), JSON.parse(trace.textContent));
  };
})();
