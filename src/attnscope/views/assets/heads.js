/* attnscope heads grouped by what they do: views/heads.py's payload drawn as the dendrogram of the clustering (scipy's
   segments, leaves named layer.head) beside the 2-D map of the heads (classical MDS of the same distances), each head
   coloured by its first behaviour label; then the label counts, the heads of each label and, with a second model,
   the two side by side. window.attnscope.renderHeads(element, data, onPick) draws it; a click on a head (a leaf or a
   point) calls onPick(layer, head); bootHeads() opens that head in the attention views of the page's example trace
   (#attnscope-data) when it has one. The drawing is SVG markup from escaped strings (F.esc), the same for the page and
   the figure (headsSVG). Layers and heads are 0-indexed. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const F = (A.fig = A.fig || {});
  const el = (...a) => A.el(...a);
  const COLOURS = { previous: "#1f77b4", next: "#17becf", self: "#9467bd", "first/special": "#d62728",
                    broad: "#2ca02c", syntactic: "#ff7f0e", mixed: "#7f7f7f" };
  const MAP = 420; // px: the map's side

  const kindOf = (labels) => (labels.length ? labels[0].split(":")[0] : "mixed");
  const colourOf = (data, u) => COLOURS[kindOf(data.labels[u])];
  const described = (data, u) => `head ${data.names[u]} (layer.head, 0-indexed): ` +
    `${data.labels[u].length ? data.labels[u].join(", ") : "mixed"}; cluster ${data.clusters[u]}`;

  // The dendrogram: scipy's coordinates (leaf i at x = 5 + 10 i, heights the linkage distances) scaled to the box.
  function dendrogramBody(data) {
    const d = data.dendrogram;
    const n = d.leaves.length;
    const step = Math.max(9, Math.min(16, 900 / n)); // a leaf's label is ~8 px across, rotated
    const height = 260;
    const top = Math.max(1e-12, ...d.dcoord.flat());
    const x = (v) => 40 + ((v - 5) / 10) * step;
    const y = (v) => 10 + height * (1 - v / top);
    const out = [`<g class="as-hd-dendrogram">`, F.text(0, 0, "dendrogram (average linkage of the JS distances)",
                                                          ' font-weight="600"')];
    d.icoord.forEach((xs, i) => {
      const pts = xs.map((v, j) => `${F.num(x(v))},${F.num(y(d.dcoord[i][j]))}`).join(" ");
      out.push(`<polyline points="${pts}" fill="none" stroke="#555555" stroke-width="1"/>`);
    });
    for (const t of [0, top / 2, top]) {
      out.push(`<line x1="34" x2="38" y1="${F.num(y(t))}" y2="${F.num(y(t))}" stroke="#555555"/>`,
               F.text(30, y(t) + 4, t.toFixed(3), ' text-anchor="end" font-size="10"'));
    }
    d.leaves.forEach((u, i) => {
      const lx = x(5 + 10 * i);
      out.push(`<text class="as-hd-leaf" data-unit="${u}" x="${F.num(lx + 3)}" y="${F.num(y(0) + 6)}" ` +
               `transform="rotate(90 ${F.num(lx + 3)} ${F.num(y(0) + 6)})" font-size="${step >= 10 ? 10 : 8}" ` +
               `fill="${colourOf(data, u)}"><title>${F.esc(described(data, u))}</title>${F.esc(data.names[u])}</text>`);
    });
    out.push("</g>");
    return { body: out.join("\n"), width: 40 + n * step + 20, height: height + 50 };
  }

  // The map: one point per head at its MDS coordinates, coloured by its first label, named when there is room.
  function mapBody(data, x0, y0) {
    const xs = data.points.map((p) => p[0]);
    const ys = data.points.map((p) => p[1]);
    const [a, b, c, d] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
    const span = Math.max(b - a, d - c) || 1;
    const at = (p) => [x0 + 12 + ((p[0] - a) / span) * (MAP - 24), y0 + 22 + MAP - ((p[1] - c) / span) * (MAP - 24)];
    const named = data.names.length <= 96;
    const out = [`<g class="as-hd-map">`, F.text(x0, y0, "map of the heads (classical MDS of the JS distances)",
                                                   ' font-weight="600"'),
      `<rect x="${x0}" y="${y0 + 10}" width="${MAP}" height="${MAP + 12}" fill="none" stroke="#cccccc"/>`];
    data.points.forEach((p, u) => {
      const [px, py] = at(p);
      out.push(`<circle data-unit="${u}" cx="${F.num(px)}" cy="${F.num(py)}" r="5" fill="${colourOf(data, u)}" ` +
               `fill-opacity="0.85"><title>${F.esc(described(data, u))}</title></circle>`);
      if (named) out.push(F.text(px + 6, py - 4, data.names[u], ' font-size="8" fill="#333333"'));
    });
    out.push("</g>");
    return out.join("\n");
  }

  function legendBody(y) {
    return Object.entries(COLOURS).map(([label, colour], i) =>
      `<circle cx="${i * 110 + 5}" cy="${y - 4}" r="5" fill="${colour}"/>` + F.text(i * 110 + 14, y, label)).join("\n");
  }

  // room: the width the picture has (the page's panel); the map goes below the dendrogram where both do not fit side
  // by side, and in a figure (no room given) where the dendrogram is wide (many heads)
  function layout(data, room) {
    const den = dendrogramBody(data);
    const beside = room ? den.width + 30 + MAP + 10 <= room : den.width <= 1000;
    const [mapX, mapY] = beside ? [den.width + 30, 0] : [0, den.height + 30];
    const height = (beside ? Math.max(den.height, MAP + 40) : mapY + MAP + 40) + 30;
    const body = [`<g transform="translate(0 14)">`, den.body, mapBody(data, mapX, mapY), "</g>",
                  legendBody(height + 10)].join("\n");
    return { body: body, width: Math.max(den.width, mapX + MAP + 10), height: height + 20 };
  }

  A.headsSVG = function (data, options) {
    const l = layout(data);
    return F.svg(l.body, l.width, l.height, [data.title, data.note, "colour: each head's first label; " +
                 "heads named layer.head, 0-indexed"], options);
  };

  function countsTable(data) {
    const cmp = data.comparison;
    const head = cmp ? ["label", cmp.a, cmp.b] : ["label", "heads"];
    const rows = cmp ? Object.entries(cmp.counts) : Object.entries(data.label_counts).map(([k, v]) => [k, [v]]);
    return el("table", { class: "as-hd-table as-hd-counts" }, [
      el("thead", {}, [el("tr", {}, head.map((h) => el("th", { text: h })))]),
      el("tbody", {}, rows.map(([label, values]) => el("tr", {}, [el("td", {}, [
        el("span", { style: `color:${COLOURS[label] || "#333"}`, text: "● " }), document.createTextNode(label)]),
        ...values.map((v) => el("td", { class: "num", text: String(v) }))])))]);
  }

  function nearestTable(cmp) {
    const fmt = (labs) => (labs.length ? labs.join(", ") : "mixed");
    return el("table", { class: "as-hd-table as-hd-nearest" }, [
      el("thead", {}, [el("tr", {}, [`${cmp.a} head`, "labels", `nearest ${cmp.b} head`, "labels",
                                     "distance"].map((h) => el("th", { text: h })))]),
      el("tbody", {}, cmp.nearest.map((r) => el("tr", {}, [el("td", { text: r.head }), el("td", { text: fmt(r.labels) }),
        el("td", { text: r.other }), el("td", { text: fmt(r.other_labels) }),
        el("td", { class: "num", text: r.distance.toFixed(3) })])))]);
  }

  function svgElement(markup, w, h) {
    const ns = document.documentElement.namespaceURI.replace("1999/xhtml", "2000/svg");
    const doc = new DOMParser().parseFromString(`\x3csvg xmlns="${ns}" width="${w}" height="${h}" ` +
      `viewBox="0 0 ${w} ${h}" font-family="${F.esc(F.FONT)}" font-size="12">${markup}\x3c/svg>`, "image/svg+xml");
    return document.importNode(doc.documentElement, true);
  }

  A.renderHeads = function (element, data, onPick) {
    const pick = onPick || (() => {});
    const l = layout(data, Math.max(0, element.clientWidth - 24)); // .as-hd's margins; 0 (not laid out): a figure's
    const picture = svgElement(l.body, l.width, l.height);
    const picked = el("p", { class: "as-hd-picked", "aria-live": "polite" });
    picture.addEventListener("click", (e) => {
      const node = e.target.closest ? e.target.closest("[data-unit]") : null;
      if (!node) return;
      const u = Number(node.dataset.unit);
      const [layer, head] = [Math.floor(u / data.heads), u % data.heads];
      picked.textContent = described(data, u);
      pick(layer, head);
    });
    const figure = () => A.headsSVG(data);
    const parts = [
      el("h2", { text: data.title }, A.svgButton ? [A.svgButton(figure, "attnscope-heads.svg"),
                                                   A.pngButton(figure, "attnscope-heads.png")] : []),
      el("p", { class: "as-hd-note", text: `${data.note}. Click a head to see it.` }),
      el("div", { class: "as-hd-figure", style: "overflow-x:auto" }, [picture]), picked,
      el("h3", { text: data.comparison ? "behaviour labels of both models" : "behaviour labels" }), countsTable(data),
    ];
    if (data.comparison) {
      parts.push(el("h3", { text: `each ${data.comparison.a} head's nearest ${data.comparison.b} head by behaviour ` +
                                  `(${data.comparison.columns.join(", ")})` }), nearestTable(data.comparison));
    }
    element.replaceChildren(el("div", { class: "as-hd" }, parts));
    element.attnscopeFigure = (options) => A.headsSVG(data, options); // what attnscope.figureSVG(element) returns
    element.dataset.attnscopeReady = "1";
  };

  A.bootHeads = function () {
    const root = document.getElementById("attnscope-heads-root");
    const data = JSON.parse(document.getElementById("attnscope-heads").textContent);
    const trace = document.getElementById("attnscope-data");
    let views = null;
    const pick = async (layer, head) => {
      A.emit(root, "attnscope:select", { view: "heads", layer: layer, head: head, query: null, key: null });
      if (!views) return;
      const ctrl = await views;
      ctrl.set({ layer: layer, head: head, heads: [head] });
      if (ctrl.show) await ctrl.show("head");
      document.getElementById("attnscope-root").scrollIntoView({ behavior: "smooth" });
    };
    A.renderHeads(root, data, pick);
    if (trace) views = A.render(document.getElementById("attnscope-root"), JSON.parse(trace.textContent));
  };
})();
