/* attnscope views: selections across views. Several query tokens at once (shift-click), and "mean of the
   selected heads" as what the head view draws: one map per layer, the mean of the heads picked in its chips. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});

  // The raw weights' mean over `heads()` per layer, as a source (8-bit again, with its own max as scale).
  A.meanOfHeads = function (weights, heads) {
    const n = weights.nq * weights.nk;
    let last = { key: null };
    function map(layer) {
      const chosen = heads().filter((h) => weights.heads.includes(h));
      const key = `${layer}:${chosen.join(",")}`;
      if (last.key === key) return last;
      const mean = new Float64Array(n); // [query * key]
      let step = 0;
      for (const h of chosen) {
        const codes = weights.codes(layer, h);
        const unit = weights.scale(layer, h) / 255;
        for (let i = 0; i < n; i++) mean[i] += (codes[i] * unit) / chosen.length;
        step += weights.step(layer, h) / chosen.length;
      }
      let max = 0;
      for (let i = 0; i < n; i++) max = Math.max(max, mean[i]);
      const codes = new Uint8Array(n);
      if (max > 0) for (let i = 0; i < n; i++) codes[i] = Math.round((mean[i] / max) * 255);
      last = { key: key, codes: codes, scale: max, step: step + max / 510, heads: chosen };
      return last;
    }
    return Object.assign({}, weights, {
      name: "mean_heads",
      label: "mean of the selected heads",
      perHead: false,
      heads: [null],
      codes: (layer) => map(layer).codes,
      scale: (layer) => map(layer).scale,
      top: () => 1, // a mean of weights is still a weight: drawn absolute
      value: (layer, head, q, k) => (map(layer).codes[q * weights.nk + k] / 255) * map(layer).scale,
      step: (layer) => map(layer).step,
      selected: (layer) => map(layer).heads,
    });
  };

  // What the head view draws: the chosen source, or the mean of the selected heads when asked for.
  A.headSource = function (model, state) {
    const src = model.sources.get(state.source) || model.sources.values().next().value;
    if (!state.meanHeads || src.name !== "weights" || !src.perHead) return src;
    const memo = (model.memo = model.memo || {});
    if (!memo.mean || memo.meanState !== state.heads) {
      const heads = state.heads;
      memo.mean = A.meanOfHeads(src, () => heads);
      memo.meanState = heads;
    }
    return memo.mean;
  };

  // The query tokens selected: several after shift-clicks, else the one picked, else none.
  A.selectedQueries = (state) =>
    (state.queries && state.queries.length ? state.queries : state.query === null || state.query === undefined
      ? [] : [state.query]);

  // Shift-click toggles `q` in the selection; a plain click selects it alone.
  A.pickQuery = function (state, q, shift) {
    if (!shift) return { query: q, queries: null };
    const on = new Set(A.selectedQueries(state));
    on.has(q) ? on.delete(q) : on.add(q);
    const queries = [...on].sort((a, b) => a - b);
    return { query: queries.length ? (on.has(q) ? q : queries[0]) : null, queries: queries.length > 1 ? queries : null };
  };
})();
