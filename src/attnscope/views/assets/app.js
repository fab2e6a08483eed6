/* attnscope views: the app shell. window.attnscope.render(element, payload, options) draws one view, or all
   four as tabs; window.attnscope.boot() renders the page's own <script type="application/json"> payload. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const el = (...a) => A.el(...a);
  const TABS = ["head", "model", "matrix", "neuron"];
  const STATE_KEYS = ["view", "layer", "head", "heads", "query", "source", "theme"];

  function resolveTheme(theme) {
    if (theme === "light" || theme === "dark") return theme;
    return window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  }

  function initialState(model, given) {
    const p = model.payload;
    return {
      layer: given.layer ?? p.layers[0],
      head: given.head ?? p.heads[0],
      heads: given.heads ?? p.heads.slice(),
      query: given.query ?? null,
      key: null,
      source: given.source || model.sources.keys().next().value,
      filter: "all",
      scale: "map",
      theme: resolveTheme(given.theme),
    };
  }

  function header(ctx, app) {
    const p = ctx.model.payload;
    const m = p.model;
    const text = p.pair ? `${p.text}  ‖  ${p.pair}` : p.text;
    const arch = m.architecture && m.architecture !== m.name ? ` (${m.architecture})` : "";
    const meta = `${m.name || "model"}${arch} · ${p.model.layers ?? "?"} layers × ` +
      `${p.model.heads ?? "?"} heads · ${ctx.model.n} ${p.level === "words" ? "words" : "tokens"}` +
      `${m.causal ? " · causal" : ""} · all 0-indexed`;
    const toggle = el("button", { type: "button", class: "as-theme", "aria-label": "switch light or dark theme",
                                  text: "◐ theme" });
    toggle.addEventListener("click", () => {
      const theme = ctx.state.theme === "dark" ? "light" : "dark";
      app.dataset.theme = theme;
      ctx.set({ theme: theme });
    });
    const c = ctx.model.check;
    const overall = c && c.ok !== null
      ? el("span", { class: `as-badge as-${c.ok ? "ok" : "fail"}`, title: c.unsupported || "every layer, head and stage",
                     text: `${c.ok ? "✓ trace verified" : "✗ trace check failed"} · max error ${A.fmtError(c.max_error)}` })
      : el("span", { class: "as-badge as-none", text: `NOT VERIFIED: ${(c && c.unsupported) || "no check"}`,
                     title: A.describeCheck(ctx.model, ctx.model.layers[0], ctx.model.heads).title });
    return el("header", { class: "as-header" }, [
      el("div", { class: "as-title", title: text, text: text }),
      el("div", { class: "as-meta" }, [el("span", { text: meta }), p.truncated
        ? el("span", { class: "as-warn", text: "truncated to the first tokens (max length)" }) : null, overall, toggle]),
    ]);
  }

  // Tabs with roving focus: arrow keys move between them, as WAI-ARIA tabs do.
  function tabs(ctx, panel, views, show) {
    const list = el("div", { class: "as-tabs", role: "tablist", "aria-label": "views" });
    const buttons = views.map((v) => el("button", { type: "button", role: "tab", class: "as-tab", "data-view": v,
                                                    id: `as-tab-${v}`, text: A.views[v].label, onclick: () => show(v) }));
    list.addEventListener("keydown", (e) => {
      const i = buttons.indexOf(document.activeElement);
      const d = { ArrowRight: 1, ArrowLeft: -1 }[e.key];
      if (i < 0 || !d) return;
      const next = buttons[(i + d + buttons.length) % buttons.length];
      next.focus();
      show(next.dataset.view);
      e.preventDefault();
    });
    list.append(...buttons);
    return {
      node: list,
      select(v) {
        for (const b of buttons) {
          const on = b.dataset.view === v;
          b.setAttribute("aria-selected", String(on));
          b.tabIndex = on ? 0 : -1;
        }
        panel.setAttribute("aria-labelledby", `as-tab-${v}`);
      },
    };
  }

  function failure(node, err) {
    console.error(err);
    node.replaceChildren(el("p", { class: "as-missing", text: `attnscope could not draw this view: ${err.message || err}` }));
  }

  const mark = (name) => window.performance && performance.mark && performance.mark(name);

  // The panel and, for "all", the tabs; show(name) swaps the view drawn in the panel.
  function mountViews(element, app, base, view) {
    const panel = el("section", { class: "as-panel", role: view === "all" ? "tabpanel" : "region" });
    const mounted = { current: null, tabs: null };
    mounted.show = async (name) => {
      if (mounted.current) mounted.current.dispose();
      mounted.current = base.scoped({ openView: mounted.tabs ? mounted.show : null });
      panel.replaceChildren();
      panel.dataset.view = name;
      if (mounted.tabs) mounted.tabs.select(name);
      try {
        await A.views[name].render(panel, mounted.current);
      } catch (err) {
        failure(panel, err);
      }
      A.emit(element, "attnscope:view", { view: name });
    };
    if (view === "all") {
      mounted.tabs = tabs(base, panel, TABS, mounted.show);
      app.append(mounted.tabs.node);
    }
    app.append(panel);
    mounted.panel = panel;
    return mounted;
  }

  // Tokens or words (views/words.py merged the maps in Python; a long trace's word maps come from the server,
  // serve/wordmaps.py): re-render with the other payload, same layer, heads, source and query (its word).
  function wordToggle(element, pairs, shown, store, options) {
    const on = shown === pairs.words;
    return el("button", { type: "button", class: "as-words", "aria-pressed": String(on),
                          title: "merge word pieces into words: to a word the sum over its pieces, from a word the mean",
                          text: on ? "words ✓" : "words", onclick: () => {
      const s = store.get();
      element.attnscopeWords = on ? null : pairs.tokens; // drawn again by the page (another view): still words
      A.render(element, on ? pairs.tokens : pairs.words, Object.assign({}, options, {
        pairs: pairs, layer: s.layer, head: s.head, heads: s.heads, source: s.source, theme: s.theme,
        query: otherLevel(pairs.words.word_of, s.query, on),
      }));
    } });
  }

  // A query token's word, or a word's first token (null without the words' token map word_of: [token] -> word).
  function otherLevel(wordOf, query, toTokens) {
    if (!wordOf || query === null || query === undefined) return null;
    return toTokens ? wordOf.indexOf(query) : wordOf[query];
  }

  // On a words payload from the server a selection names words; the page around the views (the web app's
  // step-by-step explanation) gets the word's first token as query and key, and the word itself as word, keyWord.
  function wordSelections(element, payload) {
    if (element.attnscopeWordSelect) element.removeEventListener("attnscope:select", element.attnscopeWordSelect, true);
    element.attnscopeWordSelect = null;
    if (payload.level !== "words" || !payload.word_of) return;
    const first = (u) => (u === null || u === undefined ? u : payload.word_of.indexOf(u));
    element.attnscopeWordSelect = (e) => {
      if (!e.detail || e.detail.word !== undefined) return;
      Object.assign(e.detail, { word: e.detail.query, keyWord: e.detail.key,
                                query: first(e.detail.query), key: first(e.detail.key) });
    };
    element.addEventListener("attnscope:select", element.attnscopeWordSelect, true); // before the page's own
  }

  // A long trace with word pieces but too large for word overviews: say why there is no toggle.
  function noWords(payload) {
    const w = payload.word_level;
    return w && w.available && !w.toggle ? el("button", { type: "button", class: "as-words", disabled: true,
                                                          title: w.reason, text: "words" }) : null;
  }

  // A long trace's maps arrive on request (data.js, model.ensure): a change of layer or source is applied once
  // the layer it shows is here, so every view draws real maps; patches made meanwhile are applied together.
  function lazyStore(store, model, element) {
    if (!model.lazy) return store;
    let queued = null;
    let seq = 0;
    const apply = () => {
      const patch = queued;
      queued = null;
      if (patch) store.set(patch);
    };
    return Object.assign({}, store, {
      set(patch) {
        queued = Object.assign(queued || {}, patch);
        const next = Object.assign({}, store.get(), queued);
        if (model.holds(next)) return apply();
        const ticket = ++seq;
        element.dataset.attnscopeLoading = "1";
        model.ensure(next).then(() => ticket === seq && apply(), (err) => {
          queued = null;
          A.emit(element, "attnscope:error", { message: err.message || String(err) });
        }).finally(() => ticket === seq && delete element.dataset.attnscopeLoading);
      },
    });
  }

  A.render = async function (element, payload, options) {
    options = options || {};
    if (!options.pairs && payload && payload.words && element.attnscopeWords === payload) { // words stay on
      options = Object.assign({}, options, { pairs: { tokens: payload, words: payload.words } });
      payload = payload.words;
    }
    mark("attnscope:start");
    const model = await A.decode(payload);
    mark("attnscope:decoded");
    const given = Object.assign({}, payload.initial);
    for (const k of STATE_KEYS) if (options[k] !== undefined) given[k] = options[k];
    const view = given.view || "all";
    if (view !== "all" && !A.views[view]) throw new Error(`unknown view ${view}`);
    const first = initialState(model, given);
    if (model.lazy) await model.ensure(first); // the first layer shown, before anything is drawn
    mark("attnscope:maps");
    const store = lazyStore(A.store(first), model, element);
    const app = el("div", { class: "as-app", "data-theme": store.get().theme, "data-view": view });
    element.replaceChildren(app);
    const base = A.context(element, model, store, { loadNeuron: options.loadNeuron });
    app.append(header(base, app));
    const mounted = mountViews(element, app, base, view);
    element.attnscopeShown = { model: model, state: () => store.get(), view: () => mounted.panel.dataset.view,
                               set: (patch) => store.set(patch) };
    if (A.exportButtons) app.querySelector(".as-meta").append(...A.exportButtons(element));
    const pairs = options.pairs || (payload.words ? { tokens: payload, words: payload.words } : null);
    if (pairs) app.querySelector(".as-meta").append(wordToggle(element, pairs, payload, store, options));
    else if (noWords(payload)) app.querySelector(".as-meta").append(noWords(payload));
    wordSelections(element, payload);
    await mounted.show(view === "all" ? "head" : view);
    element.dataset.attnscopeReady = "1";
    mark("attnscope:ready");
    A.emit(element, "attnscope:ready", { view: view });
    return {
      get state() { // what the element shows now (after the words button: the words' state, word indices)
        return element.attnscopeShown ? element.attnscopeShown.state() : store.get();
      },
      set: (patch) => (element.attnscopeShown ? element.attnscopeShown.set(patch) : store.set(patch)),
      show: mounted.tabs ? mounted.show : null,
      destroy() {
        if (mounted.current) mounted.current.dispose();
        element.replaceChildren();
      },
    };
  };

  A.boot = function () {
    const root = document.getElementById("attnscope-root");
    try {
      const data = JSON.parse(document.getElementById("attnscope-data").textContent);
      A.render(root, data).catch((err) => failure(root, err));
    } catch (err) {
      failure(root, err);
    }
  };
})();
