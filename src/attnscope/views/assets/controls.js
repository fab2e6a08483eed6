/* attnscope views: shared state, and the controls every view reuses (layer, head, source, query, badge). */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const el = (...a) => A.el(...a);

  // A tiny store: set(patch) notifies subscribers with (state, patch).
  A.store = function (initial) {
    let state = Object.assign({}, initial);
    const subs = new Set();
    return {
      get: () => state,
      set(patch) {
        state = Object.assign({}, state, patch);
        for (const f of Array.from(subs)) f(state, patch);
      },
      subscribe(f) {
        subs.add(f);
        return () => subs.delete(f);
      },
    };
  };

  // What a view draws with: the model, the shared store, and its own list of things to undo.
  A.context = function (root, model, store, options) {
    const disposers = [];
    const ctx = {
      root: root,
      model: model,
      options: options || {},
      get state() {
        return store.get();
      },
      set: (patch) => store.set(patch),
      subscribe(f) {
        disposers.push(store.subscribe(f));
      },
      onDispose: (f) => disposers.push(f),
      dispose() {
        while (disposers.length) disposers.pop()();
      },
      scoped: (extra) => A.context(root, model, store, Object.assign({}, ctx.options, extra || {})),
      emit(type, detail) {
        A.emit(root, type, detail);
      },
      theme: () => (root.querySelector(".as-app") || root).dataset.theme || "light",
      source() {
        return model.sources.get(store.get().source) || model.sources.values().next().value;
      },
      changed: (patch, keys) => keys.some((k) => k in patch),
    };
    return ctx;
  };

  const C = (A.controls = {});

  function labelled(text, control) {
    return el("label", { class: "as-control" }, [el("span", { text: text }), control]);
  }

  C.layer = function (ctx) {
    const select = el("select", { "aria-label": "layer (0-indexed)" });
    for (const l of ctx.model.layers) select.append(el("option", { value: String(l), text: String(l) }));
    const sync = () => {
      select.value = String(ctx.state.layer);
      select.disabled = !ctx.source().perLayer;
    };
    select.addEventListener("change", () => ctx.set({ layer: Number(select.value) }));
    ctx.subscribe((s, p) => ctx.changed(p, ["layer", "source"]) && sync());
    sync();
    return labelled("layer", select);
  };

  // In a causal model position 0 reads only itself, so every path that reaches it ends on token 0: rollout over
  // many layers piles up there, which looks broken without a word (the CLI's rollout says the same).
  const CAUSAL_ROLLOUT = "causal model: position 0 reads only itself, so rollout piles up on token 0 in later layers";

  C.source = function (ctx) {
    if (ctx.model.sources.size < 2) return null;
    const select = el("select", { "aria-label": "what to draw" });
    for (const s of ctx.model.sources.values()) select.append(el("option", { value: s.name, text: s.label }));
    const note = el("span", { class: "as-muted as-source-note", text: CAUSAL_ROLLOUT });
    const sync = () => {
      select.value = ctx.source().name;
      note.hidden = !(ctx.model.causal && ctx.source().name === "rollout");
    };
    select.addEventListener("change", () => ctx.set({ source: select.value }));
    ctx.subscribe((s, p) => "source" in p && sync());
    sync();
    const control = labelled("show", select);
    control.append(note);
    return control;
  };

  // Head chips: "multi" toggles the heads drawn together, "single" picks one head.
  C.heads = function (ctx, mode) {
    const box = el("div", { class: "as-chips", role: "group", "aria-label": "heads (0-indexed)" });
    const count = ctx.model.payload.model.heads || ctx.model.heads.length;
    const chips = ctx.model.heads.map((h) => {
      const chip = el("button", { type: "button", class: "as-chip", "data-head": String(h), text: String(h),
                                  title: `head ${h}` });
      chip.style.setProperty("--chip", A.headColour(h, count));
      chip.addEventListener("click", () => pick(h));
      return chip;
    });
    function pick(h) {
      if (mode === "single") return ctx.set({ head: h });
      const on = new Set(ctx.state.heads);
      on.has(h) ? on.delete(h) : on.add(h);
      ctx.set({ heads: ctx.model.heads.filter((x) => on.has(x)) });
    }
    function sync() {
      const perHead = ctx.source().perHead;
      box.classList.toggle("as-disabled", !perHead);
      for (const chip of chips) {
        const h = Number(chip.dataset.head);
        const on = mode === "single" ? h === ctx.state.head : ctx.state.heads.includes(h);
        chip.setAttribute("aria-pressed", String(on));
        chip.disabled = !perHead;
      }
    }
    ctx.subscribe((s, p) => ctx.changed(p, ["heads", "head", "source"]) && sync());
    sync();
    const parts = [el("span", { class: "as-control-name", text: "heads" }), ...chips];
    if (mode !== "single") {
      parts.push(el("button", { type: "button", class: "as-link", text: "all",
                                onclick: () => ctx.set({ heads: ctx.model.heads.slice() }) }));
      parts.push(el("button", { type: "button", class: "as-link", text: "none", onclick: () => ctx.set({ heads: [] }) }));
    }
    box.append(...parts);
    return box;
  };

  // The tokens the keys run over: a cross-attention's source tokens (payload "key_tokens"), else the queries' own.
  A.keys = function (model) {
    const p = model.payload;
    if (!model.keyInfo) {
      model.keyInfo = p.key_tokens
        ? { tokens: p.key_tokens, special: p.key_special, segments: p.key_segments, n: p.key_tokens.length }
        : { tokens: model.tokens, special: model.special, segments: model.segments, n: model.n };
    }
    return model.keyInfo;
  };
  A.keyLabel = (model, j) => `${j}: ${A.oneLine(A.keys(model).tokens[j])}`;

  // An encoder-decoder page: kind -> payload for the encoder, decoder and cross-attention (views/kinds.py), kept
  // on the element so that the payload drawn now, whichever kind it is, finds the others; null on other pages.
  A.kindFamily = function (ctx) {
    const p = ctx.model.payload;
    if (p.kinds) {
      const family = {};
      for (const [kind, other] of Object.entries(p.kinds)) family[kind] = other || p;
      ctx.root.attnscopeKinds = family;
      return family;
    }
    const known = ctx.root.attnscopeKinds;
    return known && Object.values(known).includes(p) ? known : null;
  };

  // Draw another kind of attention: its own payload, keeping the tab, theme and what still applies (layer, head).
  A.showKind = async function (ctx, kind) {
    const family = A.kindFamily(ctx);
    const next = family[kind];
    const s = ctx.state;
    const shown = ctx.root.attnscopeShown;
    const tab = shown ? shown.view() : null;
    const has = (v, list) => (list.includes(v) ? v : undefined);
    const controller = await A.render(ctx.root, next, {
      layer: has(s.layer, next.layers), head: has(s.head, next.heads), theme: s.theme, query: null,
      heads: s.heads.filter((h) => next.heads.includes(h)), source: has(s.source, next.sources.map((x) => x.name)),
    });
    if (controller.show && tab && tab !== ctx.root.attnscopeShown.view()) await controller.show(tab);
    return controller;
  };

  // Encoder / decoder / cross: which of an encoder-decoder's three kinds of attention the views draw.
  C.attention = function (ctx) {
    const family = ctx.options.fixed ? null : A.kindFamily(ctx);
    if (!family) return null;
    const select = el("select", { "aria-label": "which attention (encoder, decoder or cross)", class: "as-attention" });
    for (const [kind, p] of Object.entries(family)) select.append(el("option", { value: kind, text: p.attention_label }));
    select.value = ctx.model.payload.attention;
    select.addEventListener("change", () => A.showKind(ctx, select.value));
    return labelled("attention", select);
  };

  // How the two token columns or axes read: target and source for cross-attention.
  A.sides = (model) => (model.payload.attention === "cross"
    ? { q: "queries: target (decoder) tokens", k: "keys: source (encoder) tokens" } : { q: "queries", k: "keys" });

  // shown: the query a view draws while none is selected (the neuron view's first word), so that opening a view
  // never selects a query for the others
  C.query = function (ctx, shown) {
    const select = el("select", { "aria-label": "query token (0-indexed)", class: "as-query" });
    ctx.model.tokens.forEach((t, i) => select.append(el("option", { value: String(i), text: A.tokenLabel(ctx.model, i) })));
    const sync = () => (select.value = String(ctx.state.query ?? shown ?? 0));
    select.addEventListener("change", () => ctx.set({ query: Number(select.value) }));
    ctx.subscribe((s, p) => "query" in p && sync());
    sync();
    return labelled("query", select);
  };

  // Colour scale of the matrix and model views: each map's own max, or absolute weights (0 to 1).
  A.top = (ctx, src, layer, head) =>
    (src.range === "unit" && ctx.state.scale === "unit" ? 1 : src.scale(layer, head) || 1);

  C.scale = function (ctx) {
    const select = el("select", { "aria-label": "colour scale" });
    select.append(el("option", { value: "map", text: "each map's max" }), el("option", { value: "unit", text: "absolute (0–1)" }));
    const sync = () => {
      select.value = ctx.state.scale;
      select.disabled = ctx.source().range !== "unit";
    };
    select.addEventListener("change", () => ctx.set({ scale: select.value }));
    ctx.subscribe((s, p) => ctx.changed(p, ["scale", "source"]) && sync());
    sync();
    return labelled("colour", select);
  };

  const FILTERS = [["all", "all"], ["AA", "A → A"], ["AB", "A → B"], ["BA", "B → A"], ["BB", "B → B"]];
  C.filter = function (ctx) {
    if (!ctx.model.pair) return null;
    const select = el("select", { "aria-label": "sentence filter (query → key)" });
    for (const [v, t] of FILTERS) select.append(el("option", { value: v, text: t }));
    select.value = ctx.state.filter || "all";
    select.addEventListener("change", () => ctx.set({ filter: select.value }));
    return labelled("sentences", select);
  };

  // Does a (query, key) pair pass the sentence filter?
  A.passes = function (model, filter, q, k) {
    if (!filter || filter === "all") return true;
    const seg = (i) => (model.segments[i] > 0 ? "B" : "A");
    return seg(q) === filter[0] && seg(k) === filter[1];
  };

  // The verification badge for some heads of one layer, from trace.check() (never recomputed here).
  C.badge = function (ctx, which) {
    const badge = el("span", { class: "as-badge", role: "status" });
    const sync = () => {
      const { layer, heads } = which();
      const d = describeCheck(ctx.model, layer, heads);
      badge.textContent = d.text;
      badge.title = d.title;
      badge.className = `as-badge as-${d.kind}`;
    };
    ctx.subscribe((s, p) => ctx.changed(p, ["layer", "head", "heads"]) && sync());
    sync();
    return badge;
  };

  function describeCheck(model, layer, heads) {
    const c = model.check;
    if (!c || c.ok === null) {
      const partial = c && c.max_error !== null ? `The captured numbers match the model's own outputs within ` +
        `${A.fmtError(c.max_error)}, but nothing recomputed them independently.` : "";
      return { kind: "none", text: `NOT VERIFIED: ${(c && c.unsupported) || "no check"}`, title: partial };
    }
    if (!heads.length) return { kind: "none", text: "no head selected", title: "" };
    const li = model.layers.indexOf(layer);
    const errs = heads.map((h) => c.head_errors[li][model.heads.indexOf(h)]);
    const worst = errs.reduce((m, e) => (typeof e === "string" || e > m ? e : m), 0);
    const ok = typeof worst !== "string" && worst <= c.tolerance;
    const where = heads.length === 1 ? `layer ${layer}, head ${heads[0]}` : `layer ${layer}, ${heads.length} heads`;
    return {
      kind: ok ? "ok" : "fail",
      text: `${ok ? "✓ verified" : "✗ check failed"} · ${where}: max error ${A.fmtError(worst)} ${ok ? "≤" : ">"} ` +
        `${A.fmtError(c.tolerance)}`,
      title: `${where}: captured vs independent recompute and vs the model's own outputs, every stage ` +
        `(scores and output relative). Whole trace, as \`attnscope check\` reports it: max error ${A.fmtError(c.max_error)}` +
        `${c.unsupported ? "; " + c.unsupported : ""}`,
    };
  }
  A.describeCheck = describeCheck;

  // A floating tooltip inside a positioned container.
  A.tooltip = function (container) {
    const tip = el("div", { class: "as-tip", role: "tooltip", hidden: true });
    container.append(tip);
    return {
      node: tip,
      show(x, y, lines) {
        tip.replaceChildren(...lines.map((t) => el("div", { text: t })));
        tip.hidden = false;
        const box = container.getBoundingClientRect();
        const room = document.documentElement.clientWidth - box.left; // the tip may overhang its container
        tip.style.left = `${Math.max(0, Math.min(x + 14, room - tip.offsetWidth - 4))}px`;
        tip.style.top = `${y + 14}px`;
      },
      hide() {
        tip.hidden = true;
      },
    };
  };
})();
