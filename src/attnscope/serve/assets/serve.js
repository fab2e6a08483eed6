/* attnscope serve: the form around the views. Calls this server's JSON API only, draws the payload with
   window.attnscope.render, and on "attnscope:select" shows the step-by-step explanation of that layer,
   head and query token. User text only ever reaches the page as textContent. */
(function () {
  "use strict";
  const A = window.attnscope;
  const $ = (id) => document.getElementById(id);
  const config = JSON.parse($("sv-config").textContent);
  const MAX_ROWS = 12;
  const MAX_COLS = 64; // the tables scroll inside their box; wider arrays say which columns they leave out
  const KEY_STAGES = ["scores", "scaled", "masked", "weights"]; // arrays whose columns are keys
  const MASK_FLOOR = -1.7e38; // half the most negative float32: the additive mask
  const BINARY = "application/x-attnscope-arrays"; // attnscope.serve.binary

  // The views fetch a lazy trace's maps through this (data.js has no network access of its own).
  A.getBinary = async function (url) {
    const response = await fetch(url, { credentials: "same-origin" });
    if (!response.ok) {
      const data = await response.json().catch(() => null);
      throw new Error((data && data.error) || `${url} answered HTTP ${response.status}`);
    }
    return response.arrayBuffer();
  };

  let current = null; // {request, payload, tokens, controller}
  let explainSeq = 0;

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = String(v);
      else if (k === "class") node.className = v;
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children || []) if (c) node.append(c);
    return node;
  }

  function status(text, kind) {
    const s = $("sv-status");
    s.textContent = text;
    s.dataset.kind = kind || "";
  }

  // POST a JSON body, or GET without one; the answer's JSON, or an Error saying what the server answered. The
  // page's other panels (panels.js, corpus.js) call it as A.api.
  async function api(path, body) {
    const init = body === undefined ? { method: "GET" }
      : { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
    return answer(path, await fetch(path, init));
  }
  A.api = api;

  async function answer(path, response) {
    let data = null;
    try {
      data = await response.json();
    } catch (err) {
      throw new Error(`${path} answered HTTP ${response.status} without JSON`);
    }
    if (!response.ok) throw new Error((data && data.error) || `${path} answered HTTP ${response.status}`);
    return data;
  }

  function textRequest() {
    const pair = $("sv-pair").value;
    if (seq2seq()) {  // an encoder-decoder model: the text is the source, and a target (empty: generated)
      const target = $("sv-target").value;
      return { text: $("sv-text").value, target: target.trim() ? target : null, model: $("sv-model").value || null };
    }
    return { text: $("sv-text").value, pair: pair.trim() ? pair : null, model: $("sv-model").value || null };
  }

  function seq2seq() {
    const name = $("sv-model").value;
    const m = config.models.find((x) => x.name === name) || config.models.find((x) => x.default);
    return Boolean(m && m.encoder_decoder);
  }

  function showTextFields() {  // the form's labels set their own display, so `hidden` alone would not hide them
    $("sv-target-label").style.display = seq2seq() ? "" : "none";
    $("sv-pair").closest("label").style.display = seq2seq() ? "none" : "";
  }

  function sources() {
    const out = $("sv-norms").checked ? ["norm_head", "norm_layer"] : [];
    return out.concat(["rollout", "flow"].filter((s) => $(`sv-${s}`).checked));
  }

  // The server reads at most config.max_chars characters per field (serve --max-chars). The fields have no
  // maxlength (a browser cuts a longer paste there without a word): a field over the limit is named, with its
  // length and what to do, and its form cannot be sent until it fits.
  const LIMITED = { "sv-text": ["sv-go", "sv-status", "Text"], "sv-pair": ["sv-go", "sv-status", "Second text"],
    "sv-target": ["sv-go", "sv-status", "Target"], "sv-gen-prompt": ["sv-gen-go", "sv-gen-status", "Prompt"] };

  function tooLong(button) {
    const ids = Object.keys(LIMITED).filter((id) => LIMITED[id][0] === button && $(id).offsetParent !== null);
    const over = ids.find((id) => $(id).value.length > config.max_chars);
    if (!over) return null;
    return `${LIMITED[over][2]}: ${$(over).value.length.toLocaleString("en")} characters, more than the ` +
      `${config.max_chars.toLocaleString("en")} this server reads: shorten it, or restart the server with a ` +
      "larger --max-chars (and --max-tokens for that many tokens)";
  }

  function guardLength(event) {
    const [button, statusId] = LIMITED[event.target.id];
    const message = tooLong(button);
    $(button).disabled = Boolean(message);
    $(button).title = message || "";
    const s = $(statusId);
    if (message) {
      s.textContent = message;
      s.dataset.kind = "error";
      s.dataset.limit = "over";
    } else if (s.dataset.limit === "over") {
      s.textContent = "";
      s.dataset.kind = "";
      delete s.dataset.limit;
    }
  }

  // A trace whose maps the server could not keep (stored: false: more than its --cache-size) could draw its first
  // head but no other: refused here, with what to change, instead of failing later on a map fetch.
  function unstoredMaps(data) {
    const m = data.payload && data.payload.maps;
    if (!m || m.stored !== false) return null;
    return `${data.tokens.length.toLocaleString("en")} tokens: this trace's maps do not fit the server's map ` +
      "cache, so it cannot show them: untick norm-based and attention rollout (each adds a map per head), " +
      "or restart the server with a larger --cache-size";
  }

  async function traceText(event) {
    if (event) event.preventDefault();
    const request = textRequest();
    const over = tooLong("sv-go");
    if (over) {
      status(over, "error");
      return;
    }
    const started = performance.now();
    status("tracing…", "busy");
    $("sv-go").disabled = true;
    try {
      // "auto": a long trace comes without its maps; the views fetch each layer's maps when they show it
      const body = request.target !== undefined ? Object.assign({ stages: [], payload: true }, request)
        : Object.assign({ stages: [], payload: true, sources: sources(), maps: "auto" }, request);
      const data = await api("/api/trace", body);
      const unstored = unstoredMaps(data);
      if (unstored) throw new Error(unstored);
      performance.mark("sv:traced");
      current = { request: request, payload: data.payload, tokens: data.tokens, controller: null, kinds: data.kinds };
      await draw(null);
      delete $("sv-views").dataset.stale;
      const ms = Math.round(performance.now() - started);
      const lazy = data.payload.maps ? " · maps fetched as shown" : "";
      const size = data.kinds ? `${data.kinds.encoder.tokens.length} source → ${data.kinds.decoder.tokens.length} ` +
        `target tokens${data.generated ? " (generated)" : ""} · ${data.status}` : `${data.tokens.length} tokens`;
      status(`${size}${data.truncated ? " (truncated)" : ""} · ${ms} ms${lazy}`, "ok");
      clearExplanation();
    } catch (err) {
      // the views keep the previous text, dimmed, so they are never taken for this one
      if (current) $("sv-views").dataset.stale = "true";
      status(err.message + (current ? " (the views still show the previous text)" : ""), "error");
    } finally {
      $("sv-go").disabled = false;
    }
  }

  // Draw the payload in the chosen view, keeping layer, head, query and source across view switches.
  async function draw(keep) {
    if (!current) return;
    if (current.controller) current.controller.destroy();
    const request = current.request;
    const options = { view: $("sv-view").value,
                      loadNeuron: (layer, head, query) => loadNeuron(request, layer, head, query) };
    if (keep) for (const k of ["layer", "head", "query", "source"]) if (keep[k] !== undefined) options[k] = keep[k];
    current.controller = await A.render($("sv-views"), current.payload, options);
    document.body.dataset.view = options.view;
  }

  // The Neuron tab's exact numbers of a head the payload lacks, for the query it shows (that query's row of q,
  // context, scores and weights, every key's k and v: 1.1 MB at 2,048 SmolLM2 tokens, where the whole block is
  // 36 MB), asked for in the binary form (raw float32, nothing to decode); a server that answers JSON gets the JSON
  // block (views.neuron_block) read as before.
  async function loadNeuron(request, layer, head, query) {
    const row = query === null || query === undefined ? {} : { query: query };
    const response = await fetch("/api/neuron", {
      method: "POST", body: JSON.stringify(Object.assign({ layer: layer, head: head }, row, request)),
      headers: { "Content-Type": "application/json", Accept: `${BINARY}, application/json;q=0.5` },
    });
    if (response.ok && (response.headers.get("content-type") || "").startsWith(BINARY)) {
      return A.neuronFromArrays(A.decodeArrays(await response.arrayBuffer()));
    }
    return answer("/api/neuron", response);
  }

  function clearExplanation() {
    $("sv-explain").replaceChildren(el("p", { class: "sv-hint", text: "Click a matrix cell, a head-view token or a " +
      "neuron-view row to see every step of that layer, head and query token, with the model's own numbers." }));
  }

  // Scroll the explanation to `step` and keep it there. The steps are laid out only near the pane's view (serve.css),
  // so those above it take their real heights a frame after the scroll and move it: scrolled again until it stays.
  async function scrollToStep(step) {
    const frames = () => new Promise((done) => {
      requestAnimationFrame(() => requestAnimationFrame(done));
      setTimeout(done, 100); // no frames in a hidden tab
    });
    for (let i = 0; i < 4; i++) {
      step.scrollIntoView({ block: "start" });
      const top = step.getBoundingClientRect().top;
      await frames();
      if (Math.abs(step.getBoundingClientRect().top - top) < 1) return;
    }
  }

  async function explain(detail) {
    if (!current || detail.query === null || detail.query === undefined) return;
    if (current.kinds) {  // the page explains one-kind models; the CLI walks an encoder-decoder's kinds
      $("sv-explain").replaceChildren(el("p", { class: "sv-hint", text: "An encoder-decoder model's walkthrough: " +
        "attnscope explain SOURCE --target TARGET --model M --attention encoder|decoder|cross --layer L --head H" }));
      return;
    }
    const state = current.controller ? current.controller.state : {};
    const layer = detail.layer ?? state.layer ?? 0;
    const head = detail.head ?? state.head ?? 0;
    const drawn = detail.view === "head" && Array.isArray(state.heads) ? state.heads.length : 1;
    const seq = ++explainSeq;
    const box = $("sv-explain");
    box.dataset.state = "loading";
    box.replaceChildren(el("p", { class: "sv-hint", text: `explaining layer ${layer}, head ${head}, query ${detail.query}…` }));
    try {
      const w = await api("/api/explain", Object.assign({ layer: layer, head: head, token: detail.query,
                                                          arrays: "shown" }, current.request));
      if (seq !== explainSeq) return; // a newer click won
      box.replaceChildren(...walkthrough(w, detail.key, drawn));
      const weights = box.querySelector('.sv-step[data-stage="weights"]');
      if (weights) await scrollToStep(weights); // the step that was clicked, not step 1
      if (seq !== explainSeq) return;
      box.dataset.state = "ready";
    } catch (err) {
      if (seq !== explainSeq) return;
      box.replaceChildren(el("p", { class: "sv-error", text: err.message }));
      box.dataset.state = "error";
    }
  }

  // ---- the walkthrough (same content as `attnscope explain --format json`) -------------

  function checkLine(w) {
    const c = w.check || {};
    if (c.unsupported) return { kind: "none", text: `not verified: ${c.unsupported}` };
    const ok = Boolean(c.ok);
    return {
      kind: ok ? "ok" : "fail",
      text: `${ok ? "✓ verified" : "✗ check failed"}: every stage of layer ${w.layer} head ${w.head} recomputed from ` +
        `the layer's weights matches the model's forward pass: max error ${A.fmtError(Number(c.head_max_error ?? 0))} ` +
        `(tolerance ${A.fmtError(Number(c.tolerance))}; whole trace ${A.fmtError(Number(c.max_error ?? 0))}, ` +
        "as `attnscope check` reports it)",
    };
  }

  function walkthrough(w, key, drawn) {
    const tokens = w.tokens.map((t) => t.text);
    const focus = w.token === null ? "every query" : `query token ${w.token} “${tokens[w.token]}”`;
    const check = checkLine(w);
    const which = drawn > 1 ? el("p", { class: "sv-which", text: `The head view draws ${drawn} heads; this explains ` +
      `layer ${w.layer}, head ${w.head}, the first of them. Select one head there to explain another.` }) : null;
    const out = [
      el("h2", { class: "sv-explain-title", text: `Layer ${w.layer}, head ${w.head}, ${focus}` }),
      which,
      el("p", { class: "sv-meta", text: `${w.model.name} · ${w.model.layers} layers × ${w.model.heads} heads · ` +
        "layers, heads and tokens are 0-indexed" }),
      el("p", { class: `sv-badge sv-${check.kind}`, "data-ok": String(check.kind === "ok"), text: check.text }),
    ];
    w.steps.forEach((step, i) => out.push(stepNode(step, step.number || String(i + 1), w, tokens, key)));
    return out.filter(Boolean);
  }

  function stepNode(step, n, w, tokens, key) {
    const children = [el("summary", {}, [el("span", { text: `${n}. ${step.title} ` }),
                                         el("code", { text: step.stage })])];
    if (step.text) children.push(el("p", { text: step.text }));
    if (step.shape) children.push(el("p", { class: "sv-shape", text: `shape ${step.shape}` }));
    for (const [name, values] of Object.entries(step.arrays)) {
      children.push(matrix(name, values, step, w, tokens, key));
    }
    return el("details", { class: "sv-step", "data-stage": step.stage, open: true }, children);
  }

  function keep(n, limit, must) {
    if (n <= limit) return Array.from({ length: n }, (_, i) => i);
    const head = Array.from({ length: limit - 2 }, (_, i) => i);
    const tail = [n - 2, n - 1];
    const picked = new Set([...head, ...tail]);
    if (must !== null && must !== undefined && must >= 0 && must < n && !picked.has(must)) {
      head[head.length - 1] = must; // keep the selected key visible
      head.sort((a, b) => a - b);
    }
    return [...head, null, ...tail];
  }

  function fmt(v, integers) {
    if (typeof v !== "number") return String(v);
    if (v <= MASK_FLOOR) return "-inf*";
    return integers ? String(v) : A.fmt(v);
  }

  function rowLabels(rows, w, tokens) {
    if (rows === tokens.length) return tokens.map((t, i) => `${i}: ${t}`);
    if (rows === 1 && w.token !== null) return [`${w.token}: ${tokens[w.token]}`];
    return null;
  }

  function colLabels(name, cols, step, tokens) {
    if (step.stage === "tokens") return name.split(", ");
    if (KEY_STAGES.includes(step.stage) && cols === tokens.length) return tokens.map((t, i) => `${i}: ${t}`);
    return null;
  }

  // An array of the walkthrough -> {rows, cols, at(i, j), integers}: whole (arrays "all"), or the cells the page
  // shows with where they sit (arrays "shown": step.shown[name] has the shape, the rows and columns kept).
  function cellsOf(values, where) {
    const g = Array.isArray(values[0]) ? values : [values];
    if (!where) {
      return { rows: g.length, cols: g[0] ? g[0].length : 0, at: (i, j) => g[i][j],
               integers: g.flat().every((v) => Number.isInteger(v) && Math.abs(v) < 1e6) };
    }
    const rowAt = new Map(where.rows.map((r, i) => [r, i]));
    const colAt = where.cols ? new Map(where.cols.map((c, j) => [c, j])) : null;
    return { rows: where.shape[0], cols: where.shape[1], integers: where.integers,
             at: (i, j) => g[rowAt.get(i)][colAt ? colAt.get(j) : j] };
  }

  function matrix(name, values, step, w, tokens, key) {
    const { rows, cols, at, integers } = cellsOf(values, step.shown && step.shown[name]);
    const rl = rowLabels(rows, w, tokens);
    const cl = colLabels(name, cols, step, tokens);
    const keyCol = cl && KEY_STAGES.includes(step.stage) ? key : null;
    const ri = keep(rows, MAX_ROWS, w.token !== null && rows === tokens.length ? w.token : null);
    const ci = keep(cols, MAX_COLS, keyCol);
    const head = el("tr", {}, [el("th", { text: "" }), ...ci.map((j) => el("th", {
      class: j !== null && j === keyCol ? "sv-hit" : null, title: j === null ? null : cl ? cl[j] : String(j),
      text: j === null ? "…" : cl ? cl[j] : String(j) }))]);
    const body = ri.map((i) => el("tr", {}, [
      el("th", { text: i === null ? "…" : rl ? rl[i] : String(i) }),
      ...ci.map((j) => el("td", { class: j !== null && j === keyCol ? "sv-hit" : null,
                                  text: i === null || j === null ? "…" : fmt(at(i, j), integers) })),
    ]));
    const caption = el("caption", { text: `${name} [${rows}, ${cols}]` });
    const table = el("div", { class: "sv-matrix" }, [el("table", { "data-name": name }, [caption,
      el("thead", {}, [head]), el("tbody", {}, body)])]);
    const gaps = [elided("rows", ri, rows), elided("columns", ci, cols)].filter(Boolean);
    return gaps.length ? el("div", {}, [table, el("p", { class: "sv-elided", text: `${gaps.join("; ")} ` +
      "(`attnscope explain --full` or the API's JSON has them all)" })]) : table;
  }

  // "rows 10..381 of 384 not shown (0-indexed)" for the gap (null) in the kept indices, as the terminal says it.
  function elided(kind, kept, n) {
    const at = kept.indexOf(null);
    if (at < 0) return null;
    return `${kind} ${at === 0 ? 0 : kept[at - 1] + 1}..${kept[at + 1] - 1} of ${n} not shown (0-indexed)`;
  }

  // ---- the Generate panel: POST /api/generate, NDJSON read as it streams, drawn live ----------

  const DECODER = /(ForCausalLM|LMHeadModel)$/; // the architectures a causal LM checkpoint is saved as
  let generation = null; // {abort: AbortController, view: renderGeneration's controller}

  function genStatus(text, kind) {
    const s = $("sv-gen-status");
    s.textContent = text;
    s.dataset.kind = kind || "";
  }

  // Each complete line of the body as one parsed event, as the bytes arrive.
  async function* ndjson(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      buffered += decoder.decode(value || new Uint8Array(), { stream: !done });
      let at;
      while ((at = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, at);
        buffered = buffered.slice(at + 1);
        if (line.trim()) yield JSON.parse(line);
      }
      if (done) return;
    }
  }

  function onEvent(e, box, count) {
    if (e.event === "start") {
      const waiting = { unsupported: "checked when the generation ends (every step with its KV cache and " +
        "against a no-cache pass)" };
      generation.view = A.renderGeneration(box, Object.assign({}, e, { steps: [], check: waiting }));
    } else if (e.event === "token") {
      generation.view.addStep(e);
      genStatus(`step ${e.step}: ${JSON.stringify(e.piece)} (p = ${e.probability.toFixed(4)})…`, "busy");
    } else if (e.event === "done") {
      generation.view = A.renderGeneration(box, e); // every step's rows, and the check
      const c = e.check;
      genStatus(`${e.steps.length} tokens (${e.stopped}) · ${c.ok ? "✓ verified" : "✗ check failed"}, max error ` +
        `${A.fmtError(Number(c.max_error || 0))}`, c.ok ? "ok" : "error");
    } else if (e.event === "error") {
      genStatus(e.error, "error");
    }
    return count + (e.event === "token" ? 1 : 0);
  }

  // The request: empty sampling fields are null (greedy unless temperature or top p is given).
  function generateRequest() {
    const number = (id) => ($(id).value.trim() === "" ? null : Number($(id).value));
    return { prompt: $("sv-gen-prompt").value, model: $("sv-gen-model").value || null,
             max_new_tokens: Number($("sv-gen-max").value), temperature: number("sv-gen-temperature"),
             top_p: number("sv-gen-top-p"), seed: number("sv-gen-seed") };
  }

  async function generate(event) {
    event.preventDefault();
    const over = tooLong("sv-gen-go");
    if (over) {
      genStatus(over, "error");
      return;
    }
    if (generation) generation.abort.abort();
    const abort = new AbortController();
    generation = { abort: abort, view: null };
    const box = $("sv-gen-view");
    box.dataset.state = "streaming";
    $("sv-gen-go").disabled = true;
    $("sv-gen-stop").disabled = false;
    genStatus("generating…", "busy");
    let count = 0;
    try {
      const response = await fetch("/api/generate", { method: "POST", signal: abort.signal,
        headers: { "Content-Type": "application/json" }, body: JSON.stringify(generateRequest()) });
      if (!response.ok) {
        const data = await response.json().catch(() => null);
        throw new Error((data && data.error) || `/api/generate answered HTTP ${response.status}`);
      }
      for await (const e of ndjson(response)) {
        if (abort.signal.aborted) throw new DOMException("stopped", "AbortError"); // lines read before Stop
        count = onEvent(e, box, count);
      }
      box.dataset.state = "done";
    } catch (err) {
      const stopped = err.name === "AbortError";
      genStatus(stopped ? `stopped after ${count} token(s): not verified` : err.message, stopped ? "" : "error");
      box.dataset.state = stopped ? "stopped" : "error";
    } finally {
      if (generation && generation.abort === abort) {
        $("sv-gen-go").disabled = false;
        $("sv-gen-stop").disabled = true;
      }
    }
  }

  function startGeneration() {
    const decoders = config.models.filter((m) => DECODER.test(m.architecture));
    if (!decoders.length) return; // nothing here can write: no panel
    const select = $("sv-gen-model");
    for (const m of decoders) {
      select.append(el("option", { value: m.name, text: `${m.name} (${m.architecture}, ${m.layers} layers × ` +
        `${m.heads} heads)` }));
    }
    $("sv-gen-form").addEventListener("submit", generate);
    $("sv-gen-stop").addEventListener("click", () => { if (generation) generation.abort.abort(); });
    $("sv-gen").hidden = false;
  }

  // ---- interventions: ablate and patch heads, the grid drawn by effects.js ----------------------

  function fxStatus(name, text, kind) {
    const s = $(`sv-${name}-status`);
    s.textContent = text;
    s.dataset.kind = kind || "";
  }

  // The measures before and after, one row each: what changed, in the model's own units.
  function measures(title, before, after, primary) {
    const names = Object.keys(after).filter((k) => after[k] !== undefined);
    const rows = names.map((k) => el("tr", { class: k === primary ? "sv-hit" : null }, [
      el("th", { scope: "row", text: k }),
      el("td", { text: before && before[k] !== undefined ? fmtMeasure(before[k]) : "" }),
      el("td", { text: fmtMeasure(after[k]) })]));
    return el("table", { class: "sv-fx-table" }, [el("caption", { text: title }),
      el("thead", {}, [el("tr", {}, [el("th", { text: "measure" }), el("th", { text: "clean" }),
        el("th", { text: "intervened" })])]), el("tbody", {}, rows)]);
  }

  function fmtMeasure(v) {
    return v === null ? "NaN" : typeof v === "number" ? v.toFixed(4) : String(v);
  }

  // A click on a grid cell opens that head in the views above (the traced text's).
  async function openHead(layer, head) {
    if (!current || !current.controller) return;
    await draw({ layer: layer, head: head });
    $("sv-views").scrollIntoView({ behavior: "smooth", block: "start" });
  }

  function showEffects(box, effects) {
    if (!effects) return;
    const grid = el("div", { class: "sv-fx-grid" });
    box.append(grid);
    A.renderEffects(grid, effects, (layer, head) => openHead(layer, head).catch((err) => status(err.message, "error")));
  }

  async function runIntervention(name, path, body, render) {
    const go = $(`sv-${name}-go`);
    const out = $(`sv-${name}-out`);
    go.disabled = true;
    fxStatus(name, "running…", "busy");
    const started = performance.now();
    try {
      const data = await api(path, body);
      out.replaceChildren();
      render(out, data);
      fxStatus(name, `${Math.round(performance.now() - started)} ms`, "ok");
    } catch (err) {
      fxStatus(name, err.message, "error");
    } finally {
      go.disabled = false;
    }
  }

  function ablate(event) {
    event.preventDefault();
    const request = textRequest();
    const heads = $("sv-ablate-heads").value.trim();
    const each = $("sv-ablate-each").checked;
    const target = seq2seq() ? request.target : ($("sv-ablate-target").value || null);
    const body = { text: request.text, model: request.model, heads: heads || null, mode: $("sv-ablate-mode").value,
                   target: target, each: each };
    if (seq2seq() && each) body.attention = $("sv-ablate-kind").value;
    runIntervention("ablate", "/api/ablate", body, (out, data) => {
      const removed = data.heads.map((h) => h.join(".")).join(", ") || "none (each head alone below)";
      out.append(el("p", { class: "sv-fx-line", text: `${data.model} (${data.kind}): heads ${removed} removed ` +
        `(${data.mode}); ${data.target !== null ? `target ${JSON.stringify(data.target)}; ` : ""}` +
        `primary measure: ${data.primary}` }));
      if (data.heads.length) out.append(measures("the text's measures, clean and with those heads removed",
        data.clean, data.ablated, data.primary));
      showEffects(out, data.effects);
    });
  }

  function patchHeads(event) {
    event.preventDefault();
    const optional = (id) => ($(id).value.trim() ? $(id).value : null);
    const body = { clean: $("sv-patch-clean").value, corrupt: $("sv-patch-corrupt").value,
                   model: $("sv-model").value || null, target: optional("sv-patch-target"),
                   contrast: optional("sv-patch-contrast") };
    runIntervention("patch", "/api/patch", body, (out, data) => {
      // m: the logit difference answer - contrast (language models), or the pooled embedding's cosine similarity
      // to the clean run's (encoders); recovered = (m(patched) - m(corrupt)) / (m(clean) - m(corrupt))
      const m = data.answer !== null ? `the logit difference ${JSON.stringify(data.answer)} − ` +
        `${JSON.stringify(data.contrast)}` : "the pooled sentence embedding's cosine similarity to the clean run's";
      out.append(el("p", { class: "sv-fx-line", text: `${data.model}: m is ${m}; m(clean) = ` +
        `${fmtMeasure(data.clean)}, m(corrupt) = ${fmtMeasure(data.corrupt)}; per head, recovered = ` +
        "(m(patched) − m(corrupt)) / (m(clean) − m(corrupt)): 1 when that head alone restores the clean run" }));
      showEffects(out, data.effects);
    });
  }

  function showInterventionFields() {
    $("sv-ablate-kind-label").style.display = seq2seq() ? "" : "none";
    $("sv-ablate-target").closest("label").style.display = seq2seq() ? "none" : "";
  }

  function startInterventions() {
    $("sv-ablate-form").addEventListener("submit", ablate);
    $("sv-patch-form").addEventListener("submit", patchHeads);
    $("sv-model").addEventListener("change", showInterventionFields);
    showInterventionFields();
  }

  // ---- start -------------------------------------------------------------------------------

  function start() {
    const select = $("sv-model");
    for (const m of config.models) {
      select.append(el("option", { value: m.name, selected: m.default, text: `${m.name} (${m.architecture}, ` +
        `${m.layers} layers × ${m.heads} heads)` }));
    }
    $("sv-form").addEventListener("submit", traceText);
    for (const id of Object.keys(LIMITED)) $(id).addEventListener("input", guardLength);
    select.addEventListener("change", showTextFields);
    showTextFields();
    $("sv-view").addEventListener("change", () => {
      if (current && current.controller) draw(current.controller.state).catch((err) => status(err.message, "error"));
    });
    $("sv-views").addEventListener("attnscope:select", (e) => explain(e.detail));
    $("sv-views").addEventListener("attnscope:error", (e) => status(e.detail.message, "error")); // a map fetch
    clearExplanation();
    startGeneration();
    startInterventions();
    if ($("sv-text").value.trim()) traceText(null);
  }

  start();
})();
