/* attnscope views: level-of-detail tiles of one [query, key] map, for a canvas that pans and zooms.
   Level 0 has one pixel per cell; level L one pixel per 2^L x 2^L block of cells, the max of the block
   (max-pooled: a peak never disappears from the overview). Each level is cut into TILE x TILE tiles that are
   coloured on first use, so a 2,048 x 2,048 map costs a few small images, never a DOM node per cell. */
(function () {
  "use strict";
  const A = (window.attnscope = window.attnscope || {});
  const TILE = 256; // pixels per tile side

  // [rows, cols] uint8 codes -> [ceil(rows / 2), ceil(cols / 2)], each the max of its 2 x 2 block.
  function pool(lv) {
    const rows = Math.ceil(lv.rows / 2);
    const cols = Math.ceil(lv.cols / 2);
    const out = new Uint8Array(rows * cols);
    for (let i = 0; i < lv.rows; i++) {
      const from = i * lv.cols;
      const to = (i >> 1) * cols;
      for (let j = 0; j < lv.cols; j++) {
        const v = lv.codes[from + j];
        if (v > out[to + (j >> 1)]) out[to + (j >> 1)] = v;
      }
    }
    return { codes: out, rows: rows, cols: cols };
  }

  // The coarsest detail that still gives every shown block at least one pixel: 2^level cells per pixel.
  A.levelFor = function (scale) {
    let level = 0;
    while (scale * 2 ** level < 1 - 1e-9) level++;
    return level;
  };

  // codes [rows, cols] of one map, colours: Uint32Array(256) of RGBA pixels indexed by code.
  A.pyramid = function (codes, rows, cols, colours) {
    const levels = [{ codes: codes, rows: rows, cols: cols }];
    const tiles = new Map();
    const level = (L) => {
      while (levels.length <= L) levels.push(pool(levels[levels.length - 1]));
      return levels[L];
    };
    function tile(L, ti, tj) {
      const key = `${L}:${ti}:${tj}`;
      if (tiles.has(key)) return tiles.get(key);
      const lv = level(L);
      const h = Math.min(TILE, lv.rows - ti * TILE);
      const w = Math.min(TILE, lv.cols - tj * TILE);
      const canvas = document.createElement("canvas");
      canvas.width = w;
      canvas.height = h;
      const g = canvas.getContext("2d");
      const img = g.createImageData(w, h);
      const px = new Uint32Array(img.data.buffer); // one RGBA pixel per cell (or block)
      for (let i = 0; i < h; i++) {
        const from = (ti * TILE + i) * lv.cols + tj * TILE;
        for (let j = 0; j < w; j++) px[i * w + j] = colours[lv.codes[from + j]];
      }
      g.putImageData(img, 0, 0);
      tiles.set(key, canvas);
      return canvas;
    }
    // The code of block (i, j) at level L: the max code of its cells.
    const code = (L, i, j) => level(L).codes[i * level(L).cols + j];
    return { rows: rows, cols: cols, level: level, tile: tile, code: code, tileCount: () => tiles.size };
  };

  // Code -> RGBA pixel through the theme's colour table; toLut maps a code to a colour index (0..255).
  A.codeColours = function (theme, toLut) {
    const table = new Uint32Array(A.lut(theme).buffer);
    const out = new Uint32Array(256);
    for (let c = 0; c < 256; c++) out[c] = table[Math.min(255, Math.round(c * toLut))];
    return out;
  };

  // The hatching of masked cells (a causal query's later keys).
  A.hatch = function (g, theme) {
    const p = document.createElement("canvas");
    p.width = p.height = 6;
    const pg = p.getContext("2d");
    pg.strokeStyle = theme === "dark" ? "rgba(200,200,200,.35)" : "rgba(90,90,90,.35)";
    pg.beginPath();
    pg.moveTo(0, 6);
    pg.lineTo(6, 0);
    pg.stroke();
    return g.createPattern(p, "repeat");
  };

  // Draws the part of the map in view: view {scale (px per cell), q0, k0 (first row and column, fractional)},
  // rect {x, y, w, h} the viewport on the canvas. Returns the level drawn.
  A.drawTiles = function (g, pyr, view, rect) {
    const L = A.levelFor(view.scale);
    const f = 2 ** L; // cells per pixel of this level
    const lv = pyr.level(L);
    const span = TILE * f; // cells per tile side
    const [ti0, ti1] = [Math.floor(view.q0 / span), Math.floor((view.q0 + rect.h / view.scale) / span)];
    const [tj0, tj1] = [Math.floor(view.k0 / span), Math.floor((view.k0 + rect.w / view.scale) / span)];
    const right = Math.min(rect.w, (pyr.cols - view.k0) * view.scale); // a partial last block stays inside the map
    const bottom = Math.min(rect.h, (pyr.rows - view.q0) * view.scale);
    g.save();
    g.beginPath();
    g.rect(rect.x, rect.y, right, bottom);
    g.clip();
    g.imageSmoothingEnabled = false;
    for (let ti = ti0; ti <= Math.min(ti1, Math.ceil(lv.rows / TILE) - 1); ti++) {
      for (let tj = tj0; tj <= Math.min(tj1, Math.ceil(lv.cols / TILE) - 1); tj++) {
        const t = pyr.tile(L, ti, tj);
        const x = rect.x + (tj * span - view.k0) * view.scale;
        const y = rect.y + (ti * span - view.q0) * view.scale;
        g.drawImage(t, x, y, t.width * f * view.scale, t.height * f * view.scale);
      }
    }
    g.restore();
    return L;
  };
})();
