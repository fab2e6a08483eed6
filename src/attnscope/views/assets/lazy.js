/* attnscope views: maps that stay on the server until shown (the web app on a long trace, attnscope.serve.maps).
   Lazy sources (scales and overviews first, each head or layer fetched on request), the maps a page holds, and
   model.map / model.ensure / model.holds / model.onMap, as data.js describes them; A.decode builds models with
   A.lazyMaps. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});

  // Lazy maps come from the web app only: its script (serve.js) sets A.getBinary(url) -> Promise<ArrayBuffer>.
  // A self-contained page carries every map and never reaches the network, so it has no such function.
  async function getArrays(url) {
    if (typeof A.getBinary !== "function") throw new Error("this page has no server to fetch " + url + " from");
    return A.decodeArrays(await A.getBinary(url));
  }

  const HELD_BYTES = 256 * 2 ** 20; // maps a page keeps fetched (the oldest layers leave first)
  // the map endpoint's query for a source; a words payload's maps are word maps (level=words, serve/wordmaps.py)
  const mapQuery = (payload, source) => new URLSearchParams(Object.assign({ source: source },
    payload.maps.level ? { level: payload.maps.level } : {}));

  // A source whose maps stay on the server until shown: scales and overviews now, each layer on request.
  function makeLazySource(spec, overview, payload, held) {
    const src = A.mapSource(spec, new Uint8Array(0), payload);
    const [nl, nh, nq, nk] = spec.shape;
    const [oq, ok] = spec.overview.shape;
    const layerOf = (layer) => (src.perLayer ? layer : null);
    const keyOf = (layer, head) => `${spec.name}:${layerOf(layer)}:${src.perHead ? head : null}`;
    const headAt = (head) => (spec.heads.length ? spec.heads.indexOf(head) : 0);
    const layerAt = (layer) => (spec.layers.length ? spec.layers.indexOf(layer) : 0);
    let scratch = null; // one n_query x n_key stand-in, rewritten per call (the model view reads it at once)
    src.lazy = true;
    src.loaded = (layer, head) => held.has(keyOf(layer, head));
    src.overview = (layer, head) => {
      const i = layerAt(layer) * nh + headAt(head);
      return { rows: oq, cols: ok, codes: overview.subarray(i * oq * ok, (i + 1) * oq * ok) };
    };
    src.codes = (layer, head) => {
      if (held.has(keyOf(layer, head))) return held.get(keyOf(layer, head)).codes; // [query * key]
      const o = src.overview(layer, head);
      scratch = scratch || new Uint8Array(nq * nk);
      const bq = Math.ceil(nq / oq);
      const bk = Math.ceil(nk / ok);
      for (let q = 0; q < nq; q++) {
        const from = Math.floor(q / bq) * ok;
        for (let k = 0; k < nk; k++) scratch[q * nk + k] = o.codes[from + Math.floor(k / bk)];
      }
      return scratch;
    };
    src.value = (layer, head, q, k) => (src.codes(layer, head)[q * nk + k] / 255) * src.scale(layer, head);
    // one head of one layer as uint8, as stored on the server (a source without heads: its layer's map)
    src.load = (layer, head) => {
      const key = keyOf(layer, head);
      if (held.get(key)) return held.get(key).ready;
      const query = mapQuery(payload, spec.name);
      if (src.perLayer) query.set("layer", String(layer));
      if (src.perHead) query.set("head", String(head));
      const entry = { codes: null, ready: null };
      entry.ready = getArrays(`${payload.maps.url}?${query}`).then(({ arrays }) => {
        entry.codes = arrays[spec.name].values;
        held.keep(key, entry, entry.codes.byteLength);
        return entry;
      });
      held.pending(key, entry);
      entry.ready.catch(() => held.drop(key));
      return entry.ready;
    };
    // the heads of one layer not held yet, in one request (the whole layer: one answer costs less than eight)
    src.loadLayer = (layer) => {
      const missing = src.heads.filter((h) => !held.get(keyOf(layer, h)));
      if (!src.perHead || !missing.length) return Promise.all(missing.map((h) => src.load(layer, h)));
      const query = mapQuery(payload, spec.name);
      if (src.perLayer) query.set("layer", String(layer));
      const all = getArrays(`${payload.maps.url}?${query}`);
      for (const h of missing) {
        const entry = { codes: null, ready: null };
        entry.ready = all.then(({ arrays }) => { // [head, query, key]
          entry.codes = arrays[spec.name].values.subarray(headAt(h) * nq * nk, (headAt(h) + 1) * nq * nk);
          held.keep(keyOf(layer, h), entry, entry.codes.byteLength);
          return entry;
        });
        held.pending(keyOf(layer, h), entry);
        entry.ready.catch(() => held.drop(keyOf(layer, h)));
      }
      return all;
    };
    return src;
  }

  const HELD = new WeakMap(); // payload -> its fetched maps (kept when the page draws another view)

  // Fetched layers by key, the oldest dropped past HELD_BYTES; pending ones count once they arrive.
  function heldMaps() {
    const done = new Map();
    const waiting = new Map();
    let bytes = 0;
    const listeners = new Set();
    return {
      listen: (fn) => (listeners.add(fn), () => listeners.delete(fn)),
      has: (key) => done.has(key),
      get: (key) => done.get(key) || waiting.get(key) || null,
      pending: (key, entry) => waiting.set(key, entry),
      drop: (key) => waiting.delete(key),
      keep(key, entry, size) {
        waiting.delete(key);
        done.set(key, Object.assign(entry, { size: size }));
        bytes += size;
        for (const [old, e] of done) {
          if (bytes <= HELD_BYTES || old === key) break;
          done.delete(old);
          bytes -= e.size;
        }
        for (const fn of listeners) fn(key);
      },
    };
  }

  // model.map and model.ensure (see the top of this file).
  function mapAccess(sources, payload, held) {
    const pick = (name) => sources.get(name || "weights") || sources.values().next().value;
    return {
      async map(layer, head, options) {
        const o = options || {};
        const src = pick(o.source);
        if ((o.precision || "uint8") === "uint8") {
          if (src.lazy) await src.load(layer, head);
          return { n_query: src.nq, n_key: src.nk, values: src.codes(layer, head), scale: src.scale(layer, head) };
        }
        if (!payload.maps) throw new Error("exact maps come from the server: this page has uint8 maps only");
        const query = mapQuery(payload, src.name);
        query.set("precision", o.precision);
        if (src.perLayer) query.set("layer", String(layer));
        if (src.perHead) query.set("head", String(head));
        const { arrays } = await getArrays(`${payload.maps.url}?${query}`);
        return { n_query: src.nq, n_key: src.nk, values: arrays[src.name].values, scale: src.scale(layer, head) };
      },
      holds: (state) => !pick(state.source).lazy || firstHeads(pick(state.source), state)
        .every((h) => pick(state.source).loaded(state.layer, h)),
      ensure: async (state) => {
        const src = pick(state.source);
        if (!src.lazy) return;
        await Promise.all(firstHeads(src, state).map((h) => src.load(state.layer, h)));
        // the rest in the background, once the frame that shows the first is out (they would delay it)
        const each = () => src.heads.forEach((h) => src.load(state.layer, h).catch(() => null));
        const rest = () => src.loadLayer(state.layer).catch(() => setTimeout(each, 0)); // a layer over the server's
        // response limit: one head at a time (once the failed entries are dropped)
        requestAnimationFrame(() => setTimeout(rest, 0));
        setTimeout(rest, 1000); // a hidden tab has no frames (a map already asked for is not asked again)
      },
      onMap: (fn) => held.listen(fn),
    };
  }

  // The heads a state shows first: the selected head, or every selected head when it shows their mean.
  function firstHeads(src, state) {
    if (!src.perHead) return [null];
    const picked = (state.heads || []).filter((h) => src.heads.includes(h));
    if (state.meanHeads && picked.length) return picked;
    const head = src.heads.includes(state.head) ? state.head : picked.length ? picked[0] : src.heads[0];
    return [head];
  }

  // A neuron block sent in the binary form (POST /api/neuron with Accept: application/x-attnscope-arrays; its
  // header has the JSON block's fields, each stage an array of its own) -> the decoded block the neuron view
  // reads, as data.js decodes a JSON block: float32 views of the answer's bytes per stage, d, scaling; and query
  // when the block holds one query's row (q, context, scores, weights [1, ...]; k and v every key's).
  A.neuronFromArrays = function ({ header, arrays }) {
    const parts = {};
    for (const s of header.stages) {
      if (!arrays[s] || arrays[s].spec.dtype !== "float32") throw new Error(`neuron data without float32 ${s}`);
      parts[s] = arrays[s].values;
    }
    const row = header.query === undefined ? {} : { query: header.query };
    return Object.assign(parts, row, { layer: header.layer, head: header.head, d: header.d_head, scaling: header.scaling });
  };

  A.lazyMaps = {
    source: makeLazySource,
    held(payload) {
      const held = HELD.get(payload) || heldMaps();
      HELD.set(payload, held);
      return held;
    },
    access: mapAccess,
  };
})();
