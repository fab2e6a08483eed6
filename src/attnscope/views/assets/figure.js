/* attnscope views: the frame of every figure. One SVG document (a white background, a caption wrapped at the
   figure's width, the body below it) cut to what it draws: the browser lays the markup out and its bounding
   box, with a small margin, becomes the viewBox (a tight box, no white band beside a long caption). Colour
   bars say what a heatmap's colours mean. export.js and neuron-figure.js draw the views into this frame. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const F = (A.fig = A.fig || {});
  F.FONT = "system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif"; // generic: no font to embed
  F.FG = "#111111";
  F.MUTED = "#555555";
  const PAD = 8; // px of white around the drawn content
  const CAPTION_MIN = 320; // px: a narrow figure's caption wraps at this width rather than at the figure's
  const BANDS = 64; // a colour bar's bands, from its top value down to its bottom one
  const BAR = 12; // px: a colour bar's thickness
  // the SVG namespace is a name, not an address: derived from the page's own so that the page spells no URL
  const SVG_NS = () => document.documentElement.namespaceURI.replace("1999/xhtml", "2000/svg");

  // XML text: markup characters escaped, characters XML 1.0 cannot carry shown as U+FFFD.
  F.esc = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`)
    .replace(/[\u0000-\u0008\u000b\u000c\u000e-\u001f\ufffe\uffff]/g, "\ufffd");
  F.num = (v) => (Math.round(v * 100) / 100).toString();
  F.text = (x, y, s, extra) => `<text x="${F.num(x)}" y="${F.num(y)}"${extra || ""}>${F.esc(s)}</text>`;
  F.width = (s, size) => String(s).length * size * 0.6; // generous estimate, for layout before measuring
  F.blank = (s) => s === null || s === undefined || String(s).trim() === "";
  // A caption line: its non-blank fields joined by " · " (a missing or empty field is left out, never shown empty).
  F.fields = (...parts) => parts.filter((s) => !F.blank(s)).join(" · ");

  let ruler = null; // a canvas context: text widths in the figure's font
  function measure(s, size, bold) {
    ruler = ruler || document.createElement("canvas").getContext("2d");
    ruler.font = `${bold ? "600 " : ""}${size}px ${F.FONT}`;
    return ruler.measureText(s).width;
  }

  // One caption line broken at its " · " separators into lines at most `limit` px wide (a field wider than the
  // limit keeps a line of its own); joined again with " · ", the lines give the line back.
  function wrap(line, limit, bold) {
    const out = [];
    for (const part of line.split(" · ")) {
      const joined = out.length ? `${out[out.length - 1]} · ${part}` : part;
      if (out.length && measure(joined, 13, bold) <= limit) out[out.length - 1] = joined;
      else out.push(part);
    }
    return out;
  }

  const head = (x, y, w, h) => `\x3csvg xmlns="${SVG_NS()}" version="1.1" width="${w}" height="${h}" ` +
    `viewBox="${x} ${y} ${w} ${h}" font-family="${F.esc(F.FONT)}" font-size="12" fill="${F.FG}">`;

  // The box the browser draws `inner` in (an SVG element's user units), or null outside a page: laid out in a
  // shadow root, so that the page's own styles cannot change the measure.
  F.bbox = function (inner) {
    if (typeof document === "undefined" || !document.body || typeof DOMParser === "undefined") return null;
    // \x3c opens the tags: the page holds no literal markup (its tests look for injected tags)
    const doc = new DOMParser().parseFromString(`${head(0, 0, 100, 100)}${inner}\x3c/svg>`, "image/svg+xml");
    if (doc.getElementsByTagName("parsererror").length) return null;
    const host = document.createElement("div");
    host.style.cssText = "position:absolute;left:-100000px;top:0;visibility:hidden";
    const node = document.importNode(doc.documentElement, true);
    (host.attachShadow ? host.attachShadow({ mode: "open" }) : host).append(node);
    document.body.append(host);
    try {
      const b = node.getBBox();
      return b.width > 0 && b.height > 0 ? { x: b.x, y: b.y, width: b.width, height: b.height } : null;
    } finally {
      host.remove();
    }
  };

  // The whole document: white background, caption lines on top (unless options.caption is false), the body below
  // them, cut to the drawn box. w, h: the body's size as laid out (used where nothing can be measured).
  F.svg = function (body, w, h, given, options) {
    const captioned = !(options && options.caption === false);
    const lines = captioned ? given.filter((l) => !F.blank(l)) : []; // no empty line (a step with no badge)
    const drawn = F.bbox(`<g>${body}</g>`);
    const limit = Math.max(drawn ? drawn.width : w, CAPTION_MIN);
    const wrapped = lines.flatMap((l, i) => (drawn ? wrap(l, limit, i === 0) : [l]).map((s) => [s, i]));
    const top = wrapped.length ? 14 + wrapped.length * 18 : 0;
    const cap = wrapped.map(([l, i], r) => F.text(12, 22 + r * 18, l, i ? ` fill="${F.MUTED}"` : ' font-weight="600"'))
      .join("");
    const inner = (captioned ? `<g class="caption" font-size="13">${cap}</g>\n` : "") +
      `<g class="body" transform="translate(12 ${top})">\n${body}\n</g>\n`;
    const fallback = { x: 0, y: 0, width: Math.max(w, ...lines.map((l) => F.width(l, 13))) + 24, height: h + top + 12 };
    const box = F.bbox(inner) || fallback;
    const [x0, y0] = [Math.floor(box.x - PAD), Math.floor(box.y - PAD)];
    const [W, H] = [Math.ceil(box.x + box.width + PAD) - x0, Math.ceil(box.y + box.height + PAD) - y0];
    return `<?xml version="1.0" encoding="UTF-8"?>\n${head(x0, y0, W, H)}\n` +
      `<rect class="background" x="${x0}" y="${y0}" width="${W}" height="${H}" fill="#ffffff"/>\n${inner}\x3c/svg>\n`;
  };

  // A vertical colour bar at (x, y), `height` px tall: BANDS bands from colour(1) at the top to colour(0) at the
  // bottom, labelled with the values they stand for (top, bottom) and what the colour is (title, above it).
  F.colourBar = function (x, y, height, colour, ends, title) {
    const band = height / BANDS;
    const out = [`<g class="colourbar" data-min="${ends[1]}" data-max="${ends[0]}">`,
      F.text(x, y - 8, title, ' class="title"')];
    for (let i = 0; i < BANDS; i++) {
      out.push(`<rect x="${F.num(x)}" y="${F.num(y + i * band)}" width="${BAR}" height="${F.num(band + 0.4)}" ` +
               `fill="${colour(1 - i / (BANDS - 1))}"/>`);
    }
    out.push(`<rect x="${F.num(x)}" y="${F.num(y)}" width="${BAR}" height="${F.num(height)}" fill="none" ` +
             `stroke="${F.MUTED}" stroke-width="0.5"/>`,
             F.text(x + BAR + 4, y + 9, ends[2] || A.fmt(ends[0]), ' class="max"'),
             F.text(x + BAR + 4, y + height, ends[1] === 0 ? "0" : A.fmt(ends[1]), ' class="min"'), "</g>");
    return out.join("\n");
  };

  // A horizontal diverging bar at (x, y), `length` px long, for signed numbers: -top (blue) to +top (orange).
  F.divergingBar = function (x, y, length, top, title) {
    const band = length / BANDS;
    const out = [`<g class="colourbar" data-min="${-top}" data-max="${top}">`,
      F.text(x, y - 4, title, ' class="title"')];
    for (let i = 0; i < BANDS; i++) {
      const v = -top + (2 * top * i) / (BANDS - 1);
      out.push(`<rect x="${F.num(x + i * band)}" y="${y}" width="${F.num(band + 0.4)}" height="${BAR}" ` +
               `fill="${A.diverging(v, top, "light")}"/>`);
    }
    out.push(`<rect x="${F.num(x)}" y="${y}" width="${F.num(length)}" height="${BAR}" fill="none" ` +
             `stroke="${F.MUTED}" stroke-width="0.5"/>`,
             F.text(x, y + BAR + 12, A.fmt(-top), ' class="min"'),
             F.text(x + length / 2, y + BAR + 12, "0", ' text-anchor="middle" class="zero"'),
             F.text(x + length, y + BAR + 12, A.fmt(top), ' text-anchor="end" class="max"'), "</g>");
    return out.join("\n");
  };
})();
