/* attnscope views: decode a payload (attnscope.views.payload) into maps, exact neuron data and helpers
   (a lazily sent trace's maps: lazy.js).

   The data interface the views draw with (model = await attnscope.decode(payload)):
     model.sources: Map name -> source; a source answers synchronously for maps it holds:
       src.codes(layer, head) -> Uint8Array [n_query * n_key] (value = code / 255 * src.scale(layer, head)),
       src.scale(layer, head), src.value(layer, head, q, k), src.top(layer, head), src.nq, src.nk.
     model.map(layer, head, {source, precision}) -> Promise<{n_query, n_key, values, scale}>: one map, fetched
       when the page does not hold it. precision "uint8" (default): values Uint8Array codes, a value is
       values[i] / 255 * scale; "float32": values Float32Array, the trace's numbers bit for bit (scale: the max).
     model.lazy: true when the payload came without its maps (the web app on a long trace, attnscope.serve.maps);
       then model.ensure(state) -> Promise loads what state {source, layer, head, heads, meanHeads} needs first (the
       selected head; every selected head for their mean), one head per request, then the layer's other heads
       in the background (one request for the layer; one per head when the layer is over the server's limit); model.holds(state) says whether that is there; model.onMap(fn) calls fn
       as each map arrives (returns a function that stops it); for a map not held yet src.codes() answers from
       src.overview(layer, head) -> {rows, cols, codes} (at most 64 x 64, each the max of its block, same scale),
       scaled up to n_query x n_key (a stand-in: src.loaded(layer, head) is false). A words payload (payload.level
       "words", serve/wordmaps.py) is lazy the same way: its maps are word maps (level=words), n = its words.
   Layers, heads and tokens are 0-indexed. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});

  function base64Bytes(text) {
    if (typeof Uint8Array.fromBase64 === "function") return Uint8Array.fromBase64(text);
    const bin = atob(text);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  async function inflate(bytes) {
    // zlib stream -> bytes, in the browser itself (no library, no request)
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  async function unpack(encoding, text) {
    const raw = base64Bytes(text);
    return encoding.endsWith("+zlib") ? inflate(raw) : raw;
  }

  // One [query, key] array of the trace, as uint8 codes with one scale per matrix.
  function makeSource(spec, codes, payload) {
    const [nl, nh, nq, nk] = spec.shape;
    const size = nq * nk;
    const layerAt = (layer) => (spec.layers.length ? spec.layers.indexOf(layer) : 0);
    const headAt = (head) => (spec.heads.length ? spec.heads.indexOf(head) : 0);
    const index = (layer, head) => layerAt(layer) * nh + headAt(head);
    return {
      name: spec.name,
      label: spec.label,
      range: spec.range,
      perLayer: spec.layers.length > 0,
      perHead: spec.heads.length > 0,
      layers: spec.layers.length ? spec.layers : [null],
      heads: spec.heads.length ? spec.heads : [null],
      nq: nq,
      nk: nk,
      count: nl * nh,
      codes(layer, head) {
        const i = index(layer, head);
        return codes.subarray(i * size, (i + 1) * size);
      },
      scale(layer, head) {
        return spec.scales[index(layer, head)];
      },
      // what 1.0 of colour or opacity means: weights are absolute, other sources per matrix
      top(layer, head) {
        return spec.range === "unit" ? 1 : spec.scales[index(layer, head)] || 1;
      },
      value(layer, head, q, k) {
        return (codes[index(layer, head) * size + q * nk + k] / 255) * spec.scales[index(layer, head)];
      },
      step(layer, head) {
        return spec.scales[index(layer, head)] / 510; // the largest quantization error
      },
      payload: payload,
    };
  }

  // Exact float32 numbers of one head for the neuron view, in the block's order of stages: q, k, v, context
  // [token, d_head]; scores, weights [query, key] (older blocks carry q, k, scores, weights only).
  // nk: the keys' count (cross-attention: the source tokens, so k and v are [nk, d_head]); else n.
  async function decodeBlock(block, n, nk) {
    const bytes = await unpack(block.encoding, block.data);
    const f = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
    const d = block.d_head;
    const parts = {};
    let at = 0;
    const stages = block.stages || ["q", "k", "scores", "weights"];
    const sizes = { q: n * d, context: n * d, k: nk * d, v: nk * d, scores: n * nk, weights: n * nk,
                    position_bias: n * nk };
    for (const [name, len] of stages.map((s) => [s, sizes[s]])) {
      parts[name] = f.subarray(at, at + len);
      at += len;
    }
    if (at !== f.length) throw new Error(`neuron data of layer ${block.layer} head ${block.head} has the wrong size`);
    return Object.assign(parts, { layer: block.layer, head: block.head, d: d, scaling: block.scaling });
  }

  // ---- the binary form (attnscope.serve.binary): magic, header length, JSON header, aligned arrays ----

  const MAGIC = "ATNSARR1";
  const TYPED = { float32: Float32Array, float16: null, uint8: Uint8Array };

  // An application/x-attnscope-arrays body -> {header, arrays: name -> {spec, values}}; values view the buffer
  // (no copy). float16 arrives as raw Uint16Array bits (Float16Array where the browser has it).
  A.decodeArrays = function (buffer) {
    const bytes = new Uint8Array(buffer);
    if (String.fromCharCode(...bytes.subarray(0, 8)) !== MAGIC) throw new Error("not an attnscope arrays body");
    const size = new DataView(buffer).getUint32(8, true);
    const header = JSON.parse(new TextDecoder().decode(bytes.subarray(16, 16 + size)));
    const arrays = {};
    for (const [name, spec] of Object.entries(header.arrays)) {
      const Type = TYPED[spec.dtype] || (typeof Float16Array === "function" ? Float16Array : Uint16Array);
      arrays[name] = { spec: spec, values: new Type(buffer, 16 + size + spec.offset, spec.nbytes / Type.BYTES_PER_ELEMENT) };
    }
    return { header: header, arrays: arrays };
  };

  A.mapSource = makeSource; // lazy.js builds its sources on it

  // The play button and step slider of the generation and translation views: setStep(i) shows step i, start()
  // plays from the step shown (from the first at the end) one step per 700 ms, stop() pauses, and moving the
  // slider pauses. `steps` may grow while it plays (a generation streamed step by step).
  A.stepPlayer = function (state, steps, slider, play, draw) {
    const setStep = (i) => {
      state.step = Math.max(0, Math.min(i, steps.length - 1));
      slider.value = String(state.step);
      draw();
    };
    const stop = () => {
      clearInterval(state.timer);
      state.timer = null;
      play.textContent = "▶ play";
    };
    const start = () => {
      if (state.step >= steps.length - 1) setStep(0);
      play.textContent = "⏸ pause";
      state.timer = setInterval(() => (state.step >= steps.length - 1 ? stop() : setStep(state.step + 1)), 700);
    };
    play.addEventListener("click", () => (state.timer ? stop() : start()));
    slider.addEventListener("input", () => { stop(); setStep(Number(slider.value)); });
    return { setStep, stop, start };
  };

  A.decode = async function (payload) {
    if (!payload || payload.format !== "attnscope.views/1") {
      throw new Error("not an attnscope views payload (format attnscope.views/1)");
    }
    const sources = new Map();
    const held = A.lazyMaps.held(payload); // drawn again (another view): the layers fetched stay (lazy.js)
    for (const spec of payload.sources) {
      sources.set(spec.name, spec.encoding === "lazy"
        ? A.lazyMaps.source(spec, await unpack(spec.overview.encoding, spec.overview.data), payload, held)
        : makeSource(spec, await unpack(spec.encoding, spec.data), payload));
    }
    const n = payload.tokens.length;
    const blocks = new Map();
    const ready = new Map(); // decoded blocks, for code that cannot wait
    const keep = (b) => {
      const key = `${b.layer}:${b.head}`;
      const p = decodeBlock(b, n, payload.key_tokens ? payload.key_tokens.length : n).then((d) => (ready.set(key, d), d));
      blocks.set(key, p);
      return p;
    };
    for (const b of payload.neuron.blocks) keep(b);
    await Promise.all(blocks.values());
    return {
      payload: payload,
      n: n,
      tokens: payload.tokens,
      segments: payload.segments,
      special: payload.special,
      layers: payload.layers,
      heads: payload.heads,
      causal: !!payload.causal,
      pair: payload.segments.some((s) => s > 0),
      sources: sources,
      blocks: blocks,
      check: payload.check,
      neuronBlock(layer, head) {
        return blocks.get(`${layer}:${head}`) || null;
      },
      readyBlock(layer, head) {
        return ready.get(`${layer}:${head}`) || null;
      },
      addBlock: keep,
      lazy: payload.sources.some((s) => s.encoding === "lazy"),
      ...A.lazyMaps.access(sources, payload, held),
    };
  };

  // ---- numbers and colours -------------------------------------------------------------

  // One number format (attnscope.numbers): values with 4 decimals, errors as 5.4e-07 (2 significant digits).
  A.fmt = function (v) {
    if (typeof v === "string") return v;
    if (Number.isNaN(v)) return "nan";
    if (!Number.isFinite(v)) return v < 0 ? "-inf" : "inf";
    return v.toFixed(4);
  };
  A.fmtError = function (e) {
    if (typeof e === "string") return e;
    const [m, x] = e.toExponential(1).split("e");
    return `${m}e${x[0]}${x.slice(1).padStart(2, "0")}`;
  };
  A.SCALING_RULE = "÷ sqrt(d_head) = × 1/sqrt(d_head)";
  A.scalingText = function (d, scaling) {
    const root = Math.sqrt(d);
    if (Math.abs(scaling - 1 / root) < 1e-7) return `${A.SCALING_RULE}: ÷ sqrt(${d}) = ÷ ${A.fmt(root)} = × ${A.fmt(1 / root)}`;
    return `× ${A.fmt(scaling)} (this layer's own scaling, not 1/sqrt(d_head) = ${A.fmt(1 / root)})`;
  };

  function hexRgb(hex) {
    const v = parseInt(hex.slice(1), 16);
    return [(v >> 16) & 255, (v >> 8) & 255, v & 255];
  }

  function ramp(stops) {
    const rgb = stops.map(hexRgb);
    const lut = new Uint8ClampedArray(256 * 4);
    for (let i = 0; i < 256; i++) {
      const t = (i / 255) * (rgb.length - 1);
      const j = Math.min(rgb.length - 2, Math.floor(t));
      const f = t - j;
      for (let c = 0; c < 3; c++) lut[i * 4 + c] = rgb[j][c] + (rgb[j + 1][c] - rgb[j][c]) * f;
      lut[i * 4 + 3] = 255;
    }
    return lut;
  }

  const LUTS = {
    light: ramp(["#ffffff", "#deebf7", "#9ecae1", "#4292c6", "#08519c", "#08306b"]),
    dark: ramp(["#10131a", "#3b1f5c", "#8c2981", "#de4968", "#fe9f6d", "#fcfdbf"]),
  };
  A.lut = (theme) => LUTS[theme === "dark" ? "dark" : "light"];

  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                   "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a"];
  A.headColour = function (head, count) {
    if (head === null) return "#4c78a8";
    if (count <= PALETTE.length) return PALETTE[head % PALETTE.length];
    return `hsl(${Math.round((head * 360) / count)}, 65%, 50%)`;
  };

  // Diverging colour for a signed number: blue below zero, orange above, strength |v| / max, from the theme's
  // base colour. divergingInto writes it as bytes at out[at..at+3] with alpha 255 (the neuron view fills its
  // canvases from them); diverging says the same colour as a CSS string.
  const [LIGHT, DARK, NEGATIVE, POSITIVE] = [[255, 255, 255], [24, 27, 34], [33, 102, 172], [230, 97, 1]];
  A.divergingInto = function (out, at, v, max, theme) {
    const t = max > 0 ? Math.min(1, Math.abs(v) / max) : 0;
    const base = theme === "dark" ? DARK : LIGHT;
    const end = v < 0 ? NEGATIVE : POSITIVE;
    for (let i = 0; i < 3; i++) out[at + i] = Math.round(base[i] + (end[i] - base[i]) * t);
    out[at + 3] = 255;
  };
  const one = new Uint8ClampedArray(4);
  A.diverging = function (v, max, theme) {
    A.divergingInto(one, 0, v, max, theme);
    return `rgb(${one[0]},${one[1]},${one[2]})`;
  };

  A.emit = function (el, type, detail) {
    el.dispatchEvent(new CustomEvent(type, { detail: detail, bubbles: true }));
  };

  // Small DOM helper: el("div", {class: "x", text: "..."}, children). Text always goes in as text.
  A.el = function (tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = v;
      else if (k === "class") node.className = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children || []) if (c) node.append(c);
    return node;
  };

  // A token on one line: a newline, tab or carriage return in its text (the tokenizer's decoding of "Ċ" is "\n")
  // drawn as a visible mark, so that a label never breaks or loses it.
  A.oneLine = (s) => String(s).replace(/\r\n|\n/g, "↵").replace(/\t/g, "⇥").replace(/\r/g, "␍");
  A.tokenLabel = (model, i) => `${i}: ${A.oneLine(model.tokens[i])}`;

  // A canvas sized in CSS pixels and drawn at the screen's pixel density.
  A.canvas = function (width, height, cls) {
    const c = A.el("canvas", { class: cls || null });
    A.sizeCanvas(c, width, height);
    return c;
  };
  A.sizeCanvas = function (c, width, height) {
    const dpr = Math.min(2, window.devicePixelRatio || 1);
    c.width = Math.max(1, Math.round(width * dpr));
    c.height = Math.max(1, Math.round(height * dpr));
    c.style.width = `${width}px`;
    c.style.height = `${height}px`;
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    return g;
  };

  A.cssVar = (el, name) => getComputedStyle(el).getPropertyValue(name).trim();
})();
