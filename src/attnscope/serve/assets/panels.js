/* attnscope serve: the attribution, faithfulness and corpus-search panels, and the links from a selection in the
   attention views ("what this head contributes", "find similar tokens in the corpus"). Each panel asks this
   server's JSON API about the text the views show (its model), and draws the answer: attribution.js draws
   POST /api/attribute's; the faithfulness curves are SVG drawn here, one line per method; the search's matches are
   sentences with the matched token marked. User text only ever reaches the page as textContent. */
(function () {
  "use strict";
  const A = window.attnscope;
  const $ = (id) => document.getElementById(id);
  const el = (...a) => A.el(...a);
  const config = JSON.parse($("sv-config").textContent);
  const SVG = "http://www.w3.org/2000/svg";
  const CONTROL = /^(random_\d+|position)$/;
  const PALETTE = ["#2563eb", "#d97706", "#059669", "#dc2626", "#7c3aed", "#0891b2", "#be185d", "#4d7c0f",
                   "#9333ea", "#b45309", "#0f766e", "#1d4ed8"];

  const post = (path, body) => A.api(path, body); // serve.js's: the JSON answer or an Error saying what came

  function setStatus(name, text, kind) {
    const s = $(`sv-${name}-status`);
    s.textContent = text;
    s.dataset.kind = kind || "";
  }

  // ---- what the views show: the text, its model, its tokens ---------------------------------------------------

  function modelInfo(name) {
    return config.models.find((m) => m.name === name || (m.aliases || []).includes(name)) ||
      config.models.find((m) => m.default);
  }

  // The text the attention views show ({text, pair, model, tokens}); before any trace, the form's fields.
  function shown() {
    const s = $("sv-views").attnscopeShown;
    const p = s && s.model && s.model.payload;
    if (p && typeof p.text === "string" && p.model) {
      return { text: p.text, pair: p.pair, model: p.model.name, tokens: p.tokens };
    }
    return { text: $("sv-text").value, pair: null, model: $("sv-model").value || null, tokens: null };
  }

  const kindOf = (name) => modelInfo(name).attribution; // "causal", "seq2seq", "encoder" or null

  // Each panel's method boxes: a method that does not apply to the model is disabled, with why.
  function methodBoxes() {
    const kind = kindOf(shown().model);
    for (const box of document.querySelectorAll(".sv-methods input[type=checkbox]")) {
      const method = config.methods.find((m) => m.name === box.value);
      const why = method && kind ? method.not_for[kind] : null;
      const label = box.closest("label");
      box.disabled = Boolean(why);
      label.title = why || label.dataset.title;
    }
    $("sv-attr-target-label").style.display = kind === "encoder" ? "none" : "";
  }

  function chosenMethods(prefix) {
    const boxes = document.querySelectorAll(`input[name="${prefix}-method"]:checked:not(:disabled)`);
    return [...boxes].map((b) => b.value);
  }

  // ---- attribution ---------------------------------------------------------------------------------------------

  async function attribute(body, what) {
    const out = $("sv-attr-out");
    $("sv-attr-go").disabled = true;
    setStatus("attr", `${what}…`, "busy");
    const started = performance.now();
    try {
      const data = await post("/api/attribute", body);
      A.renderAttributionResponse(out, data);
      setStatus("attr", `${what} · ${data.status} · ${Math.round(performance.now() - started)} ms`,
                data.status === "FAIL" ? "error" : "ok");
    } catch (err) {
      setStatus("attr", err.message, "error");
    } finally {
      $("sv-attr-go").disabled = false;
    }
  }

  function attributeText(event) {
    event.preventDefault();
    const s = shown();
    const methods = chosenMethods("sv-attr");
    if (!methods.length) return setStatus("attr", "tick at least one method that applies to this model", "error");
    const target = $("sv-attr-target").value;
    const encoder = kindOf(s.model) === "encoder";
    attribute({ text: s.text, model: s.model, methods: methods.join(","),
                target: encoder || !target.trim() ? null : target }, `attributing ${methods.length} method(s)`);
  }

  // "What this head contributes": attribution.js's body for the head picked in the views (0-indexed).
  function headContribution(layer, head) {
    const s = shown();
    const body = A.headAttributionBody({ text: s.text, model: s.model }, layer, head, kindOf(s.model) === "encoder");
    $("sv-attr").scrollIntoView({ block: "start" });
    return attribute(body, `what layer ${layer}, head ${head} contributes`);
  }

  // ---- faithfulness: the curves -------------------------------------------------------------------------------

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const colourOf = (rows) => {
    let i = 0;
    return Object.fromEntries(rows.map((r) => [r.method, CONTROL.test(r.method) ? "#8a8f98" : PALETTE[i++ % PALETTE.length]]));
  };

  // The y range of every line of one curve kind (the unperturbed measure included), padded when flat.
  function yRange(rows, kind, full) {
    const ys = rows.flatMap((r) => r[kind]).filter((v) => v !== null).concat(full === null ? [] : [full]);
    let lo = Math.min(...ys);
    let hi = Math.max(...ys);
    if (!(hi > lo)) [lo, hi] = [lo - 0.5, hi + 0.5];
    return [lo, hi];
  }

  // One curve kind (deletion or insertion) as an SVG: x the share of removable tokens removed (or kept), y the
  // measure; one polyline per method, controls dashed; a null (NaN) point breaks its line.
  function curveSVG(data, kind, colours) {
    const W = 470, H = 280, L = 62, R = 22, T = 26, B = 40;
    const xs = data[`${kind}_x`];
    const [lo, hi] = yRange(data.rows, kind, data.rows[0].full);
    const px = (x) => L + x * (W - L - R);
    const py = (y) => T + (1 - (y - lo) / (hi - lo)) * (H - T - B);
    const root = svg("svg", { class: "sv-curve", "data-kind": kind, viewBox: `0 0 ${W} ${H}`, width: W, height: H,
                              role: "img" });
    const title = kind === "deletion" ? "deletion: the top-ranked tokens removed first"
      : "insertion: only the top-ranked tokens kept";
    root.append(svg("title", {}, title), svg("text", { x: L, y: 16, class: "sv-curve-title" }, title));
    root.append(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "sv-axis" }),
                svg("line", { x1: L, y1: T, x2: L, y2: H - B, class: "sv-axis" }));
    for (const [v, anchor] of [[lo, "end"], [hi, "end"]]) {
      root.append(svg("text", { x: L - 4, y: py(v) + 4, "text-anchor": anchor, class: "sv-tick" }, A.fmt(v)));
    }
    for (const x of [0, 0.5, 1]) root.append(svg("text", { x: px(x), y: H - B + 14, "text-anchor": "middle",
                                                           class: "sv-tick" }, `${Math.round(x * 100)}%`));
    const xLabel = kind === "deletion" ? "share of removable tokens removed" : "share of removable tokens kept";
    root.append(svg("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", class: "sv-tick" }, xLabel));
    const yMid = (T + H - B) / 2;
    root.append(svg("text", { x: 12, y: yMid, "text-anchor": "middle", class: "sv-tick",
                              transform: `rotate(-90 12 ${yMid})` }, "the measure f"));
    for (const row of data.rows) {
      const points = row[kind].map((y, i) => (y === null ? null : `${px(xs[i]).toFixed(1)},${py(y).toFixed(1)}`));
      const line = svg("polyline", { points: points.filter(Boolean).join(" "), fill: "none",
        stroke: colours[row.method], "stroke-width": CONTROL.test(row.method) ? 1.2 : 2,
        "stroke-dasharray": CONTROL.test(row.method) ? "4 3" : "none", "data-method": row.method,
        "data-points": row[kind].length });
      line.append(svg("title", {}, `${row.method}: ${row[kind].map((v) => (v === null ? "NaN" : A.fmt(v))).join(", ")}`));
      root.append(line);
    }
    return root;
  }

  function legend(rows, colours) {
    return el("ul", { class: "sv-legend" }, rows.map((r) => el("li", { "data-method": r.method }, [
      el("span", { class: "sv-swatch", style: `background:${colours[r.method]}` }),
      el("span", { text: `${r.method}${CONTROL.test(r.method) ? " (control)" : ""}` })])));
  }

  const fmtNumber = (v) => (v === null || v === undefined ? "NaN" : A.fmt(v));
  const METRICS = [["naopc", "normalised AOPC"], ["aopc", "AOPC"], ["comprehensiveness_aopc", "comprehensiveness"],
                   ["sufficiency_aopc", "sufficiency"], ["deletion_area", "deletion area"],
                   ["insertion_area", "insertion area"], ["spearman_loo", "Spearman vs LOO"],
                   ["kendall_loo", "Kendall vs LOO"]];

  function metricsTable(rows) {
    const head = el("tr", {}, [el("th", { text: "method" }), el("th", { text: "check" }),
                               ...METRICS.map(([, label]) => el("th", { scope: "col", text: label }))]);
    const body = rows.map((r) => el("tr", { "data-method": r.method }, [
      el("th", { scope: "row", text: r.method }), el("td", { text: r.check }),
      ...METRICS.map(([key]) => el("td", { class: "num", "data-key": key, "data-value": r[key] === null ? "NaN"
        : String(r[key]), text: fmtNumber(r[key]) }))]));
    return el("div", { class: "sv-panel-scroll" }, [el("table", { class: "sv-fx-table sv-faith-table" }, [
      el("caption", { text: "this text's metrics per ordering (ERASER comprehensiveness and sufficiency as their " +
        "aggregate over 1, 5, 10, 20 and 50%; normalised AOPC: 1 the best ordering, 0 the worst)" }),
      el("thead", {}, [head]), el("tbody", {}, body)])]);
  }

  function drawFaithfulness(out, data) {
    const first = data.rows[0];
    const colours = colourOf(data.rows);
    const kept = data.tokens.filter((t) => t.removable).map((t) => A.oneLine(t.text));
    out.replaceChildren(
      el("p", { class: "sv-fx-line", text: `${data.model} (${data.kind}): ${data.description}; removal ` +
        `${data.removal} (special tokens never removed); f(x) = ${fmtNumber(first.full)}; unperturbed check ` +
        `${first.unperturbed_verified ? "✓" : "✗"} ${A.fmtError(Number(first.unperturbed_error))}; ` +
        `${data.cost.modified_inputs} modified inputs, ${data.cost.seconds.toFixed(1)} s` }),
      el("p", { class: "sv-fx-line sv-faith-tokens", text: `${kept.length} removable tokens: ${kept.join(" · ")}` }),
      el("div", { class: "sv-curves" }, [curveSVG(data, "deletion", colours), curveSVG(data, "insertion", colours)]),
      legend(data.rows, colours), metricsTable(data.rows));
    out.dataset.rows = String(data.rows.length);
  }

  async function measureFaithfulness(event) {
    event.preventDefault();
    const s = shown();
    const methods = chosenMethods("sv-faith");
    if (!methods.length) return setStatus("faith", "tick at least one method that applies to this model", "error");
    const body = { text: s.text, model: s.model, methods: methods.join(","), removal: $("sv-faith-removal").value,
                   seeds: Number($("sv-faith-seeds").value) };
    $("sv-faith-go").disabled = true;
    setStatus("faith", "measuring…", "busy");
    const started = performance.now();
    try {
      drawFaithfulness($("sv-faith-out"), await post("/api/faithfulness", body));
      setStatus("faith", `${Math.round(performance.now() - started)} ms`, "ok");
    } catch (err) {
      setStatus("faith", err.message, "error");
    } finally {
      $("sv-faith-go").disabled = false;
    }
  }

  // ---- corpus search ------------------------------------------------------------------------------------------

  const SPECIAL = "(special token)"; // a match with no characters in its sentence ([CLS], [SEP], BOS)

  // The sentence as text, its matched token in a <mark>.
  function marked(m) {
    const special = m.start === m.end;
    return el("span", { class: "sv-sentence" }, [document.createTextNode(m.text.slice(0, m.start)),
      el("mark", { class: special ? "sv-special" : null, text: special ? SPECIAL : m.text.slice(m.start, m.end) }),
      document.createTextNode(m.text.slice(m.end))]);
  }

  function counts(title, values) {
    const entries = Object.entries(values || {});
    const top = Math.max(1, ...entries.map(([, n]) => n));
    return el("section", { class: "sv-counts", "data-name": title }, [el("h3", { text: title }),
      entries.length ? el("ul", {}, entries.slice(0, 12).map(([label, n]) => el("li", {}, [
        el("span", { class: "sv-count-label", text: label === "" ? SPECIAL : A.oneLine(label) }),
        el("span", { class: "sv-bar", style: `width:${Math.round((n / top) * 100)}%` }),
        el("span", { class: "sv-count-n", text: String(n) })]))) : el("p", { class: "sv-hint", text: "none" })]);
  }

  function drawSearch(out, data) {
    const head = data.head === null ? "" : `, head ${data.head}`;
    const matches = data.matches.map((m) => el("li", { "data-rank": m.rank, "data-distance": String(m.distance) }, [
      el("span", { class: "sv-distance", text: m.distance.toFixed(4) }), marked(m),
      el("span", { class: "sv-labels", text: [m.upos, m.deprel, `position ${m.position}`, m.where]
        .filter((x) => x !== null).join(" · ") })]));
    out.replaceChildren(
      el("p", { class: "sv-fx-line", text: `${JSON.stringify(data.token_text)} (token ${data.token} of the query) ` +
        `at layer ${data.layer}, by ${data.by}${head}: ${data.matches.length} nearest of ${data.index.tokens} ` +
        `corpus tokens (${data.method}; distance 1 − cosine; 0-indexed)` }),
      el("div", { class: "sv-summary" }, [counts("part of speech (UD)", data.summary.upos),
        counts("dependency relation (UD)", data.summary.deprel), counts("position", data.summary.position),
        counts("token", data.summary.token)]),
      el("ol", { class: "sv-matches", start: 0 }, matches));
  }

  function searchRequest() {
    const by = $("sv-search-by").value;
    return { text: $("sv-search-text").value, token: Number($("sv-search-token").value),
             layer: Number($("sv-search-layer").value), by: by,
             head: by === "query" || by === "key" ? Number($("sv-search-head").value) : null,
             k: Number($("sv-search-k").value), exact: $("sv-search-exact").checked };
  }

  async function runSearch(event) {
    if (event) event.preventDefault();
    const body = searchRequest();
    const s = shown();
    if (s.model && modelInfo(s.model).name === config.corpus.model) body.model = s.model;
    $("sv-search-go").disabled = true;
    setStatus("search", "searching…", "busy");
    const started = performance.now();
    try {
      drawSearch($("sv-search-out"), await post("/api/search", body));
      setStatus("search", `${Math.round(performance.now() - started)} ms`, "ok");
    } catch (err) {
      setStatus("search", err.message, "error");
    } finally {
      $("sv-search-go").disabled = false;
    }
  }

  // From a token clicked in the views: its text and index, the views' layer when the index holds it.
  function findSimilar(query, layer) {
    const s = shown();
    $("sv-search-text").value = s.text;
    $("sv-search-token").value = String(query);
    const layers = config.corpus.layers;
    $("sv-search-layer").value = String(layers.includes(layer) ? layer : layers[layers.length - 1]);
    $("sv-search").scrollIntoView({ block: "start" });
    return runSearch(null);
  }

  // ---- the links from a selection in the views -----------------------------------------------------------------

  function link(id, text, onclick) {
    return el("button", { type: "button", id: id, class: "sv-link", text: text, onclick: (e) => {
      e.preventDefault();
      onclick();
    } });
  }

  function selected(detail) {
    const bar = $("sv-links");
    const s = shown();
    const kind = kindOf(s.model);
    const parts = [];
    if (detail.layer !== null && detail.layer !== undefined && detail.head !== null && detail.head !== undefined &&
        (kind === "causal" || kind === "encoder")) {
      parts.push(el("span", { text: `layer ${detail.layer}, head ${detail.head}:` }),
                 link("sv-link-head", "what this head contributes", () => headContribution(detail.layer, detail.head)));
    }
    if (config.corpus && detail.query !== null && detail.query !== undefined) {
      const token = s.tokens && s.tokens[detail.query] !== undefined ? ` ${JSON.stringify(s.tokens[detail.query])}` : "";
      parts.push(el("span", { text: `token ${detail.query}${token}:` }),
                 link("sv-link-search", "find similar tokens in the corpus", () => findSimilar(detail.query, detail.layer)));
    }
    bar.replaceChildren(...parts);
    bar.hidden = parts.length === 0;
  }

  // ---- start ----------------------------------------------------------------------------------------------------

  function start() {
    for (const label of document.querySelectorAll(".sv-methods label")) label.dataset.title = label.title;
    $("sv-attr-form").addEventListener("submit", attributeText);
    $("sv-faith-form").addEventListener("submit", measureFaithfulness);
    if (config.corpus) $("sv-search-form").addEventListener("submit", runSearch);
    $("sv-views").addEventListener("attnscope:select", (e) => selected(e.detail || {}));
    $("sv-views").addEventListener("attnscope:ready", methodBoxes);
    $("sv-model").addEventListener("change", methodBoxes);
    methodBoxes();
  }

  start();
})();
