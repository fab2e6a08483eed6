/* attnscope translation: an encoder-decoder model writing its target (attnscope.views.translation).
   window.attnscope.renderTranslation(element, data) draws a payload: the source tokens shaded by the current
   step's cross-attention (its alignment: one head of a layer, or the mean over its heads), the target written
   so far with the step's new token outlined, and the alignment matrix of every step (rows: steps, columns:
   source tokens). Steps, layers, heads and tokens are 0-indexed. All text goes in as text (A.el). */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const el = (...a) => A.el(...a);

  function rows(b64, levels) {
    const bin = atob(b64);
    const out = new Float32Array(bin.length / 2);
    for (let i = 0; i < out.length; i++) out[i] = (bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8)) / levels;
    return out;
  }

  // One step's alignment over the source: [layer, head, source] -> one head's row, or the mean over heads.
  function align(w, model, n, layer, head) {
    const heads = head === "mean" ? [...Array(model.heads).keys()] : [Number(head)];
    const out = new Float32Array(n);
    for (const h of heads) for (let j = 0; j < n; j++) out[j] += w[(layer * model.heads + h) * n + j] / heads.length;
    return out;
  }

  // Absolute, not relative to the row's maximum: a near-uniform row stays pale (1/n each), a peak stands out.
  function shade(v) {
    return `rgba(8, 81, 156, ${(0.04 + 0.9 * Math.min(1, Math.max(0, v))).toFixed(3)})`;
  }

  function options(count, extra) {
    return [...(extra || []), ...Array.from({ length: count }, (_, i) => ({ value: String(i), label: String(i) }))]
      .map((o) => el("option", { value: o.value, text: o.label }));
  }

  A.renderTranslation = function (element, data) {
    const model = data.model;
    const source = data.source_tokens;
    const n = source.length;
    const steps = data.steps.map((s) => Object.assign({}, s, { w: rows(s.alignment, data.levels) }));
    const state = { step: Math.max(0, steps.length - 1), layer: model.layers - 1, head: "mean", timer: null };
    const play = el("button", { type: "button", text: "▶ play" });
    const slider = el("input", { type: "range", min: "0", max: String(Math.max(0, steps.length - 1)), value: "0",
      class: "as-tr-slider", "aria-label": "step (0-indexed)" });
    const label = el("span", { class: "as-tr-label" });
    const layerSel = el("select", { "aria-label": "layer (0-indexed)" }, options(model.layers));
    const headSel = el("select", { "aria-label": "head (0-indexed)" },
      options(model.heads, [{ value: "mean", label: "mean over heads" }]));
    layerSel.value = String(state.layer);
    const sourceBox = el("div", { class: "as-tr-text as-tr-source" });
    const targetBox = el("div", { class: "as-tr-text as-tr-target" });
    const grid = el("div", { class: "as-tr-matrix" });
    const verdict = `check: ${data.status} (encoder ${data.statuses.encoder}, decoder ${data.statuses.decoder}, ` +
      `cross ${data.statuses.cross}; every step's rows from the model's own generate loop compared with the ` +
      "recomputed trace)";
    element.replaceChildren(el("div", { class: "as-tr" }, [
      el("h2", { text: data.title }), el("p", { class: "as-tr-note as-tr-badge", text: verdict }),
      el("div", { class: "as-tr-controls" }, [play, slider, label, el("span", { text: "layer" }), layerSel,
        el("span", { text: "head" }), headSel]),
      el("h3", { text: "source: shaded by the step's cross-attention, the alignment (darker: more weight, 0 to 1)" }), sourceBox,
      el("h3", { text: "target, step by step (the step's new token outlined)" }), targetBox,
      el("h3", { text: "alignment of every step (rows: steps, columns: source tokens)" }), grid]));

    // A step's token as the page shows it: the tokenizer's decoding of its piece (as spelled with raw_tokens; a
    // payload without "shown", as spelled), a newline as a visible mark.
    const shown = (t) => A.oneLine(t.shown ?? t.token);

    function draw() {
      if (!steps.length) { label.textContent = "no steps"; return; }
      const s = steps[state.step];
      label.textContent = `step ${s.step} of ${steps.length - 1} (0-indexed): ${JSON.stringify(s.shown ?? s.token)} ` +
        `p = ${s.probability.toExponential(2)}`;
      const r = align(s.w, model, n, state.layer, state.head);
      sourceBox.replaceChildren(...source.map((t, j) => el("span", { class: "as-tr-tok", "data-weight": r[j],
        style: `background: ${shade(r[j])}`, title: `source ${j} (${t}): weight ${A.fmt(r[j])}`, text: A.oneLine(t) })));
      targetBox.replaceChildren(...steps.slice(0, state.step + 1).map((t) => el("span", {
        class: `as-tr-tok${t.step === s.step ? " as-tr-new" : ""}`, title: `step ${t.step}: p = ${t.probability}`,
        "data-token": t.token, text: shown(t) })));
      drawGrid();
    }

    function drawGrid() {
      const head = el("tr", {}, [el("th", { text: "" }), ...source.map((t, j) => el("th", { title: `source ${j}`,
        text: String(j) }))]);
      const body = steps.map((s) => {
        const r = align(s.w, model, n, state.layer, state.head);
        return el("tr", { class: s.step === state.step ? "as-tr-current" : "" }, [
          el("th", { text: `${s.step}: ${shown(s)}` }),
          ...Array.from(r, (v, j) => el("td", { style: `background: ${shade(v)}`,
            title: `step ${s.step} (${shown(s)}) -> source ${j} (${A.oneLine(source[j])}): ${A.fmt(v)}` }))]);
      });
      grid.replaceChildren(el("table", { class: "as-tr-grid" }, [head, ...body]));
    }

    const { setStep } = A.stepPlayer(state, steps, slider, play, draw);
    layerSel.addEventListener("change", () => { state.layer = Number(layerSel.value); draw(); });
    headSel.addEventListener("change", () => { state.head = headSel.value; draw(); });
    setStep(state.step);
    element.dataset.attnscopeReady = "1";
    return { setStep: setStep, state: state };
  };

  A.bootTranslation = function () {
    const root = document.getElementById("attnscope-translation-root");
    const data = JSON.parse(document.getElementById("attnscope-translation").textContent);
    A.translation = A.renderTranslation(root, data);
  };
})();
