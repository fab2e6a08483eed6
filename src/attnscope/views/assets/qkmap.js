/* attnscope query/key maps (AttentionViz): views/qkmap.py's payload drawn as one joint scatter per head (small
   multiples of a layer's heads), one point per query and one per key of the sampled tokens. window.attnscope
   .renderQKMap(element, data) draws it; the colour toggle says token kind (query or key), position or UD label;
   hovering a point shows its token in its sentence. The panels are SVG built from escaped strings (F.esc; a token's
   text never enters the markup: points carry numbers only), and the same strings make the figure (qkmapSVG). Layers,
   heads and positions are 0-indexed. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const F = (A.fig = A.fig || {});
  const el = (...a) => A.el(...a);
  const KIND = { query: "#1f77b4", key: "#e6550d" };
  const NONE = "#bdbdbd";
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                   "#bcbd22", "#393b79", "#ad494a", "#637939", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1"];
  const NAMES = { kind: "token kind", position: "position", upos: "UD part of speech", deprel: "UD relation" };

  // The labels a colouring uses, most frequent first (UD labels), and each label's colour.
  function categories(data, by) {
    const counts = new Map();
    for (const t of data.tokens) if (t[by] !== null) counts.set(t[by], (counts.get(t[by]) || 0) + 1);
    const labels = [...counts.keys()].sort((a, b) => counts.get(b) - counts.get(a) || (a < b ? -1 : 1));
    return new Map(labels.map((l, i) => [l, i < PALETTE.length ? PALETTE[i] : "#555555"]));
  }

  function colourer(data, by) {
    if (by === "kind") return (kind) => KIND[kind];
    if (by === "position") {
      const top = Math.max(1, ...data.tokens.map((t) => t.position));
      const lut = A.lut("light");
      return (kind, t) => {
        const i = Math.round((0.15 + (0.85 * t.position) / top) * 255) * 4;
        return `rgb(${lut[i]},${lut[i + 1]},${lut[i + 2]})`;
      };
    }
    const cats = categories(data, by);
    return (kind, t) => (t[by] === null ? NONE : cats.get(t[by]));
  }

  // The legend of a colouring as [label, colour] pairs.
  function legend(data, by) {
    if (by === "kind") return [["query", KIND.query], ["key", KIND.key]];
    if (by === "position") {
      const top = Math.max(1, ...data.tokens.map((t) => t.position));
      const c = colourer(data, by);
      return [[`position 0`, c("query", { position: 0 })], [`position ${top}`, c("query", { position: top })]];
    }
    return [...categories(data, by)].concat([["no label", NONE]]);
  }

  // One head's panel as SVG markup: a frame, its title, the keys then the queries (queries drawn on top).
  function panelBody(data, m, by, size) {
    const all = m.queries.concat(m.keys);
    const xs = all.map((p) => p[0]);
    const ys = all.map((p) => p[1]);
    const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
    const span = Math.max(x1 - x0, y1 - y0) || 1;
    const pad = 8;
    const at = (p) => [pad + ((p[0] - x0) / span) * (size - 2 * pad), size - pad - ((p[1] - y0) / span) * (size - 2 * pad)];
    const colour = colourer(data, by);
    const r = size > 300 ? 2.6 : 2;
    const out = [`<rect x="0" y="0" width="${size}" height="${size}" fill="#ffffff" stroke="#cccccc"/>`];
    for (const [kind, points] of [["key", m.keys], ["query", m.queries]]) {
      points.forEach((p, i) => {
        const [x, y] = at(p);
        out.push(`<circle class="as-qk-point" data-kind="${kind}" data-row="${i}" data-head="${m.head}" ` +
                 `cx="${F.num(x)}" cy="${F.num(y)}" r="${r}" fill="${colour(kind, data.tokens[i])}" ` +
                 `fill-opacity="0.75"/>`);
      });
    }
    return out.join("\n");
  }

  function caption(m) {
    const ex = m.explained ? ` · PCA ${(100 * (m.explained[0] + m.explained[1])).toFixed(0)}% of variance` : "";
    return `layer ${m.layer} head ${m.head}${ex}`;
  }

  const panelSize = (data) => (data.maps.length > 1 ? 260 : 520);

  // The whole figure: every head's panel in a grid with its caption, and the legend.
  A.qkmapSVG = function (data, state, options) {
    const size = panelSize(data);
    const perRow = Math.min(data.maps.length, size > 300 ? 1 : 4);
    const body = [];
    data.maps.forEach((m, k) => {
      const [gx, gy] = [(k % perRow) * (size + 16), Math.floor(k / perRow) * (size + 28)];
      body.push(`<g class="as-qk-head" data-head="${m.head}" transform="translate(${gx} ${gy})">`,
                F.text(0, 12, caption(m), ' font-weight="600"'),
                `<g transform="translate(0 18)">${panelBody(data, m, state.colour, size)}</g></g>`);
    });
    const rows = Math.ceil(data.maps.length / perRow);
    let y = rows * (size + 28) + 10;
    const items = legend(data, state.colour);
    items.forEach(([label, colour], i) => {
      const [x, yy] = [(i % 6) * 120, y + Math.floor(i / 6) * 16];
      body.push(`<circle cx="${x + 5}" cy="${yy - 4}" r="4" fill="${colour}"/>`, F.text(x + 13, yy, label));
    });
    y += Math.ceil(items.length / 6) * 16;
    const lines = [data.title, F.fields(`${data.sampled} of ${data.total} tokens`, `colour: ${NAMES[state.colour]}`,
                                        "queries and keys in one space (AttentionViz's normalisation)", "0-indexed")];
    return F.svg(body.join("\n"), perRow * (size + 16), y, lines, options);
  };

  // SVG markup -> an <svg> element of the page (parsed as XML: the markup is ours, every text escaped).
  function svgElement(markup, w, h) {
    const ns = document.documentElement.namespaceURI.replace("1999/xhtml", "2000/svg");
    const doc = new DOMParser().parseFromString(`\x3csvg xmlns="${ns}" width="${w}" height="${h}" ` +
      `viewBox="0 0 ${w} ${h}">${markup}\x3c/svg>`, "image/svg+xml");
    return document.importNode(doc.documentElement, true);
  }

  // The hover card: the point's kind, head and token, and the sentence with the token marked (all as text).
  function showTip(tip, data, point, event) {
    const t = data.tokens[Number(point.dataset.row)];
    const text = data.documents[String(t.doc)];
    const labels = [t.upos, t.deprel].filter((x) => x !== null).join(", ");
    const head = el("div", { class: "as-qk-tip-head",
      text: `${point.dataset.kind} · head ${point.dataset.head} · token ${JSON.stringify(t.text)} at position ` +
            `${t.position}${labels ? ` (${labels})` : ""}` });
    const sentence = el("div", { class: "as-qk-sentence" }, t.special && t.start === t.end
      ? [document.createTextNode(text)]
      : [document.createTextNode(text.slice(0, t.start)), el("mark", { text: text.slice(t.start, t.end) }),
         document.createTextNode(text.slice(t.end))]);
    tip.replaceChildren(head, sentence);
    tip.hidden = false;
    tip.style.left = `${Math.min(event.clientX + 14, window.innerWidth - 470)}px`;
    tip.style.top = `${event.clientY + 14}px`;
  }

  A.renderQKMap = function (element, data) {
    const state = { colour: data.colour };
    const tip = el("div", { class: "as-qk-tip", hidden: true, role: "tooltip" });
    const grid = el("div", { class: "as-qk-grid" });
    const legendBox = el("div", { class: "as-qk-legend" });
    const buttons = data.colours.map((c) => el("button", { type: "button", "data-colour": c, text: NAMES[c],
      "aria-pressed": String(c === state.colour), onclick: () => { state.colour = c; draw(); } }));
    function draw() {
      const size = panelSize(data);
      buttons.forEach((b) => b.setAttribute("aria-pressed", String(b.dataset.colour === state.colour)));
      grid.replaceChildren(...data.maps.map((m) => el("figure", { class: "as-qk-panel", "data-head": m.head }, [
        el("figcaption", { text: caption(m) }), svgElement(panelBody(data, m, state.colour, size), size, size)])));
      legendBox.replaceChildren(...legend(data, state.colour).map(([label, colour]) => el("span", {}, [
        el("span", { class: "as-qk-swatch", style: `background:${colour}` }), document.createTextNode(label)])));
    }
    grid.addEventListener("mouseover", (e) => {
      if (e.target.classList && e.target.classList.contains("as-qk-point")) showTip(tip, data, e.target, e);
    });
    grid.addEventListener("mouseout", (e) => {
      if (e.target.classList && e.target.classList.contains("as-qk-point")) tip.hidden = true;
    });
    const figure = () => A.qkmapSVG(data, state);
    element.replaceChildren(el("div", { class: "as-qk" }, [
      el("h2", { text: data.title }, A.svgButton ? [A.svgButton(figure, "attnscope-qkmap.svg"),
                                                   A.pngButton(figure, "attnscope-qkmap.png")] : []),
      el("p", { class: "as-qk-note", text: `${data.sampled} of ${data.total} tokens of ${data.corpus}: each ` +
        "head's queries and keys in one space (keys moved and both scaled as AttentionViz does, so that each " +
        "query's ranking of keys is kept); hover a point for its token in its sentence. Layers and heads are " +
        "0-indexed." }),
      el("div", { class: "as-qk-toggle", role: "group", "aria-label": "colour by" },
         [document.createTextNode("colour: "), ...buttons]),
      legendBox, grid, tip]));
    draw();
    element.attnscopeFigure = (options) => A.qkmapSVG(data, state, options); // what attnscope.figureSVG returns
    element.dataset.attnscopeReady = "1";
  };

  A.bootQKMap = function () {
    const root = document.getElementById("attnscope-qkmap-root");
    A.renderQKMap(root, JSON.parse(document.getElementById("attnscope-qkmap").textContent));
  };
})();
