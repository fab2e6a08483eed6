/* attnscope attribution: which input tokens carry a prediction, per method (views/attribution.py's payload).
   window.attnscope.renderAttribution(element, data) draws one row of tokens per method (per target), each method's
   check badge and unit beside its row, colours on a per-method or a shared scale (a toggle: signed scores blue below
   0 and orange above, unsigned white to blue from 0), a table of a clicked token's score and rank under every
   method, and the methods' rank agreement (Spearman, computed in Python). attributionSVG draws the same as a figure;
   renderAttributionResponse draws a POST /api/attribute answer. Every text goes in as text; null scores (NaN) show
   as NaN, never as 0. Tokens and targets are 0-indexed. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const el = (...a) => A.el(...a);
  const SCALE_NAMES = { method: "per method", shared: "shared" };

  // ---- numbers and colours --------------------------------------------------------------------------------------

  // A score as people read it: 4 decimals, or 3 significant digits when it is that small; NaN for null.
  const fmtScore = (v) => (v === null ? "NaN" : v !== 0 && Math.abs(v) < 1e-3 ? v.toExponential(2) : v.toFixed(4));
  const fmtRank = (r) => (r === null ? "—" : Number.isInteger(r) ? String(r) : r.toFixed(1));
  const fmtRho = (r) => (r === null ? "—" : r.toFixed(2));
  A.attributionScore = fmtScore;

  // The largest |score| each method's colours run to: its own (per method) or every method's (shared).
  function tops(data, scale) {
    const shared = Math.max(0, ...data.methods.map((m) => m.top));
    return data.methods.map((m) => (scale === "shared" ? shared : m.top));
  }

  function sequential(v, top) {
    const t = top > 0 ? Math.min(1, Math.max(0, v / top)) : 0;
    const lut = A.lut("light");
    const i = Math.round(t * 255) * 4;
    return `rgb(${lut[i]},${lut[i + 1]},${lut[i + 2]})`;
  }

  // A score's colour: diverging around 0 for a signed method, white to blue from 0 for an unsigned one; grey for NaN.
  A.attributionColour = function (v, top, signed) {
    if (v === null) return "#d0d0d0";
    return signed ? A.diverging(v, top, "light") : sequential(v, top);
  };
  const ink = (v, top) => (v !== null && top > 0 && Math.abs(v) / top > 0.55 ? "#ffffff" : "#111111");

  const oneLine = (s) => A.oneLine(s);
  const target = (data, t) => `target ${t} (0-indexed): ${JSON.stringify(data.targets[t])}`;
  // A check in words: its name, the measured value against its bound, what was compared (NOT VERIFIED: why not).
  const checkBody = (c) => (c.status === "NOT VERIFIED" ? c.detail
    : `${c.name} ${c.value === null ? "nan" : A.fmtError(c.value)} ${c.status === "PASS" ? "≤" : ">"} ` +
      `${c.bound === null ? "nan" : A.fmtError(c.bound)}: ${c.detail}`);
  const checkText = (c) => `${c.status}${c.status === "NOT VERIFIED" ? ":" : ""} ${checkBody(c)}`;

  // ---- the page ----------------------------------------------------------------------------------------------------

  function badge(check) {
    return el("span", { class: "as-attr-badge", "data-status": check.status, text: check.status,
                        title: checkText(check) });
  }

  // An encoder-decoder's scored tokens are the source's, then the decoder's input (segment 1): how many are source.
  const nSource = (data) => (data.kind === "seq2seq" ? data.segments.filter((s) => s === 0).length : null);
  const DECODER_INPUT = "decoder input (the target so far)";

  function partsRow(data) {
    const k = nSource(data);
    if (k === null) return null;
    return el("tr", { class: "as-attr-parts" }, [el("th", {}),
      el("th", { colspan: k, scope: "colgroup", text: "source" }),
      k < data.tokens.length ? el("th", { colspan: data.tokens.length - k, scope: "colgroup", text: DECODER_INPUT })
        : null, el("th", {})]);
  }

  function heatTable(data, t, pick) {
    const n = data.tokens.length;
    const index = el("tr", {}, [el("th", { text: "method \\ token" }),
      ...data.tokens.map((_, i) => el("th", { class: "as-attr-idx", scope: "col", text: String(i) })),
      el("th", { class: "as-attr-unit", text: "unit" })]);
    const rows = data.methods.map((m, k) => el("tr", { "data-method": m.name }, [
      el("th", { class: "as-attr-method", scope: "row" }, [document.createTextNode(m.name), badge(m.check)]),
      ...data.tokens.map((tok, i) => {
        const v = m.scores[t][i];
        return el("td", {}, [el("button", {
          type: "button", class: "as-attr-cell", "data-method": k, "data-target": t, "data-token": i,
          "data-value": v === null ? "NaN" : String(v), text: oneLine(tok),
          title: `${i}: ${oneLine(tok)} · ${m.name} ${fmtScore(v)} (rank ${fmtRank(m.ranks[t][i])} of ${n})`,
          "aria-label": `token ${i} ${oneLine(tok)}, ${m.name} ${fmtScore(v)}`, onclick: () => pick(i, t),
        })]);
      }),
      el("td", { class: "as-attr-unit", text: m.unit }),
    ]));
    return el("div", { class: "as-attr-scroll" }, [
      el("table", { class: "as-attr-heat", "data-target": t }, [el("thead", {}, [partsRow(data), index]),
                                                                  el("tbody", {}, rows)])]);
  }

  // Every method's score and rank of token i for target t.
  function tokenTable(data, i, t) {
    const n = data.tokens.length;
    const rows = data.methods.map((m) => el("tr", { "data-method": m.name }, [
      el("th", { scope: "row", text: m.name }),
      el("td", { class: "num score", "data-value": m.scores[t][i] === null ? "NaN" : String(m.scores[t][i]),
                 text: fmtScore(m.scores[t][i]) }),
      el("td", { class: "num rank", "data-value": m.ranks[t][i] === null ? "" : String(m.ranks[t][i]),
                 text: `${fmtRank(m.ranks[t][i])} of ${n}` }),
      el("td", { text: m.unit }), el("td", {}, [badge(m.check)]),
    ]));
    return el("table", { class: "as-attr-tok", "data-token": i, "data-target": t }, [
      el("caption", { text: `token ${i} (0-indexed): ${JSON.stringify(data.tokens[i])}, ${target(data, t)}` }),
      el("thead", {}, [el("tr", {}, ["method", "score", "rank (1: highest)", "unit", "check"].map(
        (h) => el("th", { scope: "col", text: h })))]),
      el("tbody", {}, rows)]);
  }

  function rhoTable(data, agreement) {
    const names = data.methods.map((m) => m.name);
    const head = el("tr", {}, [el("th", { text: "" }), ...names.map((n) => el("th", { scope: "col", text: n }))]);
    const rows = agreement.rho.map((row, a) => el("tr", {}, [el("th", { scope: "row", text: names[a] }),
      ...row.map((r, b) => el("td", {
        "data-a": names[a], "data-b": names[b], "data-value": r === null ? "" : String(r), text: fmtRho(r),
        style: r === null ? "background:#eeeeee" : `background:${A.diverging(r, 1, "light")};color:${ink(r, 1)}`,
        title: `Spearman's rho of ${names[a]} and ${names[b]}: ${r === null ? "not defined" : r.toFixed(4)}`,
      }))]));
    return el("table", { class: "as-attr-rho", "data-target": agreement.target }, [
      el("thead", {}, [head]), el("tbody", {}, rows)]);
  }

  function scaleToggle(state, redraw) {
    const buttons = Object.entries(SCALE_NAMES).map(([key, label]) => el("button", {
      type: "button", "data-scale": key, "aria-pressed": String(state.scale === key), text: label,
      onclick: () => { state.scale = key; redraw(); },
    }));
    return el("div", { class: "as-attr-toggle", role: "group", "aria-label": "colour scale" },
              [el("span", { text: "colour scale: " }), ...buttons]);
  }

  // Colour every cell for the scale chosen (and mark the picked token's column).
  function paint(root, data, state) {
    const top = tops(data, state.scale);
    for (const b of root.querySelectorAll(".as-attr-cell")) {
      const [k, t, i] = [+b.dataset.method, +b.dataset.target, +b.dataset.token];
      const v = data.methods[k].scores[t][i];
      b.style.background = A.attributionColour(v, top[k], data.methods[k].signed);
      b.style.color = ink(v, top[k]);
      b.classList.toggle("as-attr-picked", state.token === i && state.target === t);
      b.setAttribute("aria-pressed", String(state.token === i && state.target === t));
    }
    for (const b of root.querySelectorAll(".as-attr-toggle button")) {
      b.setAttribute("aria-pressed", String(b.dataset.scale === state.scale));
    }
    root.dataset.scale = state.scale;
  }

  function scaleNote(scale) {
    return (scale === "shared" ? "one scale for every row, up to the largest |score| of all methods"
      : "each method's rows on its own scale, up to its largest |score|") +
      "; signed methods blue below 0, orange above; unsigned white to blue from 0; NaN grey";
  }

  // The methods left out (not named, or not applying to this model), each with why.
  function skippedList(data) {
    const left = Object.entries(data.skipped || {});
    if (!left.length) return null;
    return el("section", { class: "as-attr-skipped" }, [el("h3", { text: "not run" }),
      el("ul", {}, left.map(([name, why]) => el("li", {}, [el("b", { text: name }),
                                                           document.createTextNode(`: ${why}`)])))]);
  }

  A.renderAttribution = function (element, data, options) {
    const state = { scale: (options && options.scale) || data.colours || "method", token: null, target: 0 };
    const panel = el("section", { class: "as-attr-token-panel", "aria-live": "polite" }, [
      el("p", { class: "as-attr-note", text: "click a token to see its score and rank under every method" })]);
    const note = el("p", { class: "as-attr-note as-attr-scale-note" });
    const redraw = () => { paint(element, data, state); note.textContent = scaleNote(state.scale); };
    const pick = (i, t) => {
      state.token = i;
      state.target = t;
      panel.replaceChildren(el("h3", { text: "the token under every method" }), tokenTable(data, i, t));
      redraw();
      A.emit(element, "attnscope:select", { view: "attribution", token: i, target: t });
    };
    const heat = data.targets.map((_, t) => el("section", { class: "as-attr-target" }, [
      el("h3", { text: target(data, t) }), heatTable(data, t, pick)]));
    const agree = data.agreement.map((g) => el("section", { class: "as-attr-agreement" }, [
      el("h3", { text: `rank agreement (Spearman's rho between methods), ${target(data, g.target)}` }),
      rhoTable(data, g), g.note ? el("p", { class: "as-attr-note", text: g.note }) : null]));
    const checks = el("ul", { class: "as-attr-checks" }, data.methods.map((m) => el("li", {}, [
      el("b", { text: m.name }), badge(m.check), document.createTextNode(` ${checkBody(m.check)} · ${m.unit} · ` +
        `${m.cost.forwards} forwards, ${m.cost.backwards} backwards, ${m.cost.seconds.toFixed(2)} s`)])));
    const svgButton = A.svgButton ? A.svgButton(() => A.attributionSVG(data, state), "attnscope-attribution.svg") : null;
    element.replaceChildren(el("div", { class: "as-attr" }, [
      el("h2", { text: data.title }, [el("span", { class: "as-attr-badge", "data-status": data.status,
        text: data.status, title: "the verdict over every method's check" }), svgButton]),
      el("p", { class: "as-attr-note", text: `${data.tokens.length} input tokens, ${data.targets.length} ` +
        `target${data.targets.length === 1 ? "" : "s"}, ${data.methods.length} methods; rank 1 is a method's ` +
        "highest score; tokens and targets 0-indexed" }),
      scaleToggle(state, redraw), note, ...heat, panel, ...agree,
      el("h3", { text: "checks" }), checks, skippedList(data)]));
    redraw();
    element.attnscopeFigure = (opts) => A.attributionSVG(data, state, opts); // what figureSVG(element) returns
    element.attnscopeAttribution = { state: () => ({ ...state }), pick: pick,
                                     setScale: (s) => { state.scale = s; redraw(); } };
    element.dataset.attnscopeReady = "1";
    A.emit(element, "attnscope:ready", { view: "attribution" });
    return element.attnscopeAttribution;
  };

  // A POST /api/attribute answer ({..., view: the payload}) in `element`; an error answer as its one line.
  A.renderAttributionResponse = function (element, response, options) {
    if (!response || response.error || !response.view) {
      element.replaceChildren(el("p", { class: "as-attr-note", role: "alert",
        text: (response && response.error) || "the answer carries no attribution view" }));
      return null;
    }
    return A.renderAttribution(element, response.view, options);
  };

  // "What does this head contribute?": from a head picked in the attention views (layer, head 0-indexed), the
  // POST /api/attribute body that scores the input by that head alone: its attention weights from the predicting
  // position and, where the prediction has a gradient (not an encoder's pooled embedding, at its maximum), attention
  // x gradient. `traced`: the body the views' trace was asked with ({text, model, target?}).
  A.headAttributionBody = function (traced, layer, head, encoder) {
    return { text: traced.text, model: traced.model === undefined ? null : traced.model,
             target: encoder || traced.target === undefined ? null : traced.target,
             methods: encoder ? "attention" : "attention,attention_x_gradient", layer: layer, head: head };
  };

  A.bootAttribution = function () {
    const root = document.getElementById("attnscope-root");
    A.renderAttribution(root, JSON.parse(document.getElementById("attnscope-attribution").textContent));
  };

  // ---- the figure --------------------------------------------------------------------------------------------------

  // The heatmaps (a row per method, per target; each cell the token as text on its colour, data-value its score),
  // each method's check and unit beside its row, then the Spearman matrix of each target.
  const WRAP = 1100; // px of token cells per line of a figure: a longer text goes on as more lines

  // The token indices of each line of a figure, in order.
  function wrapped(colW) {
    const out = [[]];
    let w = 0;
    colW.forEach((cw, i) => {
      if (w + cw > WRAP && out[out.length - 1].length) {
        out.push([]);
        w = 0;
      }
      out[out.length - 1].push(i);
      w += cw;
    });
    return out;
  }

  // An encoder-decoder's part labels over one line of tokens: "source" and the decoder input, where each starts.
  function partLabels(data, idx) {
    const k = nSource(data);
    if (k === null) return [];
    const out = idx[0] < k ? [[idx[0], "source"]] : [[idx[0], DECODER_INPUT]];
    if (idx[0] < k && idx.includes(k)) out.push([k, DECODER_INPUT]);
    return out;
  }

  A.attributionSVG = function (data, state, options) {
    const F = A.fig;
    const scale = (state && state.scale) || data.colours || "method";
    const top = tops(data, scale);
    const labelW = Math.max(...data.methods.map((m) => F.width(`${m.name} ${m.check.status}`, 12))) + 16;
    const colW = data.tokens.map((tok) => Math.max(24, F.width(oneLine(tok), 11) + 8));
    const rowH = 20;
    const body = [];
    let [y, widest] = [0, labelW];
    data.targets.forEach((_, t) => {
      body.push(F.text(0, y + 14, target(data, t), ' font-weight="600"'));
      y += 20;
      for (const idx of wrapped(colW)) {
        const xs = {};
        let end = labelW;
        for (const i of idx) [xs[i], end] = [end, end + colW[i]];
        widest = Math.max(widest, end);
        const parts = partLabels(data, idx);
        for (const [i, label] of parts) body.push(F.text(xs[i], y + 12, label, ` font-size="11" fill="${F.MUTED}"`));
        y += parts.length ? 16 : 0;
        for (const i of idx) {
          body.push(F.text(xs[i] + colW[i] / 2, y + 12, String(i), ` text-anchor="middle" font-size="10" fill="${F.MUTED}"`));
        }
        y += 16;
        data.methods.forEach((m, k) => {
          const fill = m.check.status === "PASS" ? "#2e7d32" : m.check.status === "FAIL" ? "#c62828" : "#8d6e00";
          body.push(`<g class="method" data-method="${F.esc(m.name)}" data-target="${t}">`, F.text(0, y + 14, m.name),
                    F.text(F.width(m.name, 12) + 6, y + 14, m.check.status, ` font-size="10" fill="${fill}"`));
          for (const i of idx) {
            const v = m.scores[t][i];
            body.push(`<rect x="${F.num(xs[i])}" y="${y}" width="${F.num(colW[i] - 2)}" height="${rowH - 2}" ` +
                      `fill="${A.attributionColour(v, top[k], m.signed)}" data-token="${i}" ` +
                      `data-value="${v === null ? "NaN" : v}"/>`,
                      F.text(xs[i] + colW[i] / 2 - 1, y + 13, oneLine(data.tokens[i]),
                             ` text-anchor="middle" font-size="11" fill="${ink(v, top[k])}"`));
          }
          body.push(F.text(end + 8, y + 14, `${m.unit}${scale === "method" ? ` · max |score| ${fmtScore(top[k])}` : ""}`,
                           ` font-size="11" fill="${F.MUTED}"`), "</g>");
          y += rowH;
        });
        y += 8;
      }
      y += 6;
    });
    y = rhoFigure(data, body, y + 8, labelW);
    const lines = [data.title, F.fields(`colours: ${SCALE_NAMES[scale]} scale` +
      (scale === "shared" ? ` (max |score| ${fmtScore(top[0] || 0)})` : ""), scaleNote(scale).split("; ").slice(1)
      .join(", "), `every check: ${data.status}`, "tokens 0-indexed")];
    return F.svg(body.join("\n"), widest + 320, y, lines, options);
  };

  // The Spearman matrices below the heatmaps (method names down the side and slanted across the top).
  function rhoFigure(data, body, y0, labelW) {
    const F = A.fig;
    const cell = 44;
    let y = y0;
    data.agreement.forEach((g) => {
      body.push(F.text(0, y + 14, `rank agreement (Spearman's rho), ${target(data, g.target)}`, ' font-weight="600"'));
      y += 24 + Math.max(...data.methods.map((m) => F.width(m.name, 11))) * 0.7;
      data.methods.forEach((m, b) => {
        const x = labelW + b * cell + cell / 2;
        body.push(F.text(x, y - 4, m.name, ` font-size="11" transform="rotate(-45 ${F.num(x)} ${F.num(y - 4)})"`));
      });
      g.rho.forEach((row, a) => {
        body.push(F.text(0, y + 14, data.methods[a].name, ' font-size="11"'));
        row.forEach((r, b) => {
          const x = labelW + b * cell;
          body.push(`<rect x="${x}" y="${y}" width="${cell - 2}" height="18" data-value="${r === null ? "" : r}" ` +
                    `fill="${r === null ? "#eeeeee" : A.diverging(r, 1, "light")}"/>`,
                    F.text(x + cell / 2 - 1, y + 13, fmtRho(r), ` text-anchor="middle" font-size="10" fill="${ink(r, 1)}"`));
        });
        y += 20;
      });
      if (g.note) body.push(F.text(0, y + 14, g.note, ` font-size="11" fill="${F.MUTED}"`));
      y += g.note ? 28 : 12;
    });
    return y;
  }
})();
