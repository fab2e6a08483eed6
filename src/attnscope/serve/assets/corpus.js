/* attnscope serve: the query/key map panel (POST /api/qkmap, `serve --index`) and the heads panel (GET/POST
   /api/heads, `serve --heads`). The answers are the library's payloads, drawn by the views' own renderers: qkmap.js
   (window.attnscope.renderQKMap: hover a point for its token in its sentence) and heads.js
   (window.attnscope.renderHeads: the dendrogram and the map of the heads). A click on a head sets the attention
   views' layer and head (#sv-views' attnscopeShown.set), when they show a text of the heads' model. User text only
   ever reaches the page as textContent (the renderers escape what they put in SVG markup). Layers and heads are
   0-indexed. */
(function () {
  "use strict";
  const A = window.attnscope;
  const $ = (id) => document.getElementById(id);
  const config = JSON.parse($("sv-config").textContent);

  const call = (path, body) => A.api(path, body); // serve.js's: GET without a body, POST with one

  function setStatus(name, text, kind) {
    const s = $(`sv-${name}-status`);
    s.textContent = text;
    s.dataset.kind = kind || "";
  }

  // One request of a panel: its button disabled meanwhile, its status saying how it went and in how long.
  async function ask(name, what, path, body, draw) {
    $(`sv-${name}-go`).disabled = true;
    setStatus(name, `${what}…`, "busy");
    const started = performance.now();
    try {
      draw(await call(path, body));
      setStatus(name, `${what} · ${Math.round(performance.now() - started)} ms`, "ok");
    } catch (err) {
      setStatus(name, err.message, "error");
    } finally {
      $(`sv-${name}-go`).disabled = false;
    }
  }

  // ---- query/key maps -------------------------------------------------------------------------------------------

  function drawMap(data) {
    const out = $("sv-qkmap-out");
    A.renderQKMap(out, data);
    out.dataset.heads = String(data.maps.length);
    out.dataset.points = String(out.querySelectorAll("circle.as-qk-point").length);
  }

  function mapRequest(event) {
    event.preventDefault();
    const head = $("sv-qkmap-head").value;
    const body = { layer: Number($("sv-qkmap-layer").value), head: head === "" ? null : Number(head),
                   projection: $("sv-qkmap-projection").value, colour: $("sv-qkmap-colour").value,
                   limit: Number($("sv-qkmap-limit").value) };
    const which = body.head === null ? "every head" : `head ${body.head}`;
    return ask("qkmap", `layer ${body.layer}, ${which} (${body.projection})`, "/api/qkmap", body, drawMap);
  }

  // ---- heads grouped by what they do ------------------------------------------------------------------------------

  // The model the views show (its canonical name), or null before any trace.
  function shownModel() {
    const s = $("sv-views").attnscopeShown;
    const p = s && s.model && s.model.payload;
    return p && p.model ? p.model.name : null;
  }

  // A head picked in the dendrogram or the map: the views show it (the same text, that layer and head).
  function openHead(layer, head) {
    const views = $("sv-views");
    const model = shownModel();
    if (model !== config.heads.model) {
      const now = model ? `the views show ${model}` : "no text is traced yet";
      setStatus("heads", `layer ${layer}, head ${head}: ${now}; trace a text with ${config.heads.model} to open its ` +
        "heads", "error");
      return;
    }
    views.attnscopeShown.set({ layer: layer, head: head, heads: [head] });
    views.dataset.headsPicked = `${layer}.${head}`;
    views.scrollIntoView({ behavior: "smooth", block: "start" });
    setStatus("heads", `layer ${layer}, head ${head} opened in the views`, "ok");
  }

  function drawHeads(data) {
    const out = $("sv-heads-out");
    A.renderHeads(out, data, openHead);
    out.dataset.heads = String(data.names.length);
    out.dataset.clusters = String(Math.max(...data.clusters));
  }

  function headsRequest(event) {
    if (event) event.preventDefault();
    const k = $("sv-heads-clusters").value.trim();
    if (!k) return ask("heads", "grouping", "/api/heads", undefined, drawHeads);
    return ask("heads", `${k} clusters`, "/api/heads", { clusters: Number(k) }, drawHeads);
  }

  // ---- start ----------------------------------------------------------------------------------------------------

  if (config.corpus) $("sv-qkmap-form").addEventListener("submit", mapRequest);
  if (config.heads) {
    $("sv-heads-form").addEventListener("submit", headsRequest);
    headsRequest(null); // the grouping is read once at start: drawn at once
  }
})();
