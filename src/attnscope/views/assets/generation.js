/* attnscope generation: a decoder writing one token at a time (attnscope.views.generation).
   window.attnscope.renderGeneration(element, data) draws a payload and returns {addStep, setStep, play};
   steps can be added while they are generated (the web app streams them). Step s writes the token at
   position prompt_length + s; its query is the last token so far, attending over every earlier position.
   Layers, heads, steps and positions are 0-indexed. All text goes in as text (A.el), never as markup. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const el = (...a) => A.el(...a);
  const LEVELS = 65535;

  function rows(b64) {
    if (!b64) return null;
    const bin = atob(b64);
    const out = new Float32Array(bin.length / 2);
    for (let i = 0; i < out.length; i++) out[i] = (bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8)) / LEVELS;
    return out;
  }

  function decodeStep(s) {
    return Object.assign({}, s, { w: rows(s.weights), r: rows(s.rollout) });
  }

  // The step's query row over keys 0..keys-1: one head, the mean over heads, or the layer's rollout.
  function row(s, model, layer, head, source) {
    const n = s.keys;
    if (!s.w) return null;
    if (source === "rollout") return s.r ? s.r.subarray(layer * n, (layer + 1) * n) : null;
    const H = model.heads;
    const out = new Float32Array(n);
    const heads = head === "mean" ? [...Array(H).keys()] : [Number(head)];
    for (const h of heads) for (let j = 0; j < n; j++) out[j] += s.w[(layer * H + h) * n + j] / heads.length;
    return out;
  }

  function shade(v, top) {
    const t = top > 0 ? Math.min(1, v / top) : 0;
    return `rgba(8, 81, 156, ${(0.08 + 0.8 * t).toFixed(3)})`;
  }

  function options(count, extra) {
    return [...(extra || []), ...Array.from({ length: count }, (_, i) => ({ value: String(i), label: String(i) }))]
      .map((o) => el("option", { value: o.value, text: o.label }));
  }

  A.renderGeneration = function (element, data) {
    const model = data.model;
    const steps = (data.steps || []).map(decodeStep);
    const init = data.initial || {}; // the step, layer, head ("mean" or 0-indexed) and source shown first
    const state = { step: 0, layer: init.layer ?? model.layers - 1, head: String(init.head ?? "mean"),
                    source: init.source || "weights", timer: null };
    const play = el("button", { type: "button", class: "as-gen-play", text: "▶ play" });
    const slider = el("input", { type: "range", min: "0", max: "0", value: "0", class: "as-gen-slider",
      "aria-label": "step (0-indexed)" });
    const label = el("span", { class: "as-gen-label" });
    const layerSel = el("select", { "aria-label": "layer (0-indexed)" }, options(model.layers));
    const headSel = el("select", { "aria-label": "head (0-indexed)" },
      options(model.heads, [{ value: "mean", label: "mean over heads" }]));
    const sourceSel = el("select", { "aria-label": "source" }, [
      el("option", { value: "weights", text: "attention weights" }),
      el("option", { value: "rollout", text: "attention rollout" })]);
    layerSel.value = String(state.layer);
    headSel.value = state.head;
    sourceSel.value = state.source;
    const text = el("div", { class: "as-gen-text" });
    const bars = el("div", { class: "as-gen-bars" });
    const grid = el("div", { class: "as-gen-heads" });
    const check = data.check || {};
    const failed = check.ok === false && !(check.unsupported && !check.max_error); // drawn in the views' red
    const badge = el("p", { class: `as-gen-note${failed ? " as-gen-fail" : ""}`, text: check.unsupported && !check.max_error ? `not verified: ${check.unsupported}`
      : `${check.ok ? "verified" : "CHECK FAILED"}: every step recomputed with its KV cache and every row against a ` +
        `no-cache forward pass, max error ${A.fmtError(check.max_error || 0)} (tolerance ${A.fmtError(check.tolerance || 1e-5)})` });
    element.replaceChildren(el("div", { class: "as-gen" }, [
      el("h2", { text: data.title }), badge,
      el("div", { class: "as-gen-controls" }, [play, slider, label,
        el("label", { text: "layer " }, [layerSel]), el("label", { text: " head " }, [headSel]),
        el("label", { text: " source " }, [sourceSel]), ...exportButtons()]),
      text, el("div", { class: "as-gen-row" }, [bars, grid])]));

    // The step shown as a standalone SVG (assets/export.js), with its model, step, layer, head and badge as caption.
    function figure(options) {
      const s = steps[Math.min(state.step, steps.length - 1)];
      const who = state.source === "rollout" ? `attention rollout, layer ${state.layer}`
        : `layer ${state.layer} · ${state.head === "mean" ? "mean over heads" : `head ${state.head}`}`;
      return A.generationSVG({
        tokens: Array.from({ length: s.position + 1 }, (_, i) => shownAt(i)), row: row(s, model, state.layer,
          state.head, state.source), query: s.keys - 1, step: s.step, token: shown(s),
        alternatives: s.alternatives.map((a) => Object.assign({}, a, { token: shown(a) })),
        caption: [`${model.name || "model"} · generation view · step ${s.step} writes position ${s.position} · ${who}` +
          " · 0-indexed", badge.textContent, `shade: the attention of position ${s.keys - 1} (the step's query) to ` +
          `each earlier token · ${s.keys} tokens`],
      }, options);
    }

    function exportButtons() {
      if (!A.svgButton) return [];
      const name = (ext) => () => `attnscope-generation-step${state.step}-layer${state.layer}-head${state.head}.${ext}`;
      return [A.svgButton(figure, name("svg")), A.pngButton(figure, name("png"))];
    }

    function tokenAt(i) {
      if (i < data.prompt_length) return data.prompt_tokens[i];
      const s = steps[i - data.prompt_length];
      return s ? s.token : "";
    }

    // A step's token or an alternative as the page shows it: the tokenizer's decoding of the piece (as spelled when
    // the page was made with raw_tokens; a payload without "shown", as spelled).
    const shown = (t) => t.shown ?? t.token;

    // The token at position i as it is shown: the prompt's from prompt_shown, a step's as above.
    function shownAt(i) {
      if (i < data.prompt_length) return (data.prompt_shown || data.prompt_tokens)[i];
      const s = steps[i - data.prompt_length];
      return s ? shown(s) : "";
    }

    function drawText(s, r) {
      const spans = [];
      const top = r ? Math.max(...r) : 0;
      for (let i = 0; i <= s.position; i++) {
        const writing = i === s.position;
        const w = r && i < s.keys ? r[i] : null;
        spans.push(el("span", {
          class: `as-gen-tok${i < data.prompt_length ? " as-gen-prompt" : ""}${writing ? " as-gen-new" : ""}` +
            `${i === s.keys - 1 ? " as-gen-query" : ""}`,
          style: w === null ? null : `background:${shade(w, top)};color:${w / (top || 1) > 0.55 ? "#fff" : "#111"}`,
          title: writing ? `step ${s.step} writes position ${i}` : `position ${i}: weight ${w === null ? "-" : A.fmt(w)}`,
          "data-position": i, "data-token": tokenAt(i), text: A.oneLine(shownAt(i)),
        }));
      }
      text.replaceChildren(...spans);
    }

    function drawBars(s) {
      const top = Math.max(...s.alternatives.map((a) => a.probability), 1e-12);
      bars.replaceChildren(el("h3", { text: `step ${s.step}: top alternatives` }), ...s.alternatives.map((a) =>
        el("div", { class: `as-gen-bar${a.token === s.token ? " as-gen-chosen" : ""}` }, [
          el("span", { class: "as-gen-bar-label", title: a.token, text: A.oneLine(shown(a)) }),
          el("span", { class: "as-gen-bar-fill", style: `width:${(100 * a.probability / top).toFixed(1)}%` }),
          el("span", { class: "as-gen-bar-value", text: a.probability.toFixed(4) })])));
    }

    // Each head's row for the layer shown: rows heads, columns key positions, both labelled and 0-indexed.
    function drawHeads(s) {
      const H = model.heads;
      const n = s.keys;
      const head = el("tr", {}, [el("th", { class: "as-gen-corner", scope: "col", text: "head \\ key" }),
        ...Array.from({ length: n }, (_, j) => el("th", { scope: "col", title: `key ${j}: ${A.oneLine(shownAt(j))}`,
          text: String(j) }))]);
      const cells = [];
      for (let h = 0; h < H; h++) {
        const r = row(s, model, state.layer, String(h), "weights");
        const top = r ? Math.max(...r) : 0;
        cells.push(el("tr", {}, [el("th", { scope: "row", title: `head ${h}`, text: String(h) }),
          ...Array.from({ length: n }, (_, j) => el("td", { style: r ? `background:${shade(r[j], top)}` : null,
            title: `head ${h}, key ${j} (${A.oneLine(shownAt(j))}): ${r ? A.fmt(r[j]) : "-"}` }))]));
      }
      grid.replaceChildren(el("h3", { text: `layer ${state.layer}: each head's attention from position ${n - 1} ` +
        `(rows: heads 0-${H - 1}, columns: key positions 0-${n - 1}; 0-indexed)` }),
        el("table", { class: "as-gen-grid" }, [el("thead", {}, [head]), el("tbody", {}, cells)]));
    }

    function draw() {
      if (!steps.length) {
        label.textContent = "no steps yet";
        return;
      }
      const s = steps[Math.min(state.step, steps.length - 1)];
      label.textContent = `step ${s.step} of ${steps.length - 1} (0-indexed): ${JSON.stringify(shown(s))} ` +
        `p = ${s.probability.toFixed(4)}`;
      const r = row(s, model, state.layer, state.head, state.source);
      drawText(s, r);
      drawBars(s);
      if (s.w) drawHeads(s);
    }

    const { setStep, stop, start } = A.stepPlayer(state, steps, slider, play, draw);
    layerSel.addEventListener("change", () => { state.layer = Number(layerSel.value); draw(); });
    headSel.addEventListener("change", () => { state.head = headSel.value; draw(); });
    sourceSel.addEventListener("change", () => { state.source = sourceSel.value; draw(); });

    function addStep(s) {
      const at = steps.findIndex((t) => t.step === s.step);
      if (at >= 0) steps[at] = decodeStep(s); else steps.push(decodeStep(s));
      slider.max = String(steps.length - 1);
      if (!state.timer) setStep(steps.length - 1);
    }

    slider.max = String(Math.max(0, steps.length - 1));
    setStep(init.step ?? steps.length - 1);
    element.attnscopeFigure = figure; // what attnscope.figureSVG(element) returns: the step shown, as a figure
    element.dataset.attnscopeReady = "1";
    return { addStep: addStep, setStep: setStep, play: start, pause: stop, state: state };
  };

  A.bootGeneration = function () {
    const root = document.getElementById("attnscope-generation-root");
    const data = JSON.parse(document.getElementById("attnscope-generation").textContent);
    A.generation = A.renderGeneration(root, data);
  };
})();
